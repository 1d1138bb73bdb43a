"""Runs the CUDA kernels of csrc/cuda on the CPU, under a host emulator, against the reference.

    python tests/cuda/emulation/run_emulated_check.py [--quick] [--fuzz N]
    python tests/cuda/emulation/run_emulated_check.py --quick --sanitize thread    # data races
    python tests/cuda/emulation/run_emulated_check.py --quick --sanitize address   # out of bounds

For machines without a GPU: compiles fourier_attention_launch.h + fourier_attention_kernels.cuh
as plain C++ (FF_HOST_EMULATION, with the emulator of csrc/cuda/emulation/; every CUDA thread is
an OS thread, barriers and shuffles are real, shared memory starts as NaN) with the installed
torch, in a throw-away module that registers those kernels as the CPU implementation of the
fourierformer ops. Checks forward,
backward, masks, causal, dropout and fully masked rows, for every phi the CUDA kernels run (the
powers, |x|, ReLU, sigmoid), against
fourierformer_fairseq.ops.fourier_attention_reference in float64, the decoding forward (few query
rows, keys split over blocks) against tests/oracle.py at decoding shapes, negative, zero and tiny
radii of every shape and non-finite inputs against tests/oracle.py, and the float32 sin/cos.

With --sanitize the module is built with the compiler's thread or address sanitizer (the script
restarts itself with the sanitizer's runtime preloaded), which then watches the same checks: a data
race between the threads of a block (a missing __syncthreads or __syncwarp, on shared or global
memory: what compute-sanitizer's racecheck finds on a GPU) or a read or write past a block's
shared memory or past a tensor (memcheck's) stops the run with a report. The blocks of a kernel
run one after another, so races between blocks (through global memory) are not seen there
(check_block_order runs every launch's blocks last to first as well: a result that depends on
their order differs); a shuffle is a barrier here, which on a GPU it is not for memory. Planted
bugs (emulated_sanitizer_probe in emulated_ops.h) must then be reported, each in a child process.

It does not model what only a GPU does (fast-math intrinsics, the memory model, timing); the
real check is tests/cuda/test_cuda_kernels.py on a GPU. The real extension (fourierformer_fairseq._C)
must not load in the same process, as both define the fourierformer library: importing this
module sets FOURIERFORMER_DISABLE_EXTENSION=1 before it imports the package.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

# --sanitize thread | address: the emulation module built with that sanitizer of the compiler that
# torch's builder runs (CXX, else c++), whose runtime must be the process's first library: the
# script starts itself again with it in LD_PRELOAD, before torch is imported (sanitizer_restart).
# A report stops the process with exit status SANITIZER_EXIT.
SANITIZERS = {  # runtime library, options variable, options
    "thread": ("libtsan.so", "TSAN_OPTIONS", "halt_on_error=1:exitcode=66"),
    "address": ("libasan.so", "ASAN_OPTIONS", "detect_leaks=0:halt_on_error=1:exitcode=66"),
}
# preloaded after the runtime: the C++ library, whose __cxa_throw the address sanitizer intercepts
# (python does not load it at start: a C++ exception, a refused input, would stop the run)
SANITIZER_ALSO = "libstdc++.so"
SANITIZER_EXIT = 66


def requested_sanitizer(argv):
    for i, arg in enumerate(argv):
        if arg == "--sanitize" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--sanitize="):
            return arg.split("=", 1)[1]
    return None


def sanitizer_restart(argv):
    """Under --sanitize KIND: returns in a process that has KIND's runtime loaded (LD_PRELOAD then
    set back to what it was, so that the compiler and ninja run without the runtime); otherwise
    replaces this process by the script run again with the runtime preloaded before anything the
    environment preloaded."""
    kind = requested_sanitizer(argv)
    if kind not in SANITIZERS:
        return  # (none asked for; argparse names a wrong one)
    lib, variable, options = SANITIZERS[kind]
    with open("/proc/self/maps") as maps:
        loaded = lib[: -len(".so")] in maps.read()
    if loaded:  # the children (compiler, ninja, the probes) get the preload the restart found, or none
        was = os.environ.pop("FF_EMU_SANITIZER_RESTARTED", "")[len("preload="):]
        if was:
            os.environ["LD_PRELOAD"] = was
        else:
            os.environ.pop("LD_PRELOAD", None)
        return
    if os.environ.get("FF_EMU_SANITIZER_RESTARTED"):
        raise SystemExit(f"--sanitize {kind}: {lib} did not load through LD_PRELOAD")
    cxx = os.environ.get("CXX", "c++")
    paths = []
    for name in (lib, SANITIZER_ALSO):
        try:
            path = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        except OSError as exc:
            raise SystemExit(f"--sanitize {kind}: cannot run the compiler {cxx}: {exc}")
        if not (os.path.isabs(path) and os.path.exists(path)):
            raise SystemExit(f"--sanitize {kind}: the compiler {cxx} has no {name} (a runtime that the sanitizer needs)")
        paths.append(path)
    before = os.environ.get("LD_PRELOAD", "")
    env = dict(os.environ, LD_PRELOAD=" ".join(paths + ([before] if before else [])),
               FF_EMU_SANITIZER_RESTARTED="preload=" + before)
    env[variable] = options + (":" + env[variable] if env.get(variable) else "")  # (yours win)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, os.path.abspath(argv[0]), *argv[1:]], env)


if __name__ == "__main__":
    sanitizer_restart(sys.argv)

import torch  # noqa: E402
from torch.utils.cpp_extension import load_inline  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(os.path.dirname(HERE))
ROOT = os.path.dirname(TESTS)
CSRC = os.path.join(ROOT, "csrc")
EMULATION = os.path.join(CSRC, "cuda", "emulation")
# the package of this checkout, and the tests' shared modules (helpers, oracle: torch only)
sys.path[:0] = [ROOT, TESTS]
# importing the package loads the real extension unless this is set: the emulated library
# defines the same ops
os.environ["FOURIERFORMER_DISABLE_EXTENSION"] = "1"

from fourierformer_fairseq.ops.reference import dropout_keep_mask, fourier_attention_reference  # noqa: E402
from helpers import NONFINITE, nonfinite_case, random_qkv  # noqa: E402
from oracle import (float64_mismatches, lse_mismatches, oracle_attention, oracle_gradient_scales,  # noqa: E402
                    oracle_gradients, oracle_mismatches, oracle_weights)


print = functools.partial(print, flush=True)  # progress shows up at once, also through a pipe


def build(sanitize=None, build_dir=None):
    """The emulation module. sanitize ("thread", "address"): compiled with that sanitizer (the
    process must have its runtime loaded: sanitizer_restart). build_dir: build there and keep it
    (a second process then loads the same build); default a fresh directory, removed after."""
    # A fresh directory per run: torch's builder waits, without a time limit, for a lock file
    # that a killed earlier build in a shared directory would have left behind.
    directory = build_dir or tempfile.mkdtemp(prefix="ff_cuda_emulation_")
    sanitizer_flags = [f"-fsanitize={sanitize}", "-g", "-fno-omit-frame-pointer"] if sanitize else []
    try:
        return load_inline(
            name="ff_cuda_emulation",
            cpp_sources=[f'#include "{os.path.join(EMULATION, "emulated_ops.h")}"'],
            functions=["emulated_sincosf", "emulated_sanitizer_probe"],
            extra_include_paths=[CSRC],
            # -O2: 5 s more to build, no faster
            extra_cflags=["-O1", "-DFF_HOST_EMULATION=1", "-Wall", "-Wno-unknown-pragmas"] + sanitizer_flags,
            extra_ldflags=["-lpthread"] + sanitizer_flags[:1],
            build_directory=directory,
            verbose=False,
        )
    finally:  # the loaded library stays mapped; the files are not needed any more
        if build_dir is None:
            shutil.rmtree(directory, ignore_errors=True)


def check_sincos(mod):
    x = torch.cat([
        torch.linspace(-70000, 70000, 200001, dtype=torch.float64),
        torch.linspace(-20, 20, 200001, dtype=torch.float64),
        torch.arange(-2000, 2001, dtype=torch.float64) * math.pi,  # next to the zeros of sin
        torch.arange(-2000, 2001, dtype=torch.float64) * math.pi / 2,
        torch.tensor([0.0, 1e-30, 0.2499, 0.25, 0.2501, 1e5, 3e6, 1e9, -1e9]),
    ]).to(torch.float32)
    s, c, g, l = mod.emulated_sincosf(x)
    xd = x.double()
    sd, cd = torch.sin(xd), torch.cos(xd)
    # error relative to the float32 spacing of the result (1 ulp of max(|sin|, tiny))
    ulp_s = ((s.double() - sd).abs() / torch.clamp(sd.abs(), min=2**-60) * 2**23)
    ulp_c = ((c.double() - cd).abs() / torch.clamp(cd.abs(), min=2**-60) * 2**23)
    big = xd.abs() > 65536
    print(f"  ff_sincosf: max ulp sin {ulp_s[~big].max():.2f}, cos {ulp_c[~big].max():.2f} (|x| <= 65536); "
          f"abs err beyond {max((s.double() - sd)[big].abs().max(), (c.double() - cd)[big].abs().max()):.1e}")
    assert ulp_s[~big].max() < 4 and ulp_c[~big].max() < 4
    # g(x) = cot x - 1/x and log|sinc| against float64 (where sin is not clamped)
    ok = (sd.abs() > 1e-6) & (xd.abs() < 1e6)
    gd = torch.where(xd.abs() < 1e-3, -xd / 3, cd / sd - 1 / torch.where(xd == 0, torch.ones_like(xd), xd))
    safe_x = torch.where(xd == 0, torch.ones_like(xd), xd)
    ld = torch.where(xd == 0, torch.zeros_like(xd), torch.log((sd / safe_x).abs()))
    gerr = ((g.double() - gd).abs() / (gd.abs() + 1e-2))[ok].max()
    lerr = ((l.double() - ld).abs() / (ld.abs() + 1e-2))[ok].max()
    print(f"  g(x) max rel err {gerr:.1e}, log|sinc x| max rel err {lerr:.1e}")
    assert gerr < 1e-4 and lerr < 2e-5


def make_case(B, H, N, M, D, Dv, dtype, *, mask=None, kpm=False, causal=False, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = random_qkv(B, H, N, M, D, Dv, generator=g, dtype=torch.float64, scale=scale)
    radius = (0.5 + torch.rand(H, D, generator=g, dtype=torch.float64))
    attn_mask = None
    if mask == "random":
        attn_mask = torch.zeros(B, 1, N, M, dtype=torch.float64).masked_fill(
            torch.rand(B, 1, N, M, generator=g) < 0.3, float("-inf"))
    elif mask == "float":
        attn_mask = torch.randn(1, H, N, M, generator=g, dtype=torch.float64)
    elif mask == "full_row":  # query rows 0 and N-1 see nothing
        attn_mask = torch.zeros(N, M, dtype=torch.float64)
        attn_mask[0] = float("-inf")
        attn_mask[-1] = float("-inf")
        attn_mask = attn_mask.reshape(1, 1, N, M)
    key_padding = None
    if kpm:
        key_padding = torch.rand(B, M, generator=g) < 0.25
        key_padding[:, 0] = False
        if B > 1:
            key_padding[-1] = True  # a batch whose keys are all padding
    return dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), radius=radius, attn_mask=attn_mask,
                key_padding=key_padding, causal=causal)


def op_args(case, power, dropout_p, seed, normaliser_eps=0.0, phi="power"):
    """The forward op's arguments for `case` (make_case): the radius, the mask and the key padding
    (as a key bias of -inf) in the accumulation dtype (float64 for float64 inputs, else float32);
    with a phi other than "power", also tables (None) and phi (the op's power is then 1)."""
    acc = torch.float64 if case["q"].dtype == torch.float64 else torch.float32
    kpm = case["key_padding"]
    key_bias = None if kpm is None else torch.zeros(kpm.shape, dtype=acc).masked_fill(kpm, float("-inf"))
    attn_mask = None if case["attn_mask"] is None else case["attn_mask"].to(acc)
    args = (case["q"], case["k"], case["v"], case["radius"].to(acc), op_power(phi, power), attn_mask, key_bias,
            case["causal"], dropout_p, seed, normaliser_eps)
    return args if phi == "power" else args + (None, phi)


def op_power(phi, power):
    """The op's power for phi: the call's for "power", 1 for |x|, ReLU and sigmoid (the ops take no other)."""
    return float(power) if phi == "power" else 1.0


def forward_backward(args, dout):
    """(out, lse, dq, dk, dv, dradius) of the ops on op_args' arguments."""
    out, lse = torch.ops.fourierformer.fourier_attention_forward(*args)
    return (out, lse, *torch.ops.fourierformer.fourier_attention_backward(dout, *args[:4], out, lse, *args[4:]))


@contextlib.contextmanager
def environment(name, value):
    """The emulator's (or the launcher's) environment variable `name` set to `value` inside."""
    os.environ[name] = value
    try:
        yield
    finally:
        del os.environ[name]


def run_case(name, case, power, dropout_p=0.0, seed=1234, rtol=1e-9, atol=1e-9, normaliser_eps=0.0, phi="power"):
    t0 = time.time()
    q, k, v, radius, kpm = case["q"], case["k"], case["v"], case["radius"], case["key_padding"]
    B, H, N, _ = q.shape
    dout = torch.randn(B, H, N, v.shape[-1], generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    out, lse, dq, dk, dv, dr = forward_backward(op_args(case, power, dropout_p, seed, normaliser_eps, phi),
                                                dout.to(q.dtype))

    # float64 reference with autograd
    qr, kr, vr, rr = (t.detach().double().requires_grad_(True) for t in (q, k, v, radius))
    ref = fourier_attention_reference(qr, kr, vr, rr, power=power, phi=phi, attn_mask=case["attn_mask"],
                                      key_padding_mask=kpm, causal=case["causal"], dropout_p=dropout_p, seed=seed,
                                      normaliser_eps=normaliser_eps)
    ref.backward(dout)
    worst = []
    for label, got, want in (("out", out, ref), ("dq", dq, qr.grad), ("dk", dk, kr.grad), ("dv", dv, vr.grad),
                             ("dradius", dr, rr.grad)):
        got = got.double()
        assert got.shape == want.shape, (label, got.shape, want.shape)
        assert torch.isfinite(got).all(), f"{name}: {label} has non-finite values"
        err = (got - want).abs().max().item()
        bound = atol + rtol * want.abs().max().item()
        worst.append(f"{label} {err:.1e}")
        if not err <= bound:
            raise AssertionError(f"{name}: {label} max err {err:.3e} > {bound:.3e}")
    # rows without any visible key: out 0, lse +inf
    if case["attn_mask"] is not None or kpm is not None:
        dead = torch.isinf(lse)
        if dead.any():
            assert (out[dead] == 0).all(), f"{name}: fully masked rows not zero"
    print(f"  ok  {name:<44} {', '.join(worst)}  ({time.time() - t0:.1f}s)")


def check_smem_limit(f32):
    """A GPU with 99 KiB of shared memory per block (sm_86, sm_89: 101376 bytes, FF_EMU_SMEM_OPTIN):
    Dv above 128 takes the simple forward kernel (the tiled one would ask for 124 KiB at Dv 160),
    D = Dv = 128 still the tiled forward and backward (89 and 99 KiB)."""
    case = make_case(1, 1, 9, 40, 64, 160, torch.float32, scale=0.3)

    def forward():
        return torch.ops.fourierformer.fourier_attention_forward(
            case["q"], case["k"], case["v"], case["radius"].float(), 4.0, None, None, False, 0.0, 0, 0.0)[0]

    unlimited = forward()
    with environment("FF_EMU_SMEM_OPTIN", "101376"):
        limited = forward()
        run_case("f32 D64 Dv160 at 99 KiB per block", case, 4, 0.0, **f32)
        run_case("f32 D128 Dv128 at 99 KiB per block", make_case(1, 1, 9, 70, 128, 128, torch.float32, scale=0.3), 4,
                 0.0, **f32)
    # the same inputs through the other kernel: not bit for bit the same output
    assert not torch.equal(unlimited, limited), "the 99 KiB limit did not change the forward's kernel"
    print("  ok  99 KiB per block: Dv 160 runs the simple forward kernel")


def backward_two_ways(case, env, value, dout_seed, also, phi="power", power=4):
    """The float32 backward of `case` (power 4 or `power`, or phi's power, causal, its key padding as a
    key bias, dropout 0.2) with the environment variable `env` unset and then set to `value`, `also()`
    run while it is set; the two (dq, dk, dv, dradius)."""
    assert case["causal"] and case["attn_mask"] is None
    args = op_args(case, power, 0.2, 5, 0.0, phi)
    out, lse = torch.ops.fourierformer.fourier_attention_forward(*args)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(dout_seed))

    def backward():
        return torch.ops.fourierformer.fourier_attention_backward(dout, *args[:4], out, lse, *args[4:])

    first = backward()
    with environment(env, value):
        second = backward()
        also()
    return first, second


def check_score_cache(f32):
    """The tiled backward's main pass with the pre-pass's score cache (within kScoreCacheBytes:
    the default; rows of M rounded up to a multiple of 4) and without (FF_EMU_SCORE_CACHE_BYTES=0:
    it computes the scores again): both against the reference, and the two alike (the same P; dq's
    atomics may add in another order). Causal with a key padding mask and dropout: the cache holds
    no scores for the keys a query block does not see, which the main pass must read as -inf; M =
    70, not a multiple of 4: the last 4 keys of a row straddle its end."""
    case = make_case(2, 1, 69, 70, 16, 12, torch.float32, causal=True, kpm=True, scale=0.7)
    cached, recomputed = backward_two_ways(
        case, "FF_EMU_SCORE_CACHE_BYTES", "0", 11,
        lambda: run_case("f32 causal kpm dropout, no score cache", case, 4, 0.2, **f32))
    run_case("f32 causal kpm dropout, score cache", case, 4, 0.2, **f32)
    for name, a, b in zip(("dq", "dk", "dv", "dradius"), cached, recomputed):
        err = (a - b).abs().max().item()
        same = err <= 1e-6 * max(1.0, b.abs().max().item()) if name in ("dq", "dradius") else torch.equal(a, b)
        assert same, f"score cache: {name} differs by {err:.3e}"
    print("  ok  score cache and recomputed scores agree (dk, dv bit for bit; dq, dradius to rounding)")
    check_score_cache_budget()


def check_relu_kills(f32):
    """ReLU's main pass that computes its scores (without the score cache: its own instance), and
    that the ReLU cases above are not |x|'s: at a case of them, the keys that a negative factor
    zeroes move out by far more than the bound (so that a kernel that ignored the sign fails)."""
    case = make_case(2, 1, 69, 70, 16, 12, torch.float32, causal=True, kpm=True, scale=0.7)
    with environment("FF_EMU_SCORE_CACHE_BYTES", "0"):
        run_case("f32 relu causal kpm dropout, no score cache", case, 1, 0.2, phi="relu", **f32)
    case = make_case(1, 1, 33, 70, 40, 20, torch.float32)
    outs = {phi: torch.ops.fourierformer.fourier_attention_forward(*op_args(case, 1, 0.0, 0, 0.0, phi))[0]
            for phi in ("abs", "relu")}
    moved = (outs["relu"] - outs["abs"]).abs().max().item()
    bound = f32["atol"] + f32["rtol"] * outs["abs"].abs().max().item()
    assert moved > 100 * bound, f"ReLU and |x| agree within {moved:.1e}: the ReLU cases check no sign"
    print(f"  ok  ReLU's zero weights move out by {moved:.1e} from |x|'s (the bound: {bound:.1e})")


def cache_and_splits(cache_name, split_name, cache_kw, split_kw, run):
    """A phi's own instances of the tiled backward, as check_score_cache and check_grid_splits: with
    the pre-pass's score cache and without it (FF_EMU_SCORE_CACHE_BYTES=0; M = 70: the last 4 keys of
    a row straddle its end), and on a small grid (D 100: the pre-pass in two halves and four main-pass
    splits; D 40: two splits, dk and dv bit for bit) and whole; each against the reference
    (`run(label, case, kw)`) and the two alike. cache_kw and split_kw: backward_two_ways' phi keywords."""
    case = make_case(2, 1, 69, 70, 16, 12, torch.float32, causal=True, kpm=True, scale=0.7)
    label = f"f32 {cache_name} causal kpm dropout"
    cached, recomputed = backward_two_ways(case, "FF_EMU_SCORE_CACHE_BYTES", "0", 11,
                                           lambda: run(label + ", no score cache", case, cache_kw), **cache_kw)
    run(label + ", score cache", case, cache_kw)
    for name, a, b in zip(("dq", "dk", "dv", "dradius"), cached, recomputed):
        err = (a - b).abs().max().item()
        same = err <= 1e-6 * max(1.0, b.abs().max().item()) if name in ("dq", "dradius") else torch.equal(a, b)
        assert same, f"{cache_name}, score cache: {name} differs by {err:.3e}"
    for D, Dv, N, M, same in ((40, 40, 37, 70, True), (100, 12, 37, 70, False)):
        case = make_case(2, 1, N, M, D, Dv, torch.float32, causal=True, kpm=True, scale=0.4, seed=D)
        label = f"f32 {split_name} D{D} Dv{Dv} N{N} M{M} causal kpm dropout"
        split, whole = backward_two_ways(case, "FF_EMU_SM_COUNT", "1", 12,
                                         lambda: run(label + ", whole", case, split_kw), **split_kw)
        run(label + ", split", case, split_kw)
        for name, a, b in zip(("dq", "dk", "dv", "dradius"), split, whole):
            err = (a - b).abs().max().item()
            rel = 1e-6 if same else 1e-5
            ok = torch.equal(a, b) if same and name in ("dk", "dv") else err <= rel * max(1.0, b.abs().max().item())
            assert ok, f"{split_name}, grid splits: {name} differs by {err:.3e} (D {D}, Dv {Dv})"


def check_sigmoid_paths(f32):
    """phi = sigmoid's own instances of the tiled backward: the main pass with the pre-pass's score
    cache (its g pass takes sigmoid's derivative: another instance than the power's) and without it
    (it computes the scores: FF_EMU_SCORE_CACHE_BYTES=0), both against the reference and the two
    alike as in check_score_cache (M = 70: the last 4 keys of a row straddle its end); on a small grid
    (D 100: the pre-pass in two halves, which swap sums, and four main-pass splits; D 40: two splits,
    dk and dv bit for bit) and on the whole one; and the simple float32 forward where the GPU allows
    99 KiB per block (Dv 160)."""
    cache_and_splits("sigmoid", "sigmoid", dict(phi="sigmoid"), dict(phi="sigmoid"),
                     lambda label, case, kw: run_case(label, case, 1, 0.2, phi="sigmoid", **f32))
    case = make_case(1, 1, 9, 40, 64, 160, torch.float32, scale=0.3)
    args = op_args(case, 1, 0.0, 0, 0.0, "sigmoid")
    unlimited = torch.ops.fourierformer.fourier_attention_forward(*args)[0]
    with environment("FF_EMU_SMEM_OPTIN", "101376"):
        limited = torch.ops.fourierformer.fourier_attention_forward(*args)[0]
        run_case("f32 sigmoid D64 Dv160 at 99 KiB per block", case, 1, 0.0, phi="sigmoid", **f32)
    assert not torch.equal(unlimited, limited), "the 99 KiB limit did not change sigmoid's forward kernel"
    print("  ok  sigmoid: score cache and recomputed scores, split and whole agree; the simple forward at 99 KiB")


# phi(x) = x^p with odd p (x and x^3: Phi::kOdd, signed weights normalised by their signed sum plus
# eps in the kernels; tests/oracle.py knows them). Each case against the float64 oracle: float32 within
# oracle_mismatches' bound (which grows with a row's sum of |P| where its weights cancel), lse within
# lse_mismatches' (log|sum|), float64 within float64_mismatches' 1e-9 of the scale.
def odd_mismatches(case, power, dropout_p=0.0, seed=5, normaliser_eps=0.0, dout_seed=7):
    """What breaks the oracle's bounds for `case` (make_case) at odd `power`: the forward, the four
    gradients and lse; rows that see no key must give 0 with lse +inf. Returns (mismatches, results)."""
    q, k, v, radius, kpm = case["q"], case["k"], case["v"], case["radius"], case["key_padding"]
    B, H, N, _ = q.shape
    M = k.shape[2]
    dout = torch.randn(B, H, N, v.shape[-1], generator=torch.Generator().manual_seed(dout_seed), dtype=torch.float64)
    results = forward_backward(op_args(case, power, dropout_p, seed, normaliser_eps), dout.to(q.dtype))
    out, lse, *grads = results
    kwargs = dict(power=power, attn_mask=case["attn_mask"], key_padding_mask=kpm, causal=case["causal"],
                  normaliser_eps=normaliser_eps)
    okw = dict(kwargs)
    if dropout_p:
        okw["dropout_scale"] = dropout_keep_mask(seed, (B, H, N, M), dropout_p, "cpu").double() / (1 - dropout_p)
    ours = (out, *grads)
    if q.dtype == torch.float64:
        bad = float64_mismatches(ours, q, k, v, radius, dout, **okw)
    else:
        bad = oracle_mismatches(ours, q.double(), k.double(), v.double(), radius, dout, **okw)
        bad += lse_mismatches(lse, q.double(), k.double(), radius, **kwargs)
    seen = (oracle_weights(q.double(), k.double(), radius, **kwargs) != 0).any(-1)
    if not (out[~seen] == 0).all() or not torch.isposinf(lse[~seen]).all():
        bad.append("a row that sees no key is not 0 with lse +inf")
    return bad, results


def odd_case(name, case, power, **kwargs):
    t0 = time.time()
    bad, _ = odd_mismatches(case, power, **kwargs)
    print(f"  {'ok ' if not bad else 'BAD'} {name:60s} ({time.time() - t0:.1f}s) {'; '.join(bad)}")
    if bad:
        raise AssertionError(f"{name}: {'; '.join(bad)}")


def cancelling_case(power, N, dtype, mask=False, seed=0):
    """Rows whose signed weights cancel to a sum of relative size 1e-1 .. 1e-4 (tests/ops/
    test_fused_phis.py's construction: one sequence per size, each row's keys in feature 0 at x =
    q0 (sinc m1 (1 + delta) > 0), x1 (sinc -m1) and 2 pi (sinc 0), the other features a little off
    q's; q and k rounded to float32), N rows per sequence (each a little off the others), as a
    make_case case."""
    x1 = 4.4934094579
    m1 = abs(math.sin(x1) / x1)
    deltas = (1e-1, 1e-2, 1e-3, 1e-4)

    def solve(target):  # x in (0, pi) with sinc(x) = target
        lo, hi = 1e-9, 3.14159
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if math.sin(mid) / mid > target else (lo, mid)
        return (lo + hi) / 2

    H, D, Dv = 2, 16, 5
    g = torch.Generator().manual_seed(seed)
    q = torch.zeros(len(deltas), H, N, D, dtype=torch.float64)
    k = torch.zeros(len(deltas), H, 3, D, dtype=torch.float64)
    for b, delta in enumerate(deltas):
        q[b, :, :, 0] = solve(m1 * (1 + delta))
        k[b, :, 1, 0] = q[b, 0, 0, 0] - x1
        k[b, :, 2, 0] = q[b, 0, 0, 0] - 2 * math.pi
    q = q + 1e-3 * torch.randn(q.shape, generator=g, dtype=torch.float64) * (torch.arange(D) > 0)
    q, k = q.float(), k.float()  # (rounded to float32 for every dtype, as the CPU test's)
    v = torch.randn(len(deltas), H, 3, Dv, generator=g, dtype=torch.float64)
    attn_mask = torch.tensor([[0.0, 0.0, -1.0]], dtype=torch.float64).expand(N, 3).reshape(1, 1, N, 3) if mask else None
    return dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), radius=torch.ones(H, D, dtype=torch.float64),
                attn_mask=attn_mask, key_padding=None, causal=False)


