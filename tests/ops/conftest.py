"""The op's numerics: fast, but for the re-runs of the op's and the fuzz's files under each narrower
CPU kernel variant (a subprocess each) and the workspace above the kept size."""
from tiers import room_tiers

ROOM = "fast"
EXCEPTIONS = {
    "test_cpu_workspace_above_the_kept_size": "slow",  # a workspace past the kept size: large inputs
    "test_every_cpu_kernel_variant": "slow",  # the op's accuracy tests again per variant, in a subprocess
    "test_fuzz_every_cpu_kernel_variant": "slow",  # the whole fuzz again per variant, in a subprocess
}

pytest_collection_modifyitems = room_tiers(__file__, ROOM, EXCEPTIONS)
