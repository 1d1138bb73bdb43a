#!/usr/bin/env bash
# Train the small / medium FourierFormer or softmax language models on WikiText-103.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/lib.sh"

PROTOCOL=""   # the recipe's default (fourierformer_fairseq/training_recipes.py: DEFAULT_LM_PROTOCOL)
MODEL=fourier
SIZE=small
SEEDS="1"
DATA="data-bin/wikitext-103"
RUNS="runs/wikitext103"
NAME=""
MAX_UPDATE=""
MAX_SEQS=""
BATCH=""
LR=""
WARMUP=""
CONTEXT=""
SMALL=0
PRINT=0
CPU=0
GPUS=1
KEEP=5
SAVE_EVERY=5000
EXTRA=()

# the recipe's hyper-parameters for a protocol and size: R_LR, R_MAX_UPDATE, ... (training_recipes.py)
load_recipe() { eval "$(recipe wikitext103 ${PROTOCOL:+--protocol "$PROTOCOL"} --size "$SIZE" --shell)"; }

usage() {
    load_recipe
    cat <<EOF
Usage: examples/wikitext103/train.sh [options] [-- extra fairseq-train arguments]

Trains a language model on WikiText-103 (prepared by examples/wikitext103/prepare.sh).
Models (registered by the plugin, --user-dir fourierformer_fairseq):
  fourier small   fourierformer_lm_wiki103_small   16 layers, d 128, 8 heads, ffn 2048, p=4, R0=0.43 (paper-exact: 2)
  fourier medium  fourierformer_lm_wiki103_medium  d 256, R0=0.36
  softmax small   softmax_lm_wiki103_small         the same shapes with dot-product attention
  softmax medium  softmax_lm_wiki103_medium
Training context (tokens-per-sample): $R_CONTEXT_SMALL (small) / $R_CONTEXT_MEDIUM (medium), sample-break-mode $R_SAMPLE_BREAK_MODE.
Protocols (--protocol; the same training for every model, so both columns of a table come from one):
  published  the published code's training (the default): its optimiser, schedule, adaptive input
             and softmax, post-LN and init (docs/published-model.md: what is reproduced, what approximated)
  fairseq    fairseq's transformer_lm recipe at the paper's sizes (inverse-sqrt, full softmax, pre-LN)
This protocol ($R_PROTOCOL_NAME, $SIZE): Adam $R_ADAM_BETAS, lr $R_LR, $R_LR_SCHEDULER with $R_WARMUP_UPDATES warm-up
updates, clip-norm $R_CLIP_NORM, dropout $R_DROPOUT, weight decay $R_WEIGHT_DECAY, $(( R_BATCH_SIZE * R_UPDATE_FREQ )) sequences an update
($R_BATCH_SIZE a pass, the rest by --update-freq), $R_MAX_UPDATE updates. On data with another vocabulary than
WikiText-103's (dict.txt), the published cutoffs are scaled to it in proportion (and printed); with
--max-update and no --warmup, the warm-up is scaled in proportion too. One run per seed:
RUNS/NAME_seedS/ holds train.log, meta.json and checkpoints/. A run is resumed from its
checkpoint_last.pt, its log appended to (each run's start marked); a run that already holds its
--max-update updates is skipped, with a word: raise --max-update to train it further, or remove
its checkpoints/ to train it anew. The console shows fairseq's progress lines (every
--log-interval updates) and validation; train.log has everything.

On N GPUs (--gpus N, all machines together) the update keeps the protocol's sequences: each GPU
takes an equal share, in passes of at most --max-seqs sequences (N must divide the sequences an
update; else refused, with the N that do). One machine: fairseq starts one process per GPU.
Several: run this script in each srun task with -- --distributed-port PORT, or by torchrun ...
--no-python examples/wikitext103/train.sh, or on each machine with -- --distributed-init-method
tcp://HOST:PORT --distributed-rank R (docs/distributed.md); the first copy writes train.log and
meta.json, copy C train.copyC.log.

Options:
  --protocol published|fairseq   (default: $R_PROTOCOL_NAME)
  --model fourier|softmax|ARCH   (default: $MODEL)
  --size small|medium      (default: $SIZE)
  --seeds "1 2 3"          (default: $SEEDS)
  --data DIR               (default: $DATA)
  --runs DIR               (default: $RUNS)
  --name NAME              run name (default: MODEL_SIZE plus the Fourier options given)
  --context N              tokens per sample (default: $R_CONTEXT_SMALL small, $R_CONTEXT_MEDIUM medium)
  --max-update N           (default: the protocol's)
  --batch N                sequences an update (default: the protocol's)
  --max-seqs N             sequences a forward pass (default: the protocol's)
  --gpus N                 GPUs in all, one process each (default: $GPUS); fairseq's distributed
                           options (--distributed-port, ...) go after --
  --lr X / --warmup N      (defaults: the protocol's)
  --save-every N           checkpoint every N updates, the last $KEEP kept (default: $SAVE_EVERY)
  --small                  small mode: a 2-layer, 32-dim model, context 32, 40 updates
  --cpu                    train on the CPU (default: the GPU where torch sees one, else the CPU)
  --print-command          print each seed's fairseq-train command and stop (nothing is checked or run):
                           the command for a GPU machine, or with --cpu for a CPU
  -h, --help               this help
Anything after -- goes to fairseq-train (e.g. -- --adaptive-input ... for the softmax twins,
or -- --fourier-phi abs / --fourier-radius-init 1.0 / --fourier-radius-shape head).

Examples:
  examples/wikitext103/train.sh --model fourier --size small --seeds "1 2 3" -- --fourier-published
  examples/wikitext103/train.sh --model softmax --size medium --seeds "1 2 3"
  examples/wikitext103/train.sh --protocol fairseq --model fourier --size small
EOF
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --protocol) PROTOCOL="${2:?}"; shift 2 ;;
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
        --print-command) PRINT=1; shift ;;
        --cpu) CPU=1; shift ;;
        --gpus) GPUS="${2:?}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) usage >&2; die "unknown option '$1' (fairseq-train arguments go after --)" ;;
    esac
done

case "$SIZE" in small|medium) ;; *) die "--size must be small or medium, got '$SIZE'" ;; esac
case "${PROTOCOL:-published}" in published|fairseq) ;; *) die "--protocol must be published or fairseq, got '$PROTOCOL'" ;; esac
load_recipe
case "$MODEL" in
    fourier) ARCH="$R_ARCH" ;;
    softmax) ARCH=$(softmax_twin "$R_ARCH") ;;
    *) ARCH="$MODEL" ;;
