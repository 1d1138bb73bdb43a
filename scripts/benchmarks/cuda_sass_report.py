#!/usr/bin/env python
"""Static reading of the sm_90 SASS of the float32 CUDA kernels, without a GPU and without torch.

    python scripts/benchmarks/cuda_sass_report.py                      # head dims 16 and 128
    python scripts/benchmarks/cuda_sass_report.py --head-dims 16,64,128
    python scripts/benchmarks/cuda_sass_report.py --json > sass.json   # machine-readable
    python scripts/benchmarks/cuda_sass_report.py --keep               # keep the generated .cu, logs and SASS

For each head dim (D = Dv) it compiles, from the kernel headers alone (csrc/cuda/*.cuh, no torch
or ATen header), the float32 kernel instances that the launcher (csrc/cuda/fourier_attention_launch.h)
runs at that shape: the table kernel, the tiled forward (forward_threads(Dv) threads per block: two
halves of kFwdThreads when Dv > 64), the tiled backward's pre-pass, main pass and dq finish kernels,
and the decoding forward for few query rows (forward_decode.cuh: its key-chunk kernel with one and with
kDecodeMaxRows register rows, and the kernel that merges the chunks).
A generated translation unit includes fourier_attention_kernels.cuh and explicitly instantiates one
kernel template; it is compiled with ``nvcc -cubin -arch=sm_90 -Xptxas -v`` and the nvcc flags of
setup.py (-O3 -lineinfo), and disassembled with nvdisasm (line information included). The cubins
and ptxas logs are cached under ``${TMPDIR:-/tmp}/fourierformer-sass-cache`` (--cache-dir), keyed
on a hash of the headers, the instance and the compiler, so a second run only disassembles.
Head-dim dependent sizes (shared memory, padded features) and the tile constants come from a small
host program compiled from the same headers.

Per kernel instance it prints:
  * registers, spill stores / loads (bytes), stack frame, shared memory (static + dynamic at the
    head dim, as the launcher asks for it);
  * the launch bounds of the kernel (read from its FF_LAUNCH_BOUNDS in the headers; ptxas caps
    the registers by them) and the warps per SM on sm_90 (65536 registers per SM in 4 quarters,
    allocated per warp in units of 256; 228 KiB shared memory per SM with 1 KiB reserved per
    block; 64 warps and 32 blocks at most), and what limits it;
  * every loop of the kernel, found from the backward branches of the SASS (a loop is the address
    range from a branch target up to a branch that jumps back to it), named by the source ``for``
    statement of that branch (the line information of -lineinfo) and the annotation above it (see
    "The model beside the code" below), with its static instruction
    count, the unroll factor the compiler chose (source iterations per SASS iteration, read from
    the increment of the induction variable that the exit test compares) and the trip count used
    for the weighting;
  * instructions per element of each inner loop: the static instructions of the loop body divided
    by the elements one SASS iteration of one thread handles (unroll factor times the elements of
    one source iteration, from the tile constants: e.g. the score loop does kMicro x kMicro pairs
    times kRenormEvery features). Elements are (query, key, feature) triples, or (query, key,
    value column) triples for the P V / dO V^T / P^T dO loops;
  * the whole kernel per (query, key, feature) element at N = M = 256 and 1024: every instruction
    of the kernel weighted by the trip counts of the loops around it (per entry, for the shape),
    summed over the threads of all blocks of one (batch, head) slice, divided by N M D. The count
    is for the plain case: no mask, no key bias, no dropout, not causal, the backward's score cache
    present (its main pass reads the pre-pass's scores; --no-score-cache: computes them again), no pair on the rare path
    (|x| < 2^-14), no flat feature: the source lines of those branches (the cold regions the
    headers annotate) weigh 0, but for the tests that skip them, which the plain case runs (a
    region's first line with the flag test: its instructions up to its conditional branch, the
    compare and what the compiler hoisted above it), and out-of-line subroutines (the rare path's function, slow paths of divisions and of
    float64 sincos) are not counted. In the table kernel the per-feature x / u branch is weighted
    for one batch (H Dp threads of the grid) and the row constant's slot sum for slot 0 only.
    Totals: forward + tables = table kernel + forward kernel, backward + tables = table kernel +
    pre-pass + main pass + dq finish kernel (as when the backward builds its own tables), and a
    training step = table kernel + forward + backward (the autograd builds the tables once and
    passes them to both: fourier_attention_tables); at head dims of 64 and more also the backward
    and the step on a small grid (the two-half pre-pass and the main pass in two splits, as the
    launcher runs the IWSLT'14 benchmark shape on 132 SMs: delta_pass_split, main_pass_splits).
    The decoding forward is counted at its own shape: N = its register rows (1 and kDecodeMaxRows)
    queries against M = the shape's keys, its key-chunk kernel and its merge per (query, key,
    feature) element (totals: decoding).

Each loop row also gives its share of the whole-kernel count (the instructions of that loop not
inside a nested loop, weighted as above, per element), and "outside every loop" the rest, so that
the shares add up to the whole. A loop without an annotation is counted once and named in the
warnings at the end: after a kernel change, annotate it rather than trust those totals.

The model beside the code: each loop the model counts and each source region it weighs carries a
`// SASS:` line comment in the kernel headers, e.g.

    // SASS: loop=g_pass step=kGroup trips=chunk_dc/kGroup elements=kMicro*kMicro*kGroup unit=qkd
    for (int dd = 0; dd < dc; dd += kGroup) {

(its name, the source step, the trips per entry and the elements per trip), or `// SASS:
cold=<id> begin [test]` ... `// SASS: cold=<id> end` around code the plain case does not run, and
`// SASS: branch=<id> weight=<expr> begin` ... `end` around code run with a weight. The report
reads those annotations and the -lineinfo line numbers, nothing else of the comments; the
grammar, and the ids it knows (LOOPS, REGIONS), are at parse_annotations in this file. An
annotation it cannot read is refused with its file and line.

This is a static model: it does not know about stalls, bank conflicts or latency; an instruction
issued under a false predicate still counts (it takes an issue slot), and a loop exit or `continue`
that the plain case does not take (P = 0) is assumed not taken.

What it reported for each version of the kernels, dated with the machine, the command, the
compiler and the headers' hash: docs/records/speed.md; the current table: docs/kernels.md. The
counts are for full tiles: the threads of a short sequence's empty micro-tiles (micro_tile_live)
skip their loops, which this count does not model. The first feature chunk of the scores runs outside that loop (peeled): at
D = 16 the loop does not run and the chunk counts in the tile loop's share.

Requirements: nvcc (the CUDA toolkit, 12.x or 13.x) and nvdisasm; cuobjdump (optional) cross-checks
the register counts. The two disassemblers come as PyPI wheels (not needed by the project itself):

    python -m pip install nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump

They are found on PATH, next to nvcc, under $CUDA_HOME/bin, or in those wheels (nvidia/cu*/bin).
A cold run compiles every instance, a cached one only disassembles.
"""
import argparse
import glob
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC = os.path.join(ROOT, "csrc")
CUDA_DIR = os.path.join(CSRC, "cuda")
KERNELS_HEADER = os.path.join(CUDA_DIR, "fourier_attention_kernels.cuh")
LAUNCH_HEADER = os.path.join(CUDA_DIR, "fourier_attention_launch.h")
ARCH = "sm_90"
DEFAULT_NVCC_FLAGS = ["-O3", "-lineinfo"]
INSTALL_HINT = "python -m pip install nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump"

