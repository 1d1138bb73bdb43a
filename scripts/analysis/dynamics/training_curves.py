"""Plots fairseq training logs side by side: loss, gradient norm, radius and attention entropy.

Reads logs written by ``fairseq-train --log-format json`` (the ``train_inner`` and ``valid``
lines), for FourierFormers trained with ``--fourier-log-interval N`` (which adds
``radius_<layer>`` and ``entropy_<site>``), and softmax runs (which have neither). Writes one
PNG with a panel per quantity against updates, and prints each run's validation losses as a
markdown table.

    python scripts/analysis/dynamics/training_curves.py --run "Fourier (defaults)=runs/fourier/train.log" \\
        --run "softmax=runs/softmax/train.log" --out curves.png [--entropy "softmax=entropy.json"]

``--entropy NAME=FILE`` adds entropies measured afterwards on checkpoints
(``scripts/analysis/dynamics/attention_entropy.py``), e.g. for softmax runs, which do not log them.
"""
from __future__ import annotations

import argparse
import json
import logging
from collections import defaultdict

from fourierformer_fairseq.fairseq_runs import fairseq_log_records

# importing the package imports fairseq, which leaves the root logger at DEBUG: without this,
# matplotlib would print its font search
logging.getLogger("matplotlib").setLevel(logging.WARNING)


def read_log(path: str):
    """{'train': [dict, ...], 'valid': [dict, ...]} with numbers parsed."""
    out = {"train": [], "valid": []}
    with open(path) as fh:
        for tag, rec in fairseq_log_records(fh):
            if tag == "train":
                continue
            record = {}
            for key, value in rec.items():
                try:
                    record[key] = float(value)
                except (TypeError, ValueError):
                    record[key] = value
            if tag == "valid" and "valid_num_updates" in record:
                record["num_updates"] = record["valid_num_updates"]
            out["train" if tag == "train_inner" else "valid"].append(record)
    return out


def valid_key(log):
    """Translation criteria log valid_nll_loss; the language model's cross_entropy only valid_loss."""
    return "valid_nll_loss" if any("valid_nll_loss" in r for r in log["valid"]) else "valid_loss"


def series(records, key):
    xs, ys = [], []
    for r in records:
        # a metric logged every few intervals (--fourier-log-interval) is null in the others
        if isinstance(r.get(key), float) and "num_updates" in r:
            xs.append(r["num_updates"])
            ys.append(r[key])
    return xs, ys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", required=True, metavar="NAME=LOG")
    ap.add_argument("--entropy", action="append", default=[], metavar="NAME=JSON")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--title", default="")
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    for spec in args.run:
        name, _, path = spec.partition("=")
        runs.append((name, read_log(path)))
    extra_entropy = {}
    for spec in args.entropy:
        name, _, path = spec.partition("=")
        with open(path) as fh:
            extra_entropy[name] = json.load(fh)

    fig, axes = plt.subplots(1, 5, figsize=(25, 4.5))
    ax_loss, ax_valid, ax_gnorm, ax_radius, ax_entropy = axes
    for i, (name, log) in enumerate(runs):
        color = f"C{i}"
        ax_loss.plot(*series(log["train"], "loss"), color=color, label=name)
        ax_valid.plot(*series(log["valid"], valid_key(log)), "o-", color=color, label=name)
        ax_gnorm.plot(*series(log["train"], "gnorm"), color=color, label=name)
        radius_keys = sorted({k for r in log["train"] for k in r if k.startswith("radius_")})
        for j, key in enumerate(radius_keys):
            ax_radius.plot(*series(log["train"], key), color=color, alpha=0.6, lw=1,
                           label=name if j == 0 else None)
        entropy_keys = sorted({k for r in log["train"] for k in r if k.startswith("entropy_")})
        for j, key in enumerate(entropy_keys):
            ax_entropy.plot(*series(log["train"], key), color=color, ls=["-", "--", ":"][j % 3],
                            label=f"{name}: {key[len('entropy_'):]}")
        if name in extra_entropy:
            by_site = defaultdict(list)
            for point in extra_entropy[name]["points"]:
                for site, value in point["entropy"].items():
                    if "/" not in site:  # q_rms/<site>, past_zero/<site> are not entropies
                        by_site[site].append((point["num_updates"], value))
            for j, (site, pts) in enumerate(sorted(by_site.items())):
                pts.sort()
                ax_entropy.plot([p[0] for p in pts], [p[1] for p in pts], "s", color=color,
                                ls=["-", "--", ":"][j % 3], label=f"{name}: {site} (checkpoints)")
    ax_loss.set_title("train loss (label-smoothed, base 2)")
    ax_valid.set_title("valid nll_loss / loss (base 2)")
    ax_gnorm.set_title("gradient norm (before clipping)")
    ax_gnorm.set_yscale("log")
    ax_radius.set_title("radius, every Fourier layer")
    ax_entropy.set_title("mean attention entropy (nats)")
    for ax in axes:
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=80)
    print(f"wrote {args.out}")

    print("| run | valid nll_loss (ppl) by update |")
    print("|---|---|")
    for name, log in runs:
        xs, ys = series(log["valid"], valid_key(log))
        _, ppl = series(log["valid"], "valid_ppl")
        cells = ", ".join(f"{y:.3f} ({p:.1f}) @{int(x)}" for x, y, p in zip(xs, ys, ppl or [float("nan")] * len(ys)))
        print(f"| {name} | {cells} |")


if __name__ == "__main__":
    main()
