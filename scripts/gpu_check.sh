#!/usr/bin/env bash
# The GPU check: install and build, the CUDA tests and fuzz, the op and model benchmarks, and
# stock fairseq-train with --fp16 and --amp, generate and eval-lm with --fp16, one summary table at the
# end; exits non-zero on any failure. Options and what each step checks: scripts/gpu_check.py.
#
#   bash scripts/gpu_check.sh                      # on a GPU machine (8-9 minutes on an H200, estimated)
#   bash scripts/gpu_check.sh --wheels DIR         # offline: fairseq and its dependencies from DIR
#   bash scripts/gpu_check.sh --dry-run            # without a GPU: everything but the GPU steps
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
