#!/usr/bin/env bash
# One command per table of the FourierFormer paper: prepare -> train (all seeds) -> evaluate
# -> analysis -> markdown table. Runs already evaluated are reused (table 6 reuses table 1's).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SEEDS="1 2 3"
SMALL=0
PROTOCOL=""   # the WikiText-103 recipe's default (training_recipes.py: DEFAULT_LM_PROTOCOL)
DRY=0
TIMINGS=""
IWSLT_RAW=""
WIKI_RAW=""
DATA_ROOT="data-bin"
RUNS="runs"
TABLES=()

usage() {
    cat <<EOF
Usage: examples/reproduce.sh [options] TABLE [TABLE ...]

TABLE is one of
  table1   WikiText-103 valid/test perplexity, small and medium: softmax, the published FourierFormer
           (--fourier-published: the paper's column) and our defaults
  table5   IWSLT'14 De-En BLEU: softmax (transformer_iwslt_de_en) and FourierFormer
  table6   head redundancy of table 1's small LMs (trains them if table1 has not)
  table7   the paper's ablation over phi (x^2, x^4, x^6, x, x^3, |x|, ReLU, sigmoid; the published
           attention), and our defaults and Gaussian kernel beside them; small LM
  table8   the paper's ablation over the radius (R_init 0.1, 1, 2, 3, 4 a scalar per layer; a learnable
           vector at 2; the published attention), and our defaults (automatic radius: a scalar, per head,
           per head and feature) beside them; small LM
  table9   training / inference ms per sample and peak memory, small LMs, same batch
The runs of each table: python examples/paper_runs.py plan TABLE. A run that
diverges (fairseq-train stops on a NaN or an overflow) is recorded as not converged (RUN/not_converged.json,
with the update it stopped at) and the table goes on: make_tables.py prints "not converge" for it.
Tables 1, 6, 7 and 8 train under the WikiText-103 recipe's --protocol: published (the default, the
published code's training: comparable with the paper's numbers) or fairseq.
  e4       Appendix E.4: Fourier density estimators and Nadaraya-Watson regression
  all      all of the above
Each writes RUNS/tableN.md (mean ± std over the seeds, the paper's numbers beside ours).

Options:
  --seeds "1 2 3"      seeds of every trained model (default: "$SEEDS")
  --iwslt-raw PATH     offline IWSLT'14 archive or folder (default: download)
  --wikitext-raw PATH  offline wikitext-103-v1.zip or folder (default: download)
  --data-root DIR      (default: $DATA_ROOT)      --runs DIR (default: $RUNS)
  --protocol P         published (default) or fairseq: the WikiText-103 training of tables 1, 6, 7, 8
  --dry-run            train nothing: print each distinct run of the tables once (the tables that share
                       it), its seeds' fairseq-train commands, its attention backend, updates, tokens
                       and GPU-hours on 1, 2 and 8 GPUs (or why unknown), and the totals
                       (examples/paper_runs.py)
  --timings FILE       the step times the GPU-hours come from (default: the dated record,
                       docs/records/step_times.json of this checkout)
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
        --protocol) PROTOCOL="${2:?}"; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        --timings) TIMINGS="${2:?}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        table1|table5|table6|table7|table8|table9|e4) TABLES+=("$1"); shift ;;
        all) TABLES+=(table1 table5 table6 table7 table8 table9 e4); shift ;;
        *) usage >&2; die "unknown argument '$1'" ;;
    esac
