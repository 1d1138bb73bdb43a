#!/usr/bin/env python
"""Side-by-side speed and memory of Fourier attention implementations and softmax SDPA.

    python scripts/benchmark_attention.py            # full run (CPU here, CUDA if --device cuda)
    python scripts/benchmark_attention.py --quick    # fewer repetitions and sweep sizes

For each shape it prints the median time of forward and of forward+backward (the fast
implementations timed in alternating rounds, so that they share the machine's load), the peak
extra memory of each, and every time as a ratio to softmax
``torch.nn.functional.scaled_dot_product_attention`` measured in the same run:

  fused      fourier_attention (the fused kernel of this device)
  published  the published code's approach: materialised weights, product of sincs, + 1e-6
  reference  fourier_attention_reference, the pure-PyTorch log-domain implementation
  sdpa       softmax attention at the same shapes

Peak memory: on CUDA, torch.cuda.max_memory_allocated; on CPU (Linux), the growth of the
peak resident set size of a fresh subprocess that runs the call once after a small
warm-up, inputs excluded, outputs and gradients included.
The materialising implementations (published, reference) are reported as skipped rather
than run when one of their (B, H, N, M, D) intermediates would exceed --memory-budget-gib.
A full run takes about half an hour on a 2-core CPU, mostly in those two baselines;
--shapes picks a subset of the shapes, --impls a subset of the implementations.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

IMPLS = ("fused", "published", "reference", "sdpa")


def published_attention(q, k, v, radius, power, causal):
    """The published FourierFormer code's attention: linear-domain product, materialised."""
    x = radius * (q.unsqueeze(-2) - k.unsqueeze(-3))  # (B, H, N, M, D)
    w = (torch.sin(x) / x).pow(power).prod(-1)
    if causal:
        N, M = w.shape[-2:]
        w = w.masked_fill(torch.ones(N, M, dtype=torch.bool, device=w.device).triu(M - N + 1), 0.0)
    return (w @ v) / (w.sum(-1, keepdim=True) + 1e-6)


def make_call(impl, q, k, v, radius, power, causal):
    from fourierformer_fairseq.ops import fourier_attention, fourier_attention_reference

    if impl == "fused":
        backend = "cuda" if q.is_cuda else "cpu"
        return lambda: fourier_attention(q, k, v, radius, power=power, causal=causal, backend=backend)
    if impl == "published":
        return lambda: published_attention(q, k, v, radius, power, causal)
    if impl == "reference":
        return lambda: fourier_attention_reference(q, k, v, radius, power=power, causal=causal)
    if impl == "sdpa":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    raise ValueError(impl)


def make_inputs(shape, device, dtype, requires_grad):
    B, H, N, D = shape["B"], shape["H"], shape["N"], shape["D"]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g).to(device=device, dtype=dtype) for _ in range(3))
    radius = torch.tensor(2.0, device=device)
    for t in (q, k, v, radius):
        t.requires_grad_(requires_grad)
    return q, k, v, radius


def step(call, backward, tensors):
    out = call()
    if backward:
        out.sum().backward()
        for t in tensors:
            t.grad = None


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed_ms(call, tensors, backward, device):
    start = time.perf_counter()
    step(call, backward, tensors)
    sync(device)
    return (time.perf_counter() - start) * 1e3


OUT_OF_ROUNDS = 20.0


def median_ms(calls, backward, device, reps, warmup=2):
    """Median ms of each call in {impl: (call, tensors)}, timed in alternating rounds (one call
    of each implementation per round) so that they share whatever else the machine is doing.
    A call slower than a second, or more than OUT_OF_ROUNDS times slower than the quickest,
    is timed three times, after the others: in the rounds, the materialising baselines'
    temporaries (up to gigabytes) would evict the caches and occupy the memory bus of the fast
    calls they alternate with."""
    last = {}
    for impl, (call, tensors) in calls.items():
        for _ in range(warmup):
            last[impl] = timed_ms(call, tensors, backward, device)
    quickest = min(last.values())
    fast = [impl for impl in calls if last[impl] <= min(1000.0, OUT_OF_ROUNDS * quickest)]
    times = {impl: [] for impl in calls}
    for _ in range(reps):
        for impl in fast:
            times[impl].append(timed_ms(*calls[impl], device=device, backward=backward))
    for impl in calls:
        if impl not in fast:
            times[impl] = [timed_ms(*calls[impl], device=device, backward=backward) for _ in range(min(reps, 3))]
    return {impl: statistics.median(t) for impl, t in times.items()}


def materialised_bytes(shape, dtype):
    """Size of one (B, H, N, M, D) intermediate of the published / reference implementations."""
    return shape["B"] * shape["H"] * shape["N"] * shape["N"] * shape["D"] * torch.tensor([], dtype=dtype).element_size()


def peak_memory_cuda(impl, shape, dtype, backward, power):
    q, k, v, r = make_inputs(shape, "cuda", dtype, backward)
    call = make_call(impl, q, k, v, r, power, shape["causal"])
    step(call, backward, (q, k, v, r))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step(call, backward, (q, k, v, r))
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def probe_cpu_memory(args) -> int:
    """Runs in a fresh process: warm up on a tiny shape, reset the peak resident set size
    (Linux: `5` into /proc/self/clear_refs), run the call once, report the peak's growth."""
    shape = json.loads(args.probe)
    dtype = getattr(torch, args.dtype)
    backward = args.probe_backward
    tiny = dict(shape, B=1, H=1, N=8)
    q, k, v, r = make_inputs(tiny, "cpu", dtype, backward)
    step(make_call(args.probe_impl, q, k, v, r, args.power, shape["causal"]), backward, (q, k, v, r))
    q, k, v, r = make_inputs(shape, "cpu", dtype, backward)
    call = make_call(args.probe_impl, q, k, v, r, args.power, shape["causal"])
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _rss_kib("VmRSS")
    step(call, backward, (q, k, v, r))
    print((_rss_kib("VmHWM") - before) * 1024)
    return 0


