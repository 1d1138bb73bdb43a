#!/usr/bin/env python
"""Side-by-side speed and memory of Fourier attention implementations and softmax SDPA.

    python scripts/benchmarks/benchmark_attention.py            # full run (CPU here, CUDA if --device cuda)
    python scripts/benchmarks/benchmark_attention.py --quick    # fewer repetitions and sweep sizes
    python scripts/benchmarks/benchmark_attention.py --decoding # the forward at decoding shapes (N 1 to 8)
    python scripts/benchmarks/benchmark_attention.py --scaling  # N = 256 ... 16384 at one head shape, with crossovers
    python scripts/benchmarks/benchmark_attention.py --profile  # also the fused op's non-kernel time (torch.profiler)
    python scripts/benchmarks/benchmark_attention.py --profile-only --shapes small,IWSLT  # that alone, at some shapes

For each shape it prints the median time of forward and of forward+backward (the fast
implementations timed in alternating rounds, so that they share the machine's load), the peak
extra memory of each, and every time as a ratio to softmax
``torch.nn.functional.scaled_dot_product_attention`` measured in the same run:

  fused      fourier_attention (the fused kernel of this device)
  fused_unsplit  the same with FOURIERFORMER_GRID_SPLITS=1: the CUDA backward's work not split
             where its grid is small (CUDA only; a control elsewhere, where nothing splits)
  published  the published code's approach: materialised weights, product of sincs, + 1e-6
  reference  fourier_attention_reference, the pure-PyTorch log-domain implementation
  sdpa       softmax attention at the same shapes
  performer  FAVOR+ random-feature softmax attention (ops.favor.favor_attention, kernel "softmax"),
             round(d ln d) orthogonal features, as PerformerMultiheadAttention's default
  fourier_rf the random-feature Fourier kernel (kernel "fourier_rf"), 16 frequencies
             (528 features), radius 2 as the others, as the module's default
  gfnet      the global filter (ops.global_filter.global_filter): an FFT long convolution of the
             values per channel (H x D channels), filter taps for N positions (causal: lags 0..N-1,
             else -(N-1)..N-1), O(N log N); q and k unused

The default run times the first four (--impls adds the sub-quadratic ops to it). --profile
adds, after that table, the fused op's cost outside its kernels, per forward+backward call under
torch.profiler (see profile_fused): the ATen ops and the device launches outside the fused
kernels, the host time outside them, the device time of the fused kernels and of everything
else, and the non-kernel share of the call's wall time. --scaling
instead sweeps N = 256, 512, ..., 16384 at one head shape (--scaling-shape, default B=1, H=4,
D=64) for fused, sdpa, performer, fourier_rf and gfnet, without and with the causal mask, forward
and forward+backward, and prints one table of times, ratios and peak memory and then, for each
sub-quadratic op (the linear-time ones and gfnet), the crossover N against each exact one: the
smallest N of the sweep from which it is faster at every larger N ("none up to N" if it is not faster at the largest). There a row
runs up to --reps alternating rounds (default 10) but stops after --min-reps (default 3) once its
rounds have taken --row-budget-s (default 20 s), so the largest N gets fewer rounds; the rounds
column says how many each row had.

Peak memory: on CUDA, torch.cuda.max_memory_allocated; on CPU (Linux), the growth of the
peak resident set size of a fresh subprocess that runs the call once after a small
warm-up, inputs excluded, outputs and gradients included.
The materialising implementations (published, reference) are reported as skipped rather
than run when one of their (B, H, N, M, D) intermediates would exceed --memory-budget-gib.
A full run on a small CPU takes most of its time in those two baselines;
--shapes picks a subset of the shapes, --impls a subset of the implementations.
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

IMPLS = ("fused", "published", "reference", "sdpa")  # the default run's implementations
LINEAR_IMPLS = ("performer", "fourier_rf")
FUSED_IMPLS = ("fused", "fused_unsplit")
#: the ops that are not quadratic in N: the --scaling crossovers are theirs against the exact ones
SUBQUADRATIC_IMPLS = LINEAR_IMPLS + ("gfnet",)
ALL_IMPLS = IMPLS + ("fused_unsplit",) + SUBQUADRATIC_IMPLS
MATERIALISING = ("published", "reference")
SCALING_IMPLS = ("fused", "sdpa") + SUBQUADRATIC_IMPLS
SCALING_SIZES = tuple(256 * 2 ** i for i in range(7))  # 256 ... 16384
QUICK_SCALING_SIZES = (256, 512, 1024)
#: the seed of the linear-time ops' random features (ops.favor.feature_seed)
FEATURE_SEED = 0


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
    if impl == "fused_unsplit":
        fused = make_call("fused", q, k, v, radius, power, causal)

        def unsplit():  # (the launcher reads the variable at each call; the backward runs within)
            before = os.environ.get("FOURIERFORMER_GRID_SPLITS")
            os.environ["FOURIERFORMER_GRID_SPLITS"] = "1"
            try:
                return fused()
            finally:
                if before is None:
                    del os.environ["FOURIERFORMER_GRID_SPLITS"]
                else:
                    os.environ["FOURIERFORMER_GRID_SPLITS"] = before
        return unsplit
    if impl == "published":
        return lambda: published_attention(q, k, v, radius, power, causal)
    if impl == "reference":
        return lambda: fourier_attention_reference(q, k, v, radius, power=power, causal=causal)
    if impl == "sdpa":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if impl == "gfnet":
        from fourierformer_fairseq.ops.global_filter import global_filter

        B, H, N, D = v.shape
        g = torch.Generator().manual_seed(FEATURE_SEED)
        taps = (torch.randn(H * D, N if causal else 2 * N - 1, generator=g) * 0.02).to(device=v.device, dtype=v.dtype)
        taps.requires_grad_(v.requires_grad)
        return lambda: global_filter(v.transpose(-1, -2).reshape(B, H * D, N), taps, causal)
    if impl in LINEAR_IMPLS:
        from fourierformer_fairseq.ops.favor import favor_attention

        kernel, projection = linear_projection(impl, q.size(-1), power)
        projection = projection.to(q.device)
        if kernel == "fourier_rf":
            return lambda: favor_attention(q, k, v, projection, kernel=kernel, causal=causal, radius=radius)
        return lambda: favor_attention(q, k, v, projection, kernel=kernel, causal=causal)
    raise ValueError(impl)


def linear_projection(impl, head_dim, power):
    """(kernel, projection) of a linear-time op: the module's default feature count and draw."""
    from fourierformer_fairseq.ops.favor import default_num_features, draw_projection, feature_seed

    kernel = "softmax" if impl == "performer" else "fourier_rf"
    m = default_num_features(head_dim, kernel)
    return kernel, draw_projection(kernel, m, head_dim, feature_seed(FEATURE_SEED, "benchmark"), power=power)


