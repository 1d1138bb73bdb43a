# Helpers shared by the examples/*/ recipes (sourced, not run).
# shellcheck shell=bash

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
USER_DIR="${FOURIERFORMER_USER_DIR:-$REPO_ROOT/fourierformer_fairseq}"
PYTHON="${PYTHON:-python3}"

die() { echo "$(basename "$0"): error: $*" >&2; exit 1; }
say() { echo "[$(basename "$(dirname "$0")")/$(basename "$0")] $*" >&2; }

need() {  # need CMD HINT
    command -v "$1" >/dev/null 2>&1 || die "$1 not found${2:+: $2}"
}

# write_meta FILE key=value ... [-- extra args]: a meta.json describing a run, for make_tables.py
write_meta() {
    local file="$1"; shift
    "$PYTHON" - "$file" "$@" <<'PY'
import json, sys
path, rest = sys.argv[1], sys.argv[2:]
meta, extra = {}, []
if "--" in rest:
    i = rest.index("--")
    rest, extra = rest[:i], rest[i + 1:]
for kv in rest:
    k, _, v = kv.partition("=")
    meta[k] = int(v) if v.lstrip("-").isdigit() else v
meta["extra_args"] = extra
# the --fourier-* options among them, as make_tables.py reads them
from fourierformer_fairseq.fairseq_runs import options_given
meta["fourier"] = options_given(extra)
with open(path, "w") as fh:
    json.dump(meta, fh, indent=1, sort_keys=True)
PY
}

# fourier_suffix ARGS...: a run-name suffix from the --fourier-* options among ARGS, any of them
# (--fourier-phi abs --fourier-paper-exact -> _phiabs_paper_exact), read by the parser that write_meta's
# options_given is (fourierformer_fairseq/fairseq_runs.py, run as a file: run_name_suffix)
fourier_suffix() { "$PYTHON" "$REPO_ROOT/fourierformer_fairseq/fairseq_runs.py" run-suffix "$@"; }

# recipe NAME [--shell | --set OPTION VALUE ... --drop OPTION ...]: a task's fairseq-train
# hyper-parameters from their one table (fourierformer_fairseq/training_recipes.py, run as a file)
recipe() { "$PYTHON" "$REPO_ROOT/fourierformer_fairseq/training_recipes.py" "$@"; }

# softmax_twin ARCH: the softmax twin of a Fourier architecture (fourierformer_fairseq.models.SOFTMAX_TWINS)
softmax_twin() {
    "$PYTHON" -c "import sys; from fourierformer_fairseq.models import SOFTMAX_TWINS; print(SOFTMAX_TWINS[sys.argv[1]])" "$1" \
        2>/dev/null | tail -1 | grep . || die "no softmax twin of $1 (is the package installed? pip install -e .)"
}

