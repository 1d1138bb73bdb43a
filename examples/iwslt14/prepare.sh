#!/usr/bin/env bash
# IWSLT'14 German-English for fairseq: download (or take local raw files), the canonical
# prepare-iwslt14.sh pipeline in Python (sacremoses, subword-nmt), then fairseq-preprocess.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../lib.sh"

URL="${IWSLT14_URL:-http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz}"
# MD5 of de-en.tgz at the URL above. Taken from a third-party script that downloads the same
# file; not verified by this project (no internet where it was written). Set IWSLT14_MD5=''
# (or --md5 '') to skip, or to the value you trust.
MD5="${IWSLT14_MD5-10936dfdf616504ddbd844e91b94ef4a}"
SHA256="${IWSLT14_SHA256-}"

RAW=""
OUT="data-bin/iwslt14.tokenized.de-en"
CORPUS="iwslt14"
TEXT_TRAIN="" TEXT_VALID="" TEXT_TEST=""
BPE_MERGES=10000
WORKERS="$(nproc 2>/dev/null || echo 1)"
SMALL=0
MAX_TRAIN_LINES=0
MAX_EVAL_LINES=0
JOINED=0
SRC=de TGT=en

usage() {
    cat <<EOF
Usage: examples/iwslt14/prepare.sh [options]

Prepares IWSLT'14 De-En exactly like fairseq's examples/translation/prepare-iwslt14.sh:
Moses tokenisation (sacremoses), cleaning to 1..175 tokens with ratio 1.5, lowercasing,
valid = every 23rd training pair, test = TED.dev2010 + TEDX.dev2012 + TED.tst2010 +
TED.tst2011 + TED.tst2012, joint BPE (subword-nmt, 10,000 merges), then fairseq-preprocess.

Data source (one of):
  (default)            download \$IWSLT14_URL ($URL)
                       with a progress bar, then verify its MD5 (--md5) / SHA-256 (--sha256)
  --raw PATH           offline: the archive de-en.tgz, or a folder with its contents
                       (train.tags.de-en.{de,en} and IWSLT14.TED*.de-en.{de,en}.xml)
  --text-train PREFIX  offline: any plain parallel corpus (PREFIX.de / PREFIX.en, one sentence
  --text-valid PREFIX  a line), e.g. Multi30k; train is cleaned, valid/test only tokenised
  [--text-test PREFIX]

Options:
  --out DIR            binarised data here; text (tokenised, BPE, raw test) in DIR/text
                       (default: $OUT)
  --bpe-merges N       joint BPE merges (default: $BPE_MERGES)
  --joined-dictionary  one dictionary for both languages (default: two, as fairseq's README)
  --workers N          tokenisation / binarisation processes (default: $WORKERS)
  --md5 HEX            expected MD5 of the download ('' skips; default documented in this file)
  --sha256 HEX         expected SHA-256 of the download (default: unset)
  --small              small mode: first 2,000 training lines, 200 valid/test pairs, 500 merges
  --max-train-lines N  keep only the first N training lines
  -h, --help           this help

Examples:
  examples/iwslt14/prepare.sh                                   # download + full pipeline
  examples/iwslt14/prepare.sh --raw ~/Downloads/de-en.tgz       # offline
  examples/iwslt14/prepare.sh --text-train multi30k/train --text-valid multi30k/val \\
      --text-test multi30k/test_2016_flickr --bpe-merges 8000 --out data-bin/multi30k.de-en
EOF
}


while [[ $# -gt 0 ]]; do
    case "$1" in
        --raw) RAW="${2:?--raw needs a path}"; shift 2 ;;
        --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
        --text-train) CORPUS=text; TEXT_TRAIN="${2:?}"; shift 2 ;;
        --text-valid) CORPUS=text; TEXT_VALID="${2:?}"; shift 2 ;;
        --text-test) CORPUS=text; TEXT_TEST="${2:?}"; shift 2 ;;
        --bpe-merges) BPE_MERGES="${2:?}"; shift 2 ;;
        --joined-dictionary) JOINED=1; shift ;;
        --workers) WORKERS="${2:?}"; shift 2 ;;
        --md5) MD5="${2-}"; shift 2 ;;
        --sha256) SHA256="${2-}"; shift 2 ;;
        --small) SMALL=1; shift ;;
        --max-train-lines) MAX_TRAIN_LINES="${2:?}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option '$1'" ;;
    esac