done
[[ ${#TABLES[@]} -gt 0 ]] || { usage >&2; die "name at least one TABLE"; }

EX="$REPO_ROOT/examples"
IWSLT_DATA="$DATA_ROOT/iwslt14.tokenized.de-en"
WIKI_DATA="$DATA_ROOT/wikitext-103"
if [[ $DRY == 1 ]]; then
    # each distinct run once (examples/paper_runs.py), its seeds' fairseq-train commands as its recipe
    # prints them (--print-command), its backend and cost
    TRAINED=() COMMANDS=$(mktemp)
    trap 'rm -f "$COMMANDS"' EXIT
    for T in "${TABLES[@]}"; do
        case "$T" in table9|e4) echo "$T: trains nothing" ;; *) TRAINED+=("$T") ;; esac
    done
    [[ ${#TRAINED[@]} -gt 0 ]] || exit 0
    while IFS=$'\t' read -r -a fields; do
        task="${fields[0]}" name="${fields[1]}" model="${fields[2]}" size="${fields[3]}" extra=("${fields[@]:4}")
        if [[ $task == wikitext103 ]]; then
            "$EX/wikitext103/train.sh" --print-command ${PROTOCOL:+--protocol "$PROTOCOL"} --model "$model" --size "$size" \
                --seeds "$SEEDS" --data "$WIKI_DATA" --runs "$RUNS/wikitext103" --name "$name" -- "${extra[@]}"
        else
            "$EX/iwslt14/train.sh" --print-command --model "$model" --seeds "$SEEDS" --data "$IWSLT_DATA" \
                --runs "$RUNS/iwslt14" --name "$name" -- "${extra[@]}"
        fi | sed "s/^/$name\t/" >> "$COMMANDS"
    done < <("$PYTHON" "$EX/paper_runs.py" plan "${TRAINED[@]}")
    "$PYTHON" "$EX/paper_runs.py" dry-run "${TRAINED[@]}" --seeds "$(wc -w <<< "$SEEDS")" \
        ${PROTOCOL:+--protocol "$PROTOCOL"} --timings "${TIMINGS:-$REPO_ROOT/docs/records/step_times.json}" \
        --commands "$COMMANDS"
    exit 0
fi
PROTO=()
[[ -n "$PROTOCOL" ]] && PROTO=(--protocol "$PROTOCOL")
SM=()
[[ $SMALL == 1 ]] && SM=(--small)
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
        [[ -f "$run/not_converged.json" ]] && { say "$run did not converge (recorded in $run/not_converged.json)"; continue; }
        if ! "$EX/wikitext103/train.sh" "${PROTO[@]}" --model "$model" --size "$size" --seeds "$seed" --data "$WIKI_DATA" \
            --runs "$RUNS/wikitext103" --name "$name" "${SM[@]}" -- "$@"; then
            # a divergence (NaN or overflow) is the row's result: recorded, and the table goes on
            "$PYTHON" "$EX/paper_runs.py" diverged "$run" || die "training $run failed (not a divergence): see $run/train.log"
            continue
        fi
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
# lm_table TABLE: train + evaluate every run of a paper table (paper_runs.py plan: task, name, model, size, extra)
lm_table() {
    local name model size extra
    while IFS=$'\t' read -r -a fields; do
        name="${fields[1]}" model="${fields[2]}" size="${fields[3]}" extra=("${fields[@]:4}")
        lm "$model" "$size" "$name" "${extra[@]}"
    done < <("$PYTHON" "$EX/paper_runs.py" plan "$1")
}
tables() {  # tables OUT [make_tables args]
    local out="$1"; shift
    "$PYTHON" "$REPO_ROOT/scripts/analysis/tables/make_tables.py" --out "$out" "$@"
    cat "$out"
}

for T in "${TABLES[@]}"; do
    say "=== $T ==="
    case "$T" in
        table1)
            prep_wiki
            lm_table table1
            tables "$RUNS/table1.md" --runs "$RUNS/wikitext103" ;;
        table5)
            prep_iwslt
            mt softmax softmax
            mt fourier fourier
            tables "$RUNS/table5.md" --runs "$RUNS/iwslt14" ;;
        table6)
            prep_wiki
            lm_table table6
            HR=()
            while IFS=$'\t' read -r -a fields; do
                name="${fields[1]}"
                seed="${SEEDS%% *}"
                ck="$RUNS/wikitext103/${name}_seed$seed/checkpoints/checkpoint_best.pt"
                "$PYTHON" "$REPO_ROOT/scripts/analysis/tables/head_redundancy.py" --checkpoint "$ck" --data "$WIKI_DATA" --label "$name" \
                    --out "$RUNS/head_redundancy_$name.json" --png "$RUNS/attention_maps_$name.png" "${SM[@]}"
                HR+=("$RUNS/head_redundancy_$name.json")
            done < <("$PYTHON" "$EX/paper_runs.py" plan table6)
            tables "$RUNS/table6.md" --runs "$RUNS/none" --head-redundancy "${HR[@]}" ;;
        table7)
            prep_wiki
            lm_table table7
            tables "$RUNS/table7.md" --runs "$RUNS/wikitext103" ;;
        table8)
            prep_wiki
            lm_table table8
            tables "$RUNS/table8.md" --runs "$RUNS/wikitext103" ;;
        table9)
            "$PYTHON" "$REPO_ROOT/scripts/benchmarks/benchmark_model.py" --out "$RUNS/benchmark.json" "${SM[@]}"
            tables "$RUNS/table9.md" --runs "$RUNS/none" --benchmark "$RUNS/benchmark.json" ;;
        e4)
            "$PYTHON" "$REPO_ROOT/scripts/analysis/tables/fourier_estimators.py" --out "$RUNS/estimators" "${SM[@]}" ;;
    esac
done