# has_cuda: 0 when torch sees a GPU
has_cuda() { "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }

# verify_checksums FILE MD5 SHA256: prints both sums of FILE; fails when a non-empty expected one differs
verify_checksums() {
    local f="$1" md5="$2" sha256="$3" got
    got=$(md5sum "$f" | cut -d' ' -f1)
    say "md5    $got  $f"
    [[ -z "$md5" || "$got" == "$md5" ]] \
        || die "MD5 mismatch for $f: expected $md5, got $got (a changed or broken download; pass --md5 '' to skip if you trust it)"
    got=$(sha256sum "$f" | cut -d' ' -f1)
    say "sha256 $got  $f"
    [[ -z "$sha256" || "$got" == "$sha256" ]] || die "SHA-256 mismatch for $f: expected $sha256, got $got"
    if [[ -z "$md5$sha256" ]]; then say "no checksum set: not verified"; else say "checksum OK"; fi
}

# download URL FILE: fetches URL to FILE with a progress bar (curl or wget), unless FILE is already there
download() {
    local url="$1" dest="$2"
    if [[ -s "$dest" ]]; then
        say "$dest already downloaded"
        return 0
    fi
    say "downloading $url -> $dest"
    if command -v curl >/dev/null; then
        curl -L --fail --progress-bar -o "$dest.part" "$url" || die "download failed: $url (offline? use --raw PATH)"
    elif command -v wget >/dev/null; then
        wget --progress=bar:force -O "$dest.part" "$url" || die "download failed: $url (offline? use --raw PATH)"
    else
        die "needs curl or wget to download (or use --raw PATH)"
    fi
    mv "$dest.part" "$dest"
}

# ----------------------------------------------------------------------------- several GPUs and machines
# A recipe's --gpus N is N GPUs in all (fairseq's --distributed-world-size: one process each), on one
# machine or several; the recipe keeps its protocol's units an update (tokens or sequences) by
# sharing them out with gpu_split, and takes fairseq's options for the way it was started from
# distributed_options. What each launcher needs, and what was measured: docs/distributed.md.
#
# gpu_split TOTAL N MAX_PER_PASS UNIT
#   How the protocol's TOTAL UNITs an update (at one GPU: --max-tokens or --batch-size times
#   --update-freq) are shared by N GPUs: sets SPLIT_PER_PASS (the per-GPU --max-tokens or
#   --batch-size: the largest divisor of TOTAL / N that is at most MAX_PER_PASS, so the fewest passes)
#   and SPLIT_UPDATE_FREQ (--update-freq), with SPLIT_PER_PASS * SPLIT_UPDATE_FREQ * N == TOTAL.
#   Dies with the reason and the N that divide TOTAL when N does not (no split keeps the protocol's
#   TOTAL an update). UNIT ("tokens", "sequences") is for the messages.
gpu_split() {
    local total="$1" n="$2" max="$3" unit="$4" share per
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "--gpus takes a positive number of GPUs, got '$n'"
    if (( total % n )); then
        local d divisors=()
        for (( d = 1; d <= total; d++ )); do (( total % d )) || divisors+=("$d"); done
        die "the protocol's $total $unit an update cannot be shared evenly by $n GPUs (each would take" \
            "$total/$n): use --gpus with one of ${divisors[*]}, or set the batch yourself after --" \
            "(an update then takes the per-GPU batch times --update-freq times $n $unit)"
    fi
    share=$(( total / n ))
    for (( per = max < share ? max : share; per >= 1; per-- )); do
        if (( share % per == 0 )); then
            SPLIT_PER_PASS=$per SPLIT_UPDATE_FREQ=$(( share / per ))
            return 0
        fi
    done
}

# distributed_options N [ARGS...]
#   Sets DIST_OPTIONS (an array: the fairseq-train options for N processes; none for N = 1),
#   DIST_LAUNCH (how this copy of the recipe was started, for the messages) and DIST_COPY (this copy
#   among those a launcher started: copy 0 writes meta.json and train.log, a copy C > 0 its own
#   train.copyC.log only), from the environment and from ARGS (the fairseq-train arguments given
#   after the recipe's --), as fairseq itself tells them apart:
#     torchrun: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (the recipe run by
#       `torchrun ... --no-python RECIPE`); --distributed-world-size N (without it fairseq would
#       train alone where a machine has one GPU: its default is the GPUs it sees); fairseq reads
#       torchrun's variables; WORLD_SIZE must be N; DIST_COPY=RANK.
#     srun: SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) set and --distributed-port P in ARGS;
#       --distributed-world-size N; fairseq reads SLURM's environment: with one task a machine it
#       starts one process per GPU of each and counts the world itself (machines times GPUs, which
#       must be N), with one task a GPU each task is one process; DIST_COPY=SLURM_PROCID.
#     by hand on each machine: --distributed-init-method URL and --distributed-rank R in ARGS (R the
#       first rank of the machine); --distributed-world-size N; fairseq starts one process per GPU;
#       DIST_COPY=R.
#     otherwise one machine: --distributed-world-size N; fairseq starts one process per GPU of the
#       machine on a free port.
#   Dies with the reason where the environment contradicts N (torchrun's WORLD_SIZE, srun's machines
#   without --distributed-port).
distributed_options() {
    local n="$1"; shift
    local args=("$@") port="" init="" rank="" i
    for ((i = 0; i < ${#args[@]}; i++)); do
        case "${args[$i]}" in
            --distributed-port) port="${args[$((i + 1))]:-}" ;;
            --distributed-port=*) port="${args[$i]#*=}" ;;
            --distributed-init-method) init="${args[$((i + 1))]:-}" ;;
            --distributed-init-method=*) init="${args[$i]#*=}" ;;
            --distributed-rank) rank="${args[$((i + 1))]:-}" ;;
            --distributed-rank=*) rank="${args[$i]#*=}" ;;
        esac
    done
    DIST_OPTIONS=() DIST_COPY=0
    if [[ -n "${RANK:-}" && -n "${WORLD_SIZE:-}" && -n "${MASTER_ADDR:-}" && -n "${MASTER_PORT:-}" ]]; then
        DIST_LAUNCH="torchrun (rank $RANK of $WORLD_SIZE)"
        [[ "$WORLD_SIZE" == "$n" ]] || die "torchrun started $WORLD_SIZE processes (WORLD_SIZE) but --gpus is $n:" \
            "the batch is shared by --gpus GPUs, so they must be equal"
        DIST_OPTIONS=(--distributed-world-size "$n")
        DIST_COPY=$RANK
    elif [[ -n "${SLURM_STEP_NODELIST:-${SLURM_JOB_NODELIST:-}}" && -n "$port" && "$port" != -* ]]; then
        DIST_LAUNCH="SLURM (task ${SLURM_PROCID:-0} of ${SLURM_NTASKS:-1}, port $port)"
        DIST_OPTIONS=(--distributed-world-size "$n")
        DIST_COPY=${SLURM_PROCID:-0}
    elif (( ${SLURM_NNODES:-1} > 1 )) && [[ -n "${SLURM_PROCID:-}" ]]; then
        die "under srun on ${SLURM_NNODES} machines fairseq needs a port to meet on: pass -- --distributed-port PORT" \
            "(the same in every task; without it each machine would train alone)"
    elif [[ -n "$init" ]]; then
        DIST_LAUNCH="by hand (first rank ${rank:-0} of $n, $init)"
        DIST_OPTIONS=(--distributed-world-size "$n")
        DIST_COPY=${rank:-0}
    elif (( n > 1 )); then
        DIST_LAUNCH="one machine, $n GPUs"
        DIST_OPTIONS=(--distributed-world-size "$n")
    else
        DIST_LAUNCH="one process"
    fi
}

