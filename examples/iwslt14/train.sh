#!/usr/bin/env bash
# Train FourierFormer or its softmax twin on IWSLT'14 De-En with fairseq's IWSLT hyper-parameters.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/lib.sh"

# the recipe's hyper-parameters: R_LR, R_MAX_TOKENS, ... (fourierformer_fairseq/training_recipes.py)
eval "$(recipe iwslt14 --shell)"
MODEL=fourier
SEEDS="1"
DATA="data-bin/iwslt14.tokenized.de-en"
RUNS="runs/iwslt14"
NAME=""
MAX_EPOCH=$R_MAX_EPOCH
MAX_UPDATE=0
KEEP_LAST=10
EVAL_BLEU=1
SMALL=0
MAX_TOKENS=$R_MAX_TOKENS
GPUS=1
PRINT=0
CPU=0
LR=$R_LR
WARMUP=""
EXTRA=()

usage() {
    cat <<EOF
Usage: examples/iwslt14/train.sh [options] [-- extra fairseq-train arguments]

Trains on IWSLT'14 De-En (prepared by examples/iwslt14/prepare.sh) with fairseq's IWSLT
recipe: Adam $R_ADAM_BETAS, lr $R_LR, $R_LR_SCHEDULER with $R_WARMUP_UPDATES warm-up updates, dropout $R_DROPOUT,
weight decay $R_WEIGHT_DECAY, label smoothing $R_LABEL_SMOOTHING, $R_MAX_TOKENS tokens a batch, shared decoder in/out
embeddings, BLEU (beam 5) on valid for the best checkpoint. One run per seed:
RUNS/NAME_seedS/ holds train.log, meta.json and checkpoints/. A run is resumed from its
checkpoint_last.pt, its log appended to (each run's start marked); a run that already holds the
training asked for (--max-epoch / --max-update) is skipped, with a word: raise the limit to train
it further, or remove its checkpoints/ to train it anew. The console shows fairseq's progress lines
(every --log-interval updates), each epoch's summary and validation; train.log has everything.

On N GPUs (--gpus N, all machines together) the update keeps its $R_MAX_TOKENS tokens: each GPU's batch
is --max-tokens $R_MAX_TOKENS/N (N must divide $R_MAX_TOKENS; a smaller cap packs its sentences less tightly,
docs/distributed.md). One machine: fairseq starts one process per GPU. Several: run this script in
each srun task with -- --distributed-port PORT, or by torchrun ... --no-python examples/iwslt14/train.sh,
or on each machine with -- --distributed-init-method tcp://HOST:PORT --distributed-rank R (R: the
machine's first rank); the first copy writes train.log and meta.json, copy C train.copyC.log.

Options:
  --model fourier|softmax|ARCH  fourier = $R_ARCH (p=2; --fourier-paper-exact after -- for the paper's formulation),
                           softmax = its softmax twin; or any registered arch (default: $MODEL)
  --seeds "1 2 3"          seeds, one run each, in turn (default: $SEEDS)
  --data DIR               binarised data (default: $DATA)
  --runs DIR               runs folder (default: $RUNS)
  --name NAME              run name (default: the model, plus the Fourier options given)
  --max-epoch N            (default: $MAX_EPOCH; checkpoints of the last $KEEP_LAST epochs are kept for averaging)
  --max-update N           stop after N updates instead (0: no limit; default: $MAX_UPDATE)
  --keep-last N            epoch checkpoints kept (default: $KEEP_LAST)
  --max-tokens N           tokens an update (default: $MAX_TOKENS; with --gpus, shared by the GPUs)
  --gpus N                 GPUs in all, one process each (default: $GPUS); fairseq's distributed
                           options (--distributed-port, ...) go after --
  --lr X                   peak learning rate (default: $LR)
  --warmup N               warm-up updates (default: $R_WARMUP_UPDATES)
  --no-eval-bleu           pick the best checkpoint by valid loss (no beam search each epoch)
  --small                  small mode: a 1-layer, 32-dim model, 3 epochs (minutes on a CPU)
  --cpu                    train on the CPU (default: the GPU where torch sees one, else the CPU)
  --print-command          print each seed's fairseq-train command and stop (nothing is checked or run):
                           the command for a GPU machine, or with --cpu for a CPU
  -h, --help               this help
Anything after -- goes to fairseq-train, e.g. -- --fourier-phi abs --fourier-radius-init 2.0

Examples:
  examples/iwslt14/train.sh --model fourier --seeds "1 2 3"
  examples/iwslt14/train.sh --model softmax --seeds "1 2 3"
  examples/iwslt14/train.sh --model fourier --name phi_abs -- --fourier-phi abs
  examples/iwslt14/train.sh --model fourier --gpus 4
EOF
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) MODEL="${2:?}"; shift 2 ;;
        --seeds) SEEDS="${2:?}"; shift 2 ;;
        --data) DATA="${2:?}"; shift 2 ;;
        --runs) RUNS="${2:?}"; shift 2 ;;
        --name) NAME="${2:?}"; shift 2 ;;
        --max-epoch) MAX_EPOCH="${2:?}"; shift 2 ;;
        --max-update) MAX_UPDATE="${2:?}"; shift 2 ;;
        --keep-last) KEEP_LAST="${2:?}"; shift 2 ;;
        --max-tokens) MAX_TOKENS="${2:?}"; shift 2 ;;
        --lr) LR="${2:?}"; shift 2 ;;
        --warmup) WARMUP="${2:?}"; shift 2 ;;
        --gpus) GPUS="${2:?}"; shift 2 ;;
        --print-command) PRINT=1; shift ;;
        --cpu) CPU=1; shift ;;
        --no-eval-bleu) EVAL_BLEU=0; shift ;;
        --small) SMALL=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) usage >&2; die "unknown option '$1' (fairseq-train arguments go after --)" ;;
    esac
