"""The extension's loader, each in a fresh process: the shape (fake) and autograd registrations
made at import, an extension that cannot load (one warning, the reference runs), no extension at all,
and what ``python -m fourierformer_fairseq.info`` reports."""
import os
import subprocess
import sys

import pytest
import torch

from fourierformer_fairseq.ops import backend_unavailable_reason

CPU_FUSED = not backend_unavailable_reason("cpu")
needs_cpu_kernel = pytest.mark.skipif(not CPU_FUSED, reason=f"fused CPU kernel: {backend_unavailable_reason('cpu')}")


def run_python(code, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)


@needs_cpu_kernel
def test_fake_and_autograd_registered_at_import():
    # in a fresh process: import the ops package, make no call, then run the op on fake tensors
    # and with autograd
    code = (
        "import torch\n"
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "import fourierformer_fairseq.ops\n"
        "assert fourierformer_fairseq.ops.extension.extension_status().loaded\n"
        "with FakeTensorMode():\n"
        "    q = torch.empty(1, 2, 3, 4); v = torch.empty(1, 2, 5, 6); r = torch.empty(2, 4)\n"
        "    out, lse = torch.ops.fourierformer.fourier_attention_forward(q, torch.empty(1, 2, 5, 4), v, r, 4.0,"
        " None, None, False, 0.0, 0)\n"
        "    print(tuple(out.shape), tuple(lse.shape), lse.dtype)\n"
        "q = torch.ones(1, 1, 2, 3, requires_grad=True)\n"
        "out, _ = torch.ops.fourierformer.fourier_attention_forward(q, q.detach(), q.detach(), torch.ones(1, 3), 2.0,"
        " None, None, False, 0.0, 0)\n"
        "print('grad_fn', out.grad_fn is not None)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(1, 2, 3, 6) (1, 2, 3) torch.float64" in result.stdout
    assert "grad_fn True" in result.stdout


def test_an_extension_that_cannot_load_warns_once_at_import_and_the_reference_runs():
    code = (
        "import sys, warnings\n"
        "sys.modules['fourierformer_fairseq._C'] = None  # an extension that cannot be imported\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import torch\n"
        "    import fourierformer_fairseq.ops as ops\n"
        "    q = torch.ones(1, 1, 2, 2)\n"
        "    for _ in range(2):\n"
        "        print(ops.fourier_attention(q, q, q, torch.tensor(1.0)).shape)\n"
        "found = [str(w.message) for w in caught if 'fused kernels unavailable' in str(w.message)]\n"
        "print('warnings:', len(found), found[0] if found else '')\n"
        "print('loaded:', ops.extension.extension_status().loaded)\n"
        "print('cpu:', ops.backend_unavailable_reason('cpu'))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("torch.Size([1, 1, 2, 2])") == 2
    assert "warnings: 1 fourierformer_fairseq: fused kernels unavailable" in result.stdout
    assert "the compiled extension failed to load" in result.stdout
    assert "loaded: False" in result.stdout and "cpu: the compiled extension failed to load" in result.stdout


def test_without_the_extension_everything_runs_on_the_reference():
    """Also: without the extension there is no fused backend to fall back from, so a call that
    the fused kernels would not take (float16 on CPU) gives no fallback warning."""
    code = (
        "import warnings, torch\n"
        "from fourierformer_fairseq.ops import fourier_attention, select_backend\n"
        "from fourierformer_fairseq.ops.extension import extension_status\n"
        "from fourierformer_fairseq.ops.inputs import prepare_inputs\n"
        "print('loaded:', extension_status().loaded)\n"
        "q = torch.randn(1, 1, 3, 2, generator=torch.Generator().manual_seed(0)); r = torch.tensor(1.0)\n"
        "print('auto ->', select_backend('auto', prepare_inputs(q, q, q, r)))\n"
        "print(fourier_attention(q, q, q, r).shape)\n"
        "try:\n    fourier_attention(q, q, q, r, backend='cpu')\nexcept ValueError as e:\n    print('cpu:', e)\n"
        "h = torch.ones(1, 1, 2, 2, dtype=torch.float16)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    fourier_attention(h, h, h, torch.tensor(1.0, dtype=torch.float16))\n"
        "print('warnings:', len(caught))\n"
        "try:\n    torch.ops.fourierformer.fourier_attention_forward\nexcept AttributeError:\n"
        "    print('op names free')\n"
    )
    result = run_python(code, FOURIERFORMER_DISABLE_EXTENSION="1")
    assert result.returncode == 0, result.stderr
    assert "loaded: False" in result.stdout
    assert "auto -> reference" in result.stdout
    assert "torch.Size([1, 1, 3, 2])" in result.stdout
    assert "cpu:" in result.stdout and "FOURIERFORMER_DISABLE_EXTENSION" in result.stdout
    assert "warnings: 0" in result.stdout
    assert "op names free" in result.stdout  # another library (the CUDA host emulation) may define them


def test_info_reports_backends(capsys):
    """`python -m fourierformer_fairseq.info`, run in this process (its error check starts its
    own); scripts/tools/install.sh runs the command itself on every install."""
    from fourierformer_fairseq import info

    assert info.main() == 0
    out = capsys.readouterr().out
    assert f"torch {torch.__version__}" in out
    cpu_line = next(line for line in out.splitlines() if line.strip().startswith("cpu"))
    assert ("unavailable" not in cpu_line) == CPU_FUSED
    if CPU_FUSED:  # the build turns a rejected input into an exception (it does not crash)
        assert "error reporting: ok" in out


def test_info_error_reporting_tells_a_crash_and_a_silent_pass_from_an_exception():
    """What info reports when the rejected call kills its process (a build with its own
    libstdc++ segfaults there) or returns without raising."""
    from fourierformer_fairseq.info import error_reporting

    crashed = error_reporting("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    assert crashed.startswith("BROKEN: a rejected input killed the process (signal 11)"), crashed
    silent = error_reporting("print('accepted')\n")
    assert silent.startswith("BROKEN: a rejected input did not raise (exit 0)") and "accepted" in silent, silent
