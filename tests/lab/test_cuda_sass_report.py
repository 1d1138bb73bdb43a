"""The SASS report (scripts/benchmarks/sass_report/, run as scripts/benchmarks/cuda_sass_report.py): its
SASS reading on tiny kernels compiled here for sm_90, its annotations, and the launcher's choices it
reads from csrc/cuda/tile_switch.h.

Needs nvcc and nvdisasm (and cuobjdump for the register cross-check); without them the tests
are skipped with the reason (python -m pip install nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump).
One translation unit of four small kernels is compiled once (a few seconds); the real kernels
are not compiled here (that is the script's own job).
"""
import importlib.util
import os
import subprocess
import sys

import pytest

from repo import REPO

PACKAGE = os.path.join(REPO, "scripts", "benchmarks", "sass_report")
_spec = importlib.util.spec_from_file_location("sass_report", os.path.join(PACKAGE, "__init__.py"),
                                               submodule_search_locations=[PACKAGE])
sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # (its modules and dataclasses look it up)
_spec.loader.exec_module(sys.modules[_spec.name])
from sass_report import annotations, build, count, disassembly, occupancy  # noqa: E402

BODY = 64  # dependent FMAs per element in the single body

# single: BODY FMAs per element; doubled: the same loop with 2 * BODY; unrolled: the single body
# with `#pragma unroll 4` over a runtime count (a main loop of 4 elements and a remainder loop);
# strided: an up-counting loop idx += 256 unrolled by 4. The annotations (`// SASS:`) model two of
# the loops for the whole-kernel count.
SOURCE = r"""
#define BODY(acc, x) \
  _Pragma("unroll") for (int r = 0; r < %(body)d; ++r) acc = fmaf(acc, x, 1.0f + 0.5f * r);

extern "C" __global__ void __launch_bounds__(256) single(float* out, const float* a, int n) {
  float acc = 0.0f;
  // SASS: loop=tiny step=1 trips=T elements=1 unit=qkd
#pragma unroll 1
  for (int i = 0; i < n; ++i) { const float x = a[i]; BODY(acc, x) }
  out[threadIdx.x] = acc;
}

extern "C" __global__ void __launch_bounds__(256) doubled(float* out, const float* a, int n) {
  float acc = 0.0f;
#pragma unroll 1
  for (int i = 0; i < n; ++i) { const float x = a[i]; BODY(acc, x) BODY(acc, x) }
  out[threadIdx.x] = acc;
}

extern "C" __global__ void __launch_bounds__(256) unrolled(float* out, const float* a, int n) {
  float acc = 0.0f;
  // SASS: loop=tiny_unrolled step=1 trips=T elements=1 unit=qkd
#pragma unroll 4
  for (int i = 0; i < n; ++i) { const float x = a[i]; BODY(acc, x) }
  out[threadIdx.x] = acc;
}

extern "C" __global__ void __launch_bounds__(256) strided(float* out, const float* a, int n) {
  float acc = 0.0f;
#pragma unroll 4
  for (int i = threadIdx.x; i < n; i += 256) { const float x = a[i]; BODY(acc, x) }
  out[threadIdx.x] = acc;
}
""" % {"body": BODY}


def _tool(name):
    try:
        return build.find_tool(name)
    except build.ToolMissing as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    nvcc = _tool("nvcc")
    nvdisasm = _tool("nvdisasm")
    d = tmp_path_factory.mktemp("sass")
    src, cub = d / "tiny.cu", d / "tiny.cubin"
    src.write_text(SOURCE)
    log = build.run([nvcc, "-cubin", "-arch=sm_90", "-O3", "-lineinfo", "-Xptxas", "-v", "-o", str(cub), str(src)])
    funcs = disassembly.parse_nvdisasm(build.run([nvdisasm, "-g", "-gi", "-c", str(cub)]))
    return dict(cubin=str(cub), log=log, funcs=funcs, src=str(src))


def _loops(compiled, name):
    fn = compiled["funcs"][name]
    return fn, disassembly.find_loops(fn)


def _count(insts, opcode):
    return sum(1 for i in insts if i.opcode.split(".")[0] == opcode)


