"""Metrics logged on some training updates only (``--fourier-log-interval``), left off the lines of the others.

fairseq prints its meters every ``--log-interval`` updates and then resets them, but keeps them: a
metric that nothing logged since shows on the next line (and in the epoch's summary) as ``None``.
``forget_unlogged`` removes such meters (nothing logged since their reset) from the active
aggregators; called before each training pass, it leaves on a line only the metrics logged in its
interval. fairseq is not changed: the meters are removed as its ``MetersDict`` holds them (the dict
entry and its priority).
"""
from __future__ import annotations

from typing import Tuple


def forget_unlogged(prefixes: Tuple[str, ...]) -> None:
    """Removes, from fairseq's active aggregators, the average meters named with one of ``prefixes``
    that hold nothing (logged nothing since their last reset)."""
    from fairseq.logging import metrics
    from fairseq.logging.meters import AverageMeter

    for meters in metrics.get_active_aggregators():
        empty = [key for key, meter in meters.items()
                 if key.startswith(prefixes) and isinstance(meter, AverageMeter) and meter.count == 0]
        for key in empty:
            del meters[key]
        if empty:
            meters.priorities = [entry for entry in meters.priorities if entry[2] not in empty]
