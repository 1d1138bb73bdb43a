"""The seeded cases of the op's fuzz, shared by the CPU fuzz (ops/test_op_fuzz.py) and the CUDA fuzz
(cuda/test_cuda_fuzz.py, cuda/test_cuda_harness_on_cpu.py): ``draw_case(seed)`` is a pure function
of the seed; the classes it draws and the bound the cases are checked with are described in
ops/test_op_fuzz.py's docstring."""
from __future__ import annotations

import math

import torch

from oracle import additive_mask as oracle_additive_mask
from oracle import _log_abs_sinc_oracle, _radius_table, _scores

from fourierformer_fairseq.ops.reference import draw_seed, dropout_keep_mask


def oracle_scores(q, k, radius, power, phi="power"):
    return _scores(q, k, radius, power, _log_abs_sinc_oracle, phi=phi)

CLASSES = ("plain", "duplicate", "duplicate", "near_1e-6", "near_1e-3", "sinc_zeros", "large")
MASKS = ("none", "causal", "padding", "causal_padding", "additive", "bool")
RADIUS_SHAPES = ("scalar", "head", "feature", "head_feature")
RADIUS_SIGNS = ("positive", "negative", "mixed", "positive", "mixed")


NULL_KEY_FACTORS = (0.0, 0.1, 0.0, 1.0, 0.0, 10.0)
DROPOUTS = (0.0, 0.5, 0.0, 0.0, 0.1, 0.0)  # by (seed // 3) % 6: every radius shape and mask meets both
# by (seed // 2) % 6: the fused phis besides the even powers ("odd": phi(x) = x^p with p 1, 3 or 5, signed
# weights)
PHI_KINDS = ("power", "abs", "power", "relu", "odd", "power")


def median_row_mass(q, k, radius, kwargs) -> float:
    """The median over rows that see a key of sum_j w_ij (masks included), from the oracle's scores."""
    B, H, N, _ = q.shape
    M = k.shape[2]
    S = oracle_scores(q.double(), k.double(), radius.double(), kwargs["power"], kwargs.get("phi", "power"))
    S = S + oracle_additive_mask(B, H, N, M, kwargs.get("attn_mask"), kwargs.get("key_padding_mask"),
                                 kwargs.get("causal", False))
    lse = torch.logsumexp(S, -1)
    lse = lse[torch.isfinite(lse)]
    return math.exp(lse.median().item()) if lse.numel() else 1.0


