#!/usr/bin/env bash
# The equal-update comparison of docs/records/training/published-normaliser-init-radius.md at full size, on one GPU:
# softmax, the defaults, the Gaussian ablation, paper-exact and the published preset, for the
# IWSLT'14 architecture (6 + 6 layers, d 512, head dim 128) on Multi30k and the 16-layer
# WikiText-103 small LM on WikiText-2, all ten trainings side by side for one wall-clock budget.
# Then, at the largest update count every run of a task reached: test-set hypotheses (beam 5)
# of the translation models, and attention entropy / pairs past a sinc zero of every model.
# examples/full_size/summarize.py RUNS prints the tables (BLEU with --refs).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/lib.sh"

DATA_MT="${DATA_MT:-data-bin/m30k}"            # Multi30k De-En, joined dictionary (section 6 of the doc)
DATA_LM="${DATA_LM:-data-bin/wikitext-2}"
RUNS="${RUNS:-runs/full_size}"
MINUTES="${MINUTES:-5}"                         # training wall-clock budget of every run (fairseq --stop-time-hours)
TASKS="${TASKS:-mt lm}"
CONFIGS="${CONFIGS:-softmax defaults gaussian paper_exact published}"
SEED="${SEED:-1}"
MAX_UPDATE="${MAX_UPDATE:-100000}"              # the budget is the wall clock; this only caps it
EVERY_MT="${EVERY_MT:-100}"                     # validation every this many updates (checkpoints every 2x)
EVERY_LM="${EVERY_LM:-200}"                     # validation and checkpoints
EVAL_SECONDS="${EVAL_SECONDS:-120}"             # limit of each evaluation command
SENTENCES="${SENTENCES:-20}"                    # sentences of scripts/analysis/dynamics/attention_entropy.py
DEVICE_ARGS="${DEVICE_ARGS:-}"                  # e.g. --cpu, for a dry run with SIZE_MT / SIZE_LM
SIZE_MT="${SIZE_MT:-}"                          # extra fairseq-train options, given last (empty: full size)
SIZE_LM="${SIZE_LM:-}"

usage() {
    echo "Usage: [VAR=value ...] examples/full_size/compare.sh [-h]"
    echo
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    cat <<EOF

Environment (defaults): DATA_MT=$DATA_MT DATA_LM=$DATA_LM RUNS=$RUNS MINUTES=$MINUTES
  TASKS="$TASKS" CONFIGS="$CONFIGS" SEED=$SEED EVERY_MT=$EVERY_MT EVERY_LM=$EVERY_LM
  EVAL_SECONDS=$EVAL_SECONDS SENTENCES=$SENTENCES DEVICE_ARGS="$DEVICE_ARGS" SIZE_MT="$SIZE_MT" SIZE_LM="$SIZE_LM"
Each run: RUNS/<task>_<config>/train.log and ckpt/; evaluations: gen_<update>.txt, entropy_<update>.json.
EOF
}
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { usage; exit 0; }

fourier_flags() {  # fourier_flags CONFIG: the options that make a configuration
    case "$1" in
        softmax|defaults) echo "" ;;
        gaussian) echo "--fourier-kernel gaussian" ;;
        paper_exact) echo "--fourier-paper-exact" ;;
        published) echo "--fourier-published" ;;
        *) die "unknown configuration '$1' (softmax defaults gaussian paper_exact published)" ;;
    esac
}
# each task's recipe (fourierformer_fairseq/training_recipes.py), its Fourier architecture and its softmax twin
recipe_of() {  # recipe_of TASK
    case "$1" in mt) echo iwslt14 ;; lm) echo wikitext103 ;; *) die "unknown task '$1' (mt lm)" ;; esac
}
declare -A ARCH_OF
for task in $TASKS; do
    recipe_of "$task" >/dev/null  # (an unknown task stops here)
    eval "$(recipe "$(recipe_of "$task")" --shell | grep '^R_ARCH=')"
    ARCH_OF[$task:fourier]=$R_ARCH
    ARCH_OF[$task:softmax]=$(softmax_twin "$R_ARCH")
done
arch_of() {  # arch_of TASK CONFIG
    if [[ $2 == softmax ]]; then echo "${ARCH_OF[$1:softmax]}"; else echo "${ARCH_OF[$1:fourier]}"; fi
}
for task in $TASKS; do
    data=$DATA_MT; [[ $task == lm ]] && data=$DATA_LM
    [[ -d "$data" ]] || die "$data not found (DATA_MT / DATA_LM: binarised data, see docs/training-dynamics.md section 6)"
    for c in $CONFIGS; do fourier_flags "$c" >/dev/null; arch_of "$task" "$c" >/dev/null; done
done
[[ "$MINUTES" =~ ^[0-9]*\.?[0-9]+$ ]] && [[ ! "$MINUTES" =~ ^0*\.?0*$ ]] || die "MINUTES must be a positive number, got '$MINUTES'"
STOP_HOURS=$("$PYTHON" -c "print($MINUTES / 60)")
mkdir -p "$RUNS"

