"""The weights_only allowlist (checkpoint_compat) and the plugin's import guard, each in a fresh process."""
import os
import subprocess
import sys
import textwrap

import pytest
from repo import REPO

SAVE_FAIRSEQ_LIKE_STATE = """
import argparse, datetime, zipfile, numpy as np, torch
state = {
    "cfg": {"model": argparse.Namespace(arch="fourierformer_iwslt_de_en", fourier_power=2)},
    "extra_state": {"metrics": {"valid": [(10, "_bleu_counts", "AverageMeter",
                                           {"val": np.array([7, 3]), "sum": np.float64(2.5)})]}},
    "model": {"w": torch.ones(2)},
}
torch.save(state, "{path}/ckpt.pt")
torch.save({"when": datetime.date(2024, 1, 1)}, "{path}/other.pt")
# the same file as numpy 1.x names it (numpy.core instead of numpy._core)
with zipfile.ZipFile("{path}/ckpt.pt") as src, zipfile.ZipFile("{path}/np1.pt", "w") as dst:
    for item in src.infolist():
        data = src.read(item.filename)
        if item.filename.endswith("data.pkl"):
            data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
        dst.writestr(item, data)
"""


def run_python(code: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_fairseq_checkpoint_objects_load_with_weights_only_and_nothing_else_does(tmp_path):
    run_python(SAVE_FAIRSEQ_LIKE_STATE.replace("{path}", str(tmp_path)))
    proc = run_python(f"""
        import pickle, torch
        def load(name):
            try:
                return torch.load("{tmp_path}/" + name)  # torch 2.13: weights_only=True by default
            except pickle.UnpicklingError as e:
                return "refused: " + str(e).splitlines()[0]
        before = load("ckpt.pt")
        import fourierformer_fairseq  # what --user-dir does
        after = load("ckpt.pt")
        np1 = load("np1.pt")
        other = load("other.pt")
        print("BEFORE", before if isinstance(before, str) else "loaded")
        print("AFTER", after["cfg"]["model"].fourier_power, after["extra_state"]["metrics"]["valid"][0][3]["val"].tolist())
        print("NP1", np1 if isinstance(np1, str) else np1["extra_state"]["metrics"]["valid"][0][3]["sum"])
        print("OTHER", other if isinstance(other, str) else "loaded")
    """)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.split(" ")[0].isupper())
    assert lines["BEFORE"].startswith("refused")
    assert lines["AFTER"] == "2 [7, 3]"
    assert lines["NP1"] == "2.5"
    assert lines["OTHER"].startswith("refused"), "the allowlist must stay narrow"


def test_ops_import_without_fairseq():
    proc = run_python("""
        import importlib.machinery as machinery, sys
        find = machinery.PathFinder.find_spec
        def hide_fairseq(name, path=None, target=None):
            return None if name.split(".")[0] in ("fairseq", "fairseq_cli") else find(name, path, target)
        machinery.PathFinder.find_spec = hide_fairseq
        import torch
        import fourierformer_fairseq
        from fourierformer_fairseq.ops import fourier_attention
        q = torch.randn(1, 1, 3, 4)
        out = fourier_attention(q, q, q, torch.tensor(1.0))
        print(fourierformer_fairseq.FAIRSEQ_AVAILABLE, "fairseq" in sys.modules, tuple(out.shape))
    """)
    assert proc.stdout.strip().splitlines()[-1] == "False False (1, 1, 3, 4)"


def test_what_rank_0_broadcasts_of_a_checkpoint_loads_on_the_other_ranks():
    """Resuming with several ranks: rank 0 reads the checkpoint (its cfg made an omegaconf DictConfig) and
    fairseq's broadcast_object sends it to the others through torch.save / torch.load, the tensors apart
    as placeholders. The other ranks' torch.load (weights_only) reads it once the plugin is imported."""
    proc = run_python("""
        import io, pickle, torch
        from omegaconf import OmegaConf
        from fairseq.distributed import utils as distributed_utils
        state = {"cfg": OmegaConf.create({"common": {"seed": 3, "user_dir": None}, "optimization": {"lr": [0.005]}}),
                 "model": {"w": torch.ones(2)}, "extra_state": {"train_iterator": {"epoch": 3}}}
        tensors = []
        buffer = io.BytesIO()
        torch.save(distributed_utils._split_tensors_from_obj(state, tensors), buffer)
        def load():
            try:
                return torch.load(io.BytesIO(buffer.getvalue()), map_location="cpu")
            except pickle.UnpicklingError as e:
                return "refused: " + str(e).splitlines()[0]
        before = load()
        import fourierformer_fairseq  # what --user-dir does
        after = distributed_utils._put_tensors_in_obj(load(), tensors)
        print("BEFORE", before if isinstance(before, str) else "loaded")
        print("AFTER", after["cfg"].common.seed, list(after["cfg"].optimization.lr), after["model"]["w"].tolist())
    """)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.split(" ")[0].isupper())
    assert lines["BEFORE"].startswith("refused")
    assert lines["AFTER"] == "3 [0.005] [1.0, 1.0]"


