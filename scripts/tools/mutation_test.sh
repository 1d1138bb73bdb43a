#!/usr/bin/env bash
# Mutation check of the fused CPU kernel: each patch in tests/ops/mutants/ (or the ones named on
# the command line) plants one realistic bug in csrc/cpu/; the fast test tier must catch it.
#
#   scripts/tools/mutation_test.sh [--skip-baseline] [--keep] [--only TESTS ...] [PATCH ...]
#
# The tracked (and untracked, not ignored) files of this checkout are copied to a temporary
# folder, which is built and tested there: first unmutated (the fast tier must pass, else a
# failure would prove nothing; --skip-baseline only builds it), then with each patch applied
# in turn (and reverted after). Each run is
#   FOURIERFORMER_REQUIRE_FUSED=1 python -m pytest -q -x -m "not slow" tests
# (less tests/ops/test_mutants.py, which checks that the patches apply to unmutated sources)
# with PYTHONPATH at the copy, after checking that the package and its _C extension are
# imported from the copy. --only TESTS (repeatable) runs those test files or node ids in place
# of tests/, e.g. to see which op test catches a mutant. Rebuilds are incremental (ninja), so a
# mutant costs the objects its patch touches. Per mutant it reports "caught by <first failing
# test>" or "SURVIVED", with the build and test times; the logs stay in the folder it names at
# the end (--keep keeps the copy too). Exit status 1 when a mutant survives, a patch does not
# apply, a build fails or a test run ends without a verdict (e.g. the extension does not load);
# 0 when every mutant is caught. MAX_JOBS limits the compiler processes, as for any torch
# extension build.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python}
skip_baseline=0
keep=0
patches=()
tests=()
while [ $# -gt 0 ]; do
  arg=$1; shift
  case "$arg" in
    --skip-baseline) skip_baseline=1 ;;
    --keep) keep=1 ;;
    --only) [ $# -gt 0 ] || { echo "--only needs a test path" >&2; exit 2; }; tests+=("$1"); shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "unknown option: $arg" >&2; exit 2 ;;
    *) patches+=("$(cd "$(dirname "$arg")" && pwd)/$(basename "$arg")") ;;
  esac
done
if [ ${#patches[@]} -eq 0 ]; then
  patches=("$ROOT"/tests/ops/mutants/*.patch)
  [ -e "${patches[0]}" ] || { echo "no patches in $ROOT/tests/ops/mutants" >&2; exit 2; }
fi
[ ${#tests[@]} -gt 0 ] || tests=(tests)
for p in "${patches[@]}"; do
  [ -f "$p" ] || { echo "no such patch: $p" >&2; exit 2; }
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fourierformer-mutants.XXXXXX")
LOGS="$WORK.logs"
mkdir -p "$LOGS"
cleanup() { [ "$keep" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT

say() { echo "[$(date +%H:%M:%S)] $*"; }

say "copying the checkout $ROOT to $WORK"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
   while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
   tar --null --no-recursion -T - -cf -) | tar -xf - -C "$WORK" || { echo "copy failed" >&2; exit 1; }

# git apply in the copy, which is no repository (the ceiling keeps git from finding one above)
apply_in_copy() { (cd "$WORK" && GIT_CEILING_DIRECTORIES=$(dirname "$WORK") git apply "$@"); }

# build: incremental in-place build of the copy; $1 names the log
build() {
  (cd "$WORK" && "$PYTHON" setup.py build_ext --inplace --force) >"$LOGS/$1.build.log" 2>&1
}

# check_import: the copy's package and extension are the ones imported
check_import() {
  local where
  where=$(cd "$WORK" && PYTHONPATH="$WORK" "$PYTHON" -c \
    'import fourierformer_fairseq as f, fourierformer_fairseq._C as c; print(f.__file__); print(c.__file__)' \
    2>"$LOGS/import.log") || { echo "the copy's package or extension does not import (see $LOGS/import.log)" >&2; return 1; }
  while IFS= read -r path; do
    case "$path" in
      "$WORK"/*) ;;
      *) echo "imported $path, not the copy's (under $WORK)" >&2; return 1 ;;
    esac
  done <<<"$where"
}

# fast_tier LOGNAME: sets rc and first_failure
fast_tier() {
  (cd "$WORK" && PYTHONPATH="$WORK" FOURIERFORMER_REQUIRE_FUSED=1 \
     "$PYTHON" -m pytest -q -x -m "not slow" -p no:cacheprovider \
     --ignore=tests/ops/test_mutants.py "${tests[@]}") >"$LOGS/$1.tests.log" 2>&1
  rc=$?
  first_failure=$(grep -m1 -E '^(FAILED|ERROR) ' "$LOGS/$1.tests.log" | awk '{print $2}')
}

elapsed() { local s=$(( $(date +%s) - $1 )); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

start_all=$(date +%s)
t0=$(date +%s)
say "baseline: building the unmutated copy"
if ! build baseline; then
  say "baseline: BUILD FAILED (log: $LOGS/baseline.build.log)"; keep=1; exit 1
fi
check_import || exit 1
say "baseline: built in $(elapsed "$t0")"
if [ "$skip_baseline" = 0 ]; then
  t0=$(date +%s)
  say "baseline: running ${tests[*]}"
  fast_tier baseline
  if [ "$rc" -ne 0 ]; then
    say "baseline: the unmutated tree FAILS the fast tier (rc $rc, first failure: ${first_failure:-none}; log: $LOGS/baseline.tests.log); mutants would prove nothing"
    exit 1
  fi
  say "baseline: $(tail -n1 "$LOGS/baseline.tests.log" | sed 's/=//g; s/^ *//; s/ *$//') ($(elapsed "$t0"))"
fi

results=()
status=0
for patch in "${patches[@]}"; do
  name=$(basename "$patch" .patch)
  if ! apply_in_copy --check "$patch" 2>"$LOGS/$name.apply.log"; then
    say "$name: DOES NOT APPLY ($(head -n1 "$LOGS/$name.apply.log"))"
    results+=("$name: DOES NOT APPLY"); status=1; continue
  fi
  apply_in_copy "$patch"
  t0=$(date +%s)
  say "$name: applied; building"
  if ! build "$name"; then
    say "$name: BUILD FAILED (log: $LOGS/$name.build.log)"
    results+=("$name: BUILD FAILED"); status=1
  elif ! check_import; then
    results+=("$name: WRONG PACKAGE IMPORTED"); status=1
  else
    build_time=$(elapsed "$t0")
    t0=$(date +%s)
    say "$name: built in $build_time; running ${tests[*]}"
    fast_tier "$name"
    test_time=$(elapsed "$t0")
    if [ "$rc" -eq 0 ]; then
      verdict="SURVIVED (the tests passed: $(tail -n1 "$LOGS/$name.tests.log" | sed 's/=//g; s/^ *//; s/ *$//'))"
      status=1
    elif [ "$rc" -eq 1 ] && [ -n "$first_failure" ]; then
      verdict="caught by $first_failure"
    elif [ "$rc" -ge 128 ]; then
      verdict="caught: the test process died (signal $((rc - 128)))"
    else
      verdict="NO VERDICT (pytest exit status $rc)"; status=1
    fi
    say "$name: $verdict (build $build_time, tests $test_time)"
    results+=("$name: $verdict (build $build_time, tests $test_time)")
  fi
  apply_in_copy -R "$patch" || { say "could not revert $name; stopping"; status=1; break; }
done

echo
echo "mutation check, $(elapsed "$start_all") in all (logs: $LOGS):"
for r in "${results[@]}"; do echo "  $r"; done
exit $status