# sm_90 resources (CUDA C Programming Guide, compute capability 9.0)
SM90 = dict(regs_per_sm=65536, reg_quarters=4, reg_alloc_unit=256, max_regs_per_thread=255,
            smem_per_sm=228 * 1024, smem_reserved_per_block=1024, max_smem_per_block=227 * 1024,
            max_warps=64, max_blocks=32)

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
# Head-dim dependent sizes (functions of the headers), per D = Dv.
SIZES = {
    "Dp": "padded_features(D)",
    "Dvs": "padded_value_columns(Dv)",
    "ostride": "dkv_out_stride(Dv)",
    "fwd_smem_floats": "tiled_forward_smem_floats(Dv)",
    "fwd_threads": "forward_threads(Dv)",
    "table_smem_floats": "table_smem_bytes() / sizeof(float)",
    "delta_smem_floats": "tiled_delta_smem_floats(Dv)",
    "delta2_smem_floats": "tiled_delta_smem_floats(Dv, 2)",
    "delta2_threads": "2 * kFwdThreads",
    "main_smem_floats": "tiled_main_smem_floats(padded_features(D), Dv)",
    "finish_smem_floats": "kBwdMaxFeatures",
    "decode1_smem_floats": "decode_smem_floats(padded_features(D), 1)",
    "decode8_smem_floats": "decode_smem_floats(padded_features(D), kDecodeMaxRows)",
}


def host_program(head_dims):
    lines = ['#include <cstdio>', f'#include "{KERNELS_HEADER}"', 'using namespace fourierformer::cuda;',
             'int main() {', '  printf("{\\"constants\\": {");']
    for i, c in enumerate(CONSTANTS):
        sep = "," if i else ""
        lines.append(f'  printf("{sep}\\"{c}\\": %lld", (long long)({c}));')
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
# Kernel instances, as the launcher picks them (fourier_attention_launch.h)
# ---------------------------------------------------------------------------------------------

@dataclass
class Instance:
    kind: str            # tables, forward, delta, delta2 (two halves), main, main2 (two splits), finish
    template: str        # e.g. forward_tiled_kernel<float, 4>
    params: dict         # template parameters by name (kO)
    threads: str         # constant (or SIZES key) of the block size
    smem: str            # SIZES key of the dynamic shared memory (floats), or None
    grid_rows: str = ""  # rows per block of the grid: rows of the slice / this


def launcher_instances(D, Dv, c):
    """The float32 kernels launch_forward and launch_backward run at (D, Dv): mirrors
    fourier_attention_launch.h (checked against its text by check_launcher)."""
    Dp = (D + c["kRenormEvery"] - 1) // c["kRenormEvery"] * c["kRenormEvery"]
    out = [Instance("tables", "table_kernel<float>", {}, "kTableThreads", "table_smem_floats")]
    kO = 4 if Dv <= 16 else (16 if Dv <= 64 else (32 if Dv <= 128 else 64))
    out.append(Instance("forward", f"forward_tiled_kernel<float, {kO}>", {"kO": kO}, "fwd_threads",
                        "fwd_smem_floats", "kFwdRows"))
    if Dp <= c["kBwdMaxFeatures"] and Dv <= c["kBwdMaxValueColumns"]:
        out.append(Instance("delta", "backward_delta_tiled_kernel<float, 1>", {"kSplit": 1}, "kFwdThreads",
                            "delta_smem_floats", "kFwdRows"))
        if Dp >= c["kDeltaSplitMinFeatures"] and SCORE_CACHE:
            # where the grid is small (delta_pass_split; with the score cache only): the pre-pass
            # in two halves (not in the totals but the small-grid backward's)
            out.append(Instance("delta2", "backward_delta_tiled_kernel<float, 2>", {"kSplit": 2}, "delta2_threads",
                                "delta2_smem_floats", "kFwdRows"))
        kOk = 1 if Dv <= 4 else 2 if Dv <= 8 else 4 if Dv <= 16 else 8 if Dv <= 32 else 16 if Dv <= 64 else 32
        cache = "true" if SCORE_CACHE else "false"  # (the pre-pass's scores read, or computed again)
        out.append(Instance("main", f"backward_main_tiled_kernel<float, {kOk}, {cache}>", {"kO": kOk},
                            "kFwdThreads", "main_smem_floats", "kFwdKeys"))
        out.append(Instance("finish", "backward_dq_finish_kernel<float>", {}, "kFwdThreads",
                            "finish_smem_floats", "kFwdRows"))
        if Dp >= c["kDeltaSplitMinFeatures"] and SCORE_CACHE:
            # the main pass at the small grid of the IWSLT'14 benchmark shape on 132 SMs (128 key
            # tiles, 264 block slots): two blocks per key tile (main_pass_splits), counted as such
            out.append(Instance("main2", f"backward_main_tiled_kernel<float, {kOk}, {cache}>",
                                {"kO": kOk, "splits": 2}, "kFwdThreads", "main_smem_floats", "kFwdKeys"))
    # the decoding forward (launch_decode): one register row (a query per slice) and the most,
    # each with the merge of its chunks
    for rows in (1, c["kDecodeMaxRows"]):
        out.append(Instance("decode", f"forward_decode_kernel<float, {rows}>", {"kRows": rows}, "kDecThreads",
                            f"decode{rows}_smem_floats", "kDecKeys"))
        out.append(Instance("combine", "forward_combine_kernel<float>", {"kRows": rows}, "kCombineThreads", None))
    return out


# The launcher's lines that launcher_instances mirrors: if one is gone, the mirror is stale.
LAUNCHER_LINES = [
    r"const int threads = forward_threads\(p\.Dv\);",
    r"if \(p\.Dv <= 16\)\s*launch\(forward_tiled_kernel<scalar_t, 4>, blocks, threads,",
    r"else if \(p\.Dv <= 64\)\s*launch\(forward_tiled_kernel<scalar_t, 16>, blocks, threads,",
    r"else if \(p\.Dv <= 128\)\s*launch\(forward_tiled_kernel<scalar_t, 32>, blocks, threads,",
    r"else\s*launch\(forward_tiled_kernel<scalar_t, 64>, blocks, threads,",
    r"launch\(backward_delta_tiled_kernel<scalar_t, 2>, row_blocks, 2 \* kFwdThreads,",
    r"launch\(backward_delta_tiled_kernel<scalar_t, 1>, row_blocks, kFwdThreads,",
    r"launch\(backward_dq_finish_kernel<scalar_t>",
    r"if \(p\.Dv <= 4\)\s*launch\(backward_main_tiled_kernel<scalar_t, 1, kCache>",
    r"if \(p\.score_cache\)\s*launch_main_tiled<scalar_t, true>",
    r"launch\(table_kernel<scalar_t>, blocks, kTableThreads, table_smem_bytes\(\),",
    r"if \(decode_forward\(sh\.N\)\)",
    r"if \(rows == 1\)\s*launch\(forward_decode_kernel<scalar_t, 1>, blocks, kDecThreads, smem, p\);",
    r"else\s*launch\(forward_decode_kernel<scalar_t, 8>, blocks, kDecThreads, smem, p\);",
    r"launch\(forward_combine_kernel<scalar_t>, sh\.B \* sh\.H, kCombineThreads, 0, p\);",
]


def check_launcher():
    text = re.sub(r"\s+", " ", open(LAUNCH_HEADER).read())
    missing = [pat for pat in LAUNCHER_LINES if not re.search(pat.replace(r"\s*", r"\s*"), text)]
    return missing