def linear_features(impl, head_dim):
    """(m, feature dimension) of a linear-time op at head_dim."""
    from fourierformer_fairseq.ops.favor import default_num_features

    if impl == "performer":
        m = default_num_features(head_dim, "softmax")
        return m, m
    m = default_num_features(head_dim, "fourier_rf")
    return m, m * (2 * m + 1)


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


def median_ms(calls, backward, device, reps, warmup=2, budget_s=None, min_reps=3):
    """Median ms of each call in {impl: (call, tensors)}, timed in alternating rounds (one call
    of each implementation per round) so that they share whatever else the machine is doing.
    A materialising baseline (published, reference) slower than a second, or more than
    OUT_OF_ROUNDS times slower than the quickest, is timed three times, after the others: in
    the rounds, its temporaries (up to gigabytes) would evict the caches and occupy the memory
    bus of the fast calls it alternates with. With ``budget_s``, the rounds stop after
    ``min_reps`` once they have taken that many seconds. Returns ({impl: ms}, rounds run)."""
    last = {}
    for impl, (call, tensors) in calls.items():
        for _ in range(warmup):
            last[impl] = timed_ms(call, tensors, backward, device)
    quickest = min(last.values())
    fast = [impl for impl in calls
            if impl not in MATERIALISING or last[impl] <= min(1000.0, OUT_OF_ROUNDS * quickest)]
    times = {impl: [] for impl in calls}
    start = time.perf_counter()
    rounds = 0
    for _ in range(reps):
        for impl in fast:
            times[impl].append(timed_ms(*calls[impl], device=device, backward=backward))
        rounds += 1
        if budget_s is not None and rounds >= min_reps and time.perf_counter() - start >= budget_s:
            break
    for impl in calls:
        if impl not in fast:
            times[impl] = [timed_ms(*calls[impl], device=device, backward=backward) for _ in range(min(reps, 3))]
    return {impl: statistics.median(t) for impl, t in times.items()}, rounds


def materialised_bytes(shape, dtype):
    """Size of one (B, H, N, M, D) intermediate of the published / reference implementations."""
    return shape["B"] * shape["H"] * shape["N"] * shape["N"] * shape["D"] * torch.tensor([], dtype=dtype).element_size()


