"""The offline quickstart: synthetic corpus -> stock fairseq CLIs -> two BLEU scores.

    python -m fourierformer_fairseq.quickstart [--out-dir runs/quickstart] [--max-epoch N]
        [--time-budget-minutes M] [--jobs 1|2] [--small]

1. writes the synthetic English -> Fourieran corpus (``corpus.py``),
2. ``fairseq-preprocess`` binarises it,
3. ``fairseq-train`` trains ``fourierformer_iwslt_de_en`` and its softmax twin
   ``transformer_iwslt_de_en`` with identical (reduced) sizes, optimiser, data and seed,
   side by side (one process per core) or one after the other,
4. ``fairseq-generate`` translates the test set with beam search and scores it (sacreBLEU),
5. prints both BLEU scores and where the checkpoints, logs and translations are.

Every step is a subprocess running the stock fairseq command with ``--user-dir``; the exact
commands are printed and saved in ``commands.sh`` so each step can be rerun by hand.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, TextIO

from ..fairseq_runs import fairseq_command, fairseq_log_records, run_logged, shell_line
from ..training_recipes import generation, generation_args, recipe_args, validation_lengths
from .corpus import SOURCE_LANG, TARGET_LANG, write_corpus

MARKER = ".fourierformer-quickstart"
OWN_ENTRIES = ("corpus", "data-bin", "checkpoints", "logs", "translations", "commands.sh", "summary.json", MARKER)

ARCH = "fourierformer_iwslt_de_en"


def models():
    """(name, --arch, extra options) of the two models: they differ only in the attention, and both
    run with their architecture's defaults (the twin: fourierformer_fairseq.models.SOFTMAX_TWINS)."""
    from ..models import SOFTMAX_TWINS

    return (("fourierformer", ARCH, ()), ("softmax", SOFTMAX_TWINS[ARCH], ()))


@dataclass
class Sizes:
    """Everything the two runs share: data size, model dims, optimisation."""

    train: int
    valid: int
    test: int
    layers: int
    embed_dim: int
    ffn_dim: int
    heads: int
    max_tokens: int
    lr: float
    warmup: int
    max_epoch: int


FULL = Sizes(train=20000, valid=400, test=400, layers=2, embed_dim=128, ffn_dim=256, heads=4,
             max_tokens=2048, lr=3e-3, warmup=150, max_epoch=4)
SMALL = Sizes(train=2000, valid=60, test=60, layers=1, embed_dim=64, ffn_dim=128, heads=4,
              max_tokens=1024, lr=5e-3, warmup=20, max_epoch=4)


@dataclass
class QuickstartConfig:
    out_dir: str = os.path.join("runs", "quickstart")
    small: bool = False
    max_epoch: Optional[int] = None  # default: the mode's
    max_update: Optional[int] = None  # stop each training after this many updates (default: no limit)
    time_budget_minutes: float = 5.0  # cap on each model's training time
    jobs: int = 0  # parallel trainings; 0: 2 if there are >= 2 cores, else 1
    seed: int = 1
    beam: int = int(dict(generation())["--beam"])  # the translation recipes' (training_recipes.GENERATION)

    @property
    def sizes(self) -> Sizes:
        sizes = SMALL if self.small else FULL
        if self.max_epoch is not None:
            sizes = Sizes(**{**asdict(sizes), "max_epoch": self.max_epoch})
        return sizes


@dataclass
class ModelResult:
    name: str
    arch: str
    bleu: Optional[float] = None
    bleu_line: str = ""
    epochs: int = 0
    updates: int = 0
    best_valid_loss: Optional[float] = None
    train_seconds: float = 0.0
    stopped_by_time_budget: bool = False
    checkpoint: str = ""
    train_log: str = ""
    generate_log: str = ""
    translations: str = ""
    hypotheses: Dict[int, str] = field(default_factory=dict)


class QuickstartError(RuntimeError):
    pass


# --------------------------------------------------------------------------- commands


def user_dir() -> str:
    import fourierformer_fairseq

    return fourierformer_fairseq.USER_DIR


def preprocess_command(corpus: Dict[str, str], data_bin: str) -> List[str]:
    return fairseq_command("fairseq-preprocess") + [
        "--source-lang", SOURCE_LANG, "--target-lang", TARGET_LANG,
        "--trainpref", corpus["train"], "--validpref", corpus["valid"], "--testpref", corpus["test"],
        "--destdir", data_bin, "--workers", "1",
    ]


# The IWSLT'14 recipe (training_recipes.py) with what a small model on a small synthetic corpus
# needs instead: less dropout, gradient clipping, no weight decay
RECIPE_CHANGES = {"--dropout": "0.1", "--clip-norm": "1.0"}
RECIPE_DROPPED = ("--weight-decay",)


