"""The fairseq-train hyper-parameters of each task's recipe, in one table.

``examples/iwslt14/train.sh`` and ``examples/wikitext103/train.sh`` train with them (the command-line
interface below prints them for a shell), ``examples/full_size/compare.sh``, ``scripts/gpu_check.py``
and the quickstart train with them and change what their own budgets need, by name. The softmax twin
of each architecture is ``fourierformer_fairseq.models.SOFTMAX_TWINS``.

    python fourierformer_fairseq/training_recipes.py iwslt14                 # the options, one a line
    python fourierformer_fairseq/training_recipes.py iwslt14 --set lr 1e-3 --drop max-epoch
    python fourierformer_fairseq/training_recipes.py wikitext103 --shell     # NAME=value lines for a shell
    python fourierformer_fairseq/training_recipes.py --paper-updates         # updates of each paper table's runs

This file imports nothing of the package (nor fairseq or torch), so a shell can run it as a file.
"""
from __future__ import annotations

import argparse
import shlex
import sys

# Each recipe: the architecture it trains, and its fairseq-train options in the order they are
# given (None: a flag without a value). Values are strings, as on a command line.
RECIPES = {
    # fairseq's IWSLT'14 De-En transformer recipe (examples/translation in fairseq)
    "iwslt14": {
        "arch": "fourierformer_iwslt_de_en",
        "options": (
            ("--share-decoder-input-output-embed", None),
            ("--optimizer", "adam"), ("--adam-betas", "(0.9, 0.98)"), ("--clip-norm", "0.0"),
            ("--lr", "5e-4"), ("--lr-scheduler", "inverse_sqrt"), ("--warmup-updates", "4000"),
            ("--dropout", "0.3"), ("--weight-decay", "0.0001"),
            ("--criterion", "label_smoothed_cross_entropy"), ("--label-smoothing", "0.1"),
            ("--max-tokens", "4096"), ("--max-epoch", "50"),
        ),
    },
    # the WikiText-103 language models (small: 16 layers, d 128; medium: d 256): 96 sequences an
    # update (16 a pass, 6 passes), 120,000 updates
    "wikitext103": {
        "arch": "fourierformer_lm_wiki103_small",
        "sizes": {  # each size's architecture and --tokens-per-sample
            "small": {"arch": "fourierformer_lm_wiki103_small", "context": "256"},
            "medium": {"arch": "fourierformer_lm_wiki103_medium", "context": "384"},
        },
        "options": (
            ("--task", "language_modeling"), ("--tokens-per-sample", "256"), ("--sample-break-mode", "none"),
            ("--optimizer", "adam"), ("--adam-betas", "(0.9, 0.98)"), ("--clip-norm", "0.25"),
            ("--weight-decay", "0.01"), ("--dropout", "0.1"),
            ("--lr", "5e-4"), ("--lr-scheduler", "inverse_sqrt"), ("--warmup-updates", "4000"),
            ("--warmup-init-lr", "1e-07"),
            ("--batch-size", "16"), ("--update-freq", "6"), ("--max-update", "120000"),
        ),
    },
}

# The IWSLT'14 recipe stops after epochs, not updates. Its training set, as fairseq's
# prepare-iwslt14.sh makes it, is 160,239 sentence pairs; at 4,096 tokens a batch fairseq makes
# about 1,100 updates an epoch of it (an estimate, not measured here: about 27 BPE tokens a
# sentence with padding, 150 sentences a batch). Only the GPU-hour estimates use it.
IWSLT14_UPDATES_PER_EPOCH_ESTIMATE = 1100

# The paper's tables as examples/reproduce.sh trains them, per seed: (recipe, size, number of
# runs). Table 6 reuses table 1's small models, table 9 and E.4 train nothing.
PAPER_TABLE_RUNS = {
    "table1": (("wikitext103", "small", {"softmax": 1, "fourier": 1}),
               ("wikitext103", "medium", {"softmax": 1, "fourier": 1})),
    "table5": (("iwslt14", None, {"softmax": 1, "fourier": 1}),),
    "table7": (("wikitext103", "small", {"fourier": 4}),),  # phi: power (the default), abs, relu, sigmoid
    "table8": (("wikitext103", "small", {"fourier": 7}),),  # radius init auto/0.5/1/2/4, shape head/feature
}
PAPER_SEEDS = 3


