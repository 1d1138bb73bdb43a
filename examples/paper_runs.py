#!/usr/bin/env python3
"""The paper tables' runs as examples/reproduce.sh trains them (``PAPER_TABLES``), what a diverged run
leaves, and what the runs cost.

    python examples/paper_runs.py plan table1 table8 # the distinct runs of the tables, one a line
    python examples/paper_runs.py diverged RUN       # a failed training: record it as not converged?
    python examples/paper_runs.py dry-run table7 --timings docs/records/step_times.json [--commands FILE]

**The plan.** Each table's runs (``PAPER_TABLES``): a run's name, model, size and the fairseq-train
arguments beyond its recipe's (fourierformer_fairseq/training_recipes.py, which this file reads as a
file); scripts/analysis/tables/make_tables.py reads the rows back from here.

**Not converged.** A row that diverges (the paper reports x, x^3 and sigmoid as not converging) stops
fairseq-train: its trainer raises FloatingPointError ("gradients are Nan/Inf" in float32; "Minimum
loss scale reached" under --fp16 or --amp) and, before it does, saves ``crash.pt`` in the run's
checkpoint folder. ``diverged RUN`` reads the run's train.log and that checkpoint and writes
RUN/not_converged.json (the error, the update it stopped at), so that reproduce.sh goes on with the
next row and scripts/analysis/tables/make_tables.py prints "not converge" for it; any other failure is not a
divergence (exit status 1: reproduce.sh stops on it).

**The cost** of a run is its updates times the step time of what it executes
(``step_time_of``): the language models by protocol, size, attention (the softmax twin; a Fourier row
on the fused kernels, or on the reference backend where its phi is not fused) and precision (the
protocols train float32), from a step-time record (``--timings``: scripts/tools/gpu_check.py's ``steptimes``
step writes one at the protocol's own shapes); a run whose step time the record does not hold has
an unknown cost, said so, never assumed. Each distinct run is counted once, with the tables that
share it.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _load_recipes():
    """fourierformer_fairseq/training_recipes.py, as a file (it imports nothing of the package)."""
    spec = importlib.util.spec_from_file_location(
        "training_recipes_file", os.path.join(REPO, "fourierformer_fairseq", "training_recipes.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tr = _load_recipes()

NOT_CONVERGED = "not_converged.json"
# fairseq's words for a training that overflowed or went NaN (its trainer and loss scalers)
DIVERGENCE_MESSAGES = ("gradients are Nan/Inf", "Minimum loss scale reached")


# ------------------------------------------------------------------------------------- the plan

# The runs of each paper table, as examples/reproduce.sh trains them (per seed) and
# scripts/analysis/tables/make_tables.py reads them back (by this file): (run name, model, size, fairseq-train arguments beyond
# the protocol's, the row's label, the paper's row in scripts/analysis/tables/paper_numbers.json or None for a row
# of this project's own). The paper's FourierFormer is the published attention (--fourier-published)
# with the row's phi or radius; this project's rows (the defaults: unit-RMS q / k and the automatic
# radius; the Gaussian kernel) stand beside them. A run named in several tables is trained once.
_PUBLISHED = ("--fourier-published",)
PAPER_TABLES = {
    "table1": {"task": "wikitext103", "runs": (
        ("softmax_small", "softmax", "small", (), "softmax small", "softmax small"),
        ("published_small", "fourier", "small", _PUBLISHED, "FourierFormer small (published attention)", "fourier small"),
        ("fourier_small", "fourier", "small", (), "FourierFormer small (defaults)", None),
        ("softmax_medium", "softmax", "medium", (), "softmax medium", "softmax medium"),
        ("published_medium", "fourier", "medium", _PUBLISHED, "FourierFormer medium (published attention)", "fourier medium"),
        ("fourier_medium", "fourier", "medium", (), "FourierFormer medium (defaults)", None),
    )},
    "table5": {"task": "iwslt14", "runs": (
        ("softmax", "softmax", None, (), "softmax", "softmax"),
        ("fourier", "fourier", None, (), "FourierFormer (defaults)", "fourier"),
    )},
    "table7": {"task": "wikitext103", "runs": (
        ("published_small_power2", "fourier", "small", _PUBLISHED + ("--fourier-power", "2"), "phi x^2", "x^2"),
        ("published_small", "fourier", "small", _PUBLISHED, "phi x^4", "x^4"),
        ("published_small_power6", "fourier", "small", _PUBLISHED + ("--fourier-power", "6"), "phi x^6", "x^6"),
        ("published_small_power1", "fourier", "small", _PUBLISHED + ("--fourier-power", "1"), "phi x", "x"),
        ("published_small_power3", "fourier", "small", _PUBLISHED + ("--fourier-power", "3"), "phi x^3", "x^3"),
        ("published_small_phiabs", "fourier", "small", _PUBLISHED + ("--fourier-phi", "abs"), "phi |x|", "|x|"),
        ("published_small_phirelu", "fourier", "small", _PUBLISHED + ("--fourier-phi", "relu"), "phi ReLU", "ReLU"),
        ("published_small_phisigmoid", "fourier", "small", _PUBLISHED + ("--fourier-phi", "sigmoid"), "phi sigmoid",
         "sigmoid"),
        ("fourier_small", "fourier", "small", (), "defaults (x^4, unit-RMS q / k, automatic radius)", None),
        ("fourier_small_gaussian", "fourier", "small", ("--fourier-kernel", "gaussian"), "defaults, Gaussian kernel",
         None),
    )},
    "table8": {"task": "wikitext103", "runs": (
        ("published_small_radius0.1", "fourier", "small", _PUBLISHED + ("--fourier-radius-init", "0.1"), "R_init 0.1",
         "R_init 0.1"),
        ("published_small_radius1.0", "fourier", "small", _PUBLISHED + ("--fourier-radius-init", "1.0"), "R_init 1.0",
         "R_init 1.0"),
        ("published_small", "fourier", "small", _PUBLISHED, "R_init 2.0", "R_init 2.0"),
        ("published_small_radius3.0", "fourier", "small", _PUBLISHED + ("--fourier-radius-init", "3.0"), "R_init 3.0",
         "R_init 3.0"),
        ("published_small_radius4.0", "fourier", "small", _PUBLISHED + ("--fourier-radius-init", "4.0"), "R_init 4.0",
         "R_init 4.0"),
        ("published_small_vector", "fourier", "small", _PUBLISHED + ("--fourier-radius-shape", "vector"),
         "R a learnable vector, 2.0", "R vector 2.0"),
        ("fourier_small", "fourier", "small", (), "defaults (automatic radius, a scalar)", None),
        ("fourier_small_radius_head", "fourier", "small", ("--fourier-radius-shape", "head"),
         "defaults, a radius per head", None),
        ("fourier_small_radius_feature", "fourier", "small", ("--fourier-radius-shape", "feature"),
         "defaults, a radius per head and feature", None),
    )},
}
PAPER_TABLES["table6"] = {"task": "wikitext103",  # head redundancy of table 1's small models
                          "runs": tuple(r for r in PAPER_TABLES["table1"]["runs"] if r[2] == "small")}
PAPER_SEEDS = 3


def table_runs(table: str):
    try:
        return PAPER_TABLES[table]
    except KeyError:
        raise ValueError(f"unknown table '{table}' (choose from {', '.join(PAPER_TABLES)})") from None


def distinct_runs(tables) -> list:
    """Each distinct run of the tables once, in the order they first appear: (task, run, model, size,
    extra, label, [tables that train it]). A run is the same run in two tables by its name."""
    seen, out = {}, []
    for table in tables:
        spec = table_runs(table)
        for run, model, size, extra, label, _ in spec["runs"]:
            key = (spec["task"], run)
            if key not in seen:
                seen[key] = [spec["task"], run, model, size, tuple(extra), label, []]
                out.append(seen[key])
            if table not in seen[key][6]:
                seen[key][6].append(table)
    return [tuple(r) for r in out]


# ------------------------------------------------------------------------------------- not converged

def divergence(run: str) -> dict | None:
    """What RUN's failed training says about a divergence: None where its log shows none; else the
    error and the update it stopped at (fairseq's crash.pt holds the updates done before it)."""
    log = os.path.join(run, "train.log")
    if not os.path.exists(log):
        return None
    text = open(log, encoding="utf-8", errors="replace").read()
    error = next((line.strip() for line in reversed(text.splitlines())
                  if line.startswith("FloatingPointError") and any(m in line for m in DIVERGENCE_MESSAGES)), None)
    if error is None:
        return None
    out = {"error": error}
    crash = os.path.join(run, "checkpoints", "crash.pt")
    done = None
    if os.path.exists(crash):
        import torch

        state = torch.load(crash, map_location="cpu", weights_only=False)
        done = int(state["optimizer_history"][-1]["num_updates"])
        out["source"] = "checkpoints/crash.pt"
    else:  # the last update fairseq logged
        found = re.findall(r"num_updates[=\"': ]+(\d+)", text)
        if found:
            done, out["source"] = int(found[-1]), "train.log (the last logged update; it stopped later)"
    if done is not None:
        out["updates_done"] = done
        out["stopped_at_update"] = done + 1
    return out


def record_divergence(run: str) -> dict | None:
    """Writes RUN/not_converged.json when RUN's training diverged; returns what it wrote (or None)."""
    found = divergence(run)
    if found is not None:
        with open(os.path.join(run, NOT_CONVERGED), "w") as fh:
            json.dump(found, fh, indent=1, sort_keys=True)
    return found


# ------------------------------------------------------------------------------------- the cost

def attention_setting(extra) -> dict:
    """phi and power of a Fourier run from its --fourier-* arguments (an option not given: its default)."""
    from fourierformer_fairseq.fairseq_runs import options_given

    given = options_given(list(extra))
    power = int(given.get("power", 4))  # the published attention's p, the defaults' too
    return {"phi": str(given.get("phi", "power")), "power": power, "kernel": str(given.get("kernel", "fourier"))}


def attention_backend(extra, head_dim: int) -> tuple:
    """The op's backend for a Fourier run's attention on a GPU: ("fused" | "reference", why), or
    (None, why) where the extension's limits are not known here. Asked of the CUDA kernel's own
    declaration (fourierformer_fairseq/ops/backends.py), less what only a GPU would change (the
    device, whether one is visible)."""
    import torch

    from fourierformer_fairseq.ops import DECLARATIONS
    from fourierformer_fairseq.ops.inputs import AttentionInputs

    setting = attention_setting(extra)
    if setting["kernel"] != "fourier":
        return setting["kernel"], f"the {setting['kernel']} kernel's attention, not the Fourier op"
    cuda = DECLARATIONS["cuda"]
    if cuda._limits is None:
        return None, "the extension is not loaded here: its kernels' limits are unknown"
    x = torch.zeros(1, 1, 2, head_dim)
    inp = AttentionInputs(q=x, k=x, v=x, radius_hd=torch.ones(1, head_dim), power=setting["power"],
                          phi=setting["phi"], attn_mask=None, key_padding_mask=None, causal=True, dropout_p=0.0)
    here = set(cuda._availability_reasons)
    reasons = [r for r in cuda.not_supported_reasons(inp) if r not in here and not r.startswith("inputs are on")]
    if reasons:
        return "reference", "; ".join(reasons)
    return "fused", f"the fused kernels take phi {setting['phi']}, p {setting['power']}"


def head_dim(size: str) -> int:
    """The LM's attention head dim at a size (fairseq's defaults of the architectures: d / 8 heads)."""
    return {"small": 16, "medium": 32}[size]


# The IWSLT'14 recipe stops after epochs, not updates. Its training set, as fairseq's
# prepare-iwslt14.sh makes it, is 160,239 sentence pairs; at 4,096 tokens a batch fairseq makes
# about 1,100 updates an epoch of it (an estimate, not measured here: about 27 BPE tokens a
# sentence with padding, 150 sentences a batch). Only the dry run's GPU-hours use it.
IWSLT14_UPDATES_PER_EPOCH_ESTIMATE = 1100
# Multi-GPU scaling assumed until it is measured: data-parallel efficiency by GPU count (1.0:
# linear, the same GPU-hours on any count).
ASSUMED_SCALING_EFFICIENCY = {1: 1.0, 2: 1.0, 8: 1.0}
# The precision the step times are read at: both protocols train float32 (no --fp16).
TRAINED_PRECISION = "fp32"


def step_times(path: str) -> dict:
    """A step-time record (reproduce.sh passes the dated one, docs/records/step_times.json, or its --timings)."""
    with open(path) as fh:
        return json.load(fh)


def shown_path(path: str) -> str:
    """A path as the dry run prints it: relative to the repository where it lies inside it."""
    full = os.path.abspath(path)
    return os.path.relpath(full, REPO) if full.startswith(REPO + os.sep) else path


def updates_per_run(name: str, protocol: str = None, size: str = None) -> int:
    """The updates of one run of the recipe as the paper's tables train it."""
    if name == "iwslt14":
        return int(tr.recipe_value(name, "--max-epoch")) * IWSLT14_UPDATES_PER_EPOCH_ESTIMATE
    return int(tr.recipe_value(name, "--max-update", protocol, size))


def tokens_per_update(name: str, protocol: str = None, size: str = None) -> int:
    """Tokens an update: sequences x context (LM); --max-tokens, the most there can be (translation)."""
    if name == "iwslt14":
        return int(tr.recipe_value(name, "--max-tokens"))
    rec = tr.recipe(name, protocol, size)
    values = dict(rec["options"])
    return int(values["--batch-size"]) * int(values["--update-freq"]) * int(values["--tokens-per-sample"])


def lm_pass(protocol: str, size: str) -> tuple:
    """(sequences a pass, tokens a sequence, passes an update) of a protocol's LM at a size."""
    values = dict(tr.lm_recipe(protocol, size)["options"])
    return int(values["--batch-size"]), int(values["--tokens-per-sample"]), int(values["--update-freq"])


def step_time_of(record: dict, task: str, protocol, size, attention: str, precision: str = TRAINED_PRECISION):
    """(ms an update, how it was had) of a run from the record; (None, why not) where the record does not
    hold what the run executes. A language model's entry must be of its protocol, size, attention and
    context; one measured at another number of sequences a pass is scaled per sequence (said so). A
    translation entry is scaled per token to the recipe's --max-tokens."""
    entries = [e for e in record.get("step_times", []) if e.get("task") == task and e.get("attention") == attention
               and e.get("precision") == precision and e.get("protocol") == protocol and e.get("size") == size]
    what = f"{task}{' ' + protocol + ' protocol' if protocol else ''}{' ' + size if size else ''}, {attention}, {precision}"
    if not entries:
        return None, f"not in the record ({what})"
    e = entries[-1]
    if e.get("ms_per_pass") is None:
        return None, f"not measured ({what}: {e.get('error', 'no time')})"
    if task == "wikitext103":
        seqs, context, passes = lm_pass(protocol, size)
        if e["tokens_per_sequence"] != context:
            return None, f"measured at a context of {e['tokens_per_sequence']}, not {context} ({what})"
        ms = e["ms_per_pass"] * seqs / e["sequences_per_pass"] * passes
        how = "measured" if e["sequences_per_pass"] == seqs else \
            f"scaled from {e['sequences_per_pass']} to {seqs} sequences a pass"
        return ms, how
    tokens = tokens_per_update(task)
    ms = e["ms_per_pass"] * tokens / e["tokens_per_pass"]
    return ms, "measured" if e["tokens_per_pass"] == tokens else f"scaled from {e['tokens_per_pass']} to {tokens} tokens"


def run_cost(task, run, model, size, extra, protocol, record) -> dict:
    """One seed of a run: its updates, tokens, attention backend and GPU-hours on one GPU (None: unknown, with why)."""
    protocol = protocol if task == "wikitext103" else None
    updates = updates_per_run(task, protocol, size)
    tokens = updates * tokens_per_update(task, protocol, size)
    if model == "softmax":
        attention, backend_why = "softmax", "the softmax twin"
    else:
        attention, backend_why = attention_backend(extra, head_dim(size) if size else 64)
    out = {"updates": updates, "tokens": tokens, "attention": attention, "backend_why": backend_why,
           "gpu_hours": None}
    if attention is None:
        out["why"] = backend_why
        return out
    ms, how = step_time_of(record, task, protocol, size, attention)
    if ms is None:
        out["why"] = how + " (scripts/tools/gpu_check.py --steps steptimes measures it)"
        if attention == "reference":
            out["why"] += "; it runs the slow reference backend, not the fused kernels' speed"
        return out
    out.update(gpu_hours=updates * ms / 3.6e6, how=how)
    return out


def dry_run_lines(tables, protocol=None, record=None, record_path: str = None, seeds: int = PAPER_SEEDS,
                  commands: dict = None) -> list:
    """What reproduce.sh --dry-run prints: each distinct run once (the tables that share it, its attention
    backend, updates, tokens, GPU-hours a seed on 1, 2 and 8 GPUs or why unknown, its commands: {run: [lines]}),
    then each table's total (its runs, as if trained alone) and, for several tables, the total of the
    distinct runs. The step times: record (a dict) or the file record_path."""
    protocol = protocol or tr.DEFAULT_LM_PROTOCOL
    if record is None:
        if record_path is None:
            raise ValueError("no step-time record (--timings FILE)")
        record = step_times(record_path)
    counts = sorted(ASSUMED_SCALING_EFFICIENCY)
    note = record.get("note", "")
    source = shown_path(record_path) if record_path else "the record given"
    lines = [f"# step times: {source} ({record.get('date', '?')}, {record.get('machine', '?')}; "
             f"{record.get('kernels', '?')}){': ' + note if note else ''}",
             f"# GPU-hours a seed on 1 GPU at the {TRAINED_PRECISION} step time of what the run executes; on "
             + ", ".join(f"{n} GPUs" for n in counts[1:]) + " with the assumed multi-GPU efficiency "
             + ", ".join(f"{n}: {ASSUMED_SCALING_EFFICIENCY[n]:g}" for n in counts) + " (not measured)"]
    costs = {}
    for task, run, model, size, extra, label, shared in distinct_runs([t for t in tables]):
        c = run_cost(task, run, model, size, extra, protocol, record)
        costs[(task, run)] = c
        what = f"{task} {size + ' ' if size else ''}{run}" + (f" ({protocol} protocol)" if task == "wikitext103" else "")
        backend = {"softmax": "softmax attention", "fused": "the fused kernels",
                   "reference": "the slow reference backend", None: "backend unknown"}.get(c["attention"], c["attention"])
        lines.append(f"{what}: {label}; in {', '.join(shared)}; attention: {backend}"
                     + (f" ({c['backend_why']})" if c["attention"] not in ("softmax", "fused") else ""))
        head = f"  {seeds} seeds x {c['updates']:,} updates = {seeds * c['tokens'] / 1e9:.2f}G tokens; "
        if c["gpu_hours"] is None:
            lines.append(head + f"cost unknown: {c['why']}")
        else:
            hours = [c["gpu_hours"] / ASSUMED_SCALING_EFFICIENCY[n] for n in counts]
            lines.append(head + "a seed " + ", ".join(
                f"{h:.1f} GPU-h on {n} GPU{'s' if n > 1 else ''} ({h / n:.1f} h)" for n, h in zip(counts, hours))
                + f" ({c['how']})")
        for cmd in (commands or {}).get(run, []):
            lines.append(f"  {cmd}")

    def total(keys, name):
        known = [costs[k]["gpu_hours"] for k in keys if costs[k]["gpu_hours"] is not None]
        unknown = [k[1] for k in keys if costs[k]["gpu_hours"] is None]
        hours = seeds * sum(known)
        text = (f"{name} total: {hours:.0f} GPU-hours on 1 GPU, "
                + ", ".join(f"{hours / ASSUMED_SCALING_EFFICIENCY[n] / n:.0f} h on {n}" for n in counts)
                + f" (wall-clock), {len(known)} of {len(keys)} runs")
        return text + (f"; cost unknown: {', '.join(unknown)}" if unknown else "")

    for table in tables:
        spec = table_runs(table)
        keys = list(dict.fromkeys((spec["task"], r[0]) for r in spec["runs"]))
        lines.append(total(keys, table))
    if len(tables) > 1:
        lines.append(total(list(costs), f"all {len(tables)} tables (each distinct run once)"))
    return lines


# ------------------------------------------------------------------------------------- command line

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    pl = sub.add_parser("plan", help="each distinct run of the tables once: task, name, model, size and the "
                                     "extra arguments, tab-separated")
    pl.add_argument("tables", nargs="+")
    d = sub.add_parser("diverged", help="record RUN's failed training as not converged (exit 1: not a divergence)")
    d.add_argument("run")
    dr = sub.add_parser("dry-run", help="each distinct run of the tables once, its backend, updates, tokens and "
                                        "GPU-hours, and the totals")
    dr.add_argument("tables", nargs="+")
    dr.add_argument("--protocol", help=f"the WikiText-103 protocol (default {tr.DEFAULT_LM_PROTOCOL})")
    dr.add_argument("--timings", required=True, metavar="FILE",
                    help="the step-time record (reproduce.sh passes docs/records/step_times.json or its --timings)")
    dr.add_argument("--seeds", type=int, default=PAPER_SEEDS)
    dr.add_argument("--commands", help="a file of 'RUN<tab>COMMAND' lines (a recipe's --print-command), printed "
                                       "under their run")
    args = p.parse_args(argv)
    try:
        if args.what == "diverged":
            found = record_divergence(args.run)
            if found is None:
                print(f"paper_runs.py: {args.run}: no divergence in its train.log", file=sys.stderr)
                return 1
            print(f"{args.run}: not converged ({found['error']}; stopped at update "
                  f"{found.get('stopped_at_update', '?')}): {os.path.join(args.run, NOT_CONVERGED)}", file=sys.stderr)
            return 0
        if args.what == "plan":
            for task, run, model, size, extra, _, _ in distinct_runs(args.tables):
                print("\t".join([task, run, model, size or "-", *extra]))
            return 0
        commands = {}
        if args.commands:
            with open(args.commands) as fh:
                for line in fh:
                    run, _, cmd = line.rstrip("\n").partition("\t")
                    commands.setdefault(run, []).append(cmd)
        print("\n".join(dry_run_lines(args.tables, args.protocol, record_path=args.timings, seeds=args.seeds,
                                      commands=commands)))
    except (ValueError, OSError, KeyError) as e:
        print(f"paper_runs.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
