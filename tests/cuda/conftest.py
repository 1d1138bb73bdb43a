"""The CUDA kernels: fast (the GPU tests skip without a GPU), but for the host emulation, which
compiles the kernels for the CPU and runs them (also under the sanitizers)."""
from tiers import room_tiers

ROOM = "fast"
EXCEPTIONS = {
    "test_cuda_emulated.py": "slow",  # builds and runs the host emulator
}

pytest_collection_modifyitems = room_tiers(__file__, ROOM, EXCEPTIONS)
