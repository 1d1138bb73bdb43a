"""The offline bundle: what a bare GPU machine without a network needs to run the GPU check.

Two archives, made where there is a network (``scripts/tools/gpu_check.py --prepare-offline DIR``) and
carried to the GPU machine (``scripts/tools/gpu_check.sh --offline DIR``):

- ``wheels.tar.xz``: the wheels of everything the check installs beyond what the machine has
  (``OFFLINE_ROOTS`` and their requirements, minus ``ON_THE_MACHINE``), resolved for the target
  Python and platform (``TARGET_ENV``), each stored uncompressed inside so that xz compresses
  their contents;
- ``data-bin.tar.xz``: the binarised data and dictionaries the check's trainings read.

Each unpacker refuses an archive holding anything else.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile

from fourierformer_fairseq import FAIRSEQ_REQUIREMENT

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def requirements(section: str) -> list[str]:
    """requirements.txt's requirements in a section (the lines after the comment line that starts with
    ``# SECTION``, up to the next comment line), without their comments: the one list of the recipe,
    test and build dependencies, which setup.py's extras read too."""
    out, inside = [], False
    with open(os.path.join(REPO, "requirements.txt")) as fh:
        for line in fh:
            line = line.strip()
            if line.startswith("#"):
                inside = line.startswith(f"# {section}")
            elif inside and line:
                out.append(line.split("#")[0].strip())
    if not out:
        raise RuntimeError(f"requirements.txt has no section '# {section}'")
    return out


# Of requirements.txt, what the check does not use: the analysis' plots (scripts/tools/install.sh
# installs them where there is a network).
NOT_CARRIED = {"matplotlib"}
# What the check installs, for a CPython 3.12 manylinux x86-64 machine that already has torch,
# sacrebleu, sentencepiece and pytest (and what they require): the pinned fairseq, requirements.txt's
# recipe, test and build sections, and what the check itself needs beyond them (parallel tests,
# fairseq's build from its source).
OFFLINE_ROOTS = (FAIRSEQ_REQUIREMENT,
                 *(r for section in ("extra: recipes", "extra: test", "build") for r in requirements(section)
                   if re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].lower() not in NOT_CARRIED),
                 "pytest-xdist", "cython", "setuptools>=64", "wheel")
ON_THE_MACHINE = {  # never in the wheels folder: torch (a CUDA build is there) and what the image has
    "torch", "triton", "filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2", "markupsafe",
    "fsspec", "setuptools", "sacrebleu", "portalocker", "regex", "tabulate", "numpy", "colorama", "lxml",
    "sentencepiece", "pytest", "iniconfig", "packaging", "pluggy", "pygments",
}
OFFLINE_PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}

def log(msg: str) -> None:
    print(f"[offline_bundle {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wheel_requirements(path: str) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) of a wheel, from its METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8", "replace")
    head = text.split("\n\n", 1)[0]
    field = lambda k: [l.split(":", 1)[1].strip() for l in head.splitlines() if l.startswith(k + ":")]  # noqa: E731
    return field("Name")[0], field("Version")[0], field("Requires-Dist")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def needed(requirement: str):
    """The Requirement when it applies on the target machine (its marker, no extras), else None."""
    from packaging.requirements import Requirement

    req = Requirement(requirement)
    if req.marker is not None and not req.marker.evaluate(TARGET_ENV):
        return None
    return req


def verify_wheels(folder: str) -> list[str]:
    """Problems of a wheels folder: a requirement of a wheel in it that no wheel there satisfies
    and that is not on the machine already (ON_THE_MACHINE), a wheel torch, or a root missing."""
    from packaging.requirements import Requirement

    have = {}
    for path in glob.glob(os.path.join(folder, "*.whl")):
        name, version, requires = wheel_requirements(path)
        have[canonical(name)] = (version, requires)
    problems = [f"torch is in {folder} (the machine's CUDA build must be kept)"] if "torch" in have else []
    wanted = [Requirement(r) for r in OFFLINE_ROOTS]
    for version, requires in have.values():
        wanted += [r for r in map(needed, requires) if r is not None]
    for req in wanted:
        name = canonical(req.name)
        if name in ON_THE_MACHINE:
            continue
        if name not in have:
            problems.append(f"{req} is missing")
        elif req.specifier and not req.specifier.contains(have[name][0], prereleases=True):
            problems.append(f"{req} is not satisfied by {name} {have[name][0]}")
    return sorted(set(problems))


