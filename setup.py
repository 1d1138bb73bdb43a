"""Build of fourierformer-fairseq and its fused-kernel extension ``fourierformer_fairseq._C``.

    pip install --no-build-isolation -e .

compiles the C++ CPU kernels with ninja. The CUDA kernels are compiled too when torch
is a CUDA build and nvcc is found (CUDA_HOME), or when FORCE_CUDA=1 is set; no GPU is
needed to compile. TORCH_CUDA_ARCH_LIST picks the architectures (default "8.0;9.0").
FOURIERFORMER_NO_EXTENSION=1 skips the extension (the package then runs the reference).
"""
import glob
import os
import re

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def extension_modules():
    if os.environ.get("FOURIERFORMER_NO_EXTENSION", "0") == "1":
        return [], {}
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as e:
        raise RuntimeError(
            "fourierformer-fairseq compiles against the installed torch: install torch first, then "
            "`pip install --no-build-isolation -e .` (or set FOURIERFORMER_NO_EXTENSION=1 to skip the kernels)"
        ) from e

    force_cuda = os.environ.get("FORCE_CUDA", "0") == "1"
    with_cuda = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if force_cuda and not with_cuda:
        raise RuntimeError(
            "FORCE_CUDA=1 needs a CUDA build of torch (torch.version.cuda is "
            f"{torch.version.cuda}) and nvcc (CUDA_HOME is {cpp_extension.CUDA_HOME})"
        )
    sources = [os.path.relpath(p, ROOT) for p in sorted(glob.glob(os.path.join(ROOT, "csrc", "**", "*.cpp"), recursive=True))]
    macros = [("FF_TORCH_VERSION", f'"{torch.__version__}"')]
    cxx = ["-O3", "-fopenmp", "-Wno-psabi"]  # the C++ standard is the one torch asks for
    extra = {"cxx": cxx}
    if with_cuda:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
        sources += [os.path.relpath(p, ROOT) for p in sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))]
        macros += [("FF_CUDA_VERSION", f'"{torch.version.cuda}"')]
        extra["nvcc"] = ["-O3", "-lineinfo"]
        builder = cpp_extension.CUDAExtension
    else:
        builder = cpp_extension.CppExtension
    ext = builder(
        name="fourierformer_fairseq._C",
        sources=sources,
        include_dirs=[os.path.join(ROOT, "csrc")],
        define_macros=macros,
        extra_compile_args=extra,
        extra_link_args=["-fopenmp"],
        py_limited_api=False,
    )
    return [ext], {"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)}


def package_constant(name: str) -> str:
    """A string constant of fourierformer_fairseq/__init__.py (``NAME = "..."``), read without importing it."""
    with open(os.path.join(ROOT, "fourierformer_fairseq", "__init__.py")) as fh:
        return re.search(rf'^{name} = "([^"]+)"', fh.read(), re.M).group(1)


def requirements_section(extra: str) -> list:
    """The requirements of one extra: requirements.txt's lines after "# extra: EXTRA", up to the next
    section comment, without their comments (the list is kept there, once)."""
    out, inside = [], False
    with open(os.path.join(ROOT, "requirements.txt")) as fh:
        for line in fh:
            line = line.strip()
            if line.startswith("#"):
                inside = line == f"# extra: {extra}"
            elif inside and line:
                out.append(line.split("#")[0].strip())
    if not out:
        raise RuntimeError(f"requirements.txt has no section '# extra: {extra}'")
    return out


def version() -> str:
    """The one version string: ``__version__`` in fourierformer_fairseq/__init__.py."""
    return package_constant("__version__")


ext_modules, cmdclass = extension_modules()

setup(
    name="fourierformer-fairseq",
    version=version(),
    description="FourierFormer (Fourier integral attention) for fairseq, with fused CPU and CUDA kernels",
    packages=find_packages(include=["fourierformer_fairseq", "fourierformer_fairseq.*"]),
    python_requires=">=3.9",
    license="MIT",
    # the op and the modules need torch only; fairseq and the recipes' tools are extras
    install_requires=["torch>=2.4"],
    extras_require={
        "fairseq": [package_constant("FAIRSEQ_REQUIREMENT")],  # the one pin
        "recipes": requirements_section("recipes"),  # the list is requirements.txt's
        "test": requirements_section("test"),
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    zip_safe=False,
)
