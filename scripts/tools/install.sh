#!/usr/bin/env bash
# Installs fourierformer-fairseq and everything it needs into the current Python
# environment (a virtualenv is recommended), then compiles its kernels.
#
#   bash scripts/tools/install.sh                      # torch as below, fairseq, this package
#   TORCH_SPEC="torch==2.14.1" bash scripts/tools/install.sh   # a torch of your choice
#   WHEELS=DIR bash scripts/tools/install.sh           # offline: every package from the wheels in DIR
#
# torch, unless TORCH_SPEC says otherwise: an installed CUDA build that sees a GPU is kept; on a
# machine with an NVIDIA GPU (nvidia-smi lists one) the CUDA build torch==2.14.1 is installed;
# elsewhere the CPU build torch==2.13.0. The CUDA kernels are compiled when torch is a CUDA
# build and nvcc is found, for the GPU's own architecture when one is present
# (TORCH_CUDA_ARCH_LIST overrides; setup.py's default is "8.0;9.0").
#
# fairseq: the plugin's one pin, FAIRSEQ_REQUIREMENT in fourierformer_fairseq/__init__.py (read
# here as setup.py reads it, without importing the package).
set -euo pipefail
cd "$(dirname "$0")/../.."
FAIRSEQ_SPEC=$(sed -n 's/^FAIRSEQ_REQUIREMENT = "\(.*\)"$/\1/p' fourierformer_fairseq/__init__.py)
[[ -n "$FAIRSEQ_SPEC" ]] || { echo "[install] no FAIRSEQ_REQUIREMENT in fourierformer_fairseq/__init__.py" >&2; exit 1; }
PYTHON=${PYTHON:-python3}
PIP_ARGS=(--disable-pip-version-check)
if [[ -n "${WHEELS:-}" ]]; then
    [[ -d "$WHEELS" ]] || { echo "[install] WHEELS=$WHEELS is not a folder" >&2; exit 1; }
    PIP_ARGS+=(--no-index --find-links "$WHEELS")
fi
pip_install() { "$PYTHON" -m pip install "${PIP_ARGS[@]}" "$@"; }

torch_sees_gpu() { "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }
if [[ -z "${TORCH_SPEC:-}" ]]; then
    if torch_sees_gpu; then
        TORCH_SPEC="torch==$("$PYTHON" -c 'import torch; print(torch.__version__.split("+")[0])')"
        WHY="the installed CUDA build, which sees the GPU"
    elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
        TORCH_SPEC="torch==2.14.1"
        WHY="an NVIDIA GPU is present: a CUDA build"
    else
        TORCH_SPEC="torch==2.13.0"
        WHY="no GPU: the CPU build"
    fi
else
    WHY="TORCH_SPEC"
fi

echo "[install] 1/4 torch ($TORCH_SPEC: $WHY) and build tools"
pip_install "$TORCH_SPEC" "numpy" "cython" "setuptools>=64" "wheel" "ninja"
echo "[install] 2/4 fairseq ($FAIRSEQ_SPEC; from source this compiles its extensions against this torch, minutes)"
pip_install --no-build-isolation "$FAIRSEQ_SPEC" "$TORCH_SPEC"
echo "[install] 3/4 runtime and test dependencies"
pip_install -r requirements.txt "$TORCH_SPEC"

if [[ -z "${TORCH_CUDA_ARCH_LIST:-}" ]] && torch_sees_gpu; then
    TORCH_CUDA_ARCH_LIST=$("$PYTHON" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability(0))")
    export TORCH_CUDA_ARCH_LIST
    echo "[install] building the CUDA kernels for this GPU's architecture ($TORCH_CUDA_ARCH_LIST)"
fi
build() {
    echo "[install] 4/4 fourierformer-fairseq and its C++/CUDA extension${CXX:+ (CXX=$CXX)}"
    pip_install --no-build-isolation --no-deps -e .
    INFO=$("$PYTHON" -m fourierformer_fairseq.info)
    echo "$INFO"
}
build
if grep -q "^error reporting: BROKEN" <<<"$INFO" && [[ -x /usr/bin/g++ ]] \
        && [[ "$(command -v "${CXX:-g++}")" != /usr/bin/g++ ]]; then
    # A g++ that is not the system's (a wrapper with its own search paths, which an environment
    # may also name in CXX) has been seen to link its own libstdc++ into the extension, whose
    # exceptions then crash the process instead of raising.
    echo "[install] the extension crashes on a rejected input; building again with the system compiler /usr/bin/g++" \
         "instead of ${CXX:-$(command -v g++)}"
    rm -rf build
    export CXX=/usr/bin/g++ CC=/usr/bin/gcc
    build
fi
if grep -q "^error reporting: BROKEN" <<<"$INFO"; then
    echo "[install] the extension was built but crashes on a rejected input (see 'error reporting' above);" \
         "set CXX to another C++ compiler and run this again" >&2
    exit 1
fi
