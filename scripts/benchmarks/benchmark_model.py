#!/usr/bin/env python3
"""Table 9 of the FourierFormer paper: efficiency of the small language model.

Builds each model twice, FourierFormer and its softmax twin, feeds both the same random batch,
and measures, side by side:

  lm  the small WikiText-103 LM (fourierformer_lm_wiki103_small / softmax_lm_wiki103_small),
      B sequences of the training context (the paper's Table 9)
  mt  the IWSLT'14 translation model (fourierformer_iwslt_de_en / transformer_iwslt_de_en),
      B sentence pairs of --context tokens each side (--shapes lm,mt)

at each --precision: fp32, or fp16 / bf16 with the parameters cast as fairseq's --fp16 / --bf16
do (the optimiser steps the half-precision parameters directly, without fairseq's float32 master
copy, which costs both models the same):

  training   ms per sequence of a full step (forward, cross-entropy, backward, Adam step)
  inference  ms per sequence of a forward pass without gradients
  memory     peak memory of each: on a GPU torch.cuda.max_memory_allocated (MB); on the CPU
             the peak resident set size of the process (ru_maxrss, MB) that ran only that
             model and mode (each measurement runs in its own subprocess)

It runs on the GPU when torch sees one (--device cuda), else on the CPU.

    python scripts/benchmarks/benchmark_model.py [--batch-size B] [--context N] [--vocab V] [--shapes lm[,mt]]
                                      [--precision fp32[,fp16,bf16]] [--out runs/benchmark.json]

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
REPO = os.path.dirname(os.path.dirname(HERE))
# shape -> (name, arch) of the softmax twin and the FourierFormer, in that order
MODELS = {
    "lm": (("softmax small", "softmax_lm_wiki103_small"), ("fourier small", "fourierformer_lm_wiki103_small")),
    "mt": (("softmax iwslt", "transformer_iwslt_de_en"), ("fourier iwslt", "fourierformer_iwslt_de_en")),
}
SMALL_DIMS = {
    "lm": ["--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
           "--decoder-attention-heads", "2"],
    "mt": ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
           "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
           "--decoder-attention-heads", "2"],
}
PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# shape -> (batch, context, vocabulary) unless --batch-size / --context / --vocab say otherwise: the
# paper's LM batch with WikiText-103's vocabulary, and IWSLT-length sentences (the attention
# benchmark's IWSLT shape, B 32 x N 64) with a joint BPE vocabulary of IWSLT'14's size
DEFAULT_BATCH = {"lm": (8, 256, 267744), "mt": (32, 64, 10000)}


def build(arch: str, vocab: int, context: int, extra: list[str], user_dir: str, shape: str = "lm"):
    """A model of `arch` with random weights and the size of its dictionary."""
    model, task = build_with_task(arch, vocab, context, extra, user_dir, shape)
    return model, len(task.source_dictionary)


def build_with_task(arch: str, vocab: int, context: int, extra: list[str], user_dir: str, shape: str = "lm"):
    """A model of `arch` with random weights, and its fairseq task (a dictionary of `vocab` words a side)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    tmp = tempfile.mkdtemp(prefix="ffbench-")
    for name in ("dict.txt",) if shape == "lm" else ("dict.de.txt", "dict.en.txt"):
        with open(os.path.join(tmp, name), "w") as fh:
            for i in range(vocab - 4):  # fairseq adds <s>, <pad>, </s>, <unk>
                fh.write(f"w{i} 1\n")
    if shape == "lm":
        task = ["--task", "language_modeling", "--tokens-per-sample", str(context), "--dropout", "0.1"]
    else:
        task = ["--task", "translation", "-s", "de", "-t", "en", "--share-decoder-input-output-embed", "--dropout", "0.3"]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [tmp, "--arch", arch, "--user-dir", user_dir] + task + extra)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return task.build_model(cfg.model), task


def worker(args) -> list[dict]:
    """Measures one model in one mode at each precision (one process: on a GPU the peak is reset
    between precisions; on the CPU main() runs one precision per process, ru_maxrss never falls)."""
    import torch

    dev = torch.device(args.device)
    extra = SMALL_DIMS[args.shape] if args.small else []
    results = []
    for precision in args.precision.split(","):
        torch.manual_seed(0)
        model, vocab = build(args.arch, args.vocab, args.context, extra + args.extra, args.user_dir, args.shape)
        model.to(device=dev, dtype=getattr(torch, PRECISIONS[precision]))
        results.append(measure(args, model, vocab, dev, precision))
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return results


