"""Which module may import which: the package has no import cycle (lazy imports counted), no
attention kind's module imports another kind's, nor does one kind's models file import another's
(what two kinds share has a module of its own)."""
import ast
import os

from repo import REPO


def test_the_package_has_no_import_cycle():
    """Every import between the package's modules, lazy ones too (a module's import of the
    package it belongs to is not counted: that package is being imported already)."""
    root = REPO
    files = {}
    for folder, _, names in os.walk(os.path.join(root, "fourierformer_fairseq")):
        for f in names:
            if f.endswith(".py"):
                module = os.path.relpath(os.path.join(folder, f), root)[:-3].replace(os.sep, ".")
                files[module[: -len(".__init__")] if module.endswith(".__init__") else module] = os.path.join(folder, f)
    imports = {}
    for module, path in files.items():
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
        imports[module] = {t for t in targets if t in files and t != module and not module.startswith(t + ".")}

    done = set()  # modules from which no cycle can be reached

    def cycle_from(module, path):
        for target in sorted(imports[module] - done):
            if target in path:
                return path[path.index(target):] + [target]
            found = cycle_from(target, path + [target])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(files):
        cycle = cycle_from(module, [module])
        assert cycle is None, " -> ".join(cycle)


def test_no_attention_kind_imports_another():
    folder = os.path.join(REPO, "fourierformer_fairseq", "modules")
    kinds = {"fourier_multihead_attention", "performer_multihead_attention", "global_filter_mixer"}
    for kind in kinds:
        tree = ast.parse(open(os.path.join(folder, kind + ".py")).read())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[-1])
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[-1] for alias in node.names)
        assert not (imported & (kinds - {kind})), (kind, imported & kinds)
        assert "modules" not in imported, f"{kind} imports the modules package"


def test_no_attention_kinds_options_import_another_kinds():
    """Each kind's file (its config's module) imports no other kind's; what two kinds share
    (the Fourier kernel's power and radius: models/fourier_kernel.py) has a module of its own."""
    import ast
    import importlib

    from fourierformer_fairseq.models.attention_options import AttentionOptions

    def kinds(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from kinds(sub)

    modules = {sub.config_class.__module__ for sub in kinds(AttentionOptions) if hasattr(sub, "config_class")}
    assert {"fourierformer_fairseq.models.fourierformer", "fourierformer_fairseq.models.performer",
            "fourierformer_fairseq.models.gfnet"} <= modules
    short = {m.rsplit(".", 1)[1] for m in modules}
    for module in modules:
        tree = ast.parse(open(importlib.import_module(module).__file__).read())
        imported = {(node.module or "").rsplit(".", 1)[-1] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {a.name.rsplit(".", 1)[-1] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        assert not imported & (short - {module.rsplit(".", 1)[1]}), (module, imported & short)
