"""Shared test setup: a throwaway cache directory for the whole session, and the `device` fixture.

The language suite runs once per device named in `TGC_TEST_DEVICES` (comma-separated, default "CPU"),
so the same tests check OPENCL and PYTHON later: `TGC_TEST_DEVICES=CPU,PYTHON pytest tests/test_lang_*.py`.
Every kernel built in the session is checked for out-of-bounds accesses (`TGC_VERIFY_BOUNDS`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# set at import time, before tgc reads them, so that no test ever touches the user's home
_CACHE_ROOT = tempfile.mkdtemp(prefix="tgc-tests-")
os.environ["TGC_CACHE_DIR"] = os.path.join(_CACHE_ROOT, "tgc")
os.environ["POCL_CACHE_DIR"] = os.path.join(_CACHE_ROOT, "pocl")
os.environ["XDG_CACHE_HOME"] = _CACHE_ROOT
# every kernel any test builds, for any device, goes through the bounds verifier (tgc/codegen/verify.py): a
# kernel that would touch memory outside a buffer fails its test even where the hardware forgives it
# (TGC_VERIFY_BOUNDS=0 in the environment turns it off, e.g. to measure its cost)
os.environ.setdefault("TGC_VERIFY_BOUNDS", "1")
atexit.register(shutil.rmtree, _CACHE_ROOT, ignore_errors=True)
# one directory for the whole session, xdist workers included (they inherit it from the process that made it):
# work done once per session and shared between workers, as the language suite's run (tests/suite_runs.py)
if not os.environ.get("TGC_TEST_SHARED_DIR"):
    os.environ["TGC_TEST_SHARED_DIR"] = tempfile.mkdtemp(prefix="tgc-tests-shared-")
    atexit.register(shutil.rmtree, os.environ["TGC_TEST_SHARED_DIR"], ignore_errors=True)

if os.environ.get("TGC_STANDIN_DIR"):  # CUDA through the CPU stand-in driver (tests/cuda_standin.py)
    import cuda_standin
    cuda_standin.install()

DEVICES = [d.strip() for d in os.environ.get("TGC_TEST_DEVICES", "CPU").split(",") if d.strip()]


@pytest.fixture(scope="session")
def remote_server():
    """A real `tgc serve` subprocess on loopback serving the CPU, for REMOTE in TGC_TEST_DEVICES."""
    from tgc.backends.remote.process import ServerProcess
    with ServerProcess("CPU") as server:
        old = os.environ.get("TGC_REMOTE")
        os.environ["TGC_REMOTE"] = server.address
        yield server
        if old is None:
            os.environ.pop("TGC_REMOTE", None)
        else:
            os.environ["TGC_REMOTE"] = old


@pytest.fixture(scope="session", params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """The device a language test runs on; one run of the test per entry of TGC_TEST_DEVICES.
    REMOTE runs against a real `tgc serve` subprocess serving the CPU. A device whose probe fails here (PoCL
    on a CPU its LLVM does not know, say) skips every test with the probe's reason, shown in pytest's summary."""
    from langkit import device_skip_reason
    why = device_skip_reason(request.param)  # once per device: a session fixture's skip is cached by pytest
    if why is not None:
        pytest.skip(why)
    if request.param.upper().startswith("REMOTE") and not os.environ.get("TGC_REMOTE"):
        request.getfixturevalue("remote_server")
    return request.param


@pytest.fixture
def known_bug(request: pytest.FixtureRequest, device: str):
    """`known_bug({"OPENCL"}, "reason")` marks the running test a strict xfail when it runs on one of those devices:
    a bug in that backend, listed for its owner; the mark fails loudly once the bug is fixed."""
    from tgc.backends import canonical

    def mark(devices: set[str], reason: str) -> None:
        if canonical(device)[0] in devices:
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    return mark