def measure(args, model, vocab: int, dev, precision: str) -> dict:
    import resource

    import torch

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, vocab, (args.batch_size, args.context + 1), generator=g).to(dev)
    src, tgt = tokens[:, :-1], tokens[:, 1:]
    if args.shape == "lm":
        inputs = (src,)
    else:  # a pair of the same length each side; teacher forcing on the shifted target
        lengths = torch.full((args.batch_size,), args.context, dtype=torch.long, device=dev)
        inputs = (src, lengths, src)
    params = sum(p.numel() for p in model.parameters())

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.mode == "train":
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-4 if precision != "fp32" else 1e-8)

        def step():
            opt.zero_grad(set_to_none=True)
            out, _ = model(*inputs)
            loss = torch.nn.functional.cross_entropy(out.float().reshape(-1, out.shape[-1]), tgt.reshape(-1))
            loss.backward()
            opt.step()
    else:
        model.eval()

        def step():
            with torch.no_grad():
                model(*inputs)
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
    return {"arch": args.arch, "mode": args.mode, "precision": precision, "params": params,
            "ms_per_sample": 1000 * median / args.batch_size,
            "step_ms_median": 1000 * median, "step_ms_all": [round(1000 * t, 2) for t in times],
            "peak_mem_mb": peak, "peak_mem_kind": peak_what, "rss_before_steps_mb": rss0, "vocab": vocab,
            "threads": torch.get_num_threads()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=None, help="sequences (default 8 lm, 32 mt)")
    p.add_argument("--context", type=int, default=None, help="tokens per sequence (default 256 lm, 64 mt)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary (default 267744 lm, 10000 mt)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="timed steps (the median is reported)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--shapes", default="lm", help="lm (the paper's Table 9), mt (the IWSLT model), or lm,mt")
    p.add_argument("--precision", default="fp32", help="fp32, fp16, bf16 or a comma-separated list (default fp32)")
    p.add_argument("--out", help="JSON results (for make_tables.py --benchmark)")
    p.add_argument("--user-dir", default=os.path.join(REPO, "fourierformer_fairseq"))
    p.add_argument("--small", action="store_true", help="2-layer 32-dim models, context 32, batch 2, vocab 1000")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--arch", help=argparse.SUPPRESS)
    p.add_argument("--shape", default="lm", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("train", "infer"), help=argparse.SUPPRESS)
    p.add_argument("extra", nargs="*", help="extra model arguments for both models (after --)")
    args = p.parse_args(argv)
    shapes = [x for x in args.shapes.split(",") if x]
    precisions = [x for x in args.precision.split(",") if x]
    bad = [x for x in shapes if x not in MODELS] + [x for x in precisions if x not in PRECISIONS]
    if bad or not shapes or not precisions:
        p.error(f"unknown --shapes / --precision value(s) {bad}: shapes are {', '.join(MODELS)}, "
                f"precisions {', '.join(PRECISIONS)}")
    fixed = (args.batch_size, args.context, args.vocab)
    if args.small:
        fixed = (2, 32, 1000)
        args.warmup, args.steps = 1, 3

    def set_shape(shape):
        args.batch_size, args.context, args.vocab = (f or d for f, d in zip(fixed, DEFAULT_BATCH[shape]))

    if args.worker:
        set_shape(args.shape)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.worker:
        print("RESULT " + json.dumps(worker(args)))
        return 0

    # on the CPU one process per precision (the peak RSS cannot be reset); on a GPU one for all
    groups = [precisions] if args.device == "cuda" else [[x] for x in precisions]
    rows = []
    for shape in shapes:
        set_shape(shape)
        for name, arch in MODELS[shape]:
            by_precision = {x: {"name": name if x == "fp32" else f"{name} ({x})", "arch": arch, "shape": shape,
                                "precision": x, "batch_size": args.batch_size, "context": args.context,
                                "vocab": args.vocab}
                            for x in precisions}
            for mode in ("train", "infer"):
                for group in groups:
                    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--arch", arch, "--shape", shape,
                           "--mode", mode, "--precision", ",".join(group),
                           "--batch-size", str(args.batch_size), "--context", str(args.context), "--vocab", str(args.vocab),
                           "--warmup", str(args.warmup), "--steps", str(args.steps), "--device", args.device,
                           "--user-dir", args.user_dir] + (["--small"] if args.small else []) + (["--"] + args.extra if args.extra else [])
                    print(f"[benchmark] {name}: {mode} {','.join(group)} ({args.device}, batch {args.batch_size}, "
                          f"context {args.context}, vocab {args.vocab})", file=sys.stderr, flush=True)
                    proc = subprocess.run(cmd, capture_output=True, text=True)
                    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                    if proc.returncode != 0 or not line:
                        sys.stderr.write(proc.stderr[-3000:])
                        raise SystemExit(f"benchmark of {arch} ({mode}, {','.join(group)}) failed (exit {proc.returncode})")
                    for r in json.loads(line[0][7:]):
                        row = by_precision[r["precision"]]
                        row["params"] = r["params"]
                        row[f"{mode}_ms_per_sample"] = r["ms_per_sample"]
                        row[f"{mode}_peak_mem_mb"] = r["peak_mem_mb"]
                        row[f"{mode}_step_ms_all"] = r["step_ms_all"]
                        row["peak_mem_kind"] = r["peak_mem_kind"]
                        row["threads"] = r["threads"]
            rows.extend(by_precision.values())

    device = args.device
    if device == "cuda":
        import torch

        device = f"cuda ({torch.cuda.get_device_name(0)})"
    res = {"device": device, "batch_size": rows[0]["batch_size"], "context": rows[0]["context"], "vocab": rows[0]["vocab"],
           "warmup": args.warmup, "steps": args.steps, "small": args.small, "models": rows}
    twin = {(r["shape"], r["precision"]): r for r in rows if r["name"].startswith("softmax")}
    print("| model | precision | batch x context, vocab | params | train ms/sample | vs softmax | inference ms/sample | "
          "vs softmax | train peak MB | inference peak MB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t = twin[(r["shape"], r["precision"])]
        r["train_vs_softmax"] = r["train_ms_per_sample"] / t["train_ms_per_sample"]
        r["infer_vs_softmax"] = r["infer_ms_per_sample"] / t["infer_ms_per_sample"]
        print(f"| {r['name']} | {r['precision']} | {r['batch_size']} x {r['context']}, {r['vocab']} | {r['params']:,} | {r['train_ms_per_sample']:.2f} | "
              f"{r['train_vs_softmax']:.2f}x | {r['infer_ms_per_sample']:.2f} | {r['infer_vs_softmax']:.2f}x | "
              f"{r['train_peak_mem_mb']:.0f} | {r['infer_peak_mem_mb']:.0f} |")
    print(f"device {device}, "
          f"median of {args.steps} steps after {args.warmup} warm-up; memory: {rows[0]['peak_mem_kind']}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        json.dump(res, open(args.out, "w"), indent=1)
        print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