def test_loops_come_from_backward_branches(compiled):
    for name in ("single", "doubled"):
        fn, loops = _loops(compiled, name)
        assert len(loops) == 1, (name, [(hex(lp.head), hex(lp.latch)) for lp in loops])
        lp = loops[0]
        assert lp.insts[-1].opcode.startswith("BRA") and lp.head < lp.latch
        # the latch is named by the `for` of the source (line information of -lineinfo)
        src_line = open(compiled["src"]).read().splitlines()[lp.chain[0][1] - 1]
        assert "for (int i = 0; i < n; ++i)" in src_line, src_line


def test_doubled_body_doubles_the_count_per_element(compiled):
    _, (one,) = _loops(compiled, "single")
    _, (two,) = _loops(compiled, "doubled")
    assert _count(one.insts, "FFMA") == BODY
    assert _count(two.insts, "FFMA") == 2 * BODY
    u1, _ = disassembly.unroll_factor(one, 1)
    u2, _ = disassembly.unroll_factor(two, 1)
    assert u1 == u2 == 1
    per_one, per_two = len(one.insts) / u1, len(two.insts) / u2
    # the loop overhead (load, increment, test, branch) is counted once in both
    assert abs((per_two - per_one) - BODY) <= 4, (per_one, per_two)
    assert 1.75 < per_two / per_one < 2.0, (per_one, per_two)


def test_unroll_factor_of_the_main_loop(compiled):
    _, (one,) = _loops(compiled, "single")
    per_one = len(one.insts)
    for name in ("unrolled", "strided"):
        fn, loops = _loops(compiled, name)
        factors = sorted(disassembly.unroll_factor(lp, 1 if name == "unrolled" else 256)[0] for lp in loops)
        assert factors[-1] == 4, (name, factors, [disassembly.unroll_factor(lp, 1)[1] for lp in loops])
        main = max(loops, key=lambda lp: len(lp.insts))
        u, how = disassembly.unroll_factor(main, 1 if name == "unrolled" else 256)
        assert _count(main.insts, "FFMA") == u * BODY, how
        # instructions per element of the unrolled loop: about the single loop's, less overhead
        assert BODY <= len(main.insts) / u <= per_one, (name, len(main.insts), u, per_one)


def test_registers_and_spills_from_ptxas(compiled):
    props = occupancy.parse_ptxas(compiled["log"])
    for name in ("single", "doubled", "unrolled", "strided"):
        assert props[name]["entry"] and props[name]["spill_stores"] == 0 and props[name]["spill_loads"] == 0
        assert 1 <= props[name]["regs"] <= 255
    cuobjdump = build.find_tool("cuobjdump", required=False)
    if cuobjdump is None:
        pytest.skip("cuobjdump not found: " + build.INSTALL_HINT)
    res = occupancy.parse_res_usage(build.run([cuobjdump, "-res-usage", compiled["cubin"]]))
    assert {n: props[n]["regs"] for n in res} == res


def test_ptxas_log_parsing():
    log = """ptxas info    : Compiling entry function 'kern' for 'sm_90'
ptxas info    : Function properties for kern
    80 bytes stack frame, 68 bytes spill stores, 60 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 80 bytes cumulative stack size, 2048 bytes smem
ptxas info    : Function properties for helper
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
"""
    p = occupancy.parse_ptxas(log)
    assert p["kern"] == dict(entry=True, stack=80, spill_stores=68, spill_loads=60, regs=128, smem=2048)
    assert p["helper"]["entry"] is False and p["helper"]["spill_stores"] == 8


def test_launch_bounds_with_a_constexpr_template_helper(tmp_path, monkeypatch):
    # the forward's bounds name a `template <int kO> constexpr` helper and a ternary
    header = tmp_path / "k.cuh"
    header.write_text("template <int kO>\nFF_HD constexpr int halves() { return kO > 16 ? 2 : 1; }\n"
                      "template <typename scalar_t, int kO>\n"
                      "FF_GLOBAL void FF_LAUNCH_BOUNDS_MIN(kT * halves<kO>(), kO <= 16 ? 2 : 1)\n"
                      "    kern(const Params<scalar_t, float> p) {}\n")
    monkeypatch.setattr(build, "header_files", lambda: [str(header)])
    assert occupancy.launch_bounds("kern<float, 4>", dict(kT=256, kO=4)) == (256, 2)
    assert occupancy.launch_bounds("kern<float, 32>", dict(kT=256, kO=32)) == (512, 1)


