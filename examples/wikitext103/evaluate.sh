#!/usr/bin/env bash
# Evaluate WikiText-103 language models with a sliding window at batch 1: the base toolkit's evaluation
# of the published training, not the published code's (docs/published-model.md, status row 16).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/lib.sh"

DATA="data-bin/wikitext-103"
SUBSETS="valid test"
CKPT=checkpoint_best.pt
CONTEXT=""
STRIDE=1
BATCH=1
SMALL=0
PRINT=0
CPU=0
RUNS_ARGS=()

usage() {
    cat <<EOF
Usage: examples/wikitext103/evaluate.sh [options] RUN [RUN ...]

For each RUN folder written by train.sh: fairseq-eval-lm with batch size 1 and a sliding
window as long as the training context (from RUN/meta.json): every window scores only its
last position, except the first window, which scores all of its positions
(--tokens-per-sample CONTEXT --context-window CONTEXT-1). Writes RUN/eval-SUBSET.log and
RUN/results-lm.json (valid_ppl, test_ppl, ...) for make_tables.py. A subset missing from
the data (e.g. WikiText-2 without test) is skipped.

Options:
  --data DIR          (default: $DATA)
  --subsets "valid test"   (default: "$SUBSETS")
  --checkpoint NAME   file in RUN/checkpoints (default: $CKPT)
  --context N         window length (default: the run's training context)
  --stride N          positions scored a window (default: $STRIDE, the evaluation of status row 16 of
                      docs/published-model.md; larger is faster and scores each token with less context)
  --batch-size N      (default: $BATCH)
  --small             small mode: stride 8, batch 8
  --cpu               evaluate on the CPU (default: the GPU where torch sees one, else the CPU)
  --print-command     print each RUN's fairseq-eval-lm commands and stop (nothing is run): the
                      commands for a GPU machine, or with --cpu for a CPU
  -h, --help          this help

Example: examples/wikitext103/evaluate.sh runs/wikitext103/fourier_small_seed*
EOF
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --data) DATA="${2:?}"; shift 2 ;;
        --subsets) SUBSETS="${2:?}"; shift 2 ;;
        --checkpoint) CKPT="${2:?}"; shift 2 ;;
        --context) CONTEXT="${2:?}"; shift 2 ;;
        --stride) STRIDE="${2:?}"; shift 2 ;;
        --batch-size) BATCH="${2:?}"; shift 2 ;;
        --small) SMALL=1; shift ;;
        --print-command) PRINT=1; shift ;;
        --cpu) CPU=1; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) usage >&2; die "unknown option '$1'" ;;
        *) RUNS_ARGS+=("$1"); shift ;;
    esac
done
[[ ${#RUNS_ARGS[@]} -gt 0 ]] || { usage >&2; die "no RUN folder given"; }
[[ $SMALL == 1 ]] && { STRIDE=8; BATCH=8; }
device_for "$PRINT" "$CPU"
if [[ $PRINT == 0 ]]; then
    need fairseq-eval-lm "bash scripts/tools/install.sh installs fairseq"
    [[ -f "$DATA/dict.txt" ]] || die "no binarised data in $DATA"
fi

for RUN in "${RUNS_ARGS[@]}"; do
    MODEL="$RUN/checkpoints/$CKPT"
    [[ $PRINT == 1 || -f "$MODEL" ]] || die "no checkpoint $MODEL"
    ctx="$CONTEXT"
    if [[ -z "$ctx" ]]; then
        ctx=$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1])).get('context', ''))" "$RUN/meta.json" 2>/dev/null || true)
        [[ -n "$ctx" ]] || die "no context in $RUN/meta.json: pass --context N"
    fi
    (( STRIDE >= 1 && STRIDE <= ctx )) || die "--stride must be in 1..$ctx"
    WINDOW=$(( ctx - STRIDE ))
    for SUB in $SUBSETS; do
        # --required-batch-size-multiple 1: fairseq's default (8) can leave windows out of the batches
        CMD=(fairseq-eval-lm "$DATA" --user-dir "$USER_DIR" --path "$MODEL" --gen-subset "$SUB"
             --batch-size "$BATCH" --tokens-per-sample "$ctx" --context-window "$WINDOW"
             --sample-break-mode none --required-batch-size-multiple 1 "${DEVICE[@]}")
        if [[ $PRINT == 1 ]]; then
            printf '%q ' "${CMD[@]}"; echo
            continue
        fi
        if ! ls "$DATA/$SUB".* >/dev/null 2>&1; then
            say "$RUN: no $SUB split in $DATA, skipped"
            continue
        fi
        LOG="$RUN/eval-$SUB.log"
        say "$RUN: fairseq-eval-lm on $SUB (window $ctx, context $WINDOW, batch $BATCH) -> $LOG"
        "${CMD[@]}" > "$LOG" 2>&1 || { tail -20 "$LOG" >&2; die "fairseq-eval-lm failed for $RUN on $SUB"; }
        grep -E "Loss \(base 2\)|Evaluated" "$LOG" | sed 's/^.*eval_lm | /  /' >&2 || true
    done
    [[ $PRINT == 1 ]] && continue
    "$PYTHON" - "$RUN" "$ctx" "$STRIDE" "$BATCH" "$MODEL" $SUBSETS <<'PY'
import json, os, re, sys
run, ctx, stride, batch, model, *subsets = sys.argv[1:]
res = {"checkpoint": model, "context": int(ctx), "stride": int(stride), "batch_size": int(batch)}
for sub in subsets:
    log = os.path.join(run, f"eval-{sub}.log")
    if not os.path.exists(log):
        continue
    text = open(log).read()
    m = re.findall(r"Loss \(base 2\): ([0-9.]+), Perplexity: ([0-9.]+)", text)
    if m:
        res[f"{sub}_loss_base2"] = float(m[-1][0])
        res[f"{sub}_ppl"] = float(m[-1][1])
    n = re.findall(r"Evaluated ([0-9,]+) tokens", text)
    if n:
        res[f"{sub}_tokens"] = int(n[-1].replace(",", ""))
json.dump(res, open(os.path.join(run, "results-lm.json"), "w"), indent=1)
print("  " + ", ".join(f"{k} {v}" for k, v in res.items() if k.endswith("_ppl")), file=sys.stderr)
PY
    say "$RUN: results in $RUN/results-lm.json"
done
