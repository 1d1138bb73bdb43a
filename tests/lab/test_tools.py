"""The tools of scripts/tools/: average_checkpoints. (gpu_check and offline_bundle:
tests/lab/test_gpu_check.py; install.sh's pin: tests/house/test_one_home.py.)"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from repo import load, script


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# --------------------------------------------------------------------------- average_checkpoints
def test_average_checkpoints(tmp_path):
    ac = load("scripts/tools/average_checkpoints.py")
    ck = tmp_path / "ck"
    ck.mkdir()
    for e in range(1, 5):
        torch.save({"model": {"w": torch.full((2, 2), float(e)), "n": torch.tensor([e])}, "cfg": {"epoch": e}},
                   ck / f"checkpoint{e}.pt")
    torch.save({"model": {"w": torch.zeros(2, 2), "n": torch.tensor([0])}}, ck / "checkpoint_best.pt")
    out = tmp_path / "avg.pt"
    assert ac.main(["--inputs", str(ck), "--num-epoch-checkpoints", "3", "--output", str(out)]) == 0
    st = torch.load(out, weights_only=False)
    assert torch.allclose(st["model"]["w"], torch.full((2, 2), 3.0))  # mean of epochs 2, 3, 4
    assert st["model"]["n"].item() == 4 and st["cfg"]["epoch"] == 4
    assert st["model"]["w"].dtype == torch.float32


@pytest.mark.parametrize("flag,asked", [("--num-epoch-checkpoints", "5"), ("--num-update-checkpoints", "1")])
def test_average_checkpoints_refuses_fewer_checkpoints_than_asked(tmp_path, flag, asked):
    """Four epoch checkpoints and none by update: asking for more than there are exits non-zero, naming
    what it found, and writes nothing."""
    ck = tmp_path / "ck"
    ck.mkdir()
    for e in range(1, 5):
        torch.save({"model": {"w": torch.full((2,), float(e))}}, ck / f"checkpoint{e}.pt")
    out = tmp_path / "avg.pt"
    r = run([sys.executable, script("scripts/tools/average_checkpoints.py"), "--inputs", str(ck), flag, asked, "--output", str(out)])
    assert r.returncode == 1 and not out.exists(), r.stderr
    found = "4 (checkpoint1.pt, checkpoint2.pt, checkpoint3.pt, checkpoint4.pt)" if "epoch" in flag else "0 (none)"
    assert f"asked for the last {asked} " in r.stderr and f"found {found}" in r.stderr, r.stderr