def skip_reason(impl, shape, dtype, args):
    """Why impl is not run at this shape (a materialising one over the memory budget), or None."""
    need = materialised_bytes(shape, dtype)
    if impl in MATERIALISING and need > args.memory_budget_gib * 2**30:
        return f"skipped: one (B,H,N,M,D) intermediate is {need / 2**30:.1f} GiB"
    if impl == "fused_unsplit" and args.device != "cuda":
        return "skipped: only the CUDA kernels split their grid"
    if impl == "fourier_rf" and args.power % 2:
        return f"skipped: fourier_rf needs an even power, got {args.power}"
    return None


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
        # a 4096-token batch of sentences of a typical length (the kernels' 64 x 64 tiles mostly empty)
        dict(name="IWSLT'14 sentences", B=144, H=4, N=28, D=128, causal=False),
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


def fmt_ratio(x):
    if x is None:
        return "-"
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.3f}x"


def run_shapes(args, impls, dtype, reps):
    """The default run: one table row per (shape, implementation); returns the rows as records
    (--json), with the (query, key, feature) elements of one call (B H N M D)."""
    records = []
    print("| shape | impl | fwd ms | fwd / sdpa | fwd peak MiB | fwd+bwd ms | fwd+bwd / sdpa | fwd+bwd peak MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in shapes_for(args):
        label = f"{shape['name']} (B={shape['B']}, H={shape['H']}, N={shape['N']}, D={shape['D']})"
        rows = {}
        runnable = []
        for impl in impls:
            reason = skip_reason(impl, shape, dtype, args)
            if reason:
                rows[impl] = reason
            else:
                rows[impl] = {}
                runnable.append(impl)
        for backward in (False, True):
            calls = {}
            for impl in runnable:
                q, k, v, r = make_inputs(shape, args.device, dtype, backward)
                calls[impl] = (make_call(impl, q, k, v, r, args.power, shape["causal"]), (q, k, v, r))
            for impl, ms in (median_ms(calls, backward, args.device, reps)[0] if calls else {}).items():
                rows[impl][("ms", backward)] = ms
            del calls
            for impl in runnable:
                rows[impl][("mem", backward)] = peak_memory(impl, shape, args, dtype, backward)
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
            records.append({"shape": shape["name"], "label": label, "impl": impl, "causal": shape["causal"],
                            "elements": shape["B"] * shape["H"] * shape["N"] * shape["N"] * shape["D"],
                            "fwd_ms": result[("ms", False)], "fwd_bwd_ms": result[("ms", True)],
                            "sdpa_fwd_ms": sdpa[("ms", False)] if isinstance(sdpa, dict) else None,
                            "sdpa_fwd_bwd_ms": sdpa[("ms", True)] if isinstance(sdpa, dict) else None,
                            "fwd_peak_mib": result[("mem", False)], "fwd_bwd_peak_mib": result[("mem", True)]})
            print(f"| {label} | {impl} | {fmt_ms(result[('ms', False)])} | {ratio[0]} | {fmt_mib(result[('mem', False)])} "
                  f"| {fmt_ms(result[('ms', True)])} | {ratio[1]} | {fmt_mib(result[('mem', True)])} |", flush=True)
    return records


# The decoding calls of beam search and incremental LM decoding: a few query rows (one per beam for
# self-attention; the beams of a sentence for beamable encoder-decoder attention) over M cached keys.
# (name, B, H, N, M, D): IWSLT'14 at beam 5 x 16 sentences, a D-64 model, the small LM at batch 8
DECODING_SHAPES = (
    [("IWSLT'14 self, beam 5 x 16", 80, 4, 1, m, 128) for m in (1, 8, 30, 100)]
    + [("IWSLT'14 beamable cross, 16 sentences", 16, 4, n, 28, 128) for n in (2, 5, 8)]
    + [("IWSLT'14 N rows", 80, 4, n, 30, 128) for n in (2, 4)]
    + [("D 64, beam 5 x 8", 40, 8, 1, m, 64) for m in (30, 128)]
    + [("WikiText-103 small LM step", 8, 8, 1, m, 16) for m in (1, 64, 256)]
)
DECODING_IMPLS = ("fused", "fused_table", "sdpa")


def run_decoding(args, dtype, reps):
    """--decoding: the forward at each decoding shape, no gradients: the fused op as a decoding step
    calls it (``fused_table``: with the key table it keeps between steps, built outside the timed
    call), the op alone (``fused``: the kernel transposes the keys itself) and sdpa, in alternating
    rounds; the ratios to sdpa."""
    from fourierformer_fairseq.ops import fourier_attention, key_table

    records = []
    print("| shape (B, H, N, M, D) | fused ms | fused_table ms | sdpa ms | fused / sdpa | fused_table / sdpa |")
    print("|---|---|---|---|---|---|")
    for name, B, H, N, M, D in DECODING_SHAPES:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, n, D, generator=g).to(device=args.device, dtype=dtype) for n in (N, M, M))
        radius = torch.tensor(0.36, device=args.device)
        backend = "cuda" if args.device == "cuda" else "cpu"
        table = key_table(k)
        calls = {
            "fused": (lambda: fourier_attention(q, k, v, radius, power=args.power, backend=backend), (q, k, v)),
            "fused_table": (lambda: fourier_attention(q, k, v, radius, power=args.power, backend=backend,
                                                      key_table=table), (q, k, v)),
            "sdpa": (lambda: F.scaled_dot_product_attention(q, k, v), (q, k, v)),
        }
        with torch.no_grad():
            ms = median_ms(calls, False, args.device, reps)[0]
        label = f"{name} ({B}, {H}, {N}, {M}, {D})"
        records.append({"shape": label, **{f"{impl}_ms": ms[impl] for impl in DECODING_IMPLS}})
        print(f"| {label} | {ms['fused']:.3f} | {ms['fused_table']:.3f} | {ms['sdpa']:.3f} | "
              f"{ms['fused'] / ms['sdpa']:.2f}x | {ms['fused_table'] / ms['sdpa']:.2f}x |", flush=True)
    return records


