#!/usr/bin/env python3
"""The published FourierFormer language model at initialisation, against our --fourier-paper-exact.

The published code (docs/published-model.md) initialises every Linear layer N(0, 0.02), so after
a LayerNorm its queries and keys have a standard deviation of 0.02 sqrt(d_model) per feature:
0.23 for the small model (d 128, head dim 16), 0.32 for the medium one (d 256, head dim 32).
fairseq's initialisation (xavier_uniform with gain 1/sqrt(2) on the joint projection) gives 0.71.
With i.i.d. Gaussian q and k of those scales, R = 2, p = 4, causal rows of N = 256 keys, this
measures in float64, per setting, over the rows with at least N / 2 keys:

  row sum      the median of sum_j w_ij, w_ij = prod_d sinc(R (q_id - k_jd))^p (with the R^D factor
               of the published CPU extension, the sum is R^(pD) times larger)
  eps mass     the share of a row's attention that the published normaliser sum_j w_ij + 1e-6
               sends to its implicit zero-valued key (median and mean)
  entropy      the mean row entropy in nats, and that of a softmax twin (q k^T / sqrt(D))
  past zero    the share of (query, key) pairs with some feature past sinc's first zero
  overflow     with the R^D factor, the share of weights (R^D prod sinc)^p that overflow float32
               (the published code forms them in the linear domain)

    python scripts/analysis/dynamics/published_init.py [--batch 2] [--seed 0]
"""
from __future__ import annotations

import argparse
import math

import torch

SETTINGS = (  # (label, q std, head dim)
    ("published small (N(0, 0.02) init)", 0.02 * math.sqrt(128), 16),
    ("published medium (N(0, 0.02) init)", 0.02 * math.sqrt(256), 32),
    ("ours, paper-exact small (fairseq init)", math.sqrt(0.5), 16),
    ("ours, paper-exact medium (fairseq init)", math.sqrt(0.5), 32),
)
EPS = 1e-6


def entropy(P: torch.Tensor) -> torch.Tensor:
    return -(P * torch.where(P > 0, P.log(), torch.zeros_like(P))).sum(-1)


def measure(qstd: float, D: int, R: float, p: int, N: int, B: int, H: int, g: torch.Generator) -> dict:
    q = torch.randn(B, H, N, D, generator=g, dtype=torch.float64) * qstd
    k = torch.randn(B, H, N, D, generator=g, dtype=torch.float64) * qstd
    x = R * (q.unsqueeze(3) - k.unsqueeze(2))  # (B, H, N, N, D)
    sinc = torch.where(x == 0, torch.ones_like(x), torch.sin(x) / x)
    prod = sinc.prod(-1)
    masked = torch.triu(torch.ones(N, N, dtype=torch.bool), 1)
    w = (prod ** p).masked_fill(masked, 0.0)
    rows = w.sum(-1)
    eps_mass = EPS / (rows + EPS)
    P = w / rows.unsqueeze(-1)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(masked, float("-inf"))
    past = (x.abs() > math.pi).any(-1) & ~masked
    overflow = torch.isinf((prod.float() * R ** D) ** p) & ~masked
    keep = slice(N // 2, N)  # rows with at least N / 2 keys
    visible = (~masked).sum().item() * B * H
    return {
        "row sum": rows[..., keep].median().item(),
        "eps mass median": eps_mass[..., keep].median().item(),
        "eps mass mean": eps_mass[..., keep].mean().item(),
        "entropy": entropy(P)[..., keep].mean().item(),
        "softmax entropy": entropy(scores.softmax(-1))[..., keep].mean().item(),
        "past zero": past.sum().item() / visible,
        "overflow": overflow.sum().item() / visible,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--radius", type=float, default=2.0)
    ap.add_argument("--power", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    g = torch.Generator().manual_seed(args.seed)
    print(f"R = {args.radius}, p = {args.power}, causal rows of N = {args.context} keys (those with >= N/2), "
          f"{args.batch} x {args.heads} heads, seed {args.seed}")
    print("| setting | q std | D | median row sum | eps mass (median / mean) | entropy (softmax) | pairs past first zero "
          "| float32 overflow with R^D |")
    print("|---|---|---|---|---|---|---|---|")
    for label, qstd, D in SETTINGS:
        r = measure(qstd, D, args.radius, args.power, args.context, args.batch, args.heads, g)
        print(f"| {label} | {qstd:.2f} | {D} | {r['row sum']:.2g} | {r['eps mass median']:.2g} / {r['eps mass mean']:.2g} "
              f"| {r['entropy']:.2f} ({r['softmax entropy']:.2f}) | {100 * r['past zero']:.2g} % | {100 * r['overflow']:.2g} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
