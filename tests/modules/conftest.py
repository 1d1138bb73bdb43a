"""The attention modules: fast, but for the trainings and fresh processes of the Performer and the
global filter."""
from tiers import room_tiers

ROOM = "fast"
EXCEPTIONS = {
    "test_feature_draws_are_identical_across_processes": "slow",  # two fresh interpreters importing torch
    "test_model_redraw_is_identical_in_two_fresh_processes": "slow",  # two fresh interpreters building a model
    "test_performer_lm_trains_with_redraws_and_evaluates": "slow",  # trains with fairseq_cli
    "test_approximation_script_prints_its_table": "slow",  # runs the approximation tool
    "test_language_model_trains_resumes_and_evaluates_with_stock_fairseq": "slow",  # trains with fairseq_cli
    "test_language_model_learns_from_two_positions_back": "slow",  # trains a model
}

pytest_collection_modifyitems = room_tiers(__file__, ROOM, EXCEPTIONS)
