#!/usr/bin/env python3
"""Write the FourierFormer paper's tables in markdown from the logs of many runs.

    python scripts/analysis/tables/make_tables.py --runs runs/ [--head-redundancy runs/head_*.json]
                                  [--benchmark runs/benchmark.json] [--out tables.md]

Reads every run folder under --runs written by examples/*/train.sh (meta.json) and
evaluated by examples/*/evaluate.sh (results-test.json / results-lm.json, or, when those
are missing, the raw logs generate-test.txt / eval-{valid,test}.log), groups the runs
by model and settings, and writes mean +- std over seeds (sample std; n = runs), with the
paper's number in a column beside ours (scripts/analysis/tables/paper_numbers.json; "—" where not filled in):

  Table 1   WikiText-103 valid / test perplexity, small and medium, by protocol: every LM run, grouped
            by its settings; the paper's numbers beside the rows of PAPER_TABLES (examples/paper_runs.py)
            (its Fourier column is the published attention) trained under the published protocol
  Table 5   IWSLT'14 De-En BLEU (tokenised, beam 5) and sacreBLEU (detokenised)
  Table 6   head redundancy (from head_redundancy.py JSON files)
  Table 7   the paper's ablation over phi: the rows of PAPER_TABLES["table7"], by protocol
  Table 8   the paper's ablation over the radius: the rows of PAPER_TABLES["table8"], by protocol
  Table 9   efficiency (from benchmark_model.py JSON)

A run's protocol is meta.json's "protocol" (runs recorded without one trained fairseq's recipe).
"""
from __future__ import annotations

import argparse
import functools
import glob
import importlib.util
import json
import math
import os
import re
import sys
from collections import defaultdict