# check_distributed N: before training, that this machine can run its part of N processes (the GPUs
#   torch sees here: at least N on one machine; under srun with one task a machine, N = machines
#   times GPUs); dies with the reason. Without a GPU, N > 1 dies: fairseq's launchers need CUDA
#   (two CPU processes train by the per-rank commands of docs/distributed.md).
check_distributed() {
    local n="$1" gpus
    (( n > 1 )) || return 0
    gpus=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null | tail -1)
    (( ${gpus:-0} > 0 )) || die "--gpus $n needs GPUs and torch sees none here; for several CPU processes" \
        "(gloo) see docs/distributed.md"
    case "$DIST_LAUNCH" in
        one\ machine*)
            (( gpus >= n )) || die "--gpus $n on one machine, but torch sees $gpus GPUs here" ;;
        SLURM*)
            if [[ "${SLURM_NTASKS_PER_NODE:-}" == 1 || "${SLURM_NTASKS:-1}" == "${SLURM_NNODES:-1}" ]]; then
                (( ${SLURM_NNODES:-1} * gpus == n )) || die "srun with one task a machine: fairseq trains on" \
                    "${SLURM_NNODES:-1} machines x $gpus GPUs, not --gpus $n"
            fi ;;
    esac
}

# print_commands: for a recipe's --print-command, each of SEEDS' fairseq-train commands on a line
#   (command_of SEED RUN, the recipe's, fills CMD; RUNS and NAME name the run folder)
print_commands() {
    local seed
    for seed in $SEEDS; do
        command_of "$seed" "$RUNS/${NAME}_seed${seed}"
        printf '%q ' "${CMD[@]}"; echo
    done
}

# run_log RUN: this copy's log file (see distributed_options)
run_log() { if [[ "${DIST_COPY:-0}" == 0 ]]; then echo "$1/train.log"; else echo "$1/train.copy${DIST_COPY}.log"; fi; }

# device_for PRINT CPU: sets DEVICE (fairseq's device option). --cpu when asked (CPU=1, a recipe's --cpu);
#   else a command only printed (PRINT=1, --print-command) is the command for a GPU machine, whatever this
#   machine has (it is printed on a login node and run in a GPU job), and a run here adds --cpu where
#   torch sees no GPU. A printed command is announced (on stderr) as for a GPU machine or a CPU.
device_for() {
    DEVICE=()
    if [[ "$2" == 1 ]]; then
        DEVICE=(--cpu)
    elif [[ "$1" != 1 ]]; then
        has_cuda || DEVICE=(--cpu)
    fi
    if [[ "$1" == 1 ]]; then
        if [[ "$2" == 1 ]]; then say "commands for a CPU (--cpu)"; else say "commands for a GPU machine (--cpu for a CPU)"; fi
    fi
}

# trained RUN: succeeds, printing why, when RUN/checkpoints/checkpoint_last.pt already holds the training
#   that CMD (command_of's fairseq-train command) asks for: its --max-update updates or --max-epoch epochs.
#   Stock fairseq-train would resume it anyway, train one more update and rewrite its checkpoints.
trained() {
    "$PYTHON" "$REPO_ROOT/fourierformer_fairseq/fairseq_runs.py" trained "$1/checkpoints/checkpoint_last.pt" "${CMD[@]:1}"
}

# the console's share of fairseq-train's output (all of it goes to the log): the progress every
# --log-interval updates (train_inner), each epoch's summary and validation, the end, and errors
CONSOLE_LINES='[|] train_inner [|]|[|] train [|]|valid on|done training|Error|error:|Traceback'

# train_logged LOG: runs CMD, its output appended to LOG after a line that marks the start of this run
#   (the date, the recipe and the command; a resumed run's log keeps its first part), and
#   CONSOLE_LINES of it on the console; returns fairseq-train's exit status
train_logged() {
    local log="$1" rc
    printf '==== %s %s: %s\n' "$(date -u '+%F %T UTC')" "$(basename "$(dirname "$0")")/$(basename "$0")" \
        "$(printf '%q ' "${CMD[@]}")" >> "$log"
    set +e
    "${CMD[@]}" 2>&1 | tee -a "$log" | grep --line-buffered -E "$CONSOLE_LINES" >&2
    rc=${PIPESTATUS[0]}
    set -e
    return "$rc"
}
