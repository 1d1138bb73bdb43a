"""fairseq's prefetch thread at exit (fourierformer_fairseq/prefetch_exit.py): a process whose
BufferedIterator is still making a batch (a torch op, the GIL released) when the interpreter ends
exits 0 once the plugin is registered, and aborts without the plugin's handler (the failure it
prevents, shown here so that the check cannot pass for another reason)."""
import os
import subprocess
import sys

import pytest

from repo import REPO

# A consumer that spends its time in torch ops that release the GIL (matrix products), a queue of
# one batch; the main thread takes one batch and returns, so the consumer is inside a product
# when the interpreter ends.
_SCRIPT = r"""
import atexit, sys, time, torch
import fairseq  # registers the plugin (it is importable from the checkout)
import fourierformer_fairseq.prefetch_exit as prefetch_exit
from fairseq.data.iterators import BufferedIterator
torch.set_num_threads(1)
if sys.argv[1] == "without":
    atexit.unregister(prefetch_exit.stop_prefetch_threads)
a = torch.randn(600, 600)

class Batches:
    def __len__(self):
        return 1000

    def __iter__(self):
        for i in range(1000):
            for _ in range(40):
                torch.mm(a, a)
            yield i

itr = BufferedIterator(1, Batches())
print("batch", next(itr), flush=True)
time.sleep(0.05)  # the consumer is making the next batches
print("returning", flush=True)
"""


def _run(mode):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, timeout=300,
                          env=env, cwd=REPO)


def test_a_run_that_ends_while_fairseq_prefetches_exits_zero():
    r = _run("with")
    assert "returning" in r.stdout, r.stdout + r.stderr[-3000:]
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]


def test_without_the_handler_that_run_aborts():
    r = _run("without")
    assert "returning" in r.stdout, r.stdout + r.stderr[-3000:]
    if r.returncode == 0:
        pytest.fail("the run without the handler exited 0: the check above shows nothing")
    assert "terminate called without an active exception" in r.stderr, r.stderr[-3000:]
