"""Loads the compiled extension ``fourierformer_fairseq._C`` and says why when it cannot.

Importing this module (which ``import fourierformer_fairseq.ops`` does first) loads the
extension, which defines the ``fourierformer::`` ops (``TORCH_LIBRARY``); ``ops/fused.py`` then
registers their shape (fake) and autograd implementations, so that all is in place before
any call, opcheck or trace. A missing extension, or one built for another torch, must not
break ``import``: the package then warns once and runs the pure-PyTorch reference.
``FOURIERFORMER_DISABLE_EXTENSION=1`` leaves the extension unloaded (and the op names free for
another library, as the CUDA host emulation's).
"""
from __future__ import annotations

import importlib
import os
import warnings
from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class ExtensionStatus:
    loaded: bool
    reason: str = ""  # why it did not load, empty when it did
    module: Optional[object] = None
    build: dict = field(default_factory=dict)

    @property
    def has_cuda(self) -> bool:
        return self.loaded and bool(self.build.get("cuda_version"))


_REBUILD = "rebuild it with `pip install --no-build-isolation -e .` in the project folder"


def _try_load() -> ExtensionStatus:
    if os.environ.get("FOURIERFORMER_DISABLE_EXTENSION", "0") == "1":
        return ExtensionStatus(False, "disabled by FOURIERFORMER_DISABLE_EXTENSION=1")
    try:
        module = importlib.import_module("fourierformer_fairseq._C")
    except ImportError as e:
        if "No module named" in str(e):
            return ExtensionStatus(False, f"the compiled extension is not installed; {_REBUILD}")
        return ExtensionStatus(False, f"the compiled extension failed to load ({e}); {_REBUILD}")
    except OSError as e:
        return ExtensionStatus(False, f"the compiled extension failed to load ({e}); {_REBUILD}")
    build = {
        "torch_version": getattr(module, "torch_version", "unknown"),
        "cuda_version": getattr(module, "cuda_version", ""),
        "cpu_isa": getattr(module, "cpu_isa", "unknown"),
    }
    if build["torch_version"] != torch.__version__:
        return ExtensionStatus(
            False,
            f"the compiled extension was built for torch {build['torch_version']} but torch "
            f"{torch.__version__} is running; {_REBUILD}",
            build=build,
        )
    return ExtensionStatus(True, module=module, build=build)


def _load() -> ExtensionStatus:
    status = _try_load()
    if not status.loaded and "FOURIERFORMER_DISABLE_EXTENSION" not in status.reason:
        warnings.warn(
            f"fourierformer_fairseq: fused kernels unavailable, using the PyTorch reference: {status.reason}",
            RuntimeWarning,
            stacklevel=2,
        )
    return status


_STATUS = _load()


def extension_status() -> ExtensionStatus:
    """What loading the extension (at import) gave: loaded, or the reason it is not."""
    return _STATUS