# ---------------------------------------------------------------------------------------------
# The model beside the code: the `// SASS:` annotations of the kernel headers
# ---------------------------------------------------------------------------------------------
# Each loop that the model counts and each source region that it weighs carries, in the kernel
# headers, a line comment of its own that starts with `// SASS:` (a comment: the compiled code
# does not change). Nothing else of the headers' comments is read, so rewording a comment changes
# nothing here. An annotation is one line of whitespace-separated fields, `key=value` or a flag:
#
#   // SASS: loop=<id> step=<expr> trips=<expr> [unroll=<n>] [elements=<expr> unit=<unit>]
#       directly above a `for` statement (only `#pragma` lines between): the SASS loop whose latch
#       branch the line information names that line. step: the source increment of the induction
#       variable (for the unroll factor); unroll: the factor itself, for the tile loops, which are
#       never unrolled and whose exit test the compiler may rescale; trips: source iterations per
#       entry of the enclosing code; elements / unit (inner loops only): the elements of one
#       source iteration of one thread, in units of UNITS.
#   // SASS: cold=<id> [test] [when=<case>]
#       directly above a line of code that the plain case does not run (weight 0);
#   // SASS: cold=<id> begin [test] [when=<case>]   ...   // SASS: cold=<id> end
#       the same for the lines between the two. test: the region's first line of code is the
#       test that skips it, which the plain case runs: its instructions up to each of its
#       conditional branches count (the compare, and what the compiler hoisted above the
#       branch), those after its last branch are the region's (test_line_runs). when: the region
#       is cold only in that case (CASES), e.g. the score cache's store without the score cache.
#   // SASS: branch=<id> weight=<expr> begin   ...   // SASS: branch=<id> end
#       lines that a thread runs with that weight (in the table kernel: a thread takes the query
#       or the key branch, N / (N + M) of them the first).
#
# The expressions name N, M, D, Dv, the SIZES, the CONSTANTS, the template parameters and the
# model's own names of build_report: chunk_dc (features of a chunk, on average), fwd_cols and
# fwd_passes (value columns per thread of the forward, and its column passes), dv_column_groups
# / dv_phases / dv_groups (the main pass's DvTile<kO>), split (the halves per block: the
# forward's forward_threads(Dv) / kFwdThreads, 2 in the two-half pre-pass, 1 in the other
# kernels), main_splits (the main pass's blocks per key tile, main_pass_splits: 1 but in the
# small-grid instance; each split runs its share of the chunks, of the dk store and of the
# dradius sums, split 0 alone the dv loops (averaged over the splits here), every split the pair
# work). An expression holds no whitespace.
#
# The ids the report knows: LOOPS (with the name it prints) and REGIONS. An annotation of another
# id, of a missing or unknown field, or one that is not where its kind must be, is refused with
# its file and line; a known id without an annotation is named in the report's warnings (and the
# tests fail).

LOOPS = {
    # tile_scores_impl (forward_tiled.cuh), in the forward and in the backward's kernels: the chunk
    # loop is the element loop (its renormalisation groups and the staging are unrolled in it; with
    # two halves each thread takes half of the groups of a chunk)
    "scores_chunks": "scores (chunk)",
    # forward_tiled_kernel
    "forward_key_tiles": "key tiles",
    "pv_column_passes": "P V column passes",
    "pv": "P V",
    "output_zeroing": "output tile",
    "output_store": "output tile",
    "rare_pairs": "rare pairs (not run)",  # rare_scores_log2 (a cold region)
    # the backward (backward_tiled.cuh): pre-pass, main pass and dq finish
    "v_staging": "V staging",
    "dout_staging": "dO staging",
    "row_sums_zeroing": "row sums zeroing",
    "delta_key_tiles": "key tiles",
    "delta_dp": "dP = dO V^T",
    "dk_sums_zeroing": "dk sums zeroing",
    "dv_zeroing": "dv zeroing / store",
    "query_tiles": "query tiles",
    "dout_staging_columns": "dO staging columns",
    "main_dp": "dP = dO V^T",
    "dv": "dv = P^T dO",
    "dv_phase_sums": "dv phase sums",
    "g_chunks": "g-pass chunks",
    "g_staging_scalar": "g-pass staging (scalar, not run)",
    "g_pass": "g pass (dq, dk)",
    "dk_store": "dk store",
    "main_dradius_sums": "dradius sums",
    "dradius_key_sum": "dradius key sum",
    "dv_store": "dv zeroing / store",
    "dradius_zeroing": "dradius zeroing",
    "dq_store": "dq store",
    "finish_dradius_sums": "dradius sums",
    # table_kernel
    "query_features": "features",
    "key_features": "features",
    # forward_decode_kernel and forward_combine_kernel (forward_decode.cuh)
    "decode_row_staging": "row fields staging",
    "decode_features": "scores (features)",
    "decode_pv_columns": "P V columns",
    "decode_pv": "P V",
    "combine_columns": "output columns",
    "combine_lse": "lse rows",
    "combine_max": "chunks' maximum",
    "combine_sum": "chunks' sums",
}
# Loops of headers outside csrc/, which carry no annotation: by file.
# atomicAdd's compare-and-swap retry loop (shared memory float): once without contention.
EXTERNAL_LOOPS = [dict(file="sm_20_atomic_functions.hpp", name="atomicAdd CAS loop", step="1", trips="1")]
REGIONS = {
    "rare_path": dict(kind="cold", why="rare path (|x| < 2^-14)"),
    "rare_scores": dict(kind="cold", why="rare path of the forward (|x| < 2^-14)"),
    "rare_scores_call": dict(kind="cold", why="rare path of the forward"),
    "masks": dict(kind="cold", why="attention mask and key bias"),
    "partial_tile": dict(kind="cold", why="a partial tile (the causal diagonal, the last keys)"),
    "scalar_staging": dict(kind="cold", why="scalar staging (N or M not a multiple of 4)"),
    # threads with no visible pair (short sequences, the causal diagonal: micro_tile_live)
    "empty_tile": dict(kind="cold", why="a tile with no visible pair"),
    "dropout": dict(kind="cold", why="dropout"),
    "dropout_hash": dict(kind="cold", why="dropout (hash)"),
    "rows_over_2_31": dict(kind="cold", why="over 2^31 table rows"),
    "flat_feature": dict(kind="cold", why="flat features"),
    # the pre-pass's store of the backward's score cache (kScoreCacheBytes, score_cache.h): the
    # main pass is a kernel instance of its own with the cache and without
    # (backward_main_tiled_kernel<..., kCache>); the store weighs 0 without it
    "score_cache_store": dict(kind="cold", why="the score cache (written)"),
    # the table kernel: a thread's query or key branch, the per-feature x / u (H Dp threads of the
    # grid, Dp per (batch, head) slice with one batch; more batches: fewer, an upper bound), and
    # after the slots' parts slot 0 of each row only, then the query or the key row's constant
    "query_row": dict(kind="branch", why="a query row of the tables"),
    "key_row": dict(kind="branch", why="a key row of the tables"),
    "x_per_u": dict(kind="branch", why="the per-feature x / u"),
    "slot_zero": dict(kind="branch", why="slot 0 of a row"),
    "query_constant": dict(kind="branch", why="a query row's constant"),
    "key_constant": dict(kind="branch", why="a key row's constant"),
}
UNITS = {"qkd": "per (query, key, feature)", "qkc": "per (query, key, value column)", "rd": "per (row, feature)"}
CASES = {"score-cache", "no-score-cache"}  # when=: the backward with (the default) or without the score cache
SCORE_CACHE = True  # (main: --no-score-cache)

ANNOTATION_RE = re.compile(r"^\s*// SASS:(.*)$")
LOOP_FIELDS = dict(required={"step", "trips"}, optional={"unroll", "elements", "unit"}, flags=set())
REGION_FIELDS = {"cold": dict(required=set(), optional={"when"}, flags={"begin", "end", "test"}),
                 "branch": dict(required={"weight"}, optional=set(), flags={"begin", "end"})}


class AnnotationError(ValueError):
    """An annotation that the report cannot read: names the file and the line."""


@dataclass
class Region:
    id: str
    kind: str        # cold or branch
    file: str        # basename of the header
    lines: set       # its lines (1-based)
    first: int       # its first line of code
    where: int       # line of its (first) annotation
    test: bool = False
    when: str = None
    weight: str = None


@dataclass
class Annotations:
    loops: dict = field(default_factory=dict)    # (file, line of the `for`) -> spec
    regions: list = field(default_factory=list)  # Region

    def loop_ids(self):
        return {spec["id"] for spec in self.loops.values()}

    def region_ids(self):
        return {r.id for r in self.regions}


def _code_line_after(lines, i):
    """Index of the line of code that the annotation at index i stands above: the next line,
    `#pragma` lines skipped; None when that is blank, a comment or the end of the file."""
    j = i + 1
    while j < len(lines) and lines[j].strip().startswith("#pragma"):
        j += 1
    if j >= len(lines):
        return None
    text = lines[j].strip()
    return None if not text or text.startswith("//") else j


