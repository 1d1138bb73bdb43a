#!/usr/bin/env bash
# WikiText-103 for fairseq language modelling: download (or local raw files), then
# fairseq-preprocess --only-source, as fairseq's examples/language_model/prepare-wikitext-103.sh.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/lib.sh"

URL="${WIKITEXT103_URL:-https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip}"
# MD5 of wikitext-103-v1.zip as published with torchtext's WikiText103 dataset.
MD5="${WIKITEXT103_MD5-9ddaacaf6af0710eda8c456decff7832}"
SHA256="${WIKITEXT103_SHA256-}"

RAW=""
OUT="data-bin/wikitext-103"
WORKERS="$(nproc 2>/dev/null || echo 1)"
SMALL=0
MAX_TRAIN_LINES=0

usage() {
    cat <<EOF
Usage: examples/wikitext103/prepare.sh [options]

Binarises WikiText-103 (wiki.{train,valid,test}.tokens, word level, as released) with
fairseq-preprocess --only-source. The test split is optional (binarised when present).

Data source (one of):
  (default)          download \$WIKITEXT103_URL ($URL)
                     with a progress bar, and verify its MD5 ($MD5; --md5 '' skips)
  --raw PATH         offline: wikitext-103-v1.zip, or a folder holding wiki.*.tokens
                     (WikiText-2 works the same way)

Options:
  --out DIR            (default: $OUT); the raw files are kept in DIR/raw
  --workers N          (default: $WORKERS)
  --md5 HEX / --sha256 HEX   expected checksums of the download ('' skips)
  --small              small mode: the first 2,000 training lines, 200 valid/test lines
  --max-train-lines N  keep only the first N training lines
  -h, --help           this help

Examples:
  examples/wikitext103/prepare.sh
  examples/wikitext103/prepare.sh --raw ~/Downloads/wikitext-103-v1.zip
  examples/wikitext103/prepare.sh --raw /data/wikitext-2 --out data-bin/wikitext-2
EOF
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --raw) RAW="${2:?--raw needs a path}"; shift 2 ;;
        --out) OUT="${2:?}"; shift 2 ;;
        --workers) WORKERS="${2:?}"; shift 2 ;;
        --md5) MD5="${2-}"; shift 2 ;;
        --sha256) SHA256="${2-}"; shift 2 ;;
        --small) SMALL=1; shift ;;
        --max-train-lines) MAX_TRAIN_LINES="${2:?}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option '$1'" ;;
    esac
done
[[ $SMALL == 1 && $MAX_TRAIN_LINES == 0 ]] && MAX_TRAIN_LINES=2000
need fairseq-preprocess "bash scripts/tools/install.sh installs fairseq"

verify() { verify_checksums "$1" "$MD5" "$SHA256"; }

unpack_zip() {  # unpack_zip ZIP DEST
    say "extracting $1 -> $2"
    mkdir -p "$2"
    "$PYTHON" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2" \
        || die "cannot extract $1 (not a zip?)"
}

mkdir -p "$OUT"
if [[ -n "$RAW" ]]; then
    [[ -e "$RAW" ]] || die "--raw $RAW does not exist"
    if [[ -d "$RAW" ]]; then
        say "using local folder $RAW (offline)"; SRC_DIR="$RAW"
    else
        say "using local archive $RAW (offline)"
        [[ -n "$MD5$SHA256" ]] && verify "$RAW"
        rm -rf "$OUT/unpacked"; unpack_zip "$RAW" "$OUT/unpacked"; SRC_DIR="$OUT/unpacked"
    fi
else
    ZIP="$OUT/wikitext-103-v1.zip"
    download "$URL" "$ZIP"
    verify "$ZIP"
    rm -rf "$OUT/unpacked"; unpack_zip "$ZIP" "$OUT/unpacked"; SRC_DIR="$OUT/unpacked"
fi

# the folder holding wiki.train.tokens: SRC_DIR or one level below (the zip has wikitext-103/)
FOUND=""
for d in "$SRC_DIR" "$SRC_DIR"/*; do
    if [[ -f "$d/wiki.train.tokens" ]]; then FOUND="$d"; break; fi
done
[[ -n "$FOUND" ]] || die "no wiki.train.tokens in $SRC_DIR or one level below"
[[ -f "$FOUND/wiki.valid.tokens" ]] || die "no wiki.valid.tokens beside $FOUND/wiki.train.tokens"

RAWDIR="$OUT/raw"
mkdir -p "$RAWDIR"
for split in train valid test; do
    f="$FOUND/wiki.$split.tokens"
    [[ -f "$f" ]] || { say "no $f: skipping the $split split"; rm -f "$RAWDIR/wiki.$split.tokens"; continue; }
    if [[ $split == train && $MAX_TRAIN_LINES != 0 ]]; then
        head -n "$MAX_TRAIN_LINES" "$f" > "$RAWDIR/wiki.$split.tokens"
    elif [[ $split != train && $SMALL == 1 ]]; then
        head -n 200 "$f" > "$RAWDIR/wiki.$split.tokens"
    else
        cp "$f" "$RAWDIR/wiki.$split.tokens"
    fi
    say "  $split: $(wc -l < "$RAWDIR/wiki.$split.tokens") lines, $(wc -w < "$RAWDIR/wiki.$split.tokens") words"
done

PREF=(--trainpref "$RAWDIR/wiki.train.tokens" --validpref "$RAWDIR/wiki.valid.tokens")
[[ -f "$RAWDIR/wiki.test.tokens" ]] && PREF+=(--testpref "$RAWDIR/wiki.test.tokens")
say "fairseq-preprocess --only-source -> $OUT"
rm -f "$OUT/dict.txt"
fairseq-preprocess --only-source "${PREF[@]}" --destdir "$OUT" --workers "$WORKERS" \
    > "$OUT/preprocess.log" 2>&1 \
    || { tail -20 "$OUT/preprocess.log" >&2; die "fairseq-preprocess failed (log: $OUT/preprocess.log)"; }
grep -E "\[None\] .*sents|Dictionary" "$OUT/preprocess.log" | sed 's/^.*preprocess:/  /' >&2 || true
say "done: $OUT"
