"""FourierFormer for fairseq: Fourier integral attention with fused C++/CUDA kernels.

Registration with fairseq (the ``fourier_multihead_attention`` module, the FourierFormer models and
architectures and their softmax twins, and the allowlist of the non-tensor objects of fairseq
checkpoints for torch's ``weights_only`` loader, ``checkpoint_compat``; fairseq's batch prefetch
stopped at exit, ``prefetch_exit``) happens once fairseq is
imported: at once when it already is (``--user-dir`` pointing at this folder: fairseq's tools import
it after fairseq), else as soon as anything imports it. Importing the package, or
``fourierformer_fairseq.ops``, does not import fairseq itself: the op needs torch alone.

No import of the package configures logging. Stock fairseq's import does (its text-to-speech tasks
call ``logging.basicConfig``): where a module of the plugin imports fairseq (``import
fourierformer_fairseq.models``), and while the plugin registers, the root logger's level and handlers
are kept as they were (``logging_untouched``); a user's own ``import fairseq`` stays stock.
"""
import contextlib
import importlib.abc
import importlib.util
import logging
import os
import sys

__version__ = "0.1.0"

#: the fairseq the plugin is built and tested with, its one pin: setup.py's ``fairseq`` extra,
#: scripts/tools/install.sh and the GPU check's offline bundle (scripts/tools/offline_bundle.py) read it here.
#: fairseq-fixed is fairseq main that builds and imports on Python 3.11 and 3.12 (fairseq 0.12.2
#: from PyPI does neither).
FAIRSEQ_REQUIREMENT = "fairseq-fixed==0.12.3.1"

#: the folder to pass to fairseq's ``--user-dir`` from anywhere
USER_DIR = os.path.dirname(os.path.abspath(__file__))


def _fairseq_findable() -> bool:
    try:
        return importlib.util.find_spec("fairseq") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a half-imported fairseq
        return False


FAIRSEQ_AVAILABLE = _fairseq_findable()


@contextlib.contextmanager
def logging_untouched():
    """The root logger's level and handlers as they were before the block (for the plugin's imports
    of fairseq, whose import configures logging)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers


def _register() -> None:
    """Registers the plugin with fairseq (imported by now); idempotent, as imports are."""
    with logging_untouched():
        from . import checkpoint_compat, models, modules, prefetch_exit  # noqa: F401  (registers with fairseq)

        checkpoint_compat.allow_fairseq_checkpoints()
        prefetch_exit.stop_prefetch_at_exit()


def _imported_by_the_plugin() -> bool:
    """Whether a module of this package is being executed (importing) further up the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and str(frame.f_globals.get("__name__", "")).startswith(__name__ + "."):
            return True
        frame = frame.f_back
    return False


class _RegisterAfterFairseq(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Registers the plugin right after fairseq's own import, whoever imports it (one use)."""

    def __init__(self):
        self._loader = None

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "fairseq" or self._loader is not None:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self._loader  # fairseq sees its own loader
        with logging_untouched() if _imported_by_the_plugin() else contextlib.nullcontext():
            self._loader.exec_module(module)
        _register()


if "fairseq" in sys.modules:
    _register()
elif FAIRSEQ_AVAILABLE:
    # what needs no fairseq is allowed at once (torch.load of a checkpoint before fairseq's import)
    from . import checkpoint_compat

    checkpoint_compat.allow_fairseq_checkpoints()
    sys.meta_path.insert(0, _RegisterAfterFairseq())