def check_odd_powers(quick):
    """phi(x) = x^p with odd p (1 and 3; 5 in the fuzz) on every kernel path against the float64 oracle:
    the float64 simple kernels; the float32 tiled forward (N > 8) and the decoding forward (N <= 8),
    the tiled backward (pre-pass and main pass) and the simple float32 backward (D above 128); masks
    (-inf at random, finite additive ones per head), causal, key padding with a batch of padding
    only, rows that see no key, dropout, the null key (normaliser_eps: applied by the kernels to the
    signed sum), rows whose signed sum nearly cancels (with and without eps, each path); the main pass
    with and without the score cache (its sign bytes) and split on a small grid; and that the cases
    check signs at all: x's output moves far from |x|'s."""
    f32 = dict(rtol=2e-4, atol=2e-5)
    cases = [
        ("f64 x^3 N37 M45 D59 Dv33 mask", make_case(1, 2, 37, 45, 59, 33, torch.float64, mask="random"), 3, {}),
        ("f64 x causal kpm dropout null key", make_case(2, 1, 5, 40, 8, 12, torch.float64, causal=True, kpm=True), 1,
         dict(dropout_p=0.2, normaliser_eps=1e-3)),
        ("f64 x^3 float mask H-broadcast", make_case(2, 3, 9, 33, 4, 5, torch.float64, mask="float"), 3, {}),
        ("f64 x fully masked rows", make_case(1, 1, 6, 10, 3, 4, torch.float64, mask="full_row"), 1, {}),
        ("f32 x N33 M70 D40", make_case(1, 1, 33, 70, 40, 20, torch.float32), 1, {}),
        ("f32 x^3 N33 M70 D40", make_case(1, 1, 33, 70, 40, 20, torch.float32), 3, {}),
        ("f32 x^3 causal dropout kpm", make_case(2, 1, 20, 41, 5, 3, torch.float32, causal=True, kpm=True), 3,
         dict(dropout_p=0.2)),
        ("f32 x D100 Dv100 N9 M70 causal float mask", make_case(1, 1, 9, 70, 100, 100, torch.float32, causal=True,
                                                                scale=0.8, mask="float"), 1, {}),
        ("f32 x^3 fully masked rows N65 M70", make_case(1, 2, 65, 70, 24, 8, torch.float32, mask="full_row"), 3, {}),
        ("f32 x^3 null key causal N65 M70 mask", make_case(1, 2, 65, 70, 16, 8, torch.float32, causal=True,
                                                           mask="random", scale=0.7), 3, dict(normaliser_eps=1e-2)),
        ("f32 x null key D129 Dv200 (decoding forward, simple backward)",
         make_case(1, 1, 5, 7, 129, 200, torch.float32, scale=0.3), 1, dict(normaliser_eps=0.5)),
        ("f32 x^3 D129 Dv200 N9 M7 (simple backward)", make_case(1, 1, 9, 7, 129, 200, torch.float32, scale=0.8), 3,
         {}),
        ("f32 x^3 large |x| (scale 20)", make_case(1, 1, 9, 40, 8, 8, torch.float32, scale=20.0), 3, {}),
        # the decoding forward (N <= 8): every register-row count, key chunks, masks, the null key
        ("f32 decoding x N1 M130 kpm", make_case(2, 2, 1, 130, 16, 16, torch.float32, kpm=True, scale=0.5), 1, {}),
        ("f32 decoding x^3 N3 M130 causal kpm dropout", make_case(2, 1, 3, 130, 16, 12, torch.float32, causal=True,
                                                                  kpm=True, scale=0.5, seed=7), 3,
         dict(dropout_p=0.2)),
        ("f32 decoding x^3 N8 M200 full rows", make_case(2, 2, 8, 200, 16, 16, torch.float32, mask="full_row",
                                                         scale=0.5), 3, {}),
        ("f32 decoding x N6 M129 D64 kpm null key", make_case(2, 1, 6, 129, 64, 20, torch.float32, kpm=True,
                                                              scale=0.5), 1, dict(normaliser_eps=1e-3)),
        ("f32 decoding x^3 N4 M130 D128 float mask", make_case(1, 2, 4, 130, 128, 100, torch.float32, mask="float",
                                                               scale=0.3), 3, {}),
    ]
    if not quick:
        cases += [
            ("f64 x^3 D256 Dv256 N3 M33", make_case(1, 1, 3, 33, 256, 256, torch.float64, scale=0.3), 3, {}),
            ("f32 x D256 Dv256 N70 M40 (simple backward)", make_case(1, 1, 70, 40, 256, 256, torch.float32,
                                                                     scale=0.3), 1, {}),
        ]
    for name, case, power, kwargs in cases:
        odd_case(name, case, power, **kwargs)
    # rows near a zero normaliser: the decoding forward (N 1), the tiled one (N 12), float64; with a
    # finite additive mask; with and without eps
    for power in (1, 3):
        for N, dtype, mask in ((1, torch.float32, False), (12, torch.float32, True), (12, torch.float32, False),
                               (2, torch.float64, False)):
            case = cancelling_case(power, N, dtype, mask, seed=power)
            w = oracle_weights(case["q"].double(), case["k"].double(), case["radius"], power=power)
            assert w.abs().sum(-1).max() > 1e3, "the case has no cancelling row"
            for eps in (0.0, 1e-3):
                odd_case(f"{str(dtype).split('.')[-1]} p={power} near-zero normaliser N{N}{' mask' if mask else ''} "
                         f"eps={eps}", case, power, normaliser_eps=eps)
    # the score cache's sign bytes and the recomputed signs, split and whole (as check_score_cache and
    # check_grid_splits): against the oracle and each other
    cache_and_splits("x^3", "x", dict(power=3), dict(power=1),
                     lambda label, case, kw: odd_case(label, case, kw["power"], dropout_p=0.2))
    # the blocks of every launch last to first (check_block_order): the decoding forward, the tiled
    # kernels split on a small grid, float64
    for label, case, dropout_p in (
            ("f32 x^3 D100 Dv12 N37 M70", make_case(2, 1, 37, 70, 100, 12, torch.float32, causal=True, kpm=True,
                                                     scale=0.4, seed=102), 0.2),
            ("f32 x decoding D16 Dv12 N5 M130", make_case(2, 2, 5, 130, 16, 12, torch.float32, causal=True, kpm=True,
                                                          scale=0.5, seed=6), 0.2),
            ("f64 x^3 D9 Dv5 N37 M45", make_case(1, 2, 37, 45, 9, 5, torch.float64, mask="random"), 0.3)):
        args = op_args(case, 3 if "x^3" in label else 1, dropout_p, 5, 1e-3)
        B, H, N, _ = case["q"].shape
        dout = torch.randn(B, H, N, case["v"].shape[-1], generator=torch.Generator().manual_seed(9),
                           dtype=args[3].dtype)
        first = forward_backward(args, dout)
        with environment("FF_EMU_BLOCK_ORDER", "reverse"):
            last = forward_backward(args, dout)
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv", "dradius"), first, last):
            if name in ("dq", "dradius"):
                ok = (a - b).abs().max().item() <= 1e-6 * max(1.0, b.abs().max().item())
            else:
                ok = torch.equal(a, b)
            assert ok, f"block order: {label}: {name} differs when the blocks run last to first"
    # the cases check signs: x's output is far from |x|'s (the tiled forward and the decoding one)
    for N in (33, 5):
        case = make_case(1, 1, N, 70, 40, 20, torch.float32)
        outs = {phi: torch.ops.fourierformer.fourier_attention_forward(*op_args(case, 1, 0.0, 0, 0.0, phi))[0]
                for phi in ("abs", "power")}
        moved = (outs["power"] - outs["abs"]).abs().max().item()
        bound = f32["atol"] + f32["rtol"] * outs["abs"].abs().max().item()
        assert moved > 100 * bound, f"x and |x| agree within {moved:.1e} at N {N}: the odd cases check no sign"
    print("  ok  odd powers: score cache and recomputed signs, split and whole, blocks in either order agree; "
          "x moves far from |x|")


