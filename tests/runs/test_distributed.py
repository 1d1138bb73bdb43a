"""Data-parallel training with stock ``fairseq-train``, in real processes: two CPU ranks (gloo on the
loopback, ``--ddp-backend legacy_ddp``, one thread each) against one process with ``--update-freq 2``.

fairseq gives rank r the batches r, r + 2, ... of one shuffle, which ``--update-freq 2`` groups in
pairs, and legacy_ddp's division by the world size and the trainer's normalisation are by powers
of two; so with every dropout at 0 the two agree bit for bit (the test-only plugin
``tests/runs/distributed_plugin``, which records every rank's state, Performer features, batches and
logged scalars after each update, has the single process normalise a 0-dim gradient in float64 as
fairseq does with several ranks: its docstring says why). For every attention kind and preset,
translation and language model, the tests check: every parameter and buffer identical on both
ranks and in the single process; the same batches; the Performer's features identical after each
of its redraws; a rank that runs out of data (fairseq's dummy batch: each epoch here has an odd
number of batches) handled; the attention diagnostics logged on each rank reduced over both (the
single process's values, to the rounding of fairseq's weighted means: relative 1e-12, where
float64 sums of a few hundred terms differ by about 1e-16 relative); the loss falling. Then
dropout (the ranks still agree) and resuming with the other world size at an epoch's end. What
was measured: docs/distributed.md.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repo import REPO
from fairseq_helpers import (
    LM_DIMS,
    TRANSLATION_DIMS,
    create_dummy_data,
    create_markov_lm_data,
    preprocess_lm_data,
    preprocess_translation_data,
)

ROOT = Path(REPO)
PLUGIN = Path(__file__).resolve().parent / "distributed_plugin"
# 5 batches an epoch, 3 updates (the second rank's third is fairseq's dummy batch): 120 translation
# pairs in batches of 24; the LM's blocks of 32 tokens in batches of ceil(blocks / 5)
BATCHES, MT_PAIRS, LM_LINES, LM_CONTEXT = 5, 120, 100, 32
EPOCHS = 4
DIAGNOSTICS = ("radius_", "entropy_", "nullkey_")
DIAGNOSTIC_RTOL = 1e-12
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]

# case: (task, arch, options); the Fourier cases log their diagnostics at every update
CASES = {
    "mt-fourier": ("mt", "fourierformer_iwslt_de_en", ["--fourier-log-interval", "1"]),
    "mt-fourier-published": ("mt", "fourierformer_iwslt_de_en", ["--fourier-published", "--fourier-log-interval", "1"]),
    "mt-gaussian": ("mt", "fourierformer_iwslt_de_en", ["--fourier-kernel", "gaussian", "--fourier-log-interval", "1"]),
    "mt-performer": ("mt", "performer_iwslt_de_en", ["--performer-redraw-interval", "4"]),
    "mt-performer-fourier-rf": ("mt", "performer_iwslt_de_en",
                                ["--performer-kernel", "fourier_rf", "--performer-redraw-interval", "4"]),
    "mt-gfnet": ("mt", "gfnet_iwslt_de_en", []),
    "lm-fourier": ("lm", "fourierformer_lm_wiki103_small", ["--fourier-log-interval", "1"]),
    "lm-fourier-published": ("lm", "fourierformer_lm_wiki103_small",
                             ["--fourier-published", "--fourier-log-interval", "1"]),
    "lm-gaussian": ("lm", "fourierformer_lm_wiki103_small", ["--fourier-kernel", "gaussian", "--fourier-log-interval", "1"]),
    "lm-performer": ("lm", "performer_lm_wiki103_small", ["--performer-redraw-interval", "4"]),
    "lm-performer-fourier-rf": ("lm", "performer_lm_wiki103_small",
                                ["--performer-kernel", "fourier_rf", "--performer-redraw-interval", "4"]),
    "lm-gfnet": ("lm", "gfnet_lm_wiki103_small", []),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """{"mt": translation data, "lm": language-model data, "lm_batch": the LM's batch size}, BATCHES batches an
    epoch each."""
    root = tmp_path_factory.mktemp("distributed-data")
    mt, lm = root / "mt", root / "lm"
    mt.mkdir()
    lm.mkdir()
    create_dummy_data(str(mt), num_examples=MT_PAIRS, maxlen=10, seed=3)
    preprocess_translation_data(str(mt))
    create_markov_lm_data(str(lm), num_lines=LM_LINES, seed=3)
    preprocess_lm_data(str(lm))
    tokens = sum(len(line.split()) + 1 for line in (lm / "train.out").read_text().splitlines())  # words and eos
    blocks = -(-tokens // LM_CONTEXT)
    lm_batch = -(-blocks // BATCHES)
    assert -(-blocks // lm_batch) == BATCHES, (tokens, blocks, lm_batch)
    return {"mt": mt, "lm": lm, "lm_batch": lm_batch}


def task_options(task: str, data) -> list[str]:
    if task == "mt":
        return [str(data["mt"]), "--task", "translation", "--source-lang", "in", "--target-lang", "out",
                "--batch-size", str(MT_PAIRS // BATCHES), "--required-batch-size-multiple", "1", *TRANSLATION_DIMS]
    assert "--tokens-per-sample" in LM_DIMS and str(LM_CONTEXT) in LM_DIMS
    return [str(data["lm"]), "--task", "language_modeling", "--sample-break-mode", "none",
            "--batch-size", str(data["lm_batch"]), "--required-batch-size-multiple", "1", *LM_DIMS]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fairseq_train_exe() -> list[str]:
    exe = Path(sys.executable).parent / "fairseq-train"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "fairseq_cli.train"]


class Run:
    """Stock fairseq-train with the recording plugin, started: ``ranks`` processes of one run (gloo on
    the loopback) or, with ranks=1, one process with --update-freq 2. ``records()`` waits for them and
    returns each rank's record (tests/runs/distributed_plugin)."""

    def __init__(self, data, task: str, arch: str, options, out: Path, ranks: int,
                 save_dir: Path | None = None, epochs: int = EPOCHS, device: str = "cpu"):
        out.mkdir(parents=True, exist_ok=True)
        save = ["--save-dir", str(save_dir)] if save_dir else ["--no-save", "--save-dir", str(out / "unused")]
        argv = [*fairseq_train_exe(), *task_options(task, data), "--user-dir", str(PLUGIN), "--arch", arch,
                "--optimizer", "adam", "--lr", "0.005", "--max-epoch", str(epochs), "--seed", "1",
                *(["--cpu"] if device == "cpu" else []),
                "--num-workers", "0", "--no-progress-bar", "--log-format", "simple", "--log-interval", "1",
                *NO_DROPOUT, *save, *options]
        if ranks == 1:
            self.commands = [argv + ["--update-freq", "2"]]
        else:
            port = free_port()
            if device == "cpu":
                backend = ["--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"]
                devices = [[] for _ in range(ranks)]
            else:  # fairseq's GPU default, c10d without --find-unused-parameters; NCCL needs a GPU a rank
                nccl = torch.cuda.device_count() >= ranks
                backend = ["--distributed-backend", "nccl" if nccl else "gloo", "--ddp-backend", "pytorch_ddp"]
                devices = [["--device-id", str(r if nccl else 0)] for r in range(ranks)]
            self.commands = [argv + ["--distributed-world-size", str(ranks), "--distributed-rank", str(r), *backend,
                                     *devices[r], "--distributed-init-method", f"tcp://127.0.0.1:{port}",
                                     "--distributed-no-spawn"]
                             for r in range(ranks)]
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                   FF_DIST_RECORD=str(out))
        self.out, self.ranks = out, ranks
        self.logs = [out / f"process{i}.log" for i in range(len(self.commands))]
        self.procs = []
        for command, log in zip(self.commands, self.logs):
            with open(log, "w") as fh:
                self.procs.append(subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=out))

    def records(self, timeout: int = 900) -> list[dict]:
        try:
            codes = [p.wait(timeout=timeout) for p in self.procs]
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
        if any(codes):
            text = "\n".join(f"--- process {i} (exit {c}):\n" + log.read_text()[-3000:]
                             for i, (c, log) in enumerate(zip(codes, self.logs)))
            pytest.fail(f"fairseq-train failed: {' '.join(self.commands[0])}\n{text}")
        return [torch.load(self.out / f"rank{r}.pt", weights_only=False) for r in range(self.ranks)]


