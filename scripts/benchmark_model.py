#!/usr/bin/env python3
"""Table 9 of the FourierFormer paper: efficiency of the small language model.

Builds the small WikiText-103 LM twice, FourierFormer (fourierformer_lm_wiki103_small) and
softmax (softmax_lm_wiki103_small), feeds both the same random batch (B sequences of the
training context), and measures, side by side:

  training   ms per sequence of a full step (forward, cross-entropy, backward, Adam step)
  inference  ms per sequence of a forward pass without gradients
  memory     peak memory of each: on a GPU torch.cuda.max_memory_allocated (MB); on the CPU
             the peak resident set size of the process (ru_maxrss, MB) that ran only that
             model and mode (each measurement runs in its own subprocess)

It runs on the GPU when torch sees one (--device cuda), else on the CPU.

    python scripts/benchmark_model.py [--batch-size 8] [--context 256] [--vocab 267744] [--out runs/benchmark.json]

The vocabulary sets the size of the output layer (WikiText-103's is 267,744 with fairseq's
specials); with a smaller one (e.g. --vocab 33278, WikiText-2's) the attention's share of
the time is larger. --small: a 2-layer 32-dim model, context 32, batch 2 (seconds).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MODELS = (("softmax small", "softmax_lm_wiki103_small"), ("fourier small", "fourierformer_lm_wiki103_small"))
SMALL_DIMS = ["--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
              "--decoder-attention-heads", "2"]


def build(arch: str, vocab: int, context: int, extra: list[str], user_dir: str):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    tmp = tempfile.mkdtemp(prefix="ffbench-")
    with open(os.path.join(tmp, "dict.txt"), "w") as fh:
        for i in range(vocab - 4):  # fairseq adds <s>, <pad>, </s>, <unk>
            fh.write(f"w{i} 1\n")
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [tmp, "--task", "language_modeling", "--arch", arch, "--user-dir", user_dir,
                                               "--tokens-per-sample", str(context), "--dropout", "0.1"] + extra)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return task.build_model(cfg.model), len(task.source_dictionary)


def worker(args) -> dict:
    import resource

    import torch

    torch.manual_seed(0)
    dev = torch.device(args.device)
    extra = SMALL_DIMS if args.small else []
    model, vocab = build(args.arch, args.vocab, args.context, extra + args.extra, args.user_dir)
    model.to(dev)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, vocab, (args.batch_size, args.context + 1), generator=g).to(dev)
    src, tgt = tokens[:, :-1], tokens[:, 1:]
    params = sum(p.numel() for p in model.parameters())

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.mode == "train":
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            out, _ = model(src)
            loss = torch.nn.functional.cross_entropy(out.float().reshape(-1, out.shape[-1]), tgt.reshape(-1))
            loss.backward()
            opt.step()
    else:
        model.eval()

        def step():
            with torch.no_grad():
                model(src)
    for _ in range(args.warmup):
        step()
    sync()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    median = times[len(times) // 2]
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
        peak_what = "torch.cuda.max_memory_allocated"
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        peak_what = "process peak RSS (ru_maxrss)"
    return {"arch": args.arch, "mode": args.mode, "params": params, "ms_per_sample": 1000 * median / args.batch_size,
            "step_ms_median": 1000 * median, "step_ms_all": [round(1000 * t, 2) for t in times],
            "peak_mem_mb": peak, "peak_mem_kind": peak_what, "rss_before_steps_mb": rss0, "vocab": vocab,
            "threads": torch.get_num_threads()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--vocab", type=int, default=267744)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="timed steps (the median is reported)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--out", help="JSON results (for make_tables.py --benchmark)")
    p.add_argument("--user-dir", default=os.path.join(REPO, "fourierformer_fairseq"))
    p.add_argument("--small", action="store_true", help="2-layer 32-dim models, context 32, batch 2, vocab 1000")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--arch", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("train", "infer"), help=argparse.SUPPRESS)
    p.add_argument("extra", nargs="*", help="extra model arguments for both models (after --)")
    args = p.parse_args(argv)
    if args.small:
        args.context, args.batch_size, args.vocab = 32, 2, 1000
        args.warmup, args.steps = 1, 3
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.worker:
        print("RESULT " + json.dumps(worker(args)))
        return 0

    rows = []
    for name, arch in MODELS:
        row = {"name": name, "arch": arch}
        for mode in ("train", "infer"):
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--arch", arch, "--mode", mode,
                   "--batch-size", str(args.batch_size), "--context", str(args.context), "--vocab", str(args.vocab),
                   "--warmup", str(args.warmup), "--steps", str(args.steps), "--device", args.device,
                   "--user-dir", args.user_dir] + (["--small"] if args.small else []) + (["--"] + args.extra if args.extra else [])
            print(f"[benchmark] {name}: {mode} ({args.device}, batch {args.batch_size}, context {args.context}, vocab {args.vocab})",
                  file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode != 0 or not line:
                sys.stderr.write(proc.stderr[-3000:])
                raise SystemExit(f"benchmark of {arch} ({mode}) failed (exit {proc.returncode})")
            r = json.loads(line[0][7:])
            row["params"] = r["params"]
            row[f"{mode}_ms_per_sample"] = r["ms_per_sample"]
            row[f"{mode}_peak_mem_mb"] = r["peak_mem_mb"]
            row[f"{mode}_step_ms_all"] = r["step_ms_all"]
            row["peak_mem_kind"] = r["peak_mem_kind"]
            row["threads"] = r["threads"]
        rows.append(row)

    device = args.device
    if device == "cuda":
        import torch

        device = f"cuda ({torch.cuda.get_device_name(0)})"
    res = {"device": device, "batch_size": args.batch_size, "context": args.context, "vocab": args.vocab,
           "warmup": args.warmup, "steps": args.steps, "small": args.small, "models": rows}
    print(f"| model | params | train ms/sample | inference ms/sample | train peak MB | inference peak MB |")
    print(f"|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['params']:,} | {r['train_ms_per_sample']:.2f} | {r['infer_ms_per_sample']:.2f} | "
              f"{r['train_peak_mem_mb']:.0f} | {r['infer_peak_mem_mb']:.0f} |")
    print(f"device {device}, batch {args.batch_size} x context {args.context}, vocab {args.vocab}, "
          f"median of {args.steps} steps after {args.warmup} warm-up; memory: {rows[0]['peak_mem_kind']}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        json.dump(res, open(args.out, "w"), indent=1)
        print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
