"""How well random-feature attention approximates exact attention as the number of features grows.

    python scripts/analysis/dynamics/performer_approximation.py [--draws 5] [--input-std 0.707] [--shapes lm,iwslt]

For two shapes, the language model's (head dim 16, p = 4, R = 2, 256 positions, 8 heads) and
IWSLT's (head dim 128, p = 2, R = 1, 64 positions, 4 heads), with queries and keys drawn from
N(0, input_std^2) (default 0.707^2 = 0.5: the variance of fairseq's initial projections of
unit-variance inputs) and values from N(0, 1), prints a markdown table of the relative error
||out - exact||_F / ||exact||_F of the attention output, mean and standard deviation over
independent feature draws, without and with a causal mask:

- softmax attention against FAVOR+ estimators (``fourierformer_fairseq.ops.favor``): positive
  features (the Performer's) with orthogonal or iid projections, and trigonometric features
  (random Fourier features of the Gaussian kernel times exp(|x|^2/2)), orthogonal or iid;
- the Fourier kernel prod_d sinc^p(R (q_d - k_d)) (exact: ``ops.fourier_attention``) against
  ``fourier_rf`` (the squared, non-negative estimator of ``ops.favor.fourier_rf_features``) with
  scrambled Sobol (qmc) or iid frequencies, and plain signed trigonometric features of the kernel
  itself (``trig``). For fourier_rf, m counts frequencies; its feature dimension is m (2m + 1).

``neg. den.`` is the share of output rows whose normaliser came out <= 0 (then the row is set
to 0). ``uniform`` is the error of plain averaging of the values (every weight 1/M): an
estimator no better than it has captured none of the attention's shape; ``eff. keys`` is
exp(entropy) of the exact weights, averaged over rows (how many keys a query really attends to).
"""
from __future__ import annotations

import argparse
import math
import time

import torch

from fourierformer_fairseq.ops import fourier_attention
from fourierformer_fairseq.ops import favor

SHAPES = {
    # name: (batch, heads, positions, head_dim, power, radius)
    "lm": (1, 8, 256, 16, 4, 2.0),
    "iwslt": (2, 4, 64, 128, 2, 1.0),
}
SOFTMAX_M = (16, 64, 256, 1024)
FOURIER_M = (4, 8, 16, 32)


def rel_error(out, exact):
    return ((out - exact).norm() / exact.norm()).item()


def from_features(qf, kf, v, causal):
    """Linear attention from given features; returns (output, share of rows with normaliser <= 0)."""
    v1 = favor.with_ones(v)
    num_den = favor.causal_linear_attention(qf, kf, v1) if causal else qf @ (kf.transpose(-1, -2) @ v1)
    bad = (num_den[..., -1] <= 0).float().mean().item()
    return favor.normalise(num_den), bad


def trig_features(x, w, radius=1.0):
    proj = (x * radius) @ w.t()
    return torch.cat([torch.cos(proj), torch.sin(proj)], -1) * w.size(0) ** -0.5


def exact_softmax(q, k, v, causal):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, -1)
    return p @ v, p


def fourier_weights(q, k, radius, power, causal):
    """Exact Fourier weights, for the effective-keys statistic only (log domain)."""
    x = radius * (q.unsqueeze(-2) - k.unsqueeze(-3))
    s = power * torch.log(torch.sinc(x / math.pi).abs().clamp_min(1e-30)).sum(-1)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1)


def effective_keys(p):
    ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    return torch.exp(ent).mean().item()


def uniform_error(v, exact, causal):
    if causal:
        n = torch.arange(1, v.size(-2) + 1, dtype=v.dtype).view(-1, 1)
        out = v.cumsum(-2) / n
    else:
        out = v.mean(-2, keepdim=True).expand_as(v)
    return rel_error(out, exact)


def row(cells):
    return "| " + " | ".join(cells) + " |"


def stats(values):
    t = torch.tensor(values, dtype=torch.float64)
    return t.mean().item(), (t.std().item() if len(values) > 1 else 0.0)