done

if [[ $SMALL == 1 ]]; then
    [[ $MAX_TRAIN_LINES == 0 ]] && MAX_TRAIN_LINES=2000
    MAX_EVAL_LINES=200
    [[ $BPE_MERGES == 10000 ]] && BPE_MERGES=500
fi

"$PYTHON" -c "import sacremoses, subword_nmt" 2>/dev/null \
    || die "needs sacremoses and subword-nmt: pip install -r requirements.txt (or bash scripts/tools/install.sh)"
command -v fairseq-preprocess >/dev/null || die "fairseq-preprocess not found: bash scripts/tools/install.sh installs fairseq"

TEXT="$OUT/text"
mkdir -p "$TEXT"

verify() { verify_checksums "$1" "$MD5" "$SHA256"; }

extract() {  # extract ARCHIVE DEST
    say "extracting $1 -> $2"
    mkdir -p "$2"
    tar -xzf "$1" -C "$2" || die "cannot extract $1 (not a .tgz?)"
}

if [[ $CORPUS == iwslt14 ]]; then
    ORIG="$OUT/orig"
    if [[ -n "$RAW" ]]; then
        [[ -e "$RAW" ]] || die "--raw $RAW does not exist"
        if [[ -d "$RAW" ]]; then
            say "using local folder $RAW (offline)"
            ORIG="$RAW"
        else
            say "using local archive $RAW (offline)"
            [[ -n "$MD5$SHA256" ]] && verify "$RAW"
            rm -rf "$ORIG"; extract "$RAW" "$ORIG"
        fi
    else
        GZ="$OUT/de-en.tgz"
        download "$URL" "$GZ"
        verify "$GZ"
        rm -rf "$ORIG"; extract "$GZ" "$ORIG"
    fi
    say "text pipeline -> $TEXT"
    "$PYTHON" "$HERE/prepare_text.py" --corpus iwslt14 --orig "$ORIG" --out "$TEXT" --src $SRC --tgt $TGT \
        --bpe-merges "$BPE_MERGES" --workers "$WORKERS" --max-train-lines "$MAX_TRAIN_LINES" --max-eval-lines "$MAX_EVAL_LINES"
else
    [[ -n "$TEXT_TRAIN" && -n "$TEXT_VALID" ]] || die "--text-train and --text-valid go together"
    say "text pipeline on $TEXT_TRAIN / $TEXT_VALID ${TEXT_TEST:+/ $TEXT_TEST} -> $TEXT"
    "$PYTHON" "$HERE/prepare_text.py" --corpus text --train "$TEXT_TRAIN" --valid "$TEXT_VALID" \
        ${TEXT_TEST:+--test "$TEXT_TEST"} --out "$TEXT" --src $SRC --tgt $TGT \
        --bpe-merges "$BPE_MERGES" --workers "$WORKERS" --max-train-lines "$MAX_TRAIN_LINES" --max-eval-lines "$MAX_EVAL_LINES"
fi

say "fairseq-preprocess -> $OUT"
PREF=(--trainpref "$TEXT/train" --validpref "$TEXT/valid")
[[ -f "$TEXT/test.$SRC" ]] && PREF+=(--testpref "$TEXT/test")
EXTRA=()
[[ $JOINED == 1 ]] && EXTRA+=(--joined-dictionary)
rm -f "$OUT"/dict.*.txt
fairseq-preprocess --source-lang $SRC --target-lang $TGT "${PREF[@]}" --destdir "$OUT" \
    --workers "$WORKERS" "${EXTRA[@]}" > "$OUT/preprocess.log" 2>&1 \
    || { tail -20 "$OUT/preprocess.log" >&2; die "fairseq-preprocess failed (log: $OUT/preprocess.log)"; }
grep -E "\[($SRC|$TGT)\] .*sents" "$OUT/preprocess.log" | sed 's/^.*preprocess:/  /' >&2 || true
say "done: $OUT (dictionaries and binaries); text in $TEXT"
