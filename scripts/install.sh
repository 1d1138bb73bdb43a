#!/usr/bin/env bash
# Installs fourierformer-fairseq and everything it needs into the current Python
# environment (a virtualenv is recommended), then compiles its kernels.
#
#   bash scripts/install.sh            # torch 2.13 (CPU build), fairseq, this package
#   TORCH_SPEC="torch==2.14.1" bash scripts/install.sh   # another torch (CUDA builds compile CUDA kernels)
#
# fairseq comes from `fairseq-fixed` (a maintained fork of fairseq main that builds and
# imports on Python 3.11); fairseq 0.12.2 from PyPI does not.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
pip_install() { "$PYTHON" -m pip install --disable-pip-version-check "$@"; }

echo "[install] 1/4 torch ($TORCH_SPEC) and build tools"
pip_install "$TORCH_SPEC" "numpy" "cython" "setuptools>=64" "wheel" "ninja"
echo "[install] 2/4 fairseq (fairseq-fixed 0.12.3.1; compiles its extensions against this torch, ~4 min the first time)"
pip_install --no-build-isolation "fairseq-fixed==0.12.3.1" "$TORCH_SPEC"
echo "[install] 3/4 runtime and test dependencies"
pip_install -r requirements.txt "$TORCH_SPEC"
echo "[install] 4/4 fourierformer-fairseq and its C++/CUDA extension"
pip_install --no-build-isolation --no-deps -e .
INFO=$("$PYTHON" -m fourierformer_fairseq.info)
echo "$INFO"
if grep -q "^error reporting: BROKEN" <<<"$INFO"; then
    echo "[install] the extension was built but crashes on a rejected input (see 'error reporting' above)" >&2
    exit 1
fi
