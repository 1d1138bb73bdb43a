"""The CPU kernel variants a test run can force with FOURIERFORMER_CPU_ISA, declared once.

``REQUESTED_ISA``: the variant this process was asked to use (None in the parent run).
``BEST_ISA``: the variant the extension picked for this process (None without the extension).
``OTHER_ISAS``: the narrower variants this CPU can run besides the best one, which every test
uses by default; the variant tests re-run their selection under each in a subprocess (the best
one is left out: every other test already runs it).
``variant_params()``: OTHER_ISAS as pytest parameters, plus each variant this CPU cannot run, as
a parameter that is skipped with the reason (e.g. the avx512 variant, with its own assembly in
csrc/cpu/kernel_avx512.cpp and sinc_tables.inc, on an AVX2-only host): a run on such a host
says in its skip list which variant it did not test.
"""
import os

import pytest


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []


def _loaded_isa():
    from fourierformer_fairseq.ops.extension import extension_status

    status = extension_status()
    return status.build.get("cpu_isa") if status.loaded else None


# the CPU flags each variant needs (as csrc/cpu/isa_dispatch.cpp checks them), widest first
VARIANT_FLAGS = (
    ("avx512", ("avx512f", "avx512dq", "avx512vl", "avx512bw")),
    ("avx2", ("avx2", "fma")),
    ("generic", ()),
)

REQUESTED_ISA = os.environ.get("FOURIERFORMER_CPU_ISA")
BEST_ISA = _loaded_isa()
OTHER_ISAS = [
    isa for isa, flags in VARIANT_FLAGS
    if all(f in cpu_flags() for f in flags) and isa != BEST_ISA
]
MISSING_ISAS = {
    isa: [f for f in flags if f not in cpu_flags()] for isa, flags in VARIANT_FLAGS
    if not all(f in cpu_flags() for f in flags)
}


def variant_params():
    return [pytest.param(isa, id=isa) for isa in OTHER_ISAS] + [
        pytest.param(isa, id=isa, marks=pytest.mark.skip(
            reason=f"the {isa} CPU kernel variant is NOT tested on this host: its CPU lacks {', '.join(missing)} "
                   f"(run the op tests and the fuzz on a host that has them: python -m pytest tests/ops/test_op_fuzz.py "
                   f"tests/ops/test_fourier_attention_op.py tests/ops/test_normaliser_eps.py, there the default variant)"))
        for isa, missing in MISSING_ISAS.items()
    ]
