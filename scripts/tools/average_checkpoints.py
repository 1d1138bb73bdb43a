#!/usr/bin/env python3
"""Average the parameters of fairseq checkpoints (as fairseq's scripts/tools/average_checkpoints.py).

    python scripts/tools/average_checkpoints.py --inputs RUN/checkpoints --num-epoch-checkpoints 10 --output avg.pt
    python scripts/tools/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt

With a folder, the last N checkpointN.pt (by epoch) or checkpoint_E_U.pt (by update, with
--num-update-checkpoints) are averaged; fewer than N there is an error (exit status 1). The output keeps the newest input's other state
(cfg, optimizer history) and the averaged "model" weights; floating tensors are averaged
in float64 and cast back, other tensors are taken from the newest input.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys

import torch


def last_checkpoints(folder: str, n: int, by_update: bool) -> list[str]:
    pat = re.compile(r"checkpoint_\d+_(\d+)\.pt$" if by_update else r"checkpoint(\d+)\.pt$")
    found = []
    for name in os.listdir(folder):
        m = pat.fullmatch(name)
        if m:
            found.append((int(m.group(1)), os.path.join(folder, name)))
    found.sort()
    if len(found) < n:  # (an average of fewer than asked would pass for the one asked for)
        kind = "checkpoint_E_U.pt" if by_update else "checkpointN.pt"
        names = ", ".join(os.path.basename(p) for _, p in found) or "none"
        raise SystemExit(f"average_checkpoints: asked for the last {n} {kind} in {folder}, found {len(found)} ({names})")
    return [p for _, p in found[-n:]]


def average(paths: list[str]) -> dict:
    # the same narrow allow-list that lets stock fairseq-generate load these checkpoints
    from fourierformer_fairseq.checkpoint_compat import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    newest = None
    sums: "collections.OrderedDict[str, torch.Tensor]" = collections.OrderedDict()
    for path in paths:
        state = torch.load(path, map_location="cpu")  # weights_only where torch defaults to it
        model = state["model"]
        if not sums:
            for k, v in model.items():
                sums[k] = v.double().clone() if v.is_floating_point() else v.clone()
        else:
            if set(model) != set(sums):
                raise SystemExit(f"average_checkpoints: {path} has other parameters than {paths[0]}")
            for k, v in model.items():
                if v.is_floating_point():
                    sums[k] += v.double()
                else:
                    sums[k] = v.clone()
        newest = state
    avg = collections.OrderedDict()
    for k, v in sums.items():
        ref = newest["model"][k]
        avg[k] = (v / len(paths)).to(ref.dtype) if ref.is_floating_point() else v
    newest["model"] = avg
    return newest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True, help="checkpoint files, or one folder")
    p.add_argument("--output", required=True)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--num-epoch-checkpoints", type=int, help="with a folder: the last N checkpointN.pt")
    g.add_argument("--num-update-checkpoints", type=int, help="with a folder: the last N checkpoint_E_U.pt")
    args = p.parse_args(argv)
    if len(args.inputs) == 1 and os.path.isdir(args.inputs[0]):
        n = args.num_epoch_checkpoints or args.num_update_checkpoints
        if not n:
            p.error("a folder needs --num-epoch-checkpoints or --num-update-checkpoints")
        paths = last_checkpoints(args.inputs[0], n, by_update=args.num_update_checkpoints is not None)
    else:
        paths = args.inputs
    for x in paths:
        if not os.path.isfile(x):
            p.error(f"no checkpoint {x}")
    state = average(paths)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    torch.save(state, args.output)
    print(f"average_checkpoints: averaged {len(paths)} checkpoints ({', '.join(os.path.basename(x) for x in paths)}) -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
