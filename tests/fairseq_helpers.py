"""Test helpers in the style of fairseq's own tests/utils.py: tiny dummy data, one-epoch runs
through the real ``fairseq_cli`` entry points (``train.main``, ``generate.main``, ...)."""
from __future__ import annotations

import contextlib
import copy
import math
import os
import random
from collections import Counter
import subprocess
import sys
from types import SimpleNamespace
from typing import List, Optional, Sequence

import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.models import ARCH_MODEL_REGISTRY

import fourierformer_fairseq

USER_DIR = fourierformer_fairseq.USER_DIR

# shrunk dims for the smoke tests: every arch keeps its own attention and options
TRANSLATION_DIMS = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]
# (fairseq drops a last batch whose size is not a multiple of --required-batch-size-multiple, default 8;
# the tiny valid/test sets here would lose most of their blocks, so the helpers pass 1)
LM_DIMS = [
    "--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
    "--decoder-attention-heads", "2", "--tokens-per-sample", "32",
]


# ----------------------------------------------------------------------------- data


def create_dummy_data(data_dir: str, num_examples: int = 60, maxlen: int = 12, seed: int = 0) -> None:
    """{train,valid,test}.in/.out: random letters; the target is the reversed source (learnable)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrst"
    for split, n in (("train", num_examples), ("valid", num_examples // 4), ("test", num_examples // 4)):
        with open(os.path.join(data_dir, f"{split}.in"), "w") as fin, \
                open(os.path.join(data_dir, f"{split}.out"), "w") as fout:
            for _ in range(n):
                words = [rng.choice(letters) for _ in range(rng.randint(2, maxlen))]
                fin.write(" ".join(words) + "\n")
                fout.write(" ".join(reversed(words)) + "\n")


def create_markov_lm_data(data_dir: str, num_lines: int = 400, seed: int = 0, stay: float = 0.9,
                          lag: int = 1) -> None:
    """{train,valid,test}.out for language models: the letter at t follows a fixed random successor
    table from the letter at t - lag with probability ``stay`` (otherwise a uniform letter),
    3 + lag to 13 + lag letters a line.

    Learnable from context, so a trained model must score far below the unigram perplexity
    (``unigram_perplexity``), which a model that ignores its context cannot beat; with lag 2 the
    previous letter tells nothing about the next one, so a model must mix in the letter two back."""
    rng = random.Random(seed)
    letters = list("abcdefghijklmnopqrst")
    successor = dict(zip(letters, rng.sample(letters, len(letters))))
    for split, n in (("train", num_lines), ("valid", num_lines // 8), ("test", num_lines // 8)):
        with open(os.path.join(data_dir, f"{split}.out"), "w") as f:
            for _ in range(n):
                words = [rng.choice(letters) for _ in range(lag)]
                for _ in range(rng.randint(2 + lag, 12 + lag)):
                    words.append(successor[words[-lag]] if rng.random() < stay else rng.choice(letters))
                f.write(" ".join(words) + "\n")


def unigram_perplexity(train_file: str, eval_file: str) -> float:
    """Perplexity on eval_file's tokens (words and one end-of-sentence per line, as fairseq scores
    them) of the add-one unigram distribution estimated from train_file."""
    def tokens(path):
        with open(path) as f:
            return [t for line in f for t in line.split() + ["</s>"]]

    counts = Counter(tokens(train_file))
    evaluated = tokens(eval_file)
    vocab = set(counts) | set(evaluated)
    total = sum(counts.values()) + len(vocab)
    nll = -sum(math.log((counts[t] + 1) / total) for t in evaluated) / len(evaluated)
    return math.exp(nll)


def preprocess_translation_data(data_dir: str, extra_flags: Sequence[str] = ()) -> None:
    from fairseq_cli import preprocess

    parser = options.get_preprocessing_parser()
    args = parser.parse_args([
        "--source-lang", "in", "--target-lang", "out",
        "--trainpref", os.path.join(data_dir, "train"),
        "--validpref", os.path.join(data_dir, "valid"),
        "--testpref", os.path.join(data_dir, "test"),
        "--thresholdtgt", "0", "--thresholdsrc", "0",
        "--destdir", data_dir, *extra_flags,
    ])
    preprocess.main(args)


def preprocess_lm_data(data_dir: str) -> None:
    from fairseq_cli import preprocess

    parser = options.get_preprocessing_parser()
    args = parser.parse_args([
        "--only-source",
        "--trainpref", os.path.join(data_dir, "train.out"),
        "--validpref", os.path.join(data_dir, "valid.out"),
        "--testpref", os.path.join(data_dir, "test.out"),
        "--destdir", data_dir,
    ])
    preprocess.main(args)


# ----------------------------------------------------------------------------- CLI mains


def _forget_best_checkpoint_score():
    """fairseq keeps the best validation score on a function attribute; forget it between runs in one process."""
    from fairseq import checkpoint_utils

    if hasattr(checkpoint_utils.save_checkpoint, "best"):
        del checkpoint_utils.save_checkpoint.best


def train_translation_model(data_dir: str, save_dir: str, arch: str, extra_flags: Sequence[str] = (),
                            max_epoch: int = 1, dims: Sequence[str] = TRANSLATION_DIMS) -> None:
    from fairseq_cli import train

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "--user-dir", USER_DIR, "--task", "translation", data_dir,
        "--save-dir", save_dir, "--arch", arch, *dims,
        "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "500",
        "--max-epoch", str(max_epoch), "--no-progress-bar", "--num-workers", "0",
        "--source-lang", "in", "--target-lang", "out", "--seed", "1", *extra_flags,
    ])
    _forget_best_checkpoint_score()
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), train.main)


def train_language_model(data_dir: str, save_dir: str, arch: str, extra_flags: Sequence[str] = (),
                         max_epoch: int = 1, dims: Sequence[str] = LM_DIMS) -> None:
    from fairseq_cli import train

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "--user-dir", USER_DIR, "--task", "language_modeling", data_dir,
        "--save-dir", save_dir, "--arch", arch, *dims,
        "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "500",
        "--max-epoch", str(max_epoch), "--no-progress-bar", "--num-workers", "0",
        "--seed", "1", "--required-batch-size-multiple", "1", *extra_flags,
    ])
    _forget_best_checkpoint_score()
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), train.main)


def generate_main(data_dir: str, checkpoint: str, extra_flags: Sequence[str] = ()) -> None:
    """Prints fairseq-generate's output (S-/H-/A- lines and the BLEU line) to stdout."""
    from fairseq_cli import generate

    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, [
        "--user-dir", USER_DIR, data_dir, "--path", checkpoint,
        "--beam", "3", "--batch-size", "8", "--max-len-b", "20", "--gen-subset", "valid",
        # fairseq drops a last batch that is not a multiple of this (default 8): translate every sentence
        "--required-batch-size-multiple", "1",
        "--no-progress-bar", "--num-workers", "0", "--source-lang", "in", "--target-lang", "out", *extra_flags,
    ])
    generate.main(args)