def case_classes(seed: int) -> tuple:
    """(case class, mask, radius shape, radius sign, null-key factor, dropout p, phi) of fuzz case `seed`."""
    return (CLASSES[seed % len(CLASSES)], MASKS[(seed // len(CLASSES)) % len(MASKS)],
            RADIUS_SHAPES[(seed // 3) % 4], RADIUS_SIGNS[seed % len(RADIUS_SIGNS)],
            NULL_KEY_FACTORS[(seed // 2) % len(NULL_KEY_FACTORS)], DROPOUTS[(seed // 3) % len(DROPOUTS)],
            PHI_KINDS[(seed // 2) % len(PHI_KINDS)])


def draw_case(seed: int) -> dict:
    """Inputs and keywords of fuzz case `seed` (a pure function of the seed)."""
    g = torch.Generator().manual_seed(1_000_003 * seed + 17)

    def pick(xs):
        return xs[int(torch.randint(len(xs), (1,), generator=g))]

    B, H = pick((1, 2)), pick((1, 2))
    N = pick((1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33))
    M = pick((1, 3, 4, 5, 8, 15, 16, 17, 31, 33, 40, 100))
    D = pick((1, 3, 4, 8, 16, 17, 64, 128))
    Dv = pick((1, 3, 16, 17, 33))
    std = pick((0.3, 1.0, 3.0))
    R = pick((0.5, 2.0, 10.0))
    power = pick((2, 4, 6))
    kind, mask_kind, radius_kind, sign_kind, eps_factor, dropout_p, phi = case_classes(seed)

    k = torch.randn(B, H, M, D, generator=g) * std
    v = torch.randn(B, H, M, Dv, generator=g)
    if kind == "large":
        std = 30.0
        k = torch.randn(B, H, M, D, generator=g) * std
    if kind.startswith("duplicate") or kind.startswith("near"):
        idx = torch.randint(M, (N,), generator=g)
        q = k[:, :, idx].clone()
        if kind.startswith("near"):
            q = q + float(kind.split("_")[1]) * std * torch.randn(q.shape, generator=g)
    else:
        q = torch.randn(B, H, N, D, generator=g) * std

    if radius_kind == "scalar":
        radius = torch.tensor(R)
    else:
        shape = {"head": (H, 1), "feature": (D,), "head_feature": (H, D)}[radius_kind]
        radius = R * (0.7 + 0.6 * torch.rand(shape, generator=g))
    if kind == "sinc_zeros":
        # some (query, key, feature) triples at R (q - k) = m pi (1 + delta), delta down to 0
        r_hd = radius.reshape(1, D).expand(H, D) if radius.dim() == 1 else radius.reshape(-1, radius.shape[-1] if radius.dim() else 1).expand(H, D)
        for _ in range(max(1, N * M // 4)):
            b, h = int(torch.randint(B, (1,), generator=g)), int(torch.randint(H, (1,), generator=g))
            i, j, d = (int(torch.randint(n, (1,), generator=g)) for n in (N, M, D))
            m = pick((-2, -1, 1, 2, 7))
            delta = pick((0.0, 1e-6, 1e-3, 3e-2))
            k[b, h, j, d] = q[b, h, i, d] - m * math.pi * (1 + delta) / float(r_hd[h, d])

    if phi == "odd":
        power, phi = (1, 3, 5)[seed % 3], "power"
    kwargs = dict(power=power) if phi == "power" else dict(power=power, phi=phi)  # (|x| takes no power)
    causal = mask_kind.startswith("causal") and N <= M
    if causal:
        kwargs["causal"] = True
    if mask_kind.endswith("padding"):
        kpm = torch.zeros(B, M, dtype=torch.bool)
        for b in range(B):
            style = int(torch.randint(4, (1,), generator=g))
            n = int(torch.randint(M + 1, (1,), generator=g))
            if style == 0:
                kpm[b, M - n:] = True  # right padding (possibly all keys)
            elif style == 1:
                kpm[b, :n] = True  # left padding
            elif style == 2:
                kpm[b] = torch.rand(M, generator=g) < 0.3
        kwargs["key_padding_mask"] = kpm
    if mask_kind == "additive":
        mask = torch.randn(N, M, generator=g) * 3
        mask[torch.rand(N, M, generator=g) < 0.2] = float("-inf")
        kwargs["attn_mask"] = mask
    if mask_kind == "bool":
        kwargs["attn_mask"] = torch.rand(B * H, N, M, generator=g) < 0.25
    grad_out = torch.randn(B, H, N, Dv, generator=g)
    # the radius's sign (training may move it through 0; sinc is even, so only dradius's sign
    # changes): from its own generator, so that the draws above stay what they were
    if sign_kind == "negative":
        radius = -radius
    elif sign_kind == "mixed":
        flip = torch.rand(radius.shape, generator=torch.Generator().manual_seed(seed)) < 0.5
        radius = torch.where(flip, -radius, radius)
    # the published normaliser on every other pair of seeds: eps at 0.1, 1 or 10 times the median
    # row's sum_j w_ij, so that the null key takes from a tenth to most of a typical row
    if eps_factor:
        kwargs["normaliser_eps"] = eps_factor * median_row_mass(q, k, radius, kwargs)
    # dropout (after the null key) with the kernels' own mask: the op draws its seed from torch's
    # generator (seeded in fused_gradients), and the oracle takes the factors f_ij it implies
    oracle_kwargs = dict(kwargs)
    if dropout_p:
        kwargs["dropout_p"] = dropout_p
        oracle_kwargs["dropout_scale"] = dropout_keep_mask(_dropout_seed(seed), (B, H, N, M), dropout_p, "cpu").double() / (1 - dropout_p)
    label = (
        f"seed={seed} {kind} B{B} H{H} N{N} M{M} D{D} Dv{Dv} std={std} R={R} ({radius_kind}, {sign_kind}) "
        + (f"p={power} " if phi == "power" else f"phi={phi} ") +
        f"mask={mask_kind}{' causal' if causal else ''}"
        + (f" normaliser_eps={kwargs['normaliser_eps']:.3g}" if eps_factor else "")
        + (f" dropout_p={dropout_p}" if dropout_p else "")
    )
    return dict(q=q, k=k, v=v, radius=radius, grad_out=grad_out, kwargs=kwargs, oracle_kwargs=oracle_kwargs,
                label=label, seed=seed)


def _dropout_seed(seed: int) -> int:
    """The dropout seed the op draws in fused_gradients for fuzz case `seed`."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return draw_seed()


def op_forward_args(case, dtype, device="cpu"):
    """The op's arguments (fourierformer::fourier_attention_forward) for a fuzz case: radius as
    (H, D), the masks as the op takes them, dropout's seed 0."""
    q, k, v = (case[n].to(device, dtype) for n in ("q", "k", "v"))
    B, H, N, D = q.shape
    M = k.shape[2]
    kw = case["kwargs"]
    radius = _radius_table(case["radius"], H, D).to(device, torch.float64 if dtype == torch.float64 else torch.float32)
    mask = kw.get("attn_mask")
    if mask is not None:
        mask = mask.reshape(*((B, H) if mask.dim() == 3 else (1, 1)), N, M).to(device)
    padding = kw.get("key_padding_mask")
    phi = kw.get("phi", "power")
    power = float(kw["power"]) if phi == "power" else 1.0  # (the ops take |x| and ReLU with p = 1)
    return (q, k, v, radius.contiguous(), power, mask, None if padding is None else padding.to(device),
            kw.get("causal", False), kw.get("dropout_p", 0.0), 0, kw.get("normaliser_eps", 0.0), None, phi)
