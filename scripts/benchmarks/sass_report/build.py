"""Building what the report reads: the CUDA tools, the headers (their files, their hash, setup.py's nvcc
flags), the host program that prints the headers' constants, sizes and the launcher's choices, the
kernel instances the launcher runs at a head dim, and their compilation with a cache."""
import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CSRC = os.path.join(ROOT, "csrc")
CUDA_DIR = os.path.join(CSRC, "cuda")
KERNELS_HEADER = os.path.join(CUDA_DIR, "fourier_attention_kernels.cuh")
ARCH = "sm_90"
DEFAULT_NVCC_FLAGS = ["-O3", "-lineinfo"]
INSTALL_HINT = "python -m pip install nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump"

T0 = time.monotonic()


def progress(msg):
    print(f"[cuda_sass_report {time.monotonic() - T0:5.1f}s] {msg}", file=sys.stderr, flush=True)


class ToolMissing(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------------

def _wheel_bin_dirs():
    """bin/ folders of the nvidia-* wheels (nvidia/cu13/bin, nvidia/cuda_nvcc/bin, ...)."""
    dirs = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
    for root in roots:
        dirs += sorted(glob.glob(os.path.join(root, "*", "bin")), reverse=True)
    return dirs


def find_tool(name, required=True):
    """Path of a CUDA tool: PATH, $CUDA_HOME/bin, beside nvcc, then the nvidia-* wheels."""
    cands = []
    found = shutil.which(name)
    if found:
        cands.append(found)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            cands.append(os.path.join(home, "bin", name))
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(os.path.join(os.path.dirname(os.path.realpath(nvcc)), name))
    cands += [os.path.join(d, name) for d in _wheel_bin_dirs()]
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    if not required:
        return None
    if name == "nvcc":
        raise ToolMissing("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): install the CUDA toolkit "
                          "(12.x or 13.x; no GPU needed) or set CUDA_HOME")
    raise ToolMissing(f"{name} not found (PATH, $CUDA_HOME/bin, beside nvcc, the nvidia-* wheels); install it "
                      f"with:  {INSTALL_HINT}")


def run(cmd, cwd=None):
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"command failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout}{res.stderr}")
    return res.stdout + res.stderr


def tool_version(path):
    out = run([path, "--version"])
    m = re.search(r"release ([\d.]+), V([\d.]+)", out) or re.search(r"V([\d.]+)", out)
    return m.group(m.lastindex) if m else out.strip().splitlines()[-1]


# ---------------------------------------------------------------------------------------------
# Sources: hash, nvcc flags of setup.py, constants and sizes from the headers
# ---------------------------------------------------------------------------------------------

def header_files():
    files = sorted(glob.glob(os.path.join(CUDA_DIR, "*.cuh")) + glob.glob(os.path.join(CUDA_DIR, "*.h"))
                   + glob.glob(os.path.join(CSRC, "*.h")))
    return [f for f in files if os.path.isfile(f)]


def headers_hash():
    h = hashlib.sha256()
    for f in header_files():
        h.update(os.path.relpath(f, ROOT).encode())
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def setup_nvcc_flags():
    """The nvcc flags of setup.py (extra["nvcc"] = [...]), else -O3 -lineinfo."""
    try:
        text = open(os.path.join(ROOT, "setup.py")).read()
    except OSError:
        return list(DEFAULT_NVCC_FLAGS)
    m = re.search(r'extra\["nvcc"\]\s*=\s*\[([^\]]*)\]', text)
    if not m:
        return list(DEFAULT_NVCC_FLAGS)
    flags = re.findall(r'"([^"]+)"', m.group(1))
    if "-lineinfo" not in flags:  # needed to name the loops
        flags.append("-lineinfo")
    return flags


# Constants of the headers that the loop model uses; the host program below prints them.
CONSTANTS = ["kMicro", "kRenormEvery", "kChunk", "kFwdRows", "kFwdKeys", "kFwdThreads", "kStageStep",
             "kRowFields", "kKeyFields", "kTableThreads", "kBwdMaxFeatures", "kBwdMaxValueColumns",
             "kGroup", "kTableSlots", "kDeltaSplitMinFeatures", "kDecodeMaxRows", "kDecKeys", "kDecThreads",
             "kCombineThreads"]
