"""The README's commands, as a user copies them.

The README marks each code block a user runs with an HTML comment on the line before its fence,
``<!-- readme-test: NAME -->`` (invisible on GitHub). From those blocks:

- fast: every ``fairseq-train`` / ``fairseq-generate`` / ``fairseq-eval-lm`` command is parsed by
  fairseq's own parser for that tool, with the plugin loaded, so a renamed or removed flag or arch
  is an error; every arch named anywhere in the README is registered; every ``--fourier-*``,
  ``--performer-*`` and ``--gfnet-*`` flag named anywhere in the README exists; the op snippet runs
  and its gradients reach q, k, v and the radius.
- slow: both tasks run end to end on tiny data the test makes itself, in a scratch folder laid out
  as the README expects (``data-bin/iwslt14.tokenized.de-en`` with its raw test references,
  ``data-bin/wikitext-103``, ``fourierformer_fairseq`` as the user dir): the prepare scripts'
  ``--help`` (they download), then every command of the train and evaluate blocks as written, by
  bash, except that each ``fairseq-train`` gets overrides appended (argparse keeps the last value):
  a few updates (``--max-update``) of a shrunk model on the CPU, with the LM's batch made to fit
  the tiny data. Each command must exit 0, and its output must carry what the README says it
  prints (the BLEU lines, the perplexity). And each README training line parses to the same
  settings as the line its recipe (``examples/*/train.sh``) runs.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fourierformer_fairseq.training_recipes import WIKITEXT103_VOCAB

import fourierformer_fairseq
from fairseq_helpers import create_dummy_data, create_markov_lm_data
from repo import REPO

ROOT = Path(REPO)
README = ROOT / "README.md"
USER_DIR = fourierformer_fairseq.USER_DIR
MARK = re.compile(r"^<!-- readme-test: ([a-z0-9-]+) -->\s*$")
TOOLS = ("fairseq-train", "fairseq-generate", "fairseq-eval-lm")

# what the slow test appends to each fairseq-train line of a block (argparse keeps the last value)
TRAIN_OVERRIDES = {
    "iwslt-train": [
        # ten updates, an epoch each on the tiny data: the evaluate block averages the last ten epoch
        # checkpoints, and scripts/tools/average_checkpoints.py refuses fewer than it is asked for
        "--max-update", "10", "--cpu", "--num-workers", "0",
        "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    ],
    "lm-train": [
        "--max-update", "2", "--cpu", "--num-workers", "0", "--batch-size", "2", "--update-freq", "1",
        "--required-batch-size-multiple", "1",
        # the published protocol's adaptive cutoffs within the tiny data's vocabulary (20 words, 4 symbols)
        "--adaptive-input-cutoff", "4,8,16", "--adaptive-softmax-cutoff", "4,8,16",
        "--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
        "--decoder-attention-heads", "2",
    ],
}


def readme_blocks(text: str) -> dict[str, tuple[str, str]]:
    """{name: (info string, body)} of the fenced blocks marked ``<!-- readme-test: name -->``."""
    lines = text.split("\n")
    blocks = {}
    for i, line in enumerate(lines):
        m = MARK.match(line)
        if not m:
            continue
        fence = lines[i + 1]
        assert fence.startswith("```"), f"README: the line after '{line}' must open a fenced block"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        assert m.group(1) not in blocks, f"README: two blocks named {m.group(1)}"
        blocks[m.group(1)] = (fence[3:].strip(), "\n".join(lines[i + 2:end]))
    return blocks


def shell_commands(body: str) -> list[str]:
    """The commands of a shell block, one string each (continuation lines joined)."""
    commands, current = [], ""
    for line in body.split("\n"):
        if current == "" and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
        elif line.lstrip().startswith("|") and commands and current == "":
            commands[-1] += " " + line.strip()  # a pipeline continued on the next line
        else:
            commands.append((current + line).strip())
            current = ""
    assert current == "", "a block ends in a continuation line"
    return commands


def fairseq_argv(command: str) -> tuple[str, list[str]] | None:
    """(tool, its arguments up to the first redirection or pipe) when command runs a fairseq tool."""
    words = shlex.split(command, comments=True)
    if not words or words[0] not in TOOLS:
        return None
    argv = []
    for w in words[1:]:
        if w in (">", "|", "2>", ">>", "&&") or w.startswith(">"):
            break
        argv.append(w)
    return words[0], argv


@pytest.fixture(scope="module")
def blocks():
    b = readme_blocks(README.read_text(encoding="utf-8"))
    expected = {"iwslt-prepare", "iwslt-train", "iwslt-evaluate", "lm-prepare", "lm-train", "lm-evaluate", "op"}
    assert expected <= set(b), f"README: marked blocks missing: {sorted(expected - set(b))}"
    return b


def _parse(tool: str, argv: list[str]):
    """fairseq's own parsing of a command line of that tool (plugin loaded from its real folder)."""
    from fairseq import options

    argv = [USER_DIR if a == "fourierformer_fairseq" else a for a in argv]
    parser = {
        "fairseq-train": options.get_training_parser,
        "fairseq-generate": options.get_generation_parser,
        "fairseq-eval-lm": options.get_eval_lm_parser,
    }[tool]()
    return parser, options.parse_args_and_arch(parser, argv)


