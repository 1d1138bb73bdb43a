#!/usr/bin/env bash
# One command per table of the FourierFormer paper: prepare -> train (all seeds) -> evaluate
# -> analysis -> markdown table. Runs already evaluated are reused (table 6 reuses table 1's).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SEEDS="1 2 3"
SMALL=0
IWSLT_RAW=""
WIKI_RAW=""
DATA_ROOT="data-bin"
RUNS="runs"
TABLES=()

usage() {
    cat <<EOF
Usage: examples/reproduce.sh [options] TABLE [TABLE ...]

TABLE is one of
  table1   WikiText-103 valid/test perplexity: softmax and FourierFormer, small and medium
  table5   IWSLT'14 De-En BLEU: softmax (transformer_iwslt_de_en) and FourierFormer
  table6   head redundancy of the small LMs (trains them if table1 has not)
  table7   ablation over phi (power, abs, relu, sigmoid), FourierFormer small LM
  table8   ablation over the radius: init automatic (the default) / 0.5 / 1 / 2 (the paper's) / 4 (scalar), shape scalar / head / feature (automatic init)
  table9   training / inference ms per sample and peak memory, small LMs, same batch
  e4       Appendix E.4: Fourier density estimators and Nadaraya-Watson regression
  all      all of the above
Each writes RUNS/tableN.md (mean ± std over the seeds, the paper's numbers beside ours).

Options:
  --seeds "1 2 3"      seeds of every trained model (default: "$SEEDS")
  --iwslt-raw PATH     offline IWSLT'14 archive or folder (default: download)
  --wikitext-raw PATH  offline wikitext-103-v1.zip or folder (default: download)
  --data-root DIR      (default: $DATA_ROOT)      --runs DIR (default: $RUNS)
  --small              every step in its small mode (the whole path in minutes on a CPU)
  -h, --help
EOF
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --seeds) SEEDS="${2:?}"; shift 2 ;;
        --iwslt-raw) IWSLT_RAW="${2:?}"; shift 2 ;;
        --wikitext-raw) WIKI_RAW="${2:?}"; shift 2 ;;
        --data-root) DATA_ROOT="${2:?}"; shift 2 ;;
        --runs) RUNS="${2:?}"; shift 2 ;;
        --small) SMALL=1; shift ;;
        -h|--help) usage; exit 0 ;;
        table1|table5|table6|table7|table8|table9|e4) TABLES+=("$1"); shift ;;
        all) TABLES+=(table1 table5 table6 table7 table8 table9 e4); shift ;;
        *) usage >&2; die "unknown argument '$1'" ;;
    esac
done
[[ ${#TABLES[@]} -gt 0 ]] || { usage >&2; die "name at least one TABLE"; }

EX="$REPO_ROOT/examples"
SM=()
[[ $SMALL == 1 ]] && SM=(--small)
IWSLT_DATA="$DATA_ROOT/iwslt14.tokenized.de-en"
WIKI_DATA="$DATA_ROOT/wikitext-103"
mkdir -p "$RUNS"

prep_iwslt() {
    [[ -f "$IWSLT_DATA/dict.en.txt" ]] && return 0
    "$EX/iwslt14/prepare.sh" --out "$IWSLT_DATA" ${IWSLT_RAW:+--raw "$IWSLT_RAW"} "${SM[@]}"
}
prep_wiki() {
    [[ -f "$WIKI_DATA/dict.txt" ]] && return 0
    "$EX/wikitext103/prepare.sh" --out "$WIKI_DATA" ${WIKI_RAW:+--raw "$WIKI_RAW"} "${SM[@]}"
}

# lm MODEL SIZE NAME [fairseq args...]: train + evaluate every seed not evaluated yet
lm() {
    local model="$1" size="$2" name="$3"; shift 3
    local seed
    for seed in $SEEDS; do
        local run="$RUNS/wikitext103/${name}_seed$seed"
        [[ -f "$run/results-lm.json" ]] && { say "$run already evaluated"; continue; }
        "$EX/wikitext103/train.sh" --model "$model" --size "$size" --seeds "$seed" --data "$WIKI_DATA" \
            --runs "$RUNS/wikitext103" --name "$name" "${SM[@]}" -- "$@"
        "$EX/wikitext103/evaluate.sh" --data "$WIKI_DATA" "${SM[@]}" "$run"
    done
}
mt() {
    local model="$1" name="$2"; shift 2
    local seed
    for seed in $SEEDS; do
        local run="$RUNS/iwslt14/${name}_seed$seed"
        [[ -f "$run/results-test.json" ]] && { say "$run already evaluated"; continue; }
        "$EX/iwslt14/train.sh" --model "$model" --seeds "$seed" --data "$IWSLT_DATA" --runs "$RUNS/iwslt14" \
            --name "$name" "${SM[@]}" -- "$@"
        "$EX/iwslt14/evaluate.sh" --data "$IWSLT_DATA" "${SM[@]}" "$run"
    done
}
tables() {  # tables OUT [make_tables args]
    local out="$1"; shift
    "$PYTHON" "$REPO_ROOT/scripts/make_tables.py" --out "$out" "$@"
    cat "$out"
}

for T in "${TABLES[@]}"; do
    say "=== $T ==="
    case "$T" in
        table1)
            prep_wiki
            for size in small medium; do
                lm softmax "$size" "softmax_$size"
                lm fourier "$size" "fourier_$size"
            done
            tables "$RUNS/table1.md" --runs "$RUNS/wikitext103" ;;
        table5)
            prep_iwslt
            mt softmax softmax
            mt fourier fourier
            tables "$RUNS/table5.md" --runs "$RUNS/iwslt14" ;;
        table6)
            prep_wiki
            lm softmax small softmax_small
            lm fourier small fourier_small
            HR=()
            for name in softmax_small fourier_small; do
                seed="${SEEDS%% *}"
                ck="$RUNS/wikitext103/${name}_seed$seed/checkpoints/checkpoint_best.pt"
                "$PYTHON" "$REPO_ROOT/scripts/head_redundancy.py" --checkpoint "$ck" --data "$WIKI_DATA" \
                    --out "$RUNS/head_redundancy_$name.json" --png "$RUNS/attention_maps_$name.png" "${SM[@]}"
                HR+=("$RUNS/head_redundancy_$name.json")
            done
            tables "$RUNS/table6.md" --runs "$RUNS/none" --head-redundancy "${HR[@]}" ;;
        table7)
            prep_wiki
            lm fourier small fourier_small
            for phi in abs relu sigmoid; do
                lm fourier small "fourier_small_phi$phi" --fourier-phi "$phi"
            done
            tables "$RUNS/table7.md" --runs "$RUNS/wikitext103" ;;
        table8)
            prep_wiki
            lm fourier small fourier_small
            for r in 0.5 1.0 2.0 4.0; do lm fourier small "fourier_small_radius$r" --fourier-radius-init "$r"; done
            for s in head feature; do lm fourier small "fourier_small_radius_$s" --fourier-radius-shape "$s"; done
            tables "$RUNS/table8.md" --runs "$RUNS/wikitext103" ;;
        table9)
            "$PYTHON" "$REPO_ROOT/scripts/benchmark_model.py" --out "$RUNS/benchmark.json" "${SM[@]}"
            tables "$RUNS/table9.md" --runs "$RUNS/none" --benchmark "$RUNS/benchmark.json" ;;
        e4)
            "$PYTHON" "$REPO_ROOT/scripts/fourier_estimators.py" --out "$RUNS/estimators" "${SM[@]}" ;;
    esac
done
