#!/usr/bin/env python
"""Static reading of the sm_90 SASS of the float32 CUDA kernels, without a GPU and without torch: the
command line of the package beside this file, sass_report/ (its method: ``--help``, or
sass_report/__init__.py).

    python scripts/benchmarks/cuda_sass_report.py                      # head dims 16 and 128
    python scripts/benchmarks/cuda_sass_report.py --head-dims 16,64,128
    python scripts/benchmarks/cuda_sass_report.py --json > sass.json   # machine-readable
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sass_report.report import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