from fourierformer_fairseq.fairseq_runs import options_given

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def _paper_runs():
    """examples/paper_runs.py, the paper tables' runs as examples/reproduce.sh trains them, from its file."""
    spec = importlib.util.spec_from_file_location("paper_runs", os.path.join(REPO, "examples", "paper_runs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PAPER_TABLES = _paper_runs().PAPER_TABLES

TASKS = ("iwslt14", "wikitext103")
# A run's options are the --fourier-* arguments it gave fairseq-train (meta.json's "fourier",
# written by examples/lib.sh's write_meta with fourierformer_fairseq.fairseq_runs.options_given); an
# option it did not give is at its architecture's default. Runs that gave none are the default
# rows; the others get rows of their own, named by what they gave. Options that do not change the
# model are not settings:
NOT_SETTINGS = ("log_interval",)


@functools.lru_cache(maxsize=None)
def declared_defaults() -> dict:
    """What leaving each option unset means, read from FourierAttentionConfig (imported only for
    the ablation tables): an unset radius init is the automatic one (auto_radius)."""
    from dataclasses import fields

    from fourierformer_fairseq.models.fourierformer import FourierAttentionConfig

    out = {f.name[len("fourier_"):]: f.default for f in fields(FourierAttentionConfig)}
    out["radius_init"] = "auto"
    return out


DASH = "—"


# --------------------------------------------------------------------------- reading runs
def _float(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def read_bleu_from_generate(path: str):
    """The tokenised BLEU of a fairseq-generate output ('Generate test with beam=5: BLEU4 = 30.00, ...')."""
    if not os.path.exists(path):
        return None
    found = None
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            m = re.search(r"Generate \S+ with beam=\d+: BLEU4? = ([0-9.]+)", line)
            if m:
                found = float(m.group(1))
    return found


def read_ppl_from_eval_log(path: str):
    if not os.path.exists(path):
        return None
    m = re.findall(r"Loss \(base 2\): ([0-9.]+), Perplexity: ([0-9.]+)", open(path, encoding="utf-8", errors="replace").read())
    return float(m[-1][1]) if m else None


def read_run(folder: str) -> dict | None:
    meta_path = os.path.join(folder, "meta.json")
    if not os.path.exists(meta_path):
        return None
    meta = json.load(open(meta_path))
    task = meta.get("task")
    run = dict(meta)
    run["folder"] = folder
    given = meta["fourier"] if "fourier" in meta else options_given(meta.get("extra_args", []))
    run["fourier"] = {k: v for k, v in given.items() if k not in NOT_SETTINGS}
    if "radius_init" in run["fourier"]:
        run["fourier"]["radius_init"] = _float(run["fourier"]["radius_init"])
    nc = os.path.join(folder, "not_converged.json")  # examples/paper_runs.py: a diverged training
    if os.path.exists(nc):
        run["not_converged"] = json.load(open(nc))
    if task == "iwslt14":
        res_path = os.path.join(folder, "results-test.json")
        if os.path.exists(res_path):
            res = json.load(open(res_path))
            run["bleu"] = _float(res.get("bleu_tok"))
            run["sacrebleu"] = _float(res.get("sacrebleu"))
            run["sacrebleu_signature"] = res.get("sacrebleu_signature")
        else:
            run["bleu"] = read_bleu_from_generate(os.path.join(folder, "generate-test.txt"))
    elif task == "wikitext103":
        res_path = os.path.join(folder, "results-lm.json")
        res = json.load(open(res_path)) if os.path.exists(res_path) else {}
        for sub in ("valid", "test"):
            v = _float(res.get(f"{sub}_ppl"))
            if v is None:
                v = read_ppl_from_eval_log(os.path.join(folder, f"eval-{sub}.log"))
            run[f"{sub}_ppl"] = v
        run["eval_stride"] = res.get("stride")
    return run


def collect(roots: list[str]) -> list[dict]:
    runs = []
    for root in roots:
        for meta in sorted(glob.glob(os.path.join(root, "**", "meta.json"), recursive=True)):
            r = read_run(os.path.dirname(meta))
            if r:
                runs.append(r)
    return runs


# --------------------------------------------------------------------------- formatting
def mean_std(values):
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None, None, 0
    m = sum(vals) / len(vals)
    if len(vals) == 1:
        return m, None, 1
    var = sum((v - m) ** 2 for v in vals) / (len(vals) - 1)
    return m, math.sqrt(var), len(vals)


def fmt(m, s, digits=2):
    if m is None:
        return DASH
    if s is None:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def fmt_paper(x, digits=2):
    if x is None:
        return DASH
    if isinstance(x, str):  # the paper's words for a row without a number ("not converge")
        return x
    if isinstance(x, float) and (abs(x) < 1e-3 and x != 0):
        return f"{x:.2e}"
    return f"{x:.{digits}f}"


def not_converged_note(runs) -> str:
    """'' where every run converged; else the paper's words, "not converge", with the update each diverged
    run stopped at (examples/paper_runs.py writes it), after the converged seeds' mean where there are some."""
    stopped = [r["not_converged"].get("stopped_at_update", "?") for r in runs if r.get("not_converged")]
    if not stopped:
        return ""
    where = ", ".join(f"{u:,}" if isinstance(u, int) else str(u) for u in stopped)
    text = f"not converge (stopped at update {where})"
    if len(stopped) == len(runs):
        return text
    return f" ({len(stopped)} of {len(runs)} seeds {text})"


def ppl_cell(stats, note: str) -> str:
    """Our mean ± std, with not_converged_note's words (alone where no seed converged)."""
    return note if note and stats[0] is None else fmt(stats[0], stats[1]) + note


def table_md(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def data_name(run: dict) -> str:
    """The data set a run trained on: the basename of its data folder (e.g. iwslt14.tokenized.de-en)."""
    d = str(run.get("data") or "").rstrip("/")
    return os.path.basename(d) or DASH


# --------------------------------------------------------------------------- tables
def setting_label(run: dict) -> str:
    """'' for a softmax run or a Fourier run at its architecture's defaults, else e.g. ' (radius_init=0.5)'."""
    if run.get("model") == "softmax" or run.get("task") not in TASKS:
        return ""
    changed = [k if k in ("paper_exact", "published") else f"{k}={v}" for k, v in run.get("fourier", {}).items()]
    return f" ({', '.join(changed)})" if changed else ""


def protocol_of(run: dict) -> str:
    """The protocol a WikiText-103 run trained under; runs recorded before protocols trained fairseq's recipe."""
    return str(run.get("protocol") or "fairseq")


def _normalised(options: dict) -> dict:
    out = {}
    for k, v in options.items():
        if k in NOT_SETTINGS:
            continue
        f = _float(v)
        out[k] = f if f is not None else str(v)
    return out


def table_row_of(run: dict, table: str):
    """The row of PAPER_TABLES[table] a run is (same model, size and options), or None."""
    for row in PAPER_TABLES[table]["runs"]:
        name, model, size, extra, label, paper_row = row
        if (run.get("model") == model and (size is None or run.get("size") == size)
                and _normalised(run.get("fourier", {})) == _normalised(options_given(list(extra)))):
            return row
    return None


def table1(runs, paper) -> str | None:
    lm = [r for r in runs if r.get("task") == "wikitext103"]
    if not lm:
        return None
    groups = defaultdict(list)
    for r in lm:  # runs off the defaults get a row of their own, named by what they changed
        groups[(data_name(r), protocol_of(r), r.get("model"), r.get("size"), setting_label(r))].append(r)
    rows = []
    order = {"small": 0, "medium": 1}
    for (data, protocol, model, size, label), rs in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], order.get(kv[0][3], 9), kv[0][2] != "softmax", kv[0][2], kv[0][4])):
        v, t = mean_std([r["valid_ppl"] for r in rs]), mean_std([r["test_ppl"] for r in rs])
        diverged = not_converged_note(rs)
        row = table_row_of(rs[0], "table1")
        # the paper's number only beside its own row, trained as the paper trained it
        p = (paper.get("table1_wikitext103", {}).get(row[5], {})
             if row and row[5] and protocol == "published" else {})
        name = row[4] if row else f"{model} {size}{label}"
        strides = sorted({str(r.get("eval_stride")) for r in rs if r.get("eval_stride") is not None})
        rows.append([name, data, protocol, ppl_cell(v, diverged), ppl_cell(t, diverged), str(len(rs)),
                     fmt_paper(p.get("valid_ppl")), fmt_paper(p.get("test_ppl")), ",".join(strides) or DASH])
    return "### Table 1: WikiText-103 perplexity (lower is better)\n\n" + table_md(
        ["model", "data", "protocol", "valid PPL (ours)", "test PPL (ours)", "seeds", "valid PPL (paper)",
         "test PPL (paper)", "eval stride"], rows)


def table5(runs, paper) -> str | None:
    mt = [r for r in runs if r.get("task") == "iwslt14"]
    if not mt:
        return None
    groups = defaultdict(list)
    for r in mt:  # runs off the defaults get a row of their own, named by what they changed
        groups[(data_name(r), r.get("model"), setting_label(r))].append(r)
    rows, sigs = [], set()
    for (data, model, label), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "softmax", kv[0][1], kv[0][2])):
        b, s = mean_std([r.get("bleu") for r in rs]), mean_std([r.get("sacrebleu") for r in rs])
        sigs |= {r["sacrebleu_signature"] for r in rs if r.get("sacrebleu_signature")}
        p = {} if label else paper.get("table5_iwslt14", {}).get(model, {})
        rows.append([model + label, data, fmt(b[0], b[1]), fmt(s[0], s[1]), str(max(b[2], s[2])), fmt_paper(p.get("bleu"))])
    text = "### Table 5: IWSLT'14 De-En BLEU (higher is better)\n\n" + table_md(
        ["model", "data", "BLEU, tokenised (ours)", "sacreBLEU, detokenised (ours)", "seeds", "BLEU (paper)"], rows)
    if sigs:
        text += "\n\nsacreBLEU signature: " + "; ".join(f"`{s}`" for s in sorted(sigs))
    return text