# The recipes with this comparison's budget: the translation models share all embeddings (a joined
# dictionary) and warm up over 400 updates; the language models take 16 sequences an update at
# lr 1e-3 with 200 warm-up updates under the WikiText-103 recipe's fairseq protocol (the one these
# comparisons were measured with: a full softmax, which WikiText-2's vocabulary allows as it is);
# both stop at MAX_UPDATE or the wall-clock budget.
mapfile -t RECIPE_MT < <(recipe iwslt14 --drop share-decoder-input-output-embed --drop max-epoch --drop clip-norm \
    --set warmup-updates 400 --flag share-all-embeddings --set required-batch-size-multiple 1)
mapfile -t GENERATE < <(recipe iwslt14 --generate --validation-lengths)  # the generation protocol, the short runs' length limit
mapfile -t RECIPE_LM < <(recipe wikitext103 --protocol fairseq --set lr 1e-3 --set warmup-updates 200 \
    --drop update-freq --drop max-update)

train() {  # train TASK CONFIG
    local task=$1 config=$2 dir="$RUNS/$1_$2" arch flags log_flag=""
    arch=$(arch_of "$task" "$config"); flags=$(fourier_flags "$config")
    [[ $config != softmax ]] && log_flag="--fourier-log-interval 50"
    mkdir -p "$dir"
    # shellcheck disable=SC2086
    if [[ $task == mt ]]; then
        "$PYTHON" -m fairseq_cli.train "$DATA_MT" --user-dir "$USER_DIR" $DEVICE_ARGS --arch "$arch" $flags "${RECIPE_MT[@]}" \
            --validate-interval-updates "$EVERY_MT" --save-interval-updates $((2 * EVERY_MT)) --no-epoch-checkpoints \
            --no-save-optimizer-state --max-update "$MAX_UPDATE" --stop-time-hours "$STOP_HOURS" --seed "$SEED" \
            --log-format json --log-interval 10 --num-workers 0 $log_flag --save-dir "$dir/ckpt" $SIZE_MT > "$dir/train.log" 2>&1
    else
        "$PYTHON" -m fairseq_cli.train "$DATA_LM" --user-dir "$USER_DIR" $DEVICE_ARGS --arch "$arch" $flags "${RECIPE_LM[@]}" \
            --validate-interval-updates "$EVERY_LM" --save-interval-updates "$EVERY_LM" --no-epoch-checkpoints \
            --no-save-optimizer-state --max-update "$MAX_UPDATE" --stop-time-hours "$STOP_HOURS" --seed "$SEED" \
            --log-format json --log-interval 10 --num-workers 0 $log_flag --save-dir "$dir/ckpt" $SIZE_LM > "$dir/train.log" 2>&1
    fi
}

say "training: tasks '$TASKS', configurations '$CONFIGS', side by side, $MINUTES minutes each (logs: $RUNS/*/train.log)"
pids=()
for task in $TASKS; do
    for config in $CONFIGS; do
        OMP_NUM_THREADS=1 train "$task" "$config" & pids+=($!)
    done
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
((failed == 0)) || say "$failed training(s) exited with an error (see their train.log; a run that stopped early is evaluated where it got)"

common_update() {  # common_update TASK: the largest checkpoint update that every run of TASK has
    local task=$1
    for config in $CONFIGS; do
        ls "$RUNS/${task}_$config/ckpt" 2>/dev/null | sed -n 's/^checkpoint_[0-9]*_\([0-9]*\)\.pt$/\1/p' | sort -un
    done | sort -n | uniq -c | awk -v n="$(wc -w <<<"$CONFIGS")" '$1 == n {u = $2} END {print u + 0}'
}
evaluate() {  # evaluate TASK CONFIG UPDATE
    local task=$1 config=$2 update=$3 dir="$RUNS/$1_$2" data=$DATA_MT ckpt
    [[ $task == lm ]] && data=$DATA_LM
    ckpt=$(ls "$dir"/ckpt/checkpoint_*_"$update".pt | head -1)
    if [[ $task == mt ]]; then
        # shellcheck disable=SC2086
        timeout "$EVAL_SECONDS" "$PYTHON" -m fairseq_cli.generate "$data" --user-dir "$USER_DIR" $DEVICE_ARGS \
            --path "$ckpt" --gen-subset test "${GENERATE[@]}" > "$dir/gen_$update.txt" 2> "$dir/gen_$update.err" || true
    fi
    OMP_NUM_THREADS=1 timeout "$EVAL_SECONDS" "$PYTHON" "$REPO_ROOT/scripts/analysis/dynamics/attention_entropy.py" --data "$data" \
        --checkpoints "$ckpt" --out "$dir/entropy_$update.json" --sentences "$SENTENCES" --user-dir "$USER_DIR" \
        > "$dir/entropy_$update.log" 2>&1 || true
}
pids=()
for task in $TASKS; do
    update=$(common_update "$task")
    if ((update == 0)); then
        say "$task: no checkpoint update that every run reached; nothing to evaluate"
        continue
    fi
    say "$task: evaluating every run at update $update (the largest that all reached)"
    echo "$update" > "$RUNS/${task}_common_update"
    for config in $CONFIGS; do evaluate "$task" "$config" "$update" & pids+=($!); done
done
for pid in "${pids[@]}"; do wait "$pid" || true; done
"$PYTHON" "$REPO_ROOT/examples/full_size/summarize.py" "$RUNS" || true