# The launcher's choices that do not depend on the head dim (csrc/cuda/tile_switch.h), printed with
# the constants: the decoding forward's register rows for one query row and for the most.
CHOICES = {
    "decode_rows_one": "DecodeRows::of(1)",
    "decode_rows_most": "DecodeRows::of(kDecodeMaxRows)",
}
# Head-dim dependent sizes and the launcher's choices at the head dim (functions of the headers:
# tile_switch.h states the kernel instance the launcher runs), per D = Dv.
SIZES = {
    "Dp": "padded_features(D)",
    "Dvs": "padded_value_columns(Dv)",
    "ostride": "dkv_out_stride(Dv)",
    "fwd_columns": "ForwardColumns::of(Dv)",
    "fwd_smem_floats": "tiled_forward_smem_floats(Dv)",
    "fwd_odd_smem_floats": "tiled_forward_smem_floats(Dv, true)",
    "fwd_threads": "forward_threads(Dv)",
    "table_smem_floats": "table_smem_bytes() / sizeof(float)",
    "tiled_backward": "tiled_backward_takes(padded_features(D), Dv)",
    "delta_smem_floats": "tiled_delta_smem_floats(Dv)",
    "delta2_smem_floats": "tiled_delta_smem_floats(Dv, 2)",
    "delta2_threads": "2 * kFwdThreads",
    "main_columns": "MainPassColumns::of(Dv)",
    "main_smem_floats": "tiled_main_smem_floats(padded_features(D), Dv)",
    "finish_smem_floats": "kBwdMaxFeatures",
    "decode_one_smem_floats": "decode_smem_floats(padded_features(D), DecodeRows::of(1))",
    "decode_most_smem_floats": "decode_smem_floats(padded_features(D), DecodeRows::of(kDecodeMaxRows))",
}


def host_program(head_dims):
    lines = ['#include <cstdio>', f'#include "{KERNELS_HEADER}"', 'using namespace fourierformer::cuda;',
             'int main() {', '  printf("{\\"constants\\": {");']
    for i, (c, expr) in enumerate([(c, c) for c in CONSTANTS] + list(CHOICES.items())):
        sep = "," if i else ""
        lines.append(f'  printf("{sep}\\"{c}\\": %lld", (long long)({expr}));')
    lines.append('  printf("}, \\"sizes\\": {");')
    for n, hd in enumerate(head_dims):
        sep = "," if n else ""
        lines.append(f'  {{ const int D = {hd}, Dv = {hd}; (void)D; (void)Dv;')
        lines.append(f'    printf("{sep}\\"{hd}\\": {{");')
        for i, (k, expr) in enumerate(SIZES.items()):
            sep2 = "," if i else ""
            lines.append(f'    printf("{sep2}\\"{k}\\": %lld", (long long)({expr}));')
        lines.append('    printf("}"); }')
    lines += ['  printf("}}\\n");', '  return 0;', '}']
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Kernel instances, as the launcher picks them (fourier_attention_launch.h, tile_switch.h)
# ---------------------------------------------------------------------------------------------

@dataclass
class Instance:
    kind: str            # tables, forward, delta, delta2 (two halves), main, main2 (two splits), finish
    template: str        # e.g. forward_tiled_kernel<float, 4>
    params: dict         # template parameters by name (kO)
    threads: str         # constant (or SIZES key) of the block size
    smem: str            # SIZES key of the dynamic shared memory (floats), or None
    grid_rows: str = ""  # rows per block of the grid: rows of the slice / this


# The template argument of each phi's kernel instances (csrc/cuda/common.cuh: Phi; "abs" runs the
# power's instances with p = 1), and which the launcher's main pass takes with the score cache, where
# its scores are the pre-pass's (main_pass_phi in backward_tiled.cuh: ReLU the power's). "odd": phi(x)
# = x^p with odd p (Phi::kOdd, signed weights; its tiled forward keeps the scores' signs in shared
# memory, its decoding forward's merge is forward_combine_kernel<float, true>).
PHIS = {"power": "", "relu": ", Phi::kRelu", "sigmoid": ", Phi::kSigmoid", "odd": ", Phi::kOdd"}
CACHED_MAIN_PASS_PHI = {"power": "power", "relu": "power", "sigmoid": "sigmoid", "odd": "odd"}