def ablation(runs, table: str, title: str, paper_key: str, paper) -> str | None:
    """The rows of PAPER_TABLES[table] that have runs, by data and protocol; the paper's number beside
    its rows trained under the published protocol."""
    lm = [r for r in runs if r.get("task") == PAPER_TABLES[table]["task"]]
    by = defaultdict(lambda: defaultdict(list))  # (data, protocol) -> row name -> runs
    for r in lm:
        row = table_row_of(r, table)
        if row:
            by[(data_name(r), protocol_of(r))][row[0]].append(r)
    parts = []
    for (data, protocol), found in sorted(by.items()):
        if len(found) < 2:
            continue
        rows = []
        for name, model, size, extra, label, paper_row in PAPER_TABLES[table]["runs"]:
            rs = found.get(name)
            if not rs:
                continue
            p = paper.get(paper_key, {}).get(paper_row, {}) if paper_row and protocol == "published" else {}
            v, t = mean_std([r["valid_ppl"] for r in rs]), mean_std([r["test_ppl"] for r in rs])
            diverged = not_converged_note(rs)
            rows.append([label, "paper" if paper_row else "ours", ppl_cell(v, diverged),
                         ppl_cell(t, diverged), str(len(rs)), fmt_paper(p.get("valid_ppl")),
                         fmt_paper(p.get("test_ppl"))])
        size = PAPER_TABLES[table]["runs"][0][2]
        parts.append(f"### {title}, WikiText-103 {size} ({data}, {protocol} protocol)\n\n" + table_md(
            ["setting", "row", "valid PPL (ours)", "test PPL (ours)", "seeds", "valid PPL (paper)",
             "test PPL (paper)"], rows))
    return "\n\n".join(parts) if parts else None


