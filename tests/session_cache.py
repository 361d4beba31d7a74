"""Where the test session's tgc compile cache lives (tests/conftest.py sets `TGC_CACHE_DIR` to it).

One cache for the whole session: the xdist workers, the language suite's subprocess run (tests/suite_runs.py),
the `tgc serve` processes of REMOTE tests and the CLI subprocesses tests start all inherit
`TGC_TEST_SHARED_DIR` (made once by the first process, removed by it at exit), so a kernel compiled by any of
them is a cache hit for the others. tgc.cache is made for several processes filling one cache at once.

Processes on the CUDA stand-in (tests/cuda_standin.py) get a cache of their own, shared only between them: the
stand-in launches a host build that its NVRTC compile wrapper writes, so a cubin must never come from a process
that compiled it without the stand-in (tests/compile_only.py compiles the same kernels for sm_90).
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def session_cache_dir(standin: bool = False, env: Mapping[str, str] | None = None) -> str:
    """The session's tgc cache directory (the stand-in processes' own where `standin`), from `env` (default
    os.environ), whose `TGC_TEST_SHARED_DIR` tests/conftest.py sets."""
    root = (os.environ if env is None else env).get("TGC_TEST_SHARED_DIR")
    if not root:
        raise RuntimeError("TGC_TEST_SHARED_DIR is not set: tests/conftest.py sets it")
    return os.path.join(root, "tgc-cache-standin" if standin else "tgc-cache")