def validate_main(data_dir: str, checkpoint: str, extra_flags: Sequence[str] = ()) -> None:
    from fairseq_cli import validate

    parser = options.get_validation_parser()
    args = options.parse_args_and_arch(parser, [
        "--user-dir", USER_DIR, data_dir, "--path", checkpoint,
        "--task", "translation", "--source-lang", "in", "--target-lang", "out",
        "--valid-subset", "valid", "--max-tokens", "500", "--no-progress-bar", "--num-workers", "0", *extra_flags,
    ])
    validate.main(convert_namespace_to_omegaconf(args))


def eval_lm_main(data_dir: str, checkpoint: str, extra_flags: Sequence[str] = ()) -> dict:
    """fairseq-eval-lm's main; returns its {"loss", "perplexity"}."""
    from fairseq_cli import eval_lm

    parser = options.get_eval_lm_parser()
    args = options.parse_args_and_arch(parser, [
        "--user-dir", USER_DIR, data_dir, "--path", checkpoint,
        "--tokens-per-sample", "32", "--max-tokens", "500", "--no-progress-bar", "--num-workers", "0",
        "--required-batch-size-multiple", "1",
        *extra_flags,
    ])
    return eval_lm.main(convert_namespace_to_omegaconf(args))


@contextlib.contextmanager
def models_as_saved():
    """Records, at each checkpoint fairseq-train writes, a copy of the in-memory model (taken just
    before it is saved) and the training config: a list of (model, cfg), the last one the last saved."""
    from fairseq import checkpoint_utils

    saved = []
    original = checkpoint_utils.save_checkpoint

    def save_checkpoint(cfg, trainer, epoch_itr, val_loss):
        saved.append((copy.deepcopy(trainer.get_model()).cpu().eval(), trainer.cfg))
        return original(cfg, trainer, epoch_itr, val_loss)

    checkpoint_utils.save_checkpoint = save_checkpoint
    try:
        yield saved
    finally:
        checkpoint_utils.save_checkpoint = original


