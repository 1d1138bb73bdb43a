"""The CPU kernel variants a test run can force with FOURIERFORMER_CPU_ISA, declared once.

``REQUESTED_ISA``: the variant this process was asked to use (None in the parent run).
``BEST_ISA``: the variant the extension picked for this process (None without the extension).
``OTHER_ISAS``: the narrower variants this CPU can run besides the best one, which every test
uses by default; the variant tests re-run their selection under each in a subprocess (the best
one is left out: every other test already runs it).
"""
import os


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


REQUESTED_ISA = os.environ.get("FOURIERFORMER_CPU_ISA")
BEST_ISA = _loaded_isa()
OTHER_ISAS = [
    isa for isa, flags in (("avx2", ("avx2", "fma")), ("generic", ()))
    if all(f in cpu_flags() for f in flags) and isa != BEST_ISA
]
