"""Running the stock fairseq tools and reading what they write, for the recipes (``examples/``),
the quickstart and the tools that read runs (``scripts/analysis/``, ``scripts/benchmarks/``).

- ``fairseq_command``: the console script of a fairseq tool (fairseq-train, ...) to run.
- ``run_logged``: runs a command, its output into a log file line by line (the tee), with an
  optional time limit.
- ``fairseq_log_records``: the records of a fairseq-train ``--log-format json`` log.
- ``options_given``: the ``--fourier-*`` options among a run's fairseq-train arguments
  (``examples/lib.sh``'s ``write_meta`` records them; ``scripts/analysis/tables/make_tables.py`` groups runs by them),
  and ``run_name_suffix``, the run-name suffix the recipes make of them (``examples/lib.sh``'s
  ``fourier_suffix`` runs this file: ``python fourierformer_fairseq/fairseq_runs.py run-suffix ARGS...``).
- ``training_done``: whether a run's ``checkpoint_last.pt`` already holds the training a fairseq-train
  command asks for (the recipes' ``trained``: ``python fourierformer_fairseq/fairseq_runs.py trained
  CHECKPOINT ARGS...``), as stock fairseq-train would resume it and train one more update.
- ``generate_hypotheses`` and ``detokenised_bleu``: the BLEU scoring of the translation recipes,
  sacreBLEU (lowercase) on the Moses-detokenised hypotheses of ``fairseq-generate``
  (``examples/iwslt14/evaluate.sh``, ``examples/full_size/summarize.py``); the options the
  hypotheses are generated with are ``training_recipes.GENERATION``.

Nothing here imports fairseq, nor torch but ``training_done`` (to read the checkpoint).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading

__all__ = ["fairseq_command", "run_logged", "shell_line", "fairseq_log_records", "options_given",
           "run_name_suffix", "training_done", "generate_hypotheses", "detokenised_bleu"]

# "... | INFO | train_inner | {...}": the progress bar's tag, then the interval's metrics
_LOG_RECORD = re.compile(r"\|\s*(train_inner|train|valid)\s*\|\s*(\{.*\})\s*$")

#: exit status run_logged returns for a command it stopped at its time limit (as timeout(1) does)
TIMED_OUT = 124


def fairseq_command(tool: str) -> list[str]:
    """The stock console script of a fairseq tool (fairseq-train, fairseq-generate, ...): the one
    next to this Python, else the one on PATH, else its entry point run through this Python."""
    candidate = os.path.join(os.path.dirname(sys.executable), tool)
    if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
        return [candidate]
    found = shutil.which(tool)
    if found:
        return [found]
    module = tool.split("-", 1)[1].replace("-", "_")  # fairseq-eval-lm -> fairseq_cli.eval_lm
    return [sys.executable, "-c", f"from fairseq_cli.{module} import cli_main; cli_main()"]


def shell_line(cmd) -> str:
    return " ".join(shlex.quote(str(c)) for c in cmd)


def run_logged(cmd, log_path: str, env: dict | None = None, on_line=None, timeout: float | None = None,
               cwd: str | None = None) -> int:
    """Runs cmd with its output (stdout and stderr) written to log_path as it comes, after a
    "$ command" line; calls on_line(line) for each line. With a timeout (seconds), the command and
    every process it started are stopped when it runs longer, a line saying so ends the log, and
    the exit status is TIMED_OUT. Returns the command's exit status."""
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + shell_line(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd, text=True,
                                bufsize=1, errors="replace", start_new_session=timeout is not None)
        expired = threading.Event()
        timer = None
        if timeout is not None:
            def stop():
                expired.set()
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            timer = threading.Timer(timeout, stop)
            timer.daemon = True
            timer.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()  # (tail -f follows a running command)
            if on_line is not None:
                on_line(line.rstrip("\n"))
        code = proc.wait()
        if timer is not None:
            timer.cancel()
        if expired.is_set():
            log.write(f"[stopped: ran past its time limit of {timeout:.0f} s]\n")
            return TIMED_OUT
        return code


def fairseq_log_records(lines):
    """The (tag, record) pairs of a fairseq-train ``--log-format json`` log, in order: tag is
    "train_inner" (every --log-interval updates), "train" (an epoch's end) or "valid"; record is
    the JSON object as fairseq writes it (values as strings; a metric that was not logged in the
    interval, such as one of ``--fourier-log-interval``, as None). Other lines are skipped."""
    for line in lines:
        m = _LOG_RECORD.search(line)
        if not m:
            continue
        try:
            yield m.group(1), json.loads(m.group(2))
        except json.JSONDecodeError:
            continue


