"""The mutation check's patches (tests/ops/mutants/*.patch, run by scripts/tools/mutation_test.sh) stay usable.

Each patch plants one bug in the fused CPU kernel's sources; the script builds each mutant and
runs the fast tier, which must fail. Here, without building: every patch still applies to the
current sources and changes only csrc/cpu/, so a change to the kernels that makes a mutant
stale shows up in the fast tier instead of in the next mutation run. (The script leaves this
file out: in a mutated copy the applied patch no longer applies.)
"""
import glob
import os
import shutil
import subprocess

import pytest

from repo import REPO  # noqa: E402

PATCHES = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mutants", "*.patch")))


def _git(*args):
    # the ceiling: git finds this checkout's repository or none (then `git apply` works on the
    # files under REPO alone), never one of a folder above it
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=os.path.dirname(REPO))
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, env=env)


def test_there_are_mutants():
    assert PATCHES, "no patches in tests/ops/mutants"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize("patch", PATCHES, ids=[os.path.basename(p)[:-len(".patch")] for p in PATCHES])
def test_mutant_applies_to_the_cpu_kernel_only(patch):
    stat = _git("apply", "--numstat", patch)
    assert stat.returncode == 0, stat.stderr
    files = [line.split("\t")[2] for line in stat.stdout.splitlines()]
    assert files and all(f.startswith("csrc/cpu/") for f in files), files
    check = _git("apply", "--check", patch)
    assert check.returncode == 0, f"{os.path.basename(patch)} no longer applies: {check.stderr}"
