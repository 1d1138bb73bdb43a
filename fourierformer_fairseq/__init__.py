"""FourierFormer for fairseq: Fourier integral attention with fused CPU and CUDA kernels.

``import fourierformer_fairseq`` (or ``--user-dir`` pointing at this folder) registers, when
fairseq is installed, the ``fourier_multihead_attention`` module, the FourierFormer models and
architectures and their softmax twins, and allowlists the non-tensor objects of fairseq
checkpoints for torch's ``weights_only`` loader (see ``checkpoint_compat``).
``fourierformer_fairseq.ops`` works without fairseq.
"""
import importlib.util
import os

__version__ = "0.1.0"

#: the fairseq the plugin is built and tested with, its one pin: setup.py's ``fairseq`` extra,
#: tools/install.sh and the GPU check's offline bundle (tools/offline_bundle.py) read it here.
#: fairseq-fixed is fairseq main that builds and imports on Python 3.11 and 3.12 (fairseq 0.12.2
#: from PyPI does neither).
FAIRSEQ_REQUIREMENT = "fairseq-fixed==0.12.3.1"

#: the folder to pass to fairseq's ``--user-dir`` from anywhere
USER_DIR = os.path.dirname(os.path.abspath(__file__))

FAIRSEQ_AVAILABLE = importlib.util.find_spec("fairseq") is not None

if FAIRSEQ_AVAILABLE:
    from . import checkpoint_compat, models, modules  # noqa: F401  (registers with fairseq)

    checkpoint_compat.allow_fairseq_checkpoints()