def test_the_op_imports_and_runs_where_fairseq_cannot_be_imported(tmp_path):
    """A fairseq that fails to import (first on the path) is never imported by the package or its op."""
    fake = tmp_path / "fake" / "fairseq"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("this fairseq must not be imported")\n')
    proc = run_python(f"""
        import sys
        sys.path.insert(0, {str(tmp_path / "fake")!r})
        import torch
        import fourierformer_fairseq.ops
        from fourierformer_fairseq.ops import fourier_attention
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 5, 4, generator=g, requires_grad=True) for _ in range(3))
        out = fourier_attention(q, k, v, torch.tensor(1.0))
        out.sum().backward()
        ok = bool(torch.isfinite(out).all()) and bool(torch.isfinite(q.grad).all())
        print("RESULT", "fairseq" in sys.modules, tuple(out.shape), ok)
    """)
    assert proc.stdout.strip().splitlines()[-1] == "RESULT False (1, 2, 5, 4) True"


@pytest.mark.parametrize("module", ["fourierformer_fairseq.models", "fourierformer_fairseq.models.fourierformer",
                                    "fourierformer_fairseq.modules",
                                    "fourierformer_fairseq.modules.fourier_multihead_attention"])
def test_no_import_of_the_package_configures_logging(module):
    """The root logger's level and handlers stay as they were: after importing the package or its op
    (fairseq stays unimported), after a module of it that imports fairseq (which registers the plugin
    as it is imported), and after the registration that follows a user's own import of fairseq
    (which, stock, configures logging itself)."""
    proc = run_python(f"""
        import logging, sys
        def state():
            return (logging.root.level, list(logging.root.handlers))
        before = state()
        import fourierformer_fairseq, fourierformer_fairseq.ops
        print("PACKAGE", state() == before, "fairseq" in sys.modules)
        import {module}
        from fairseq.models import ARCH_MODEL_REGISTRY
        print("MODELS", state() == before, "fourierformer_iwslt_de_en" in ARCH_MODEL_REGISTRY)
    """)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.split(" ")[0].isupper())
    assert lines == {"PACKAGE": "True False", "MODELS": "True True"}
    proc = run_python("""
        import logging
        import fairseq  # stock fairseq configures the root logger on import
        after_fairseq = (logging.root.level, list(logging.root.handlers))
        import fourierformer_fairseq  # registers at once
        from fairseq.models import ARCH_MODEL_REGISTRY
        print("REGISTERED", (logging.root.level, list(logging.root.handlers)) == after_fairseq,
              "fourierformer_lm_wiki103_small" in ARCH_MODEL_REGISTRY)
    """)
    assert proc.stdout.strip().splitlines()[-1] == "REGISTERED True True"


def test_the_plugin_registers_when_fairseq_is_imported_after_it():
    """import fourierformer_fairseq, then fairseq: the archs are registered and the broadcast objects
    allowlisted once fairseq is imported."""
    proc = run_python("""
        import sys
        import fourierformer_fairseq
        assert "fairseq" not in sys.modules
        from fairseq.models import ARCH_MODEL_REGISTRY
        from fairseq.distributed.utils import _TensorPlaceholder
        from torch.serialization import get_safe_globals
        print("RESULT", "fourierformer_iwslt_de_en" in ARCH_MODEL_REGISTRY, _TensorPlaceholder in get_safe_globals())
    """)
    assert proc.stdout.strip().splitlines()[-1] == "RESULT True True"


@pytest.mark.parametrize("first", ["fourierformer_fairseq.modules", "fourierformer_fairseq.models",
                                   "fourierformer_fairseq.modules.fourier_multihead_attention",
                                   "fourierformer_fairseq.models.fourierformer"])
def test_a_subpackage_imported_first_registers_the_plugin(first):
    """A fresh process whose first import is one of the plugin's fairseq-facing modules (which imports
    fairseq, whose import registers the plugin, which imports those modules again) ends with the
    plugin registered, not in a circular import."""
    proc = run_python(f"""
        import importlib
        importlib.import_module({first!r})
        from fairseq.models import ARCH_MODEL_REGISTRY
        from fourierformer_fairseq.modules import FourierMultiheadAttention
        print("RESULT", "fourierformer_iwslt_de_en" in ARCH_MODEL_REGISTRY)
    """)
    assert proc.stdout.strip().splitlines()[-1:] == ["RESULT True"], proc.stderr[-2000:]


def test_the_readme_names_what_a_forgotten_user_dir_gives(translation_data, tmp_path):
    """fairseq-generate on a checkpoint of the stock softmax twin, without --user-dir: torch's loader
    refuses it with the message that the README's troubleshooting quotes; with it, it runs."""
    from fairseq_helpers import USER_DIR, run_cli, train_translation_model

    train_translation_model(translation_data, str(tmp_path), "transformer_iwslt_de_en", ["--max-update", "2"])
    args = [translation_data, "--path", str(tmp_path / "checkpoint_last.pt"), "--gen-subset", "valid", "--beam", "1",
            "--max-len-b", "5", "--source-lang", "in", "--target-lang", "out", "--cpu"]
    exe = os.path.join(os.path.dirname(sys.executable), "fairseq-generate")
    proc = subprocess.run([exe if os.path.exists(exe) else "fairseq-generate", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode != 0
    quoted = "Weights only load failed"
    assert quoted in proc.stderr and "argparse.Namespace" in proc.stderr, proc.stderr[-3000:]
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        assert f"{quoted} ... argparse.Namespace" in fh.read()
    assert "H-0" in run_cli("fairseq-generate", ["--user-dir", USER_DIR, *args]).stdout