def options_given(extra_args) -> dict:
    """Every --fourier-* option among fairseq-train arguments, named as its FourierAttentionConfig
    field without the prefix (--fourier-radius-init 1.0 -> {"radius_init": "1.0"}; a flag
    without a value -> 1). No option is listed here: a new one is recorded as it is."""
    out = {}
    for i, a in enumerate(extra_args):
        name, eq, val = str(a).partition("=")
        if not name.startswith("--fourier-"):
            continue
        if not eq:
            nxt = str(extra_args[i + 1]) if i + 1 < len(extra_args) else "--"
            val = 1 if nxt.startswith("--") else nxt
        out[name[len("--fourier-"):].replace("-", "_")] = val
    return out


def run_name_suffix(extra_args) -> str:
    """A run-name suffix from the --fourier-* options among fairseq-train arguments, as options_given
    reads them, each option's name and its value (a flag: its name), dashes as underscores
    (--fourier-phi abs --fourier-paper-exact -> _phiabs_paper_exact)."""
    parts = (name if value == 1 and not isinstance(value, str) else f"{name}{value}"
             for name, value in options_given(extra_args).items())
    return "".join("_" + p for p in parts).replace("-", "_")


def _last_int_option(args, flag: str) -> int:
    """The value of the last ``flag N`` / ``flag=N`` among fairseq-train arguments (argparse's rule); 0 if absent."""
    value = "0"
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1:]
    return int(value)


def training_done(checkpoint: str, train_args) -> str:
    """Why the fairseq-train command ``train_args`` has nothing left to train from ``checkpoint`` (its
    ``checkpoint_last.pt``): its ``--max-update`` updates are done, or its ``--max-epoch`` epochs; ''
    when there is training left (or no checkpoint). fairseq's saved iterator names the epoch to run
    next, so the epochs done are one fewer."""
    if not os.path.exists(checkpoint):
        return ""
    import torch

    from fourierformer_fairseq.checkpoint_compat import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    state = torch.load(checkpoint, map_location="cpu", mmap=True)  # weights_only where torch defaults to it
    updates = int(state["optimizer_history"][-1]["num_updates"])
    epochs = int(state["extra_state"]["train_iterator"]["epoch"]) - 1
    max_update, max_epoch = _last_int_option(train_args, "--max-update"), _last_int_option(train_args, "--max-epoch")
    if max_update > 0 and updates >= max_update:
        return f"{updates} updates done, --max-update {max_update}"
    if max_epoch > 0 and epochs >= max_epoch:
        return f"{epochs} epochs done ({updates} updates), --max-epoch {max_epoch}"
    return ""


def generate_hypotheses(lines) -> dict:
    """{sentence id: hypothesis} from fairseq-generate's output (its "H-<id>\\tscore\\ttext" lines)."""
    hyps = {}
    for line in lines:
        if line.startswith("H-"):
            ident, _, text = line.rstrip("\n").split("\t", 2)
            hyps[int(ident[2:])] = text
    return hyps


def detokenised_bleu(hypotheses, references, lang: str = "en"):
    """The recipes' BLEU: sacreBLEU, case-insensitive, on the hypotheses detokenised with the Moses
    detokeniser (sacremoses), against references as they are (raw text). Returns (score,
    sacreBLEU's signature, the detokenised hypotheses)."""
    import sacrebleu
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=lang)
    detok = [md.detokenize(h.split()) for h in hypotheses]
    metric = sacrebleu.metrics.BLEU(lowercase=True)
    score = metric.corpus_score(detok, [list(references)])
    return score.score, str(metric.get_signature()), detok


def main(argv=None) -> int:
    """For the recipes' shells: ``fairseq_runs.py run-suffix ARGS...`` prints run_name_suffix(ARGS);
    ``fairseq_runs.py trained CHECKPOINT ARGS...`` prints training_done(CHECKPOINT, ARGS) and exits 0
    when it is not '' (nothing left to train), 1 otherwise."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "run-suffix":
        print(run_name_suffix(argv[1:]))
        return 0
    if len(argv) >= 2 and argv[0] == "trained":
        why = training_done(argv[1], argv[2:])
        if why:
            print(why)
        return 0 if why else 1
    print("usage: fairseq_runs.py run-suffix [FAIRSEQ-TRAIN ARGUMENTS...]\n"
          "       fairseq_runs.py trained CHECKPOINT [FAIRSEQ-TRAIN ARGUMENTS...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