def launcher_instances(c, sizes, score_cache=True, phi="power"):
    """The float32 kernels launch_forward and launch_backward (fourier_attention_launch.h) run at a head
    dim D = Dv, with the template arguments the launcher's choices give there (tile_switch.h, through
    the host program: c its constants and choices, sizes those of the head dim). With score_cache the
    backward's main pass reads the pre-pass's scores; without it, it computes them again. phi: the
    instances of that phi (with_phi: its Phi where a kernel computes scores or, the main pass, takes
    their derivative; with the score cache the main pass of CACHED_MAIN_PASS_PHI[phi])."""
    Dp = sizes["Dp"]
    arg = PHIS[phi]  # (the kPhi template argument; Phi::kPower is its default)
    out = [Instance("tables", "table_kernel<float>", {}, "kTableThreads", "table_smem_floats")]
    kO = sizes["fwd_columns"]
    out.append(Instance("forward", f"forward_tiled_kernel<float, {kO}{arg}>", {"kO": kO}, "fwd_threads",
                        "fwd_odd_smem_floats" if phi == "odd" else "fwd_smem_floats", "kFwdRows"))
    if sizes["tiled_backward"]:
        out.append(Instance("delta", f"backward_delta_tiled_kernel<float, 1{arg}>", {"kSplit": 1}, "kFwdThreads",
                            "delta_smem_floats", "kFwdRows"))
        if Dp >= c["kDeltaSplitMinFeatures"] and score_cache:
            # where the grid is small (delta_pass_split; with the score cache only): the pre-pass
            # in two halves (not in the totals but the small-grid backward's)
            out.append(Instance("delta2", f"backward_delta_tiled_kernel<float, 2{arg}>", {"kSplit": 2}, "delta2_threads",
                                "delta2_smem_floats", "kFwdRows"))
        kOk = sizes["main_columns"]
        cache = "true" if score_cache else "false"  # (the pre-pass's scores read, or computed again)
        main_phi = PHIS[CACHED_MAIN_PASS_PHI[phi]] if score_cache else arg
        out.append(Instance("main", f"backward_main_tiled_kernel<float, {kOk}, {cache}{main_phi}>", {"kO": kOk},
                            "kFwdThreads", "main_smem_floats", "kFwdKeys"))
        out.append(Instance("finish", "backward_dq_finish_kernel<float>", {}, "kFwdThreads",
                            "finish_smem_floats", "kFwdRows"))
        if Dp >= c["kDeltaSplitMinFeatures"] and score_cache:
            # the main pass at the small grid of the IWSLT'14 benchmark shape on 132 SMs (128 key
            # tiles, 264 block slots): two blocks per key tile (main_pass_splits), counted as such
            out.append(Instance("main2", f"backward_main_tiled_kernel<float, {kOk}, {cache}{main_phi}>",
                                {"kO": kOk, "splits": 2}, "kFwdThreads", "main_smem_floats", "kFwdKeys"))
    # the decoding forward (launch_decode): a query per slice and the most query rows, each with the
    # merge of its chunks (N: the rows counted; kRows: the register rows of the instance)
    for which, n in (("one", 1), ("most", c["kDecodeMaxRows"])):
        rows = c[f"decode_rows_{which}"]
        out.append(Instance("decode", f"forward_decode_kernel<float, {rows}{arg}>", {"kRows": rows, "N": n},
                            "kDecThreads", f"decode_{which}_smem_floats", "kDecKeys"))
        combine = "forward_combine_kernel<float, true>" if phi == "odd" else "forward_combine_kernel<float>"
        out.append(Instance("combine", combine, {"kRows": rows, "N": n}, "kCombineThreads", None))
    return out


# ---------------------------------------------------------------------------------------------
# Compilation with a cache
# ---------------------------------------------------------------------------------------------

class Builder:
    def __init__(self, cache_dir, work_dir, nvcc, flags):
        self.cache_dir, self.work_dir, self.nvcc, self.flags = cache_dir, work_dir, nvcc, flags
        self.nvcc_version = tool_version(nvcc)
        self.hash = headers_hash()
        os.makedirs(cache_dir, exist_ok=True)
        os.makedirs(work_dir, exist_ok=True)

    def key(self, what):
        h = hashlib.sha256("\0".join([self.hash, self.nvcc_version, ARCH, " ".join(self.flags), what]).encode())
        return h.hexdigest()[:20]

    def kernel_tu(self, template):
        return (f'// generated by scripts/benchmarks/cuda_sass_report.py: one float32 kernel instance, no torch headers\n'
                f'#include "{KERNELS_HEADER}"\n'
                f'namespace fourierformer {{\nnamespace cuda {{\n'
                f'template __global__ void {template}(const Params<float, float>);\n}}\n}}\n')

    def cubin(self, template):
        """(cubin path, ptxas log, cached?) of one kernel instance."""
        key = self.key(template)
        cub = os.path.join(self.cache_dir, key + ".cubin")
        log = os.path.join(self.cache_dir, key + ".ptxas.txt")
        safe = re.sub(r"[^\w]+", "_", template).strip("_")
        src = os.path.join(self.work_dir, safe + ".cu")
        with open(src, "w") as fh:
            fh.write(self.kernel_tu(template))
        if os.path.exists(cub) and os.path.exists(log):
            return cub, open(log).read(), True
        tmp = cub + f".tmp{os.getpid()}"
        out = run([self.nvcc, "-cubin", f"-arch={ARCH}", "-std=c++17", *self.flags, "-Xptxas", "-v",
                   "-o", tmp, src])
        with open(log + f".tmp{os.getpid()}", "w") as fh:
            fh.write(out)
        os.replace(log + f".tmp{os.getpid()}", log)
        os.replace(tmp, cub)
        return cub, out, False

    def host_info(self, head_dims):
        prog = host_program(head_dims)
        key = self.key("host:" + prog)
        cached = os.path.join(self.cache_dir, key + ".json")
        if os.path.exists(cached):
            return json.load(open(cached)), True
        src = os.path.join(self.work_dir, "header_constants.cu")
        exe = os.path.join(self.work_dir, "header_constants")
        with open(src, "w") as fh:
            fh.write(prog)
        run([self.nvcc, "-std=c++17", "-o", exe, src])
        info = json.loads(run([exe]))
        with open(cached, "w") as fh:
            json.dump(info, fh)
        return info, False