def test_readme_fairseq_commands_parse(blocks):
    """Each fairseq command of the README parses: its flags and its arch exist today."""
    seen = set()
    for name, (_, body) in blocks.items():
        for command in shell_commands(body):
            parsed = fairseq_argv(command)
            if parsed is None:
                continue
            tool, argv = parsed
            try:
                _, args = _parse(tool, argv)
            except SystemExit as e:  # argparse's way of rejecting a flag or a choice
                pytest.fail(f"README block {name}: {tool} rejects its arguments (exit {e.code}): {command}")
            assert "--user-dir" in argv and "fourierformer_fairseq" in argv, f"{name}: {command}"
            seen.add(tool)
    assert seen == set(TOOLS), f"README: no marked command runs {sorted(set(TOOLS) - seen)}"


def test_readme_archs_and_attention_flags_exist():
    """Every arch and every attention flag the README names, in prose and tables too."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    text = README.read_text(encoding="utf-8")
    archs = set(re.findall(r"\b((?:fourierformer|softmax|performer|gfnet)_(?:iwslt_de_en|lm_wiki103_(?:small|medium)))\b", text))
    archs |= {f"{a}_medium" for a in re.findall(r"\b((?:performer|gfnet|softmax)_lm_wiki103)_small` / `_medium", text)}
    assert "fourierformer_iwslt_de_en" in archs and "performer_lm_wiki103_medium" in archs
    missing = sorted(a for a in archs if a not in ARCH_MODEL_REGISTRY)
    assert not missing, f"README names archs that are not registered: {missing}"

    option_strings = set()
    for arch in ("fourierformer_iwslt_de_en", "performer_iwslt_de_en", "gfnet_iwslt_de_en"):
        parser, _ = _parse("fairseq-train", ["data", "--user-dir", "fourierformer_fairseq", "--arch", arch])
        option_strings |= set(parser._option_string_actions)
    flags = set(re.findall(r"(--(?:fourier|performer|gfnet)-[a-z0-9-]*[a-z0-9])", text))
    assert "--fourier-published" in flags and "--fourier-kernel" in flags
    unknown = sorted(flags - option_strings)
    assert not unknown, f"README names flags that no architecture takes: {unknown}"


def test_readme_op_snippet_runs(blocks):
    info, body = blocks["op"]
    assert info == "python"
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(body, "README.md (the op)", "exec"), namespace)
    q, k, v, radius, out = (namespace[n] for n in ("q", "k", "v", "radius", "out"))
    assert out.shape == v.shape and torch.isfinite(out).all()
    for t in (q, k, v, radius):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- end to end (slow)


def _tiny_translation_data(root: Path) -> None:
    """data-bin/iwslt14.tokenized.de-en: a binarised de -> en pair and text/raw/test.en, as prepare.sh lays it out."""
    raw = root / "raw-mt"
    raw.mkdir()
    create_dummy_data(str(raw), num_examples=48, maxlen=8)
    for split in ("train", "valid", "test"):
        (raw / f"{split}.in").rename(raw / f"{split}.de")
        (raw / f"{split}.out").rename(raw / f"{split}.en")
    dest = root / "data-bin" / "iwslt14.tokenized.de-en"
    _run(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
          "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"), "--testpref", str(raw / "test"),
          "--destdir", str(dest), "--workers", "1"], root)
    (dest / "text" / "raw").mkdir(parents=True)
    (dest / "text" / "raw" / "test.en").write_text((raw / "test.en").read_text())


def _tiny_lm_data(root: Path) -> None:
    raw = root / "raw-lm"
    raw.mkdir()
    create_markov_lm_data(str(raw), num_lines=320)
    _run(["fairseq-preprocess", "--only-source", "--trainpref", str(raw / "train.out"),
          "--validpref", str(raw / "valid.out"), "--testpref", str(raw / "test.out"),
          "--destdir", str(root / "data-bin" / "wikitext-103"), "--workers", "1"], root)


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _run(argv_or_command, cwd: Path, what: str = "") -> str:
    shell = isinstance(argv_or_command, str)
    proc = subprocess.run(["bash", "-c", "set -eo pipefail\n" + argv_or_command] if shell else argv_or_command,
                          cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{what or argv_or_command} failed (exit {proc.returncode}):\n{out[-4000:]}"
    return out


def _with_overrides(command: str, block: str) -> str:
    tool, _ = fairseq_argv(command)
    assert tool == "fairseq-train"
    words = shlex.split(command, comments=True)
    return shlex.join(words + TRAIN_OVERRIDES[block])


def _run_block(blocks, name: str, root: Path) -> str:
    out = ""
    for command in shell_commands(blocks[name][1]):
        parsed = fairseq_argv(command)
        if parsed and parsed[0] == "fairseq-train":
            command = _with_overrides(command, name)
        out += _run(command, root, f"README block {name}: {command}")
    return out


def test_readme_commands_end_to_end_on_tiny_data(blocks, tmp_path):
    root = tmp_path
    os.symlink(USER_DIR, root / "fourierformer_fairseq")
    for sub in ("scripts", "examples"):
        os.symlink(ROOT / sub, root / sub)

    for name in ("iwslt-prepare", "lm-prepare"):  # they download: check that they exist and answer --help
        for command in shell_commands(blocks[name][1]):
            script = shlex.split(command, comments=True)[0]
            assert "Usage:" in _run(f"{shlex.quote(script)} --help", root, f"README block {name}: {script} --help")

    _tiny_translation_data(root)
    _run_block(blocks, "iwslt-train", root)
    out = _run_block(blocks, "iwslt-evaluate", root)
    gen = (root / "gen.txt").read_text()
    test_sentences = len((root / "raw-mt" / "test.en").read_text().splitlines())
    assert len(re.findall(r"^H-\d+\t", gen, flags=re.M)) == test_sentences, "every test sentence translated"
    assert re.search(r"BLEU4 = [0-9.]+", out), out[-2000:]  # the grep of fairseq-generate's BLEU line
    assert re.search(r'"name": "BLEU",\s*"score": [0-9.]+', out), out[-2000:]  # sacrebleu's score

    _tiny_lm_data(root)
    _run_block(blocks, "lm-train", root)
    assert (root / "checkpoints" / "wikitext103_fourier_small" / "checkpoint_best.pt").exists()
    out = _run_block(blocks, "lm-evaluate", root)
    m = re.search(r"Loss \(base 2\): ([0-9.]+), Perplexity: ([0-9.]+)", out)
    assert m and float(m.group(2)) > 1.0, out[-2000:]


# what may differ between the README's training command and the recipe's: where the run's files
# go, how it logs, the device flag the recipe adds on a CPU, and the user dir's spelling
RUN_BOOKKEEPING = {"save_dir", "log_format", "log_interval", "cpu", "user_dir"}

RECIPES = {
    "iwslt-train": (["examples/iwslt14/train.sh", "--model", "fourier", "--seeds", "1"],
                    "data-bin/iwslt14.tokenized.de-en", ["dict.de.txt", "dict.en.txt"]),
    "lm-train": (["examples/wikitext103/train.sh", "--model", "fourier", "--size", "small", "--seeds", "1"],
                 "data-bin/wikitext-103", ["dict.txt"]),
}


@pytest.mark.parametrize("block", sorted(RECIPES))
def test_readme_training_command_is_the_recipes(blocks, block, tmp_path):
    """The README's fairseq-train line and the one the recipe runs parse to the same settings.

    The recipe runs with a ``fairseq-train`` first on PATH that only records its arguments (the
    recipe's command line is what is compared; nothing is trained), in a folder where the recipe
    finds the dictionaries it checks for."""
    recipe, data, dicts = RECIPES[block]
    (tmp_path / "bin").mkdir()
    record = tmp_path / "argv.json"
    spy = tmp_path / "bin" / "fairseq-train"
    spy.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n")
    spy.chmod(0o755)
    (tmp_path / data).mkdir(parents=True)
    for name in dicts:  # the LM's: WikiText-103's size, so that the recipe keeps the published cutoffs
        words = WIKITEXT103_VOCAB - 4 if block == "lm-train" else 1
        (tmp_path / data / name).write_text("".join(f"w{i} 1\n" for i in range(words)))
    env = _env()
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(["bash", str(ROOT / recipe[0]), *recipe[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    recipe_argv = json.load(open(record))
    readme_argv = [fairseq_argv(c)[1] for c in shell_commands(blocks[block][1]) if fairseq_argv(c)]
    assert len(readme_argv) == 1, f"README block {block}: one fairseq-train command expected"
    _, ours = _parse("fairseq-train", readme_argv[0])
    _, theirs = _parse("fairseq-train", recipe_argv)
    ours, theirs = vars(ours), vars(theirs)
    differ = {k: (ours.get(k), theirs.get(k)) for k in set(ours) | set(theirs)
              if k not in RUN_BOOKKEEPING and ours.get(k) != theirs.get(k)}
    assert not differ, f"README block {block} and {recipe[0]} train differently (README, recipe): {differ}"


# what may differ between two generation lines of the same protocol: the checkpoint, the device flag
# evaluate.sh adds on a CPU, and the user dir's spelling
GENERATION_BOOKKEEPING = {"path", "cpu", "user_dir"}


def _generation_settings(argv: list[str]) -> dict:
    _, args = _parse("fairseq-generate", argv)
    return {k: v for k, v in vars(args).items() if k not in GENERATION_BOOKKEEPING}


def test_readme_generation_and_evaluate_sh_are_the_generation_protocol(blocks, tmp_path):
    """The README's fairseq-generate line and the one examples/iwslt14/evaluate.sh runs (its
    --print-command) each parse to the settings of the generation protocol's home
    (training_recipes.GENERATION, on the same data, checkpoint and subset); the --eval-bleu-args of
    the README's training line and of train.sh's are the validation's (VALIDATION_GENERATION), whose
    length limit evaluate.sh --small also generates with."""
    from fourierformer_fairseq.training_recipes import eval_bleu_args, generation_args

    data = "data-bin/iwslt14.tokenized.de-en"
    home = _generation_settings([data, "--user-dir", "fourierformer_fairseq", "--path", "x.pt", "--gen-subset", "test",
                                 *generation_args("iwslt14")])
    (readme,) = [fairseq_argv(c)[1] for c in shell_commands(blocks["iwslt-evaluate"][1]) if fairseq_argv(c)]
    proc = subprocess.run(["bash", str(ROOT / "examples" / "iwslt14" / "evaluate.sh"), "--print-command", "run"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (printed,) = proc.stdout.strip().splitlines()
    tool, script_argv = fairseq_argv(printed)
    assert tool == "fairseq-generate"
    for what, argv in (("README block iwslt-evaluate", readme), ("examples/iwslt14/evaluate.sh", script_argv)):
        got = _generation_settings(argv)
        differ = {k: (got.get(k), home.get(k)) for k in set(got) | set(home) if got.get(k) != home.get(k)}
        assert not differ, f"{what} generates differently from training_recipes.GENERATION ({what}, home): {differ}"
    # the small mode generates with the validation's length limit (the home's), the test set without it
    assert (home["max_len_a"], home["max_len_b"]) == (0, 200), "GENERATION must keep fairseq's length limit"
    proc = subprocess.run(["bash", str(ROOT / "examples" / "iwslt14" / "evaluate.sh"), "--print-command", "--small", "run"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    small = _generation_settings(fairseq_argv(proc.stdout.strip().splitlines()[0])[1])
    limit = json.loads(eval_bleu_args("iwslt14"))
    assert (small["max_len_a"], small["max_len_b"], small["beam"]) == (limit["max_len_a"], limit["max_len_b"], 2)

    (train,) = [fairseq_argv(c)[1] for c in shell_commands(blocks["iwslt-train"][1]) if fairseq_argv(c)]
    proc = subprocess.run(["bash", str(ROOT / "examples" / "iwslt14" / "train.sh"), "--print-command"], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (printed,) = proc.stdout.strip().splitlines()
    for what, argv in (("README block iwslt-train", train), ("examples/iwslt14/train.sh", fairseq_argv(printed)[1])):
        _, args = _parse("fairseq-train", argv)
        assert args.eval_bleu_args == eval_bleu_args("iwslt14"), what


# ----------------------------------------------------------------------------- several GPUs and machines

# what may differ between the README's one-GPU training line and a distributed one: the bookkeeping
# above, the per-GPU batch (validation's follows it, as fairseq's default) and fairseq's distributed options
DISTRIBUTED_SETTINGS = RUN_BOOKKEEPING | {"max_tokens", "max_tokens_valid", "distributed_world_size", "distributed_port"}


def _launched(command: str):
    """A README launch line -> (its recipe's argv, the launcher's environment as each copy of the recipe
    sees it (the first copy's), the processes in all). srun's and torchrun's own options are read as
    they read them (torchrun's by its own parser)."""
    words = shlex.split(command, comments=True)
    env = {}
    if words[0] == "srun":
        options, i = {}, 1
        while words[i].startswith("--"):
            options[words[i]] = words[i + 1]
            i += 2
        nodes, tasks, gpus = (int(options[k]) for k in ("--nodes", "--ntasks-per-node", "--gpus-per-node"))
        env = {"SLURM_JOB_NODELIST": f"node[1-{nodes}]", "SLURM_STEP_NODELIST": f"node[1-{nodes}]",
               "SLURM_NNODES": str(nodes), "SLURM_NTASKS_PER_NODE": str(tasks), "SLURM_NTASKS": str(nodes * tasks),
               "SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_LOCALID": "0"}
        return words[i:], env, nodes * (gpus if tasks == 1 else tasks)
    if words[0] == "torchrun":
        from torch.distributed.run import get_args_parser

        args = get_args_parser().parse_args(words[1:])
        assert args.no_python, "torchrun runs the recipe, a shell script: --no-python"
        world = int(args.nnodes) * int(args.nproc_per_node)
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "MASTER_ADDR": "host",
               "MASTER_PORT": "29500"}
        return [args.training_script, *args.training_script_args], env, world
    gpus = words[words.index("--gpus") + 1]
    return words, env, int(gpus)


@pytest.mark.parametrize("block", ["distributed-one-machine", "distributed-slurm", "distributed-torchrun"])
def test_readme_distributed_commands_train_as_the_one_gpu_line(blocks, block, tmp_path):
    """Each launch line's recipe, run as its launcher would run it (the environment a copy of the recipe
    sees) with --print-command, gives fairseq-train the README's one-GPU training line with the update's
    4096 tokens shared by every process and fairseq's distributed options; the launcher's processes are
    --gpus (torchrun's nnodes x nproc-per-node, srun's nodes x GPUs a node with one task a node)."""
    (command,) = shell_commands(blocks[block][1])
    recipe, env, world = _launched(command)
    assert recipe[0] == "examples/iwslt14/train.sh" and int(recipe[recipe.index("--gpus") + 1]) == world
    split = recipe.index("--") if "--" in recipe else len(recipe)
    argv = [*recipe[1:split], "--print-command", *recipe[split:]]
    proc = subprocess.run(["bash", str(ROOT / recipe[0]), *argv], cwd=tmp_path, env={**_env(), **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (printed,) = proc.stdout.strip().splitlines()
    tool, theirs = fairseq_argv(printed)
    assert tool == "fairseq-train"
    _, theirs = _parse(tool, theirs)
    (one_gpu,) = [fairseq_argv(c)[1] for c in shell_commands(blocks["iwslt-train"][1]) if fairseq_argv(c)]
    _, ours = _parse("fairseq-train", one_gpu)
    assert ours.max_tokens == 4096 and theirs.max_tokens * world == 4096 and theirs.update_freq == [1]
    assert theirs.distributed_world_size == world
    if block == "distributed-slurm":
        assert theirs.distributed_port == 12345
    ours, theirs = vars(ours), vars(theirs)
    differ = {k: (ours.get(k), theirs.get(k)) for k in set(ours) | set(theirs)
              if k not in DISTRIBUTED_SETTINGS and ours.get(k) != theirs.get(k)}
    assert not differ, f"README block {block} trains differently from iwslt-train (README, recipe): {differ}"
