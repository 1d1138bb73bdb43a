#!/usr/bin/env bash
# Evaluate IWSLT'14 runs: checkpoint averaging, the recipe's generation protocol, tokenised BLEU and
# detokenised sacreBLEU.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/lib.sh"

DATA="data-bin/iwslt14.tokenized.de-en"
AVG=10
AVG_GIVEN=""
AVG_BY=epochs
# fairseq-generate's options: the generation protocol (fourierformer_fairseq/training_recipes.py:
# GENERATION) with what --beam, --lenpen, --batch-size and --small change (--set OPTION VALUE)
SETS=()
SUBSET=test
SMALL=0
PRINT=0
CPU=0
RUNS_ARGS=()

usage() {
    cat <<EOF
Usage: examples/iwslt14/evaluate.sh [options] RUN [RUN ...]

For each RUN folder written by train.sh (RUN/checkpoints/):
  1. averages the last N epoch checkpoints -> RUN/checkpoints/checkpoint_avgN.pt
     (N=0: checkpoint_best.pt as is)
  2. fairseq-generate on the test set with the recipe's generation protocol
     ($(recipe iwslt14 --generate | tr '\n' ' ' | sed 's/ $//'))
     -> RUN/generate-SUBSET.txt; its "BLEU4 =" line is BLEU on the tokenised, lowercased text
     (the paper's protocol: its numbers are scripts/analysis/tables/paper_numbers.json's table5)
  3. sacreBLEU on detokenised text (sacremoses) against the raw references kept by
     prepare.sh (DATA/text/raw/test.en), case-insensitive, with its signature
  4. writes RUN/results-SUBSET.json (bleu_tok, sacrebleu, signature, checkpoint) for make_tables.py

Options:
  --data DIR        binarised data (default: $DATA)
  --avg N           checkpoints to average (default: $AVG; 0 = checkpoint_best.pt, e.g. for a
                    --max-update run, which may keep no epoch checkpoints)
  --avg-by epochs|updates   average the last N epoch checkpoints (checkpointE.pt, default) or
                    the last N update checkpoints (checkpoint_E_U.pt, --save-interval-updates)
  --beam N          beam size (default: the protocol's)
  --lenpen X        length penalty (default: the protocol's)
  --batch-size N    sentences a batch (default: the protocol's)
  --subset NAME     test or valid (default: $SUBSET)
  --small           small mode: average 2 (unless --avg says otherwise), beam 2, batch 64, the
                    validation's length limit
  --cpu             generate on the CPU (default: the GPU where torch sees one, else the CPU)
  --print-command   print each RUN's fairseq-generate command and stop (nothing is run): the
                    command for a GPU machine, or with --cpu for a CPU
  -h, --help        this help

Example: examples/iwslt14/evaluate.sh runs/iwslt14/fourier_seed*
EOF
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --data) DATA="${2:?}"; shift 2 ;;
        --avg) AVG="${2:?}"; AVG_GIVEN=1; shift 2 ;;
        --avg-by) AVG_BY="${2:?}"; shift 2 ;;
        --beam|--lenpen|--batch-size) SETS+=(--set "${1#--}" "${2:?}"); shift 2 ;;
        --subset) SUBSET="${2:?}"; shift 2 ;;
        --small) SMALL=1; shift ;;
        --print-command) PRINT=1; shift ;;
        --cpu) CPU=1; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) usage >&2; die "unknown option '$1'" ;;
        *) RUNS_ARGS+=("$1"); shift ;;
    esac