def recipe(name: str) -> dict:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe '{name}' (choose from {', '.join(RECIPES)})") from None


def recipe_value(name: str, option: str):
    for opt, value in recipe(name)["options"]:
        if opt == option:
            return value
    raise ValueError(f"recipe '{name}' has no option {option}")


def recipe_args(name: str, set_options=None, drop=()) -> list:
    """The recipe's fairseq-train arguments: set_options ({"--lr": "1e-3", ...}) replaces the
    value of an option in place or, for an option the recipe does not give, appends it (value
    None: a flag); drop leaves options out. Unknown options in drop are an error (a typo would
    otherwise keep the recipe's value silently)."""
    set_options = dict(set_options or {})
    options = recipe(name)["options"]
    given = {opt for opt, _ in options}
    missing = [opt for opt in drop if opt not in given]
    if missing:
        raise ValueError(f"recipe '{name}' has no option {', '.join(missing)} to drop")
    out = []
    for opt, value in list(options) + [(opt, set_options[opt]) for opt in set_options if opt not in given]:
        if opt in drop:
            continue
        value = set_options.get(opt, value)
        out += [opt] if value is None else [opt, str(value)]
    return out


def updates_per_run(name: str) -> int:
    """The updates of one run of the recipe as the paper's tables train it."""
    if name == "iwslt14":
        return int(recipe_value(name, "--max-epoch")) * IWSLT14_UPDATES_PER_EPOCH_ESTIMATE
    return int(recipe_value(name, "--max-update"))


def passes_per_update(name: str) -> int:
    """Forward/backward passes of an update (fairseq's --update-freq)."""
    for opt, value in recipe(name)["options"]:
        if opt == "--update-freq":
            return int(value)
    return 1


def _shell_name(option: str) -> str:
    return "R_" + option.lstrip("-").replace("-", "_").upper()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name", nargs="?", help=f"the recipe ({', '.join(RECIPES)})")
    p.add_argument("--set", nargs=2, action="append", default=[], metavar=("OPTION", "VALUE"),
                   help="give OPTION (without its dashes: lr) this VALUE; appended when the recipe has no such option")
    p.add_argument("--flag", action="append", default=[], metavar="OPTION", help="add a flag without a value (share-all-embeddings)")
    p.add_argument("--drop", action="append", default=[], metavar="OPTION", help="leave OPTION out (max-epoch)")
    p.add_argument("--shell", action="store_true", help="print the recipe's values as NAME=value lines")
    p.add_argument("--paper-updates", action="store_true", help="print the updates of each paper table's runs")
    args = p.parse_args(argv)
    try:
        if args.paper_updates:
            for table, runs in PAPER_TABLE_RUNS.items():
                for name, size, kinds in runs:
                    for kind, n in kinds.items():
                        print(f"{table} {name} {size or '-'} {kind}: {n} run(s) x {PAPER_SEEDS} seeds, "
                              f"{updates_per_run(name)} updates each")
            return 0
        if not args.name:
            p.error("name a recipe")
        if args.shell:
            rec = recipe(args.name)
            print(f"R_ARCH={shlex.quote(rec['arch'])}")
            for opt, value in rec["options"]:
                print(f"{_shell_name(opt)}={shlex.quote('1' if value is None else value)}")
            for size, values in rec.get("sizes", {}).items():
                for key, value in values.items():
                    print(f"R_{key.upper()}_{size.upper()}={shlex.quote(value)}")
            return 0
        set_options = {"--" + opt.lstrip("-"): value for opt, value in args.set}
        set_options.update({"--" + opt.lstrip("-"): None for opt in args.flag})
        print("\n".join(recipe_args(args.name, set_options, ["--" + opt.lstrip("-") for opt in args.drop])))
    except ValueError as e:
        print(f"training_recipes.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
