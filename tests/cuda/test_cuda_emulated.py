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

from repo import REPO  # noqa: E402

ROOT = REPO
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "emulation", "run_emulated_check.py")


def _text(output):
    if output is None:
        return ""
    return output.decode(errors="replace") if isinstance(output, bytes) else output


# Forward and backward against the reference and the oracle: masks, dropout, the published
# normaliser, the tiles' limits, the decoding forward, the special and non-finite inputs, and
# negative, zero and tiny radii of every shape (emulation/run_emulated_check.py's run_checks).
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
