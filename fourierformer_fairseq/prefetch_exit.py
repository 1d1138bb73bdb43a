"""fairseq's batch prefetch stopped before the interpreter ends, so that a finished run exits 0.

fairseq-train prefetches batches in a daemon thread (``fairseq.data.iterators.BackgroundConsumer``
under ``BufferedIterator``, ``--data-buffer-size`` batches ahead), which is still making the next
batch when training stops. CPython ends a daemon thread that comes back from a call which released
the GIL (a torch op of the batch's collation) while the interpreter finalises with ``pthread_exit``;
its forced unwind through the bindings' GIL-release destructor (``noexcept``) calls
``std::terminate``: the process aborts ("terminate called without an active exception", exit 134)
after the training, its checkpoints and its logs are complete, and a script that reads the exit
status (the recipes' ``train.sh``) takes the run as failed. The record of the one seen:
docs/records/tests.md.

``stop_prefetch_at_exit`` registers, once, an ``atexit`` handler (it runs before the interpreter
finalises, while every thread still runs) that asks each live consumer to stop after the batch it
is making (its length set to what it has made) and empties its queue until it has ended, for at
most ``STOP_SECONDS``; the batches it had made are dropped, as they would be at exit anyway. A
consumer that does not end in that time is left as it was.
"""
from __future__ import annotations

import atexit
import queue
import threading
import time

STOP_SECONDS = 60.0  # the most the handler waits for a consumer (one batch's collation)

_registered = False


def stop_prefetch_threads(timeout: float = STOP_SECONDS) -> int:
    """Stops every live fairseq prefetch thread (see the module's docstring); returns how many
    were still running after ``timeout`` seconds."""
    try:
        from fairseq.data.iterators import BackgroundConsumer
    except ImportError:
        return 0
    consumers = [t for t in threading.enumerate() if isinstance(t, BackgroundConsumer) and t.is_alive()]
    deadline = time.monotonic() + timeout
    for consumer in consumers:
        # its loop breaks once count >= _max_len, after the put of the batch in hand
        consumer._max_len = consumer.count
        while consumer.is_alive() and time.monotonic() < deadline:
            try:
                while True:  # room for the batch in hand and the end sentinel
                    consumer._queue.get_nowait()
            except queue.Empty:
                pass
            consumer.join(0.01)
    return sum(consumer.is_alive() for consumer in consumers)


def stop_prefetch_at_exit() -> None:
    """Registers ``stop_prefetch_threads`` to run at exit (once per process)."""
    global _registered
    if not _registered:
        atexit.register(stop_prefetch_threads)
        _registered = True
