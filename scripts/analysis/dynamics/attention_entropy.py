"""Mean attention entropy of saved checkpoints, softmax and Fourier alike, on validation sentences.

For each checkpoint (e.g. the ``checkpoint_<epoch>_<update>.pt`` files that
``--save-interval-updates`` leaves), runs the model on the first ``--sentences`` validation
examples one at a time (no padding), with teacher forcing, and averages the entropy (nats) of
every attention row, per site: ``enc`` (encoder self-attention), ``dec`` (decoder
self-attention), ``cross`` (encoder-decoder attention). Also per site: the RMS of the query and
key projections (``q_rms``), and for Fourier layers the fraction of (query, key) pairs with a
feature past sinc's first zero, |R (q_d - k_d)| > pi, on the scored (normalised, if
``qk_norm``) q and k (``past_zero``). Writes JSON for ``scripts/analysis/dynamics/training_curves.py --entropy``.

    python scripts/analysis/dynamics/attention_entropy.py --data data-bin/multi30k --checkpoints runs/softmax/ckpt \\
        --out softmax_entropy.json [--user-dir fourierformer_fairseq]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re

import torch


def entropies(model, samples):
    from fairseq.modules.multihead_attention import MultiheadAttention

    from fourierformer_fairseq.models.attention_options import site_tag
    from fourierformer_fairseq.ops.inputs import expand_radius

    sums, counts = {}, {}

    def add(key, total, n):
        sums[key] = sums.get(key, 0.0) + total
        counts[key] = counts.get(key, 0) + n

    def wrap(name, module):
        forward = module.forward

        def capturing(*args, **kwargs):
            kwargs["need_weights"] = True
            kwargs["need_head_weights"] = True
            query = args[0] if args else kwargs["query"]
            key = args[1] if len(args) > 1 else kwargs.get("key")
            if key is None:
                key = query
            attn, weights = forward(*args, **kwargs)
            P = weights.double()  # (heads, batch, tgt, src)
            H = -(P * torch.where(P > 0, P.log(), torch.zeros_like(P))).sum(-1)
            site = site_tag(name)
            add(site, H.sum().item(), H.numel())
            q, k = module.q_proj(query).double(), module.k_proj(key).double()
            add(f"q_rms/{site}", q.pow(2).mean().sqrt().item() + k.pow(2).mean().sqrt().item(), 2)
            radius = getattr(module, "radius", None)
            if radius is not None:  # the module's own head split and q/k normalisation, the op's (H, D) radius
                qh, kh = module.prepare_queries_keys(module._split_heads(q), module._split_heads(k))
                r = expand_radius(radius.detach().double(), module.num_heads, module.head_dim)
                x = r[None, :, None, None, :] * (qh.unsqueeze(3) - kh.unsqueeze(2))  # (B, H, N, M, D)
                past = (x.abs() > torch.pi).any(-1)
                add(f"past_zero/{site}", past.double().sum().item(), past.numel())
            return attn, None

        return capturing

    forwards = {name: wrap(name, module) for name, module in model.named_modules()
                # (a kind that forms no weights, the global filter, has no entropy)
                if isinstance(module, MultiheadAttention) and getattr(module, "supports_need_weights", True)}
    run_with_forwards(model, samples, forwards)
    return {key: sums[key] / counts[key] for key in sorted(sums)}


def run_with_forwards(model, samples, forwards):
    """Runs the model on each sample without gradients, the modules named in ``forwards`` calling
    ``forwards[name]`` in place of their forward; their own forwards are put back after."""
    originals = {}
    for name, module in model.named_modules():
        if name in forwards:
            originals[name] = module.forward
            module.forward = forwards[name]
    try:
        with torch.no_grad():
            for sample in samples:
                model(**sample["net_input"])
    finally:
        for name, module in model.named_modules():
            if name in originals:
                module.forward = originals[name]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--checkpoints", required=True, help="folder of checkpoint_*_*.pt files (or one .pt file)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--user-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "..", "fourierformer_fairseq"))
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
