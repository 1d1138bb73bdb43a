#!/usr/bin/env python3
"""The GPU check: everything a user does on a GPU, in one run of under ten minutes, with one table.

    bash scripts/tools/gpu_check.sh [--out DIR] [--offline DIR | --wheels DIR --data-bin DIR] [--raw DIR]
                              [--updates N] [--budget SECONDS] [--steps install,tests,cpu,attention,table9,generation,steptimes,train,distributed,sanitize]
    bash scripts/tools/gpu_check.sh --dry-run [--offline DIR]   # without a GPU: every step but the GPU's
    python scripts/tools/gpu_check.py --prepare-offline DIR     # with a network: the wheels and data for --offline DIR

Steps (each logs to OUT/<name>.log; each row of the table is written to OUT/summary.md and printed
as soon as its step ends; the table's head names the card, torch and CUDA):

  install    scripts/tools/install.sh, or with --offline / --wheels: fairseq-fixed and what the check needs
             from the wheels folder (no network), then this package (`pip install -e .`, which builds
             the extension); then `python -m fourierformer_fairseq.info` must say the cuda backend is
             available. CXX is preset to /usr/bin/g++ when the environment's compiler is another g++
             (such a wrapper has been seen to build an extension whose exceptions crash the process,
             and install.sh would then build it twice). --dry-run installs nothing: it checks the
             wheels folder's dependency closure and runs `info`.
  tests      the CUDA tests: tests/cuda/test_cuda_kernels.py, tests/cuda/test_cuda_fuzz.py (seeded fuzz against
             the float64 oracle, every dtype), tests/cuda/test_cuda_module.py; in parallel (pytest -n, when
             pytest-xdist is installed), side by side with
  cpu        the CPU op tests and fuzz (tests/ops/test_fourier_attention_op.py, tests/ops/test_op_fuzz.py,
             fast tier) under the avx512 kernel variant (FOURIERFORMER_CPU_ISA=avx512), which no CI
             host has; SKIP on a CPU without AVX-512
  attention  scripts/benchmarks/benchmark_attention.py --device cuda --quick --profile: fused against sdpa, the
             backward's small-grid splits against none (fused_unsplit), and the op's time outside
             its kernels
  table9     scripts/benchmarks/benchmark_model.py: training ms per sequence and peak memory, Fourier against its
             softmax twin, the LM and the IWSLT model, fp32, fp16 and bf16
  generation beam-5 generation of the IWSLT'14 model against its softmax twin, as
             scripts/benchmarks/benchmark_generation.py times it (--shapes mt, one thread; on the GPU --device cuda,
             the dry run --small), and the op alone at decoding shapes (DECODING_OP_SHAPES: a query or a few
             per (batch, head) slice, the launcher's decoding forward on a GPU) against sdpa, no gradients
  steptimes  the WikiText-103 protocol's own models at its pass (both sizes; the softmax twin, the published
             attention on the fused kernels, a Table 7 row on the reference backend while one is not fused;
             fp32 and bf16): one training pass each, written to OUT/step_times.json, the record
             examples/reproduce.sh --dry-run --timings reads, and what the LM tables cost from it
  train      stock fairseq-train, the recipes of fourierformer_fairseq/training_recipes.py at full size
             for --updates updates: the IWSLT'14 architecture on Multi30k and the WikiText-103 small LM
             on WikiText-2, Fourier and its softmax twin; the --fp16 set and the --amp set side by side
             (fairseq's --bf16 means a TPU, so bfloat16 is checked by the tests and Table 9); then the
             --fp16 runs are evaluated: fairseq-generate --fp16 (beam 5, BLEU) and fairseq-eval-lm --fp16
  distributed  two ranks of stock fairseq-train on the GPU(s) for each attention kind (a translation
             model each, 12 updates): NCCL where there are two GPUs, else gloo with both on the one,
             under fairseq's GPU default --ddp-backend pytorch_ddp; every parameter and buffer, the
             Performer's features and the diagnostics identical on both ranks
             (tests/runs/test_distributed.py, its cuda tests); SKIP without a GPU
  sanitize   compute-sanitizer's memcheck, racecheck and synccheck over scripts/benchmarks/cuda_kernel_cases.py
             (every kernel instance of the CUDA path once, small shapes), each tool while at least
             SANITIZE_MIN_SECONDS of the budget is left; last, since the budget decides how much of it
             runs (a tool out of time gives no verdict: SKIP); SKIP without a GPU or compute-sanitizer,
             or where it refuses the device

What fails the check: a step's command failing or running past its time limit, any test failing,
the cuda backend not available after the install, and per trained pair (judge_pair): the softmax
twin's loss not falling by MIN_TWIN_LOSS_DROP (nothing trained), the Fourier loss not falling like the
twin's (less than LOSS_DROP_FRACTION of its drop), its best validation loss above VALID_SLACK times the
twin's, or more overflow-skipped updates than the twin by more than OVERFLOW_SLACK. Timings and scores
are reported, never judged. Every step has a time limit (STEP_SECONDS), cut to what is left of
--budget (default 570 s), so the table is complete before a ten-minute limit. Exit status 1 on a failure.

Data: --data-bin (default OUT/data-bin; --offline DIR: unpacked from DIR/data-bin.tar.xz) holds multi30k.de-en/ and
wikitext-2/, binarised by the recipes' prepare scripts; missing, they are prepared from --raw
(default ../shared/data: multi30k/*.xz, wikitext-2/*.xz; decompressed with Python's lzma).
"""
from __future__ import annotations

import argparse
import glob
import importlib
import importlib.util
import json
import lzma
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripts/tools/: the offline bundle's module
from offline_bundle import (OFFLINE_ROOTS, folder_mib, pack_data, pack_wheels, prepare_wheels,  # noqa: E402
                            unpack_data, unpack_wheels, verify_wheels)
from fourierformer_fairseq.fairseq_runs import TIMED_OUT, fairseq_command, fairseq_log_records, run_logged
from fourierformer_fairseq.training_recipes import (cutoff_changes, generation_args, recipe, recipe_args, recipe_value,
                                                    validation_lengths)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER_DIR = os.path.join(REPO, "fourierformer_fairseq")
STEPS = ("install", "tests", "cpu", "attention", "table9", "generation", "steptimes", "train", "distributed",
         "sanitize")
CUDA_TESTS = ("tests/cuda/test_cuda_kernels.py", "tests/cuda/test_cuda_fuzz.py", "tests/cuda/test_cuda_module.py")
CPU_OP_TESTS = ("tests/ops/test_fourier_attention_op.py", "tests/ops/test_op_fuzz.py")
DISTRIBUTED_TESTS = ("tests/runs/test_distributed.py",)  # its tests marked cuda: three cases, side by side
CPU_VARIANT = "avx512"  # the variant no CI host runs (tests/cpu_variants.py: FOURIERFORMER_CPU_ISA)