done
[[ ${#RUNS_ARGS[@]} -gt 0 ]] || { usage >&2; die "no RUN folder given"; }
[[ $SMALL == 1 ]] && { [[ -n $AVG_GIVEN ]] || AVG=2; SETS=(--validation-lengths --set beam 2 --set batch-size 64 "${SETS[@]}"); }
mapfile -t GENERATE < <(recipe iwslt14 --generate "${SETS[@]}")
[[ ${#GENERATE[@]} -gt 0 ]] || die "no generation protocol (fourierformer_fairseq/training_recipes.py)"
BEAM=$(printf '%s\n' "${GENERATE[@]}" | sed -n '/^--beam$/{n;p}')  # (for the messages and results.json)
device_for "$PRINT" "$CPU"
if [[ $PRINT == 0 ]]; then
    need fairseq-generate "bash scripts/tools/install.sh installs fairseq"
    [[ -f "$DATA/dict.en.txt" ]] || die "no binarised data in $DATA"
fi

for RUN in "${RUNS_ARGS[@]}"; do
    CK="$RUN/checkpoints"
    MODEL="$CK/checkpoint_best.pt"
    (( AVG > 0 )) && MODEL="$CK/checkpoint_avg$AVG.pt"
    OUTF="$RUN/generate-$SUBSET.txt"
    CMD=(fairseq-generate "$DATA" --user-dir "$USER_DIR" --path "$MODEL" --gen-subset "$SUBSET" "${GENERATE[@]}"
         "${DEVICE[@]}")
    if [[ $PRINT == 1 ]]; then
        printf '%q ' "${CMD[@]}"; echo
        continue
    fi
    [[ -d "$CK" ]] || die "$RUN has no checkpoints/ (is it a train.sh run folder?)"
    if [[ $AVG -gt 0 ]]; then
        case "$AVG_BY" in
            epochs) FLAG=--num-epoch-checkpoints ;;
            updates) FLAG=--num-update-checkpoints ;;
            *) die "--avg-by must be epochs or updates" ;;
        esac
        say "$RUN: averaging the last $AVG $AVG_BY checkpoints"
        "$PYTHON" "$REPO_ROOT/scripts/tools/average_checkpoints.py" --inputs "$CK" "$FLAG" "$AVG" --output "$MODEL" >&2 \
            || die "$RUN: no $AVG $AVG_BY checkpoints to average (a --max-update run may stop before it saves" \
                   "any epoch checkpoint): pass --avg 0 to evaluate checkpoint_best.pt, or a smaller --avg"
    fi
    [[ -f "$MODEL" ]] || die "no checkpoint $MODEL"
    say "$RUN: fairseq-generate --beam $BEAM on $SUBSET -> $OUTF"
    "${CMD[@]}" > "$OUTF" 2> "$RUN/generate-$SUBSET.log" \
        || { tail -20 "$RUN/generate-$SUBSET.log" >&2; die "fairseq-generate failed for $RUN"; }
    grep -h "BLEU4 =" "$OUTF" "$RUN/generate-$SUBSET.log" | tail -1 | sed 's/^/  tokenised: /' >&2 || true
    RAWREF="$DATA/text/raw/$SUBSET.en"
    "$PYTHON" - "$OUTF" "$RAWREF" "$RUN/results-$SUBSET.json" "$MODEL" "$SUBSET" "$BEAM" <<'PY'
import json, os, re, sys
gen, rawref, out, model, subset, beam = sys.argv[1:]
from fourierformer_fairseq.fairseq_runs import detokenised_bleu, generate_hypotheses

refs, bleu_tok = {}, None
text = open(gen, encoding="utf-8").read()
log = gen[:-4] + ".log"
if os.path.exists(log):
    text += "\n" + open(log, encoding="utf-8").read()
hyps = generate_hypotheses(text.splitlines())
for line in text.splitlines():
    if line.startswith("T-"):
        i, _, ref = line.partition("\t")
        refs[int(i[2:])] = ref
    m = re.search(r"BLEU4? = ([0-9.]+)", line)
    if m and "Generate" in line:
        bleu_tok = float(m.group(1))
ids = sorted(hyps)
if os.path.exists(rawref):
    raw = open(rawref, encoding="utf-8").read().split("\n")[:-1]
    if len(raw) == len(ids) and ids == list(range(len(ids))):
        ref, refsrc = [raw[i] for i in ids], f"raw references {rawref}"
    else:
        ref, refsrc = None, None
else:
    ref, refsrc = None, None
if os.path.exists(rawref) and ref is None:
    print(f"  WARNING: {len(ids)} hypotheses for {len(raw)} references: fairseq left sentences out", file=sys.stderr)
if ref is None:  # fall back: the detokenised tokenised references
    from sacremoses import MosesDetokenizer
    md = MosesDetokenizer(lang="en")
    ref = [md.detokenize(refs[i].split()) for i in ids]
    refsrc = "detokenised tokenised references (raw references not found or not aligned)"
score, sig, detok = detokenised_bleu([hyps[i] for i in ids], ref)
res = {"subset": subset, "checkpoint": model, "beam": int(beam), "sentences": len(ids),
       "bleu_tok": bleu_tok, "sacrebleu": round(score, 2), "sacrebleu_signature": sig,
       "sacrebleu_references": refsrc}
json.dump(res, open(out, "w"), indent=1)
with open(gen[:-4] + ".detok.en", "w", encoding="utf-8") as fh:
    fh.writelines(x + "\n" for x in detok)
print(f"  sacreBLEU (detokenised, lowercase) = {score:.2f}  {sig}  [{refsrc}]", file=sys.stderr)
print(f"  tokenised BLEU4 = {bleu_tok}", file=sys.stderr)
PY
    say "$RUN: results in $RUN/results-$SUBSET.json"
done
