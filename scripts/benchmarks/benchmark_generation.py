#!/usr/bin/env python3
"""Generation speed: each FourierFormer against its softmax twin, side by side in one process.

  mt  beam search of the IWSLT'14 model (fourierformer_iwslt_de_en / transformer_iwslt_de_en)
      with fairseq's SequenceGenerator, each model prepared as fairseq-generate prepares it
      (beamable encoder-decoder attention, weights from the alignment layer only):
      --sentences source sentences of --source-len tokens, every
      hypothesis exactly --target-len tokens (min and max length pinned, so both models do the
      same number of steps whatever their random weights predict), beam --beam
  cli the stock fairseq-generate on checkpoints of the translation pair (random weights: one update
      of fairseq-train at a learning rate of 1e-9 on random-word sentences binarised by
      fairseq-preprocess), the same sentences and pinned lengths, each run a process of its own;
      the time is the one fairseq-generate prints ("Translated ... in Xs"), without its start-up
  lm  incremental decoding of the small WikiText-103 LM (fourierformer_lm_wiki103_small /
      softmax_lm_wiki103_small): --lm-batch sequences fed a token at a time up to --lm-tokens,
      through the decoder's incremental state, as fairseq's generators drive it

Both models of a shape are built from one seed with random weights (the speed of a step does
not depend on what the weights say), then timed in alternating rounds (twin, Fourier, twin, ...)
so that a change in the machine's load falls on both; the median of each is reported with the
ratio, at each --threads. Inference only (eval mode, no gradients).

    python scripts/benchmarks/benchmark_generation.py [--shapes mt,lm] [--threads 1,2] [--rounds 5]
                                              [--out runs/generation.json]
    python scripts/benchmarks/benchmark_generation.py --small      # 32-dim models of a layer or two (seconds)

--profile also prints torch.profiler's table of one round of each model (the op's kernel scope,
fourierformer::cpu_forward_kernel, and the copies around it). Results go in
docs/records/speed.md; the targets are in docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
USER_DIR = os.path.join(REPO, "fourierformer_fairseq")
sys.path.insert(0, HERE)
# the same models, and the same --small shapes, as Table 9's benchmark
from benchmark_model import MODELS, SMALL_DIMS, build_with_task  # noqa: E402


def build(arch: str, shape: str, vocab: int, context: int, extra: list):
    """A model of `arch` with random weights in eval mode, and its task's target dictionary (as
    benchmark_model.py builds its models)."""
    model, task = build_with_task(arch, vocab, context, extra, USER_DIR, shape)
    model.eval()
    return model, task.target_dictionary


def translation_round(args, model, tgt_dict):
    """One beam search over the benchmark's sentences; returns its function and the hypotheses' lengths."""
    import torch
    from fairseq.sequence_generator import SequenceGenerator

    # as fairseq-generate prepares a model (prepare_for_inference_): beamable encoder-decoder attention
    # at the beam size, and attention weights from the alignment layer only
    model.make_generation_fast_(beamable_mm_beam_size=args.beam, need_attn=False)
    gen = SequenceGenerator([model], tgt_dict, beam_size=args.beam, max_len_a=0, max_len_b=args.target_len,
                            min_len=args.target_len)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(tgt_dict.nspecial, len(tgt_dict), (args.sentences, args.source_len), generator=g)
    src[:, -1] = tgt_dict.eos()
    sample = {"net_input": {"src_tokens": src.to(args.device),
                            "src_lengths": torch.full((args.sentences,), args.source_len, dtype=torch.long,
                                                      device=args.device)}}

    def run():
        with torch.no_grad():
            out = gen.generate([model], sample)
        _sync(args.device)
        return out

    return run


def lm_round(args, model, vocab: int):
    """Incremental decoding of --lm-batch sequences, a token at a time, up to --lm-tokens."""
    import torch

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, vocab, (args.lm_batch, args.lm_tokens), generator=g).to(args.device)

    def run():
        state = {}
        with torch.no_grad():
            for t in range(args.lm_tokens):
                model.decoder(tokens[:, : t + 1], incremental_state=state)
        _sync(args.device)
        return state

    return run


def cli_setup(args, workdir: str, threads: int) -> dict:
    """The stock command line: random-word sentences binarised by fairseq-preprocess (a joined
    dictionary of --vocab words), each model of the translation pair trained for one update (a
    checkpoint of random weights with its own config), and each one's fairseq-generate command."""
    import random
    import subprocess

    from fourierformer_fairseq.fairseq_runs import fairseq_command

    rng = random.Random(1)
    words = [f"w{i}" for i in range(args.vocab - 4)]
    raw = os.path.join(workdir, "raw")
    os.makedirs(raw, exist_ok=True)
    for split, n in (("train", args.sentences), ("test", args.sentences)):
        for lang in ("de", "en"):
            with open(os.path.join(raw, f"{split}.{lang}"), "w") as fh:
                fh.writelines(" ".join(rng.choice(words) for _ in range(args.source_len - 1)) + "\n" for _ in range(n))
    with open(os.path.join(raw, "dict.txt"), "w") as fh:
        fh.writelines(f"{w} 1\n" for w in words)
    data = os.path.join(workdir, "data-bin")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    def run(cmd):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{cmd[0]} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")

    run(fairseq_command("fairseq-preprocess") + [
        "-s", "de", "-t", "en", "--trainpref", os.path.join(raw, "train"), "--testpref", os.path.join(raw, "test"),
        "--destdir", data, "--srcdict", os.path.join(raw, "dict.txt"), "--joined-dictionary", "--workers", "1"])
    commands = {}
    for name, arch in MODELS["mt"]:
        save = os.path.join(workdir, arch)
        print(f"[generation] cli: a checkpoint of {name} ({arch}, one update)", file=sys.stderr, flush=True)
        run(fairseq_command("fairseq-train") + [
            data, "--user-dir", USER_DIR, "--arch", arch, "--share-decoder-input-output-embed", "--optimizer", "adam",
            "--lr", "1e-9", "--max-tokens", "1024", "--max-update", "1", "--save-dir", save, "--cpu",
            "--no-epoch-checkpoints", "--disable-validation", "--seed", "1", "--num-workers", "0",
            "--required-batch-size-multiple", "1"]
            + (SMALL_DIMS["mt"] if args.small else []) + args.extra)
        commands[name] = fairseq_command("fairseq-generate") + [
            data, "--user-dir", USER_DIR, "--path", os.path.join(save, "checkpoint_last.pt"), "--gen-subset", "test",
            "--beam", str(args.beam), "--batch-size", str(args.sentences), "--max-len-a", "0",
            "--max-len-b", str(args.target_len), "--min-len", str(args.target_len), "--num-workers", "0",
            "--required-batch-size-multiple", "1"] + (["--cpu"] if args.device == "cpu" else [])
    return commands


