#!/usr/bin/env python3
"""The GPU check: everything a user does on a GPU, in one run, with one summary table.

    bash scripts/gpu_check.sh [--out DIR] [--data-bin DIR] [--raw DIR] [--wheels DIR]
                              [--updates N] [--steps install,tests,attention,table9,train,evaluate]
    bash scripts/gpu_check.sh --dry-run     # on a machine without a GPU: every step but the GPU's

Steps (each logs to OUT/<step>*.log; the table at the end says what each measured):

  install    scripts/install.sh (with --wheels DIR: offline, from the wheels in DIR), then
             `python -m fourierformer_fairseq.info`, which must say the cuda backend is available
  tests      the CUDA tests: tests/test_cuda_kernels.py, tests/test_cuda_fuzz.py (seeded fuzz against
             the float64 oracle, every dtype), tests/test_cuda_module.py (half-precision parameters,
             autocast, incremental decoding, dropout seed)
  attention  scripts/benchmark_attention.py --device cuda --quick (the WikiText-103 small, IWSLT and
             N 256 / 1024 / 4096 shapes, fused against sdpa), with the forward's elements/s
  table9     scripts/benchmark_model.py: training and inference ms per sequence and peak memory,
             Fourier against its softmax twin, the LM and the IWSLT model, fp32, fp16 and bf16
  train      stock fairseq-train with --fp16 and with --amp: the IWSLT'14 architecture on Multi30k
             and the WikiText-103 small LM on WikiText-2, Fourier and its softmax twin, --updates
             updates each at full size (stock fairseq's --bf16 means a TPU: fairseq/options.py sets
             --tpu with it, so bfloat16 is checked by the tests and Table 9, not by fairseq-train)
  evaluate   fairseq-generate --fp16 (beam 5, BLEU; incremental decoding) and fairseq-eval-lm --fp16
             (perplexity) on the GPU, on the --fp16 runs

What fails the check: a step's command failing, any CUDA test failing, the cuda backend not
available after the install, and per trained pair: the Fourier loss not falling like the twin's
(its drop from the first to the last logged update below 0.8 times the twin's, or its best
validation loss above the twin's by more than 5 %), more overflow-skipped updates than the twin.
Timings (ms per update: the median over the logged intervals after the first third of fairseq's
own updates per second) and scores are reported, never judged. Exit status 1 if anything failed.

Data: OUT/data-bin (or --data-bin) holds multi30k.de-en/ and wikitext-2/, binarised by the recipes'
prepare scripts (examples/iwslt14/prepare.sh, examples/wikitext103/prepare.sh); when they are
missing they are prepared from --raw (default ../shared/data: multi30k/*.xz, wikitext-2/*.xz).
--dry-run runs on the CPU: the install and the tests as they are (the CUDA tests skip), the
benchmarks at small sizes, and the trainings with tiny models for a few updates in float32
(fairseq's --fp16 needs a GPU, and it takes --bf16 --cpu for a TPU).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # this checkout's package (its log reader, once the install has run)
USER_DIR = os.path.join(REPO, "fourierformer_fairseq")
STEPS = ("install", "tests", "attention", "table9", "train", "evaluate")
CUDA_TESTS = ("tests/test_cuda_kernels.py", "tests/test_cuda_fuzz.py", "tests/test_cuda_module.py")

# The trained pairs: (task, Fourier arch, softmax twin)
PAIRS = {
    "mt": ("fourierformer_iwslt_de_en", "transformer_iwslt_de_en"),
    "lm": ("fourierformer_lm_wiki103_small", "softmax_lm_wiki103_small"),
}
TINY = {  # --dry-run model sizes
    "mt": ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
           "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
           "--decoder-attention-heads", "2"],
    "lm": ["--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
           "--decoder-attention-heads", "2"],
}
LOSS_DROP_FRACTION = 0.8  # the Fourier loss must drop at least this fraction of the twin's drop
VALID_SLACK = 1.05  # and end no more than 5 % above the twin's validation loss


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Check:
    def __init__(self, out: str):
        self.out = out
        self.rows: list[tuple[str, str, float, str]] = []  # (step, PASS/FAIL/SKIP, seconds, what)

    def record(self, step: str, status: str, seconds: float, what: str) -> None:
        self.rows.append((step, status, seconds, what))
        log(f"{step}: {status} ({seconds:.0f} s) {what}")

    def run(self, name: str, cmd: list[str], env: dict | None = None) -> tuple[int, str]:
        """Runs cmd, output to OUT/name.log; returns (exit status, output)."""
        path = os.path.join(self.out, f"{name}.log")
        log(f"{name}: {' '.join(cmd)}  (log: {path})")
        lines: list[str] = []
        with open(path, "w") as fh:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                                    env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})), bufsize=1)
            for line in proc.stdout:
                fh.write(line)
                fh.flush()  # (tail -f OUT/name.log follows a step)
                lines.append(line)
            rc = proc.wait()
        return rc, "".join(lines)


# ------------------------------------------------------------------------------------- steps

def step_install(check: Check, args) -> None:
    t0 = time.perf_counter()
    env = {"WHEELS": os.path.abspath(args.wheels)} if args.wheels else {}
    rc, text = check.run("install", ["bash", "scripts/install.sh"], env=env)
    if rc != 0:
        check.record("install", "FAIL", time.perf_counter() - t0, f"scripts/install.sh exited {rc}: {tail(text)}")
        return
    info = text[text.find("extension:"):] if "extension:" in text else text
    first = info.splitlines()[0] if info else "?"
    cuda_ok = re.search(r"^\s*cuda\s+available", info, re.M) is not None
    if args.gpu and not cuda_ok:
        check.record("install", "FAIL", time.perf_counter() - t0, f"the cuda backend is not available: {first}")
    else:
        check.record("install", "PASS", time.perf_counter() - t0, first + ("; cuda backend available" if cuda_ok else ""))


def step_tests(check: Check, args) -> None:
    t0 = time.perf_counter()
    rc, text = check.run("tests", [sys.executable, "-m", "pytest", "-q", "-rfEs", *CUDA_TESTS])
    summary = pytest_summary(text)
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    bad = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    if rc not in (0, 5) or bad:
        check.record("tests", "FAIL", time.perf_counter() - t0, summary or f"pytest exited {rc}")
    elif not args.gpu:
        check.record("tests", "SKIP" if counts.get("passed", 0) == 0 else "PASS", time.perf_counter() - t0,
                     f"{summary} (no GPU: the CUDA tests skip)")
    elif counts.get("passed", 0) == 0:
        check.record("tests", "FAIL", time.perf_counter() - t0, f"nothing ran on the GPU: {summary}")
    else:
        check.record("tests", "PASS", time.perf_counter() - t0, summary)


def step_attention(check: Check, args) -> None:
    t0 = time.perf_counter()
    path = os.path.join(check.out, "attention.json")
    cmd = [sys.executable, "scripts/benchmark_attention.py", "--quick", "--impls", "fused,sdpa", "--json", path]
    cmd += ["--device", "cuda"] if args.gpu else ["--device", "cpu", "--shapes", "WikiText-103 small,sweep N=256", "--no-memory"]
    rc, text = check.run("attention", cmd)
    if rc != 0 or not os.path.exists(path):
        check.record("attention", "FAIL", time.perf_counter() - t0, f"exit {rc}: {tail(text)}")
        return
    rows = json.load(open(path))["rows"]
    parts = []
    for r in rows:
        if r["impl"] != "fused" or not r["sdpa_fwd_bwd_ms"]:
            continue
        rate = r["elements"] / (r["fwd_ms"] / 1e3) / (2 if r["causal"] else 1)
        parts.append(f"{r['shape']}: fwd {r['fwd_ms'] / r['sdpa_fwd_ms']:.1f}x, fwd+bwd "
                     f"{r['fwd_bwd_ms'] / r['sdpa_fwd_bwd_ms']:.1f}x sdpa, fwd {rate:.2g} elem/s")
    check.record("attention", "PASS", time.perf_counter() - t0, "; ".join(parts))


def step_table9(check: Check, args) -> None:
    t0 = time.perf_counter()
    path = os.path.join(check.out, "table9.json")
    cmd = [sys.executable, "scripts/benchmark_model.py", "--shapes", "lm,mt", "--out", path]
    if args.gpu:
        cmd += ["--device", "cuda", "--precision", "fp32,fp16,bf16"]
    else:
        cmd += ["--device", "cpu", "--small", "--precision", "fp32,bf16"]
    rc, text = check.run("table9", cmd)
    if rc != 0 or not os.path.exists(path):
        check.record("table9", "FAIL", time.perf_counter() - t0, f"exit {rc}: {tail(text)}")
        return
    res = json.load(open(path))
    parts = [f"{r['name']}: train {r['train_vs_softmax']:.2f}x softmax ({r['train_ms_per_sample']:.2f} ms/seq, "
             f"{r['train_peak_mem_mb']:.0f} MB)" for r in res["models"] if r["name"].startswith("fourier")]
    check.record("table9", "PASS", time.perf_counter() - t0, "; ".join(parts))


def train_command(args, task: str, arch: str, precision: str, save_dir: str) -> list[str]:
    data = os.path.join(args.data_bin, "multi30k.de-en" if task == "mt" else "wikitext-2")
    cmd = [*fairseq_tool("fairseq-train"), data, "--user-dir", USER_DIR, "--arch", arch, "--seed", "1",
           "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr-scheduler", "inverse_sqrt",
           "--warmup-updates", str(max(10, args.updates // 3)), "--max-update", str(args.updates),
           "--save-dir", save_dir, "--no-epoch-checkpoints", "--log-format", "json",
           "--log-interval", str(max(1, args.updates // 30)), "--num-workers", "0"]
    if task == "mt":
        cmd += ["--lr", "5e-4", "--share-decoder-input-output-embed", "--clip-norm", "0.0", "--dropout", "0.3",
                "--weight-decay", "0.0001", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                "--max-tokens", "4096" if args.gpu else "1024"]
    else:
        cmd += ["--lr", "1e-3", "--task", "language_modeling", "--tokens-per-sample", "256" if args.gpu else "32",
                "--sample-break-mode", "none", "--clip-norm", "0.25", "--weight-decay", "0.01", "--dropout", "0.1",
                "--warmup-init-lr", "1e-07", "--batch-size", "16" if args.gpu else "4"]
    cmd += {"fp16": ["--fp16"], "amp": ["--amp"], "fp32": []}[precision]
    # only the runs that are evaluated keep a checkpoint, written once at the end
    cmd += ["--save-interval", "1000000"] if evaluated(args, precision) else ["--no-save"]
    if not args.gpu:
        cmd += ["--cpu", "--max-valid-steps", "5"] + TINY[task]
    return cmd


def evaluated(args, precision: str) -> bool:
    """The runs the evaluate step uses: --fp16 on a GPU, float32 in a dry run."""
    return precision == ("fp16" if args.gpu else "fp32")


def parse_training(lines: list[str]) -> dict:
    """Losses by update, overflow-skipped updates, validation losses and ms per update (the
    median of fairseq's updates per second over the logged intervals, the first third left out)."""
    from fourierformer_fairseq.recipes import fairseq_log_records

    lines = list(lines)
    overflows = sum(1 for line in lines if "gradient overflow detected" in line or "OverflowError" in line)
    train, valid = [], []
    for tag, rec in fairseq_log_records(lines):
        if tag == "train_inner":
            train.append((float(rec.get("ups", "nan")), int(rec["num_updates"]), float(rec["loss"])))
        elif tag == "valid" and "valid_loss" in rec:
            valid.append(float(rec["valid_loss"]))
    res = {"overflows": overflows, "train": [(u, l) for _, u, l in train], "valid": valid}
    rates = sorted(1000.0 / ups for ups, _, _ in train[len(train) // 3:] if ups > 0)
    if rates:
        res["ms_per_update"] = rates[len(rates) // 2]
    return res


def step_train(check: Check, args) -> dict:
    runs = {}
    precisions = ("fp16", "amp") if args.gpu else ("fp32",)  # (fairseq's --bf16 means a TPU)
    for precision in precisions:
        for task, pair in PAIRS.items():
            results = {}
            t0 = time.perf_counter()
            failed = None
            for arch in pair:
                name = f"train_{task}_{precision}_{arch}"
                save = os.path.join(check.out, "runs", name)
                shutil.rmtree(save, ignore_errors=True)
                rc, text = check.run(name, train_command(args, task, arch, precision, save))
                if rc != 0:
                    failed = f"{arch} exited {rc}: {tail(text)}"
                    break
                results[arch] = parse_training(text.splitlines())
                results[arch]["checkpoint"] = os.path.join(save, "checkpoint_last.pt")
            step = f"train {task} {precision}"
            if failed:
                check.record(step, "FAIL", time.perf_counter() - t0, failed)
                continue
            runs[(task, precision)] = results
            status, what = judge_pair(results[pair[0]], results[pair[1]], precision)
            check.record(step, status, time.perf_counter() - t0, what)
    return runs


def judge_pair(fourier: dict, twin: dict, precision: str) -> tuple[str, str]:
    problems = []

    def drop(r):
        return r["train"][0][1] - r["train"][-1][1] if len(r["train"]) >= 2 else float("nan")

    fd, td = drop(fourier), drop(twin)
    if not fd >= LOSS_DROP_FRACTION * td:
        problems.append(f"Fourier loss dropped {fd:.2f}, less than {LOSS_DROP_FRACTION} x the twin's {td:.2f}")
    # the best validation loss (what checkpoint_best keeps): a few hundred updates at full size
    # are early in training, where single validations jump by a nat between epochs (seen with both)
    fv = min(fourier["valid"]) if fourier["valid"] else float("nan")
    tv = min(twin["valid"]) if twin["valid"] else float("nan")
    if not fv <= VALID_SLACK * tv:
        problems.append(f"Fourier best valid loss {fv:.3f} > {VALID_SLACK} x the twin's {tv:.3f}")
    if fourier["overflows"] > twin["overflows"]:
        problems.append(f"{fourier['overflows']} overflow-skipped updates against the twin's {twin['overflows']}")
    fm, tm = fourier.get("ms_per_update"), twin.get("ms_per_update")
    timing = f"{fm:.1f} vs {tm:.1f} ms/update ({fm / tm:.2f}x)" if fm and tm else "ms/update not measured"
    what = (f"loss {fourier['train'][0][1]:.2f} -> {fourier['train'][-1][1]:.2f} (twin {twin['train'][0][1]:.2f} -> "
            f"{twin['train'][-1][1]:.2f}), best valid {fv:.3f} vs {tv:.3f}, overflows {fourier['overflows']} vs "
            f"{twin['overflows']}, {timing}")
    if problems:
        return "FAIL", what + ": " + "; ".join(problems)
    return "PASS", what


def step_evaluate(check: Check, args, runs: dict) -> None:
    for (task, precision), results in runs.items():
        if not evaluated(args, precision):
            continue
        t0 = time.perf_counter()
        scores, failed = {}, None
        data = os.path.join(args.data_bin, "multi30k.de-en" if task == "mt" else "wikitext-2")
        for arch, r in results.items():
            common = [data, "--user-dir", USER_DIR, "--path", r["checkpoint"]]
            common += ["--fp16"] if precision == "fp16" else []
            common += [] if args.gpu else ["--cpu", "--max-valid-steps", "5"]
            if task == "mt":
                cmd = [*fairseq_tool("fairseq-generate"), *common, "--gen-subset", "test", "--beam", "5", "--remove-bpe",
                       "--batch-size", "128" if args.gpu else "64", "--quiet"]
                # the recipe's validation lengths (an early model would otherwise run to 200 tokens);
                # in a dry run, a tiny model barely trained: short hypotheses
                cmd += ["--max-len-a", "1.2", "--max-len-b", "10"] if args.gpu else ["--max-len-a", "0", "--max-len-b", "6"]
            else:
                cmd = [*fairseq_tool("fairseq-eval-lm"), *common, "--gen-subset", "valid", "--tokens-per-sample",
                       "256" if args.gpu else "32", "--context-window", "128" if args.gpu else "16",
                       "--batch-size", "16"]
            name = f"eval_{task}_{precision}_{arch}"
            rc, text = check.run(name, cmd)
            m = re.search(r"BLEU4? = ([0-9.]+)", text) if task == "mt" else re.search(r"Perplexity: ([0-9.]+)", text)
            if rc != 0 or not m:
                failed = f"{arch}: exit {rc}: {tail(text)}"
                break
            scores[arch] = float(m.group(1))
        step = f"evaluate {task} {precision}"
        if failed:
            check.record(step, "FAIL", time.perf_counter() - t0, failed)
            continue
        metric = "BLEU" if task == "mt" else "perplexity"
        fourier, twin = PAIRS[task]
        check.record(step, "PASS", time.perf_counter() - t0,
                     f"{metric} Fourier {scores[fourier]:.2f}, softmax {scores[twin]:.2f}")


# ------------------------------------------------------------------------------------- helpers

def fairseq_tool(name: str) -> list[str]:
    """fairseq's console script (fairseq-train, ...), or the same entry point through this Python
    where the environment's bin folder is not on PATH."""
    path = shutil.which(name)
    if path:
        return [path]
    return [sys.executable, "-m", "fairseq_cli." + name.split("-", 1)[1].replace("-", "_")]


def tail(text: str, n: int = 3) -> str:
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return " | ".join(lines[-n:])[-600:]


def pytest_summary(text: str) -> str:
    lines = [l.strip("= ").strip() for l in text.strip().splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", l)]
    return lines[-1] if lines else ""


def prepare_data(check: Check, args) -> bool:
    need = {"multi30k.de-en": "dict.de.txt", "wikitext-2": "dict.txt"}
    if all(os.path.exists(os.path.join(args.data_bin, d, f)) for d, f in need.items()):
        return True
    t0 = time.perf_counter()
    raw = os.path.join(check.out, "raw")
    files = ["multi30k/train.de", "multi30k/train.en", "multi30k/val.de", "multi30k/val.en",
             "multi30k/test_2016_flickr.de", "multi30k/test_2016_flickr.en",
             "wikitext-2/wiki.train.tokens", "wikitext-2/wiki.valid.tokens"]
    for f in files:
        src = os.path.join(args.raw, f + ".xz")
        if not os.path.exists(src):
            check.record("data", "FAIL", 0, f"{src} not found: pass --raw DIR (multi30k/, wikitext-2/) or --data-bin")
            return False
        os.makedirs(os.path.dirname(os.path.join(raw, f)), exist_ok=True)
        with open(os.path.join(raw, f), "wb") as fh:
            subprocess.run(["xz", "-dc", src], stdout=fh, check=True)
    steps = [
        ("data_multi30k", ["bash", "examples/iwslt14/prepare.sh", "--text-train", f"{raw}/multi30k/train",
                           "--text-valid", f"{raw}/multi30k/val", "--text-test", f"{raw}/multi30k/test_2016_flickr",
                           "--bpe-merges", "8000", "--out", os.path.join(args.data_bin, "multi30k.de-en")]),
        ("data_wikitext2", ["bash", "examples/wikitext103/prepare.sh", "--raw", f"{raw}/wikitext-2",
                            "--out", os.path.join(args.data_bin, "wikitext-2")]),
    ]
    for name, cmd in steps:
        rc, text = check.run(name, cmd)
        if rc != 0:
            check.record("data", "FAIL", time.perf_counter() - t0, f"{name}: exit {rc}: {tail(text)}")
            return False
    check.record("data", "PASS", time.perf_counter() - t0, f"prepared {args.data_bin} from {args.raw}")
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(REPO, "runs", "gpu_check"), help="logs, results, runs")
    p.add_argument("--data-bin", help="folder with multi30k.de-en/ and wikitext-2/ (default OUT/data-bin)")
    p.add_argument("--raw", default=os.path.join(os.path.dirname(REPO), "shared", "data"),
                   help="raw data to prepare the data-bin from, when it is missing (multi30k/*.xz, wikitext-2/*.xz)")
    p.add_argument("--wheels", help="install offline from the wheels in this folder (fairseq-fixed and its dependencies)")
    p.add_argument("--updates", type=int, default=300, help="updates of each training (default 300; --dry-run 12)")
    p.add_argument("--steps", default=",".join(STEPS), help=f"any of {','.join(STEPS)} (default all)")
    p.add_argument("--dry-run", action="store_true", help="on the CPU: everything but the GPU steps, at small sizes")
    args = p.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        p.error(f"unknown steps {unknown}; choose from {', '.join(STEPS)}")
    if "evaluate" in steps and "train" not in steps:
        p.error("evaluate needs train (it evaluates the runs train makes)")
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    args.data_bin = os.path.abspath(args.data_bin or os.path.join(args.out, "data-bin"))
    if args.dry_run and "--updates" not in " ".join(argv if argv is not None else sys.argv):
        args.updates = 12
    check = Check(args.out)
    t_start = time.perf_counter()

    if "install" in steps:
        args.gpu = not args.dry_run  # what the install must give
        step_install(check, args)
    gpu_seen = subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                              cwd=REPO).returncode == 0
    if not args.dry_run and not gpu_seen:
        check.record("gpu", "FAIL", 0, "torch sees no GPU (use --dry-run on a machine without one)")
    args.gpu = gpu_seen and not args.dry_run
    if args.gpu:
        name = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0), torch.__version__)"],
                              capture_output=True, text=True, cwd=REPO).stdout.strip()
        log(f"GPU: {name}")
    if args.gpu or args.dry_run:
        if "tests" in steps:
            step_tests(check, args)
        if "attention" in steps:
            step_attention(check, args)
        if "table9" in steps:
            step_table9(check, args)
        if "train" in steps and prepare_data(check, args):
            runs = step_train(check, args)
            if "evaluate" in steps:
                step_evaluate(check, args, runs)

    total = time.perf_counter() - t_start
    lines = ["| step | status | seconds | result |", "|---|---|---|---|"]
    lines += [f"| {s} | {st} | {sec:.0f} | {what} |" for s, st, sec, what in check.rows]
    table = "\n".join(lines)
    print("\n## GPU check" + (" (dry run, CPU)" if args.dry_run else "") + f": {total:.0f} s\n\n" + table, flush=True)
    with open(os.path.join(args.out, "summary.md"), "w") as fh:
        fh.write(table + "\n")
    failed = [s for s, st, _, _ in check.rows if st == "FAIL"]
    if failed:
        print(f"\nFAILED: {', '.join(failed)} (logs in {args.out})")
        return 1
    print(f"\nall steps passed (logs in {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
