#!/usr/bin/env python3
"""Table 6 of the FourierFormer paper: redundancy between attention heads.

For a trained fairseq model (a FourierFormer or its softmax twin; LM or translation) this
runs validation batches through the model, records every head's attention map in every
layer, and for each sequence and layer computes the L2 (Frobenius) distance between the maps
of every pair of heads. Per layer it takes the mean and the variance of those distances over
all pairs and sequences, then averages both over the layers: larger distances = heads that
attend differently = less redundancy. Also draws the attention maps of one sequence (a few
layers x all heads) as a PNG.

    python scripts/analysis/tables/head_redundancy.py --checkpoint runs/wikitext103/fourier_small_seed1/checkpoints/checkpoint_best.pt \
        --data data-bin/wikitext-103 --out runs/head_fourier_small.json --png runs/head_fourier_small.png

Attention sites: LM = decoder self-attention; translation = encoder self-attention by default
(--site encoder|decoder|cross). Only the non-padding part of each map is compared.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def load(checkpoint: str, data: str, user_dir: str):
    from fairseq import checkpoint_utils, utils

    utils.import_user_module(argparse.Namespace(user_dir=user_dir))
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    model = models[0].eval()
    return model, cfg, task


def attention_modules(model, site: str):
    """The (name, module) attention modules of the chosen site, in layer order."""
    from fairseq.modules.multihead_attention import MultiheadAttention

    found = []
    for name, mod in model.named_modules():
        if not isinstance(mod, MultiheadAttention):
            continue
        if site == "encoder" and name.startswith("encoder.") and name.endswith("self_attn"):
            found.append((name, mod))
        elif site == "decoder" and name.startswith("decoder.") and name.endswith("self_attn"):
            found.append((name, mod))
        elif site == "cross" and name.endswith("encoder_attn"):
            found.append((name, mod))
    return found


class Recorder:
    """Makes attention modules return per-head weights and keeps them."""

    def __init__(self, modules):
        self.maps: list = [None] * len(modules)
        self._orig = []
        for i, (_, mod) in enumerate(modules):
            self._orig.append((mod, mod.forward, getattr(mod, "skip_embed_dim_check", None)))
            # fairseq's MultiheadAttention takes torch's fused path, which averages the heads,
            # unless skip_embed_dim_check is set: then it runs its own per-head code
            if hasattr(mod, "skip_embed_dim_check"):
                mod.skip_embed_dim_check = True
            mod.forward = self._wrap(i, mod.forward)

    def _wrap(self, i, fwd):
        def forward(*args, **kwargs):
            kwargs["need_weights"] = True
            kwargs["need_head_weights"] = True
            out, w = fwd(*args, **kwargs)
            if w is not None and w.dim() != 4:
                raise SystemExit(f"attention module {i} returned weights of shape {tuple(w.shape)}, not (heads, batch, T, S)")
            self.maps[i] = None if w is None else w.detach().float()  # (H, B, T, S)
            return out, w

        return forward

    def restore(self):
        for mod, fwd, skip in self._orig:
            mod.forward = fwd
            if skip is not None:
                mod.skip_embed_dim_check = skip


def pairwise_stats(maps: torch.Tensor):
    """maps (H, T, S) -> the H(H-1)/2 Frobenius distances between heads."""
    h = maps.shape[0]
    flat = maps.reshape(h, -1)
    d = torch.cdist(flat[None], flat[None])[0]
    iu = torch.triu_indices(h, h, offset=1)
    return d[iu[0], iu[1]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True, help="the binarised data the model was trained on")
    p.add_argument("--subset", default="valid")
    p.add_argument("--site", choices=("auto", "encoder", "decoder", "cross"), default="auto")
    p.add_argument("--batches", type=int, default=50, help="validation batches to use (default: 50)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences a batch")
    p.add_argument("--label", help="row name in Table 6 (default: from the run's meta.json, e.g. 'fourier small')")
    p.add_argument("--out", required=True, help="JSON with the statistics")
    p.add_argument("--png", help="PNG of the attention maps of the first sequence")
    p.add_argument("--png-layers", type=int, default=4, help="layers drawn in the PNG (evenly spaced)")
    p.add_argument("--user-dir", default=os.path.join(REPO, "fourierformer_fairseq"))
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--small", action="store_true", help="small mode: 2 batches of 2 sequences")
    args = p.parse_args(argv)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    if args.small:
        args.batches, args.batch_size = 2, 2
    if not os.path.isfile(args.checkpoint):
        p.error(f"no checkpoint {args.checkpoint}")

    t0 = time.time()
    model, cfg, task = load(args.checkpoint, args.data, args.user_dir)
    use_cuda = torch.cuda.is_available() and not args.cpu
    if use_cuda:
        model.cuda()
    is_lm = not hasattr(model, "encoder") or getattr(model, "encoder", None) is None
    site = args.site if args.site != "auto" else ("decoder" if is_lm else "encoder")
    mods = attention_modules(model, site)
    if not mods:
        p.error(f"no {site} attention modules in this model")

    task.load_dataset(args.subset)
    ds = task.dataset(args.subset)
    itr = task.get_batch_iterator(dataset=ds, max_sentences=args.batch_size, max_positions=None,
                                  ignore_invalid_inputs=True, seed=1).next_epoch_itr(shuffle=False)
    rec = Recorder(mods)
    per_layer: list[list[torch.Tensor]] = [[] for _ in mods]
    first = None
    nb = nseq = 0
    pad = task.source_dictionary.pad() if task.source_dictionary is not None else task.target_dictionary.pad()
    try:
        with torch.no_grad():
            for sample in itr:
                if nb >= args.batches:
                    break
                if not sample or "net_input" not in sample:
                    continue
                if use_cuda:
                    from fairseq import utils

                    sample = utils.move_to_cuda(sample)
                model(**sample["net_input"])
                net = sample["net_input"]
                q_tokens = net["src_tokens"] if site == "encoder" or is_lm else sample["target"]
                k_tokens = net["src_tokens"] if site in ("encoder", "cross") or is_lm else sample["target"]
                q_len = q_tokens.ne(pad).sum(1)
                k_len = k_tokens.ne(pad).sum(1)
                for li, w in enumerate(rec.maps):
                    if w is None:
                        raise SystemExit(f"{mods[li][0]} returned no attention weights")
                    for b in range(w.shape[1]):
                        # left-padded sources (fairseq's default) keep their tokens at the end
                        tq, tk = int(q_len[b]), int(k_len[b])
                        m = w[:, b, -tq:, -tk:] if (site == "encoder" and not is_lm) else w[:, b, :tq, :tk]
                        if site == "cross":
                            m = w[:, b, :tq, -tk:]
                        per_layer[li].append(pairwise_stats(m).cpu())
                        if first is None and li == len(rec.maps) - 1:
                            first = [x[:, b].cpu() for x in rec.maps]
                nseq += int(q_tokens.shape[0])
                nb += 1
    finally:
        rec.restore()
    if nb == 0:
        raise SystemExit(f"no batches in {args.subset}")

    layers = []
    for li, ds_ in enumerate(per_layer):
        d = torch.cat(ds_).double()
        layers.append({"layer": mods[li][0], "mean": float(d.mean()), "var": float(d.var(unbiased=False)), "pairs": int(d.numel())})
    label = args.label
    meta = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.checkpoint))), "meta.json")
    if not label and os.path.exists(meta):
        m = json.load(open(meta))
        label = " ".join(str(x) for x in (m.get("model"), m.get("size")) if x)
    res = {"label": label or os.path.basename(args.checkpoint), "checkpoint": args.checkpoint,
           "arch": getattr(getattr(cfg, "model", None), "arch", None) or getattr(cfg.model, "_name", None),
           "site": site, "subset": args.subset, "batches": nb, "sequences": nseq, "layers": len(layers),
           "heads": int(first[0].shape[0]) if first else None,
           "mean": sum(x["mean"] for x in layers) / len(layers), "var": sum(x["var"] for x in layers) / len(layers),
           "per_layer": layers, "seconds": round(time.time() - t0, 1)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    json.dump(res, open(args.out, "w"), indent=1)
    print(f"head redundancy of {res['label']} ({site} attention, {nb} batches, {nseq} sequences): "
          f"layer-averaged mean L2 distance {res['mean']:.4f}, variance {res['var']:.4f} -> {args.out}")
    if args.png and first:
        draw(first, mods, args.png, args.png_layers, res["label"])
        print(f"attention maps -> {args.png}")
    return 0


def draw(maps, mods, path, n_layers, label):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L = len(maps)
    k = min(n_layers, L)
    idx = sorted({round(i * (L - 1) / max(1, k - 1)) for i in range(k)})
    H = maps[0].shape[0]
    fig, axes = plt.subplots(len(idx), H, figsize=(1.6 * H, 1.6 * len(idx)), squeeze=False)
    for r, li in enumerate(idx):
        for h in range(H):
            ax = axes[r][h]
            ax.imshow(maps[li][h].numpy(), cmap="viridis", aspect="auto", interpolation="nearest")
            ax.set_xticks([]); ax.set_yticks([])
            if r == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {li}", fontsize=8)
    fig.suptitle(f"attention maps of one validation sequence, {label}", fontsize=10, y=1.04)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
