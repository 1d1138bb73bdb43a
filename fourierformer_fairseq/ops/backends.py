"""What each backend of ``fourier_attention`` accepts: one declaration per backend.

Each backend is an object with its supported device, dtypes and limits, and
``not_supported_reasons(inp)``, which lists every reason it cannot run a call (an empty
list: it can). The fused backends' limits live with their kernels, in C++
(``csrc/backend_limits.h``); the extension exports them as ``_C.backend_limits`` (the rule on
the power too, as a number and in words) and the declarations read them from there, so that
the Python checks and the C++ checks cannot disagree. ``select_backend`` (ops/__init__.py)
and ``python -m fourierformer_fairseq.info`` both ask these declarations.
"""
from __future__ import annotations

import functools
from typing import List, Optional, Tuple

import torch

from .extension import extension_status
from .inputs import AttentionInputs


def _kept(fn):
    """A property computed on its first read and kept on the instance: functools.cached_property
    without the lock it takes under Python 3.11, which torch.compile cannot trace (a compiled
    first call of a process would fail on the declarations' first read)."""
    name = "_kept_" + fn.__name__

    @functools.wraps(fn)
    def read(self):
        kept = self.__dict__.get(name, _kept)
        if kept is _kept:
            kept = self.__dict__[name] = fn(self)
        return kept

    return property(read)


@functools.lru_cache(maxsize=None)
def _cuda_device_visible() -> bool:
    return torch.cuda.is_available()


class ReferenceBackend:
    """Pure PyTorch: every phi and power, every floating dtype, every device, differentiable masks."""

    name = "reference"
    fused = False
    supported_device: Optional[str] = None  # any
    supported_dtypes: Optional[Tuple[torch.dtype, ...]] = None  # any floating dtype
    max_head_dim: Optional[int] = None
    min_power: Optional[float] = None  # any positive integer p, even or odd, and every phi
    power_multiple: Optional[float] = None
    power_rule: Optional[str] = None

    def not_supported_reasons(self, inp: Optional[AttentionInputs] = None) -> List[str]:
        return []

    def describe(self) -> str:
        return "every phi and power, every floating dtype and device (materialises the N x M weights)"


def _limit(key: str, doc: str) -> property:
    """A FusedBackend property: the extension's limit ``key``, None while it is not loaded."""
    return property(lambda self: None if self._limits is None else self._limits[key], doc=doc)


class FusedBackend:
    """A fused kernel of the extension for one device type; its limits come from the extension."""

    fused = True
    differentiable_masks = False  # the op's autograd returns no gradient for attn_mask

    def __init__(self, name: str):
        self.name = name
        self.supported_device = name

    @_kept
    def _limits(self) -> Optional[dict]:
        status = extension_status()
        return status.module.backend_limits[self.name] if status.loaded else None

    @property
    def supported_dtypes(self) -> Optional[Tuple[torch.dtype, ...]]:
        """None while the extension is not loaded (the limits are the extension's)."""
        return None if self._limits is None else tuple(getattr(torch, n) for n in self._limits["dtypes"])

    max_head_dim = _limit("max_head_dim", "Largest D and Dv; None: no limit.")
    min_power = _limit("min_power", "phi(x) = x^p only, p at least this (and a multiple of power_multiple).")
    power_multiple = _limit("power_multiple", "p must be a multiple of this (2: even p alone; 1: odd p too, signed weights).")
    power_rule = _limit("power_rule", 'The rule on p in the extension\'s words: "even p >= 2", "integer p >= 1".')
    phis = _limit("phis", 'The phis it runs: "power" (under power_rule), and where listed "abs", "relu", "sigmoid" (p = 1).')
    seq_len_bound = _limit("seq_len_bound", "N and M must be below this; None: no bound.")
    tiled_backward_max_head_dim = _limit(
        "tiled_backward_max_head_dim",
        "Largest D and Dv of the backward that reads the forward's tables (fused.py keeps them for it); "
        "None: the backend has no such tables.",
    )

    @property
    def key_table_keys(self) -> Optional[int]:
        """The key table's room is a multiple of this (ops.key_table); None: the backend reads none."""
        return None if self._limits is None else self._limits.get("key_table_keys")

    @_kept
    def _availability_reasons(self) -> Tuple[str, ...]:
        status = extension_status()
        if not status.loaded:
            return (status.reason,)
        if self.name == "cuda":
            if not status.has_cuda:
                return (f"the extension was compiled without CUDA (torch {status.build.get('torch_version')})",)
            if not _cuda_device_visible():
                return ("the extension has CUDA kernels, but no CUDA device is visible",)
        return ()

    @_kept
    def _dtypes(self) -> Tuple[torch.dtype, ...]:
        return self.supported_dtypes or ()

    def not_supported_reasons(self, inp: Optional[AttentionInputs] = None) -> List[str]:
        """Every reason this backend cannot run inp (with inp=None: cannot run at all here)."""
        reasons = list(self._availability_reasons)
        if inp is None or self._limits is None:
            return reasons
        device = inp.q.device.type
        if device != self.supported_device:
            reasons.append(f"inputs are on {device}")
        def only():  # (formatted only for a call it refuses: this runs on every call)
            return f"the {self.name} kernels take phi(x) = x^p with {self.power_rule}" + "".join(
                f", or phi={phi!r}" for phi in self.phis if phi != "power")

        if inp.phi not in self.phis:
            reasons.append(f"{only()}, got phi={inp.phi!r}; the reference runs it")
        elif inp.phi == "power" and (inp.power % self.power_multiple != 0 or inp.power < self.min_power):
            reasons.append(f"{only()}, got power={inp.power}; the reference runs it")
        if inp.q.dtype not in self._dtypes:
            allowed = ", ".join(str(t) for t in self._dtypes)
            reasons.append(f"the {self.name} kernel takes {allowed}, got {inp.q.dtype}")
        D, Dv = inp.q.shape[-1], inp.v.shape[-1]
        if self.max_head_dim is not None and max(D, Dv) > self.max_head_dim:
            reasons.append(f"the {self.name} kernel takes head dims up to {self.max_head_dim}, got D = {D}, Dv = {Dv}")
        N, M = inp.q.shape[-2], inp.k.shape[-2]
        if self.seq_len_bound is not None and max(N, M) >= self.seq_len_bound:
            reasons.append(f"the {self.name} kernel takes sequence lengths below {self.seq_len_bound}, got N = {N}, M = {M}")
        if not self.differentiable_masks and inp.attn_mask is not None and inp.attn_mask.requires_grad:
            reasons.append("attn_mask requires grad; only the reference differentiates masks")
        return reasons

    def describe(self) -> str:
        if self._limits is None:
            return "limits unknown (the extension is not loaded)"
        dtypes = ", ".join(str(t).replace("torch.", "") for t in self._dtypes)
        head = f"head dims up to {self.max_head_dim}" if self.max_head_dim is not None else "any head dim"
        others = "".join(f", phi={phi!r}" for phi in self.phis if phi != "power")
        return f"{self.supported_device} tensors, {dtypes}, phi(x) = x^p with {self.power_rule}{others}, {head}"


# In the order "auto" tries them: fastest first.
DECLARATIONS = {
    "cuda": FusedBackend("cuda"),
    "cpu": FusedBackend("cpu"),
    "reference": ReferenceBackend(),
}
BACKENDS = tuple(DECLARATIONS)


def get_backend(name: str):
    """The declaration of backend ``name``; ValueError for an unknown name."""
    try:
        return DECLARATIONS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose from {BACKENDS + ('auto',)}") from None