def folder_mib(folder: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs) / 2 ** 20


def prepare_wheels(folder: str) -> list[str]:
    """Downloads (pip download, binary wheels for CPython 3.12 manylinux x86-64, one package at a
    time without its dependencies) the closure of OFFLINE_ROOTS minus ON_THE_MACHINE into folder,
    building a wheel here (pip wheel) for a package that PyPI has as source only; returns problems."""
    from packaging.requirements import Requirement

    os.makedirs(folder, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    queue = [Requirement(r) for r in OFFLINE_ROOTS]
    done: set[str] = set()
    while queue:
        req = queue.pop(0)
        name = canonical(req.name)
        if name in ON_THE_MACHINE or name in done:
            continue
        done.add(name)
        spec = str(req.specifier) if req.specifier else ""
        present = [p for p in glob.glob(os.path.join(folder, "*.whl"))
                   if canonical(wheel_requirements(p)[0]) == name
                   and req.specifier.contains(wheel_requirements(p)[1], prereleases=True)]
        if present:  # downloaded by an earlier run
            queue += [r for r in map(needed, wheel_requirements(present[0])[2]) if r is not None]
            continue
        log(f"wheels: {name}{spec}")
        before = set(glob.glob(os.path.join(folder, "*.whl")))
        got = subprocess.run(pip + ["download", "--no-deps", "--only-binary=:all:", *OFFLINE_PLATFORM, "-d", folder,
                                    f"{name}{spec}"], capture_output=True, text=True)
        if got.returncode != 0:  # source only on PyPI: a pure-Python wheel built here
            got = subprocess.run(pip + ["wheel", "--no-deps", "-w", folder, f"{name}{spec}"], capture_output=True, text=True)
        new = sorted(set(glob.glob(os.path.join(folder, "*.whl"))) - before) or sorted(
            p for p in glob.glob(os.path.join(folder, "*.whl")) if canonical(os.path.basename(p).split("-")[0]) == name)
        if got.returncode != 0 or not new:
            return [f"{name}{spec}: {got.stderr.strip().splitlines()[-1] if got.stderr.strip() else 'no wheel'}"]
        _, _, requires = wheel_requirements(new[-1])
        queue += [r for r in map(needed, requires) if r is not None]
    return verify_wheels(folder)


def pack_wheels(folder: str, archive: str) -> None:
    """folder's wheels in one tar.xz, each stored uncompressed inside (xz then compresses their
    contents across the wheels, which packs smaller than the wheels' own deflate: the sizes in
    docs/records/gpu-runs.md); unpack_wheels gives back wheels pip installs (the same files, the same RECORD)."""
    part = archive + ".part"
    with tarfile.open(part, "w:xz", preset=6) as tar:
        for path in sorted(glob.glob(os.path.join(folder, "*.whl"))):
            stored = os.path.join(os.path.dirname(archive), ".stored.whl")
            with zipfile.ZipFile(path) as zin, zipfile.ZipFile(stored, "w", zipfile.ZIP_STORED) as zout:
                for info in zin.infolist():
                    zout.writestr(info, zin.read(info.filename), compress_type=zipfile.ZIP_STORED)
            tar.add(stored, arcname=os.path.basename(path))
            os.remove(stored)
    os.replace(part, archive)


def unpack_wheels(archive: str, folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or "/" in member.name or not member.name.endswith(".whl"):
                raise ValueError(f"{archive}: {member.name} is not a wheel")
            tar.extract(member, folder)
    return folder


def pack_data(data_bin: str, archive: str) -> None:
    """The binarised data and dictionaries the check reads, in one tar.xz (the prepare scripts'
    text/ and raw/ copies left out)."""
    part = archive + ".part"
    with tarfile.open(part, "w:xz", preset=6) as tar:
        for root, dirs, files in os.walk(data_bin):
            dirs[:] = sorted(d for d in dirs if d not in ("text", "raw"))
            for f in sorted(files):
                path = os.path.join(root, f)
                tar.add(path, arcname=os.path.join("data-bin", os.path.relpath(path, data_bin)), recursive=False)
    os.replace(part, archive)


def unpack_data(archive: str, folder: str) -> str:
    """Unpacks pack_data's archive into folder; returns folder/data-bin."""
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if not member.isfile() or parts[0] != "data-bin" or ".." in parts:
                raise ValueError(f"{archive}: {member.name} is not a data-bin file")
            tar.extract(member, folder)
    return os.path.join(folder, "data-bin")