def peak_memory(impl, shape, args, dtype, backward):
    if args.no_memory:
        return None
    if args.device == "cuda":
        return peak_memory_cuda(impl, shape, dtype, backward, args.power)
    return peak_memory_cpu(impl, shape, args, backward)


# ----------------------------------------------------------------------------- --profile

#: the fused ops of the extension (csrc/fourier_attention_ops.cpp): the profile must hold them
FUSED_OPS = ("fourierformer::fourier_attention_forward", "fourierformer::fourier_attention_backward")
#: on CPU, the record scopes around the kernels' loops (csrc/cpu/fourier_attention_cpu.cpp): their
#: time is the kernels'; the rest of the fused ops (checks, copies, allocations) is not
CPU_KERNEL_SCOPES = ("fourierformer::cpu_forward_kernel", "fourierformer::cpu_backward_kernel")
#: on CUDA a device event is a fused kernel when its name says so (all of them live in this namespace)
FUSED_KERNEL_NAMESPACE = "fourierformer::"
#: the record_function label of one profiled forward+backward call
PROFILE_STEP = "benchmark_attention: fused forward+backward"


def profile_step(shape, device, dtype, power):
    """(step, tensors): one forward+backward call of the fused op on seeded inputs, the output
    gradient drawn once beforehand, so that the step holds nothing but the op and its backward
    (no loss, no .sum()). The caller drops the gradients after each step (outside its time)."""
    from fourierformer_fairseq.ops import fourier_attention

    q, k, v, r = make_inputs(shape, device, dtype, True)
    backend = "cuda" if device == "cuda" else "cpu"
    g = torch.Generator().manual_seed(1)
    dout = torch.randn(shape["B"], shape["H"], shape["N"], shape["D"], generator=g).to(device=device, dtype=dtype)

    def step():
        out = fourier_attention(q, k, v, r, power=power, causal=shape["causal"], backend=backend)
        torch.autograd.backward(out, dout)

    return step, (q, k, v, r)


