"""Session-wide checks.

The fused CPU kernel is part of this project, not optional hardware: when the extension is
missing or fails to load, the tests that need it are skipped, and a green run would say
nothing about it. With ``FOURIERFORMER_REQUIRE_FUSED=1`` (``.ci/run`` sets it) the session
stops before any test runs, with the loader's reason, unless the fused CPU backend is built
and loaded. Without it the header of every run says whether the kernel loaded, and the
skipped tests are listed with their reasons at the end (``-rfEs`` in pyproject.toml).

Under pytest-xdist (the full tier's ``-n auto``) each worker, and what it starts, runs one
torch thread (``pytest_configure``).

The tests marked ``release`` (the two-rank runs beyond one per plugin path) are deselected unless
``-m`` names ``release`` or ``FOURIERFORMER_RELEASE=1`` is set; a release runs them
(docs/testing.md). A test's tier (fast or slow) is its room's: tests/<room>/conftest.py.

The data the tests share: ``translation_data`` (the reversed-letters pair) and ``lm_data`` (the
learnable Markov text), made and binarised once a session by ``fairseq_helpers``; the tests only
read them (trainings write to their own ``tmp_path``).
"""
import os
import sys

import pytest

REQUIRE_FUSED = "FOURIERFORMER_REQUIRE_FUSED"


def pytest_configure(config):
    # A pytest-xdist worker (the full tier's `-n auto`: one a core) runs its tests, and the
    # subprocesses they start, on one torch thread: each worker's pool spinning beside another's
    # on the same cores would slow both. A test of the threaded paths sets its threads itself.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)


def _fused_cpu_reason() -> str:
    from fourierformer_fairseq.ops import backend_unavailable_reason

    return backend_unavailable_reason("cpu")


def pytest_report_header(config):
    reason = _fused_cpu_reason()
    if not reason:
        from fourierformer_fairseq.ops.extension import extension_status

        return f"fourierformer fused CPU kernel: loaded ({extension_status().build.get('cpu_isa')})"
    return (f"fourierformer fused CPU kernel: NOT loaded ({reason}); the tests that need it are skipped "
            f"(set {REQUIRE_FUSED}=1 to make this an error)")


@pytest.fixture(scope="session")
def translation_data(tmp_path_factory):
    from fairseq_helpers import create_dummy_data, preprocess_translation_data

    data_dir = str(tmp_path_factory.mktemp("translation_data"))
    create_dummy_data(data_dir)
    preprocess_translation_data(data_dir)
    return data_dir


@pytest.fixture(scope="session")
def lm_data(tmp_path_factory):
    from fairseq_helpers import create_markov_lm_data, preprocess_lm_data

    data_dir = str(tmp_path_factory.mktemp("lm_data"))
    create_markov_lm_data(data_dir)
    preprocess_lm_data(data_dir)
    return data_dir


RELEASE = "FOURIERFORMER_RELEASE"


def pytest_collection_modifyitems(config, items):
    """The ``release`` tests run when asked: ``-m`` naming ``release``, or FOURIERFORMER_RELEASE=1."""
    if os.environ.get(RELEASE, "0") == "1" or "release" in (config.option.markexpr or ""):
        return
    release = [item for item in items if item.get_closest_marker("release") is not None]
    if release:
        config.hook.pytest_deselected(items=release)
        items[:] = [item for item in items if item.get_closest_marker("release") is None]


def pytest_sessionstart(session):
    if os.environ.get(REQUIRE_FUSED, "0") != "1":
        return
    reason = _fused_cpu_reason()
    if reason:
        pytest.exit(f"{REQUIRE_FUSED}=1 and the fused CPU kernel is unavailable: {reason}",
                    returncode=pytest.ExitCode.USAGE_ERROR)
