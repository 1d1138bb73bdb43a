"""Mean attention entropy of saved checkpoints, softmax and Fourier alike, on validation sentences.

For each checkpoint (e.g. the ``checkpoint_<epoch>_<update>.pt`` files that
``--save-interval-updates`` leaves), runs the model on the first ``--sentences`` validation
examples one at a time (no padding), with teacher forcing, and averages the entropy (nats) of
every attention row, per site: ``enc`` (encoder self-attention), ``dec`` (decoder
self-attention), ``cross`` (encoder-decoder attention). Writes JSON for
``scripts/training_curves.py --entropy``.

    python scripts/attention_entropy.py --data data-bin/multi30k --checkpoints runs/softmax/ckpt \\
        --out softmax_entropy.json [--user-dir fourierformer_fairseq]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re

import torch


def site_of(name: str) -> str:
    if name.startswith("encoder"):
        return "enc"
    return "cross" if name.endswith("encoder_attn") else "dec"


def entropies(model, samples):
    from fairseq.modules.multihead_attention import MultiheadAttention

    sums, counts = {}, {}
    originals = {}

    def wrap(name, module):
        forward = module.forward

        def capturing(*args, **kwargs):
            kwargs["need_weights"] = True
            kwargs["need_head_weights"] = True
            attn, weights = forward(*args, **kwargs)
            P = weights.double()  # (heads, batch, tgt, src)
            H = -(P * torch.where(P > 0, P.log(), torch.zeros_like(P))).sum(-1)
            site = site_of(name)
            sums[site] = sums.get(site, 0.0) + H.sum().item()
            counts[site] = counts.get(site, 0) + H.numel()
            return attn, None

        originals[name] = forward
        module.forward = capturing

    for name, module in model.named_modules():
        if isinstance(module, MultiheadAttention):
            wrap(name, module)
    try:
        with torch.no_grad():
            for sample in samples:
                model(**sample["net_input"])
    finally:
        for name, module in model.named_modules():
            if name in originals:
                module.forward = originals[name]
    return {site: sums[site] / counts[site] for site in sorted(sums)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--checkpoints", required=True, help="folder of checkpoint_*_*.pt files (or one .pt file)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--user-dir", default=os.path.join(os.path.dirname(__file__), "..", "fourierformer_fairseq"))
    args = ap.parse_args(argv)

    from fairseq import checkpoint_utils, utils

    utils.import_user_module(argparse.Namespace(user_dir=os.path.abspath(args.user_dir)))
    if os.path.isfile(args.checkpoints):
        paths = [args.checkpoints]
    else:
        paths = glob.glob(os.path.join(args.checkpoints, "checkpoint_*_*.pt"))
    paths.sort(key=lambda p: int(re.findall(r"_(\d+)\.pt$", p)[0]) if re.findall(r"_(\d+)\.pt$", p) else 0)
    points = []
    samples = None
    for path in paths:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": args.data})
        model = models[0].eval()
        if samples is None:
            task.load_dataset("valid")
            dataset = task.dataset("valid")
            samples = [dataset.collater([dataset[i]]) for i in range(min(args.sentences, len(dataset)))]
        state = torch.load(path, map_location="cpu", weights_only=False)
        num_updates = int(state["optimizer_history"][-1]["num_updates"])
        point = {"checkpoint": path, "num_updates": num_updates, "entropy": entropies(model, samples)}
        print(json.dumps(point), flush=True)
        points.append(point)
    with open(args.out, "w") as fh:
        json.dump({"data": args.data, "sentences": args.sentences, "points": points}, fh, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
