"""Let torch's ``weights_only`` loader read fairseq checkpoints: a narrow allowlist, nothing else.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``: a restricted unpickler that
builds tensors, plain containers and primitives, and refuses every other class unless it is
allowlisted. fairseq-fixed's ``checkpoint_utils.load_checkpoint_to_cpu`` calls
``torch.load(f, map_location="cpu")`` without ``weights_only``, so on torch 2.13 it gets the
restricted loader, and the checkpoints fairseq-train writes hold a few other objects:

* ``argparse.Namespace``: ``cfg.model`` of every ``--arch`` (argparse) model, and ``args`` in
  older checkpoints. Every training checkpoint has one, so without this nothing loads
  ("Unsupported global: GLOBAL argparse.Namespace").
* numpy arrays and scalars (``numpy.ndarray``, ``numpy.dtype`` and its numeric dtype classes,
  ``numpy._core.multiarray._reconstruct`` / ``scalar``, also under their numpy-1.x name
  ``numpy.core.multiarray``): the saved validation meters, e.g. ``_bleu_counts`` with ``--eval-bleu``.
* what fairseq sends from rank 0 to the other ranks when a run of several processes resumes: rank 0
  alone reads the checkpoint, and fairseq's ``broadcast_object`` pickles it with ``torch.save``
  and unpickles it with ``torch.load``. Its ``cfg`` is by then an omegaconf ``DictConfig``
  (``load_checkpoint_to_cpu`` makes it one): ``DictConfig``, ``ListConfig``, ``AnyNode``,
  ``Metadata``, ``ContainerMetadata``, ``typing.Any``, ``collections.defaultdict`` and the
  ``dict``, ``list`` and ``int`` they name, and fairseq's ``_TensorPlaceholder``, which stands for
  each tensor sent apart. Without them every rank but the first stops at the resume ("Unsupported
  global: GLOBAL omegaconf.dictconfig.DictConfig").

``allow_fairseq_checkpoints()`` adds exactly these to the allowlist with
``torch.serialization.add_safe_globals``. That is all it does: ``torch.load`` is not wrapped or
patched, ``weights_only`` stays True, and any other class in a file is still refused.
Importing ``fourierformer_fairseq`` (what ``--user-dir`` does) calls it: where fairseq is installed
but not yet imported, for all but the broadcast objects (their classes are fairseq's), and again,
for those, once fairseq is imported (the package does not import fairseq itself).
"""
from __future__ import annotations

import argparse
import collections
import sys
import typing
from typing import List

import torch

_NUMPY_DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
)

_allowed_with_fairseq = None  # None: nothing allowed yet; False: all but the broadcast objects; True: all


def _numpy_globals() -> List[object]:
    try:
        import numpy as np
    except ImportError:  # no numpy: checkpoints cannot hold numpy objects either
        return []
    core = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1
    multiarray = core.multiarray
    found: List[object] = [np.ndarray, np.dtype, multiarray._reconstruct, multiarray.scalar]
    # numpy >= 1.25 pickles a dtype through its class (numpy.dtypes.Int64DType, ...)
    found += [type(np.dtype(name)) for name in _NUMPY_DTYPES if type(np.dtype(name)) is not np.dtype]
    if multiarray.__name__ != "numpy.core.multiarray":
        # files written under numpy 1.x name the same functions numpy.core.multiarray.*
        found += [
            (multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
            (multiarray.scalar, "numpy.core.multiarray.scalar"),
        ]
    return found


def _broadcast_globals() -> List[object]:
    """The globals of a loaded checkpoint as fairseq broadcasts it to the other ranks (none before
    fairseq is imported: this does not import it)."""
    if "fairseq" not in sys.modules:
        return []
    try:
        from fairseq.distributed.utils import _TensorPlaceholder
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode
    except ImportError:  # no fairseq: nothing broadcasts
        return []
    return [DictConfig, ListConfig, AnyNode, Metadata, ContainerMetadata, typing.Any, collections.defaultdict,
            dict, list, int, _TensorPlaceholder]


def fairseq_checkpoint_globals() -> List[object]:
    """The non-tensor globals in fairseq checkpoints (and in what rank 0 broadcasts of one), in the form
    ``add_safe_globals`` takes."""
    return [argparse.Namespace] + _numpy_globals() + _broadcast_globals()


def allow_fairseq_checkpoints() -> None:
    """Allowlist :func:`fairseq_checkpoint_globals` for ``torch.load(weights_only=True)``; idempotent
    (a call after fairseq's import adds the broadcast objects)."""
    global _allowed_with_fairseq
    with_fairseq = "fairseq" in sys.modules
    if _allowed_with_fairseq is True or _allowed_with_fairseq is with_fairseq:
        return
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is None:  # torch < 2.4: torch.load does not default to weights_only
        return
    add_safe_globals(fairseq_checkpoint_globals())
    _allowed_with_fairseq = with_fairseq


__all__ = ["allow_fairseq_checkpoints", "fairseq_checkpoint_globals"]
