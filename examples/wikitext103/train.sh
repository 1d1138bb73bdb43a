#!/usr/bin/env bash
# Train the small / medium FourierFormer or softmax language models on WikiText-103.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/lib.sh"

# the recipe's hyper-parameters: R_LR, R_MAX_UPDATE, ... (fourierformer_fairseq/training_recipes.py)
eval "$(recipe wikitext103 --shell)"
MODEL=fourier
SIZE=small
SEEDS="1"
DATA="data-bin/wikitext-103"
RUNS="runs/wikitext103"
NAME=""
MAX_UPDATE=$R_MAX_UPDATE
MAX_SEQS=$R_BATCH_SIZE                    # sequences a forward pass (BATCH / MAX_SEQS = gradient accumulation)
BATCH=$(( R_BATCH_SIZE * R_UPDATE_FREQ ))  # sequences an update
LR=$R_LR
WARMUP=$R_WARMUP_UPDATES
CONTEXT=""
SMALL=0
KEEP=5
SAVE_EVERY=5000
EXTRA=()

usage() {
    cat <<EOF
Usage: examples/wikitext103/train.sh [options] [-- extra fairseq-train arguments]

Trains a language model on WikiText-103 (prepared by examples/wikitext103/prepare.sh).
Models (registered by the plugin, --user-dir fourierformer_fairseq):
  fourier small   fourierformer_lm_wiki103_small   16 layers, d 128, 8 heads, ffn 2048, p=4, R0=0.43 (paper-exact: 2)
  fourier medium  fourierformer_lm_wiki103_medium  d 256, R0=0.36
  softmax small   softmax_lm_wiki103_small         the same shapes with dot-product attention
  softmax medium  softmax_lm_wiki103_medium
Training context (tokens-per-sample): $R_CONTEXT_SMALL (small) / $R_CONTEXT_MEDIUM (medium), sample-break-mode $R_SAMPLE_BREAK_MODE.
Optimisation (our defaults, all overridable): Adam $R_ADAM_BETAS, lr $LR, $R_LR_SCHEDULER with
$WARMUP warm-up updates, clip-norm $R_CLIP_NORM, dropout $R_DROPOUT, weight decay $R_WEIGHT_DECAY, $BATCH sequences an
update ($MAX_SEQS a pass, the rest by --update-freq), $MAX_UPDATE updates. One run per seed:
RUNS/NAME_seedS/ holds train.log, meta.json and checkpoints/.

Options:
  --model fourier|softmax|ARCH   (default: $MODEL)
  --size small|medium      (default: $SIZE)
  --seeds "1 2 3"          (default: $SEEDS)
  --data DIR               (default: $DATA)
  --runs DIR               (default: $RUNS)
  --name NAME              run name (default: MODEL_SIZE plus the Fourier options given)
  --context N              tokens per sample (default: $R_CONTEXT_SMALL small, $R_CONTEXT_MEDIUM medium)
  --max-update N           (default: $MAX_UPDATE)
  --batch N                sequences an update (default: $BATCH)
  --max-seqs N             sequences a forward pass (default: $MAX_SEQS)
  --lr X / --warmup N      (defaults: $LR / $WARMUP)
  --save-every N           checkpoint every N updates, the last $KEEP kept (default: $SAVE_EVERY)
  --small                  small mode: a 2-layer, 32-dim model, context 32, 40 updates
  -h, --help               this help
Anything after -- goes to fairseq-train (e.g. -- --adaptive-input ... for the softmax twins,
or -- --fourier-phi abs / --fourier-radius-init 1.0 / --fourier-radius-shape head).

Examples:
  examples/wikitext103/train.sh --model fourier --size small --seeds "1 2 3"
  examples/wikitext103/train.sh --model softmax --size medium --seeds "1 2 3"
EOF
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) MODEL="${2:?}"; shift 2 ;;
        --size) SIZE="${2:?}"; shift 2 ;;
        --seeds) SEEDS="${2:?}"; shift 2 ;;
        --data) DATA="${2:?}"; shift 2 ;;
        --runs) RUNS="${2:?}"; shift 2 ;;
        --name) NAME="${2:?}"; shift 2 ;;
        --context) CONTEXT="${2:?}"; shift 2 ;;
        --max-update) MAX_UPDATE="${2:?}"; shift 2 ;;
        --batch) BATCH="${2:?}"; shift 2 ;;
        --max-seqs) MAX_SEQS="${2:?}"; shift 2 ;;
        --lr) LR="${2:?}"; shift 2 ;;
        --warmup) WARMUP="${2:?}"; shift 2 ;;
        --save-every) SAVE_EVERY="${2:?}"; shift 2 ;;
        --small) SMALL=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) usage >&2; die "unknown option '$1' (fairseq-train arguments go after --)" ;;
    esac
