"""scripts/gpu_check.py's parsing and verdicts, on fairseq log lines written here (the GPU
steps themselves run only on a GPU: `bash scripts/gpu_check.sh`)."""
from __future__ import annotations

import argparse
import json
import os

import pytest

from test_scripts import load  # noqa: E402  (scripts/ loaded as modules)


@pytest.fixture(scope="module")
def gc():
    return load("gpu_check")


def fairseq_log(losses, ups, valid, overflows=0):
    """Lines as fairseq-train --log-format json writes them."""
    lines = ["2026-01-01 00:00:00 | INFO | fairseq_cli.train | begin training"]
    for i in range(overflows):
        lines.append("2026-01-01 00:00:01 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring "
                     f"gradient, setting loss scale to: {64 / 2 ** i}")
    for n, (loss, u) in enumerate(zip(losses, ups), start=1):
        rec = {"epoch": 1, "update": n / 100, "loss": f"{loss:.3f}", "ups": f"{u:.2f}", "num_updates": str(10 * n)}
        lines.append(f"2026-01-01 00:00:02 | INFO | train_inner | {json.dumps(rec)}")
    for v in valid:
        rec = {"epoch": 1, "valid_loss": f"{v:.3f}", "valid_num_updates": "100"}
        lines.append(f"2026-01-01 00:00:03 | INFO | valid | {json.dumps(rec)}")
    return lines


def test_parse_training_reads_losses_validations_overflows_and_the_median_rate(gc):
    r = gc.parse_training(fairseq_log([9.0, 8.0, 7.0, 6.0, 5.0, 4.0], [1.0, 10.0, 20.0, 25.0, 50.0, 40.0], [7.5, 7.0], 2))
    assert r["train"] == [(10, 9.0), (20, 8.0), (30, 7.0), (40, 6.0), (50, 5.0), (60, 4.0)]
    assert r["valid"] == [7.5, 7.0] and r["overflows"] == 2
    # the first third (ups 1 and 10) is left out; the median of 1000 / (20, 25, 50, 40) ms
    assert r["ms_per_update"] == pytest.approx(1000 / 25)


def run(losses, valid, overflows=0):
    r = {"train": [(10 * i, l) for i, l in enumerate(losses)], "valid": valid, "overflows": overflows,
         "ms_per_update": 50.0}
    return r


def test_judge_pair_passes_a_fourier_run_that_trains_like_its_twin(gc):
    status, what = gc.judge_pair(run([10, 6], [6.1, 7.0]), run([10, 6.1], [6.0, 6.5]), "fp16")
    assert status == "PASS", what
    assert "1.00x" in what  # ms/update of both reported


@pytest.mark.parametrize("fourier, why", [
    (run([10, 9.5], [6.0]), "dropped"),  # the loss barely falls
    (run([10, 6], [6.6]), "valid"),  # its best validation loss is 10 % above the twin's
    (run([10, 6], [6.0], overflows=3), "overflow"),  # more overflow-skipped updates
])
def test_judge_pair_fails_what_the_check_promises_to_catch(gc, fourier, why):
    status, what = gc.judge_pair(fourier, run([10, 6], [6.0], overflows=1), "fp16")
    assert status == "FAIL" and why in what, what


@pytest.mark.parametrize("precision, flag", [("fp16", "--fp16"), ("amp", "--amp")])
def test_train_command_is_stock_fairseq_train_with_the_precision_flag(gc, precision, flag):
    args = argparse.Namespace(gpu=True, data_bin="/data", updates=200)
    for task, (fourier, twin) in gc.PAIRS.items():
        cmd = gc.train_command(args, task, fourier, precision, "/save")
        assert os.path.basename(cmd[0]).startswith("fairseq-train") or cmd[1:3] == ["-m", "fairseq_cli.train"]
        assert flag in cmd and "--bf16" not in cmd and "--cpu" not in cmd
        assert cmd[cmd.index("--arch") + 1] == fourier and cmd[cmd.index("--max-update") + 1] == "200"
        # only the evaluated (--fp16) runs keep a checkpoint
        assert ("--no-save" in cmd) == (precision != "fp16")


# The verdict's two thresholds, each just inside and just outside (the twin: loss 10 -> 6, best
# valid 6.0): the Fourier run's loss must drop at least LOSS_DROP_FRACTION of the twin's drop
# (0.8 x 4 = 3.2), and its best validation loss stay within VALID_SLACK of the twin's (1.05 x 6.0).
@pytest.mark.parametrize("side", [-1, 1], ids=["inside", "outside"])
def test_judge_pair_loss_drop_threshold_is_exact(gc, side):
    drop = gc.LOSS_DROP_FRACTION * 4.0 * (1 - side * 1e-3)
    status, what = gc.judge_pair(run([10, 10 - drop], [6.0]), run([10, 6], [6.0]), "fp16")
    assert status == ("PASS" if side < 0 else "FAIL"), what
    assert (side > 0) == ("dropped" in what)
    assert gc.LOSS_DROP_FRACTION == pytest.approx(0.8)


@pytest.mark.parametrize("side", [-1, 1], ids=["inside", "outside"])
def test_judge_pair_valid_slack_threshold_is_exact(gc, side):
    valid = gc.VALID_SLACK * 6.0 * (1 + side * 1e-3)
    status, what = gc.judge_pair(run([10, 6], [valid, valid + 1]), run([10, 6], [6.5, 6.0]), "fp16")
    assert status == ("PASS" if side < 0 else "FAIL"), what
    assert (side > 0) == ("valid" in what.split(": ", 1)[-1] if status == "FAIL" else False)
    assert gc.VALID_SLACK == pytest.approx(1.05)
