#!/usr/bin/env python3
"""Tables of an examples/full_size/compare.sh folder: per task, every configuration's updates
reached, milliseconds per update, validation at the update counts all runs reached, gradient
norms, radii, the published preset's null-key share per layer, and at the common evaluation
update the test BLEU (translation, with --refs), attention entropy and pairs past a sinc zero.

    python examples/full_size/summarize.py RUNS [--refs multi30k/test_2016_flickr.en] [--json OUT]

BLEU is sacreBLEU -lc on the detokenised hypotheses (sacremoses), as in docs/training-dynamics.md.
Validation: the translation models' nll_loss (nats), the language models' perplexity.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics

from fourierformer_fairseq.fairseq_runs import detokenised_bleu, fairseq_log_records, generate_hypotheses

CONFIG_ORDER = ["softmax", "defaults", "gaussian", "paper_exact", "published"]


def parse_log(path: str) -> dict:
    with open(path, errors="replace") as fh:
        lines = fh.read().splitlines()
    stop = None
    for line in lines:
        if "Stopping training due to" in line:
            stop = line.split("Stopping training due to", 1)[1].strip()
    errors = [l.strip()[:300] for l in lines
              if re.search(r"FloatingPointError|Traceback|RuntimeError|CUDA error|out of memory", l)]
    train, valid = [], {}
    for tag, rec in fairseq_log_records(lines):
        if tag == "train_inner":
            train.append(rec)
        elif tag == "valid" and "valid_num_updates" in rec:
            valid[int(rec["valid_num_updates"])] = rec
    return {"train": train, "valid": valid, "errors": errors, "stop": stop}


def bleu(gen_path: str, refs: str) -> float | None:
    """The recipes' BLEU (fourierformer_fairseq.fairseq_runs.detokenised_bleu) of a fairseq-generate
    output against the raw references; None without sacrebleu / sacremoses or when they do not align."""
    try:
        import sacrebleu  # noqa: F401
        import sacremoses  # noqa: F401
    except ImportError:
        return None
    with open(gen_path, errors="replace") as fh:
        hyps = generate_hypotheses(fh)
    if not hyps:
        return None
    with open(refs) as fh:
        ref_lines = [l.rstrip("\n") for l in fh]
    if len(hyps) != len(ref_lines):
        return None
    return detokenised_bleu([hyps[i] for i in range(len(ref_lines))], ref_lines)[0]


def summarize(runs: str, refs: str | None) -> dict:
    result = {}
    for task in ("mt", "lm"):
        dirs = {os.path.basename(d)[len(task) + 1:]: d for d in glob.glob(os.path.join(runs, f"{task}_*"))
                if os.path.isdir(d)}
        if not dirs:
            continue
        configs = sorted(dirs, key=lambda c: CONFIG_ORDER.index(c) if c in CONFIG_ORDER else 99)
        common_file = os.path.join(runs, f"{task}_common_update")
        common = int(open(common_file).read()) if os.path.exists(common_file) else None
        rows = {}
        for c in configs:
            log = parse_log(os.path.join(dirs[c], "train.log"))
            tr = log["train"]
            reached = [int(r["num_updates"]) for r in tr] + list(log["valid"])
            row = {"updates": max(reached, default=0), "stop": log["stop"], "errors": log["errors"][:3]}
            ups = [float(r["ups"]) for r in tr[len(tr) // 3:] if float(r.get("ups", 0)) > 0]
            row["ms_per_update"] = 1000 / statistics.median(ups) if ups else None
            gn = [float(r["gnorm"]) for r in tr if "gnorm" in r]
            row["gnorm_median"] = statistics.median(gn) if gn else None
            row["gnorm_max"] = max(gn) if gn else None
            key = "valid_nll_loss" if task == "mt" else "valid_ppl"
            row["valid"] = {u: float(r[key]) for u, r in sorted(log["valid"].items()) if key in r}
            with_radius = [r for r in tr if any(k.startswith("radius_") and v is not None for k, v in r.items())]
            last = {k: v for k, v in (with_radius[-1] if with_radius else {}).items() if v is not None}
            row["radius"] = {k[7:]: float(v) for k, v in last.items() if k.startswith("radius_")}
            row["nullkey_last"] = {k[8:]: float(v) for k, v in last.items() if k.startswith("nullkey_")}
            row["nullkey_curve"] = [(int(r["num_updates"]), {k[8:]: float(v) for k, v in r.items()
                                                             if k.startswith("nullkey_") and v is not None})
                                    for r in tr if any(k.startswith("nullkey_") and v is not None for k, v in r.items())]
            if common:
                ent = os.path.join(dirs[c], f"entropy_{common}.json")
                if os.path.exists(ent):
                    pts = json.load(open(ent))["points"]
                    row["entropy"] = pts[-1]["entropy"] if pts else None
                gen = os.path.join(dirs[c], f"gen_{common}.txt")
                if task == "mt" and refs and os.path.exists(gen):
                    row["bleu"] = bleu(gen, refs)
            rows[c] = row
        result[task] = {"common_update": common, "rows": rows}
    return result


def fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def print_tables(res: dict) -> None:
    for task, t in res.items():
        rows, common = t["rows"], t["common_update"]
        metric = "valid nll_loss" if task == "mt" else "valid perplexity"
        print(f"\n## {task}: {metric}; evaluated at update {common}\n")
        shared = sorted(set.intersection(*[set(r["valid"]) for r in rows.values()])) if rows else []
        cols = shared[-6:]
        head = ["config", "updates", "ms/update"] + [f"@{u}" for u in cols] + ["gnorm med/max"]
        head += ["test BLEU"] if task == "mt" else []
        head += ["entropy", "past zero", "radii"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for c, r in rows.items():
            cells = [c, str(r["updates"]), fmt(r["ms_per_update"], ".0f")]
            cells += [fmt(r["valid"].get(u), ".3f" if task == "mt" else ".1f") for u in cols]
            cells.append(f"{fmt(r['gnorm_median'], '.2f')} / {fmt(r['gnorm_max'], '.2f')}")
            if task == "mt":
                cells.append(fmt(r.get("bleu"), ".1f"))
            ent = r.get("entropy") or {}
            sites = sorted(k for k in ent if "/" not in k)
            cells.append(" / ".join(f"{s} {ent[s]:.2f}" for s in sites) or "-")
            pz = sorted(k for k in ent if k.startswith("past_zero/"))
            cells.append(" / ".join(f"{100 * ent[k]:.2g} %" for k in pz) or "-")
            rad = list(r["radius"].values())
            cells.append(f"{min(rad):.2f}-{max(rad):.2f}" if rad else "-")
            print("| " + " | ".join(cells) + " |")
        for c, r in rows.items():
            if r["errors"]:
                print(f"\n{c}: {r['errors'][0]}")
            if r["nullkey_curve"]:
                print(f"\n{c}: null key share per layer (update: layer share)")
                for u, d in r["nullkey_curve"][:: max(1, len(r["nullkey_curve"]) // 8)] + r["nullkey_curve"][-1:]:
                    print(f"  {u}: " + ", ".join(f"{k} {v:.2f}" for k, v in d.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs")
    ap.add_argument("--refs", help="the test references (Multi30k test_2016_flickr.en) for BLEU")
    ap.add_argument("--json", help="also write the numbers as JSON")
    args = ap.parse_args(argv)
    res = summarize(args.runs, args.refs)
    if not res:
        print(f"no runs under {args.runs}")
        return 1
    print_tables(res)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
