#!/usr/bin/env python3
"""Runs every kernel instance of the fused op's CUDA path once, forward and backward, for a checker
that watches the kernels run (the GPU check runs it under compute-sanitizer's memcheck, racecheck
and synccheck).

    python scripts/benchmarks/cuda_kernel_cases.py                  # on the GPU
    python scripts/benchmarks/cuda_kernel_cases.py --device cpu     # the same calls through the CPU kernels

The cases are small (a few blocks each, so that an instrumented run takes seconds) and together
launch, per the launcher (csrc/cuda/fourier_attention_launch.h): the table kernel; the tiled forward
at each of its value-column widths (Dv up to 16, 64, 128 and above); the tiled backward's pre-pass
(whole and in two halves), its main pass at each value-column width (Dv up to 4, 8, 16, 32, 64, 128),
with the score cache and without (FOURIERFORMER_SCORE_CACHE_MB=0), split over blocks on a small grid
and whole (FOURIERFORMER_GRID_SPLITS=1), and its dq finish; the decoding forward (few query rows) at
each of its register-row counts, over several key chunks, and the kernel that merges them; the simple kernels (float64, and float32
above the tiled backward's head dims); float16 and bfloat16 inputs; masks, key padding, causal,
dropout, the null key, exact duplicates (the rare path), N and M off the tiles and off multiples of
4, several query and key tiles. It checks only that the outputs are finite where they must be (the
accuracy is the CUDA tests' and the fuzz's). Exit status 0 when every case ran.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import fourierformer_fairseq.ops  # noqa: E402,F401  (loads the extension: registers the fourierformer ops)

# name, (B, H, N, M, D, Dv), dtype, options; options: causal, kpm (key padding as a key bias),
# mask (an additive float mask per head), dropout, eps (the null key), dup (queries equal to keys:
# the rare path), env (set around the case)
CASES = [
    ("Dv 3, causal, key padding, dropout", (2, 1, 20, 41, 5, 3), torch.float32,
     dict(causal=True, kpm=True, dropout=0.2)),
    ("Dv 7, null key, two key tiles", (2, 2, 9, 70, 16, 7), torch.float32, dict(causal=True, eps=1e-9)),
    ("Dv 12, D 100: pre-pass halves, main pass split", (2, 1, 37, 70, 100, 12), torch.float32,
     dict(causal=True, kpm=True, dropout=0.2)),
    ("the same, whole (FOURIERFORMER_GRID_SPLITS=1)", (2, 1, 37, 70, 100, 12), torch.float32,
     dict(causal=True, kpm=True, dropout=0.2, env={"FOURIERFORMER_GRID_SPLITS": "1"})),
    ("Dv 20, D 40, mask, two key tiles", (1, 2, 33, 70, 40, 20), torch.float32, dict(mask=True)),
    ("Dv 40, D 40, no score cache", (2, 1, 69, 70, 40, 40), torch.float32,
     dict(causal=True, kpm=True, env={"FOURIERFORMER_SCORE_CACHE_MB": "0"})),
    ("Dv 128, D 128, N = M = 64 (the IWSLT'14 tile)", (2, 1, 64, 64, 128, 128), torch.float32,
     dict(causal=True, kpm=True, dropout=0.2)),
    ("Dv 100, D 32, tile remainders, duplicates", (1, 1, 65, 130, 32, 100), torch.float32,
     dict(causal=True, dup=True)),
    ("Dv 16, D 16, a large grid (no splits)", (4, 8, 300, 300, 16, 16), torch.float32, dict()),
    ("Dv 160, D 64: the widest tiled forward, the simple backward", (1, 1, 9, 40, 64, 160), torch.float32, dict()),
    ("D 129, Dv 200: the decoding forward, the simple backward", (1, 1, 5, 7, 129, 200), torch.float32,
     dict(eps=0.5)),
    ("decoding, 1 row: three key chunks, key padding", (4, 2, 1, 130, 64, 64), torch.float32, dict(kpm=True)),
    ("decoding, 2 rows: causal, dropout", (2, 2, 2, 70, 16, 16), torch.float32, dict(causal=True, dropout=0.2)),
    ("decoding, 4 rows: mask, null key, D 128", (1, 2, 4, 64, 128, 128), torch.float32, dict(mask=True, eps=1e-6)),
    ("decoding, 8 rows: duplicates, causal", (2, 1, 8, 200, 32, 20), torch.float32, dict(dup=True, causal=True)),
    ("decoding, bfloat16", (2, 2, 5, 40, 16, 16), torch.bfloat16, dict(kpm=True)),
    ("float64: the simple kernels", (2, 1, 37, 45, 59, 33), torch.float64, dict(mask=True, dropout=0.3)),
    ("float16", (1, 2, 17, 40, 16, 16), torch.float16, dict(kpm=True)),
    ("bfloat16", (1, 2, 17, 40, 40, 20), torch.bfloat16, dict(causal=True)),
]


def make_inputs(shape, dtype, options, device, g):
    B, H, N, M, D, Dv = shape

    def randn(*s):
        return torch.randn(*s, generator=g)

    k = randn(B, H, M, D) * 0.5
    q = k[:, :, torch.randint(M, (N,), generator=g)].clone() if options.get("dup") else randn(B, H, N, D) * 0.5
    v = randn(B, H, M, Dv)
    radius = 0.5 + torch.rand(H, D, generator=g)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    key_bias = attn_mask = None
    if options.get("kpm"):
        padding = torch.rand(B, M, generator=g) < 0.25
        padding[:, 0] = False
        key_bias = torch.zeros(B, M).masked_fill(padding, float("-inf")).to(device, acc)
    if options.get("mask"):
        attn_mask = randn(1, H, N, M).to(device, acc)
    return ([t.to(device, dtype) for t in (q, k, v)], radius.to(device, acc), attn_mask, key_bias)


def run_case(name, shape, dtype, options, device, seed):
    g = torch.Generator().manual_seed(seed)
    (q, k, v), radius, attn_mask, key_bias = make_inputs(shape, dtype, options, device, g)
    causal, p = options.get("causal", False), options.get("dropout", 0.0)
    eps = options.get("eps", 0.0)
    saved = {n: os.environ.get(n) for n in options.get("env", {})}
    os.environ.update(options.get("env", {}))
    try:
        tables = torch.ops.fourierformer.fourier_attention_tables(q, k, radius)
        args = (4.0, attn_mask, key_bias, causal, p, seed, eps)
        out, lse = torch.ops.fourierformer.fourier_attention_forward(q, k, v, radius, *args, tables)
        dout = torch.randn(out.shape, generator=g).to(device, dtype)
        grads = torch.ops.fourierformer.fourier_attention_backward(dout, q, k, v, radius, out, lse, *args, tables)
        again = torch.ops.fourierformer.fourier_attention_backward(dout, q, k, v, radius, out, lse, *args)  # own tables
        if device.type == "cuda":
            torch.cuda.synchronize()
    finally:
        for n, value in saved.items():
            if value is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = value
    bad = [label for label, t in zip(("out", "dq", "dk", "dv", "dradius"), (out, *grads)) if not torch.isfinite(t).all()]
    bad += [f"{label} (own tables)" for label, t in zip(("dq", "dk", "dv", "dradius"), again)
            if not torch.isfinite(t).all()]
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("torch sees no GPU (--device cpu runs the same calls through the CPU kernels)", file=sys.stderr)
        return 2
    failures = skipped = 0
    for n, (name, shape, dtype, options) in enumerate(CASES):
        if device.type == "cpu" and dtype not in (torch.float32, torch.float64):
            print(f"--  {name:60s} (the CPU kernels take float32 and float64)")
            skipped += 1
            continue
        t0 = time.perf_counter()
        bad = run_case(name, shape, dtype, options, device, seed=n + 1)
        failures += bool(bad)
        print(f"{'ok ' if not bad else 'BAD'} {name:60s} {time.perf_counter() - t0:6.2f} s"
              + (f"  not finite: {', '.join(bad)}" if bad else ""), flush=True)
    print(f"{len(CASES) - failures - skipped} of {len(CASES)} cases ran with finite outputs on {device.type}"
          + (f" ({skipped} not for this device)" if skipped else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
