"""Which attention configurations learn a small translation model (slow: fairseq-train in process).

The model and task of docs/published-model.md, "At small width": ``fourierformer_iwslt_de_en``
with 2+2 layers, d 64, 4 heads of 16, ffn 128, trained on a word-by-word task (the quickstart's
English sentences, each word replaced by a fixed invented word at the same position), so that a
model that ignores the source can only learn the target's language model.

What is asserted is the measured behaviour, judged by how much the model uses its source: the
validation nll (teacher forcing, nats) with each sentence's own source against the same targets
with another sentence's source. The defaults learn the task (their nll is far below the
source-blind level, and swapping the sources costs nats); ``--fourier-published`` at this width
collapses the encoder (its output is the same vector at every position), so swapping the sources
changes nothing; with ``--fourier-proj-init-std 0.06`` (three times the published init, the
documented way to run the preset at this width) it learns.
"""
import os
import random

import pytest
import torch

from fairseq_helpers import preprocess_translation_data, train_translation_model

SMALL_MODEL = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--share-decoder-input-output-embed",
]
# the recipe (Adam lr 2e-3, inverse-sqrt warm-up 50, label smoothing 0.1), 28 updates an epoch
RECIPE = [
    "--dropout", "0.1", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0", "--lr", "2e-3",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50", "--criterion", "label_smoothed_cross_entropy",
    "--label-smoothing", "0.1", "--max-tokens", "1024", "--no-epoch-checkpoints", "--cpu",
]
EPOCHS = 6


def write_word_by_word_data(data_dir: str, train: int = 2800, seed: int = 1) -> None:
    """{train,valid,test}.in/.out: the quickstart's English sentences and, word for word, a fixed
    invented word for each English word (a bijection)."""
    from fourierformer_fairseq.quickstart.corpus import _invent_stems, make_splits

    splits = make_splits(train, 60, 60, seed)
    words = sorted({w for pairs in splits.values() for s, _ in pairs for w in s.split()})
    lexicon = _invent_stems(words, random.Random(f"word-by-word-{seed}"), set())
    for name, pairs in splits.items():
        with open(os.path.join(data_dir, f"{name}.in"), "w") as fs, open(os.path.join(data_dir, f"{name}.out"), "w") as ft:
            for s, _ in pairs:
                fs.write(s + "\n")
                ft.write(" ".join(lexicon[w] for w in s.split()) + "\n")


@pytest.fixture(scope="module")
def word_by_word_data(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("word_by_word"))
    write_word_by_word_data(data_dir)
    preprocess_translation_data(data_dir)
    return data_dir


def source_dependence(data_dir: str, checkpoint: str):
    """(nll with the true sources, nll with each target paired with the next sentence's source):
    mean nats per target token over the validation set, teacher forcing, dropout off."""
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data_dir})
    model = models[0].eval()
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    items = [dataset[i] for i in range(len(dataset))]
    swapped = [dict(item, source=items[(i + 1) % len(items)]["source"]) for i, item in enumerate(items)]
    pad = task.target_dictionary.pad()

    def nll(batch_items):
        batch = dataset.collater(batch_items)
        with torch.no_grad():
            logits = model(**batch["net_input"])[0].float()
        lprobs = torch.log_softmax(logits, -1)
        target = batch["target"]
        total = torch.nn.functional.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1), ignore_index=pad,
                                             reduction="sum")
        return (total / target.ne(pad).sum()).item()

    return nll(items), nll(swapped)


def train_small(data_dir, save_dir, arch, extra=()):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    train_translation_model(data_dir, save_dir, arch, [*RECIPE, *extra], max_epoch=EPOCHS, dims=SMALL_MODEL)
    return source_dependence(data_dir, os.path.join(save_dir, "checkpoint_last.pt"))


@pytest.mark.slow
def test_small_translation_model_defaults_and_the_published_preset(word_by_word_data, tmp_path):
    own, swapped = train_small(word_by_word_data, str(tmp_path / "defaults"), "fourierformer_iwslt_de_en")
    # measured (seed 1, 6 epochs): see docs/published-model.md, "At small width"
    assert own < 1.5 and swapped - own > 1.5, ("the defaults do not learn the small model", own, swapped)

    own_p, swapped_p = train_small(word_by_word_data, str(tmp_path / "published"), "fourierformer_iwslt_de_en",
                                   ["--fourier-published"])
    # the documented failure: the encoder collapses and the model ignores its source
    assert own_p > own + 1.0 and abs(swapped_p - own_p) < 0.05, ("the preset's documented failure changed", own_p,
                                                                swapped_p)

    own_w, swapped_w = train_small(word_by_word_data, str(tmp_path / "published_std"), "fourierformer_iwslt_de_en",
                                   ["--fourier-published", "--fourier-proj-init-std", "0.06"])
    assert own_w < 1.5 and swapped_w - own_w > 1.5, ("the preset at 3x its init does not learn", own_w, swapped_w)