def check_score_cache_budget():
    """The launcher's budget for the score cache at the call (score_cache.h, as on a GPU where
    FF_EMU_SCORE_CACHE_BYTES is unset): a quarter of the free memory (FF_EMU_FREE_MEMORY_BYTES
    here), FOURIERFORMER_SCORE_CACHE_MB overriding it. At D 64 on a small grid only the cached
    backward runs its pre-pass in two halves, whose dk and dv differ from the whole pre-pass's in
    the last bits, which tells here which way the launcher went: with the cache's bytes exactly a
    quarter of the free memory the cache is used, one byte less free it is not (each bit for bit as
    with the budget set to all or nothing), and the setting decides whatever the free memory."""
    case = make_case(1, 1, 37, 40, 64, 8, torch.float32, scale=0.4, seed=64)
    args = op_args(case, 4, 0.0, 0)
    out, lse = torch.ops.fourierformer.fourier_attention_forward(*args)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(13))
    cache_bytes = 37 * 40 * 4  # (B H N rows of M rounded up to 4 floats)

    def dk_dv(**env):
        with contextlib.ExitStack() as stack:
            for name, value in env.items():
                stack.enter_context(environment(name, value))
            _, dk, dv, _ = torch.ops.fourierformer.fourier_attention_backward(dout, *args[:4], out, lse, *args[4:])
        return dk, dv

    cached = dk_dv(FF_EMU_SCORE_CACHE_BYTES=str(cache_bytes))
    recomputed = dk_dv(FF_EMU_SCORE_CACHE_BYTES="0")
    assert not all(torch.equal(a, b) for a, b in zip(cached, recomputed)), \
        "the check cannot tell the two backwards apart (the pre-pass did not split?)"
    for label, want, env in (
            ("free memory 4x the cache", cached, dict(FF_EMU_FREE_MEMORY_BYTES=str(4 * cache_bytes))),
            ("one byte less free", recomputed, dict(FF_EMU_FREE_MEMORY_BYTES=str(4 * cache_bytes - 1))),
            ("the default free memory", cached, {}),
            ("FOURIERFORMER_SCORE_CACHE_MB=0", recomputed, dict(FOURIERFORMER_SCORE_CACHE_MB="0")),
            ("FOURIERFORMER_SCORE_CACHE_MB=1, nothing free", cached,
             dict(FOURIERFORMER_SCORE_CACHE_MB="1", FF_EMU_FREE_MEMORY_BYTES="0"))):
        got = dk_dv(**env)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), \
            f"score cache budget, {label}: expected the {'cached' if want is cached else 'recomputing'} backward"
    try:
        dk_dv(FOURIERFORMER_SCORE_CACHE_MB="256MB")
    except RuntimeError as e:
        assert "FOURIERFORMER_SCORE_CACHE_MB must be a whole number of MiB" in str(e), e
    else:
        raise AssertionError("FOURIERFORMER_SCORE_CACHE_MB=256MB was taken")
    print("  ok  score cache budget: a quarter of the free memory, FOURIERFORMER_SCORE_CACHE_MB overriding it")