def profiled_events(step, tensors, device, calls):
    """torch.profiler's events of ``calls`` steps, each under the PROFILE_STEP label and followed
    (outside it) by a synchronisation and the gradients' reset."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sync(device)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            with record_function(PROFILE_STEP):
                step()
            sync(device)
            for t in tensors:
                t.grad = None
    return prof.events()


def summarise_profile(events, calls, device):
    """Per-call counts and times (microseconds) of a profile of ``calls`` steps (profiled_events).
    Counts are the mean per call (they do not vary); host times the median over the calls (a
    busy machine preempts some of them); device times the mean.

      aten_ops          ATen ops outside the fused kernels: every aten:: event, nested ones included
                        (each is one dispatch), also those the fused ops' C++ calls
      aten_top          those not called by another ATen op (what the Python wrapper, the autograd
                        engine and the fused ops' C++ call directly)
      host_us           the call's host time outside the fused kernels: on CPU its time less that of
                        the kernel scopes (CPU_KERNEL_SCOPES), on CUDA all of it (the kernels run on
                        the device)
      fused_us          the fused kernels: on CPU the kernel scopes' time, on CUDA the device time of
                        the kernels of the fourierformer:: namespace
      other_device_us   CUDA: the device time of every other kernel, copy and fill (None on CPU)
      fused_launches, other_launches   CUDA: device kernels, copies and fills of each (None on CPU)
      ops               {name: (count, own host us)} per call of every host event outside the kernels
                        (ATen ops, the fused ops' own time, autograd nodes, runtime calls)
      non_kernel_share  CPU: the median over the calls of host time / call time (CUDA: profile_fused's)
    """
    from torch.autograd import DeviceType

    host = [e for e in events if e.device_type == DeviceType.CPU]
    steps = sorted((e for e in host if e.name == PROFILE_STEP), key=lambda e: e.time_range.start)
    if len(steps) != calls:
        raise RuntimeError(f"the profile holds {len(steps)} steps, expected {calls}")
    if not any(e.name in FUSED_OPS for e in host):
        raise RuntimeError(f"no {' or '.join(FUSED_OPS)} in the profile: the call did not run the fused op")
    starts = [e.time_range.start for e in steps]

    def step_of(e):  # the step whose time holds e's start (the backward may run on another thread)
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        return i if i >= 0 and e.time_range.start <= steps[i].time_range.end else None

    scopes = [e for e in host if e.name in CPU_KERNEL_SCOPES]
    if device != "cuda" and not scopes:
        raise RuntimeError(f"no {' or '.join(CPU_KERNEL_SCOPES)} in the profile: the extension predates "
                           "its kernel scopes; rebuild it")
    kernel_us = [0.0] * calls
    for e in scopes:
        i = step_of(e)
        if i is not None:
            kernel_us[i] += e.time_range.elapsed_us()
    aten = [e for e in host if e.name.startswith("aten::")]
    aten_top = [e for e in aten if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    own = {}  # name -> [count, own us in each step]
    for e in host:
        if e.name == PROFILE_STEP or e.name in CPU_KERNEL_SCOPES:
            continue
        i = step_of(e)
        entry = own.setdefault(e.name, [0, [0.0] * calls])
        entry[0] += 1
        if i is not None:
            entry[1][i] += e.self_cpu_time_total
    step_us = [e.time_range.elapsed_us() for e in steps]
    record = dict(calls=calls, aten_ops=len(aten) / calls, aten_top=len(aten_top) / calls,
                  ops={name: (count / calls, statistics.median(us)) for name, (count, us) in own.items()})
    if device == "cuda":
        on_device = [e for e in events if e.device_type == DeviceType.CUDA]
        if not on_device:
            raise RuntimeError("the profile holds no device events (torch.profiler without CUPTI?)")
        fused = [e for e in on_device if FUSED_KERNEL_NAMESPACE in e.name]
        other = [e for e in on_device if FUSED_KERNEL_NAMESPACE not in e.name]
        record.update(host_us=statistics.median(step_us),
                      fused_us=sum(e.time_range.elapsed_us() for e in fused) / calls,
                      other_device_us=sum(e.time_range.elapsed_us() for e in other) / calls,
                      fused_launches=len(fused) / calls, other_launches=len(other) / calls)
    else:
        record.update(host_us=statistics.median(t - k for t, k in zip(step_us, kernel_us)),
                      fused_us=statistics.median(kernel_us), other_device_us=None,
                      fused_launches=None, other_launches=None,
                      non_kernel_share=statistics.median(1.0 - k / t for t, k in zip(step_us, kernel_us)))
    return record


def profile_fused(shape, device, dtype, power, calls, warmup=3):
    """The fused op's cost outside its kernels at one shape (summarise_profile's record), with
    the median wall time of an unprofiled call (synchronised; the profiler's own cost per event
    inflates host_us, not wall_us) and, on CUDA, the non-kernel share of it, 1 - fused_us / wall_us
    (on CPU summarise_profile's, from the same profiled calls: kernel and wall times of separate
    calls differ by more than the overhead on a loaded machine)."""
    step, tensors = profile_step(shape, device, dtype, power)
    for _ in range(warmup):
        timed_ms(step, tensors, False, device)
        for t in tensors:
            t.grad = None
    wall = []
    for _ in range(calls):
        wall.append(timed_ms(step, tensors, False, device) * 1e3)
        for t in tensors:
            t.grad = None
    record = summarise_profile(profiled_events(step, tensors, device, calls), calls, device)
    record["wall_us"] = statistics.median(wall)
    if device == "cuda":
        record["non_kernel_share"] = max(0.0, 1.0 - record["fused_us"] / record["wall_us"])
    return record


def fmt_count(x):
    return "-" if x is None else (f"{x:.0f}" if x == int(x) else f"{x:.1f}")


def fmt_us(x):
    return "-" if x is None else f"{x:.0f}"


PROFILE_HEADER = ("| shape | ATen ops / call (not nested) | other launches / call | host us / call outside kernels "
                  "| fused kernels us / call | other device us / call | wall us / call | non-kernel share |")


def profile_row(label, rec):
    return (f"| {label} | {fmt_count(rec['aten_ops'])} ({fmt_count(rec['aten_top'])}) | {fmt_count(rec['other_launches'])} "
            f"| {fmt_us(rec['host_us'])} | {fmt_us(rec['fused_us'])} | {fmt_us(rec['other_device_us'])} "
            f"| {fmt_us(rec['wall_us'])} | {rec['non_kernel_share']:.1%} |")


def top_ops_line(rec, n=8):
    """The host events outside the fused ops that cost the most, per call: 'name xcount (us)'."""
    top = sorted(rec["ops"].items(), key=lambda kv: -kv[1][1])[:n]
    return ", ".join(f"{name} x{fmt_count(count)} ({us:.0f} us)" for name, (count, us) in top)


def run_profile(args, dtype, calls):
    """The --profile table: one row per shape, then each shape's costliest non-kernel events."""
    if args.device == "cuda":
        how = ("fused kernels = the device time of the fourierformer:: kernels; wall = median of "
               f"{calls} unprofiled synchronised calls; non-kernel share = 1 - fused / wall")
    else:
        how = ("fused kernels = the time in the CPU kernels' scopes (the kernel loops); wall = median of "
               f"{calls} unprofiled calls; non-kernel share = median over the profiled calls of host / (host + fused)")
    print(f"## fused op outside its kernels: forward+backward, {calls} profiled calls per shape "
          f"(torch.profiler; host and fused: median per call; {how})")
    print()
    print(PROFILE_HEADER)
    print("|---|---|---|---|---|---|---|---|")
    records, details = [], []
    for shape in shapes_for(args):
        label = f"{shape['name']} (B={shape['B']}, H={shape['H']}, N={shape['N']}, D={shape['D']})"
        try:
            rec = profile_fused(shape, args.device, dtype, args.power, calls)
        except RuntimeError as e:  # a row that says why, and the other shapes still run
            print(f"| {label} | profile failed: {e} | | | | | | |", flush=True)
            records.append(dict(shape=shape["name"], label=label, causal=shape["causal"], error=str(e)))
            continue
        print(profile_row(label, rec), flush=True)
        details.append(f"- {shape['name']}: {top_ops_line(rec)}")
        records.append(dict(rec, shape=shape["name"], label=label, causal=shape["causal"]))
    print()
    print("Costliest host events outside the fused kernels, per call (own time under the profiler):")
    print()
    for line in details:
        print(line)
    return records


# ----------------------------------------------------------------------------- --scaling

#: (causal, backward) groups of the scaling table, in their order, and their names
SCALING_GROUPS = ((False, False), (False, True), (True, False), (True, True))


def group_name(causal, backward):
    return ("causal " if causal else "") + ("fwd+bwd" if backward else "fwd")


def crossover(sizes, fast_ms, slow_ms):
    """Where an op starts to beat another: (the smallest N of ``sizes`` from which
    ``fast_ms[N] < slow_ms[N]`` at that N and every larger one, or None if it is not faster at
    the largest; the largest N compared). Sizes where either time is missing (None or absent:
    not run) are left out of the comparison; (None, None) when no size has both."""
    compared = [n for n in sorted(sizes) if fast_ms.get(n) is not None and slow_ms.get(n) is not None]
    if not compared:
        return None, None
    found = None
    for n in reversed(compared):
        if fast_ms[n] < slow_ms[n]:
            found = n
        else:
            break
    return found, compared[-1]


def fmt_crossover(found, largest):
    if largest is None:
        return "-"
    return f"N = {found}" if found is not None else f"none up to {largest}"


def scaling_shape(args):
    try:
        B, H, D = (int(x) for x in args.scaling_shape.split(","))
    except ValueError:
        raise SystemExit(f"--scaling-shape takes B,H,D (three integers), got {args.scaling_shape!r}")
    return B, H, D


def scaling_sizes(args):
    if args.sizes:
        try:
            return sorted({int(n) for n in args.sizes.split(",") if n.strip()})
        except ValueError:
            raise SystemExit(f"--sizes takes comma-separated integers, got {args.sizes!r}")
    return list(QUICK_SCALING_SIZES if args.quick else SCALING_SIZES)


def measure_scaling(args, impls, dtype, reps):
    """Rows {N, causal, backward, ms {impl: ms or None}, mem {impl: bytes or None}, rounds}."""
    B, H, D = scaling_shape(args)
    rows = []
    for N in scaling_sizes(args):
        for causal in (False, True):
            shape = dict(name=f"scaling N={N}" + (", causal" if causal else ""), B=B, H=H, N=N, D=D, causal=causal)
            runnable = [impl for impl in impls if not skip_reason(impl, shape, dtype, args)]
            for backward in (False, True):
                calls = {}
                for impl in runnable:
                    q, k, v, r = make_inputs(shape, args.device, dtype, backward)
                    calls[impl] = (make_call(impl, q, k, v, r, args.power, causal), (q, k, v, r))
                ms, rounds = (median_ms(calls, backward, args.device, reps, warmup=1, budget_s=args.row_budget_s,
                                       min_reps=min(args.min_reps, reps)) if calls else ({}, 0))
                del calls
                mem = {impl: peak_memory(impl, shape, args, dtype, backward) for impl in runnable}
                rows.append(dict(N=N, causal=causal, backward=backward, rounds=rounds,
                                 ms={impl: ms.get(impl) for impl in impls}, mem={impl: mem.get(impl) for impl in impls}))
                print(f"  measured N={N} {group_name(causal, backward)}: "
                      + ", ".join(f"{impl} {fmt_ms(ms.get(impl))} ms {fmt_mib(mem.get(impl))} MiB" for impl in impls)
                      + f" ({rounds} rounds)", file=sys.stderr, flush=True)
    return rows


def scaling_report(impls, rows):
    """The scaling table and the crossover table (markdown lines) from measure_scaling's rows."""
    linear = [impl for impl in impls if impl in SUBQUADRATIC_IMPLS]
    exact = [impl for impl in impls if impl not in SUBQUADRATIC_IMPLS]
    header = (["mask", "pass", "N"] + [f"{impl} ms" for impl in impls]
              + [f"{a} / {b}" for a in linear for b in exact] + [f"{impl} MiB" for impl in impls] + ["rounds"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for causal, backward in SCALING_GROUPS:
        for row in sorted((r for r in rows if (r["causal"], r["backward"]) == (causal, backward)), key=lambda r: r["N"]):
            ms = row["ms"]
            ratios = [fmt_ratio(ms[a] / ms[b] if ms.get(a) is not None and ms.get(b) is not None else None)
                      for a in linear for b in exact]
            cells = (["causal" if causal else "none", "fwd+bwd" if backward else "fwd", str(row["N"])]
                     + [fmt_ms(ms.get(impl)) for impl in impls] + ratios
                     + [fmt_mib(row["mem"].get(impl)) for impl in impls] + [str(row["rounds"])])
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Crossover N (the smallest N of the sweep from which the sub-quadratic op is faster at every larger N):", ""]
    header = ["sub-quadratic op", "against"] + [group_name(c, b) for c, b in SCALING_GROUPS]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for a in linear:
        for b in exact:
            cells = [a, b]
            for causal, backward in SCALING_GROUPS:
                group = [r for r in rows if (r["causal"], r["backward"]) == (causal, backward)]
                sizes = [r["N"] for r in group]
                cells.append(fmt_crossover(*crossover(sizes, {r["N"]: r["ms"].get(a) for r in group},
                                                      {r["N"]: r["ms"].get(b) for r in group})))
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def run_scaling(args, impls, dtype, reps):
    B, H, D = scaling_shape(args)
    features = [f"{impl} m={m} ({dim} features)" for impl in impls if impl in LINEAR_IMPLS
                for m, dim in [linear_features(impl, D)]]
    print(f"# scaling: B={B}, H={H}, D={D}, N = {', '.join(map(str, scaling_sizes(args)))}"
          + (f"; {', '.join(features)}" if features else "")
          + f"; up to {reps} alternating rounds per row, at least {min(args.min_reps, reps)}, "
          f"fewer past {args.row_budget_s:g} s")
    print()
    for line in scaling_report(impls, measure_scaling(args, impls, dtype, reps)):
        print(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--power", type=int, default=4)
    parser.add_argument("--reps", type=int, default=None,
                        help="timed rounds (default 20, --quick 5; --scaling 10, --scaling --quick 3; "
                             "at most 3 for the materialising baselines' calls over 1 s)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and sweep sizes")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurements")
    parser.add_argument("--json", metavar="PATH", help="also write the table's rows as JSON (not with --scaling)")
    parser.add_argument("--memory-budget-gib", type=float, default=0.5,
                        help="skip the materialising implementations (published, reference) when one (B,H,N,M,D) "
                             "intermediate exceeds this; their peak is several times that in forward+backward "
                             "(default 0.5: N=1024 at B=1, H=8, D=16 runs, N=2048 is skipped)")
    parser.add_argument("--shapes", default="",
                        help="comma-separated substrings of shape names to run (e.g. 'causal,N=4096'; default all)")
    parser.add_argument("--impls", default=None,
                        help=f"comma-separated subset of {ALL_IMPLS} (default {','.join(IMPLS)}; "
                             f"with --scaling {','.join(SCALING_IMPLS)})")
    parser.add_argument("--profile", action="store_true",
                        help="after the table, the fused op's ATen ops, launches and time outside its kernels per "
                             "forward+backward call at each shape (torch.profiler; also in --json as 'profile')")
    parser.add_argument("--profile-only", action="store_true", help="--profile without the speed table")
    parser.add_argument("--scaling", action="store_true",
                        help="sweep N at one head shape instead, with the sub-quadratic ops' crossover N")
    parser.add_argument("--scaling-shape", default="1,4,64", help="B,H,D of --scaling (default 1,4,64)")
    parser.add_argument("--sizes", default="",
                        help="comma-separated N of --scaling (default 256,512,...,16384; --quick 256,512,1024)")
    parser.add_argument("--min-reps", type=int, default=3, help="--scaling: rounds a row gets at least (default 3)")
    parser.add_argument("--row-budget-s", type=float, default=20.0,
                        help="--scaling: no further rounds once a row's rounds have taken this long (default 20)")
    parser.add_argument("--decoding", action="store_true",
                        help="the forward at beam search's and incremental decoding's shapes (a few query rows over "
                             "cached keys) instead, with and without the key table, against sdpa")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--probe-impl", help=argparse.SUPPRESS)
    parser.add_argument("--probe-backward", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        return probe_cpu_memory(args)

    from fourierformer_fairseq.ops import backend_unavailable_reason
    from fourierformer_fairseq.ops.extension import extension_status

    dtype = getattr(torch, args.dtype)
    if args.scaling:
        reps = args.reps or (3 if args.quick else 10)
    else:
        reps = args.reps or (5 if args.quick else 20)
    impls = [i.strip() for i in (args.impls or ",".join(SCALING_IMPLS if args.scaling else IMPLS)).split(",") if i.strip()]
    unknown = [i for i in impls if i not in ALL_IMPLS]
    if unknown:
        raise SystemExit(f"--impls: unknown {unknown}; choose from {ALL_IMPLS}")
    if (args.profile or args.profile_only) and args.scaling:
        raise SystemExit("--profile goes with the default run's shapes, not with --scaling")
    reason = backend_unavailable_reason(args.device)
    if reason and any(i in FUSED_IMPLS for i in impls):
        print(f"fused {args.device} backend unavailable ({reason}); dropping it", file=sys.stderr)
        impls = [i for i in impls if i not in FUSED_IMPLS]
    status = extension_status()
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"# Fourier attention benchmark: {device_name}, {args.dtype}, p={args.power}, torch {torch.__version__}, "
          f"kernels {status.build.get('cpu_isa', '-') if args.device == 'cpu' else 'cuda'}, median of {reps}")
    print()
    if args.decoding:
        records = run_decoding(args, dtype, reps)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"device": device_name, "dtype": args.dtype, "power": args.power, "reps": reps,
                           "torch": torch.__version__, "decoding": records}, fh, indent=1)
    elif args.scaling:
        run_scaling(args, impls, dtype, reps)
    else:
        records = [] if args.profile_only else run_shapes(args, impls, dtype, reps)
        profile = None
        if args.profile or args.profile_only:
            if records:
                print()
            if reason:
                print(f"(--profile: the fused {args.device} backend is unavailable: {reason})")
            else:
                profile = run_profile(args, dtype, reps)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"device": device_name, "dtype": args.dtype, "power": args.power, "reps": reps,
                           "torch": torch.__version__, "rows": records, "profile": profile}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
