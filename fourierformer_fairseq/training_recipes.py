"""The fairseq-train hyper-parameters of each task's recipe, in one table, and the translation
recipe's generation protocol (``GENERATION``).

``examples/iwslt14/train.sh`` and ``examples/wikitext103/train.sh`` train with them (the command-line
interface below prints them for a shell), ``examples/full_size/compare.sh``, ``scripts/tools/gpu_check.py``
and the quickstart train with them and change what their own budgets need, by name. The softmax twin
of each architecture is ``fourierformer_fairseq.models.SOFTMAX_TWINS``; the paper tables' runs and
their cost, ``examples/paper_runs.py``.

    python fourierformer_fairseq/training_recipes.py iwslt14                 # the options, one a line
    python fourierformer_fairseq/training_recipes.py iwslt14 --set lr 1e-3 --drop max-epoch
    python fourierformer_fairseq/training_recipes.py wikitext103 --shell     # NAME=value lines for a shell
    python fourierformer_fairseq/training_recipes.py wikitext103 --protocol fairseq --size medium
    python fourierformer_fairseq/training_recipes.py iwslt14 --generate      # fairseq-generate's options

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
}

# The WikiText-103 language models (small: 16 layers, d 128; medium: d 256) train under a protocol:
# the same command for the FourierFormer, --fourier-published and the softmax twin, so that both
# columns of a table come from one training. Each protocol: its options (those of every size), and
# per size the sequences an update, the sequences a forward pass (the rest by --update-freq) and
# the updates. --tokens-per-sample is the size's context (LM_SIZES).
#   published: the published code's training (docs/published-model.md: its status table says
#              which of its settings are reproduced, approximated or not, and how)
#   fairseq:   fairseq's transformer_lm recipe at the paper's sizes (inverse-sqrt, full softmax)
SIZED = "<size>"  # a value lm_recipe fills in from the protocol's size and LM_SIZES
LM_SIZES = {
    "small": {"arch": "fourierformer_lm_wiki103_small", "context": "256"},
    "medium": {"arch": "fourierformer_lm_wiki103_medium", "context": "384"},
}
PUBLISHED_CUTOFFS = "20000,40000,200000"  # the published code's adaptive input / softmax bands (wt103)
LM_PROTOCOLS = {
    "published": {
        "options": (
            ("--task", "language_modeling"), ("--tokens-per-sample", SIZED), ("--sample-break-mode", "none"),
            ("--optimizer", "adam"), ("--adam-betas", "(0.9, 0.999)"), ("--clip-norm", "0.25"),
            ("--weight-decay", "0.0"), ("--dropout", "0.1"), ("--activation-dropout", "0.1"),
            ("--adaptive-softmax-dropout", "0.1"),
            ("--lr", "2.5e-4"), ("--lr-scheduler", "cosine"), ("--warmup-updates", "2000"),
            ("--warmup-init-lr", "0"),
            ("--adaptive-input", None), ("--adaptive-input-factor", "1"),
            ("--adaptive-input-cutoff", PUBLISHED_CUTOFFS), ("--adaptive-softmax-cutoff", PUBLISHED_CUTOFFS),
            ("--adaptive-softmax-factor", "1"), ("--tie-adaptive-weights", None), ("--tie-adaptive-proj", None),
            ("--criterion", "adaptive_loss"), ("--ddp-backend", "legacy_ddp"),  # adaptive_loss refuses pytorch_ddp
            ("--lm-layernorm", "post"), ("--lm-init", "published"), ("--no-softmax-proj-bias", None),
            ("--batch-size", SIZED), ("--update-freq", SIZED), ("--max-update", SIZED),
        ),
        "sizes": {
            "small": {"sequences": 96, "per_pass": 16, "updates": 500000},
            "medium": {"sequences": 56, "per_pass": 8, "updates": 400000},
        },
    },
    "fairseq": {
        "options": (
            ("--task", "language_modeling"), ("--tokens-per-sample", SIZED), ("--sample-break-mode", "none"),
            ("--optimizer", "adam"), ("--adam-betas", "(0.9, 0.98)"), ("--clip-norm", "0.25"),
            ("--weight-decay", "0.01"), ("--dropout", "0.1"),
            ("--lr", "5e-4"), ("--lr-scheduler", "inverse_sqrt"), ("--warmup-updates", "4000"),
            ("--warmup-init-lr", "1e-07"),
            ("--batch-size", SIZED), ("--update-freq", SIZED), ("--max-update", SIZED),
        ),
        "sizes": {
            "small": {"sequences": 96, "per_pass": 16, "updates": 120000},
            "medium": {"sequences": 96, "per_pass": 16, "updates": 120000},
        },
    },
}
DEFAULT_LM_PROTOCOL = "published"

# The translation recipes' generation protocol (fairseq-generate on the test set): fairseq's IWSLT'14
# example's beam 5, length penalty 1, 128 sentences a batch, BPE removed and fairseq's default
# length limit; and every sentence scored: with fairseq's default --required-batch-size-multiple 8,
# fairseq-generate leaves out a last batch smaller than 8. fairseq-train's --eval-bleu validates
# with the example's beam and its tighter limit, hypotheses of at most 1.2 x the source + 10 tokens
# (VALIDATION_GENERATION: eval_bleu_args); the short runs (the small modes, the quickstart, the
# full-size comparison and the GPU check), whose models have barely trained and would otherwise
# decode for long, generate the test set with that limit too (validation_lengths).
# examples/iwslt14/evaluate.sh, examples/full_size/compare.sh, scripts/tools/gpu_check.py and the quickstart
# generate with it (training_recipes.py iwslt14 --generate prints it, --eval-bleu-args the JSON).
GENERATION = {
    "iwslt14": (
        ("--beam", "5"), ("--lenpen", "1.0"), ("--batch-size", "128"), ("--remove-bpe", None),
        ("--required-batch-size-multiple", "1"),
    ),
}
VALIDATION_GENERATION = {"iwslt14": {"beam": 5, "max_len_a": 1.2, "max_len_b": 10}}
# The vocabulary the published cutoffs are for: WikiText-103 as examples/wikitext103/prepare.sh
# binarises it (fairseq's dictionary, its four special symbols included).
WIKITEXT103_VOCAB = 267744


def scaled_cutoffs(cutoffs: str, vocab: int) -> str:
    """The adaptive input / softmax cutoffs scaled from WikiText-103's vocabulary to another one in
    proportion, each to two significant digits (WikiText-2's 33,280 words: 2500,5000,25000)."""
    out = []
    for c in (int(x) for x in cutoffs.split(",")):
        x = c * vocab / WIKITEXT103_VOCAB
        digits = max(0, len(str(int(x))) - 2)
        x = max(1, int(round(x / 10 ** digits)) * 10 ** digits)
        if out and x <= out[-1]:
            x = out[-1] + 1
        out.append(x)
    if out[-1] >= vocab:
        raise ValueError(f"a vocabulary of {vocab} is too small for {len(out)} adaptive-softmax cutoffs")
    return ",".join(map(str, out))


def cutoff_changes(data_dir: str, protocol: str = None) -> dict:
    """The protocol's adaptive cutoffs scaled to a binarised data folder's dictionary (dict.txt's words and
    fairseq's four special symbols), as options to set; {} where the protocol has none or the data is
    WikiText-103's vocabulary (examples/wikitext103/train.sh reads it through --cutoffs-for)."""
    import os

    values = dict(lm_protocol(protocol)["options"])
    path = os.path.join(data_dir, "dict.txt")
    if "--adaptive-input-cutoff" not in values or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        vocab = sum(1 for _ in fh) + 4
    cut = scaled_cutoffs(values["--adaptive-input-cutoff"], vocab)
    if cut == values["--adaptive-input-cutoff"]:
        return {}
    return {"--adaptive-input-cutoff": cut, "--adaptive-softmax-cutoff": cut}


def scaled_warmup(protocol: str, size: str, updates: int) -> int:
    """The protocol's warm-up scaled to a run of `updates` updates in proportion (at least 1)."""
    rec = lm_recipe(protocol, size)
    values = dict(rec["options"])
    return max(1, round(int(values["--warmup-updates"]) * updates / int(values["--max-update"])))


def lm_protocol(protocol: str = None) -> dict:
    protocol = protocol or DEFAULT_LM_PROTOCOL
    try:
        return LM_PROTOCOLS[protocol]
    except KeyError:
        raise ValueError(f"unknown protocol '{protocol}' (choose from {', '.join(LM_PROTOCOLS)})") from None


def lm_recipe(protocol: str = None, size: str = "small") -> dict:
    """The WikiText-103 recipe of a protocol and size: its arch and its options with the size's
    context, sequences a pass, --update-freq and updates filled in."""
    if size not in LM_SIZES:
        raise ValueError(f"unknown size '{size}' (choose from {', '.join(LM_SIZES)})")
    spec = lm_protocol(protocol)
    per_size = spec["sizes"][size]
    if per_size["sequences"] % per_size["per_pass"]:
        raise ValueError(f"{size}: {per_size['sequences']} sequences an update are not a multiple of "
                         f"{per_size['per_pass']} a pass")
    values = {"--tokens-per-sample": LM_SIZES[size]["context"], "--batch-size": str(per_size["per_pass"]),
              "--update-freq": str(per_size["sequences"] // per_size["per_pass"]),
              "--max-update": str(per_size["updates"])}
    options = tuple((opt, values[opt] if value == SIZED else value) for opt, value in spec["options"])
    return {"arch": LM_SIZES[size]["arch"], "options": options, "sizes": LM_SIZES}


def recipe(name: str, protocol: str = None, size: str = None) -> dict:
    """A recipe: its arch and options. wikitext103: the protocol's (default DEFAULT_LM_PROTOCOL), at a size
    (default small)."""
    if name == "wikitext103":
        return lm_recipe(protocol, size or "small")
    if protocol is not None:
        raise ValueError(f"recipe '{name}' has no protocols (only wikitext103 has: {', '.join(LM_PROTOCOLS)})")
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe '{name}' (choose from {', '.join(RECIPE_NAMES)})") from None


RECIPE_NAMES = (*RECIPES, "wikitext103")


def recipe_value(name: str, option: str, protocol: str = None, size: str = None):
    for opt, value in recipe(name, protocol, size)["options"]:
        if opt == option:
            return value
    raise ValueError(f"recipe '{name}' has no option {option}")


def recipe_args(name: str, set_options=None, drop=(), protocol: str = None, size: str = None) -> list:
    """The recipe's fairseq-train arguments: set_options ({"--lr": "1e-3", ...}) replaces the
    value of an option in place or, for an option the recipe does not give, appends it (value
    None: a flag); drop leaves options out. Unknown options in drop are an error (a typo would
    otherwise keep the recipe's value silently)."""
    return _changed(recipe(name, protocol, size)["options"], set_options, drop, f"recipe '{name}'")


def generation(name: str = "iwslt14") -> tuple:
    """A translation recipe's fairseq-generate options (GENERATION), (option, value) pairs."""
    try:
        return GENERATION[name]
    except KeyError:
        raise ValueError(f"recipe '{name}' has no generation protocol (only {', '.join(GENERATION)})") from None


def generation_args(name: str = "iwslt14", set_options=None, drop=()) -> list:
    """The recipe's fairseq-generate arguments, changed as recipe_args changes the training's."""
    return _changed(generation(name), set_options, drop, f"the generation of '{name}'")


def eval_bleu_args(name: str = "iwslt14") -> str:
    """fairseq-train's --eval-bleu-args (VALIDATION_GENERATION), as JSON."""
    import json

    generation(name)  # an unknown recipe: the same error
    return json.dumps(VALIDATION_GENERATION[name])


def validation_lengths(name: str = "iwslt14") -> dict:
    """The validation's length limit as fairseq-generate options (the short runs' test generation)."""
    generation(name)
    values = VALIDATION_GENERATION[name]
    return {"--max-len-a": str(values["max_len_a"]), "--max-len-b": str(values["max_len_b"])}


def _changed(options, set_options, drop, what: str) -> list:
    set_options = dict(set_options or {})
    given = {opt for opt, _ in options}
    missing = [opt for opt in drop if opt not in given]
    if missing:
        raise ValueError(f"{what} has no option {', '.join(missing)} to drop")
    out = []
    for opt, value in list(options) + [(opt, set_options[opt]) for opt in set_options if opt not in given]:
        if opt in drop:
            continue
        value = set_options.get(opt, value)
        out += [opt] if value is None else [opt, str(value)]
    return out


def _shell_name(option: str) -> str:
    return "R_" + option.lstrip("-").replace("-", "_").upper()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name", nargs="?", help=f"the recipe ({', '.join(RECIPE_NAMES)})")
    p.add_argument("--protocol", help=f"wikitext103: {' or '.join(LM_PROTOCOLS)} (default {DEFAULT_LM_PROTOCOL})")
    p.add_argument("--size", help=f"wikitext103: {' or '.join(LM_SIZES)} (default small)")
    p.add_argument("--set", nargs=2, action="append", default=[], metavar=("OPTION", "VALUE"),
                   help="give OPTION (without its dashes: lr) this VALUE; appended when the recipe has no such option")
    p.add_argument("--flag", action="append", default=[], metavar="OPTION", help="add a flag without a value (share-all-embeddings)")
    p.add_argument("--drop", action="append", default=[], metavar="OPTION", help="leave OPTION out (max-epoch)")
    p.add_argument("--shell", action="store_true", help="print the recipe's values as NAME=value lines")
    p.add_argument("--generate", action="store_true",
                   help="print the recipe's fairseq-generate options (the generation protocol), one a line; "
                        "--set / --flag / --drop change them")
    p.add_argument("--validation-lengths", action="store_true",
                   help="with --generate: the validation's length limit added (the short runs' generation)")
    p.add_argument("--eval-bleu-args", action="store_true",
                   help="print fairseq-train's --eval-bleu-args, the validation's generation (JSON)")
    p.add_argument("--scaled-cutoffs", type=int, metavar="VOCAB",
                   help="print the published cutoffs scaled to a vocabulary of VOCAB words")
    p.add_argument("--cutoffs-for", metavar="DATA",
                   help="print the protocol's adaptive cutoffs scaled to DATA's dict.txt (nothing where they "
                        "need no scaling or the protocol has none)")
    p.add_argument("--scaled-warmup", type=int, metavar="UPDATES",
                   help="print the protocol's warm-up scaled to a run of UPDATES updates")
    args = p.parse_args(argv)
    try:
        if args.scaled_cutoffs:
            print(scaled_cutoffs(PUBLISHED_CUTOFFS, args.scaled_cutoffs))
            return 0
        if args.cutoffs_for:
            print(cutoff_changes(args.cutoffs_for, args.protocol).get("--adaptive-input-cutoff", ""))
            return 0
        if args.scaled_warmup:
            print(scaled_warmup(args.protocol, args.size or "small", args.scaled_warmup))
            return 0
        if not args.name:
            p.error("name a recipe")
        if args.shell:
            rec = recipe(args.name, args.protocol, args.size)
            print(f"R_ARCH={shlex.quote(rec['arch'])}")
            if args.name == "wikitext103":
                print(f"R_PROTOCOL_NAME={shlex.quote(args.protocol or DEFAULT_LM_PROTOCOL)}")
            for opt, value in rec["options"]:
                print(f"{_shell_name(opt)}={shlex.quote('1' if value is None else value)}")
            for size, values in rec.get("sizes", {}).items():
                for key, value in values.items():
                    print(f"R_{key.upper()}_{size.upper()}={shlex.quote(value)}")
            return 0
        set_options = {"--" + opt.lstrip("-"): value for opt, value in args.set}
        set_options.update({"--" + opt.lstrip("-"): None for opt in args.flag})
        drop = ["--" + opt.lstrip("-") for opt in args.drop]
        if args.eval_bleu_args:
            print(eval_bleu_args(args.name))
        elif args.validation_lengths and not args.generate:
            raise ValueError("--validation-lengths goes with --generate")
        elif args.generate:
            if args.validation_lengths:
                set_options = {**validation_lengths(args.name), **set_options}
            print("\n".join(generation_args(args.name, set_options, drop)))
        else:
            print("\n".join(recipe_args(args.name, set_options, drop, args.protocol, args.size)))
    except (ValueError, OSError, KeyError) as e:
        print(f"training_recipes.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
