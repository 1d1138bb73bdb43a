"""Loads the compiled extension ``fourierformer_fairseq._C`` and says why when it cannot.

A missing extension, or one built for another torch, must not break ``import``: the
package then warns once and runs the pure-PyTorch reference.
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


_status: Optional[ExtensionStatus] = None
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


def extension_status() -> ExtensionStatus:
    """Loads the extension once; warns once, with the reason, if it is unusable.

    Loading also registers the ops' shape (fake) and autograd implementations
    (fused.register_ops), so that they are in place before any call, opcheck or trace.
    """
    global _status
    if _status is None:
        _status = _try_load()
        if _status.loaded:
            from .fused import register_ops

            register_ops()
        if not _status.loaded and "FOURIERFORMER_DISABLE_EXTENSION" not in _status.reason:
            warnings.warn(
                f"fourierformer_fairseq: fused kernels unavailable, using the PyTorch reference: {_status.reason}",
                RuntimeWarning,
                stacklevel=2,
            )
    return _status