def parse_annotations(text, file, known_loops=None, known_regions=None):
    """The annotations of one header's text (file: its basename, for the messages)."""
    known_loops = LOOPS if known_loops is None else known_loops
    known_regions = REGIONS if known_regions is None else known_regions
    lines = text.splitlines()
    out = Annotations()
    open_regions = {}  # id -> (begin index, fields, flags)

    def fail(i, why):
        raise AnnotationError(f"{file}:{i + 1}: SASS annotation: {why}: {lines[i].strip()}")

    for i, line in enumerate(lines):
        m = ANNOTATION_RE.match(line)
        if not m:
            continue
        tokens = m.group(1).split()
        if not tokens or "=" not in tokens[0]:
            fail(i, "expected loop=<id>, cold=<id> or branch=<id> first")
        kind, ident = tokens[0].split("=", 1)
        fields, flags = {}, set()
        for tok in tokens[1:]:
            if "=" in tok:
                k, v = tok.split("=", 1)
                if not v:
                    fail(i, f"field {k} has no value")
                if k in fields:
                    fail(i, f"field {k} given twice")
                fields[k] = v
            else:
                flags.add(tok)
        if kind == "loop":
            allowed = LOOP_FIELDS
            if ident not in known_loops:
                fail(i, f"unknown loop {ident!r} (the report's LOOPS)")
        elif kind in REGION_FIELDS:
            allowed = REGION_FIELDS[kind]
            if ident not in known_regions or known_regions[ident]["kind"] != kind:
                fail(i, f"unknown {kind} region {ident!r} (the report's REGIONS)")
        else:
            fail(i, f"unknown kind {kind!r} (loop, cold or branch)")
        unknown = (set(fields) - allowed["required"] - allowed["optional"]) | (flags - allowed["flags"])
        if unknown:
            fail(i, f"unknown field(s) {', '.join(sorted(unknown))}")
        if "end" in flags:
            if ident not in open_regions:
                fail(i, f"end of region {ident!r} without its begin")
            if fields or flags != {"end"}:
                fail(i, "an end takes no other field")
            b, bfields, bflags = open_regions.pop(ident)
            first = _code_line_after(lines, b)
            out.regions.append(Region(ident, kind, file, set(range(b + 2, i + 1)), first + 1, b + 1,
                                      test="test" in bflags, when=bfields.get("when"), weight=bfields.get("weight")))
            continue
        missing = allowed["required"] - set(fields)
        if missing:
            fail(i, f"missing field(s) {', '.join(sorted(missing))}")
        if "when" in fields and fields["when"] not in CASES:
            fail(i, f"when={fields['when']}: not one of {', '.join(sorted(CASES))}")
        if kind == "loop":
            if ("elements" in fields) != ("unit" in fields):
                fail(i, "elements and unit go together")
            if "unit" in fields and fields["unit"] not in UNITS:
                fail(i, f"unit={fields['unit']}: not one of {', '.join(UNITS)}")
        j = _code_line_after(lines, i)
        if j is None:
            fail(i, "must stand directly above a line of code")
        if kind == "loop":
            if not lines[j].strip().startswith("for ("):
                fail(i, "a loop annotation must stand directly above its `for`")
            if (file, j + 1) in out.loops:
                fail(i, "a second annotation for this `for`")
            spec = dict(id=ident, name=known_loops[ident], step=fields["step"], trips=fields["trips"], where=i + 1)
            if "unroll" in fields:
                spec["unroll"] = fields["unroll"]
            if "elements" in fields:
                spec.update(elems=fields["elements"], unit=fields["unit"])
            out.loops[(file, j + 1)] = spec
        elif "begin" in flags:
            if ident in open_regions:
                fail(i, f"region {ident!r} begins again before its end")
            open_regions[ident] = (i, fields, flags)
        else:
            out.regions.append(Region(ident, kind, file, {j + 1}, j + 1, i + 1, test="test" in flags,
                                      when=fields.get("when"), weight=fields.get("weight")))
    for ident, (b, _, _) in open_regions.items():
        fail(b, f"region {ident!r} has no end")
    return out


EXTRA_SOURCES = {}  # basename -> path of sources outside csrc/ that loops may be named from (tests)


class Sources:
    """The headers' lines by basename, and their annotations (read once)."""

    def __init__(self):
        self._lines = {}
        self._annotations = None

    def _path(self, name):
        hits = [f for f in header_files() if os.path.basename(f) == name]
        if not hits and name in EXTRA_SOURCES:
            hits = [EXTRA_SOURCES[name]]
        return hits[0] if hits else None

    def lines(self, name):
        if name not in self._lines:
            path = self._path(name)
            self._lines[name] = open(path).read().splitlines() if path else []
        return self._lines[name]

    @property
    def annotations(self):
        if self._annotations is None:
            self._annotations = read_annotations()
        return self._annotations


def read_annotations(paths=None):
    """The annotations of every header (and of EXTRA_SOURCES), merged."""
    if paths is None:
        paths = header_files() + sorted(EXTRA_SOURCES.values())
    out = Annotations()
    for path in paths:
        a = parse_annotations(open(path).read(), os.path.basename(path))
        out.loops.update(a.loops)
        out.regions += a.regions
    return out


def missing_annotations(ann):
    """Known loop and region ids that no annotation names."""
    return sorted(set(LOOPS) - ann.loop_ids()), sorted(set(REGIONS) - ann.region_ids())


def cold_and_test_lines(regions):
    """({file: lines} that weigh 0, {file: lines} of tests that skip them) of the cold regions: a
    test region's first line is a test line unless another region's lines hold it."""
    cold, tests = {}, {}
    for reg in regions:
        starts = {reg.first} if reg.test else set()
        cold.setdefault(reg.file, set()).update(reg.lines - starts)
        tests.setdefault(reg.file, set()).update(reg.lines & starts)
    return cold, {f: ls - cold.get(f, set()) for f, ls in tests.items()}


def active_cold_regions(ann):
    case = "score-cache" if SCORE_CACHE else "no-score-cache"
    return [r for r in ann.regions if r.kind == "cold" and r.when in (None, case)]


def test_line_runs(fn, tests, is_cold):
    """Addresses of the instructions of test lines (cold_and_test_lines) that the plain case runs:
    each conditional branch of a test line, and the line's instructions before it in its basic
    block (the compare, and what the compiler hoisted above the branch). What the line has after
    its branch (a call's arguments, the region's first instructions) is the region's."""
    runs, pending = set(), {}
    starts = set(fn.labels.values())
    for ins in fn.insts:
        if ins.addr in starts:  # a branch target: a new basic block
            pending.clear()
        on = [(f, line) for f, line in ins.chain if line in tests.get(f, ())]
        if on and not is_cold(ins.chain):
            pending.setdefault(on[0], []).append(ins.addr)
            if ins.guard and ins.opcode.startswith("BRA") and ins.chain[0] == on[0]:
                runs.update(pending.pop(on[0]))
        if ins.opcode.startswith(("BRA", "EXIT", "RET", "CALL", "JMP", "BRX")):  # the end of a basic block
            pending.clear()
    return runs


def launch_bounds(kernel_template, names):
    """(max threads, min blocks per SM or None) of a kernel's FF_LAUNCH_BOUNDS[_MIN](...) in the
    headers, evaluated with the constants and template parameters; None when not found."""
    base = kernel_template.split("<")[0]
    for f in header_files():
        text = re.sub(r"\s+", " ", open(f).read())
        m = re.search(r"FF_LAUNCH_BOUNDS(_MIN)?\(((?:[^()]|\([^()]*\))*)\) " + re.escape(base) + r"\(", text)
        if not m:
            continue
        args = [a.strip() for a in m.group(2).split(",")]

        def c_expr(e):
            t = re.match(r"(.+?)\s*\?\s*(.+?)\s*:\s*(.+)$", e)  # a ? b : c
            return f"({t.group(2)}) if ({t.group(1)}) else ({t.group(3)})" if t else e

        def call(m):  # f<arg>(): a `template <int P> FF_HD constexpr int f() { return ...; }` of the headers
            for g in header_files():
                d = re.search(r"template <int (\w+)> FF_HD constexpr int " + re.escape(m.group(1))
                              + r"\(\) \{ return ([^;]*); \}", re.sub(r"\s+", " ", open(g).read()))
                if d:
                    return str(int(evaluate(c_expr(d.group(2)), {**names, d.group(1): evaluate(m.group(2), names)})))
            raise KeyError(m.group(1))
        try:
            vals = [int(evaluate(c_expr(re.sub(r"(\w+)<([^<>()]*)>\(\)", call, a)), names)) for a in args]
        except Exception:  # an expression this reader does not know
            return None
        return vals[0], (vals[1] if len(vals) > 1 else None)
    return None


