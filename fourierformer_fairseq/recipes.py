"""Helpers of the recipes (``examples/``) and of the scripts that read their runs (``scripts/``).

``options_given`` turns the fairseq-train arguments of a run into its ``--fourier-*`` options:
``examples/lib.sh``'s ``write_meta`` records them in the run's meta.json, and
``scripts/make_tables.py`` groups runs by them (and reads them from older runs' arguments).
"""
from __future__ import annotations

__all__ = ["options_given"]


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