done

case "$MODEL" in
    fourier) ARCH="$R_ARCH" ;;
    softmax) ARCH=$(softmax_twin "$R_ARCH") ;;
    *) ARCH="$MODEL" ;;
esac
if [[ -z "$NAME" ]]; then
    NAME="$MODEL"
    NAME="${NAME}$(fourier_suffix "${EXTRA[@]}")"
    NAME="${NAME//-/_}"
fi

SIZE=()
if [[ $SMALL == 1 ]]; then
    SIZE=(--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32
          --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 --decoder-attention-heads 2)
    MAX_EPOCH=3 KEEP_LAST=3 EVAL_BLEU=0 MAX_TOKENS=2048
    WARMUP="${WARMUP:-10}"
fi
WARMUP="${WARMUP:-$R_WARMUP_UPDATES}"
STOP=()
[[ $MAX_UPDATE != 0 ]] && STOP+=(--max-update "$MAX_UPDATE")
# the update's tokens shared by the GPUs (examples/lib.sh: gpu_split), fairseq's options for them
gpu_split "$MAX_TOKENS" "$GPUS" "$MAX_TOKENS" tokens
distributed_options "$GPUS" "${EXTRA[@]}"
SETS=(--set lr "$LR" --set warmup-updates "$WARMUP" --set max-tokens "$SPLIT_PER_PASS" --set max-epoch "$MAX_EPOCH")
(( SPLIT_UPDATE_FREQ > 1 )) && SETS+=(--set update-freq "$SPLIT_UPDATE_FREQ")
mapfile -t RECIPE < <(recipe iwslt14 "${SETS[@]}")

BLEU=()
if [[ $EVAL_BLEU == 1 ]]; then
    # validation BLEU with the generation protocol's beam and lengths (training_recipes.py: GENERATION)
    BLEU=(--eval-bleu --eval-bleu-args "$(recipe iwslt14 --eval-bleu-args)"
          --eval-bleu-detok moses --eval-bleu-remove-bpe
          --best-checkpoint-metric bleu --maximize-best-checkpoint-metric)
fi

command_of() {  # command_of SEED RUN: the fairseq-train command of a seed, one argument an element of CMD
    CMD=(fairseq-train "$DATA" --user-dir "$USER_DIR" \
        --arch "$ARCH" "${SIZE[@]}" "${RECIPE[@]}" "${STOP[@]}" "${BLEU[@]}" "${DEVICE[@]}" "${DIST_OPTIONS[@]}" \
        --seed "$1" --save-dir "$2/checkpoints" --keep-last-epochs "$KEEP_LAST" \
        --log-format simple --log-interval 50 "${EXTRA[@]}")
}
device_for "$PRINT" "$CPU"
if [[ $PRINT == 1 ]]; then
    print_commands
    exit 0
fi

need fairseq-train "bash scripts/tools/install.sh installs fairseq"
[[ -f "$DATA/dict.de.txt" && -f "$DATA/dict.en.txt" ]] || die "no binarised data in $DATA: run examples/iwslt14/prepare.sh first"
[[ -d "$USER_DIR" ]] || die "plugin folder $USER_DIR not found (set FOURIERFORMER_USER_DIR)"
check_distributed "$GPUS"
(( GPUS > 1 )) && say "$GPUS GPUs ($DIST_LAUNCH): $SPLIT_PER_PASS tokens a GPU, $MAX_TOKENS an update"

for SEED in $SEEDS; do
    RUN="$RUNS/${NAME}_seed${SEED}"
    LOG=$(run_log "$RUN")
    command_of "$SEED" "$RUN"
    if why=$(trained "$RUN"); then
        say "seed $SEED: $RUN is trained ($why): skipped (raise --max-epoch or --max-update to train it further)"
        continue
    fi
    mkdir -p "$RUN/checkpoints"
    if [[ $DIST_COPY == 0 ]]; then
        write_meta "$RUN/meta.json" task=iwslt14 model="$MODEL" arch="$ARCH" seed="$SEED" name="$NAME" \
            data="$DATA" small="$SMALL" gpus="$GPUS" -- "${EXTRA[@]}"
    fi
    say "training $ARCH seed $SEED -> $RUN (log: $LOG)"
    start=$(date +%s)
    train_logged "$LOG" || die "fairseq-train failed for seed $SEED (exit $?); see $LOG"
    say "seed $SEED done in $(( $(date +%s) - start ))s: $RUN"
done