def train_command(arch: str, extra: Sequence[str], data_bin: str, save_dir: str, sizes: Sizes,
                  cfg: QuickstartConfig) -> List[str]:
    s = sizes
    recipe = recipe_args("iwslt14", {**RECIPE_CHANGES, "--lr": str(s.lr), "--warmup-updates": str(s.warmup),
                                     "--max-tokens": str(s.max_tokens), "--max-epoch": str(s.max_epoch)},
                         drop=RECIPE_DROPPED)
    return fairseq_command("fairseq-train") + [
        data_bin, "--user-dir", user_dir(), "--task", "translation",
        "--source-lang", SOURCE_LANG, "--target-lang", TARGET_LANG,
        "--arch", arch, *extra,
        "--encoder-layers", str(s.layers), "--decoder-layers", str(s.layers),
        "--encoder-embed-dim", str(s.embed_dim), "--decoder-embed-dim", str(s.embed_dim),
        "--encoder-ffn-embed-dim", str(s.ffn_dim), "--decoder-ffn-embed-dim", str(s.ffn_dim),
        "--encoder-attention-heads", str(s.heads), "--decoder-attention-heads", str(s.heads),
        *recipe,
        *(["--max-update", str(cfg.max_update)] if cfg.max_update else []),
        "--stop-time-hours", f"{cfg.time_budget_minutes / 60:.6f}",
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--seed", str(cfg.seed),
        "--log-format", "json", "--log-interval", "25" if not cfg.small else "5",
        "--no-progress-bar", "--num-workers", "0",
    ]


def generate_command(data_bin: str, checkpoint: str, cfg: QuickstartConfig) -> List[str]:
    return fairseq_command("fairseq-generate") + [
        data_bin, "--user-dir", user_dir(), "--task", "translation",
        "--source-lang", SOURCE_LANG, "--target-lang", TARGET_LANG,
        "--path", checkpoint, "--gen-subset", "test",
        # the translation recipes' generation protocol with the short runs' length limit, at the
        # quickstart's beam (its corpus has no BPE)
        *generation_args("iwslt14", {**validation_lengths(), "--beam": str(cfg.beam)}, drop=("--remove-bpe",)),
        "--scoring", "sacrebleu", "--num-workers", "0",
    ]


# --------------------------------------------------------------------------- running


class Console:
    """Progress lines from several threads, one line at a time."""

    def __init__(self, stream: TextIO = sys.stdout):
        self.stream = stream
        self.lock = threading.Lock()
        self.start = time.monotonic()

    def say(self, text: str = "") -> None:
        with self.lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.start:6.0f}s"


def _number(value) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _tail(path: str, n: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def subprocess_env(threads: int) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env.setdefault("MKL_NUM_THREADS", env["OMP_NUM_THREADS"])
    return env


def train_model(result: ModelResult, cmd: List[str], env: Dict[str, str], console: Console, width: int) -> int:
    label = result.name.ljust(width)
    started = time.monotonic()

    def on_line(line: str) -> None:
        tag, record = next(fairseq_log_records([line]), (None, None))
        inner = record if tag == "train_inner" else None
        if inner is not None:
            result.updates = int(_number(inner.get("num_updates")) or result.updates)
            console.say(f"[{console.elapsed()}] {label}  epoch {inner.get('epoch', '?'):>2}  update {result.updates:>5}"
                        f"  train loss {inner.get('loss', '?')}")
            return
        valid = record if tag == "valid" else None
        if valid is not None:
            result.epochs = int(_number(valid.get("epoch")) or result.epochs)
            result.updates = int(_number(valid.get("valid_num_updates")) or result.updates)
            best = _number(valid.get("valid_best_loss"))
            loss = _number(valid.get("valid_loss"))
            result.best_valid_loss = best if best is not None else loss
            console.say(f"[{console.elapsed()}] {label}  epoch {result.epochs:>2}  done         valid loss "
                        f"{valid.get('valid_loss', '?')}  (ppl {valid.get('valid_ppl', '?')})")
            return
        if "Stopping training due to cumulative_training_time" in line:
            result.stopped_by_time_budget = True
            console.say(f"[{console.elapsed()}] {label}  time budget reached, stopping (best checkpoint kept)")
        elif "done training in" in line:
            console.say(f"[{console.elapsed()}] {label}  {line.split(' | ')[-1].strip()}")

    code = run_logged(cmd, result.train_log, env, on_line)
    result.train_seconds = time.monotonic() - started
    return code


def _parse_generate(log_path: str, result: ModelResult) -> None:
    bleu_re = re.compile(r"Generate \w+ with beam=\d+: (BLEU4? = ([0-9.]+).*)$")
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = bleu_re.search(line)
            if m:
                result.bleu_line, result.bleu = m.group(1), float(m.group(2))
            elif line.startswith("D-"):
                ident, _score, text = (line.split("\t") + ["", ""])[:3]
                result.hypotheses[int(ident[2:])] = text


def prepare_out_dir(out_dir: str) -> None:
    """Creates out_dir, or clears the quickstart's own files from an earlier run in it."""
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        if not os.path.exists(os.path.join(out_dir, MARKER)):
            raise QuickstartError(
                f"{out_dir} exists and was not made by the quickstart; pick another --out-dir "
                f"(the quickstart only clears folders it made itself)"
            )
        for entry in OWN_ENTRIES:
            path = os.path.join(out_dir, entry)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, MARKER), "w") as f:
        f.write("made by python -m fourierformer_fairseq.quickstart; rerunning it clears this folder's runs\n")


