"""The extension: fast, but for what starts fresh interpreters that train or import fairseq."""
from tiers import room_tiers

ROOM = "fast"
EXCEPTIONS = {
    "test_fake_and_autograd_registered_at_import": "slow",  # a fresh interpreter importing torch
    "test_the_readme_names_what_a_forgotten_user_dir_gives": "slow",  # a training in a fresh process
    "test_prefetch_exit.py": "slow",  # fresh interpreters importing fairseq
}

pytest_collection_modifyitems = room_tiers(__file__, ROOM, EXCEPTIONS)
