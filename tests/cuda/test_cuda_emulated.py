"""The CUDA kernels, run on the CPU by the host emulator of csrc/cuda/emulation.

Every CUDA thread becomes an OS thread with real barriers and shuffles, so the kernels'
indexing, masking, reductions and synchronisation are checked against the float64
reference on machines without a GPU (see emulation/run_emulated_check.py for what it
cannot model). It runs in a subprocess: the emulated library must not share a process with the
real extension, both register the fourierformer ops.
"""
import os
import subprocess
import sys

import pytest

from repo import REPO, TESTS  # noqa: E402

ROOT = REPO
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "emulation", "run_emulated_check.py")


def _text(output):
    if output is None:
        return ""
    return output.decode(errors="replace") if isinstance(output, bytes) else output


def test_cuda_kernels_under_host_emulation_match_the_reference():
    try:
        result = subprocess.run(
            [sys.executable, SCRIPT, "--quick"], capture_output=True, text=True, timeout=1200, cwd=ROOT
        )
    except subprocess.TimeoutExpired as exc:  # say how far it got
        pytest.fail(f"the emulated check ran past {exc.timeout:.0f}s; its output so far:\n"
                    f"{_text(exc.stdout)[-4000:]}\n{_text(exc.stderr)[-4000:]}")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "all emulated checks passed" in result.stdout


# The same checks with the emulation module built under the compiler's thread sanitizer (data
# races between the threads of a block: a missing __syncthreads or __syncwarp, on shared or global
# memory) and its address sanitizer (reads and writes past a block's shared memory or past a
# tensor); a report fails the run. The script also checks that its planted bugs (a missing
# barrier, a read past shared memory, a read past a tensor) are reported, so that a run with no
# report is not an uninstrumented one. Skipped, with the script's reason, where the compiler has
# no such runtime.
@pytest.mark.parametrize("sanitizer", ["thread", "address"])
def test_cuda_kernels_under_host_emulation_with_sanitizer(sanitizer):
    try:
        result = subprocess.run([sys.executable, SCRIPT, "--quick", "--sanitize", sanitizer], capture_output=True,
                                text=True, timeout=1800, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the {sanitizer} sanitizer's run passed {exc.timeout:.0f}s; its output so far:\n"
                    f"{_text(exc.stdout)[-4000:]}\n{_text(exc.stderr)[-4000:]}")
    if result.returncode != 0 and "(a runtime that the sanitizer needs)" in result.stderr:
        pytest.skip(result.stderr.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    assert f"all emulated checks passed under the {sanitizer} sanitizer" in result.stdout


# Negative, zero and tiny radii through the CUDA kernels under the host emulator, forward and
# the four gradients, against the float64 oracle (tests/oracle.py): float32 within
# oracle_mismatches' bound (its plain float32 implementation with the series of log|sinc| near
# 0, as the quotient's derivative cancels at tiny x), float64 within 1e-9 of each result's scale
# (as the CPU float64 checks). Every radius shape: scalar, per head, per feature, per (head,
# feature); the op takes the (H, D) table, and the gradient is summed back to the shape given.
_RADIUS_CODE = r'''
import sys, torch
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import run_emulated_check as emu
from oracle import oracle_gradient_scales, oracle_gradients, oracle_mismatches
torch.set_num_threads(1)
emu.build()
B, H, N, M, D, Dv = 2, 2, 5, 9, 8, 3
g = torch.Generator().manual_seed(51)
q, k, v, dout = (torch.randn(*s, generator=g) for s in ((B, H, N, D), (B, H, M, D), (B, H, M, Dv), (B, H, N, Dv)))
shapes = {"scalar": (), "head": (H, 1), "feature": (D,), "head_feature": (H, D)}
failures = 0
for shape_name, shape in shapes.items():
    for value in ("negative", "mixed", "tiny", "zero"):
        magnitude = 0.7 + 0.6 * torch.rand(shape, generator=g)
        sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
        r = {"negative": -1.5 * magnitude, "mixed": 1.5 * magnitude * (sign if shape else -1.0),
             "tiny": 1e-10 * magnitude * sign, "zero": torch.zeros(shape)}[value]
        kwargs = dict(power=4, causal=True) if value in ("negative", "zero") else dict(power=2)
        for dtype in (torch.float32, torch.float64):
            table = r.reshape(-1, 1 if shape in ((), (H, 1)) else D).expand(H, D).to(dtype).contiguous()
            args = [t.to(dtype) for t in (q, k, v)]
            out, lse = torch.ops.fourierformer.fourier_attention_forward(
                *args, table, float(kwargs["power"]), None, None, kwargs.get("causal", False), 0.0, 0)
            dq, dk, dv, dtable = torch.ops.fourierformer.fourier_attention_backward(
                dout.to(dtype), *args, table, out, lse, float(kwargs["power"]), None, None, kwargs.get("causal", False), 0.0, 0)
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
            print(("FAIL" if bad else "ok"), shape_name, value, dtype, "; ".join(bad), flush=True)
            failures += bool(bad)
print("radius cases failed:", failures)
sys.exit(1 if failures else 0)
'''


def test_cuda_kernels_take_negative_zero_and_tiny_radii_under_host_emulation():
    result = subprocess.run([sys.executable, "-c", _RADIUS_CODE, os.path.dirname(SCRIPT), TESTS],
                            capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "radius cases failed: 0" in result.stdout
