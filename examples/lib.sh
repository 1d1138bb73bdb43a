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
# (--fourier-phi abs --fourier-paper-exact -> _phiabs_paper_exact)
fourier_suffix() {
    local args=("$@") out="" i a next
    for ((i = 0; i < ${#args[@]}; i++)); do
        a="${args[$i]}"
        case "$a" in
            --fourier-*=*) out+="_${a#--fourier-}"; out="${out/=/}" ;;
            --fourier-*)
                next="${args[$((i + 1))]:-}"
                if [[ -n "$next" && "$next" != --* ]]; then out+="_${a#--fourier-}$next"; i=$((i + 1))
                else out+="_${a#--fourier-}"; fi ;;
        esac
    done
    echo "${out//-/_}"
}

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