esac
CONTEXT=${CONTEXT:-$R_TOKENS_PER_SAMPLE}
MAX_SEQS=${MAX_SEQS:-$R_BATCH_SIZE}
BATCH=${BATCH:-$(( R_BATCH_SIZE * R_UPDATE_FREQ ))}
LR=${LR:-$R_LR}
if [[ -z "$WARMUP" && -n "$MAX_UPDATE" ]]; then
    WARMUP=$(recipe ${PROTOCOL:+--protocol "$PROTOCOL"} --size "$SIZE" --scaled-warmup "$MAX_UPDATE")
    say "warm-up scaled to the $MAX_UPDATE updates in proportion: $WARMUP"
fi
WARMUP=${WARMUP:-$R_WARMUP_UPDATES}
MAX_UPDATE=${MAX_UPDATE:-$R_MAX_UPDATE}
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
# the update's sequences shared by the GPUs (examples/lib.sh: gpu_split), fairseq's options for them
gpu_split "$BATCH" "$GPUS" "$MAX_SEQS" sequences
distributed_options "$GPUS" "${EXTRA[@]}"
SETS=(--set tokens-per-sample "$CONTEXT" --set lr "$LR" --set warmup-updates "$WARMUP"
      --set batch-size "$SPLIT_PER_PASS" --set update-freq "$SPLIT_UPDATE_FREQ" --set max-update "$MAX_UPDATE")
CUTOFFS=$(recipe ${PROTOCOL:+--protocol "$PROTOCOL"} --cutoffs-for "$DATA")
if [[ -n "$CUTOFFS" ]]; then
    say "a vocabulary other than WikiText-103's ($DATA/dict.txt): adaptive cutoffs $R_ADAPTIVE_INPUT_CUTOFF scaled in proportion to $CUTOFFS"
    SETS+=(--set adaptive-input-cutoff "$CUTOFFS" --set adaptive-softmax-cutoff "$CUTOFFS")
fi
mapfile -t RECIPE < <(recipe wikitext103 ${PROTOCOL:+--protocol "$PROTOCOL"} --size "$SIZE" "${SETS[@]}")
device_for "$PRINT" "$CPU"

command_of() {  # command_of SEED RUN: the fairseq-train command of a seed, one argument an element of CMD
    CMD=(fairseq-train "$DATA" --user-dir "$USER_DIR" --arch "$ARCH" "${DIMS[@]}" "${RECIPE[@]}"
         --save-interval-updates "$SAVE_EVERY" --keep-interval-updates "$KEEP" --no-epoch-checkpoints
         --seed "$1" --save-dir "$2/checkpoints" "${DEVICE[@]}" "${DIST_OPTIONS[@]}" --log-format simple \
         --log-interval 100 "${EXTRA[@]}")
}
if [[ $PRINT == 1 ]]; then
    print_commands
    exit 0
fi

need fairseq-train "bash scripts/tools/install.sh installs fairseq"
[[ -f "$DATA/dict.txt" ]] || die "no binarised data in $DATA: run examples/wikitext103/prepare.sh first"
[[ -d "$USER_DIR" ]] || die "plugin folder $USER_DIR not found (set FOURIERFORMER_USER_DIR)"
check_distributed "$GPUS"
(( GPUS == 1 )) || say "$GPUS GPUs ($DIST_LAUNCH): $SPLIT_PER_PASS sequences a GPU a pass, x $SPLIT_UPDATE_FREQ passes x $GPUS GPUs = $BATCH an update"

for SEED in $SEEDS; do
    RUN="$RUNS/${NAME}_seed${SEED}"
    LOG=$(run_log "$RUN")
    command_of "$SEED" "$RUN"
    if why=$(trained "$RUN"); then
        say "seed $SEED: $RUN is trained ($why): skipped (raise --max-update to train it further)"
        continue
    fi
    mkdir -p "$RUN/checkpoints"
    if [[ $DIST_COPY == 0 ]]; then
        write_meta "$RUN/meta.json" task=wikitext103 model="$MODEL" size="$SIZE" arch="$ARCH" seed="$SEED" \
            protocol="$R_PROTOCOL_NAME" name="$NAME" context="$CONTEXT" data="$DATA" small="$SMALL" gpus="$GPUS" \
            -- "${EXTRA[@]}"
    fi
    say "training $ARCH ($R_PROTOCOL_NAME protocol, context $CONTEXT, $BATCH seqs/update, $MAX_UPDATE updates) seed $SEED -> $RUN (log: $LOG)"
    start=$(date +%s)
    train_logged "$LOG" || die "fairseq-train failed for seed $SEED (exit $?); see $LOG"
    say "seed $SEED done in $(( $(date +%s) - start ))s: $RUN"
done