def train(*args, **kwargs) -> list[dict]:
    return Run(*args, **kwargs).records()


_RUNS: dict = {}


def runs(case: str, data, tmp_path_factory) -> tuple[list[dict], dict]:
    """(the two ranks' records, the single process's record) of a case, trained once per session."""
    if case not in _RUNS:
        task, arch, options = CASES[case]
        out = tmp_path_factory.mktemp(case)
        two = Run(data, task, arch, options, out / "two", ranks=2)
        one = Run(data, task, arch, options, out / "one", ranks=1)  # beside them: the ranks wait on each other
        _RUNS[case] = (two.records(), one.records()[0])
    return _RUNS[case]


def differing(a: dict, b: dict) -> list[str]:
    """The state_dict entries that are not identical (bit for bit) between a and b."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return [k for k in a if not torch.equal(a[k], b[k])]


def diagnostics(update: dict) -> dict:
    return {k: v for k, v in update["meters"].items() if k.startswith(DIAGNOSTICS)}


def mean(meter) -> float:
    total, count = meter
    return total / count


# One two-rank run per path of the plugin's own distributed code: the Fourier diagnostics' all-reduce
# (with the published preset, whose null key's share is one of them), the Performer's redraws, and
# the global filter, which has none and covers fairseq's dummy batch; with dropout and one resume
# below. The other cases re-test fairseq's data parallelism: a release runs them (-m release;
# docs/testing.md).
PER_PLUGIN_PATH = ("lm-fourier-published", "mt-performer", "lm-gfnet")


def case_params():
    return [pytest.param(case, marks=() if case in PER_PLUGIN_PATH else pytest.mark.release) for case in sorted(CASES)]


@pytest.mark.parametrize("case", case_params())
def test_two_ranks_hold_one_model_and_equal_one_process(case, data, tmp_path_factory):
    (rank0, rank1), single = runs(case, data, tmp_path_factory)
    updates = EPOCHS * 3
    assert [len(r["updates"]) for r in (rank0, rank1, single)] == [updates] * 3
    # the second rank ran out of data at each epoch's last update (5 batches) and ran the dummy batch
    dummy = [u["dummy"] == [True] for u in rank1["updates"]]
    assert dummy == [i % 3 == 2 for i in range(updates)]
    assert not any(any(u["dummy"]) for u in rank0["updates"] + single["updates"])
    assert [len(u["dummy"]) for u in single["updates"]] == [2, 2, 1] * EPOCHS
    # rank r trains batches r, r + 2, ... of the shuffle that --update-freq 2 groups in pairs
    assert batches([rank0, rank1]) == batches(single)

    assert not differing(rank0["state"], rank1["state"]), "the ranks' models differ"
    assert not differing(rank0["state"], single["state"]), "two ranks and one process with --update-freq 2 differ"

    features = [[u["features"] for u in r["updates"]] for r in (rank0, rank1, single)]
    if "performer" in case:
        draws = [{name: f[0] for name, f in step.items()} for step in features[0]]
        assert len({tuple(d.values()) for d in draws}) >= 3, f"fewer than two redraws: {draws}"
        for step, (f0, f1, f2) in enumerate(zip(*features), start=1):
            for name in f0:
                assert f0[name][0] == f1[name][0] == f2[name][0], (step, name)
                assert torch.equal(f0[name][1], f1[name][1]), f"features of {name} differ between ranks after update {step}"
                assert torch.equal(f0[name][1], f2[name][1]), f"features of {name} differ from one process's after update {step}"
    else:
        assert features[0][0] == {}

    if "--fourier-log-interval" in CASES[case][2]:
        expected = {"radius_", "entropy_"} | ({"nullkey_"} if "--fourier-published" in CASES[case][2] else set())
        for step, (u0, u1, u) in enumerate(zip(rank0["updates"], rank1["updates"], single["updates"]), start=1):
            d0, d1, d = diagnostics(u0), diagnostics(u1), diagnostics(u)
            assert {k.split("_")[0] + "_" for k in d0} == expected, (step, sorted(d0))
            assert d0 == d1, f"update {step}: the ranks logged different diagnostics"
            if dummy[step - 1]:
                continue  # the dummy batch's rows count on the second rank (the one process has no such pass)
            assert d0.keys() == d.keys(), step
            for k in d:
                assert mean(d0[k]) == pytest.approx(mean(d[k]), rel=DIAGNOSTIC_RTOL), (step, k, d0[k], d[k])
                if not k.startswith("radius_"):
                    assert d0[k][1] == d[k][1], (step, k)  # the rows counted: both batches' first sequences

    losses = [mean(u["meters"]["loss"]) for u in rank0["updates"]]
    assert losses == [mean(u["meters"]["loss"]) for u in rank1["updates"]]
    assert sum(losses[-3:]) / 3 < losses[0] - 0.2, losses


def test_with_dropout_the_ranks_still_agree(data, tmp_path):
    """With dropout the single process cannot agree: fairseq seeds each update with seed + updates,
    so every rank draws its masks from the same stream's start, while one process's second pass
    continues it. The ranks still hold one model, bit for bit."""
    dropout = ["--fourier-log-interval", "1", "--dropout", "0.2", "--attention-dropout", "0.2"]
    two = Run(data, "mt", "fourierformer_iwslt_de_en", dropout, tmp_path / "two", ranks=2)
    one = Run(data, "mt", "fourierformer_iwslt_de_en", dropout, tmp_path / "one", ranks=1)
    (rank0, rank1), (single,) = two.records(), one.records()
    assert not differing(rank0["state"], rank1["state"])
    assert differing(rank0["state"], single["state"]), "dropout was not applied"
    for u0, u1 in zip(rank0["updates"], rank1["updates"]):
        assert diagnostics(u0) == diagnostics(u1) and u0["meters"]["loss"] == u1["meters"]["loss"]


@pytest.fixture(scope="module")
def resumed_reference(data, tmp_path_factory) -> dict:
    """One process with --update-freq 2 for half the epochs, continued from checkpoint_last.pt by one such
    process. (Not the uninterrupted run: fairseq makes an epoch iterator's batches, by length, from a
    permutation seeded with seed + the epoch it is made at; a resumed run makes them at its first
    epoch, an uninterrupted one at epoch 1.)"""
    case = "mt-performer"
    task, arch, options = CASES[case]
    out = tmp_path_factory.mktemp("resumed-reference")
    train(data, task, arch, options, out / "first", ranks=1, save_dir=out / "checkpoints", epochs=EPOCHS // 2)
    return train(data, task, arch, options, out / "second", ranks=1, save_dir=out / "checkpoints")[0]


def batches(record_or_records) -> list[list[list[int]]]:
    """Per update, the sentences of each pass of every rank, in rank order (a dummy batch: none)."""
    records = record_or_records if isinstance(record_or_records, list) else [record_or_records]
    out = []
    for updates in zip(*(r["updates"] for r in records)):
        out.append([ids for u in updates for ids, dummy in zip(u["ids"], u["dummy"]) if not dummy])
    return out


@pytest.mark.parametrize("first, then", [pytest.param(2, 1, id="two-ranks-then-one"),
                                         pytest.param(1, 2, id="one-then-two-ranks", marks=pytest.mark.release)])
def test_resume_with_the_other_world_size_at_an_epoch_end(first, then, data, tmp_path, resumed_reference):
    """Half the epochs with one world size, checkpoint_last.pt continued with the other (two ranks, or one
    process with --update-freq 2): the same batches and, bit for bit, the model of a run resumed without
    changing the world size."""
    task, arch, options = CASES["mt-performer"]  # a buffer (the features) and a redraw on each side
    half = EPOCHS // 2
    train(data, task, arch, options, tmp_path / "first", ranks=first, save_dir=tmp_path / "checkpoints", epochs=half)
    second = train(data, task, arch, options, tmp_path / "second", ranks=then, save_dir=tmp_path / "checkpoints")
    assert [u["num_updates"] for u in second[0]["updates"]] == list(range(half * 3 + 1, EPOCHS * 3 + 1))
    assert batches(second) == batches(resumed_reference)
    for record in second:
        assert not differing(record["state"], resumed_reference["state"])


GPU_CASES = ("mt-fourier", "mt-performer", "mt-gfnet")  # a kind each, within a minute (the GPU check's row)


@pytest.mark.cuda
@pytest.mark.parametrize("case", GPU_CASES)
def test_two_ranks_on_the_gpu_hold_one_model(case, data, tmp_path):
    """On a GPU, under fairseq's GPU default (--ddp-backend pytorch_ddp: c10d, no --find-unused-parameters):
    NCCL where there are two GPUs (one a rank), else gloo with both ranks on the one. Every parameter and
    buffer is identical on both ranks, the Performer's features after each redraw, the diagnostics. (Not
    against one process: the CUDA kernels' atomics and cuBLAS add in no fixed order.)"""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    task, arch, options = CASES[case]
    rank0, rank1 = train(data, task, arch, options, tmp_path / "two", ranks=2, device="cuda")
    assert len(rank0["updates"]) == len(rank1["updates"]) == EPOCHS * 3
    assert [u["dummy"] == [True] for u in rank1["updates"]] == [i % 3 == 2 for i in range(EPOCHS * 3)]
    assert not differing(rank0["state"], rank1["state"]), "the ranks' models differ"
    for step, (u0, u1) in enumerate(zip(rank0["updates"], rank1["updates"]), start=1):
        for name, (draw, projection) in u0["features"].items():
            assert u1["features"][name][0] == draw and torch.equal(u1["features"][name][1], projection), (step, name)
        assert diagnostics(u0) == diagnostics(u1), f"update {step}: the ranks logged different diagnostics"
    losses = [mean(u["meters"]["loss"]) for u in rank0["updates"]]
    assert sum(losses[-3:]) / 3 < losses[0] - 0.2, losses
