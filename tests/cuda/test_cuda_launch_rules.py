"""Rules of the CUDA launcher that are plain functions, through the extension on any machine.

The score cache of the float32 backward (csrc/cuda/score_cache.h): the pre-pass's scores are kept
for the main pass where their bytes fit a budget taken at each backward call, a quarter of the
device memory free then, or FOURIERFORMER_SCORE_CACHE_MB MiB where that is set. The launchers (the
GPU's, the host emulator's) call the same function as `_C.score_cache_budget`; the emulator's
check_score_cache_budget checks that they do (tests/cuda/emulation/run_emulated_check.py).
"""
import pytest

from fourierformer_fairseq.ops.extension import extension_status

_status = extension_status()
pytestmark = pytest.mark.skipif(not _status.loaded, reason=f"extension not loaded: {_status.reason}")
GiB, MiB = 1 << 30, 1 << 20


@pytest.fixture(scope="module")
def C():
    return _status.module


@pytest.mark.parametrize("free", [0, 1, 3, 4, 7, 100 * MiB + 3, 139 * GiB])
def test_budget_is_a_quarter_of_the_free_memory(C, free):
    assert C.score_cache_budget(free) == free // 4
    assert C.score_cache_budget(free, None) == C.score_cache_budget(free, "") == free // 4


def test_a_negative_free_memory_gives_no_budget(C):
    assert C.score_cache_budget(-1) == 0


@pytest.mark.parametrize("free", [0, 139 * GiB])
def test_the_setting_overrides_the_free_memory(C, free):
    assert C.score_cache_budget(free, "0") == 0
    assert C.score_cache_budget(free, "1") == MiB
    assert C.score_cache_budget(free, "256") == 256 * MiB


@pytest.mark.parametrize("setting", ["256MB", "-1", "1.5", " ", "x"])
def test_a_setting_that_is_not_a_whole_number_of_mib_is_refused(C, setting):
    with pytest.raises(ValueError, match="FOURIERFORMER_SCORE_CACHE_MB must be a whole number of MiB"):
        C.score_cache_budget(GiB, setting)


def test_cache_bytes_round_each_row_up_to_four_floats(C):
    assert C.score_cache_bytes(1, 1, 3, 5) == 3 * 8 * 4
    assert C.score_cache_bytes(2, 3, 7, 8) == 2 * 3 * 7 * 8 * 4
    assert C.score_cache_bytes(2, 3, 0, 8) == C.score_cache_bytes(2, 3, 7, 0) == 0


def test_n_4096_keeps_its_scores_where_a_quarter_of_the_free_memory_holds_them(C):
    # B H = 8, N = M = 4096: 512 MiB of scores, over the former fixed budget of 256 MiB; kept with
    # 2 GiB free or more (an idle H200 has 139 GiB), not with less
    need = C.score_cache_bytes(2, 4, 4096, 4096)
    assert need == 512 * MiB
    assert need <= C.score_cache_budget(139 * GiB)
    assert need <= C.score_cache_budget(2 * GiB)
    assert need > C.score_cache_budget(2 * GiB - 1)
    assert need > C.score_cache_budget(139 * GiB, "256")
