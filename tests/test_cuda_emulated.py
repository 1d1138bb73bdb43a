"""The CUDA kernels, run on the CPU by the host emulator in csrc/cuda/emulation.

Every CUDA thread becomes an OS thread with real barriers and shuffles, so the kernels'
indexing, masking, reductions and synchronisation are checked against the float64
reference on machines without a GPU (see run_emulated_check.py for what it cannot model).
It runs in a subprocess: the emulated library must not share a process with the real
extension, both register the fourierformer ops.
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "csrc", "cuda", "emulation", "run_emulated_check.py")


def _text(output):
    if output is None:
        return ""
    return output.decode(errors="replace") if isinstance(output, bytes) else output


@pytest.mark.slow
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