@contextlib.contextmanager
def loading_replaced_by(model, cfg):
    """fairseq-generate / fairseq-eval-lm mains run with ``model`` instead of the checkpoint named by --path."""
    from fairseq import checkpoint_utils

    originals = checkpoint_utils.load_model_ensemble, checkpoint_utils.load_model_ensemble_and_task
    checkpoint_utils.load_model_ensemble = lambda *a, **kw: ([model], cfg)
    checkpoint_utils.load_model_ensemble_and_task = lambda *a, task=None, **kw: ([model], cfg, task)
    try:
        yield
    finally:
        checkpoint_utils.load_model_ensemble, checkpoint_utils.load_model_ensemble_and_task = originals


def hypothesis_scores(generate_stdout: str) -> dict:
    """{sentence id: (score, hypothesis)} from fairseq-generate's H- lines."""
    out = {}
    for line in generate_stdout.splitlines():
        if line.startswith("H-"):
            ident, score, text = (line.split("\t") + [""])[:3]
            out[int(ident[2:])] = (float(score), text)
    return out


def token_bleu(generate_stdout: str) -> dict:
    """fairseq-generate's BLEU4 line recomputed from its H- and T- lines, on whitespace tokens
    as fairseq's default scorer counts them (no end-of-sentence token, a reference's <unk>
    matching nothing): {"bleu", "precisions"
    (four, in %), "bp", "syslen", "reflen", "sentences", "hypotheses"}. Written from the
    definition (clipped n-gram counts, brevity penalty), sharing no code with fairseq."""
    hyps, refs = {}, {}
    for line in generate_stdout.splitlines():
        if line.startswith("H-"):
            ident, _, text = (line.split("\t") + ["", ""])[:3]
            hyps[int(ident[2:])] = text.split()
        elif line.startswith("T-"):
            ident, text = (line.split("\t") + [""])[:2]
            refs[int(ident[2:])] = text.split()
    matches, totals = [0] * 4, [0] * 4
    syslen = reflen = 0
    for ident, ref in refs.items():
        hyp = hyps.get(ident, [])
        syslen, reflen = syslen + len(hyp), reflen + len(ref)
        for n in range(1, 5):
            # (fairseq's scorer never matches a reference's <unk>)
            ref_counts = Counter(g for g in (tuple(ref[i:i + n]) for i in range(len(ref) - n + 1)) if "<unk>" not in g)
            hyp_counts = Counter(tuple(hyp[i:i + n]) for i in range(len(hyp) - n + 1))
            matches[n - 1] += sum(min(c, ref_counts[g]) for g, c in hyp_counts.items())
            totals[n - 1] += max(len(hyp) - n + 1, 0)
    precisions = [100.0 * m / t if t else 0.0 for m, t in zip(matches, totals)]
    bp = 1.0 if syslen > reflen else (math.exp(1 - reflen / syslen) if syslen else 0.0)
    bleu = bp * math.exp(sum(math.log(p / 100) for p in precisions) / 4) * 100 if min(precisions) > 0 else 0.0
    return dict(bleu=bleu, precisions=precisions, bp=bp, syslen=syslen, reflen=reflen, sentences=len(refs),
                hypotheses=len(hyps))