def table6(files, paper) -> str | None:
    rows = []
    for f in files:
        d = json.load(open(f))
        name = d.get("label") or d.get("model") or os.path.basename(f)
        # a label that names a run of PAPER_TABLES["table6"] (reproduce.sh passes the run's name): its row
        row = next((r for r in PAPER_TABLES["table6"]["runs"] if r[0] == name), None)
        if row:
            name, key = row[4], row[5]
        else:
            key = name
        p = paper.get("table6_head_redundancy", {}).get(key, {}) if key else {}
        rows.append([name, f"{d['mean']:.4g}", f"{d['var']:.4g}", str(d.get("layers", DASH)), str(d.get("batches", DASH)),
                     fmt(p.get("mean"), p.get("mean_std")), fmt(p.get("var"), p.get("var_std"))])
    if not rows:
        return None
    return "### Table 6: head redundancy, layer-averaged pairwise L2 distance between heads' attention maps (higher = less redundant)\n\n" + table_md(
        ["model", "mean (ours)", "variance (ours)", "layers", "batches", "mean (paper)", "variance (paper)"], rows)


def table9(files, paper) -> str | None:
    rows = []
    for f in files:
        d = json.load(open(f))
        for m in d.get("models", []):
            p = paper.get("table9_efficiency", {}).get(m["name"], {})
            rows.append([m["name"], d.get("device", DASH), str(d.get("batch_size", DASH)), str(d.get("context", DASH)),
                         f"{m['train_ms_per_sample']:.2f}", f"{m['infer_ms_per_sample']:.2f}",
                         f"{m['train_peak_mem_mb']:.0f}", f"{m['infer_peak_mem_mb']:.0f}",
                         fmt_paper(p.get("train_ms_per_sample")), fmt_paper(p.get("test_ms_per_sample")),
                         fmt_paper(p.get("train_memory_gb")), fmt_paper(p.get("test_memory_gb"))])
    if not rows:
        return None
    return "### Table 9: efficiency of the small LM (same batch)\n\n" + table_md(
        ["model", "device", "batch", "context", "train ms/sample", "inference ms/sample", "train peak MB",
         "inference peak MB", "train ms/sample (paper)", "test ms/sample (paper)", "train GB (paper)",
         "test GB (paper)"], rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", default=["runs"], help="folders searched for run folders (meta.json)")
    p.add_argument("--head-redundancy", nargs="*", default=[], help="head_redundancy.py JSON outputs")
    p.add_argument("--benchmark", nargs="*", default=[], help="benchmark_model.py JSON outputs")
    p.add_argument("--paper", default=os.path.join(HERE, "paper_numbers.json"))
    p.add_argument("--out", help="markdown file (default: stdout)")
    args = p.parse_args(argv)

    paper = json.load(open(args.paper)) if os.path.exists(args.paper) else {}
    runs = collect(args.runs)
    parts = [f"<!-- written by scripts/analysis/tables/make_tables.py from {len(runs)} runs under {', '.join(args.runs)} -->"]
    for t in (table1(runs, paper), table5(runs, paper),
              table6(args.head_redundancy, paper),
              ablation(runs, "table7", "Table 7: ablation over phi", "table7_phi", paper),
              ablation(runs, "table8", "Table 8: ablation over the radius", "table8_radius", paper),
              table9(args.benchmark, paper)):
        if t:
            parts.append(t)
    missing = [r["folder"] for r in runs if r.get("not_converged") is None and (
               (r.get("task") == "iwslt14" and r.get("bleu") is None)
               or (r.get("task") == "wikitext103" and r.get("valid_ppl") is None and r.get("test_ppl") is None))]
    if missing:
        parts.append("Runs without evaluation results (run evaluate.sh on them): " + ", ".join(f"`{m}`" for m in missing))
    if len(parts) == 1:
        parts.append(f"No runs with meta.json found under {', '.join(args.runs)}.")
    text = "\n\n".join(parts) + "\n"
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            fh.write(text)
        print(f"make_tables: {len(runs)} runs -> {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
