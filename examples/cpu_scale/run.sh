#!/usr/bin/env bash
# The CPU-scale real-data runs of docs/records/training/first-cpu-runs.md: the same recipes as the full-scale ones,
# with reduced models and budgets. Multi30k De-En (translation) and WikiText-2 (LM),
# FourierFormer and softmax twins, one seed each, equal update budgets, run one after another.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/lib.sh"

SHARED="${SHARED:-$REPO_ROOT/../shared/data}"
WORK="${WORK:-/tmp/fourierformer-cpu-scale}"
NICE="${NICE:-0}"
SEED="${SEED:-1}"
STEPS="${STEPS:-prepare mt lm tables}"
MT_UPDATES="${MT_UPDATES:-5000}"
LM_UPDATES="${LM_UPDATES:-1500}"
STOP_HOURS="${STOP_HOURS:-1.0}"      # wall-clock safety cap per run (fairseq --stop-time-hours); the budgets are the update counts
# Fourier-only options of the translation runs (none: the arch's defaults; e.g. --fourier-paper-exact)
MT_FOURIER_ARGS="${MT_FOURIER_ARGS:-}"

usage() {
    cat <<EOF
Usage: examples/cpu_scale/run.sh [-h]

Environment (defaults):
  SHARED=$SHARED   folder with multi30k/*.xz and wikitext-2/*.xz
  WORK=$WORK       scratch folder (decompressed data, data-bin, runs)
  NICE=$NICE  SEED=$SEED  MT_UPDATES=$MT_UPDATES  LM_UPDATES=$LM_UPDATES  STOP_HOURS=$STOP_HOURS
  MT_FOURIER_ARGS="$MT_FOURIER_ARGS"   extra fairseq-train options of the Fourier translation run
  STEPS="$STEPS"   any of: prepare mt lm tables
EOF
}
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { usage; exit 0; }

MT_DIMS=(--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 --decoder-embed-dim 128
         --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 --encoder-attention-heads 4 --decoder-attention-heads 4)
LM_DIMS=(--decoder-layers 2 --decoder-embed-dim 64 --decoder-ffn-embed-dim 256 --decoder-attention-heads 4)
N=(nice -n "$NICE")
mkdir -p "$WORK/raw"

if [[ " $STEPS " == *" prepare "* ]]; then
    say "decompressing $SHARED -> $WORK/raw"
    for f in multi30k/train.de multi30k/train.en multi30k/val.de multi30k/val.en \
             multi30k/test_2016_flickr.de multi30k/test_2016_flickr.en \
             wikitext-2/wiki.train.tokens wikitext-2/wiki.valid.tokens; do
        mkdir -p "$WORK/raw/$(dirname "$f")"
        [[ -s "$WORK/raw/$f" ]] || xz -dc "$SHARED/$f.xz" > "$WORK/raw/$f"
    done
    "${N[@]}" "$REPO_ROOT/examples/iwslt14/prepare.sh" --text-train "$WORK/raw/multi30k/train" \
        --text-valid "$WORK/raw/multi30k/val" --text-test "$WORK/raw/multi30k/test_2016_flickr" \
        --bpe-merges 8000 --out "$WORK/data-bin/multi30k.de-en"
    "${N[@]}" "$REPO_ROOT/examples/wikitext103/prepare.sh" --raw "$WORK/raw/wikitext-2" --out "$WORK/data-bin/wikitext-2"
fi

if [[ " $STEPS " == *" mt "* ]]; then
    for model in softmax fourier; do
        EXTRA_MT=()
        # shellcheck disable=SC2206
        [[ $model == fourier ]] && EXTRA_MT=($MT_FOURIER_ARGS)
        "${N[@]}" "$REPO_ROOT/examples/iwslt14/train.sh" --model "$model" --name "$model" --seeds "$SEED" \
            --data "$WORK/data-bin/multi30k.de-en" --runs "$WORK/runs/multi30k" \
            --max-update "$MT_UPDATES" --max-tokens 1024 --lr 1e-3 --warmup 100 --no-eval-bleu \
            -- "${MT_DIMS[@]}" --save-interval-updates 100 --keep-interval-updates 3 --stop-time-hours "$STOP_HOURS" \
            "${EXTRA_MT[@]}"
        "${N[@]}" "$REPO_ROOT/examples/iwslt14/evaluate.sh" --data "$WORK/data-bin/multi30k.de-en" --avg 3 --avg-by updates \
            "$WORK/runs/multi30k/${model}_seed$SEED"
    done
fi

if [[ " $STEPS " == *" lm "* ]]; then
    for model in softmax fourier; do
        "${N[@]}" "$REPO_ROOT/examples/wikitext103/train.sh" --protocol fairseq --model "$model" --size small --seeds "$SEED" \
            --data "$WORK/data-bin/wikitext-2" --runs "$WORK/runs/wikitext2" --context 128 \
            --batch 8 --max-seqs 8 --max-update "$LM_UPDATES" --lr 1e-3 --warmup 50 --save-every 500 \
            -- "${LM_DIMS[@]}" --stop-time-hours "$STOP_HOURS"
        "${N[@]}" "$REPO_ROOT/examples/wikitext103/evaluate.sh" --data "$WORK/data-bin/wikitext-2" \
            --subsets valid --stride 64 --batch-size 16 "$WORK/runs/wikitext2/${model}_small_seed$SEED"
    done
fi

if [[ " $STEPS " == *" tables "* ]]; then
    "$PYTHON" "$REPO_ROOT/scripts/analysis/tables/make_tables.py" --runs "$WORK/runs" --out "$WORK/tables.md"
    cat "$WORK/tables.md"
fi
