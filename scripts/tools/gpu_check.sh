#!/usr/bin/env bash
# The GPU check: install and build, the CUDA tests and fuzz, the CPU op tests under AVX-512, the op
# and model benchmarks, stock fairseq-train with --fp16 and --amp side by side, generate / eval-lm,
# and what the paper's tables cost in GPU-hours on this card; one table written row by row
# (OUT/summary.md); exits non-zero on any failure. Options and what each step checks: scripts/tools/gpu_check.py.
#
#   python scripts/tools/gpu_check.py --prepare-offline runs/offline   # with a network: wheels and data for offline
#   bash scripts/tools/gpu_check.sh --offline runs/offline             # on a GPU machine without a network
#   bash scripts/tools/gpu_check.sh                                    # on a GPU machine with one
#   bash scripts/tools/gpu_check.sh --dry-run [--offline DIR]          # without a GPU: everything but the GPU steps
set -euo pipefail
cd "$(dirname "$0")/../.."
# the check installs this package: until it has, its Python reads the package from this checkout
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" scripts/tools/gpu_check.py "$@"
