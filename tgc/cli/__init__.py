"""The `tgc` command line: a thin shell over the Python API (`tgc/api.py`).

`main.py` defines the click commands; the helpers they use (input files, output files, `--check`,
bench/beam reports) live in the sibling modules and are imported only by the command that needs them,
so that start-up stays fast.

A `tgc` process sets `OPENBLAS_THREAD_TIMEOUT` (unless the environment gives it) before anything imports
numpy: numpy's OpenBLAS starts its threads when it loads, and by default each spins about 2^28 cycles
(~0.1 s) waiting for work before it sleeps, work tgc's kernels never give it (they run on tgc's own
threads). That spin took ~0.06 s of CPU from every `tgc` process (a core of a 2-core machine for most of
a warm run) and the process waited for it at exit. 2^20 cycles (under a millisecond) still keeps the
threads awake between the back-to-back BLAS calls of a `--check` reference.
"""

import os

OPENBLAS_THREAD_TIMEOUT = "20"  # log2 of the cycles an idle OpenBLAS thread spins before it sleeps (4..30)

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_THREAD_TIMEOUT)