def cli_round(command: list, threads: int):
    """One fairseq-generate run: returns its own generation time (its 'Translated ... in Xs' line) and
    the wall time of the process."""
    import re
    import subprocess

    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads)))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"fairseq-generate failed:\n{proc.stderr[-3000:]}")
    found = re.search(r"Translated [\d,]+ sentences \([\d,]+ tokens\) in ([\d.]+)s", proc.stdout + proc.stderr)
    if not found:
        raise SystemExit(f"fairseq-generate printed no 'Translated ... in Xs' line:\n{proc.stderr[-2000:]}")
    return float(found.group(1)), wall


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def side_by_side(fns: dict, rounds: int) -> dict:
    """Median seconds of each function, timed in alternating rounds after one warm-up each."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def check_same_lengths(fns: dict) -> None:
    """Both models of the translation benchmark generate hypotheses of the pinned length."""
    lengths = {name: sorted({len(h[0]["tokens"]) for h in fn()}) for name, fn in fns.items()}
    if len(set(map(tuple, lengths.values()))) != 1:
        raise SystemExit(f"the models generated hypotheses of different lengths: {lengths}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="mt,lm",
                   help="mt (beam search, IWSLT'14), lm (incremental LM decoding), cli (the stock fairseq-generate "
                        "on the translation pair's checkpoints, in its own processes)")
    p.add_argument("--threads", default="1,2", help="torch threads, a comma-separated list")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds of each model (the median is reported)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--sentences", type=int, default=16)
    p.add_argument("--source-len", type=int, default=28, help="source tokens per sentence, </s> included")
    p.add_argument("--target-len", type=int, default=30, help="tokens of every hypothesis, </s> excluded")
    p.add_argument("--vocab", type=int, default=8000, help="dictionary size of each side (mt)")
    p.add_argument("--lm-batch", type=int, default=8)
    p.add_argument("--lm-tokens", type=int, default=256, help="tokens decoded per sequence (the small LM's context)")
    p.add_argument("--lm-vocab", type=int, default=267744, help="the LM's vocabulary (WikiText-103's)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when torch sees a GPU)")
    p.add_argument("--small", action="store_true",
                   help="benchmark_model.py's --small models (32-dim, a layer or two), short sequences (seconds)")
    p.add_argument("--profile", action="store_true", help="torch.profiler's table of one round of each model")
    p.add_argument("--out", help="JSON results")
    p.add_argument("extra", nargs="*", help="extra model arguments for both models (after --)")
    args = p.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    if not shapes or any(s not in MODELS and s != "cli" for s in shapes):
        p.error(f"--shapes takes {', '.join(MODELS)} and cli, got {args.shapes!r}")
    try:
        threads = [int(t) for t in args.threads.split(",") if t]
    except ValueError:
        threads = []
    if not threads or min(threads) < 1:
        p.error(f"--threads takes positive integers, got {args.threads!r}")
    if args.small:
        args.sentences, args.source_len, args.target_len, args.vocab = 4, 8, 6, 100
        args.lm_batch, args.lm_tokens, args.lm_vocab, args.rounds = 2, 12, 100, min(args.rounds, 3)

    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for shape in shapes:
        if shape == "cli":
            with tempfile.TemporaryDirectory(prefix="ffgen-cli-") as workdir:
                commands = cli_setup(args, workdir, threads[0])
                twin, fourier = (name for name, _ in MODELS["mt"])
                for n in threads:
                    print(f"[generation] cli: {args.rounds} alternating fairseq-generate runs, {n} thread(s)",
                          file=sys.stderr, flush=True)
                    times = {name: [] for name in commands}
                    for _ in range(args.rounds):
                        for name, command in commands.items():
                            times[name].append(cli_round(command, n))
                    gen = {name: statistics.median(t[0] for t in ts) for name, ts in times.items()}
                    wall = {name: statistics.median(t[1] for t in ts) for name, ts in times.items()}
                    rows.append({"shape": "cli", "threads": n, "softmax_s": gen[twin], "fourier_s": gen[fourier],
                                 # (fairseq prints tenths of a second: a tiny run may read 0.0s)
                                 "ratio": gen[fourier] / gen[twin] if gen[twin] > 0 else float("nan"),
                                 "softmax_wall_s": wall[twin],
                                 "fourier_wall_s": wall[fourier]})
            continue
        extra = (SMALL_DIMS[shape] if args.small else []) + args.extra
        fns = {}
        for name, arch in MODELS[shape]:
            torch.manual_seed(0)
            print(f"[generation] building {name} ({arch})", file=sys.stderr, flush=True)
            if shape == "mt":
                model, tgt_dict = build(arch, shape, args.vocab, 1024, extra)
                fns[name] = translation_round(args, model.to(args.device), tgt_dict)
            else:
                model, tgt_dict = build(arch, shape, args.lm_vocab, max(args.lm_tokens, 1), extra)
                fns[name] = lm_round(args, model.to(args.device), len(tgt_dict))
        if shape == "mt":
            check_same_lengths(fns)
        twin, fourier = (name for name, _ in MODELS[shape])
        for n in threads:
            torch.set_num_threads(n)
            print(f"[generation] {shape}: {args.rounds} alternating rounds, {n} thread(s)", file=sys.stderr, flush=True)
            med = side_by_side(fns, args.rounds)
            rows.append({"shape": shape, "threads": n, "softmax_s": med[twin], "fourier_s": med[fourier],
                         "ratio": med[fourier] / med[twin]})
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            torch.set_num_threads(threads[0])
            for name in (twin, fourier):
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    fns[name]()
                print(f"{name}, one round, {threads[0]} thread(s):")
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))

    what = {"mt": f"beam {args.beam}, {args.sentences} sentences of {args.source_len} -> {args.target_len} tokens, "
                  f"vocab {args.vocab}",
            "cli": f"fairseq-generate, its own time ('Translated ... in'), beam {args.beam}, {args.sentences} "
                   f"sentences of {args.source_len} -> {args.target_len} tokens, vocab {args.vocab}",
            "lm": f"{args.lm_batch} sequences x {args.lm_tokens} tokens, vocab {args.lm_vocab}"}
    print("| shape | what | threads | softmax twin s | FourierFormer s | ratio |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {what[r['shape']]} | {r['threads']} | {r['softmax_s']:.3f} | {r['fourier_s']:.3f} | "
              f"{r['ratio']:.2f}x |")
    print(f"median of {args.rounds} alternating rounds after a warm-up; {args.device}, torch {torch.__version__}, "
          f"CPU kernels: {_cpu_isa()}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "rows": rows}, fh, indent=1)
        print(f"-> {args.out}")
    return 0


def _cpu_isa() -> str:
    from fourierformer_fairseq.ops.extension import extension_status

    status = extension_status()
    return status.module.cpu_isa if status.loaded else "none (extension not loaded)"


if __name__ == "__main__":
    sys.exit(main())