# Time limits of the steps in seconds (each is also cut to what is left of --budget),
# sized from what the steps took on a card (docs/records/gpu-runs.md).
# A dry run runs the same test selections on a CPU, far slower: its limits are this many times longer
DRY_RUN_SCALE = 4
STEP_SECONDS = {"install": 200, "tests": 200, "cpu": 200, "attention": 90, "table9": 120, "generation": 90,
                "steptimes": 120, "training": 100, "evaluate": 60, "distributed": 60, "sanitize": 150}

# The generation step's op timings: (name, B, H, N, M, D) with q (B, H, N, D) against M keys, power 2,
# no gradients: a beam-5 step of 16 sentences in the IWSLT'14 model's self-attention (one query per
# beam, 4 heads of 128) and with 4 queries, its encoder-decoder attention with the beams folded into
# the queries (5 per sentence, 28 source tokens), and a step of the small LM (8 heads of 16, context 256)
DECODING_OP_SHAPES = (("beam step N1 M30 D128", 80, 4, 1, 30, 128), ("beam step N4 M30 D128", 80, 4, 4, 30, 128),
                      ("enc-dec N5 M28 D128", 16, 4, 5, 28, 128), ("LM step N1 M256 D16", 8, 8, 1, 256, 16))
DECODING_OP_POWER = 2

# The trained tasks: the recipe (training_recipes.py) and the data-bin folder of each
TASKS = {"mt": ("iwslt14", "multi30k.de-en"), "lm": ("wikitext103", "wikitext-2")}
# What the check's short runs change in the recipes: warm-up over the first third, no epoch limit;
# the LM (the recipe's default protocol, its adaptive cutoffs scaled to WikiText-2's vocabulary) takes
# 16 sequences an update (one pass of the recipe's) at lr 1e-3, as the full-size comparison does
# (examples/full_size/compare.sh), so a few hundred updates show learning
CHECK_CHANGES = {"mt": ({}, ("--max-epoch",)), "lm": ({"--lr": "1e-3"}, ("--update-freq", "--max-update"))}
TINY = {  # --dry-run model sizes and batches
    "mt": {"--encoder-layers": "1", "--decoder-layers": "1", "--encoder-embed-dim": "32", "--decoder-embed-dim": "32",
           "--encoder-ffn-embed-dim": "64", "--decoder-ffn-embed-dim": "64", "--encoder-attention-heads": "2",
           "--decoder-attention-heads": "2", "--max-tokens": "1024"},
    # (a tiny LM learns nothing in a dozen updates at the full size's lr: 1e-2 shows it learning)
    "lm": {"--decoder-layers": "2", "--decoder-embed-dim": "32", "--decoder-ffn-embed-dim": "64",
           "--decoder-attention-heads": "2", "--tokens-per-sample": "32", "--batch-size": "16", "--lr": "1e-2"},
}

# The sanitize step: compute-sanitizer's tools, in this order, over scripts/benchmarks/cuda_kernel_cases.py (every
# kernel instance of the CUDA path once); a tool starts only with at least SANITIZE_MIN_SECONDS of the
# budget left, and one that runs out of time gives no verdict (SKIP): the budget decides how much of
# this last step runs. Errors exit with SANITIZER_ERROR_EXIT.
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
SANITIZE_MIN_SECONDS = 30
SANITIZER_ERROR_EXIT = 86

# Verdicts on a trained pair (fairseq logs the loss in bits)
MIN_TWIN_LOSS_DROP = {True: 1.0, False: 0.05}  # GPU / dry run: the twin must learn, or the pair says nothing
LOSS_DROP_FRACTION = 0.8  # the Fourier loss must drop at least this fraction of the twin's drop
VALID_SLACK = 1.05  # and its best validation loss end no more than 5 % above the twin's
# One overflow-skipped update more than the twin is not a failure: fp16's loss scaler starts at
# 2^7 and halves on each overflow, so which of two runs hits its first overflow one update earlier
# is noise of the scale search; a range problem shows as overflows that keep coming.
OVERFLOW_SLACK = 1
OVERFLOW_LINES = ("gradient overflow detected", "AMP: overflow detected", "OverflowError")

RAW_FILES = ("multi30k/train.de", "multi30k/train.en", "multi30k/val.de", "multi30k/val.en",
             "multi30k/test_2016_flickr.de", "multi30k/test_2016_flickr.en",
             "wikitext-2/wiki.train.tokens", "wikitext-2/wiki.valid.tokens")


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Check:
    """Runs the steps' commands with time limits and writes the table row by row."""

    def __init__(self, out: str, budget: float, scale: float = 1.0):
        self.out = out
        self.scale = scale  # of every step's limit
        self.start = time.monotonic()
        self.budget = budget
        self.rows: list[tuple[str, str, float, str]] = []  # (step, PASS/FAIL/SKIP, seconds, what)
        self.lock = threading.Lock()
        self.summary = os.path.join(out, "summary.md")
        with open(self.summary, "w") as fh:
            fh.write("")

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def head(self, lines: list[str]) -> None:
        with self.lock, open(self.summary, "a") as fh:
            fh.write("\n".join(lines) + "\n\n| step | status | seconds | result |\n|---|---|---|---|\n")
        print("\n".join(lines), flush=True)

    def record(self, step: str, status: str, seconds: float, what: str) -> None:
        row = f"| {step} | {status} | {seconds:.0f} | {what} |"
        with self.lock:
            self.rows.append((step, status, seconds, what))
            with open(self.summary, "a") as fh:
                fh.write(row + "\n")
            print(f"[gpu_check {time.strftime('%H:%M:%S')}] {row}", flush=True)

    def run(self, name: str, cmd: list[str], limit: float, env: dict | None = None) -> tuple[int, str]:
        """Runs cmd (output to OUT/name.log) for at most min(limit, what is left of the budget)
        seconds; returns (exit status, output)."""
        seconds = max(1.0, min(limit * self.scale, self.left()))
        path = os.path.join(self.out, f"{name}.log")
        log(f"{name}: {' '.join(cmd)}  (log: {path}, limit {seconds:.0f} s)")
        rc = run_logged(cmd, path, env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})), timeout=seconds,
                        cwd=REPO)
        with open(path, errors="replace") as fh:
            text = fh.read()
        return rc, text


def failure(rc: int, text: str) -> str:
    if rc == TIMED_OUT:
        return "ran past its time limit: " + tail(text)
    return f"exit {rc}: {tail(text)}"


def tail(text: str, n: int = 3) -> str:
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return " | ".join(lines[-n:])[-600:].replace("|", "/")