def check_grid_splits(f32):
    """Where the grid is small (against the emulated GPU's 132 SMs, FF_EMU_SM_COUNT; with the score
    cache), the backward splits its work: the main pass each key tile's features over up to four
    blocks (main_pass_splits), the pre-pass into two halves of a block at D >= 64
    (delta_pass_split); FF_EMU_SM_COUNT=1 splits nothing. Both against the reference and against
    each other: with the main pass split alone (D 40: two splits of 32 and 8 features) dk and dv
    bit for bit (the same sums; dq and dradius to float atomics' order); with the two-half pre-pass
    (D 100: Dp 104, four main-pass splits of 32, 32, 32 and 8 features, the last with 4 real
    ones; D = Dv = 128 at N = M = 64, the IWSLT'14 benchmark's tile) within 1e-5 relative (its
    halves' scores round otherwise, by |S| eps32 in P). Causal with a key padding mask and
    dropout; Dv 12 (the dv tile's phases through shared memory), 40 and 128."""
    for D, Dv, N, M, same in ((40, 40, 37, 70, True), (100, 12, 37, 70, False), (128, 128, 64, 64, False)):
        case = make_case(2, 1, N, M, D, Dv, torch.float32, causal=True, kpm=True, scale=0.4, seed=D)
        label = f"f32 D{D} Dv{Dv} N{N} M{M} causal kpm dropout"
        split, whole = backward_two_ways(case, "FF_EMU_SM_COUNT", "1", 12,
                                         lambda: run_case(label + ", whole", case, 4, 0.2, **f32))
        run_case(label + ", split", case, 4, 0.2, **f32)
        for name, a, b in zip(("dq", "dk", "dv", "dradius"), split, whole):
            err = (a - b).abs().max().item()
            rel = 1e-6 if same else 1e-5
            ok = torch.equal(a, b) if same and name in ("dk", "dv") else err <= rel * max(1.0, b.abs().max().item())
            assert ok, f"grid splits: {name} differs by {err:.3e} (D {D}, Dv {Dv})"
    print("  ok  backward split for small grids and whole agree (main pass alone: dk, dv bit for bit)")


def check_block_order():
    """The blocks of every launch run last to first (FF_EMU_BLOCK_ORDER=reverse) against first to
    last: out, lse, dk and dv bit for bit (each written by one block: a difference is two blocks
    writing one word, or a block reading what another of the same launch writes), dq and dradius
    (summed over blocks by atomics) to float rounding. float32 with the backward split on a small
    grid (D 100: the pre-pass in halves, four main-pass splits; D 40: two), several query and key
    tiles with remainders, causal, key padding, dropout; float64 (the simple kernels); the decoding
    forward (several key chunks); phi = sigmoid's float32 instances."""
    cases = (("f32 D100 Dv12 N37 M70", make_case(2, 1, 37, 70, 100, 12, torch.float32, causal=True, kpm=True,
                                                scale=0.4, seed=100), 0.2),
             # phi = sigmoid's instances: the pre-pass's halves swap sums, the main pass's splits
             ("f32 sigmoid D100 Dv12 N37 M70", make_case(2, 1, 37, 70, 100, 12, torch.float32, causal=True, kpm=True,
                                                        scale=0.4, seed=101), 0.2, "sigmoid"),
             ("f32 D40 Dv20 N65 M130", make_case(1, 2, 65, 130, 40, 20, torch.float32, causal=True, kpm=True,
                                                 scale=0.5, seed=40), 0.0),
             ("f64 D59 Dv33 N37 M45", make_case(1, 2, 37, 45, 59, 33, torch.float64, mask="random"), 0.3),
             # the decoding forward: partials of three key chunks per slice, merged by a second kernel
             ("f32 decoding D16 Dv12 N5 M130", make_case(2, 2, 5, 130, 16, 12, torch.float32, causal=True, kpm=True,
                                                         scale=0.5, seed=5), 0.2))
    for label, case, dropout_p, *phi in cases:
        args = op_args(case, 4, dropout_p, 5, 0.0, *phi)
        B, H, N, _ = case["q"].shape
        dout = torch.randn(B, H, N, case["v"].shape[-1], generator=torch.Generator().manual_seed(9),
                           dtype=args[3].dtype)
        first = forward_backward(args, dout)
        with environment("FF_EMU_BLOCK_ORDER", "reverse"):
            last = forward_backward(args, dout)
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv", "dradius"), first, last):
            if name in ("dq", "dradius"):
                err = (a - b).abs().max().item()
                ok = err <= 1e-6 * max(1.0, b.abs().max().item())
            else:
                ok = torch.equal(a, b)
            assert ok, f"block order: {label}: {name} differs when the blocks run last to first"
    print("  ok  blocks last to first: out, lse, dk, dv bit for bit, dq and dradius to rounding")


