"""The runs: fairseq's command-line tools, trainings, the recipes, the quickstart, the README's
commands and the two-rank runs, end to end: slow. The files that hold the units of what the runs
read and print are fast, but for the runs they name."""
from tiers import room_tiers

ROOM = "slow"
EXCEPTIONS = {
    "test_every_registered_arch_is_covered_by_the_cli_tests": "fast",  # a check of the arch lists
    "test_recipes.py": "fast",  # the recipes' units: text pipeline, options, commands, summaries
    "test_prepare_download_path": "slow",
    "test_iwslt_small_end_to_end": "slow",
    "test_wikitext_small_end_to_end": "slow",
    "test_reproduce_small_tables_offline": "slow",
    "test_reproduce_table_survives_a_diverging_row": "slow",
    "test_full_size_compare_end_to_end_on_the_cpu": "slow",
    "test_lm_protocol.py": "fast",  # the published LM protocol, on the commands and models it builds
    "test_every_row_of_the_lm_tables_builds_its_setting_and_trains_a_step": "slow",
    "test_quickstart.py": "fast",  # the quickstart's corpus and options
    "test_quickstart_small_mode_end_to_end": "slow",
    "test_readme_commands.py": "fast",  # the README's commands parsed by fairseq's parsers
    "test_readme_commands_end_to_end_on_tiny_data": "slow",
    "test_readme_training_command_is_the_recipes": "slow",
    "test_recipe_reruns.py": "fast",  # what a re-run and a printed command say
    "test_a_rerun_keeps_the_log_skips_a_trained_run_and_resumes_a_longer_one": "slow",
}

pytest_collection_modifyitems = room_tiers(__file__, ROOM, EXCEPTIONS)
