"""Helpers of the recipes (``examples/``) and of the scripts that read their runs (``scripts/``).

``options_given`` turns the fairseq-train arguments of a run into its ``--fourier-*`` options:
``examples/lib.sh``'s ``write_meta`` records them in the run's meta.json, and
``scripts/make_tables.py`` groups runs by them (and reads them from older runs' arguments).
``fairseq_log_records`` reads the training logs that ``--log-format json`` writes, for the scripts
that summarise or plot runs (``scripts/training_curves.py``, ``scripts/gpu_check.py``,
``examples/full_size/summarize.py``).
"""
from __future__ import annotations

import json
import re

__all__ = ["options_given", "fairseq_log_records"]

# "... | INFO | train_inner | {...}": the progress bar's tag, then the interval's metrics
_LOG_RECORD = re.compile(r"\|\s*(train_inner|train|valid)\s*\|\s*(\{.*\})\s*$")


def fairseq_log_records(lines):
    """The (tag, record) pairs of a fairseq-train ``--log-format json`` log, in order: tag is
    "train_inner" (every --log-interval updates), "train" (an epoch's end) or "valid"; record is
    the JSON object as fairseq writes it (values as strings; a metric that was not logged in the
    interval, such as one of ``--fourier-log-interval``, as None). Other lines are skipped."""
    for line in lines:
        m = _LOG_RECORD.search(line)
        if not m:
            continue
        try:
            yield m.group(1), json.loads(m.group(2))
        except json.JSONDecodeError:
            continue


def options_given(extra_args) -> dict:
    """Every --fourier-* option among fairseq-train arguments, named as its FourierAttentionConfig
    field without the prefix (--fourier-radius-init 1.0 -> {"radius_init": "1.0"}; a flag
    without a value -> 1). No option is listed here: a new one is recorded as it is."""
    out = {}
    for i, a in enumerate(extra_args):
        name, eq, val = str(a).partition("=")
        if not name.startswith("--fourier-"):
            continue
        if not eq:
            nxt = str(extra_args[i + 1]) if i + 1 < len(extra_args) else "--"
            val = 1 if nxt.startswith("--") else nxt
        out[name[len("--fourier-"):].replace("-", "_")] = val
    return out
