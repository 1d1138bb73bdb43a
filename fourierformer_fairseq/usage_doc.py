"""``python -m fourierformer_fairseq.usage_doc [--write | --check]``: the usage reference, docs/usage.md.

Every option of every attention kind, with its default on each architecture and its meaning,
generated from what the code declares, so the reference cannot drift from it:

* the kinds and their architectures: fairseq's registry (every arch whose model names an
  ``options_class``, see ``models/attention_options.py``);
* the options: the fields of each kind's config dataclass (``FourierAttentionConfig``,
  ``PerformerConfig``, ``GlobalFilterConfig``): flag and values as fairseq's argparse makes them,
  meaning from the field's help, the attention class's keyword from its ``kwarg``; fields that
  several kinds share are listed once, under the dataclass that declares them;
* the defaults: what ``fairseq-train``'s own parser and the arch function give each arch when the
  command line is silent;
* the presets: a switch (a bool option, off by default) that changes other options; what it sets
  is the difference it makes to the parsed arguments of each arch.

Without arguments it prints the reference; ``--write`` writes docs/usage.md of this checkout;
``--check`` exits 1 when that file differs from what would be written (tests/house/test_usage_doc.py
runs the same comparison).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from typing import Any, Dict, List, Optional, Sequence

DOC_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "usage.md")
COMMAND = "python -m fourierformer_fairseq.usage_doc --write"


@dataclasses.dataclass
class Kind:
    """One attention kind: its options class, its archs, and the parsed arguments of each arch."""

    options_class: Any
    archs: List[str]
    tasks: Dict[str, str]  # arch -> "translation" / "language_modeling"
    #: arch -> field -> value with the command line silent; a field the parser leaves out is None
    defaults: Dict[str, Dict[str, Any]]
    #: preset field -> arch -> {field: value} it changes
    presets: Dict[str, Dict[str, Dict[str, Any]]]

    @property
    def config_class(self):
        return self.options_class.config_class

    @property
    def fields(self) -> List[dataclasses.Field]:
        return [f for f in dataclasses.fields(self.config_class) if not f.name.startswith("_")]


def _parse(arch: str, task: str, extra: Sequence[str] = ()) -> argparse.Namespace:
    """fairseq-train's arguments for ``--arch arch`` and ``extra`` (no data is read)."""
    from fairseq import options

    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, ["DATA", "--task", task, "--arch", arch, *extra])


def collect() -> List[Kind]:
    """The kinds, their archs and the archs' parsed defaults and presets (runs fairseq's parser)."""
    import fourierformer_fairseq.models  # noqa: F401  (registers the archs)
    from fourierformer_fairseq.models.attention_options import choice_value
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY, FairseqLanguageModel

    by_options: Dict[Any, List[str]] = {}
    for arch in sorted(ARCH_MODEL_REGISTRY):
        model = ARCH_MODEL_REGISTRY[arch]
        options_class = getattr(model, "options_class", None)
        # a model's own name is not an architecture of it; a model without an attention kind (the
        # softmax twins') has no kind's options to list
        if options_class is None or arch in MODEL_REGISTRY or getattr(options_class, "config_class", None) is None:
            continue
        by_options.setdefault(options_class, []).append(arch)
    kinds = []
    for options_class, archs in by_options.items():
        tasks = {a: "language_modeling" if issubclass(ARCH_MODEL_REGISTRY[a], FairseqLanguageModel) else "translation"
                 for a in archs}
        names = [f.name for f in dataclasses.fields(options_class.config_class) if not f.name.startswith("_")]

        def values(args):
            return {n: choice_value(getattr(args, n, None)) for n in names}

        defaults = {a: values(_parse(a, tasks[a])) for a in archs}
        presets: Dict[str, Dict[str, Dict[str, Any]]] = {}
        for f in dataclasses.fields(options_class.config_class):
            if f.type not in (bool, "bool") or f.default is not False:
                continue
            flag = "--" + f.name.replace("_", "-")
            changes = {}
            for a in archs:
                on = values(_parse(a, tasks[a], [flag]))
                changes[a] = {n: on[n] for n in names if n != f.name and on[n] != defaults[a][n]}
            if any(changes.values()):
                presets[f.name] = changes
        kinds.append(Kind(options_class, archs, tasks, defaults, presets))
    return kinds  # in the order of their first archs' names