def pytest_summary(text: str) -> str:
    lines = [l.strip("= ").strip() for l in text.strip().splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", l)]
    return lines[-1] if lines else ""


def pytest_parallel(workers: int) -> list[str]:
    """-n N when pytest-xdist is installed (run in parallel), nothing otherwise (serially)."""
    importlib.invalidate_caches()
    have = subprocess.run([sys.executable, "-c", "import xdist"], capture_output=True).returncode == 0
    return ["-n", str(max(1, workers))] if have and workers > 1 else []


# ------------------------------------------------------------------------------------- install

def compiler_preset() -> dict:
    """CXX=/usr/bin/g++ (and CC) when the compiler the build would use is another g++: such a
    wrapper has been seen to link its own libstdc++ into the extension, whose exceptions then
    crash the process (install.sh would notice and build again with /usr/bin/g++)."""
    system = "/usr/bin/g++"
    if not os.path.exists(system):
        return {}
    chosen = os.environ.get("CXX") or shutil.which("g++") or system
    chosen_path = shutil.which(chosen.split()[0]) or chosen.split()[0]
    if os.path.realpath(chosen_path) == os.path.realpath(system):
        return {}
    return {"CXX": system, "CC": "/usr/bin/gcc"}


def step_install(check: Check, args) -> None:
    t0 = time.perf_counter()
    if args.dry_run:
        problems = verify_wheels(args.wheels) if args.wheels else []
        rc, text = check.run("install", [sys.executable, "-m", "fourierformer_fairseq.info"], 60)
        info = text[text.find("extension:"):] if "extension:" in text else text
        what = (info.splitlines() or ["?"])[0] + " (dry run: nothing installed"
        what += f"; {args.wheels}: complete for Python 3.12, {folder_mib(args.wheels):.1f} MiB)" if args.wheels else ")"
        status = "FAIL" if rc != 0 or problems else "PASS"
        check.record("install", status, time.perf_counter() - t0, what + ("; " + "; ".join(problems) if problems else ""))
        return
    env = compiler_preset()
    if env:
        log(f"install: building with {env['CXX']} instead of {os.environ.get('CXX') or shutil.which('g++')}")
    env["MAX_JOBS"] = str(os.cpu_count() or 1)
    if args.wheels:
        # offline: what the check needs (scripts/tools/install.sh installs requirements.txt, plots included)
        wheels = os.path.abspath(args.wheels)
        pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--find-links", wheels]
        cap = subprocess.run([sys.executable, "-c", "import torch; print('%d.%d' % torch.cuda.get_device_capability(0))"],
                             capture_output=True, text=True, cwd=REPO)
        if cap.returncode == 0 and "TORCH_CUDA_ARCH_LIST" not in os.environ:
            env["TORCH_CUDA_ARCH_LIST"] = cap.stdout.strip()
        script = " && ".join([
            " ".join(pip + [f"'{r}'" for r in OFFLINE_ROOTS]),
            " ".join(pip + ["--no-build-isolation", "--no-deps", "-e", "."]),
            f"{sys.executable} -m fourierformer_fairseq.info",
        ])
        cmd = ["bash", "-c", script]
    else:
        cmd = ["bash", "scripts/tools/install.sh"]
    rc, text = check.run("install", cmd, STEP_SECONDS["install"], env=env)
    importlib.invalidate_caches()
    if rc != 0:
        check.record("install", "FAIL", time.perf_counter() - t0, failure(rc, text))
        return
    info = text[text.find("extension:"):] if "extension:" in text else text
    first = info.splitlines()[0] if info else "?"
    cuda_ok = re.search(r"^\s*cuda\s+available", info, re.M) is not None
    built = f"built with {env['CXX']}" if "CXX" in env else "built with the environment's compiler"
    if not cuda_ok:
        check.record("install", "FAIL", time.perf_counter() - t0, f"the cuda backend is not available: {first}")
    else:
        check.record("install", "PASS", time.perf_counter() - t0, f"{first}; cuda backend available; {built}")


# ------------------------------------------------------------------------------------- tests

def tests_command(files, workers: int, selection: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", *pytest_parallel(workers), *files]
    return cmd + (["-m", selection] if selection else [])


def judge_tests(name: str, rc: int, text: str, need_passed: bool) -> tuple[str, str]:
    summary = pytest_summary(text)
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    bad = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    if rc == TIMED_OUT:
        return "FAIL", failure(rc, text)
    if rc not in (0, 5) or bad:
        return "FAIL", summary or failure(rc, text)
    if counts.get("passed", 0) == 0:
        return ("FAIL" if need_passed else "SKIP"), f"nothing ran: {summary}"
    return "PASS", summary


def step_tests(check: Check, args, workers: int) -> None:
    t0 = time.perf_counter()
    rc, text = check.run("tests", tests_command(CUDA_TESTS, workers), STEP_SECONDS["tests"])
    status, what = judge_tests("tests", rc, text, need_passed=args.gpu)
    if not args.gpu and status != "FAIL":
        what += " (no GPU: the CUDA tests skip)"
    check.record("tests (CUDA)", status, time.perf_counter() - t0, what)


def step_distributed(check: Check, args, workers: int) -> None:
    t0 = time.perf_counter()
    step = "distributed (two ranks)"
    if not args.gpu:
        check.record(step, "SKIP", 0, "no GPU (two CPU ranks of every kind: the full tier's tests/runs/test_distributed.py)")
        return
    rc, text = check.run("distributed", tests_command(DISTRIBUTED_TESTS, min(workers, 3), "cuda"),
                         STEP_SECONDS["distributed"])
    status, what = judge_tests("distributed", rc, text, need_passed=True)
    check.record(step, status, time.perf_counter() - t0, what)


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []


def step_cpu(check: Check, args, workers: int) -> None:
    t0 = time.perf_counter()
    step = f"tests (CPU op + fuzz, {CPU_VARIANT})"
    if "avx512f" not in cpu_flags():
        check.record(step, "SKIP", 0, "this CPU has no AVX-512")
        return
    env = {"FOURIERFORMER_CPU_ISA": CPU_VARIANT, "OMP_NUM_THREADS": "1"}
    rc, text = check.run("cpu", tests_command(CPU_OP_TESTS, workers, "not slow"), STEP_SECONDS["cpu"], env=env)
    status, what = judge_tests("cpu", rc, text, need_passed=True)
    check.record(step, status, time.perf_counter() - t0, what)


# ------------------------------------------------------------------------------------- benchmarks

def step_attention(check: Check, args) -> None:
    t0 = time.perf_counter()
    path = os.path.join(check.out, "attention.json")
    # --profile: the op's ATen ops, launches and time outside its kernels at each shape
    # (fused_unsplit: the CUDA backward without its small-grid splits, timed in the same rounds)
    impls = "fused,fused_unsplit,sdpa" if args.gpu else "fused,sdpa"
    cmd = [sys.executable, "scripts/benchmarks/benchmark_attention.py", "--quick", "--impls", impls, "--json", path,
           "--profile"]
    cmd += ["--device", "cuda"] if args.gpu else ["--device", "cpu", "--shapes", "WikiText-103 small,sweep N=256", "--no-memory"]
    rc, text = check.run("attention", cmd, STEP_SECONDS["attention"])
    if rc != 0 or not os.path.exists(path):
        check.record("attention", "FAIL", time.perf_counter() - t0, failure(rc, text))
        return
    parts = []
    rows = json.load(open(path))["rows"]
    unsplit = {r["shape"]: r for r in rows if r["impl"] == "fused_unsplit"}
    for r in rows:
        if r["impl"] != "fused" or not r["sdpa_fwd_bwd_ms"]:
            continue
        rate = r["elements"] / (r["fwd_ms"] / 1e3) / (2 if r["causal"] else 1)
        part = (f"{r['shape']}: fwd {r['fwd_ms'] / r['sdpa_fwd_ms']:.1f}x, fwd+bwd "
                f"{r['fwd_bwd_ms'] / r['sdpa_fwd_bwd_ms']:.1f}x sdpa, fwd {rate:.2g} elem/s")
        if r["shape"] in unsplit:
            part += f", fwd+bwd unsplit / split {unsplit[r['shape']]['fwd_bwd_ms'] / r['fwd_bwd_ms']:.2f}"
        parts.append(part)
    for r in json.load(open(path)).get("profile", []):
        if r.get("error"):
            parts.append(f"{r['shape']}: profile failed ({r['error']})")
        else:
            launches = f"{r['other_launches']:.0f} launches, " if r.get("other_launches") is not None else ""
            parts.append(f"{r['shape']}: non-kernel {r['non_kernel_share']:.0%} ({launches}"
                         f"host {r['host_us']:.0f} us, fused {r['fused_us']:.0f} us)")
    check.record("attention", "PASS", time.perf_counter() - t0, "; ".join(parts))


def step_table9(check: Check, args) -> None:
    t0 = time.perf_counter()
    path = os.path.join(check.out, "table9.json")
    cmd = [sys.executable, "scripts/benchmarks/benchmark_model.py", "--shapes", "lm,mt", "--out", path]
    cmd += (["--device", "cuda", "--precision", "fp32,fp16,bf16"] if args.gpu
            else ["--device", "cpu", "--small", "--precision", "fp32,bf16"])
    rc, text = check.run("table9", cmd, STEP_SECONDS["table9"])
    if rc != 0 or not os.path.exists(path):
        check.record("table9", "FAIL", time.perf_counter() - t0, failure(rc, text))
        return
    res = json.load(open(path))
    parts = [f"{r['name']}: train {r['train_vs_softmax']:.2f}x softmax ({r['train_ms_per_sample']:.2f} ms/seq, "
             f"{r['train_peak_mem_mb']:.0f} MB)" for r in res["models"] if r["name"].startswith("fourier")]
    check.record("table9", "PASS", time.perf_counter() - t0, "; ".join(parts))


# ------------------------------------------------------------------------------------- generation

def decoding_op_times(device: str, reps: int = 20, shapes=DECODING_OP_SHAPES) -> list:
    """Median ms of the fused op and of sdpa at each decoding shape (float32, no gradients), timed in
    alternating calls after a warm-up; rows of shape, fused_ms, sdpa_ms, ratio."""
    import statistics

    import torch
    import torch.nn.functional as F

    from fourierformer_fairseq.ops import fourier_attention

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    rows = []
    g = torch.Generator().manual_seed(0)
    for name, B, H, N, M, D in shapes:
        q, k, v = (torch.randn(B, H, n, D, generator=g).to(device) for n in (N, M, M))
        calls = {"fused": lambda: fourier_attention(q, k, v, 2.0, power=DECODING_OP_POWER),
                 "sdpa": lambda: F.scaled_dot_product_attention(q, k, v)}
        times = {impl: [] for impl in calls}
        with torch.no_grad():
            for fn in calls.values():
                fn()
            for _ in range(reps):
                for impl, fn in calls.items():
                    sync()
                    t0 = time.perf_counter()
                    fn()
                    sync()
                    times[impl].append((time.perf_counter() - t0) * 1e3)
        fused, sdpa = (statistics.median(times[impl]) for impl in ("fused", "sdpa"))
        rows.append(dict(shape=name, fused_ms=fused, sdpa_ms=sdpa, ratio=fused / sdpa))
    return rows


def step_generation(check: Check, args) -> None:
    """Beam search of the IWSLT'14 model against its twin (scripts/benchmarks/benchmark_generation.py), then the
    op at the decoding shapes (decoding_op_times, in a process of its own); timings only."""
    t0 = time.perf_counter()
    parts, failed = [], False
    path = os.path.join(check.out, "generation.json")
    cmd = [sys.executable, "scripts/benchmarks/benchmark_generation.py", "--shapes", "mt", "--beam", "5", "--threads", "1",
           "--rounds", "3", "--out", path] + (["--device", "cuda"] if args.gpu else ["--small"])
    rc, text = check.run("generation", cmd, STEP_SECONDS["generation"])
    if rc != 0 or not os.path.exists(path):
        parts.append("beam search: " + failure(rc, text))
        failed = True
    else:
        parts += [f"beam 5, {r['shape']}: {r['ratio']:.2f}x the softmax twin ({r['fourier_s']:.2f} s against "
                  f"{r['softmax_s']:.2f} s)" for r in json.load(open(path))["rows"]]
    ops = os.path.join(check.out, "decoding_ops.json")
    device = "cuda" if args.gpu else "cpu"
    script = ("import json, sys; sys.path.insert(0, 'scripts/tools'); import gpu_check as g; "
              f"json.dump(g.decoding_op_times({device!r}, {20 if args.gpu else 3}), open(sys.argv[1], 'w'))")
    rc, text = check.run("generation_ops", [sys.executable, "-c", script, ops], STEP_SECONDS["generation"])
    if rc != 0 or not os.path.exists(ops):
        parts.append("the op at decoding shapes: " + failure(rc, text))
        failed = True
    else:
        parts += [f"{r['shape']}: op {r['ratio']:.1f}x sdpa ({r['fused_ms']:.3f} ms)" for r in json.load(open(ops))]
    check.record("generation", "FAIL" if failed else "PASS", time.perf_counter() - t0, "; ".join(parts))


# ------------------------------------------------------------------------------------- sanitize

def find_compute_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        path = os.path.join(home, "bin", "compute-sanitizer") if home else ""
        if path and os.access(path, os.X_OK):
            return path
    return None


def judge_sanitizer(tool: str, rc: int, text: str) -> tuple[str, str]:
    """(status, what) of one compute-sanitizer run over cuda_kernel_cases.py."""
    summary = [l.strip("= ").strip() for l in text.splitlines() if re.search(r"(ERROR|RACECHECK) SUMMARY", l)]
    said = "; ".join(summary[-2:]) or tail(text)
    if rc == TIMED_OUT:
        return "SKIP", f"{tool}: ran past its time limit, no verdict"
    if re.search(r"Device not supported|Unable to find injection library|not supported on this platform", text):
        return "SKIP", f"{tool}: compute-sanitizer cannot run here ({tail(text, 1)})"
    if rc == SANITIZER_ERROR_EXIT:
        first = next((l.strip("= ").strip() for l in text.splitlines()
                      if re.search(r"Invalid|Race reported|hazard|Barrier error|Error:", l)), "")
        return "FAIL", f"{tool}: {said}; first: {first}"
    if rc != 0:
        return "FAIL", f"{tool}: {failure(rc, text)}"
    return "PASS", f"{tool}: {said}"


def step_sanitize(check: Check, args) -> None:
    """compute-sanitizer's memcheck, racecheck and synccheck over every kernel instance
    (scripts/benchmarks/cuda_kernel_cases.py); on a CPU the host emulator's thread and address sanitizer runs
    (tests/cuda/test_cuda_emulated.py) check the same kernels."""
    if not args.gpu:
        check.record("sanitize", "SKIP", 0, "no GPU (on a CPU: run_emulated_check.py --sanitize thread / address)")
        return
    tool_path = find_compute_sanitizer()
    if tool_path is None:
        check.record("sanitize", "SKIP", 0, "compute-sanitizer not found (PATH, CUDA_HOME/bin, /usr/local/cuda/bin)")
        return
    # every tensor its own allocation, so that memcheck sees an access past a tensor's end
    env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    for tool in SANITIZER_TOOLS:
        t0 = time.perf_counter()
        if check.left() < SANITIZE_MIN_SECONDS:
            check.record(f"sanitize ({tool})", "SKIP", 0, f"{check.left():.0f} s of the budget left")
            continue
        cmd = [tool_path, "--tool", tool, "--error-exitcode", str(SANITIZER_ERROR_EXIT), "--print-limit", "20",
               sys.executable, "scripts/benchmarks/cuda_kernel_cases.py"]
        rc, text = check.run(f"sanitize_{tool}", cmd, STEP_SECONDS["sanitize"], env=env)
        status, what = judge_sanitizer(tool, rc, text)
        check.record(f"sanitize ({tool})", status, time.perf_counter() - t0, what)


# ------------------------------------------------------------------------------------- training

def softmax_twin(arch: str) -> str:
    """The softmax twin (fourierformer_fairseq.models.SOFTMAX_TWINS; imports fairseq)."""
    importlib.invalidate_caches()
    from fourierformer_fairseq.models import SOFTMAX_TWINS

    return SOFTMAX_TWINS[arch]


def train_command(args, task: str, arch: str, precision: str, save_dir: str) -> list[str]:
    name, folder = TASKS[task]
    changes, dropped = CHECK_CHANGES[task]
    changes = {**changes, "--warmup-updates": str(max(1, args.updates // 3))}
    if name == "wikitext103":
        changes.update(cutoff_changes(os.path.join(args.data_bin, folder)))
    if not args.gpu:
        changes.update(TINY[task])
    cmd = [*fairseq_command("fairseq-train"), os.path.join(args.data_bin, folder), "--user-dir", USER_DIR,
           "--arch", arch, *recipe_args(name, changes, drop=dropped), "--seed", "1",
           "--max-update", str(args.updates), "--save-dir", save_dir, "--no-epoch-checkpoints",
           "--log-format", "json", "--log-interval", str(max(1, args.updates // 30)), "--num-workers", "0"]
    cmd += {"fp16": ["--fp16"], "amp": ["--amp"], "fp32": []}[precision]
    # only the runs that are evaluated keep a checkpoint, written once at the end
    cmd += ["--save-interval", "1000000"] if evaluated(args, precision) else ["--no-save"]
    if not args.gpu:
        cmd += ["--cpu", "--max-valid-steps", "5"]
    return cmd


def evaluated(args, precision: str) -> bool:
    """The runs the evaluation uses: --fp16 on a GPU, float32 in a dry run."""
    return precision == ("fp16" if args.gpu else "fp32")


def parse_training(lines) -> dict:
    """Losses by update, overflow-skipped updates (fp16's and --amp's messages), validation losses
    and ms per update (the median of fairseq's updates per second over the logged intervals, the
    first third left out)."""
    lines = list(lines)
    overflows = sum(1 for line in lines if any(m in line for m in OVERFLOW_LINES))
    train, valid = [], []
    for tag, rec in fairseq_log_records(lines):
        if tag == "train_inner":
            train.append((float(rec.get("ups") or "nan"), int(rec["num_updates"]), float(rec["loss"])))
        elif tag == "valid" and "valid_loss" in rec:
            valid.append(float(rec["valid_loss"]))
    res = {"overflows": overflows, "train": [(u, l) for _, u, l in train], "valid": valid}
    rates = sorted(1000.0 / ups for ups, _, _ in train[len(train) // 3:] if ups > 0)
    if rates:
        res["ms_per_update"] = rates[len(rates) // 2]
    return res


def judge_pair(fourier: dict, twin: dict, gpu: bool = True) -> tuple[str, str]:
    problems = []

    def drop(r):
        return r["train"][0][1] - r["train"][-1][1] if len(r["train"]) >= 2 else float("nan")

    fd, td = drop(fourier), drop(twin)
    min_drop = MIN_TWIN_LOSS_DROP[gpu]
    if not td >= min_drop:
        problems.append(f"the twin's loss dropped {td:.2f}, less than {min_drop}: neither model's training is shown")
    if not fd >= LOSS_DROP_FRACTION * td:
        problems.append(f"Fourier loss dropped {fd:.2f}, less than {LOSS_DROP_FRACTION} x the twin's {td:.2f}")
    # the best validation loss (what checkpoint_best keeps): a few hundred updates at full size
    # are early in training, where single validations jump by a nat between epochs (seen with both)
    fv = min(fourier["valid"]) if fourier["valid"] else float("nan")
    tv = min(twin["valid"]) if twin["valid"] else float("nan")
    if not fv <= VALID_SLACK * tv:
        problems.append(f"Fourier best valid loss {fv:.3f} > {VALID_SLACK} x the twin's {tv:.3f}")
    if fourier["overflows"] > twin["overflows"] + OVERFLOW_SLACK:
        problems.append(f"{fourier['overflows']} overflow-skipped updates against the twin's {twin['overflows']} "
                        f"(more than {OVERFLOW_SLACK} apart)")
    fm, tm = fourier.get("ms_per_update"), twin.get("ms_per_update")
    timing = f"{fm:.1f} vs {tm:.1f} ms/update ({fm / tm:.2f}x)" if fm and tm else "ms/update not measured"

    def losses(r):
        return f"{r['train'][0][1]:.2f} -> {r['train'][-1][1]:.2f}" if r["train"] else "no loss logged"

    what = (f"loss {losses(fourier)} (twin {losses(twin)}), best valid {fv:.3f} vs {tv:.3f}, overflows "
            f"{fourier['overflows']} vs {twin['overflows']}, {timing}")
    if problems:
        return "FAIL", what + ": " + "; ".join(problems)
    return "PASS", what


def train_set(check: Check, args, precision: str, results: dict) -> None:
    """One precision's trainings, task by task (Fourier, then its twin), each pair judged and, for
    the evaluated precision, evaluated as soon as it is trained."""
    for task, (name, _) in TASKS.items():
        fourier = recipe(name)["arch"]
        pair = (fourier, softmax_twin(fourier))
        t0 = time.perf_counter()
        runs, failed = {}, None
        for arch in pair:
            run_name = f"train_{task}_{precision}_{arch}"
            save = os.path.join(check.out, "runs", run_name)
            shutil.rmtree(save, ignore_errors=True)
            rc, text = check.run(run_name, train_command(args, task, arch, precision, save), STEP_SECONDS["training"])
            if rc != 0:
                failed = f"{arch}: {failure(rc, text)}"
                break
            runs[arch] = parse_training(text.splitlines())
            runs[arch]["checkpoint"] = os.path.join(save, "checkpoint_last.pt")
        step = f"train {task} {precision}"
        if failed:
            check.record(step, "FAIL", time.perf_counter() - t0, failed)
            continue
        results[(task, precision)] = runs
        status, what = judge_pair(runs[pair[0]], runs[pair[1]], gpu=args.gpu)
        check.record(step, status, time.perf_counter() - t0, what)
        if evaluated(args, precision):
            evaluate_pair(check, args, task, precision, pair, runs)


def evaluate_pair(check: Check, args, task: str, precision: str, pair, runs: dict) -> None:
    t0 = time.perf_counter()
    data = os.path.join(args.data_bin, TASKS[task][1])
    scores = {}
    for arch in pair:
        common = [data, "--user-dir", USER_DIR, "--path", runs[arch]["checkpoint"]]
        common += ["--fp16"] if precision == "fp16" else []
        common += [] if args.gpu else ["--cpu", "--max-valid-steps", "5"]
        if task == "mt":
            # the recipes' generation protocol; in a dry run, a tiny model barely trained: smaller batches
            # and short hypotheses
            dry = {} if args.gpu else {"--batch-size": "64", "--max-len-a": "0", "--max-len-b": "6"}
            cmd = [*fairseq_command("fairseq-generate"), *common, "--gen-subset", "test",
                   *generation_args("iwslt14", {**validation_lengths(), **dry}), "--quiet"]
        else:
            context = recipe_value("wikitext103", "--tokens-per-sample") if args.gpu else TINY["lm"]["--tokens-per-sample"]
            cmd = [*fairseq_command("fairseq-eval-lm"), *common, "--gen-subset", "valid", "--tokens-per-sample",
                   context, "--context-window", str(int(context) // 2), "--batch-size", "16"]
            # in a dry run, a fiftieth of the validation set (eval-lm reads it all otherwise: minutes on a CPU)
            cmd += [] if args.gpu else ["--num-shards", "50", "--shard-id", "0"]
        rc, text = check.run(f"eval_{task}_{precision}_{arch}", cmd, STEP_SECONDS["evaluate"])
        m = re.search(r"BLEU4? = ([0-9.]+)", text) if task == "mt" else re.search(r"Perplexity: ([0-9.]+)", text)
        if rc != 0 or not m:
            check.record(f"evaluate {task} {precision}", "FAIL", time.perf_counter() - t0, f"{arch}: {failure(rc, text)}")
            return
        scores[arch] = float(m.group(1))
    metric = "BLEU" if task == "mt" else "perplexity"
    check.record(f"evaluate {task} {precision}", "PASS", time.perf_counter() - t0,
                 f"{metric} Fourier {scores[pair[0]]:.2f}, softmax {scores[pair[1]]:.2f}")


def step_train(check: Check, args) -> dict:
    """The precision sets side by side (one thread each); returns {(task, precision): runs}."""
    results: dict = {}
    precisions = ("fp16", "amp") if args.gpu else ("fp32",)
    threads = [threading.Thread(target=train_set, args=(check, args, p, results), name=p) for p in precisions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def paper_runs():
    """examples/paper_runs.py (the tables' runs and their cost), imported from its file."""
    spec = importlib.util.spec_from_file_location("paper_runs", os.path.join(REPO, "examples", "paper_runs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The steptimes step: the WikiText-103 protocol's own models (both sizes; the softmax twin, the published
# attention on the fused kernels and, while a Table 7 row's phi is not fused, that row's attention on the
# reference backend) at the protocol's pass (its sequences a pass and context, adaptive input and
# softmax over WikiText-103's vocabulary), one training pass each (forward, adaptive_loss, backward,
# clip, Adam), the median of STEP_TIME_STEPS after STEP_TIME_WARMUP; fp32 (what the protocols train) and
# bf16 (the model in bfloat16). A dry run builds them with STEP_TIME_TINY's layers at the same pass.
STEP_TIME_PRECISIONS = ("fp32", "bf16")
STEP_TIME_WARMUP, STEP_TIME_STEPS = 2, 5
STEP_TIME_TINY = ["--decoder-layers", "1", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
                  "--decoder-attention-heads", "4"]


def step_time_models(protocol: str = None) -> list:
    """(attention, model, extra arguments) of what the protocol's runs execute: the softmax twin, the
    published attention (fused), and the first Table 7 row whose attention the fused kernels do not take."""
    pr = paper_runs()
    out = [("softmax", "softmax", ()), ("fused", "fourier", ("--fourier-published",))]
    for _, run, model, size, extra, _, _ in pr.distinct_runs(["table7"]):
        if model == "fourier" and pr.attention_backend(extra, pr.head_dim(size))[0] == "reference":
            out.append(("reference", "fourier", tuple(extra)))
            break
    return out


def time_lm_pass(protocol: str, size: str, model: str, extra, precision: str, device: str, tiny: bool,
                 warmup: int = STEP_TIME_WARMUP, steps: int = STEP_TIME_STEPS) -> float:
    """ms of one training pass of the protocol's LM (its sequences a pass, its context), built by fairseq from
    the recipe's options and WikiText-103's vocabulary."""
    import torch
    from fairseq import options, tasks
    from fairseq.data import Dictionary
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fourierformer_fairseq.training_recipes import WIKITEXT103_VOCAB

    arch = recipe("wikitext103", protocol, size)["arch"]
    arch = softmax_twin(arch) if model == "softmax" else arch
    argv = ["unused-data", "--user-dir", USER_DIR, "--arch", arch, *recipe_args("wikitext103", protocol=protocol, size=size),
            *(STEP_TIME_TINY if tiny else []), *extra] + (["--cpu"] if device == "cpu" else [])
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    dictionary = Dictionary()
    for i in range(WIKITEXT103_VOCAB - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    task = tasks.get_task("language_modeling")(cfg.task, dictionary, dictionary)
    torch.manual_seed(1)
    # bf16: the model in bfloat16, as scripts/benchmarks/benchmark_model.py measures it
    net = task.build_model(cfg.model).to(device=device, dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
    criterion = task.build_criterion(cfg.criterion).to(device)
    net.train()
    opt = torch.optim.Adam(net.parameters(), lr=float(cfg.optimization.lr[0]), betas=(0.9, 0.999))
    seqs, context = int(cfg.dataset.batch_size), int(cfg.task.tokens_per_sample)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (seqs, context + 1), generator=g).to(device)
    sample = {"net_input": {"src_tokens": tokens[:, :-1], "src_lengths": torch.full((seqs,), context, device=device)},
              "target": tokens[:, 1:].contiguous(), "ntokens": seqs * context, "nsentences": seqs, "id": torch.arange(seqs)}

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def step():
        opt.zero_grad(set_to_none=True)
        loss, _, _ = criterion(net, sample)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), float(cfg.optimization.clip_norm))
        opt.step()

    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return 1000 * sorted(times)[len(times) // 2]


def protocol_step_times(device: str, tiny: bool, protocol: str = None, sizes=None, precisions=STEP_TIME_PRECISIONS,
                        warmup: int = STEP_TIME_WARMUP, steps: int = STEP_TIME_STEPS) -> list:
    """The step-time entries of the protocol's runs (examples/paper_runs.py reads them): one per size,
    attention and precision; a model that does not fit or fails gets its error instead of a time."""
    from fourierformer_fairseq.training_recipes import DEFAULT_LM_PROTOCOL, LM_SIZES

    protocol = protocol or DEFAULT_LM_PROTOCOL
    pr = paper_runs()
    entries = []
    for size in sizes or LM_SIZES:
        seqs, context, _ = pr.lm_pass(protocol, size)
        for attention, model, extra in step_time_models(protocol):
            for precision in precisions:
                entry = {"task": "wikitext103", "protocol": protocol, "size": size, "attention": attention,
                         "precision": precision, "sequences_per_pass": seqs, "tokens_per_sequence": context,
                         "extra": list(extra)}
                try:
                    entry["ms_per_pass"] = round(time_lm_pass(protocol, size, model, extra, precision, device, tiny,
                                                              warmup, steps), 3)
                except (RuntimeError, ValueError) as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
                    entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                entries.append(entry)
    return entries


def step_steptimes(check: Check, args) -> None:
    """The protocol's step times (protocol_step_times) as a record, OUT/step_times.json, the one
    examples/reproduce.sh --dry-run --timings reads; and what the paper's LM tables cost from it."""
    t0 = time.perf_counter()
    out = os.path.join(check.out, "step_times.json")
    device = "cuda" if args.gpu else "cpu"
    script = ("import json, sys; sys.path.insert(0, 'scripts/tools'); import gpu_check as g; "
              f"json.dump(g.protocol_step_times({device!r}, {not args.gpu}), open(sys.argv[1], 'w'))")
    rc, text = check.run("steptimes", [sys.executable, "-c", script, out + ".entries"], STEP_SECONDS["steptimes"])
    if rc != 0 or not os.path.exists(out + ".entries"):
        check.record("steptimes", "FAIL", time.perf_counter() - t0, failure(rc, text))
        return
    entries = json.load(open(out + ".entries"))
    os.remove(out + ".entries")
    record = step_time_record(entries, args.gpu)
    with open(out, "w") as fh:
        json.dump(record, fh, indent=1)
    failed = [f"{e['size']} {e['attention']} {e['precision']}: {e['error']}" for e in entries if "error" in e]
    pr = paper_runs()
    totals = [line for line in pr.dry_run_lines(["table1", "table7", "table8"], record=record, record_path=out)
              if " total: " in line]
    check.record("steptimes", "PASS", time.perf_counter() - t0,
                 f"{len(entries) - len(failed)} of {len(entries)} measured ({out})"
                 + (f"; not measured: {'; '.join(failed)}" if failed else "") + "; " + "; ".join(totals))


def step_time_record(entries: list, gpu: bool) -> dict:
    """The record's head (when, where, what) over the entries."""
    card = "a CPU (dry run: tiny layers at the protocol's pass, not a budget)"
    if gpu:
        import torch

        card = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return {"date": time.strftime("%Y-%m-%d"), "machine": f"{card}, {platform.node() or 'this machine'}",
            "kernels": "this checkout's", "command": "python scripts/tools/gpu_check.py --steps steptimes",
            "note": "measured by the GPU check at the protocol's own pass (scripts/tools/gpu_check.py: protocol_step_times)",
            "step_times": entries}


# ------------------------------------------------------------------------------------- data (the wheels: offline_bundle.py)

def prepare_data(args, log_to: str) -> tuple[bool, str]:
    """The data-bin the trainings read, from the raw archives (Python's lzma: xz may be absent)."""
    need = {"multi30k.de-en": "dict.de.txt", "wikitext-2": "dict.txt"}
    if all(os.path.exists(os.path.join(args.data_bin, d, f)) for d, f in need.items()):
        return True, f"{args.data_bin} (prepared)"
    raw = os.path.join(log_to, "raw")
    for f in RAW_FILES:
        src = os.path.join(args.raw, f + ".xz")
        if not os.path.exists(src):
            return False, f"{src} not found: pass --raw DIR (multi30k/, wikitext-2/) or --data-bin / --offline"
        os.makedirs(os.path.dirname(os.path.join(raw, f)), exist_ok=True)
        with lzma.open(src) as fin, open(os.path.join(raw, f), "wb") as fout:
            shutil.copyfileobj(fin, fout)
    steps = [
        ("data_multi30k", ["bash", "examples/iwslt14/prepare.sh", "--text-train", f"{raw}/multi30k/train",
                           "--text-valid", f"{raw}/multi30k/val", "--text-test", f"{raw}/multi30k/test_2016_flickr",
                           "--bpe-merges", "8000", "--out", os.path.join(args.data_bin, "multi30k.de-en")]),
        ("data_wikitext2", ["bash", "examples/wikitext103/prepare.sh", "--raw", f"{raw}/wikitext-2",
                            "--out", os.path.join(args.data_bin, "wikitext-2")]),
    ]
    for name, cmd in steps:
        path = os.path.join(log_to, f"{name}.log")
        log(f"{name}: {' '.join(cmd)} (log: {path})")
        rc = run_logged(cmd, path, env=dict(os.environ, PYTHONUNBUFFERED="1"), cwd=REPO)
        if rc != 0:
            return False, f"{name}: exit {rc}: {tail(open(path, errors='replace').read())}"
    shutil.rmtree(raw, ignore_errors=True)
    return True, f"prepared {args.data_bin} from {args.raw}"


def prepare_offline(args) -> int:
    """DIR/data-bin.tar.xz and DIR/wheels.tar.xz, what --offline DIR needs; the data-bin and the
    wheels themselves are written to DIR.work/ (kept, so a second run redoes nothing)."""
    out = os.path.abspath(args.prepare_offline)
    work = out.rstrip("/") + ".work"
    os.makedirs(out, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    args.data_bin = os.path.join(work, "data-bin")
    ok, what = prepare_data(args, work)
    log(f"data: {what}")
    if ok:
        pack_data(args.data_bin, os.path.join(out, "data-bin.tar.xz"))
    folder = os.path.join(work, "wheels")
    problems = prepare_wheels(folder)
    for p in problems:
        log(f"wheels: {p}")
    archive = os.path.join(out, "wheels.tar.xz")
    newest = max((os.path.getmtime(p) for p in glob.glob(os.path.join(folder, "*.whl"))), default=0)
    if not problems and (not os.path.exists(archive) or os.path.getmtime(archive) < newest):
        log(f"packing {folder} into {archive} (a few minutes)")
        pack_wheels(folder, archive)
    mib = lambda path: os.path.getsize(path) / 2 ** 20 if os.path.exists(path) else 0.0  # noqa: E731
    log(f"{folder}: {len(glob.glob(os.path.join(folder, '*.whl')))} wheels, {folder_mib(folder):.1f} MiB; {out}: "
        f"{folder_mib(out):.1f} MiB in all (wheels.tar.xz {mib(os.path.join(out, 'wheels.tar.xz')):.1f} MiB, "
        f"data-bin.tar.xz {mib(os.path.join(out, 'data-bin.tar.xz')):.1f} MiB)")
    return 0 if ok and not problems else 1


# ------------------------------------------------------------------------------------- main

def describe_machine(gpu: bool) -> list[str]:
    probe = ("import torch, json; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
             "'cuda': torch.version.cuda, 'device': torch.cuda.get_device_name(0) if c else None}))")
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    info = json.loads(got.stdout.strip().splitlines()[-1]) if got.returncode == 0 else {}
    smi = ""
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip().splitlines()
        smi = smi[0] if smi else ""
    card = info.get("device") or "no GPU"
    return [f"## GPU check{' (dry run, CPU)' if not gpu else ''}, {time.strftime('%Y-%m-%d %H:%M %Z')}",
            f"card: {card}" + (f" (nvidia-smi: {smi})" if smi else "") + f"; {os.cpu_count()} CPU cores",
            f"torch {info.get('torch', '?')}, CUDA {info.get('cuda') or 'none'}, Python {sys.version.split()[0]}"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(REPO, "runs", "gpu_check"), help="logs, results, runs")
    p.add_argument("--offline", metavar="DIR", help="DIR/wheels.tar.xz and DIR/data-bin.tar.xz, as --prepare-offline DIR made them")
    p.add_argument("--data-bin", help="folder with multi30k.de-en/ and wikitext-2/ (default OUT/data-bin)")
    p.add_argument("--raw", default=os.path.join(os.path.dirname(REPO), "shared", "data"),
                   help="raw data to prepare the data-bin from when it is missing (multi30k/*.xz, wikitext-2/*.xz)")
    p.add_argument("--wheels", help="install offline from the wheels in this folder")
    p.add_argument("--prepare-offline", metavar="DIR",
                   help="on a machine with a network: write DIR/wheels.tar.xz and DIR/data-bin.tar.xz for --offline DIR, then stop")
    p.add_argument("--updates", type=int, default=None, help="updates of each training (default 300; --dry-run 12)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole check; each step's limit is cut to what is left (default 570; "
                        f"--dry-run: {DRY_RUN_SCALE} times that, and every step's limit {DRY_RUN_SCALE} times its own)")
    p.add_argument("--steps", default=",".join(STEPS), help=f"any of {','.join(STEPS)} (default all)")
    p.add_argument("--dry-run", action="store_true", help="on the CPU: everything but the GPU steps, at small sizes")
    args = p.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        p.error(f"unknown steps {unknown}; choose from {', '.join(STEPS)}")
    args.raw = os.path.abspath(args.raw)
    if args.prepare_offline:
        return prepare_offline(args)
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    if args.offline:
        wheels, data = (os.path.join(args.offline, f) for f in ("wheels.tar.xz", "data-bin.tar.xz"))
        if not os.path.exists(wheels) or not os.path.exists(data):
            p.error(f"--offline {args.offline}: needs wheels.tar.xz and data-bin.tar.xz (made by --prepare-offline)")
        args.wheels = args.wheels or unpack_wheels(wheels, os.path.join(args.out, "wheels"))
        args.data_bin = args.data_bin or unpack_data(data, args.out)
    args.data_bin = os.path.abspath(args.data_bin or os.path.join(args.out, "data-bin"))
    args.updates = args.updates or (12 if args.dry_run else 300)
    args.gpu = not args.dry_run
    scale = DRY_RUN_SCALE if args.dry_run else 1.0
    check = Check(args.out, args.budget or 570 * scale, scale)
    workers = os.cpu_count() or 1

    check.head(describe_machine(not args.dry_run))
    if "install" in steps:
        step_install(check, args)
    gpu_seen = subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                              cwd=REPO).returncode == 0
    if not args.dry_run and not gpu_seen:
        check.record("gpu", "FAIL", 0, "torch sees no GPU (use --dry-run on a machine without one)")
    args.gpu = gpu_seen and not args.dry_run
    results: dict = {}
    if args.gpu or args.dry_run:
        # the CUDA tests and the CPU variant's tests side by side, half the cores each
        side = [threading.Thread(target=fn, args=(check, args, max(1, workers // 2)))
                for s, fn in (("tests", step_tests), ("cpu", step_cpu)) if s in steps]
        for t in side:
            t.start()
        for t in side:
            t.join()
        if "attention" in steps:
            step_attention(check, args)
        if "table9" in steps:
            step_table9(check, args)
        if "generation" in steps:
            step_generation(check, args)
        if "steptimes" in steps:
            step_steptimes(check, args)
        if "train" in steps:
            t0 = time.perf_counter()
            ok, what = prepare_data(args, check.out)
            check.record("data", "PASS" if ok else "FAIL", time.perf_counter() - t0, what)
            if ok:
                results = step_train(check, args)
        if "distributed" in steps:
            step_distributed(check, args, workers)
        if "sanitize" in steps:
            step_sanitize(check, args)

    total = time.monotonic() - check.start
    with open(check.summary, "a") as fh:
        fh.write(f"\ntotal: {total:.0f} s\n")
    print(f"\n## GPU check: {total:.0f} s in all; the table: {check.summary}", flush=True)
    failed = [s for s, st, _, _ in check.rows if st == "FAIL"]
    if failed:
        print(f"FAILED: {', '.join(failed)} (logs in {args.out})")
        return 1
    print(f"all steps passed (logs in {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