def run_cli(tool: str, args: Sequence[str], stdin: Optional[str] = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """A stock console script (fairseq-generate, ...) in a fresh process; fails the test on a non-zero exit."""
    exe = os.path.join(os.path.dirname(sys.executable), tool)
    cmd = [exe] if os.path.exists(exe) else [tool]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.run(cmd + list(args), input=stdin, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{tool} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


# ----------------------------------------------------------------------------- in-process models


def dummy_dictionary(size: int = 20) -> Dictionary:
    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    return d


def plugin_archs() -> List[str]:
    """Every arch name this plugin registers (on its own models or, for twins, on stock ones), sorted."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    return sorted(name for name, fn in ARCH_CONFIG_REGISTRY.items()
                  if fn.__module__.startswith("fourierformer_fairseq")
                  or ARCH_MODEL_REGISTRY[name].__module__.startswith("fourierformer_fairseq"))


def arch_task(arch: str):
    """(dims, task) for a registered arch: LM_DIMS and language_modeling for a language model,
    TRANSLATION_DIMS and translation otherwise."""
    from fairseq.models import FairseqLanguageModel

    if issubclass(ARCH_MODEL_REGISTRY[arch], FairseqLanguageModel):
        return LM_DIMS, "language_modeling"
    return TRANSLATION_DIMS, "translation"


def parse_arch(arch: str, *extra: str):
    """fairseq-train's options for ``arch`` (on its task, see arch_task) and ``extra``, without data."""
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, ["unused-data-dir", "--task", arch_task(arch)[1], "--arch", arch, *extra])


def build_model(arch: str, extra: Sequence[str] = (), dims: Sequence[str] = TRANSLATION_DIMS, task: str = "translation",
                dictionary: Optional[Dictionary] = None):
    """A model of ``arch`` from command-line style options, on a dummy dictionary (no data)."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["unused-data-dir", "--task", task, "--arch", arch, *dims, *extra])
    d = dictionary or dummy_dictionary()
    fake_task = SimpleNamespace(source_dictionary=d, target_dictionary=d)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, fake_task), args


def random_tokens(d: Dictionary, lengths: List[int], pad_left: bool, generator: torch.Generator) -> torch.Tensor:
    """(B, max(lengths)) token ids ending in eos, padded left or right."""
    T = max(lengths)
    out = torch.full((len(lengths), T), d.pad(), dtype=torch.long)
    for i, n in enumerate(lengths):
        seq = torch.randint(d.nspecial, len(d), (n,), generator=generator)
        seq[-1] = d.eos()
        if pad_left:
            out[i, T - n:] = seq
        else:
            out[i, :n] = seq
    return out


def eval_model(arch: str = "fourierformer_iwslt_de_en", extra: Sequence[str] = (), seed: int = 0):
    """A translation model of ``arch`` (TRANSLATION_DIMS, no dropout, seeded), in eval mode."""
    torch.manual_seed(seed)
    model, _ = build_model(arch, extra=["--dropout", "0.0", *extra])
    return model.eval()


def eval_translation_batch(arch: str, src_lengths: List[int], prev_lengths: List[int], seed: int = 0,
                           extra: Sequence[str] = ()):
    """A translation model of ``arch`` (seeded, eval mode, TRANSLATION_DIMS), its encoder's output on
    random left-padded sources, and random right-padded previous output tokens: (model, encoder_out, prev)."""
    torch.manual_seed(seed)
    model, _ = build_model(arch, extra=extra, dims=TRANSLATION_DIMS)
    model.eval()
    d = model.decoder.dictionary
    g = torch.Generator().manual_seed(seed)
    src = random_tokens(d, src_lengths, pad_left=True, generator=g)
    prev = random_tokens(d, prev_lengths, pad_left=False, generator=g)
    with torch.no_grad():
        encoder_out = model.encoder(src, src.ne(d.pad()).sum(1))
    return model, encoder_out, prev