def evaluate(expr, names):
    env = {"ceil": lambda x: math.ceil(x - 1e-9), "min": min, "max": max, "__builtins__": {}}
    env.update(names)
    return eval(expr, env)  # expressions of this file only


# ---------------------------------------------------------------------------------------------
# SASS parsing
# ---------------------------------------------------------------------------------------------

@dataclass
class Inst:
    addr: int
    text: str
    opcode: str
    guard: str
    chain: list  # [(file, line), ...] innermost first (inlined-at chain)


@dataclass
class Function:
    name: str
    insts: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)  # label -> address


INST_RE = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
LOC_RE = re.compile(r'^\s*//## File "([^"]+)", line (\d+)(.*)$')


def parse_nvdisasm(text):
    """Functions of `nvdisasm -g -gi -c` output: the kernel's own code (up to its first
    subroutine label), every instruction with its source chain."""
    funcs = {}
    cur = None
    chain = []
    in_comment = False
    pending = []
    in_sub = False
    for line in text.splitlines():
        m = re.match(r"^\.text\.(\S+):", line)
        if m:
            cur = Function(m.group(1))
            funcs[cur.name] = cur
            chain, pending, in_sub = [], [], False
            continue
        if cur is None:
            continue
        m = LOC_RE.match(line)
        if m:
            c = [(os.path.basename(m.group(1)), int(m.group(2)))]
            c += [(os.path.basename(a), int(b)) for a, b in re.findall(r'inlined at "([^"]+)", line (\d+)', m.group(3))]
            if not (in_comment and len(chain) >= len(c)):  # keep the longest chain of a comment block
                chain = c
            in_comment = True
            continue
        m = re.match(r"^(\.L_x_\d+|\$\S+):", line)
        if m:
            if m.group(1).startswith("$"):
                in_sub = True
            pending.append(m.group(1))
            continue
        m = INST_RE.match(line)
        if not m:
            continue
        in_comment = False
        addr, body = int(m.group(1), 16), m.group(2)
        for lab in pending:
            cur.labels[lab] = addr
        pending = []
        if in_sub:
            continue
        gm = re.match(r"^(@!?U?P\w+)\s+(.*)$", body)
        guard, body2 = (gm.group(1), gm.group(2)) if gm else ("", body)
        opcode = body2.split()[0] if body2.split() else ""
        if opcode == "NOP":
            continue
        cur.insts.append(Inst(addr, body, opcode, guard, list(chain)))
    return funcs


@dataclass
class Loop:
    head: int
    latch: int
    insts: list
    chain: list        # source chain of the latch branch
    depth: int = 0
    parent: "Loop" = None
    children: list = field(default_factory=list)
    unroll: int = 1
    unroll_how: str = ""


def find_loops(fn):
    loops = []
    for k, ins in enumerate(fn.insts):
        if not ins.opcode.startswith("BRA"):
            continue
        m = re.search(r"`\((\.L_x_\d+)\)", ins.text)
        if not m or m.group(1) not in fn.labels:
            continue
        target = fn.labels[m.group(1)]
        if target >= ins.addr:
            continue  # forward branch, or the trailing self-loop
        same = [lp for lp in loops if lp.head == target]
        if same:  # a second branch back to the same head (a `continue`): one loop, to the last latch
            if ins.addr > same[0].latch:
                same[0].latch, same[0].chain = ins.addr, ins.chain
                same[0].insts = [x for x in fn.insts if target <= x.addr <= ins.addr]
            continue
        body = [x for x in fn.insts if target <= x.addr <= ins.addr]
        loops.append(Loop(target, ins.addr, body, ins.chain))
    # nesting: the smallest loop that contains another one is its parent
    for lp in loops:
        outer = [o for o in loops if o is not lp and o.head <= lp.head and lp.latch <= o.latch]
        if outer:
            lp.parent = min(outer, key=lambda o: o.latch - o.head)
            lp.parent.children.append(lp)
    for lp in loops:
        d, p = 0, lp.parent
        while p:
            d, p = d + 1, p.parent
        lp.depth = d
    return sorted(loops, key=lambda lp: lp.head)


# (uniform registers too: a trip counter the compiler keeps in UR, stepped by UIADD3)
REG_INC = re.compile(r"^(?:U?IADD3|VIADD|IMAD\.IADD|IADD)\s+(U?R\d+),\s*(U?R\d+),\s*(-?0x[0-9a-f]+|-?\d+)")


def unroll_factor(lp, source_step):
    """Source iterations per SASS iteration, from the exit test of the latch: the register it
    compares and that register's increment in the body. An up-counter steps unroll x the
    source step; a counter compared with zero (a down-counter of the trips) steps -unroll."""
    latch = lp.insts[-1]
    pm = re.match(r"@!?(P\d)", latch.guard)
    if not pm:
        return 1, "unconditional latch"
    pred = pm.group(1)
    setp = None
    for ins in reversed(lp.insts[:-1]):
        if re.match(r"^ISETP\S*\s+" + pred + r"\b", ins.text.split(None, 1)[-1] if ins.guard else ins.text) or \
                re.search(r"ISETP\S*\s+" + pred + r",", ins.text):
            setp = ins
            break
    if setp is None:
        return 1, "no exit test found"
    ops = re.findall(r"\b(U?R\d+)\b", setp.text)
    versus_zero = ", RZ," in setp.text or setp.text.rstrip().endswith("RZ, PT")
    # a down-counter of the trips left compared with a constant: the main copy of a loop unrolled
    # by 16 over a runtime count runs while more than 12 are left (ISETP.GT P1, PT, R13, 0xc)
    constant = re.search(r",\s*(-?0x[0-9a-f]+|-?\d+),\s*PT\s*$", setp.text.rstrip())
    for reg in ops:
        for ins in lp.insts:
            m = REG_INC.match(ins.text)
            if m and m.group(1) == reg and m.group(2) == reg:
                inc = int(m.group(3), 16) if "0x" in m.group(3) else int(m.group(3))
                if inc >= 1 << 31:  # SASS prints 32-bit immediates unsigned
                    inc -= 1 << 32
                if versus_zero and abs(inc) <= 16:
                    return abs(inc), f"{reg} {inc:+d} against 0"
                if constant and -16 <= inc < 0:
                    return -inc, f"{reg} {inc:+d} against {constant.group(1)}"
                if source_step and inc % source_step == 0 and inc > 0:
                    return inc // source_step, f"{reg} += {inc:#x} (source step {source_step})"
    return 1, "increment not found (assumed 1)"


# ---------------------------------------------------------------------------------------------
# ptxas -v and cuobjdump -res-usage
# ---------------------------------------------------------------------------------------------

def parse_ptxas(log):
    """{function: dict(regs, spill_stores, spill_loads, stack, smem, entry)} of a -Xptxas -v log."""
    out = {}
    cur = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            out.setdefault(m.group(1), {})["entry"] = True
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), {})
            cur.setdefault("entry", False)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None:
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and cur is not None:
            cur["regs"] = int(m.group(1))
            sm = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(sm.group(1)) if sm else 0
    return out


def parse_res_usage(text):
    """{function: regs} of `cuobjdump -res-usage`."""
    out = {}
    fn = None
    for line in text.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            fn = m.group(1)
            continue
        m = re.search(r"REG:(\d+)", line)
        if m and fn:
            out[fn] = int(m.group(1))
            fn = None
    return out