def run_quickstart(cfg: QuickstartConfig, console: Optional[Console] = None) -> Dict[str, ModelResult]:
    console = console or Console()
    sizes = cfg.sizes
    if sizes.max_epoch < 1:
        raise QuickstartError(f"--max-epoch must be at least 1, got {sizes.max_epoch}")
    if cfg.max_update is not None and cfg.max_update < 1:
        raise QuickstartError(f"--max-update must be at least 1, got {cfg.max_update}")
    if not cfg.time_budget_minutes > 0:
        raise QuickstartError(f"--time-budget-minutes must be positive, got {cfg.time_budget_minutes}")
    cores = os.cpu_count() or 1
    jobs = cfg.jobs or (2 if cores >= 2 else 1)
    if jobs not in (1, 2):
        raise QuickstartError(f"--jobs must be 1 or 2, got {cfg.jobs}")
    threads = max(1, cores // jobs)

    out = os.path.abspath(cfg.out_dir)
    prepare_out_dir(out)
    paths = {name: os.path.join(out, name) for name in ("corpus", "data-bin", "checkpoints", "logs", "translations")}
    for p in (paths["checkpoints"], paths["logs"], paths["translations"]):
        os.makedirs(p, exist_ok=True)
    commands: List[str] = []

    mode = "small (test) mode" if cfg.small else "full mode"
    MODELS = models()
    console.say(f"FourierFormer quickstart, {mode}: English -> Fourieran (synthetic), {MODELS[0][1]} vs "
                f"its softmax twin {MODELS[1][1]}")
    console.say(f"  output: {out}")
    console.say(f"  models: {sizes.layers}+{sizes.layers} layers, d {sizes.embed_dim}, {sizes.heads} heads, "
                f"ffn {sizes.ffn_dim}; up to {sizes.max_epoch} epochs or {cfg.time_budget_minutes:g} min each; "
                f"{jobs} training job(s) at a time, {threads} thread(s) each")
    for name, arch, extra in MODELS:
        if extra:
            console.say(f"  {name}: {arch} {' '.join(extra)}")

    # 1. corpus
    console.say(f"[{console.elapsed()}] 1/4 writing the synthetic corpus ({sizes.train} train / {sizes.valid} valid / "
                f"{sizes.test} test sentence pairs)")
    corpus = write_corpus(paths["corpus"], train=sizes.train, valid=sizes.valid, test=sizes.test, seed=cfg.seed)
    with open(corpus["test"] + "." + SOURCE_LANG, encoding="utf-8") as f:
        example = f.readline().strip()
    with open(corpus["test"] + "." + TARGET_LANG, encoding="utf-8") as f:
        example_ref = f.readline().strip()
    console.say(f"           e.g.  {example}\n             ->  {example_ref}")

    # 2. binarise
    env = subprocess_env(threads)
    cmd = preprocess_command(corpus, paths["data-bin"])
    commands.append(shell_line(cmd))
    console.say(f"[{console.elapsed()}] 2/4 fairseq-preprocess -> {paths['data-bin']}")
    log = os.path.join(paths["logs"], "preprocess.log")
    if run_logged(cmd, log, env) != 0:
        raise QuickstartError(f"fairseq-preprocess failed; see {log}:\n{_tail(log)}")

    # 3. train
    results: Dict[str, ModelResult] = {}
    train_cmds = {}
    for name, arch, extra in MODELS:
        save_dir = os.path.join(paths["checkpoints"], name)
        results[name] = ModelResult(
            name=name, arch=arch, checkpoint=os.path.join(save_dir, "checkpoint_best.pt"),
            train_log=os.path.join(paths["logs"], f"{name}-train.log"),
            generate_log=os.path.join(paths["logs"], f"{name}-generate.log"),
            translations=os.path.join(paths["translations"], f"{name}.test.{TARGET_LANG}"),
        )
        train_cmds[name] = train_command(arch, extra, paths["data-bin"], save_dir, sizes, cfg)
        commands.append(shell_line(train_cmds[name]))
    console.say(f"[{console.elapsed()}] 3/4 fairseq-train, both models (full logs: {paths['logs']})")
    width = max(len(n) for n, _, _ in MODELS)
    codes: Dict[str, int] = {}

    def train(name: str) -> None:
        codes[name] = train_model(results[name], train_cmds[name], env, console, width)

    if jobs == 2:
        threads_ = [threading.Thread(target=train, args=(name,)) for name, _, _ in MODELS]
        for t in threads_:
            t.start()
        for t in threads_:
            t.join()
    else:
        for name, _, _ in MODELS:
            train(name)
    for name, code in codes.items():
        if code != 0:
            raise QuickstartError(f"fairseq-train ({name}) failed; see {results[name].train_log}:\n"
                                  f"{_tail(results[name].train_log)}")
        if not os.path.exists(results[name].checkpoint):
            raise QuickstartError(f"fairseq-train ({name}) wrote no {results[name].checkpoint}; see "
                                  f"{results[name].train_log}")

    # 4. translate and score
    console.say(f"[{console.elapsed()}] 4/4 fairseq-generate on the test set (beam {cfg.beam}, sacreBLEU)")
    for name, _, _ in MODELS:
        r = results[name]
        cmd = generate_command(paths["data-bin"], r.checkpoint, cfg)
        commands.append(shell_line(cmd))
        if run_logged(cmd, r.generate_log, env) != 0:
            raise QuickstartError(f"fairseq-generate ({name}) failed; see {r.generate_log}:\n{_tail(r.generate_log)}")
        _parse_generate(r.generate_log, r)
        if r.bleu is None:
            raise QuickstartError(f"no BLEU score in {r.generate_log}:\n{_tail(r.generate_log)}")
        with open(r.translations, "w", encoding="utf-8") as f:
            for i in range(len(r.hypotheses)):
                f.write(r.hypotheses.get(i, "") + "\n")
        console.say(f"[{console.elapsed()}]     {name.ljust(width)}  {r.bleu_line}")

    with open(os.path.join(out, "commands.sh"), "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\n# the stock fairseq commands the quickstart ran, in order\nset -e\n")
        f.write("\n".join(commands) + "\n")
    summary = {
        "mode": mode,
        "sizes": asdict(sizes),
        "time_budget_minutes": cfg.time_budget_minutes,
        "seed": cfg.seed,
        "wall_seconds": round(time.monotonic() - console.start, 1),
        "models": {n: {k: v for k, v in asdict(r).items() if k != "hypotheses"} for n, r in results.items()},
    }
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    print_summary(results, out, console, corpus)
    return results


def print_summary(results: Dict[str, ModelResult], out: str, console: Console, corpus: Dict[str, str]) -> None:
    width = max(len(n) for n in results)
    console.say("")
    console.say(f"Done in {time.monotonic() - console.start:.0f}s. Test BLEU (sacreBLEU, beam search):")
    for name, r in results.items():
        loss = f"{r.best_valid_loss:.3f}" if r.best_valid_loss is not None else "?"
        budget = ", stopped by the time budget" if r.stopped_by_time_budget else ""
        console.say(f"  {name.ljust(width)}  BLEU {r.bleu:6.2f}   ({r.arch}; {r.epochs} epochs, {r.updates} updates, "
                    f"{r.train_seconds:.0f}s training{budget}, best valid loss {loss})")
    with open(corpus["test"] + "." + SOURCE_LANG, encoding="utf-8") as f:
        sources = [line.strip() for _, line in zip(range(2), f)]
    with open(corpus["test"] + "." + TARGET_LANG, encoding="utf-8") as f:
        references = [line.strip() for _, line in zip(range(2), f)]
    for i, (src, ref) in enumerate(zip(sources, references)):
        console.say(f"  example {i + 1}: {src}")
        console.say(f"    {'reference'.ljust(width)}  {ref}")
        for name, r in results.items():
            console.say(f"    {name.ljust(width)}  {r.hypotheses.get(i, '')}")
    console.say("Where things are:")
    for name, r in results.items():
        for i, (what, path) in enumerate((("checkpoint", r.checkpoint), ("training log", r.train_log),
                                          ("generate log", r.generate_log), ("translations", r.translations))):
            console.say(f"  {(name if i == 0 else '').ljust(width)}  {what.ljust(12)}  {path}")
    for what, path in (("corpus", os.path.join(out, "corpus")), ("data-bin", os.path.join(out, "data-bin")),
                       ("commands", os.path.join(out, "commands.sh") + "  (every step, to rerun by hand)"),
                       ("summary", os.path.join(out, "summary.json"))):
        console.say(f"  {what.ljust(width + 14)}  {path}")
