"""`python -m fourierformer_fairseq.info`: versions, the extension, and which backends run here."""
from __future__ import annotations

import platform
import subprocess
import sys

# A call the extension must reject with an error whose message carries numbers (the radius'
# expected and given shapes). Run in a fresh process that loads the built extension (its path
# is the argument) and nothing else: a build whose link took its own copy of libstdc++ (a
# compiler wrapper with other search paths) crashes there, inside std::ostream, instead of
# raising, and would take this process down with it.
_REJECTED_CALL = (
    "import importlib.util, sys, torch\n"
    "spec = importlib.util.spec_from_file_location('fourierformer_fairseq._C', sys.argv[1])\n"
    "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
    "q = torch.zeros(1, 1, 2, 4)\n"
    "try:\n"
    "    torch.ops.fourierformer.fourier_attention_forward(q, q, q, torch.ones(1, 5), 4.0, None, None, False, 0.0, 0)\n"
    "except RuntimeError as e:\n"
    "    print('raised:', str(e).splitlines()[0])\n"
)


def error_reporting(code: str = _REJECTED_CALL) -> str:
    """'ok' when the loaded extension turns a rejected input into a RuntimeError, else what happened."""
    from .ops.extension import extension_status

    status = extension_status()
    if not status.loaded:
        return f"not checked (extension not loaded: {status.reason})"
    try:
        r = subprocess.run([sys.executable, "-c", code, status.module.__file__], capture_output=True, text=True,
                           timeout=300)
    except subprocess.TimeoutExpired:
        return "BROKEN: a rejected input did not return within 300 s"
    if r.returncode == 0 and "raised:" in r.stdout:
        return "ok (a rejected input raises RuntimeError)"
    if r.returncode < 0:
        return (f"BROKEN: a rejected input killed the process (signal {-r.returncode}) instead of raising; "
                "rebuild with the system compiler, e.g. CXX=/usr/bin/g++ CC=/usr/bin/gcc (README, the CUDA kernels)")
    return f"BROKEN: a rejected input did not raise (exit {r.returncode}): {(r.stdout + r.stderr).strip()[-300:]}"


def describe(check_errors: bool = True) -> str:
    """What main() prints; check_errors=False leaves out the error-reporting check (a subprocess)."""
    import torch

    from . import __version__
    from .ops.backends import DECLARATIONS
    from .ops.extension import extension_status

    status = extension_status()
    lines = [
        f"fourierformer_fairseq {__version__}",
        f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}, "
        f"GPU available: {torch.cuda.is_available()})",
    ]
    if status.loaded:
        build = status.build
        lines.append(
            f"extension: loaded, built for torch {build['torch_version']}, "
            f"CUDA {build['cuda_version'] or 'not compiled'}, CPU kernels: {build['cpu_isa']}"
        )
        if check_errors:
            lines.append(f"error reporting: {error_reporting()}")
    else:
        lines.append(f"extension: not loaded: {status.reason}")
    lines.append("backends (what each accepts, and why it cannot run here):")
    for name, declaration in DECLARATIONS.items():
        reasons = declaration.not_supported_reasons()
        state = "available" if not reasons else "unavailable: " + "; ".join(reasons)
        lines.append(f"  {name:<10} {state}")
        lines.append(f"  {'':<10} takes {declaration.describe()}")
    try:
        import fairseq

        lines.append(f"fairseq {fairseq.__version__}")
    except Exception as e:  # fairseq is optional for the op
        lines.append(f"fairseq: not importable ({type(e).__name__}: {e})")
    return "\n".join(lines)


def main() -> int:
    print(describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