@pytest.mark.parametrize("regs,threads,smem,warps,limit", [
    (255, 256, 50 * 1024, 8, "registers"),   # 256 registers per thread: 8 warps
    (180, 256, 0, 8, "registers"),           # 5760 per warp: 2 per quarter of the register file
    (128, 256, 46080, 16, "registers"),      # 4096 per warp: 4 per quarter
    (48, 128, 0, 40, "registers"),           # 1536 per warp: 10 per quarter
    (40, 64, 0, 48, "registers"),            # 1280 per warp: 12 per quarter (not 65536 / 1280 = 51)
    (32, 256, 100 * 1024, 16, "shared memory"),  # 2 blocks of 101 KiB in 228 KiB
    (16, 64, 0, 64, "warps"),
    (16, 32, 0, 32, "blocks"),
])
def test_occupancy_sm90(regs, threads, smem, warps, limit):
    got, _, why = occupancy.occupancy(regs, threads, smem)
    assert (got, why) == (warps, limit)


def test_missing_disassembler_says_how_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    monkeypatch.setattr(build, "_wheel_bin_dirs", lambda: [])
    monkeypatch.setattr(build.os.path, "isfile", lambda p: False)
    with pytest.raises(build.ToolMissing, match="pip install nvidia-cuda-nvdisasm"):
        build.find_tool("nvdisasm")