def peak_memory_cpu(impl, shape, args, backward):
    cmd = [
        sys.executable, os.path.abspath(__file__), "--probe", json.dumps(shape), "--probe-impl", impl,
        "--dtype", args.dtype, "--power", str(args.power),
    ] + (["--probe-backward"] if backward else [])
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        return None
    return int(result.stdout.strip().splitlines()[-1])


def shapes_for(args):
    shapes = [
        dict(name="WikiText-103 small", B=8, H=8, N=256, D=16, causal=False),
        dict(name="WikiText-103 small, causal", B=8, H=8, N=256, D=16, causal=True),
        dict(name="IWSLT'14", B=32, H=4, N=64, D=128, causal=False),
    ]
    sweep = (256, 1024, 4096) if args.quick else (256, 512, 1024, 2048, 4096)
    shapes += [dict(name=f"sweep N={n}", B=1, H=8, N=n, D=16, causal=False) for n in sweep]
    if args.shapes:
        wanted = [w.strip() for w in args.shapes.split(",") if w.strip()]
        shapes = [s for s in shapes if any(w in s["name"] for w in wanted)]
        if not shapes:
            raise SystemExit(f"--shapes {args.shapes!r} matches none of the benchmark's shapes")
    return shapes


def fmt_ms(x):
    return "-" if x is None else f"{x:.2f}"


def fmt_mib(x):
    return "-" if x is None else f"{x / 2**20:.1f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--power", type=int, default=4)
    parser.add_argument("--reps", type=int, default=None,
                        help="timed rounds (default 20, --quick 5; at most 3 for calls over 1 s)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and sweep sizes")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurements")
    parser.add_argument("--memory-budget-gib", type=float, default=0.5,
                        help="skip the materialising implementations (published, reference) when one (B,H,N,M,D) "
                             "intermediate exceeds this; their peak is about 9x that in forward+backward "
                             "(default 0.5: N=1024 at B=1, H=8, D=16 runs, N=2048 is skipped)")
    parser.add_argument("--shapes", default="",
                        help="comma-separated substrings of shape names to run (e.g. 'causal,N=4096'; default all)")
    parser.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated subset of {IMPLS}")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--probe-impl", help=argparse.SUPPRESS)
    parser.add_argument("--probe-backward", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        return probe_cpu_memory(args)

    from fourierformer_fairseq.ops import backend_unavailable_reason
    from fourierformer_fairseq.ops.extension import extension_status

    dtype = getattr(torch, args.dtype)
    reps = args.reps or (5 if args.quick else 20)
    impls = [i for i in args.impls.split(",") if i]
    reason = backend_unavailable_reason(args.device)
    if "fused" in impls and reason:
        print(f"fused {args.device} backend unavailable ({reason}); dropping it", file=sys.stderr)
        impls.remove("fused")
    status = extension_status()
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"# Fourier attention benchmark: {device_name}, {args.dtype}, p={args.power}, torch {torch.__version__}, "
          f"kernels {status.build.get('cpu_isa', '-') if args.device == 'cpu' else 'cuda'}, median of {reps}")
    print()
    print("| shape | impl | fwd ms | fwd / sdpa | fwd peak MiB | fwd+bwd ms | fwd+bwd / sdpa | fwd+bwd peak MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in shapes_for(args):
        label = f"{shape['name']} (B={shape['B']}, H={shape['H']}, N={shape['N']}, D={shape['D']})"
        rows = {}
        runnable = []
        for impl in impls:
            need = materialised_bytes(shape, dtype)
            if impl in ("published", "reference") and need > args.memory_budget_gib * 2**30:
                rows[impl] = f"skipped: one (B,H,N,M,D) intermediate is {need / 2**30:.1f} GiB"
            else:
                rows[impl] = {}
                runnable.append(impl)
        for backward in (False, True):
            calls = {}
            for impl in runnable:
                q, k, v, r = make_inputs(shape, args.device, dtype, backward)
                calls[impl] = (make_call(impl, q, k, v, r, args.power, shape["causal"]), (q, k, v, r))
            for impl, ms in median_ms(calls, backward, args.device, reps).items():
                rows[impl][("ms", backward)] = ms
            del calls
            for impl in runnable:
                if args.no_memory:
                    rows[impl][("mem", backward)] = None
                elif args.device == "cuda":
                    rows[impl][("mem", backward)] = peak_memory_cuda(impl, shape, dtype, backward, args.power)
                else:
                    rows[impl][("mem", backward)] = peak_memory_cpu(impl, shape, args, backward)
        print(f"  measured {label}", file=sys.stderr, flush=True)
        # (rows keep the order of --impls)
        sdpa = rows.get("sdpa")
        for impl, result in rows.items():
            if isinstance(result, str):
                print(f"| {label} | {impl} | {result} | | | | | |")
                continue
            ratio = ["-", "-"]
            if isinstance(sdpa, dict):
                ratio = [f"{result[('ms', b)] / sdpa[('ms', b)]:.2f}x" for b in (False, True)]
            print(f"| {label} | {impl} | {fmt_ms(result[('ms', False)])} | {ratio[0]} | {fmt_mib(result[('mem', False)])} "
                  f"| {fmt_ms(result[('ms', True)])} | {ratio[1]} | {fmt_mib(result[('mem', True)])} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