def fmt(values):
    mean, sd = stats(values)
    return f"{mean:.3f} ± {sd:.3f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=5, help="independent feature draws per cell")
    parser.add_argument("--input-std", type=float, default=math.sqrt(0.5), help="std of the queries and keys")
    parser.add_argument("--shapes", default="lm,iwslt")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    start = time.time()
    print(f"# torch {torch.__version__}, {args.draws} draws, q, k ~ N(0, {args.input_std:.3f}^2), v ~ N(0, 1)\n")
    print(row(["shape", "exact", "estimator", "m", "features", "error", "neg. den.", "error, causal",
               "neg. den., causal"]))
    print(row(["---"] * 9))
    for shape in args.shapes.split(","):
        B, H, N, D, power, radius = SHAPES[shape]
        g = torch.Generator().manual_seed(args.seed + D)
        q = torch.randn(B, H, N, D, generator=g) * args.input_std
        k = torch.randn(B, H, N, D, generator=g) * args.input_std
        v = torch.randn(B, H, N, D, generator=g)
        label = f"{shape} (d {D}, N {N})"

        # ---------------------------------------------------------------- softmax
        exact = {c: exact_softmax(q, k, v, c) for c in (False, True)}
        print(row([label, "softmax", "uniform (all weights 1/M)", "-", "-",
                   f"{uniform_error(v, exact[False][0], False):.3f}", "-",
                   f"{uniform_error(v, exact[True][0], True):.3f}", "-"]))
        print(row([label, "softmax", "(eff. keys of the exact weights)", "-", "-",
                   f"{effective_keys(exact[False][1]):.1f}", "-", f"{effective_keys(exact[True][1]):.1f}", "-"]))
        for name, positive, feature_type in (("positive, orthogonal (FAVOR+)", True, "orthogonal"),
                                             ("positive, iid", True, "iid"),
                                             ("trigonometric, orthogonal", False, "orthogonal"),
                                             ("trigonometric, iid", False, "iid")):
            for m in SOFTMAX_M:
                cells = {False: ([], []), True: ([], [])}
                for draw in range(args.draws):
                    w = favor.gaussian_orthogonal_matrix(
                        m, D, torch.Generator().manual_seed(favor.feature_seed(args.seed, f"{shape}/{m}", draw)),
                        feature_type)
                    for causal in (False, True):
                        if positive:
                            out = favor.favor_attention(q, k, v, w, causal=causal)
                            bad = 0.0
                        else:
                            out, bad = from_features(favor.trig_softmax_features(q, w),
                                                     favor.trig_softmax_features(k, w), v, causal)
                        cells[causal][0].append(rel_error(out, exact[causal][0]))
                        cells[causal][1].append(bad)
                features = m if positive else 2 * m
                print(row([label, "softmax", name, str(m), str(features), fmt(cells[False][0]),
                           f"{100 * stats(cells[False][1])[0]:.1f}%", fmt(cells[True][0]),
                           f"{100 * stats(cells[True][1])[0]:.1f}%"]))

        # ---------------------------------------------------------------- Fourier kernel
        r = torch.tensor(radius)
        exact_f = {c: fourier_attention(q, k, v, r, power=power, causal=c) for c in (False, True)}
        weights_f = {c: fourier_weights(q, k, radius, power, c) for c in (False, True)}
        kernel = f"Fourier p={power} R={radius:g}"
        print(row([label, kernel, "uniform (all weights 1/M)", "-", "-",
                   f"{uniform_error(v, exact_f[False], False):.3f}", "-",
                   f"{uniform_error(v, exact_f[True], True):.3f}", "-"]))
        print(row([label, kernel, "(eff. keys of the exact weights)", "-", "-",
                   f"{effective_keys(weights_f[False]):.1f}", "-", f"{effective_keys(weights_f[True]):.1f}", "-"]))
        for name, sampling, squared in (("fourier_rf, qmc", "qmc", True), ("fourier_rf, iid", "iid", True),
                                        ("trig (signed), qmc", "qmc", False)):
            for m in FOURIER_M:
                cells = {False: ([], []), True: ([], [])}
                for draw in range(args.draws):
                    seed = favor.feature_seed(args.seed, f"{shape}/fourier/{m}", draw)
                    if squared:
                        w = favor.fourier_rf_frequencies(m, D, power, seed, sampling)
                        qf, kf = favor.fourier_rf_features(q, w, r), favor.fourier_rf_features(k, w, r)
                    else:  # frequencies of sinc^p itself: p uniforms per coordinate
                        w = favor.fourier_rf_frequencies(m, D, 2 * power, seed, sampling)
                        qf, kf = trig_features(q, w, radius), trig_features(k, w, radius)
                    for causal in (False, True):
                        out, bad = from_features(qf, kf, v, causal)
                        cells[causal][0].append(rel_error(out, exact_f[causal]))
                        cells[causal][1].append(bad)
                features = m * (2 * m + 1) if squared else 2 * m
                print(row([label, kernel, name, str(m), str(features), fmt(cells[False][0]),
                           f"{100 * stats(cells[False][1])[0]:.1f}%", fmt(cells[True][0]),
                           f"{100 * stats(cells[True][1])[0]:.1f}%"]))
    print(f"\n({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