def check_shared_tables():
    """fourier_attention_tables built once and passed to the forward and the backward (as the
    autograd does on a GPU) gives what they give building their own, bit for bit, in float32,
    float16 and bfloat16, with a key padding mask, causal and dropout; the tables' size is
    _C.cuda_table_floats's formula's; float64 gets none; tables of other inputs are refused. phi = sigmoid
    reads the same tables (they take no phi), staged otherwise (cos a at t_low's place)."""
    for dtype, D, Dv, phi in ((torch.float32, 12, 7, "power"), (torch.float16, 16, 16, "power"),
                              (torch.bfloat16, 40, 20, "power"), (torch.float32, 12, 7, "sigmoid")):
        case = make_case(2, 3, 21, 37, D, Dv, dtype, causal=True, kpm=True, scale=0.7, seed=3)
        q, k, v, radius = case["q"], case["k"], case["v"], case["radius"].float()
        key_bias = torch.zeros(case["key_padding"].shape).masked_fill(case["key_padding"], float("-inf"))
        args = (q, k, v, radius, op_power(phi, 4), None, key_bias, True, 0.1, 9, 0.0)
        tables = torch.ops.fourierformer.fourier_attention_tables(q, k, radius)
        B, H, N, _ = q.shape
        M, Dp = k.shape[2], -(-D // 8) * 8
        assert tables.dtype == torch.float32 and tables.numel() == B * H * (3 * Dp * N + 4 * Dp * M + 2 * N + M) + H * Dp
        out, lse = torch.ops.fourierformer.fourier_attention_forward(*args, None, phi)
        out_t, lse_t = torch.ops.fourierformer.fourier_attention_forward(*args, tables, phi)
        assert torch.equal(out, out_t) and torch.equal(lse, lse_t), f"{dtype}: the forward with given tables differs"
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
        grads = torch.ops.fourierformer.fourier_attention_backward(dout, *args[:4], out, lse, *args[4:], None, phi)
        grads_t = torch.ops.fourierformer.fourier_attention_backward(dout, *args[:4], out, lse, *args[4:], tables, phi)
        for name, a, b in zip(("dq", "dk", "dv", "dradius"), grads, grads_t):
            # (dq and dradius: float atomics, whose order may differ between two runs: as in
            # check_score_cache)
            err = (a.float() - b.float()).abs().max().item()
            same = err <= 1e-6 * max(1.0, b.float().abs().max().item()) if name in ("dq", "dradius") else torch.equal(a, b)
            assert same, f"{dtype}: the backward's {name} with given tables differs by {err:.3e}"
        other = torch.ops.fourierformer.fourier_attention_tables(q[:, :, :-1], k, radius)
        try:
            torch.ops.fourierformer.fourier_attention_forward(*args, other, phi)
        except RuntimeError as e:
            assert "fourier_attention_tables(q, k, radius)" in str(e), e
        else:
            raise AssertionError("the forward took the tables of other inputs")
    # the CPU's kept weights (ops.fused: the autograd passes them on the CPU alone) are refused,
    # whatever their shape
    weights = torch.zeros(B, H, N, M)
    for call in (lambda: torch.ops.fourierformer.fourier_attention_backward(
                     dout, *args[:4], out, lse, *args[4:], None, phi, weights),
                 lambda: torch.ops.fourierformer.fourier_attention_forward_with_weights(*args, None, phi)):
        try:
            call()
        except RuntimeError as e:
            assert "keep no weights" in str(e), e
        else:
            raise AssertionError("the CUDA kernels took or kept the CPU's weights")
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    assert torch.ops.fourierformer.fourier_attention_tables(q, q, torch.ones(2, 4, dtype=torch.float64)).numel() == 0
    print("  ok  tables built once: forward and backward as with their own (f32, f16, bf16; f32 sigmoid); others and "
          "the CPU's kept weights refused")
    check_misaligned_tables()


def check_misaligned_tables():
    """Tables passed as a view that does not start on 16 bytes (a slice one float into a larger
    buffer): the kernels read them as float4 where N and M are multiples of 4 (as here), which
    faults on such an address (a GPU's misaligned address; here a segmentation fault), so the op
    reads an aligned copy: out, lse, dk and dv as with the tables themselves bit for bit (dq and
    dradius to their atomics' order), and within the oracle's bound."""
    case = make_case(1, 2, 20, 36, 16, 8, torch.float32, causal=True, scale=0.7, seed=5)
    q, k, v, radius = case["q"], case["k"], case["v"], case["radius"].float()
    args = (q, k, v, radius, 4.0, None, None, True, 0.0, 0, 0.0)
    tables = torch.ops.fourierformer.fourier_attention_tables(q, k, radius)
    view = torch.empty(tables.numel() + 1)[1:]
    view.copy_(tables)
    assert view.data_ptr() % 16 != 0 and view.is_contiguous()
    dout = torch.randn(q.shape[:3] + (v.shape[-1],), generator=torch.Generator().manual_seed(4))
    results = []
    for given in (tables, view):
        out, lse = torch.ops.fourierformer.fourier_attention_forward(*args, given)
        grads = torch.ops.fourierformer.fourier_attention_backward(dout, *args[:4], out, lse, *args[4:], given)
        results.append((out, lse, *grads))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv", "dradius"), *results):
        err = (a - b).abs().max().item()
        same = err <= 1e-6 * max(1.0, a.abs().max().item()) if name in ("dq", "dradius") else torch.equal(a, b)
        assert same, f"misaligned tables: {name} differs by {err:.3e}"
    out, _, *grads = results[1]
    bad = oracle_mismatches((out, *grads), q, k, v, radius, dout, power=4, causal=True)
    assert not bad, f"misaligned tables: {'; '.join(bad)}"
    print("  ok  tables as a misaligned view: read from an aligned copy, the same results, within the oracle's bound")


# The decoding forward (csrc/cuda/forward_decode.cuh), which the launcher runs for calls of at most
# kDecodeMaxRows = 8 query rows per (batch, head) slice: its keys in chunks of kDecKeys = 64, one block
# each, merged by a second kernel. (B, H, N, M, D, Dv, dtype, options): M of one key, of one chunk
# exactly, one key past a chunk, several chunks with a remainder (130, 200, 300); D 16, 64 and 128;
# every register-row instance (N 1, 2, 3 - 4, 5 - 8); masks (-inf at random, a float mask per head),
# causal, key padding with a batch whose keys are all padding, rows that see no key (the full_row mask:
# rows 0 and N - 1), the null key, exact duplicates (the rare path, also for keys past a chunk's start).
DECODING_CASES = [
    (2, 2, 1, 1, 16, 16, torch.float32, {}),
    (3, 2, 1, 30, 128, 128, torch.float32, {}),
    (2, 2, 2, 64, 64, 64, torch.float32, dict(causal=True)),
    (2, 2, 3, 65, 16, 7, torch.float32, dict(kpm=True)),
    (2, 1, 4, 130, 64, 33, torch.float32, dict(mask="random")),
    (1, 2, 5, 300, 128, 100, torch.float32, dict(mask="float", causal=True)),
    (2, 2, 8, 200, 16, 16, torch.float32, dict(mask="full_row")),
    (2, 1, 6, 129, 64, 20, torch.float32, dict(kpm=True, normaliser_eps=1e-3)),
    (1, 1, 7, 300, 16, 16, torch.float32, dict(duplicates=True, causal=True)),
    # |x| and ReLU (the ReLU instances; exact duplicates: the rare path decides ReLU's sign there)
    (2, 2, 3, 65, 16, 7, torch.float32, dict(kpm=True, phi="abs")),
    (1, 2, 5, 130, 32, 16, torch.float32, dict(duplicates=True, causal=True, phi="relu")),
    # sigmoid (its instances at every register-row count; exact duplicates: the series at q = k)
    (2, 2, 1, 1, 16, 16, torch.float32, dict(phi="sigmoid")),
    (2, 2, 2, 64, 64, 64, torch.float32, dict(causal=True, phi="sigmoid")),
    (2, 1, 4, 130, 64, 33, torch.float32, dict(mask="random", phi="sigmoid")),
    (1, 2, 5, 300, 128, 100, torch.float32, dict(mask="float", causal=True, phi="sigmoid")),
    (2, 2, 8, 200, 16, 16, torch.float32, dict(mask="full_row", phi="sigmoid")),
    (2, 1, 6, 129, 64, 20, torch.float32, dict(kpm=True, normaliser_eps=1e-3, phi="sigmoid")),
    (1, 1, 7, 300, 16, 16, torch.float32, dict(duplicates=True, causal=True, phi="sigmoid")),
]
DECODING_CASES_FULL = [  # (not --quick: as the tiled kernels' float16 and bfloat16 cases)
    (2, 2, 1, 130, 64, 64, torch.float16, dict(kpm=True)),
    (1, 2, 5, 70, 16, 16, torch.bfloat16, dict(mask="random", causal=True)),
    (2, 2, 8, 300, 128, 128, torch.float32, dict(causal=True, kpm=True, normaliser_eps=1e-6)),
    (1, 2, 4, 70, 16, 16, torch.bfloat16, dict(mask="random", phi="relu")),
    (2, 2, 1, 130, 64, 64, torch.float16, dict(kpm=True, phi="sigmoid")),
    (1, 2, 5, 70, 16, 16, torch.bfloat16, dict(mask="random", causal=True, phi="sigmoid")),
]
# float16 and bfloat16: the inputs rounded to them are the oracle's too; out within the tiled cases'
# tolerances (run_cases: the result's rounding to the dtype)
HALF_TOLERANCE = {torch.float16: dict(rtol=2e-2, atol=2e-3), torch.bfloat16: dict(rtol=5e-2, atol=1e-2)}


def decoding_case(B, H, N, M, D, Dv, dtype, options, seed):
    """make_case's case at a decoding shape, with options as DECODING_CASES names them."""
    case = make_case(B, H, N, M, D, Dv, dtype, mask=options.get("mask"), kpm=options.get("kpm", False),
                     causal=options.get("causal", False), scale=0.5, seed=seed)
    if options.get("duplicates"):  # queries equal to keys, some in the last chunk
        g = torch.Generator().manual_seed(seed)
        picks = torch.randint(M, (N,), generator=g)
        picks[-1] = M - 1
        case["q"] = case["k"][:, :, picks].clone()
    return case


def check_decoding(quick):
    """The decoding forward against the float64 oracle (tests/oracle.py): out (float32 within
    oracle_mismatches' bound) and lse (lse_mismatches': the null key's scaling and the backward read
    it), rows that see no key 0 with lse +inf; the forward with the tables built once
    (fourier_attention_tables) as with its own, bit for bit; then forward and backward against the
    reference with dropout (run_case: the backward's P from the decoding forward's lse)."""
    cases = DECODING_CASES + ([] if quick else DECODING_CASES_FULL)
    for n, (B, H, N, M, D, Dv, dtype, options) in enumerate(cases):
        t0 = time.time()
        case = decoding_case(B, H, N, M, D, Dv, dtype, options, seed=100 + n)
        eps = options.get("normaliser_eps", 0.0)
        phi = options.get("phi", "power")
        args = op_args(case, 4, 0.0, 0, eps)[:11]
        out, lse = torch.ops.fourierformer.fourier_attention_forward(*op_args(case, 4, 0.0, 0, eps, phi))
        tables = torch.ops.fourierformer.fourier_attention_tables(*args[:2], args[3])
        out_t, lse_t = torch.ops.fourierformer.fourier_attention_forward(*op_args(case, 4, 0.0, 0, eps, phi)[:11],
                                                                         tables, phi)
        label = (f"decoding {str(dtype).split('.')[-1]} B{B} H{H} N{N} M{M} D{D} Dv{Dv} "
                 f"{' '.join(f'{k}={v}' for k, v in options.items())}")
        bad = [] if torch.equal(out, out_t) and torch.equal(lse, lse_t) else ["out or lse differ with given tables"]
        q, k, v = (case[x].double() for x in ("q", "k", "v"))
        kwargs = dict(power=4, attn_mask=case["attn_mask"], key_padding_mask=case["key_padding"],
                      causal=case["causal"], normaliser_eps=eps, phi=phi)
        if dtype == torch.float32:
            bad += oracle_mismatches((out, None, None, None, None), q, k, v, case["radius"], torch.zeros_like(out),
                                     **kwargs)
        else:
            want = oracle_attention(q, k, v, case["radius"], **kwargs)
            err = (out.double() - want).abs().max().item()
            tol = HALF_TOLERANCE[dtype]
            if not err <= tol["atol"] + tol["rtol"] * want.abs().max().item():
                bad.append(f"out: error {err:.3e}")
        bad += lse_mismatches(lse, q, k, case["radius"], **kwargs)
        dead = torch.isinf(lse)
        if not (out[dead] == 0).all():
            bad.append("a row that sees no key is not 0")
        if options.get("mask") == "full_row" and not dead[:, :, [0, -1]].all():
            bad.append("the rows that see no key have a finite lse")
        print(f"  {'ok ' if not bad else 'BAD'} {label:74s} ({time.time() - t0:.1f}s) {'; '.join(bad)}")
        if bad:
            raise AssertionError(f"{label}: {'; '.join(bad)}")
    f32 = dict(rtol=2e-4, atol=2e-5)
    run_case("f32 decoding N3 M130 causal kpm dropout", make_case(2, 1, 3, 130, 16, 12, torch.float32, causal=True,
                                                                  kpm=True, scale=0.5, seed=7), 4, 0.2, **f32)
    run_case("f32 decoding N8 M70 D64 null key mask", make_case(1, 2, 8, 70, 64, 9, torch.float32, mask="random",
                                                                scale=0.5, seed=8), 4, 0.0, normaliser_eps=1e-4,
             **f32)
    run_case("f32 decoding relu N3 M130 causal kpm dropout", make_case(2, 1, 3, 130, 16, 12, torch.float32,
                                                                       causal=True, kpm=True, scale=0.5, seed=9),
             4, 0.2, phi="relu", **f32)
    run_case("f32 decoding sigmoid N3 M130 causal kpm dropout", make_case(2, 1, 3, 130, 16, 12, torch.float32,
                                                                          causal=True, kpm=True, scale=0.5, seed=10),
             1, 0.2, phi="sigmoid", **f32)
    run_case("f32 decoding sigmoid N8 M70 D64 null key mask", make_case(1, 2, 8, 70, 64, 9, torch.float32,
                                                                        mask="random", scale=0.5, seed=11),
             1, 0.0, normaliser_eps=1e-4, phi="sigmoid", **f32)


def check_empty_shapes():
    """M = 0 (no keys: out 0, lse +inf, zero grads), N = 0 (zero dk, dv), B = 0."""
    for B, N, M in ((1, 3, 0), (2, 0, 5), (0, 3, 4)):
        q = torch.randn(B, 2, N, 4)
        k = torch.randn(B, 2, M, 4)
        v = torch.randn(B, 2, M, 3)
        radius = torch.ones(2, 4)
        out, lse = torch.ops.fourierformer.fourier_attention_forward(q, k, v, radius, 4.0, None, None, False, 0.0, 0)
        assert out.shape == (B, 2, N, 3) and lse.shape == (B, 2, N)
        assert (out == 0).all() and (torch.isinf(lse) | (M > 0)).all()
        grads = torch.ops.fourierformer.fourier_attention_backward(
            torch.ones_like(out), q, k, v, radius, out, lse, 4.0, None, None, False, 0.0, 0)
        for g, like in zip(grads, (q, k, v, radius)):
            assert g.shape == like.shape and (g == 0).all(), (B, N, M)
    print("  ok  empty shapes (M = 0, N = 0, B = 0)")


def fuzz_case(seed):
    """Seeded float32 case: exact / near duplicates, keys at sinc's zeros, remainders of the tiles."""
    g = torch.Generator().manual_seed(7919 * seed + 3)

    def pick(xs):
        return xs[int(torch.randint(len(xs), (1,), generator=g))]

    B, H = pick((1, 2)), pick((1, 2))
    N, M = pick((1, 3, 5, 31, 33)), pick((1, 4, 31, 33, 40))
    D, Dv = pick((1, 4, 16, 33, 64, 128)), pick((1, 3, 33))
    std, R, power = pick((0.3, 1.0, 3.0)), pick((0.5, 2.0, 10.0)), pick((2, 4, 6))
    kind = ("plain", "duplicate", "near", "sinc_zeros")[seed % 4]
    k = torch.randn(B, H, M, D, generator=g) * std
    v = torch.randn(B, H, M, Dv, generator=g)
    if kind in ("duplicate", "near"):
        q = k[:, :, torch.randint(M, (N,), generator=g)].clone()
        if kind == "near":
            q = q + 1e-6 * std * torch.randn(q.shape, generator=g)
    else:
        q = torch.randn(B, H, N, D, generator=g) * std
    radius = R * (0.7 + 0.6 * torch.rand(H, D, generator=g))
    if kind == "sinc_zeros":
        for _ in range(max(1, N * M // 4)):
            b, h, i, j, d = (int(torch.randint(n, (1,), generator=g)) for n in (B, H, N, M, D))
            k[b, h, j, d] = q[b, h, i, d] - pick((-1, 1, 2)) * math.pi * (1 + pick((0.0, 1e-6, 1e-3))) / float(radius[h, d])
    kwargs = dict(power=power)
    if seed % 3 == 1 and N <= M:
        kwargs["causal"] = True
    if seed % 3 == 2:
        kpm = torch.rand(B, M, generator=g) < 0.3
        kpm[-1, : M // 2] = True
        kwargs["key_padding_mask"] = kpm
    # phi drawn last (the draws above are those of the cases before the other phis): a fifth of the
    # cases each of the even power, sigmoid, |x|, ReLU (the op's power 1) and an odd power (x, x^3, x^5:
    # phi "power" with p 1, 3 or 5, signed weights)
    phi = pick(("power", "sigmoid", "abs", "relu", "odd"))
    if phi == "odd":
        kwargs["power"] = (1, 3, 5)[seed % 3]
    elif phi != "power":
        kwargs.update(phi=phi, power=1)
    label = (f"fuzz {seed} {kind} B{B} H{H} N{N} M{M} D{D} Dv{Dv} std={std} R={R} p={kwargs['power']} phi={phi} "
             f"{sorted(kwargs)}")
    return q, k, v, radius, kwargs, label


def special_cases():
    """float32 cases of the table path: huge angles, negative and zero radius, tile remainders
    (N, M not multiples of 64) with exact duplicates; checked against tests/oracle.py."""
    g = torch.Generator().manual_seed(2024)
    cases = []
    # |R q| up to ~4e8 (the CPU test's construction: q - k exact in float32)
    base = 2.0**22
    q = base + 0.5 * torch.randint(-8, 9, (1, 1, 5, 8), generator=g).float()
    k = base + 0.5 * torch.randint(-8, 9, (1, 1, 11, 8), generator=g).float()
    k[0, 0, 3] = q[0, 0, 1]
    cases.append(("huge angles R=100", q, k, torch.randn(1, 1, 11, 3, generator=g), torch.tensor(100.0), dict(power=2)))
    # negative and zero radius entries
    q = torch.randn(2, 2, 9, 6, generator=g) * 0.7
    k = torch.randn(2, 2, 13, 6, generator=g) * 0.7
    k[1, 0, 4] = q[1, 0, 2]
    radius = 0.5 + torch.rand(2, 6, generator=g)
    radius[0, 1], radius[1, 3], radius[1, 0] = -radius[0, 1], 0.0, -2.0
    cases.append(("negative and zero radius", q, k, torch.randn(2, 2, 13, 5, generator=g), radius, dict(power=4)))
    # remainders of the 64-row and 64-key tiles, exact duplicates, causal
    k = torch.randn(1, 1, 130, 16, generator=g) * 0.5
    q = k[:, :, torch.randint(130, (65,), generator=g)].clone()
    q[:, :, ::3] += 1e-6 * torch.randn(q[:, :, ::3].shape, generator=g)
    cases.append(("tile remainders N65 M130 duplicates causal", q, k, torch.randn(1, 1, 130, 20, generator=g),
                  0.5 + torch.rand(1, 16, generator=g), dict(power=4, causal=True)))
    # N and M multiples of 4: the forward's float4 staging of the tables; exact duplicates (q = k
    # in every feature) and near ones (in a few features, |q - k| ~ 1e-7: the fast path)
    k = torch.randn(1, 2, 68, 32, generator=g) * 0.5
    q = k[:, :, torch.randint(68, (64,), generator=g)].clone()
    q[:, :, ::2, ::5] += 1e-7 * torch.randn(q[:, :, ::2, ::5].shape, generator=g)
    cases.append(("float4 staging N64 M68 D32 duplicates", q, k, torch.randn(1, 2, 68, 16, generator=g),
                  0.5 + torch.rand(2, 32, generator=g), dict(power=4)))
    k = torch.randn(1, 1, 72, 128, generator=g) * 0.3
    q = torch.randn(1, 1, 12, 128, generator=g) * 0.3
    q[0, 0, 5] = k[0, 0, 70]
    cases.append(("float4 staging N12 M72 D128 Dv100 causal", q, k, torch.randn(1, 1, 72, 100, generator=g),
                  0.5 + torch.rand(1, 128, generator=g), dict(power=2, causal=True)))
    # rows at tan's poles: |R q| within an ulp of pi / 2 in every feature, |1 / cos(R q)| ~ 2^24
    # per feature, so that a product of 8 table factors overflows float (the rare path's kRareAll)
    q = torch.randn(1, 1, 8, 16, generator=g) * 0.5
    q[0, 0, ::2] = torch.tensor(math.pi / 2, dtype=torch.float32)
    k = torch.randn(1, 1, 40, 16, generator=g) * 0.5
    cases.append(("rows at tan's poles (product overflow)", q, k, torch.randn(1, 1, 40, 8, generator=g),
                  torch.tensor(1.0), dict(power=2)))
    # the published normaliser's null key: a share of each row (eps near the rows' mass), and
    # rows whose keys all underflow next to eps (out and gradients 0)
    q = torch.randn(2, 2, 9, 16, generator=g) * 0.7
    k = torch.randn(2, 2, 70, 16, generator=g) * 0.7
    k[0, 1, 5] = q[0, 1, 3]
    cases.append(("null key eps 1e-9 causal N9 M70", q, k, torch.randn(2, 2, 70, 7, generator=g), torch.tensor(2.0),
                  dict(power=4, causal=True, normaliser_eps=1e-9)))
    q = torch.randn(1, 2, 5, 64, generator=g) * 3
    k = torch.randn(1, 2, 7, 64, generator=g) * 3
    cases.append(("null key takes every row N5 M7 D64", q, k, torch.randn(1, 2, 7, 3, generator=g), torch.tensor(10.0),
                  dict(power=4, normaliser_eps=1e-6)))
    # |x| and ReLU (power 1) on the cases above where the sign of a factor is hardest to read, ReLU's
    # weight 0 for a key with a negative factor; sigmoid (power 1) on every one of them (duplicates:
    # its series at q = k; tan's poles: cos a from a t of order 2^24; huge angles; the null key): the
    # cases' inputs again (copies of their tensors)
    other_phis = {"negative and zero radius": ("relu",), "tile remainders N65 M130 duplicates causal": ("relu",),
                  "float4 staging N64 M68 D32 duplicates": ("relu",),
                  "rows at tan's poles (product overflow)": ("relu",), "huge angles R=100": ("abs",),
                  "null key eps 1e-9 causal N9 M70": ("abs",)}
    for label, q, k, v, radius, kwargs in list(cases):
        for phi in other_phis.get(label, ()) + ("sigmoid",):
            cases.append((f"{phi}: {label}", q.clone(), k.clone(), v.clone(), radius.clone(),
                          dict(kwargs, power=1, phi=phi)))
        # x^3 and x (signed weights; the rare path decides the sign at duplicates, huge angles and
        # tan's poles; the null key on the signed sum) on every case
        odd = 1 if label in ("negative and zero radius", "float4 staging N64 M68 D32 duplicates") else 3
        cases.append((f"{'x' if odd == 1 else 'x^3'}: {label}", q.clone(), k.clone(), v.clone(), radius.clone(),
                      dict(kwargs, power=odd)))
    return cases


# NaN and infinities (docs/kernels.md, "NaN and infinity"): the cases of
# tests/ops/test_fourier_attention_op.py::test_nonfinite_inputs_give_nan_where_the_formula_does through
# the CUDA kernels: the decoding forward (N <= 8), the tiled forward and backward (float32), the
# simple ones (float64). The NaN pattern of out, dq, dk, dv and the radius gradient must be the
# float64 oracle's exactly, the finite entries within a loose bound.
NONFINITE_ROWS = (1, 5, 9, 70)  # (70: more than one block of rows, and of keys; float32 only: the
# float64 kernels take every row alike, and are slow to emulate)
NONFINITE_SIGMOID_ROWS = (5, 70)  # phi = sigmoid: the decoding forward and the tiled kernels


def nonfinite_mismatches(where, N, causal, dtype, phi="power"):
    """What differs between the emulated op and the oracle on nonfinite_case (empty: nothing), with
    phi (another than the power: power 1)."""
    q, k, v, radius, grad_out, kwargs = nonfinite_case(where, N, causal)
    if phi != "power":
        kwargs = dict(kwargs, power=1, phi=phi)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    kpm = kwargs.get("key_padding_mask")
    key_bias = None if kpm is None else torch.zeros(kpm.shape, dtype=acc).masked_fill(kpm, float("-inf"))
    mask = kwargs.get("attn_mask")
    args = (q.to(dtype), k.to(dtype), v.to(dtype), radius.to(acc), float(kwargs["power"]),
            None if mask is None else mask.reshape(1, 1, *mask.shape).to(acc), key_bias, causal, 0.0, 0, 0.0, None, phi)
    out, _, dq, dk, dv, dr = forward_backward(args, grad_out.to(dtype))
    expected = oracle_gradients(q, k, v, radius, grad_out, **kwargs)
    bad = []
    if bool(expected[0].isnan().any()) != (where != "padded_k_nan"):
        bad.append("the oracle's case is not what it should be")
    for name, a, b in zip(("out", "dq", "dk", "dv", "dradius"), (out, dq, dk, dv, dr), expected):
        if where == "mask_pos_inf" and name in ("dk", "dv"):
            # (torch's softmax of a +inf score makes the oracle's keys' gradients NaN at that key
            # only; the kernels give a NaN row the gradients of every NaN row)
            continue
        a = a.double()
        nan_a, nan_b = a.isnan(), b.isnan()
        if not torch.equal(nan_a, nan_b):
            extra, missing = (nan_a & ~nan_b).nonzero().tolist(), (nan_b & ~nan_a).nonzero().tolist()
            bad.append(f"{name}: NaN where the formula is not at {extra[:3]} ({len(extra)}), "
                       f"not NaN where it is at {missing[:3]} ({len(missing)})")
            continue
        err = (a[~nan_a] - b[~nan_b]).abs()
        bound = 1e-4 + 1e-3 * b[~nan_b].abs()
        if not bool((err <= bound).all()):
            bad.append(f"{name}: finite entries off by up to {err.max().item():.2e}")
    return bad


def radius_mismatches(q, k, v, dout, r, shape, kwargs, label):
    """check_radii's case at radius r of `shape`, float32 and float64: what breaks the bound."""
    H, D = q.shape[1], q.shape[3]
    power, causal, phi = float(kwargs["power"]), kwargs.get("causal", False), kwargs.get("phi", "power")
    failures = []
    for dtype in (torch.float32, torch.float64):
        table = r.reshape(-1, 1 if shape in ((), (H, 1)) else D).expand(H, D).to(dtype).contiguous()
        args = [t.to(dtype) for t in (q, k, v)]
        out, lse = torch.ops.fourierformer.fourier_attention_forward(*args, table, power, None, None, causal,
                                                                     0.0, 0, 0.0, None, phi)
        dq, dk, dv, dtable = torch.ops.fourierformer.fourier_attention_backward(
            dout.to(dtype), *args, table, out, lse, power, None, None, causal, 0.0, 0, 0.0, None, phi)
        dr = dtable.sum() if shape == () else (dtable.sum(1, keepdim=True) if shape == (H, 1) else
                                                (dtable.sum(0) if shape == (D,) else dtable))
        ours = (out, dq, dk, dv, dr)
        if dtype == torch.float32:
            bad = oracle_mismatches(ours, q, k, v, r, dout, series=True, **kwargs)
        else:
            exact = oracle_gradients(q, k, v, r, dout, **kwargs)
            scales = oracle_gradient_scales(q, k, v, r, dout, **kwargs)
            bad = [f"{n}: {(a - x).abs().max().item():.3e} > 1e-9 x {s:.3e}"
                   for n, a, x, s in zip(("out", "dq", "dk", "dv", "dradius"), ours, exact, scales)
                   if not (a - x).abs().max().item() <= 1e-9 * s + 1e-300]
        if bad:
            failures.append(f"{label} {str(dtype).split('.')[-1]}: {'; '.join(bad)}")
    return failures


def check_radii():
    """Negative, zero and tiny radii, forward and the four gradients, against the float64 oracle:
    float32 within oracle_mismatches' bound (its plain float32 implementation with the series of
    log|sinc| near 0, as the quotient's derivative cancels at tiny x), float64 within 1e-9 of each
    result's scale (as the CPU float64 checks). Every radius shape: scalar, per head, per feature,
    per (head, feature); the op takes the (H, D) table, and the gradient is summed back to the
    shape given. Each case with the power, with phi = sigmoid and with x^3 (signed weights)."""
    t0 = time.time()
    B, H, N, M, D, Dv = 2, 2, 5, 9, 8, 3
    g = torch.Generator().manual_seed(51)
    q, k, v, dout = (torch.randn(*s, generator=g) for s in ((B, H, N, D), (B, H, M, D), (B, H, M, Dv), (B, H, N, Dv)))
    shapes = {"scalar": (), "head": (H, 1), "feature": (D,), "head_feature": (H, D)}
    failures = []
    for shape_name, shape in shapes.items():
        for value in ("negative", "mixed", "tiny", "zero"):
            magnitude = 0.7 + 0.6 * torch.rand(shape, generator=g)
            sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
            r = {"negative": -1.5 * magnitude, "mixed": 1.5 * magnitude * (sign if shape else -1.0),
                 "tiny": 1e-10 * magnitude * sign, "zero": torch.zeros(shape)}[value]
            kwargs = dict(power=4, causal=True) if value in ("negative", "zero") else dict(power=2)
            for phi in ("power", "sigmoid", "odd"):  # (sigmoid: power 1; odd: x^3, signed weights)
                phi_kwargs = {"power": kwargs, "sigmoid": dict(kwargs, power=1, phi=phi), "odd": dict(kwargs, power=3)}
                failures += radius_mismatches(q, k, v, dout, r, shape, phi_kwargs[phi], f"{shape_name} {value} {phi}")
    for f in failures:
        print(f"  BAD radius {f}")
    print(f"  negative, zero and tiny radii: {'ok' if not failures else f'{len(failures)} cases BAD'} "
          f"({time.time() - t0:.0f}s)")
    return len(failures)


def check_nonfinite(verbose=False):
    """Every case of NONFINITE at NONFINITE_ROWS rows, causal and not, float32 and float64 (v_nan
    not causal: the oracle's P @ V spreads a value's NaN to rows that do not see its key); with phi =
    sigmoid at NONFINITE_SIGMOID_ROWS."""
    t0 = time.time()
    failures = []
    cases = [(phi, dtype, where, N, causal)
             for phi, rows in (("power", NONFINITE_ROWS), ("sigmoid", NONFINITE_SIGMOID_ROWS))
             for dtype in (torch.float32, torch.float64) for where in NONFINITE for N in rows
             for causal in (False, True)
             if not (N > 64 and dtype == torch.float64) and not (where == "v_nan" and causal)]
    for phi, dtype, where, N, causal in cases:
        label = (f"{str(dtype).split('.')[-1]} {where} N{N}{' causal' if causal else ''}"
                 + ("" if phi == "power" else f" {phi}"))
        if verbose:
            print(f"  nonfinite {label}")
        bad = nonfinite_mismatches(where, N, causal, dtype, phi)
        if bad:
            failures.append(f"{label}: {'; '.join(bad)}")
    for f in failures:
        print(f"  BAD nonfinite {f}")
    print(f"  nonfinite inputs: {'ok' if not failures else f'{len(failures)} cases BAD'} ({time.time() - t0:.0f}s)")
    return len(failures)


def run_special(odd_only=False):
    failures = 0
    for label, q, k, v, radius, kwargs in special_cases():
        if odd_only and not label.startswith(("x: ", "x^3: ")):
            continue
        t0 = time.time()
        causal = kwargs.get("causal", False)
        power = float(kwargs["power"])
        phi = kwargs.get("phi", "power")
        r = radius if radius.dim() == 2 else radius.expand(q.shape[1], q.shape[3])
        eps = kwargs.get("normaliser_eps", 0.0)
        out, lse = torch.ops.fourierformer.fourier_attention_forward(q, k, v, r.contiguous(), power, None, None,
                                                                     causal, 0.0, 0, eps, None, phi)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        grads = list(torch.ops.fourierformer.fourier_attention_backward(dout, q, k, v, r.contiguous(), out, lse,
                                                                        power, None, None, causal, 0.0, 0, eps, None,
                                                                        phi))
        if radius.dim() == 0:
            grads[3] = grads[3].sum()
        bad = oracle_mismatches((out, *grads), q, k, v, radius, dout, **kwargs) + lse_mismatches(lse, q, k, radius,
                                                                                                  **kwargs)
        print(f"  {'ok ' if not bad else 'BAD'} {label:44s} ({time.time() - t0:.1f}s) {'; '.join(bad)}")
        failures += bool(bad)
    return failures


def run_fuzz(count):
    """float32 cases against tests/oracle.py, with its bounds (oracle_mismatches, lse_mismatches)."""
    failures = 0
    for seed in range(count):
        t0 = time.time()
        q, k, v, radius, kwargs, label = fuzz_case(seed)
        kpm = kwargs.get("key_padding_mask")
        key_bias = None if kpm is None else torch.zeros(kpm.shape).masked_fill(kpm, float("-inf"))
        causal = kwargs.get("causal", False)
        power = float(kwargs["power"])
        phi = kwargs.get("phi", "power")
        out, lse = torch.ops.fourierformer.fourier_attention_forward(q, k, v, radius, power, None, key_bias, causal,
                                                                     0.0, 0, 0.0, None, phi)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
        grads = torch.ops.fourierformer.fourier_attention_backward(dout, q, k, v, radius, out, lse, power, None,
                                                                   key_bias, causal, 0.0, 0, 0.0, None, phi)
        bad = oracle_mismatches((out, *grads), q, k, v, radius, dout, **kwargs) + lse_mismatches(lse, q, k, radius,
                                                                                                  **kwargs)
        print(f"  {'ok ' if not bad else 'BAD'} {label:90s} ({time.time() - t0:.1f}s) {'; '.join(bad)}")
        failures += bool(bad)
    print(f"fuzz: {failures} of {count} cases outside the oracle's bound")
    return failures


# The planted bugs of emulated_sanitizer_probe (emulated_ops.h) by name, and what reports each.
PROBES = {"none": 0, "race": 1, "shared_overflow": 2, "global_overflow": 3}
PROBE_REPORTS = {"race": ("thread", "ThreadSanitizer: data race"),
                 "shared_overflow": ("address", "AddressSanitizer: heap-buffer-overflow"),
                 "global_overflow": ("address", "AddressSanitizer: heap-buffer-overflow")}


def run_probe(mod, what):
    x = torch.arange(1.0, 65.0)
    out = mod.emulated_sanitizer_probe(x, PROBES[what])
    assert torch.equal(out[1:], torch.roll(x, -1)[1:]), "the probe kernel computed something else"
    print(f"probe {what}: no report")


def check_sanitizer_probes(kind, build_dir):
    """Each planted bug of emulated_sanitizer_probe that `kind` covers must be reported (exit status
    SANITIZER_EXIT, the report naming the probe's kernel), and its correct version must not: each in
    a child process on the same build. Without this a run with no report could mean an
    uninstrumented build or a runtime that is not there."""
    for what in ["none"] + [w for w, (k, _) in PROBE_REPORTS.items() if k == kind]:
        t0 = time.time()
        result = subprocess.run([sys.executable, os.path.abspath(__file__), "--sanitize", kind, "--probe", what,
                                 "--build-dir", build_dir], capture_output=True, text=True, timeout=1200)
        text = result.stdout + result.stderr
        if what == "none":
            ok = result.returncode == 0 and "probe none: no report" in result.stdout
        else:
            ok = (result.returncode == SANITIZER_EXIT and PROBE_REPORTS[what][1] in text
                  and "probe_kernel" in text)
        print(f"  {'ok ' if ok else 'BAD'} probe {what:16s} exit {result.returncode} ({time.time() - t0:.0f}s)")
        if not ok:
            raise AssertionError(f"--sanitize {kind}: the probe {what!r} was not "
                                 f"{'clean' if what == 'none' else 'reported'}:\n{text[-3000:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer cases")
    ap.add_argument("--fuzz", type=int, default=0, help="also run this many seeded float32 cases against tests/oracle.py")
    ap.add_argument("--sanitize", choices=sorted(SANITIZERS),
                    help="build with the compiler's thread (data races between the threads of a block) or address "
                         "(out-of-bounds accesses to shared memory and to the tensors) sanitizer; a report stops the "
                         f"run with exit status {SANITIZER_EXIT}; at the end, planted bugs must be reported")
    ap.add_argument("--probe", choices=sorted(PROBES), help="(with --sanitize) run only this planted bug")
    ap.add_argument("--only-nonfinite", action="store_true", help="run only the NaN and infinity cases")
    ap.add_argument("--only-odd-powers", action="store_true",
                    help="run only the cases of odd p (signed weights: check_odd_powers and the special cases' x and x^3)")
    ap.add_argument("--build-dir", help=argparse.SUPPRESS)  # (the probes' children: the parent's build)
    args = ap.parse_args()
    if args.probe and not args.sanitize:
        ap.error("--probe needs --sanitize")
    torch.set_num_threads(1)
    t0 = time.time()
    if args.probe:
        run_probe(build(args.sanitize, args.build_dir), args.probe)
        return
    build_dir = tempfile.mkdtemp(prefix="ff_cuda_emulation_") if args.sanitize else None
    try:
        print(f"building the emulation module (plain C++{', ' + args.sanitize + ' sanitizer' if args.sanitize else ''}, "
              "about a minute)")
        mod = build(args.sanitize, build_dir)
        print(f"built the emulation module in {time.time() - t0:.0f}s")
        run_checks(mod, args)
        if args.sanitize:
            check_sanitizer_probes(args.sanitize, build_dir)
    finally:
        if build_dir:
            shutil.rmtree(build_dir, ignore_errors=True)
    under = f" under the {args.sanitize} sanitizer (no report; its planted bugs reported)" if args.sanitize else ""
    print(f"all emulated checks passed{under} in {time.time() - t0:.0f}s")


def run_checks(mod, args):
    if args.only_nonfinite:
        if check_nonfinite(verbose=True):
            sys.exit(1)
        return
    if args.only_odd_powers:
        check_odd_powers(args.quick)
        if run_special(odd_only=True):
            sys.exit(1)
        return
    check_sincos(mod)
    check_empty_shapes()
    f64 = dict(rtol=1e-9, atol=1e-10)
    f32 = dict(rtol=2e-4, atol=2e-5)
    cases = [
        ("f64 B2H2 N7 M7 D16 p4", make_case(2, 2, 7, 7, 16, 16, torch.float64), 4, 0.0, f64),
        ("f64 N1 M1 D1 p2", make_case(1, 1, 1, 1, 1, 1, torch.float64), 2, 0.0, f64),
        ("f64 N37 M45 D59 Dv33 p6 mask", make_case(1, 2, 37, 45, 59, 33, torch.float64, mask="random"), 6, 0.0, f64),
        ("f64 causal N5 M40 kpm", make_case(2, 1, 5, 40, 8, 12, torch.float64, causal=True, kpm=True), 4, 0.0, f64),
        ("f64 float mask H-broadcast", make_case(2, 3, 9, 33, 4, 5, torch.float64, mask="float"), 2, 0.0, f64),
        ("f64 dropout 0.3", make_case(1, 2, 19, 35, 6, 7, torch.float64), 4, 0.3, f64),
        ("f64 fully masked rows", make_case(1, 1, 6, 10, 3, 4, torch.float64, mask="full_row"), 4, 0.0, f64),
        ("f32 N33 M70 D40 p4", make_case(1, 1, 33, 70, 40, 20, torch.float32), 4, 0.0, f32),
        ("f32 large |x| (scale 20)", make_case(1, 1, 9, 40, 8, 8, torch.float32, scale=20.0), 2, 0.0,
         dict(rtol=1e-3, atol=1e-4)),
        ("f32 causal dropout kpm", make_case(2, 1, 20, 41, 5, 3, torch.float32, causal=True, kpm=True), 4, 0.2, f32),
        ("f32 D100 Dv100 N9 M70 causal", make_case(1, 1, 9, 70, 100, 100, torch.float32, causal=True, scale=0.3), 4,
         0.0, f32),
        # the published normaliser (the simple float64 kernels; float32's tiled ones in run_special)
        ("f64 null key causal kpm dropout", make_case(2, 1, 5, 40, 8, 12, torch.float64, causal=True, kpm=True), 4,
         0.2, dict(f64, normaliser_eps=1e-3)),
        ("f32 null key D129 Dv200 (decoding forward, simple backward)", make_case(1, 1, 5, 7, 129, 200, torch.float32, scale=0.3), 2,
         0.0, dict(f32, normaliser_eps=0.5)),
        # |x| (power 1) and ReLU: the float64 simple kernels, the float32 tiled forward and backward
        # (both instances of the pre-pass and the main pass: check_score_cache), the simple float32
        # backward (D above 128)
        ("f64 abs N37 M45 D59 Dv33 mask", make_case(1, 2, 37, 45, 59, 33, torch.float64, mask="random"), 1, 0.0,
         dict(f64, phi="abs")),
        ("f64 relu causal kpm dropout null key", make_case(2, 1, 5, 40, 8, 12, torch.float64, causal=True, kpm=True), 1,
         0.2, dict(f64, normaliser_eps=1e-3, phi="relu")),
        ("f64 relu float mask H-broadcast", make_case(2, 3, 9, 33, 4, 5, torch.float64, mask="float"), 1, 0.0,
         dict(f64, phi="relu")),
        ("f32 abs N33 M70 D40", make_case(1, 1, 33, 70, 40, 20, torch.float32), 1, 0.0, dict(f32, phi="abs")),
        ("f32 relu N33 M70 D40", make_case(1, 1, 33, 70, 40, 20, torch.float32), 1, 0.0, dict(f32, phi="relu")),
        ("f32 relu causal dropout kpm", make_case(2, 1, 20, 41, 5, 3, torch.float32, causal=True, kpm=True), 1, 0.2,
         dict(f32, phi="relu")),
        ("f32 relu D100 Dv100 N9 M70 causal float mask", make_case(1, 1, 9, 70, 100, 100, torch.float32, causal=True,
                                                                   scale=0.8, mask="float"), 1, 0.0,
         dict(f32, phi="relu")),
        ("f32 relu D129 Dv200 N9 M7 (simple backward)", make_case(1, 1, 9, 7, 129, 200, torch.float32, scale=0.8), 1,
         0.0, dict(f32, phi="relu")),
        # sigmoid (power 1): the float64 simple kernels, the float32 tiled forward and backward (its
        # main pass with and without the score cache, split and whole: check_sigmoid_paths), the
        # decoding forward (N <= 8) and the simple float32 backward (D above 128)
        ("f64 sigmoid N37 M45 D59 Dv33 mask", make_case(1, 2, 37, 45, 59, 33, torch.float64, mask="random"), 1, 0.0,
         dict(f64, phi="sigmoid")),
        ("f64 sigmoid causal kpm dropout null key", make_case(2, 1, 5, 40, 8, 12, torch.float64, causal=True,
                                                              kpm=True), 1, 0.2,
         dict(f64, normaliser_eps=1e-3, phi="sigmoid")),
        ("f64 sigmoid float mask H-broadcast", make_case(2, 3, 9, 33, 4, 5, torch.float64, mask="float"), 1, 0.0,
         dict(f64, phi="sigmoid")),
        ("f64 sigmoid fully masked rows", make_case(1, 1, 6, 10, 3, 4, torch.float64, mask="full_row"), 1, 0.0,
         dict(f64, phi="sigmoid")),
        ("f32 sigmoid N33 M70 D40", make_case(1, 1, 33, 70, 40, 20, torch.float32), 1, 0.0, dict(f32, phi="sigmoid")),
        ("f32 sigmoid large |x| (scale 20)", make_case(1, 1, 9, 40, 8, 8, torch.float32, scale=20.0), 1, 0.0,
         dict(f32, phi="sigmoid")),
        ("f32 sigmoid causal dropout kpm", make_case(2, 1, 20, 41, 5, 3, torch.float32, causal=True, kpm=True), 1,
         0.2, dict(f32, phi="sigmoid")),
        ("f32 sigmoid D100 Dv100 N9 M70 causal float mask", make_case(1, 1, 9, 70, 100, 100, torch.float32,
                                                                      causal=True, scale=0.8, mask="float"), 1, 0.0,
         dict(f32, phi="sigmoid")),
        ("f32 sigmoid fully masked rows N65 M70", make_case(1, 2, 65, 70, 24, 8, torch.float32, mask="full_row"), 1,
         0.0, dict(f32, phi="sigmoid")),
        ("f32 sigmoid null key D129 Dv200 (decoding forward, simple backward)",
         make_case(1, 1, 5, 7, 129, 200, torch.float32, scale=0.3), 1, 0.0,
         dict(f32, normaliser_eps=0.5, phi="sigmoid")),
        ("f32 sigmoid D129 Dv200 N9 M7 (simple backward)", make_case(1, 1, 9, 7, 129, 200, torch.float32,
                                                                     scale=0.8), 1, 0.0, dict(f32, phi="sigmoid")),
    ]
    if not args.quick:
        cases += [
            ("f64 D256 Dv256 N3 M33", make_case(1, 1, 3, 33, 256, 256, torch.float64, scale=0.3), 2, 0.0, f64),
            ("f32 D129 Dv200 N5 M3", make_case(1, 1, 5, 3, 129, 200, torch.float32, scale=0.3), 2, 0.0, f32),
            ("f64 M0-like causal N=M=64", make_case(1, 1, 64, 64, 3, 3, torch.float64, causal=True), 4, 0.0, f64),
            ("f16 N17 M40 D16", make_case(1, 2, 17, 40, 16, 16, torch.float16, scale=0.5), 4, 0.0,
             dict(rtol=2e-2, atol=2e-3)),
            ("bf16 N17 M40 D16 mask", make_case(1, 2, 17, 40, 16, 16, torch.bfloat16, scale=0.5, mask="random"), 4,
             0.0, dict(rtol=5e-2, atol=1e-2)),
            ("f16 relu N17 M40 D16", make_case(1, 2, 17, 40, 16, 16, torch.float16, scale=0.5), 1, 0.0,
             dict(rtol=2e-2, atol=2e-3, phi="relu")),
            ("bf16 abs N17 M40 D16 mask", make_case(1, 2, 17, 40, 16, 16, torch.bfloat16, scale=0.5, mask="random"), 1,
             0.0, dict(rtol=5e-2, atol=1e-2, phi="abs")),
            ("f16 sigmoid N17 M40 D16", make_case(1, 2, 17, 40, 16, 16, torch.float16, scale=0.5), 1, 0.0,
             dict(rtol=2e-2, atol=2e-3, phi="sigmoid")),
            ("bf16 sigmoid N17 M40 D16 mask", make_case(1, 2, 17, 40, 16, 16, torch.bfloat16, scale=0.5,
                                                        mask="random"), 1, 0.0, dict(rtol=5e-2, atol=1e-2, phi="sigmoid")),
            ("f64 sigmoid D256 Dv256 N3 M33", make_case(1, 1, 3, 33, 256, 256, torch.float64, scale=0.3), 1, 0.0,
             dict(f64, phi="sigmoid")),
            ("f32 sigmoid D256 Dv256 N70 M40 (simple backward)", make_case(1, 1, 70, 40, 256, 256, torch.float32,
                                                                           scale=0.3), 1, 0.0,
             dict(f32, phi="sigmoid")),
        ]
    for name, case, power, p, tol in cases:
        run_case(name, case, power, dropout_p=p, **tol)
    check_relu_kills(f32)
    check_sigmoid_paths(f32)
    check_smem_limit(f32)
    check_score_cache(f32)
    check_grid_splits(f32)
    check_block_order()
    check_shared_tables()
    check_decoding(args.quick)
    check_odd_powers(args.quick)
    # (the non-finite inputs are the launcher's host code and the kernels' usual paths on the inputs
    # it makes finite, and the radii's signs and sizes are the launcher's and the element math's,
    # not new paths of threads and memory: the plain run checks them, the sanitizers' runs leave
    # them out)
    if run_special() + (0 if args.sanitize else check_nonfinite() + check_radii()):
        sys.exit(1)
    if args.fuzz and run_fuzz(args.fuzz):
        sys.exit(1)


if __name__ == "__main__":
    main()
