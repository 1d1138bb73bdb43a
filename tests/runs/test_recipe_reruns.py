"""The recipes run again and by hand: a re-run keeps the log and does not retrain a trained run, the
console shows training progress, a printed command is for the machine it says, evaluation of a run
without epoch checkpoints says what to do.

The checks of printed commands and of refused evaluations run no fairseq tool; the re-run of a
training recipe is slow (three short fairseq-train runs on conftest's lm_data).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
import torch

from repo import REPO  # noqa: E402

EXAMPLES = os.path.join(REPO, "examples")


def recipe(name: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    return subprocess.run(["bash", os.path.join(EXAMPLES, name), *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


# --------------------------------------------------------------------------- printed commands

PRINTING = [
    ("wikitext103/train.sh", [], "fairseq-train"),
    ("iwslt14/train.sh", [], "fairseq-train"),
    ("iwslt14/evaluate.sh", ["RUN"], "fairseq-generate"),
    ("wikitext103/evaluate.sh", ["--context", "64", "RUN"], "fairseq-eval-lm"),
]


@pytest.mark.parametrize("name,args,tool", PRINTING)
def test_a_printed_command_is_for_a_gpu_machine_unless_cpu_is_asked(name, args, tool, tmp_path):
    """--print-command prints the command for a GPU machine whatever this one has (without --cpu
    fairseq takes the GPU), with --cpu the command for a CPU, and says on stderr which it printed."""
    for cpu in ([], ["--cpu"]):
        r = recipe(name, "--print-command", *cpu, *args, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        commands = [shlex.split(line) for line in r.stdout.strip().splitlines()]
        assert commands and all(c[0] == tool for c in commands), r.stdout
        assert all(("--cpu" in c) == bool(cpu) for c in commands), (cpu, r.stdout)
        assert ("commands for a CPU (--cpu)" if cpu else "commands for a GPU machine") in r.stderr, r.stderr


# --------------------------------------------------------------------------- evaluating a --max-update run


def test_evaluate_without_epoch_checkpoints_suggests_avg_0_and_small_keeps_an_explicit_avg(tmp_path):
    """A run that kept no epoch checkpoints (a --max-update run): averaging fails with the way out;
    --small does not override --avg 0."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "dict.en.txt").write_text("a 1\n")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"model": {"w": torch.zeros(1)}}, run / "checkpoints" / "checkpoint_best.pt")
    r = recipe("iwslt14/evaluate.sh", "--data", str(data), "--small", str(run))
    assert r.returncode != 0 and "pass --avg 0" in r.stderr, r.stderr
    assert "asked for the last 2 checkpointN.pt" in r.stderr, r.stderr  # average_checkpoints' own reason
    assert not (run / "checkpoints" / "checkpoint_avg2.pt").exists()
    r = recipe("iwslt14/evaluate.sh", "--print-command", "--small", "--avg", "0", str(run))
    assert r.returncode == 0, r.stderr
    assert f"--path {run}/checkpoints/checkpoint_best.pt " in r.stdout, r.stdout


# --------------------------------------------------------------------------- re-running a training recipe


def log_starts(log) -> list:
    with open(log, encoding="utf-8") as fh:
        return [line for line in fh if line.startswith("==== ")]


def updates_of(checkpoint) -> int:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["optimizer_history"][-1]["num_updates"]


def test_a_rerun_keeps_the_log_skips_a_trained_run_and_resumes_a_longer_one(lm_data, tmp_path):
    """The WikiText recipe (small mode) three times in one run folder: 6 updates with the progress on
    the console; the same again, which is skipped (the checkpoint and the log untouched); then 10
    updates, which resume from the 6 and append to the log, whose first part stays."""
    base = ["--small", "--seeds", "1", "--data", lm_data, "--runs", str(tmp_path / "runs"), "--name", "lm"]
    run = tmp_path / "runs" / "lm_seed1"
    log, last = run / "train.log", run / "checkpoints" / "checkpoint_last.pt"

    def train(max_update: int) -> subprocess.CompletedProcess:
        return recipe("wikitext103/train.sh", *base, "--", "--max-update", str(max_update), "--warmup-updates", "2",
                      "--log-interval", "2")

    first = train(6)
    assert first.returncode == 0, first.stderr[-3000:]
    progress = [line for line in first.stderr.splitlines() if "| train_inner |" in line]
    assert len(progress) == 3 and "num_updates=2," in progress[0].replace(" ", ""), first.stderr[-3000:]
    assert updates_of(last) == 6 and len(log_starts(log)) == 1
    first_log = log.read_text(encoding="utf-8")
    assert "--max-update 6" in log_starts(log)[0]

    stamp = os.stat(last).st_mtime_ns
    again = train(6)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "is trained (6 updates done, --max-update 6): skipped" in again.stderr, again.stderr[-3000:]
    assert os.stat(last).st_mtime_ns == stamp and updates_of(last) == 6
    assert log.read_text(encoding="utf-8") == first_log

    longer = train(10)
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert updates_of(last) == 10
    text = log.read_text(encoding="utf-8")
    assert text.startswith(first_log) and len(log_starts(log)) == 2, text[-3000:]
    assert "--max-update 10" in log_starts(log)[1] and "(epoch 1 @ 6 updates)" in text[len(first_log):]
