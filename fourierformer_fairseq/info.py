"""`python -m fourierformer_fairseq.info`: versions, the extension, and which backends run here."""
from __future__ import annotations

import platform
import sys


def describe() -> str:
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