@pytest.mark.parametrize("name,trips", [("single", 10), ("unrolled", 10), ("unrolled", 3)])
def test_whole_kernel_count_weights_loops_by_trips(compiled, monkeypatch, name, trips):
    """Whole-kernel count = instructions outside the loop + each loop copy's body x its trips; the
    trips of a source loop go to the unrolled main copy (whole SASS iterations) and the rest to
    the remainder copy."""
    monkeypatch.setattr(build, "header_files", lambda: [])
    monkeypatch.setitem(annotations.EXTRA_SOURCES, "tiny.cu", compiled["src"])
    monkeypatch.setattr(annotations, "LOOPS", {"tiny": "loop", "tiny_unrolled": "loop"})
    fn = compiled["funcs"][name]
    loops = disassembly.find_loops(fn)
    inst = build.Instance("test", name, {}, "kFwdThreads", None)
    per_thread, rows, _, outside = count.analyse(inst, fn, {"T": trips}, annotations.Sources())
    assert rows and all(row["name"] == "loop" for row in rows)  # named by the annotation
    in_loops = {i.addr for lp in loops for i in lp.insts}
    assert outside == sum(1 for i in fn.insts if i.addr not in in_loops)
    by_unroll = {disassembly.unroll_factor(lp, 1)[0]: len(lp.insts) for lp in loops}
    if name == "single":
        assert set(by_unroll) == {1}
        expected = outside + trips * by_unroll[1]
    else:
        assert set(by_unroll) == {1, 4}, by_unroll  # main loop of 4 and remainder loop
        expected = outside + (trips // 4) * by_unroll[4] + (trips % 4) * by_unroll[1]
    assert per_thread == expected
    for row in rows:  # instructions per element: the body over the elements of one SASS iteration
        assert row["per_element"] == round(row["static"] / row["unroll"], 2)


# Hand-written nvdisasm text (the layout of `nvdisasm -g -gi -c`), for what the tiny kernels above
# do not make the compiler emit: no tools needed.
def _sass(file, body):
    """A function `kern` from (line, instruction) rows; a row (None, ".L_x_N") is a label."""
    out = [".text.kern:"]
    addr = 0
    for line, text in body:
        if line is None:
            out.append(f"{text}:")
            continue
        out.append(f'\t//## File "/x/{file}", line {line}')
        out.append(f"        /*{addr:04x}*/                   {text} ;")
        addr += 0x10
    return disassembly.parse_nvdisasm("\n".join(out) + "\n")["kern"]


def test_unroll_factor_of_a_down_counter_against_a_constant():
    # nvcc's main copy of a loop unrolled by 16 over a runtime count: the trips left count down by
    # 16 and the loop runs while more than 12 are left; the remainder copy counts down by 4 to 0
    rows = [(1, "MOV R13, R48"), (None, ".L_x_1"), (2, "LDS.64 R70, [R60+0x10]"), (2, "IADD3 R13, R13, -0x10, RZ"),
            (2, "IADD3 R51, R51, 0x10, RZ"), (2, "ISETP.GT.AND P1, PT, R13, 0xc, PT"), (2, "FFMA R55, R36, R70, R55"),
            (2, "@P1 BRA `(.L_x_1)"), (None, ".L_x_2"), (2, "IADD3 R13, R13, -0x4, RZ"),
            (2, "ISETP.NE.AND P0, PT, R13, RZ, PT"), (2, "FFMA R55, R36, R70, R55"), (2, "@P0 BRA `(.L_x_2)"),
            (3, "EXIT")]
    fn = _sass("k.cuh", rows)
    loops = disassembly.find_loops(fn)
    assert [disassembly.unroll_factor(lp, 1)[0] for lp in loops] == [16, 4], [disassembly.unroll_factor(lp, 1) for lp in loops]


@pytest.mark.parametrize("test_line", [True, False])
def test_a_regions_test_counts_up_to_its_branch(tmp_path, monkeypatch, test_line):
    """A cold region whose first line is the test that skips it (flag test): that line's
    instructions count up to its conditional branch, in its basic block (the compare and what the
    compiler hoisted above the branch), not what follows the branch; the region's other lines weigh 0.
    Without the flag the whole first line weighs 0."""
    src = tmp_path / "t.cuh"
    src.write_text("x = a + b;\n"
                   f"// SASS: cold=dropout begin{' test' if test_line else ''}\n"
                   "if (p.dropout_p > 0.0f) {  // (block-uniform)\n"
                   "  y = f(y);\n"
                   "  // SASS: cold=dropout end\n"
                   "}\n"
                   "z = x + y;\n")
    monkeypatch.setattr(build, "header_files", lambda: [])
    monkeypatch.setitem(annotations.EXTRA_SOURCES, "t.cuh", str(src))
    rows = [(1, "IADD3 R1, R2, R3, RZ"),
            (3, "LDC R49, c[0x0][0x324]"), (1, "IADD3 R4, R1, R1, RZ"), (3, "FSETP.GT.AND P0, PT, R49, RZ, PT"),
            (3, "MOV R30, R34"), (3, "@!P0 BRA `(.L_x_9)"),
            (3, "IMAD R5, R5, R6, RZ"),  # the region's, on the test line after its branch
            (4, "FMUL R7, R7, R8"), (4, "FMUL R7, R7, R8"), (None, ".L_x_9"),
            (7, "FADD R9, R1, R7"), (7, "EXIT")]
    fn = _sass("t.cuh", rows)
    inst = build.Instance("test", "kern", {}, "kFwdThreads", None)
    per_thread, _, _, _ = count.analyse(inst, fn, {}, annotations.Sources())
    # lines 1 and 7: 4; the test line: LDC, FSETP, MOV, BRA with the flag test
    assert per_thread == (8 if test_line else 4)


# The model beside the code: the `// SASS:` annotations of the kernel headers (no tools needed).

def test_every_annotation_names_a_known_loop_or_region_and_every_known_one_is_annotated():
    ann = annotations.read_annotations()  # (an unknown id or a malformed annotation raises)
    assert annotations.missing_annotations(ann) == ([], []), "ids of LOOPS / REGIONS that no header annotates"
    ids = [spec["id"] for spec in ann.loops.values()]
    assert sorted(ids) == sorted(annotations.LOOPS), "each loop of LOOPS is annotated exactly once"
    for (f, line), spec in ann.loops.items():  # above its `for`, whose expressions the report evaluates
        assert annotations.Sources().lines(f)[line - 1].strip().startswith("for ("), (f, line)
        compile(spec["trips"], f"{f}:{spec['where']}", "eval")
        compile(spec["step"], f"{f}:{spec['where']}", "eval")
    for reg in ann.regions:
        assert reg.lines and reg.first in reg.lines, (reg.id, reg.file, reg.where)
        assert (reg.weight is not None) == (reg.kind == "branch"), reg


KERNEL = """\
template <int kO>
FF_DEV void k(int n) {
  // SASS: loop=pv step=4 trips=kFwdKeys/4 elements=4*fwd_cols unit=qkc
#pragma unroll 1
  for (int i = 0; i < n; ++i) {
    // SASS: cold=dropout begin test
    if (p.dropout_p > 0.0f) {  // (block-uniform)
      y = f(y);
      // SASS: cold=dropout end
    }
  }
}
"""


@pytest.mark.parametrize("annotation,why", [
    ("// SASS: loop=no_such_loop step=4 trips=kFwdKeys/4", "unknown loop 'no_such_loop'"),
    ("// SASS: loop=pv step=4", "missing field(s) trips"),
    ("// SASS: loop=pv step=4 trips=kFwdKeys/4 elements=4*fwd_cols unit=qkc colour=red", "unknown field(s) colour"),
    ("// SASS: loop=pv step=4 trips=kFwdKeys/4 elements=4*fwd_cols", "elements and unit go together"),
    ("// SASS: loop=pv step=4 trips=kFwdKeys/4 elements=4*fwd_cols unit=per_pair", "unit=per_pair"),
    ("// SASS: loop=pv step=4 trips=", "field trips has no value"),
    ("// SASS: lop=pv step=4 trips=kFwdKeys/4", "unknown kind 'lop'"),
    ("// SASS: pv step=4 trips=kFwdKeys/4", "expected loop=<id>"),
])
def test_an_annotation_with_a_missing_or_unknown_field_is_refused_with_its_line(annotation, why):
    text = KERNEL.replace("// SASS: loop=pv step=4 trips=kFwdKeys/4 elements=4*fwd_cols unit=qkc", annotation)
    with pytest.raises(annotations.AnnotationError) as e:
        annotations.parse_annotations(text, "k.cuh")
    assert str(e.value).startswith("k.cuh:3: SASS annotation: ") and why in str(e.value), str(e.value)


@pytest.mark.parametrize("edit,where,why", [
    (("#pragma unroll 1\n", "#pragma unroll 1\n  int j = 0;\n"), 3, "directly above its `for`"),
    (("#pragma unroll 1\n", "#pragma unroll 1\n\n"), 3, "directly above a line of code"),
    (("      // SASS: cold=dropout end\n", ""), 6, "region 'dropout' has no end"),
    (("    // SASS: cold=dropout begin test\n", ""), 8, "end of region 'dropout' without its begin"),
    (("cold=dropout begin test", "cold=dropout begin test when=sometimes"), 6, "when=sometimes"),
    (("cold=dropout begin test", "branch=dropout begin"), 6, "unknown branch region 'dropout'"),
])
def test_a_misplaced_annotation_is_refused_with_its_line(edit, where, why):
    text = KERNEL.replace(*edit)
    assert text != KERNEL
    with pytest.raises(annotations.AnnotationError) as e:
        annotations.parse_annotations(text, "k.cuh")
    assert str(e.value).startswith(f"k.cuh:{where}: SASS annotation: ") and why in str(e.value), str(e.value)


def _reworded(text):
    """Every comment but the annotations reworded (the same lines), and every comment line but the
    annotations removed (fewer lines)."""
    out, fewer = [], []
    for line in text.splitlines():
        if annotations.ANNOTATION_RE.match(line):
            out.append(line)
            fewer.append(line)
            continue
        code, sep, comment = line.partition("//")
        if sep and '"' not in code:
            line = code + "// " + " ".join(reversed(comment.split())) + " (reworded)"
        out.append(line)
        if line.strip().startswith("//"):
            continue
        fewer.append(line)
    return "\n".join(out) + "\n", "\n".join(fewer) + "\n"


def _model(ann, lines):
    """The annotations without their line numbers: each loop and region by its lines' code."""
    code = {f: [line.partition("//")[0].strip() for line in ls] for f, ls in lines.items()}
    loops = sorted((f, code[f][line - 1], sorted((k, v) for k, v in spec.items() if k != "where"))
                   for (f, line), spec in ann.loops.items())
    regions = sorted((r.id, r.kind, r.file, r.test, r.when, r.weight, code[r.file][r.first - 1],
                      tuple(code[r.file][n - 1] for n in sorted(r.lines) if code[r.file][n - 1]))
                     for r in ann.regions)
    return loops, regions


@pytest.mark.parametrize("name", ["forward_tiled.cuh", "forward_decode.cuh", "backward_tiled.cuh", "tables.cuh",
                                  "fourier_element_math.h"])
def test_comments_do_not_change_the_annotations(name):
    path = [f for f in build.header_files() if os.path.basename(f) == name][0]
    text = open(path).read()
    reworded, fewer = _reworded(text)
    assert reworded != text and len(fewer.splitlines()) < len(text.splitlines())
    a = annotations.parse_annotations(text, name)
    assert a.loops or a.regions
    b = annotations.parse_annotations(reworded, name)
    assert b.loops == a.loops and b.regions == a.regions  # the same lines
    c = annotations.parse_annotations(fewer, name)
    assert _model(c, {name: fewer.splitlines()}) == _model(a, {name: text.splitlines()})


# The launcher's choices: stated once in csrc/cuda/tile_switch.h and read by the report through its host
# program (nvcc needed, no disassembler).

@pytest.fixture(scope="module")
def host_info(tmp_path_factory):
    nvcc = _tool("nvcc")
    d = tmp_path_factory.mktemp("host")
    b = build.Builder(str(d / "cache"), str(d / "work"), nvcc, build.setup_nvcc_flags())
    head_dims = (4, 8, 16, 24, 64, 96, 128)
    info, _ = b.host_info(head_dims)
    return head_dims, info


def test_the_instances_are_the_launchers_choices_at_each_head_dim(host_info):
    """Each head dim's instances take their template arguments from tile_switch.h's choices: the forward's
    and the main pass's columns per thread cover the head dim's value columns (4 threads a row), grow with
    it, and every instance the report compiles is one the launcher's choices name."""
    head_dims, info = host_info
    c = info["constants"]
    assert (c["decode_rows_one"], c["decode_rows_most"]) == (1, c["kDecodeMaxRows"])
    previous = (0, 0)
    for hd in head_dims:
        sizes = info["sizes"][str(hd)]
        fwd, main = sizes["fwd_columns"], sizes["main_columns"]
        assert 4 * fwd >= hd and 4 * main >= hd, (hd, fwd, main)
        assert (fwd, main) >= previous, (hd, fwd, main, previous)
        previous = (fwd, main)
        assert sizes["tiled_backward"] == 1  # (D <= 128: the tiled backward)
        assert sizes["fwd_threads"] == c["kFwdThreads"] * (2 if fwd > 16 else 1)  # (forward_split)
        templates = {i.kind: i.template for i in build.launcher_instances(c, sizes)}
        assert templates["forward"] == f"forward_tiled_kernel<float, {fwd}>"
        assert templates["main"] == f"backward_main_tiled_kernel<float, {main}, true>"
        assert templates["decode"] == f"forward_decode_kernel<float, {c['decode_rows_most']}>"
        assert ("delta2" in templates) == (sizes["Dp"] >= c["kDeltaSplitMinFeatures"])
        without = {i.kind: i.template for i in build.launcher_instances(c, sizes, score_cache=False)}
        assert without["main"] == f"backward_main_tiled_kernel<float, {main}, false>" and "delta2" not in without
        # phi = ReLU: its Phi::kRelu instance of each kernel that computes scores (with_phi), the
        # power's main pass where it reads the pre-pass's scores (main_pass_phi)
        relu = {i.kind: i.template for i in build.launcher_instances(c, sizes, phi="relu")}
        assert relu["forward"] == f"forward_tiled_kernel<float, {fwd}, Phi::kRelu>"
        assert relu["delta"] == "backward_delta_tiled_kernel<float, 1, Phi::kRelu>"
        assert relu["main"] == templates["main"]
        assert relu["decode"] == f"forward_decode_kernel<float, {c['decode_rows_most']}, Phi::kRelu>"
        relu_without = {i.kind: i.template for i in build.launcher_instances(c, sizes, score_cache=False, phi="relu")}
        assert relu_without["main"] == f"backward_main_tiled_kernel<float, {main}, false, Phi::kRelu>"
        # phi = sigmoid: its Phi::kSigmoid instance of every kernel that computes scores, and of the
        # main pass with the score cache too (its g pass takes sigmoid's derivative)
        sigmoid = {i.kind: i.template for i in build.launcher_instances(c, sizes, phi="sigmoid")}
        assert sigmoid["forward"] == f"forward_tiled_kernel<float, {fwd}, Phi::kSigmoid>"
        assert sigmoid["delta"] == "backward_delta_tiled_kernel<float, 1, Phi::kSigmoid>"
        assert sigmoid["main"] == f"backward_main_tiled_kernel<float, {main}, true, Phi::kSigmoid>"
        assert sigmoid["decode"] == f"forward_decode_kernel<float, {c['decode_rows_most']}, Phi::kSigmoid>"
        assert ("delta2" in sigmoid) == ("delta2" in templates)
        sigmoid_without = {i.kind: i.template
                           for i in build.launcher_instances(c, sizes, score_cache=False, phi="sigmoid")}
        assert sigmoid_without["main"] == f"backward_main_tiled_kernel<float, {main}, false, Phi::kSigmoid>"
        assert {i.kind for i in build.launcher_instances(c, sizes, phi="sigmoid")} == set(templates)
        # odd p (x, x^3): its Phi::kOdd instance of every kernel that computes scores, and of the main
        # pass with the score cache too (it reads the scores' signs there); the decoding forward's
        # signed merge; the forward's shared memory with the score tile's sign bytes
        odd = {i.kind: i for i in build.launcher_instances(c, sizes, phi="odd")}
        assert odd["forward"].template == f"forward_tiled_kernel<float, {fwd}, Phi::kOdd>"
        assert odd["forward"].smem == "fwd_odd_smem_floats"
        assert sizes["fwd_odd_smem_floats"] == sizes["fwd_smem_floats"] + c["kFwdRows"] * c["kFwdKeys"] // 4
        assert odd["delta"].template == "backward_delta_tiled_kernel<float, 1, Phi::kOdd>"
        assert odd["main"].template == f"backward_main_tiled_kernel<float, {main}, true, Phi::kOdd>"
        assert odd["decode"].template == f"forward_decode_kernel<float, {c['decode_rows_most']}, Phi::kOdd>"
        assert odd["combine"].template == "forward_combine_kernel<float, true>"
        assert templates["combine"] == sigmoid["combine"] == "forward_combine_kernel<float>"
        assert ("delta2" in odd) == ("delta2" in templates) and set(odd) == set(templates)
        odd_without = {i.kind: i.template for i in build.launcher_instances(c, sizes, score_cache=False, phi="odd")}
        assert odd_without["main"] == f"backward_main_tiled_kernel<float, {main}, false, Phi::kOdd>"


def test_the_report_keeps_no_copy_of_the_launchers_choices():
    """The kernels' template arguments come from the host program (tile_switch.h): no rule by head dim in
    launcher_instances, and no module of the report reads the launcher's text."""
    import inspect

    assert "<=" not in inspect.getsource(build.launcher_instances)
    for name in os.listdir(PACKAGE):
        if name.endswith(".py"):
            assert "LAUNCH_HEADER" not in open(os.path.join(PACKAGE, name)).read(), name


def test_the_command_line_is_the_packages():
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "benchmarks", "cuda_sass_report.py"), "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "tile_switch.h" in r.stdout and "--no-score-cache" in r.stdout, r.stderr
    assert "--phi" in r.stdout
