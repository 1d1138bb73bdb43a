#!/usr/bin/env python
"""Adam's step per weight, from the optimizer state a fairseq checkpoint keeps.

For every parameter tensor: mean over its entries of |m| / sqrt(v) (Adam's first and second
moments, ``exp_avg`` and ``exp_avg_sq``), the size of the step each entry takes in units of the
learning rate (bias correction aside). A weight whose gradients spiked has a large v and a small
ratio: the optimizer has all but stopped moving it. Prints the radii's ratios and the median over
the other weights, one line per checkpoint (``--json`` for every tensor).

fairseq stores the state indexed by the order of ``model.parameters()``, which skips buffers and
lists a shared (tied) weight once; the checkpoint's model state dict has the buffers and every
name of a tied weight. The two are aligned by walking the state dict in order, skipping the
non-parameters named below and every tensor that shares storage with one already seen, and
checking each shape against the moment's.

    python scripts/analysis/dynamics/adam_steps.py RUN/ckpt/checkpoint_4_400.pt [more.pt ...] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

# fairseq buffers that are saved with the model but are not parameters.
BUFFER_SUFFIXES = ("version", "_float_tensor")


def parameter_names(model_state: dict, moments: list) -> list:
    """Names of the parameters, in the optimizer state's order (see the module docstring)."""
    names, seen = [], set()
    for name, t in model_state.items():
        if name.endswith(BUFFER_SUFFIXES) or not torch.is_tensor(t) or not t.is_floating_point():
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen and t.numel() > 0:
            continue
        seen.add(ptr)
        names.append(name)
    if len(names) != len(moments):
        raise ValueError(f"{len(names)} parameters in the model state but {len(moments)} in the optimizer "
                         "state: not a fairseq checkpoint of this layout")
    for name, st in zip(names, moments):
        if tuple(st["exp_avg"].shape) != tuple(model_state[name].shape):
            raise ValueError(f"optimizer state out of line with the model at {name}: "
                             f"{tuple(st['exp_avg'].shape)} vs {tuple(model_state[name].shape)}")
    return names


def adam_steps(checkpoint: dict) -> dict:
    """{parameter name: mean |m| / sqrt(v)} from a loaded fairseq checkpoint."""
    opt = checkpoint.get("last_optimizer_state")
    if not opt or "state" not in opt:
        raise ValueError("the checkpoint has no optimizer state (saved with --no-save-optimizer-state?)")
    state = opt["state"]
    moments = [state[k] for k in sorted(state)]
    if not all("exp_avg" in st and "exp_avg_sq" in st for st in moments):
        raise ValueError("the optimizer state has no exp_avg / exp_avg_sq: not Adam")
    names = parameter_names(checkpoint["model"], moments)
    out = {}
    for name, st in zip(names, moments):
        m, v = st["exp_avg"].double(), st["exp_avg_sq"].double()
        out[name] = (m.abs() / (v.sqrt() + 1e-8)).mean().item()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--json", help="write {checkpoint: {parameter: ratio}} here")
    args = ap.parse_args(argv)
    everything = {}
    for path in args.checkpoints:
        ck = torch.load(path, map_location="cpu", weights_only=False)
        try:
            steps = adam_steps(ck)
        except ValueError as e:
            print(f"{path}: {e}", file=sys.stderr)
            return 2
        everything[path] = steps
        radius = {n: r for n, r in steps.items() if n.endswith("radius")}
        other = [r for n, r in steps.items() if not n.endswith("radius")]
        updates = ck.get("optimizer_history", [{}])[-1].get("num_updates", "?")
        print(f"{path} (update {updates}): median over the {len(other)} other weights "
              f"{statistics.median(other):.3f}; radii " + (" ".join(f"{r:.3f}" for r in radius.values()) or "none"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