done

case "$SIZE" in small|medium) ;; *) die "--size must be small or medium, got '$SIZE'" ;; esac
case "$MODEL" in
    fourier) ARCH_OF_SIZE="R_ARCH_${SIZE^^}"; ARCH="${!ARCH_OF_SIZE}" ;;
    softmax) ARCH_OF_SIZE="R_ARCH_${SIZE^^}"; ARCH=$(softmax_twin "${!ARCH_OF_SIZE}") ;;
    *) ARCH="$MODEL" ;;
esac
if [[ -z "$CONTEXT" ]]; then
    [[ $SIZE == small ]] && CONTEXT=$R_CONTEXT_SMALL || CONTEXT=$R_CONTEXT_MEDIUM
fi
DIMS=()
if [[ $SMALL == 1 ]]; then
    DIMS=(--decoder-layers 2 --decoder-embed-dim 32 --decoder-ffn-embed-dim 64 --decoder-attention-heads 2)
    CONTEXT=32 MAX_UPDATE=40 BATCH=8 MAX_SEQS=8 WARMUP=10 SAVE_EVERY=20 KEEP=2
fi
if [[ -z "$NAME" ]]; then
    NAME="${MODEL}_${SIZE}"
    NAME="${NAME}$(fourier_suffix "${EXTRA[@]}")"
    NAME="${NAME//-/_}"
fi
(( BATCH % MAX_SEQS == 0 )) || die "--batch ($BATCH) must be a multiple of --max-seqs ($MAX_SEQS)"
UPDATE_FREQ=$(( BATCH / MAX_SEQS ))
mapfile -t RECIPE < <(recipe wikitext103 --set tokens-per-sample "$CONTEXT" --set lr "$LR" --set warmup-updates "$WARMUP" \
                      --set batch-size "$MAX_SEQS" --set update-freq "$UPDATE_FREQ" --set max-update "$MAX_UPDATE")

need fairseq-train "pip install fairseq-fixed==0.12.3.1"
[[ -f "$DATA/dict.txt" ]] || die "no binarised data in $DATA: run examples/wikitext103/prepare.sh first"
[[ -d "$USER_DIR" ]] || die "plugin folder $USER_DIR not found (set FOURIERFORMER_USER_DIR)"
DEVICE=()
has_cuda || DEVICE=(--cpu)

for SEED in $SEEDS; do
    RUN="$RUNS/${NAME}_seed${SEED}"
    mkdir -p "$RUN/checkpoints"
    write_meta "$RUN/meta.json" task=wikitext103 model="$MODEL" size="$SIZE" arch="$ARCH" seed="$SEED" \
        name="$NAME" context="$CONTEXT" data="$DATA" small="$SMALL" -- "${EXTRA[@]}"
    say "training $ARCH (context $CONTEXT, $BATCH seqs/update) seed $SEED -> $RUN (log: $RUN/train.log)"
    start=$(date +%s)
    set +e
    fairseq-train "$DATA" --user-dir "$USER_DIR" --arch "$ARCH" "${DIMS[@]}" "${RECIPE[@]}" \
        --save-interval-updates "$SAVE_EVERY" --keep-interval-updates "$KEEP" --no-epoch-checkpoints \
        --seed "$SEED" --save-dir "$RUN/checkpoints" "${DEVICE[@]}" \
        --log-format simple --log-interval 100 "${EXTRA[@]}" 2>&1 | tee "$RUN/train.log" \
        | grep --line-buffered -E "valid on|done training|Error|error:|Traceback" >&2
    rc=${PIPESTATUS[0]}
    set -e
    [[ $rc == 0 ]] || die "fairseq-train failed for seed $SEED (exit $rc); see $RUN/train.log"
    say "seed $SEED done in $(( $(date +%s) - start ))s: $RUN"
done
