"""The tools' tests: fast, but for the runs of the tools that build, train or time fairseq models."""
from tiers import room_tiers

ROOM = "fast"
EXCEPTIONS = {
    "test_fourier_estimators_small": "slow",  # the estimators' small run
    "test_benchmark_model_small": "slow",  # builds and times fairseq models
    "test_benchmark_generation_small": "slow",  # trains and generates with fairseq models
    "test_step_times_of_the_protocols_own_passes_are_the_record_the_dry_run_reads": "slow",  # times the protocols' passes
}

pytest_collection_modifyitems = room_tiers(__file__, ROOM, EXCEPTIONS)