def occupancy(regs, threads, smem_bytes, arch=SM90):
    """Resident warps per SM and the limiting resource."""
    warps_per_block = math.ceil(threads / 32)
    regs_per_warp = math.ceil(max(regs, 1) * 32 / arch["reg_alloc_unit"]) * arch["reg_alloc_unit"]
    quarter = arch["regs_per_sm"] // arch["reg_quarters"]
    warps_by_regs = arch["reg_quarters"] * (quarter // regs_per_warp)
    limits = {
        "registers": warps_by_regs // warps_per_block,
        "warps": arch["max_warps"] // warps_per_block,
        "blocks": arch["max_blocks"],
    }
    per_block = smem_bytes + arch["smem_reserved_per_block"]
    limits["shared memory"] = 0 if smem_bytes > arch["max_smem_per_block"] else arch["smem_per_sm"] // per_block
    blocks = min(limits.values())
    limiter = min(limits, key=lambda k: limits[k])
    return blocks * warps_per_block, blocks, limiter


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


# ---------------------------------------------------------------------------------------------
# Analysis of one instance
# ---------------------------------------------------------------------------------------------

def match_spec(lp, sources):
    """The model of a SASS loop: the annotation of the `for` that its latch branch is named by
    (or an EXTERNAL_LOOPS entry of that file), and that line's text."""
    f, line = lp.chain[0] if lp.chain else ("?", 0)
    lines = sources.lines(f)
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    spec = sources.annotations.loops.get((f, line))
    if spec is not None:
        return dict(spec), text
    for spec in EXTERNAL_LOOPS:
        if spec["file"] == f:
            return dict(spec), text
    return None, text


def analyse(inst, fn, names, sources):
    """Everything the report prints about one kernel instance."""
    loops = find_loops(fn)
    # specs, unroll factors
    for lp in loops:
        spec, text = match_spec(lp, sources)
        lp.source = f"{lp.chain[0][0]}:{lp.chain[0][1]}" if lp.chain else "?"
        lp.text = text
        lp.spec = spec
        step = evaluate(spec["step"], names) if spec else None
        if spec and "unroll" in spec:  # a loop the compiler does not unroll (its body is the kernel)
            lp.unroll, lp.unroll_how = int(spec["unroll"]), "fixed by the model"
        else:
            lp.unroll, lp.unroll_how = unroll_factor(lp, step)
    # copies of one source loop under the same parent: main (largest unroll) + remainder loops; or
    # copies of equal unroll, one per iteration of an unrolled enclosing loop (each runs its trips);
    # or one copy per feature chunk, of which the first `chunks` run
    groups = {}
    for lp in loops:
        groups.setdefault((lp.source, id(lp.parent)), []).append(lp)
    for (src, _), grp in groups.items():
        spec = grp[0].spec
        if spec is None:
            for lp in grp:
                lp.trips = 1.0
            continue
        trips = evaluate(spec["trips"], names)
        if spec.get("chunks"):
            active = evaluate(spec["chunks"], names)
            for k, lp in enumerate(grp):
                lp.trips = trips / lp.unroll if k < active else 0.0
            continue
        if len({lp.unroll for lp in grp}) == 1:  # copies made by an unrolled enclosing loop: each runs
            for lp in grp:
                lp.trips = trips / lp.unroll
            continue
        left = trips
        ordered = sorted(grp, key=lambda lp: -lp.unroll)
        for k, lp in enumerate(ordered):
            if k == len(ordered) - 1:  # the last copy takes the rest (fractional without a remainder loop)
                lp.trips = left / lp.unroll
            else:
                lp.trips = float(left // lp.unroll)
                left -= lp.trips * lp.unroll
    # instruction weights
    cold, tests = cold_and_test_lines(active_cold_regions(sources.annotations))
    branch_w = [({reg.file: reg.lines}, evaluate(reg.weight, names))
                for reg in sources.annotations.regions if reg.kind == "branch"]

    def is_cold(chain):
        return any(line in cold.get(f, ()) for f, line in chain)

    def on_test_line(chain):
        return any(line in tests.get(f, ()) for f, line in chain)

    runs = test_line_runs(fn, tests, is_cold)

    def weight(ins):
        if is_cold(ins.chain) or (on_test_line(ins.chain) and ins.addr not in runs):
            return 0.0
        w = 1.0
        for lines, bw in branch_w:
            if any(line in lines.get(f, ()) for f, line in ins.chain):
                w *= bw
        for lp in loops:
            if lp.head <= ins.addr <= lp.latch:
                if is_cold(lp.chain):  # a loop of a cold region: all of it, whatever line its
                    return 0.0         # address arithmetic is attributed to
                w *= lp.trips
        return w

    per_thread = 0.0
    by_line = {}
    by_loop = {id(lp): 0.0 for lp in loops}
    outside = 0.0
    for ins in fn.insts:
        w = weight(ins)
        per_thread += w
        around = [lp for lp in loops if lp.head <= ins.addr <= lp.latch]
        if around:
            by_loop[id(min(around, key=lambda lp: lp.latch - lp.head))] += w
        else:
            outside += w
        own = [(f, line) for f, line in ins.chain if sources.lines(f)]
        f, line = own[0] if own else (ins.chain[0] if ins.chain else ("?", 0))
        by_line[f"{f}:{line}"] = by_line.get(f"{f}:{line}", 0.0) + w
    # loops in the report
    loop_rows = []
    for lp in loops:
        row = dict(source=lp.source, statement=lp.text, name=lp.spec["name"] if lp.spec else "(no model: counted once)",
                   depth=lp.depth, static=len(lp.insts), unroll=lp.unroll, unroll_how=lp.unroll_how,
                   trips_per_entry=round(lp.trips, 3), inner=not lp.children, own_per_thread=by_loop[id(lp)])
        if lp.spec and lp.spec.get("elems"):
            el = evaluate(lp.spec["elems"], names) * lp.unroll
            row.update(elements_per_iteration=el, unit=lp.spec["unit"],
                       per_element=round(len(lp.insts) / el, 2) if el else None)
        loop_rows.append(row)
    top = sorted(by_line.items(), key=lambda kv: -kv[1])[:12]
    return per_thread, loop_rows, top, outside


def whole_per_element(inst, per_thread, names, c):
    """Instructions of the kernel over one (batch, head) slice per (query, key, feature) element."""
    N, M, D = names["N"], names["M"], names["D"]
    if inst.kind in ("decode", "combine"):  # N = kRows queries per slice: ceil(M / kDecKeys) chunks, one merge
        blocks = math.ceil(M / c["kDecKeys"]) if inst.kind == "decode" else 1
        return per_thread * blocks * names[inst.threads] / (N * M * D)
    if inst.kind == "tables":
        threads_total = (N + M) * c["kTableSlots"]  # kTableSlots threads per row
    else:
        rows = N if inst.kind in ("forward", "dq", "delta", "delta2", "finish") else M
        blocks = math.ceil(rows / c[inst.grid_rows]) * names.get("main_splits", 1)
        threads_total = blocks * names[inst.threads]
    return per_thread * threads_total / (N * M * D)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-dims", default="16,128", help="comma-separated D = Dv values (default 16,128)")
    ap.add_argument("--shapes", default="256,1024", help="N = M values of the whole-kernel counts (default 256,1024)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--no-score-cache", action="store_true",
                    help="count the backward's main pass without the pre-pass's score cache (it computes the "
                         "scores again, as where B H N M floats exceed kScoreCacheBytes)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (.cu, ptxas logs, SASS) and print it")
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "fourierformer-sass-cache"),
                    help="cubin cache (default: %(default)s)")
    args = ap.parse_args(argv)
    global SCORE_CACHE
    SCORE_CACHE = not args.no_score_cache
    try:
        head_dims = sorted({int(x) for x in args.head_dims.split(",") if x.strip()})
        shapes = [int(x) for x in args.shapes.split(",") if x.strip()]
    except ValueError:
        ap.error("--head-dims and --shapes take comma-separated integers")
    if not head_dims or any(d < 1 or d > 128 for d in head_dims):
        ap.error("--head-dims: values in 1..128 (the tiled float32 kernels)")
    if not shapes or any(n < 1 for n in shapes):
        ap.error("--shapes: positive integers")
    try:
        nvcc = find_tool("nvcc")
        nvdisasm = find_tool("nvdisasm")
    except ToolMissing as e:
        print(f"cuda_sass_report: {e}", file=sys.stderr)
        return 2
    cuobjdump = find_tool("cuobjdump", required=False)
    flags = setup_nvcc_flags()
    work = tempfile.mkdtemp(prefix="fourierformer-sass-")
    try:
        report = build_report(head_dims, shapes, nvcc, nvdisasm, cuobjdump, flags, args.cache_dir, work, args.keep)
    except AnnotationError as e:
        print(f"cuda_sass_report: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:  # a failed compile: the headers no longer have what the report instantiates
        print(f"cuda_sass_report: {e}\n(if a kernel, a constant or a size function was renamed, update "
              f"launcher_instances, CONSTANTS or SIZES in {os.path.relpath(__file__, ROOT)})", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.keep:
        report["work_dir"] = work
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        print_report(report)
    progress(f"done in {time.monotonic() - T0:.1f} s")
    return 0


def build_report(head_dims, shapes, nvcc, nvdisasm, cuobjdump, flags, cache_dir, work, keep):
    b = Builder(cache_dir, work, nvcc, flags)
    nvdisasm_version = tool_version(nvdisasm)
    progress(f"nvcc {b.nvcc_version} ({nvcc}), nvdisasm {nvdisasm_version}, flags {' '.join(flags)}, "
             f"headers {b.hash[:12]}, cache {cache_dir}")
    info, cached = b.host_info(head_dims)
    progress("header constants and sizes " + ("(cached)" if cached else "compiled"))
    c = info["constants"]
    stale = check_launcher()
    warnings = []
    if stale:
        warnings.append("fourier_attention_launch.h no longer has these launches that the report mirrors "
                        "(update launcher_instances): " + "; ".join(stale))
    sources = Sources()
    no_loops, no_regions = missing_annotations(sources.annotations)
    for ident in no_loops:
        warnings.append(f"no annotation in the headers for the loop {ident} ({LOOPS[ident]}): its SASS loop "
                        f"is counted once")
    for ident in no_regions:
        warnings.append(f"no annotation in the headers for the region {ident} ({REGIONS[ident]['why']}): "
                        f"counted as run")
    report = dict(date=time.strftime("%Y-%m-%d"), arch=ARCH, nvcc=b.nvcc_version, nvdisasm=nvdisasm_version,
                  nvcc_flags=flags,
                  headers_sha256=b.hash, constants=c, head_dims={}, warnings=warnings)
    done = {}
    for hd in head_dims:
        sizes = info["sizes"][str(hd)]
        insts = launcher_instances(hd, hd, c)
        rows = []
        for inst in insts:
            if inst.template not in done:
                progress(f"D = Dv = {hd}: {inst.template}: compiling for {ARCH}")
                cub, log, was_cached = b.cubin(inst.template)
                progress(f"  {'cached' if was_cached else 'compiled'}; disassembling")
                sass_path = cub[:-len(".cubin")] + f".nvdisasm-{nvdisasm_version}.sass.txt"
                if os.path.exists(sass_path):
                    sass = open(sass_path).read()
                else:
                    sass = run([nvdisasm, "-g", "-gi", "-c", cub])
                    with open(sass_path + f".tmp{os.getpid()}", "w") as fh:
                        fh.write(sass)
                    os.replace(sass_path + f".tmp{os.getpid()}", sass_path)
                if keep:
                    safe = re.sub(r"[^\w]+", "_", inst.template).strip("_")
                    open(os.path.join(work, safe + ".sass"), "w").write(sass)
                    open(os.path.join(work, safe + ".ptxas.txt"), "w").write(log)
                funcs = parse_nvdisasm(sass)
                entry = [f for f in funcs if f in parse_ptxas(log) and parse_ptxas(log)[f].get("entry")]
                if len(entry) != 1:
                    raise RuntimeError(f"{inst.template}: expected one kernel in the cubin, found {list(funcs)}")
                res = parse_res_usage(run([cuobjdump, "-res-usage", cub])) if cuobjdump else {}
                done[inst.template] = (funcs[entry[0]], parse_ptxas(log), res)
            fn, ptx, res = done[inst.template]
            props = ptx[fn.name]
            if res and res.get(fn.name) != props.get("regs"):
                warnings.append(f"{inst.template}: cuobjdump says {res.get(fn.name)} registers, ptxas {props.get('regs')}")
            callee = {k: dict(spill_stores=v.get("spill_stores", 0), spill_loads=v.get("spill_loads", 0))
                      for k, v in ptx.items() if not v.get("entry") and (v.get("spill_stores") or v.get("spill_loads"))}
            threads = {**c, **sizes}[inst.threads]
            split = threads // c["kFwdThreads"] if inst.kind in ("forward", "delta2") else 1
            lb = launch_bounds(inst.template, {**c, **inst.params})
            if lb and lb[0] != threads:
                warnings.append(f"{inst.template}: launched with {threads} threads, __launch_bounds__({lb[0]})")
            dyn = 4 * sizes[inst.smem] if inst.smem else 0
            warps, blocks, limiter = occupancy(props["regs"], threads, props.get("smem", 0) + dyn)
            label = inst.template + (f" x{inst.params['splits']}" if inst.params.get("splits", 1) > 1 else "")
            label += f" (N = {inst.params['kRows']})" if inst.kind == "combine" else ""
            row = dict(kernel=label, kind=inst.kind, rows=inst.params.get("kRows"), function=fn.name, threads=threads,
                       launch_bounds=lb,
                       registers=props["regs"], registers_cuobjdump=res.get(fn.name),
                       spill_stores=props.get("spill_stores", 0), spill_loads=props.get("spill_loads", 0),
                       stack_frame=props.get("stack", 0), callee_spills=callee,
                       smem_static=props.get("smem", 0), smem_dynamic=dyn, warps_per_sm=warps, blocks_per_sm=blocks,
                       occupancy_limit=limiter, static_instructions=len(fn.insts), shapes={})
            for n in shapes:
                names = dict(c)
                names.update(sizes)
                names.update(inst.params)
                Dp = sizes["Dp"]
                # the forward's P V: kO / split columns per thread in passes of at most 16; Dvs / (4 split)
                # of them (on average over the row's threads) are real columns
                kO = inst.params.get("kO", 0)
                fwd_passes = max(1, inst.params.get("kO", 0) // split // 16)
                fwd_passes = min(fwd_passes, math.ceil(sizes["Dvs"] / (64 * split)))
                # (the decoding forward: N its register rows)
                names.update(N=inst.params.get("kRows", n), M=n, D=hd, Dv=hd, split=split, fwd_passes=fwd_passes,
                             main_splits=inst.params.get("splits", 1),
                             chunk_dc=Dp / math.ceil(Dp / c["kChunk"]),
                             fwd_cols=min(inst.params.get("kO", 0) // split, sizes["Dvs"] / (4 * split)) / fwd_passes,
                             # the main pass's dv tiles (DvTile in backward_tiled.cuh)
                             dv_column_groups=min(kO, 16), dv_phases=16 // min(kO, 16) if kO else 1,
                             dv_groups=kO // min(kO, 16) if kO else 1)
                per_thread, loop_rows, top, outside = analyse(inst, fn, names, sources)
                scale = whole_per_element(inst, 1.0, names, c)
                row["shapes"][str(n)] = dict(per_thread=round(per_thread), per_element=round(per_thread * scale, 2),
                                             outside_loops_per_element=round(outside * scale, 3),
                                             top_lines=[(k, round(v * scale, 3)) for k, v in top])
                for lr in loop_rows:
                    lr["share_per_element"] = round(lr.pop("own_per_thread") * scale, 3)
                row["loops"] = loop_rows  # (the same for every shape but the trip counts)
                row.setdefault("loops_by_shape", {})[str(n)] = [lr["trips_per_entry"] for lr in loop_rows]
                row.setdefault("loop_shares_by_shape", {})[str(n)] = [lr["share_per_element"] for lr in loop_rows]
                for lr in loop_rows:
                    if lr["name"].startswith("(no model"):
                        msg = f"{inst.template}: loop at {lr['source']} ({lr['statement'][:60]}) has no model: counted once"
                        if msg not in warnings:
                            warnings.append(msg)
            rows.append(row)
        totals = {}
        for n in shapes:
            by = {r["kind"]: r["shapes"][str(n)]["per_element"] for r in rows if r["rows"] is None}
            # the decoding forward at N = its register rows: the chunks' kernel and the merge
            decoding = {}
            for r in rows:
                if r["rows"] is not None:
                    decoding[str(r["rows"])] = round(decoding.get(str(r["rows"]), 0.0) + r["shapes"][str(n)]["per_element"], 2)
            bwd = by["delta"] + by["main"] + by["finish"] if "delta" in by else None
            small = by["delta2"] + by["main2"] + by["finish"] if "delta2" in by else None
            totals[str(n)] = dict(forward=by["forward"], forward_with_tables=round(by["tables"] + by["forward"], 2),
                                  backward=None if bwd is None else round(bwd, 2),
                                  backward_small_grid=None if small is None else round(small, 2),
                                  backward_with_tables=None if bwd is None else round(by["tables"] + bwd, 2),
                                  step=None if bwd is None else round(by["tables"] + by["forward"] + bwd, 2),
                                  step_small_grid=None if small is None else round(by["tables"] + by["forward"] + small, 2),
                                  decoding=decoding)
        report["head_dims"][str(hd)] = dict(sizes=sizes, kernels=rows, totals=totals)
    return report


def short_name(mangled):
    m = re.search(r"rare_pair_score|__internal_\w*slowpath\w*", mangled)
    return m.group(0) if m else mangled


def print_report(r):
    out = []
    out.append(f"SASS report, {r['date']}: float32 CUDA kernels for {r['arch']}, nvcc {r['nvcc']} "
               f"{' '.join(r['nvcc_flags'])}, headers sha256 {r['headers_sha256'][:12]}")
    out.append("Counts are SASS instructions per thread (static), per element as described by "
               "`python scripts/benchmarks/cuda_sass_report.py --help`.")
    shapes = None
    for hd, h in r["head_dims"].items():
        out.append("")
        out.append(f"== D = Dv = {hd} (padded features Dp = {h['sizes']['Dp']}) ==")
        for k in h["kernels"]:
            shapes = list(k["shapes"])
            out.append("")
            lb = k.get("launch_bounds")
            lbs = ("" if not lb else f", __launch_bounds__({lb[0]}" + (f", {lb[1]})" if lb[1] else ")")
                   + (f": at most {min(SM90['max_regs_per_thread'], SM90['regs_per_sm'] // (lb[0] * lb[1]) // 8 * 8)} "
                      "registers" if lb[1] else ""))
            out.append(f"{k['kernel']}  [{k['kind']}]  {k['threads']} threads/block{lbs}")
            cs = "".join(f"; callee {short_name(n)}: {v['spill_stores']}/{v['spill_loads']} B spill st/ld"
                         for n, v in k["callee_spills"].items())
            out.append(f"  registers {k['registers']}, spill stores {k['spill_stores']} B, spill loads "
                       f"{k['spill_loads']} B, stack {k['stack_frame']} B{cs}")
            out.append(f"  shared memory {k['smem_static'] + k['smem_dynamic']} B/block "
                       f"(dynamic {k['smem_dynamic']}), {k['blocks_per_sm']} block(s) = {k['warps_per_sm']} warps/SM "
                       f"(limited by {k['occupancy_limit']}); {k['static_instructions']} instructions in the kernel body")
            out.append(f"  {'loop (source)':<30} {'name':<22} {'depth':>5} {'static':>6} {'unroll':>6} "
                       f"{'trips/entry @N=' + '/'.join(shapes):>18} {'share of whole':>16} {'instr/element':>14}")
            rows = []
            for i, lp in enumerate(k["loops"]):
                trips = "/".join(f"{k['loops_by_shape'][s][i]:g}" for s in shapes)
                pe = f"{lp['per_element']:.2f}" if lp.get("per_element") is not None else ""
                unit = f"  {UNITS[lp['unit']]}" if lp.get("unit") else ""
                share = [k["loop_shares_by_shape"][s][i] for s in shapes]
                text = (f"  {'  ' * lp['depth'] + lp['source']:<30} {lp['name'][:22]:<22} {lp['depth']:>5} "
                        f"{lp['static']:>6} {lp['unroll']:>6} {trips:>18} ")
                rest = f" {pe:>14}{unit}"
                if rows and (text, rest) == rows[-1][0]:
                    rows[-1][1] += 1  # identical copies (chunks, atomicAdd retry loops): one row, shares summed
                    rows[-1][2] = [a + b for a, b in zip(rows[-1][2], share)]
                else:
                    rows.append([(text, rest), 1, share])
            for (text, rest), n, share in rows:
                sh = "/".join(f"{v:.2f}" for v in share)
                out.append(f"{text}{sh:>16}{rest}" + (f"  (x{n}, shares summed)" if n > 1 else ""))
            sh = "/".join(f"{k['shapes'][s]['outside_loops_per_element']:.2f}" for s in shapes)
            out.append(f"  {'(outside every loop)':<30} {'':<22} {'':>5} {'':>6} {'':>6} {'':>18} {sh:>16}")
            whole = ", ".join(f"N = M = {s}: {v['per_element']:.2f} ({v['per_thread']} per thread)"
                              for s, v in k["shapes"].items())
            out.append(f"  whole kernel per (query, key, feature) element: {whole}")
        out.append("")
        for s, t in h["totals"].items():
            b = "n/a" if t["backward"] is None else (f"{t['backward']:.2f} (with the tables {t['backward_with_tables']:.2f}); "
                                                     f"a training step (the tables once) {t['step']:.2f}")
            out.append(f"  D = {hd}, N = M = {s}: forward {t['forward']:.2f} (with the tables "
                       f"{t['forward_with_tables']:.2f}), backward (pre-pass + main + dq finish) {b}")
            dec = ", ".join(f"N = {rows}: {v:.2f}" for rows, v in t.get("decoding", {}).items())
            if dec:
                out.append(f"  D = {hd}, M = {s}: the decoding forward (chunks + merge) {dec}")
    out.append("")
    out.append("Summary (instructions per (query, key, feature) element; inner = the element loop of the kernel)")
    out.append(f"  {'D':>4} {'kernel':<48} {'regs':>4} {'spill st/ld B':>13} {'warps/SM':>8} {'inner loops':>18} "
               + " ".join(f"{'whole@' + s:>10}" for s in shapes or []))
    for hd, h in r["head_dims"].items():
        for k in h["kernels"]:
            inner = {}
            for lp in k["loops"]:
                if lp.get("unit") == "qkd" and lp["inner"]:
                    inner.setdefault(lp["name"], []).append(lp["per_element"])
            ie = " + ".join(f"{min(v):.1f}" if max(v) - min(v) < 0.05 else f"{min(v):.1f}-{max(v):.1f}"
                            for v in inner.values())
            out.append(f"  {hd:>4} {k['kernel']:<48} {k['registers']:>4} "
                       f"{str(k['spill_stores']) + '/' + str(k['spill_loads']):>13} {k['warps_per_sm']:>8} {ie:>18} "
                       + " ".join(f"{k['shapes'][s]['per_element']:>10.2f}" for s in shapes))
        for name, label in (("backward", "backward (pre-pass + main + finish)"),
                            ("backward_small_grid", "backward, small grid (two-half pre-pass)"),
                            ("forward_with_tables", "forward + tables"),
                            ("backward_with_tables", "backward + tables"), ("step", "step (tables once, fwd, bwd)"),
                            ("step_small_grid", "step, small grid")):
            vals = [h["totals"][s][name] for s in shapes]
            if all(v is not None for v in vals):
                out.append(f"  {hd:>4} {label:<48} {'':>4} {'':>13} {'':>8} {'':>18} "
                           + " ".join(f"{v:>10.2f}" for v in vals))
        for rows in (h["totals"][shapes[0]].get("decoding") or {}) if shapes else ():
            vals = [h["totals"][s]["decoding"][rows] for s in shapes]
            out.append(f"  {hd:>4} {'decoding forward at N = ' + rows + ' (M = the shape)':<48} {'':>4} {'':>13} "
                       f"{'':>8} {'':>18} " + " ".join(f"{v:>10.2f}" for v in vals))
    if r["warnings"]:
        out.append("")
        out.append("Warnings:")
        out += [f"  - {w}" for w in r["warnings"]]
    if r.get("work_dir"):
        out.append("")
        out.append(f"Work folder kept: {r['work_dir']}")
    print("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
