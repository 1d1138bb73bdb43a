"""How peaked and how rough Fourier attention is at a given scale, beside softmax attention.

For random queries and keys (i.i.d. normal features of standard deviation ``--std``, what the
projections of a freshly initialised model produce), prints, per configuration of head dim D,
power p and radius R:

- ``S spread``: the standard deviation across keys of the log-weights
  S_ij = p sum_d log|sinc(R (q_id - k_jd))|, averaged over rows, divided by the same for
  softmax's scores q_i . k_j / sqrt(D) on the same q and k;
- ``near zero``: the fraction of keys with at least one feature within 0.1 of a zero of sinc
  (|R (q_d - k_d)| within 0.1 of m pi, m != 0), where d log|sinc x| / dx = cot x - 1/x blows up;
- ``entropy``: the mean row entropy of the normalised weights, over log(M) (1 = uniform,
  0 = one-hot), and softmax's;
- ``|dL/dq|``: the norm of the gradient of L = sum(out * G) with respect to q for a fixed random
  G, over softmax's;
- ``median sum w``: the median over rows of sum_j w_ij (the published code divides by
  sum_j w_ij + 1e-6; below 1e-6 the row's mass goes to an implicit zero-valued key);
- the same with the queries and keys normalised to unit RMS per head (``--qk-norm rms``, this
  project's default), where R alone sets the scale.

Everything is float64 and computed from the formula directly (no kernel), so it is slow for
large M * D; the defaults take a few seconds.

    python scripts/analysis/dynamics/attention_scale.py                       # the paper's configurations
    python scripts/analysis/dynamics/attention_scale.py --dims 16 64 128 --powers 2 4 --radii 0.5 1 2 --std 0.71
"""
from __future__ import annotations

import argparse
import itertools
import math

import torch

from fourierformer_fairseq.modules.fourier_multihead_attention import auto_radius, rms_normalise


def fourier_log_weights(q, k, radius, power):
    x = radius * (q.unsqueeze(1) - k.unsqueeze(0))  # (N, M, D)
    safe = torch.where(x == 0, torch.ones_like(x), x)
    sinc = torch.where(x == 0, torch.ones_like(x), torch.sin(safe) / safe)
    return power * torch.log(sinc.abs().clamp_min(1e-300)).sum(-1), x


def measure(D, power, radius, std, qk_norm, N=128, M=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(N, D, generator=g, dtype=torch.float64) * std).requires_grad_()
    k = torch.randn(M, D, generator=g, dtype=torch.float64) * std
    v = torch.randn(M, D, generator=g, dtype=torch.float64)
    G = torch.randn(N, D, generator=g, dtype=torch.float64)
    qn, kn = (rms_normalise(q), rms_normalise(k)) if qk_norm else (q, k)
    S, x = fourier_log_weights(qn, kn, radius, power)
    P = torch.softmax(S, dim=-1)
    (gq,) = torch.autograd.grad((P @ v * G).sum(), q)

    q2 = q.detach().clone().requires_grad_()
    T = (q2 @ k.T) / math.sqrt(D)
    Ps = torch.softmax(T, dim=-1)
    (gqs,) = torch.autograd.grad((Ps @ v * G).sum(), q2)

    def entropy(P):
        return (-(P * P.clamp_min(1e-300).log()).sum(-1)).mean().item() / math.log(M)

    ax = x.detach().abs()
    m = torch.round(ax / math.pi)
    near = ((m >= 1) & ((ax - m * math.pi).abs() < 0.1)).any(-1).double().mean().item()
    log_sum_w = torch.logsumexp(S.detach(), dim=-1)
    return {
        "spread": (S.detach().std(-1).mean() / T.detach().std(-1).mean()).item(),
        "near_zero": near,
        "entropy": entropy(P.detach()),
        "entropy_softmax": entropy(Ps.detach()),
        "grad_ratio": (gq.norm() / gqs.norm()).item(),
        "median_sum_w": math.exp(log_sum_w.median().item()),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--powers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--radii", nargs="+", default=["0.5", "1", "2", "auto"],
                    help="radii to try; 'auto' = sqrt(3 / (p sqrt(D)))")
    ap.add_argument("--std", type=float, default=1.0, help="std of the q and k features")
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"q, k ~ N(0, {args.std}^2), {args.keys} keys, 128 queries; ratios are to softmax q.k/sqrt(D) on the same q, k")
    print("| qk-norm | D | p | R | S spread / softmax | keys near a sinc zero | entropy (softmax) | |dL/dq| / softmax | median sum_j w |")
    print("|---|---|---|---|---|---|---|---|---|")
    for qk_norm, D, p, r in itertools.product((False, True), args.dims, args.powers, args.radii):
        R = auto_radius(p, D) if r == "auto" else float(r)
        m = measure(D, p, R, args.std, qk_norm, M=args.keys, seed=args.seed)
        print(f"| {'rms' if qk_norm else 'none'} | {D} | {p} | {R:.3g}{' (auto)' if r == 'auto' else ''} | "
              f"{m['spread']:.2f} | {m['near_zero']:.0%} | {m['entropy']:.3f} ({m['entropy_softmax']:.3f}) | "
              f"{m['grad_ratio']:.2f} | {m['median_sum_w']:.2e} |")


if __name__ == "__main__":
    main()