# ----------------------------------------------------------------------------- rendering


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`"


def _first_line(doc: Optional[str]) -> str:
    return (doc or "").strip().splitlines()[0] if doc else ""


def _paragraph(doc: Optional[str]) -> str:
    """The first paragraph of a docstring, on one line."""
    text = (doc or "").strip().split("\n\n")[0]
    return " ".join(line.strip() for line in text.splitlines())


def _actions(kind: Kind) -> Dict[str, argparse.Action]:
    """field name -> the argparse action the kind's models add for it."""
    parser = argparse.ArgumentParser(add_help=False)
    kind.options_class.add_args(parser)
    return {a.dest: a for a in parser._actions}


def _syntax(action: argparse.Action) -> str:
    flag = action.option_strings[0]
    if action.nargs == 0:
        return flag
    if action.choices:
        return f"{flag} {{{','.join(str(c) for c in action.choices)}}}"
    kind = {int: "INT", float: "FLOAT"}.get(action.type, "STR")
    return f"{flag} {kind}"


def _by_value(per_arch: Dict[str, Any]) -> str:
    """'`2` (arch_a, arch_c); `4` (arch_b)', or one value when every arch has it."""
    groups: Dict[str, List[str]] = {}
    for arch, value in per_arch.items():
        groups.setdefault(_show(value), []).append(arch)
    if len(groups) == 1:
        return next(iter(groups))
    return "; ".join(f"{shown} ({', '.join(archs)})" for shown, archs in groups.items())


def _declaring_class(config_class, name: str):
    """The most basic dataclass in config_class's bases that has the field ``name``."""
    for cls in reversed(config_class.__mro__):
        if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
            return cls
    return config_class


def _kind_title(kind: Kind) -> str:
    attention = kind.options_class.attention_class
    return f"`{attention.__name__}`: {_first_line(attention.__doc__).rstrip('.')}"


def render(kinds: List[Kind]) -> str:
    out: List[str] = []
    add = out.append
    add("# Usage reference: the options of every attention kind")
    add("")
    add(f"Generated by `{COMMAND}` from the option dataclasses, the registered architectures and their "
        "arch functions (`fourierformer_fairseq/usage_doc.py`); do not edit it by hand: "
        "`tests/house/test_usage_doc.py` fails when it is stale.")
    add("")
    add("The options go on the fairseq command line after `--user-dir fourierformer_fairseq --arch ARCH` "
        "(`fairseq-train`, and `fairseq-generate` / `fairseq-eval-lm` read them back from the checkpoint). "
        "An option left out takes the default listed for the arch; \"unset\" means the meaning says what "
        "happens then. In Python, the attention module takes the same option as the keyword argument listed "
        "(e.g. `FourierMultiheadAttention(embed_dim, num_heads, power=2)`).")
    add("")

    add("## Architectures")
    add("")
    add("| arch | task | attention | options |")
    add("|---|---|---|---|")
    for kind in kinds:
        prefixes = sorted({f.name.split("_")[0] for f in kind.fields})
        options = ", ".join(f"`--{p}-*`" for p in prefixes)
        for arch in kind.archs:
            add(f"| `{arch}` | {kind.tasks[arch].replace('_', ' ')} | `{kind.options_class.attention_class.__name__}` "
                f"| {options} (`{kind.config_class.__name__}`) |")
    add("")

    # a field in several kinds' configs is listed once, under the class that declares it
    owners: Dict[str, List[Kind]] = {}
    for kind in kinds:
        for f in kind.fields:
            owners.setdefault(f.name, []).append(kind)
    shared = {name: ks for name, ks in owners.items() if len(ks) > 1}

    def option(kind_list: List[Kind], f: dataclasses.Field) -> None:
        action = _actions(kind_list[0])[f.name]
        add(f"### `{_syntax(action)}`")
        add("")
        add(f.metadata.get("help", "").strip())
        add("")
        per_arch = {a: k.defaults[a][f.name] for k in kind_list for a in k.archs}
        add(f"- default: {_by_value(per_arch)}")
        if "kwarg" in f.metadata:
            modules = ", ".join(f"`{k.options_class.attention_class.__name__}`" for k in kind_list)
            add(f"- keyword: `{f.metadata['kwarg']}` of {modules}")
        presets = [
            f"`{_flag(p)}` sets {_by_value({a: ch[f.name] for a, ch in changes.items() if f.name in ch})}"
            for k in kind_list for p, changes in k.presets.items() if any(f.name in ch for ch in changes.values())
        ]
        if presets:
            add(f"- presets: {'; '.join(presets)}")
        add("")

    for kind in kinds:
        add(f"## {_kind_title(kind)}")
        add("")
        add(f"Options: `{kind.config_class.__name__}` "
            f"(`{kind.config_class.__module__}`). Architectures: {', '.join(f'`{a}`' for a in kind.archs)}.")
        add("")
        also = [f.name for f in kind.fields if f.name in shared]
        for cls in dict.fromkeys(_declaring_class(kind.config_class, n) for n in also):
            names = ", ".join(f"`{_flag(n)}`" for n in also if _declaring_class(kind.config_class, n) is cls)
            add(f"Also {names}: shared, see `{cls.__name__}` below.")
            add("")
        for f in kind.fields:
            if f.name not in shared:
                option([kind], f)

    declared: Dict[Any, List[str]] = {}
    for name, ks in shared.items():
        declared.setdefault(_declaring_class(ks[0].config_class, name), []).append(name)
    for cls, names in declared.items():
        ks = owners[names[0]]
        add(f"## Shared: `{cls.__name__}`")
        add("")
        add(f"{_paragraph(cls.__doc__)} (`{cls.__module__}`.) Architectures: "
            f"{', '.join(f'`{a}`' for k in ks for a in k.archs)}.")
        add("")
        for f in dataclasses.fields(cls):
            if f.name in names:
                option(ks, f)

    from fairseq.models.transformer_lm import TransformerLanguageModelConfig

    from fourierformer_fairseq.models.attention_options import choice_value
    from fourierformer_fairseq.models.lm_options import LanguageModelConfig

    stock = {f.name for f in dataclasses.fields(TransformerLanguageModelConfig)}
    add(f"## Every language model: `{LanguageModelConfig.__name__}`")
    add("")
    add(f"{_paragraph(LanguageModelConfig.__doc__)} (`{LanguageModelConfig.__module__}`.) Every language-model "
        "architecture of the plugin takes them, the softmax twins included (`softmax_lm`); the WikiText-103 "
        "recipe's published protocol sets them (docs/published-model.md).")
    add("")
    for f in dataclasses.fields(LanguageModelConfig):
        if f.name in stock or f.name.startswith("_"):
            continue
        add(f"### `{_flag(f.name)}`")
        add("")
        add(f.metadata.get("help", "").strip())
        add("")
        add(f"- default: {_show(choice_value(f.default))}")
        add("")

    presets = [(k, p, changes) for k in kinds for p, changes in k.presets.items()]
    if presets:
        add("## Presets")
        add("")
        add("A preset sets other options where the command line leaves them unset; an option given on the "
            "command line wins. What each sets, per arch:")
        add("")
        for kind, preset, changes in presets:
            add(f"### `{_flag(preset)}`")
            add("")
            # what the preset is: said once, under its option above (the first heading of that name)
            anchor = re.sub(r"[^\w\- ]", "", f"`{_flag(preset)}`".lower()).replace(" ", "-")
            add(f"What it is: [its option](#{anchor}).")
            add("")
            set_names = [f.name for f in kind.fields if any(f.name in ch for ch in changes.values())]
            add("| option | " + " | ".join(f"`{a}`" for a in kind.archs) + " |")
            add("|---|" + "---|" * len(kind.archs))
            for name in set_names:
                add(f"| `{_flag(name)}` | " + " | ".join(_show(changes[a].get(name, kind.defaults[a][name]))
                                                          for a in kind.archs) + " |")
            add("")
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"write {os.path.relpath(DOC_PATH)}")
    group.add_argument("--check", action="store_true", help="exit 1 if that file is stale")
    args = parser.parse_args(argv)
    import logging

    logging.disable(logging.INFO)  # fairseq's parser logs each import
    text = render(collect())
    if args.write:
        with open(DOC_PATH, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"wrote {DOC_PATH}", file=sys.stderr)
    elif args.check:
        current = open(DOC_PATH, encoding="utf-8").read() if os.path.exists(DOC_PATH) else ""
        if current != text:
            print(f"{DOC_PATH} is stale: run {COMMAND}", file=sys.stderr)
            return 1
        print(f"{DOC_PATH} is up to date", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
