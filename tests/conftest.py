"""Shared test setup: a throwaway cache directory for the whole session, and the `device` fixture.

The language suite runs once per device named in `TGC_TEST_DEVICES` (comma-separated, default "CPU"),
so the same tests check OPENCL and PYTHON later: `TGC_TEST_DEVICES=CPU,PYTHON pytest tests/test_lang_*.py`.
Every kernel built in the session is checked for out-of-bounds accesses (`TGC_VERIFY_BOUNDS`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

import pytest
from session_cache import session_cache_dir

# pytest keeps each test module's assertion-rewritten code in tests/__pycache__ only where bytecode may be written;
# this machine sets PYTHONDONTWRITEBYTECODE=1, so every process (each xdist worker, each pytest subprocess, every
# run) rewrote and compiled every test module again: ~4.8 s of the ~8.5 s of CPU that collecting the suite takes.
# Allowed in this process (and so in the pytest subprocesses, which import this file); tgc's own modules are
# byte-compiled by `make bytecode`. Other subprocesses keep the environment's setting.
sys.dont_write_bytecode = False
# set at import time, before tgc reads them, so that no test ever touches the user's home
_CACHE_ROOT = tempfile.mkdtemp(prefix="tgc-tests-")
os.environ["POCL_CACHE_DIR"] = os.path.join(_CACHE_ROOT, "pocl")
# PoCL builds a kernel's generic work-group function when tgc asks for its binary, then, by default, compiles
# another one specialized to each launch's sizes at its first launch: ~0.2 s a kernel, a quarter of the OPENCL
# language suite's time (each test's kernels are new). Tests launch the generic one (the same threads and
# results; only PoCL's speed differs). Set before PoCL loads; inherited by every subprocess.
os.environ.setdefault("POCL_WORK_GROUP_SPECIALIZATION", "0")
os.environ["XDG_CACHE_HOME"] = _CACHE_ROOT
# every kernel any test builds, for any device, goes through the bounds verifier (tgc/codegen/verify.py): a
# kernel that would touch memory outside a buffer fails its test even where the hardware forgives it
# (TGC_VERIFY_BOUNDS=0 in the environment turns it off, e.g. to measure its cost)
os.environ.setdefault("TGC_VERIFY_BOUNDS", "1")
# the verifier's index arrays (up to 32 MiB each) are allocated and freed thousands of times: glibc gives freed
# memory back to the kernel and takes fresh zeroed pages for the next array (the CUDA stand-in's symbolic test
# spent 28 of its 33 s in the kernel, zeroing pages). Keeping freed memory in the heap reuses it. Read by glibc at
# a process's start, so these reach the xdist workers and every subprocess (ignored by other C libraries).
os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 34))
os.environ.setdefault("MALLOC_TOP_PAD_", str(1 << 28))
atexit.register(shutil.rmtree, _CACHE_ROOT, ignore_errors=True)
# one directory for the whole session, xdist workers included (they inherit it from the process that made it):
# work done once per session and shared between workers, as the language suite's run (tests/suite_runs.py)
if not os.environ.get("TGC_TEST_SHARED_DIR"):
    os.environ["TGC_TEST_SHARED_DIR"] = tempfile.mkdtemp(prefix="tgc-tests-shared-")
    atexit.register(shutil.rmtree, os.environ["TGC_TEST_SHARED_DIR"], ignore_errors=True)
# tgc's compile cache is the session's too (`session_cache_dir`): a kernel compiled by one worker, by the language
# suite's subprocess run or by a `tgc serve` of a REMOTE test is a hit for every other process of the session
# (tgc.cache is made for several processes at once). Processes on the CUDA stand-in keep a cache of their own.
os.environ["TGC_CACHE_DIR"] = session_cache_dir(standin=bool(os.environ.get("TGC_STANDIN_DIR")))

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


# --- the order tests start in, for two xdist workers that end together

# The suite's longest tests (seconds of one worker in full `make test` runs), started first, in this order (node id
# prefixes; every other test keeps its place after them). Begun last, they kept one worker busy for minutes after
# the other had finished (the language suite's run and the symbolic suite came last in file order). With
# `maxschedchunk` 1 (below) xdist sends each worker two tests to begin with, then one more each time one ends:
# the first two (which share a module fixture of ~20 s) go to one worker, the next two to the other; the halves of
# the language suite's run (tests/suite_runs.py) go one to each worker and run at once, and the packaged-suite
# check that needs both comes after them. The two tests of 2 GiB buffers are kept apart.
LONGEST_FIRST = (
    "tests/test_check_tolerance.py::test_transformer_block_b8_t256_c512_tgc_result_passes_the_check",  # ~25 s
    "tests/test_check_tolerance.py::test_transformer_block_b8_t256_c512_wrong_index_still_fails",
    "tests/test_suite_compiles.py::test_every_language_suite_kernel_compiles_for_every_gpu_target[0]",  # ~60 s
    "tests/test_onnx_nodes.py::test_onnx_node_conformance",  # ~77 s
    "tests/test_suite_compiles.py::test_every_language_suite_kernel_compiles_for_every_gpu_target[1]",  # ~65 s
    "tests/test_symbolic_lang.py::test_suite_programs_at_three_sizes",  # ~60 s
    "tests/test_package.py::test_every_language_suite_program_runs_from_its_package",  # both halves' packages
    "tests/test_package_symbolic.py::test_every_example_program_packaged_once_runs_at_three_sizes_in_a_fresh_process",
    "tests/test_index_width.py::test_argmin_argmax_past_2_31_elements_on_the_cpu",  # ~13 s, 2 GiB
    "tests/test_cuda_standin.py::test_symbolic_kernels_run_on_cuda_at_every_size",  # ~37 s
    "tests/test_cluster.py::test_beam_on_a_cluster_survives_a_node_killed_mid_search",  # 7-22 s
    "tests/test_bench_corpus.py::test_quick_corpus_and_compile_tables",  # ~15 s
    "tests/test_attention_fused.py::test_fused_attention_every_ragged_length_matches_numpy",  # ~13 + 8 s
    "tests/test_index_width.py::test_u8_buffer_past_2_31_elements_on_the_cpu",  # ~12 s, 2 GiB
    "tests/test_cuda_standin.py::test_language_subset_runs_on_cuda_through_the_stand_in",  # ~10 s
    "tests/test_onnx_light.py::test_light_model_lowest_cost",  # 6-13 s each
    "tests/test_attention_beam.py::test_every_choice_matches_numpy",  # 6-12 s each
    "tests/test_progcache.py::test_a_warm_tgc_bench_keeps_the_identity_a_baseline_compares",  # ~9 s
    "tests/test_symbolic_sizes.py::test_symbolic_launches_count_the_work_of_their_sizes",  # ~9 s
    "tests/test_pipeline.py::test_beam_progress_on_run_and_bench_at_a_terminal",  # ~9 s
    "tests/test_pipeline.py::test_wide_register_tile_matches_numpy[2052-512-2048]",  # ~8 s
)


def _start_rank(nodeid: str) -> int:
    for rank, prefix in enumerate(LONGEST_FIRST):
        if nodeid.startswith(prefix):
            return rank
    return len(LONGEST_FIRST)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering (tests grouped by `device`)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _start_rank(item.nodeid))  # stable: the others keep their order


def pytest_configure(config: pytest.Config) -> None:
    # xdist hands out tests one at a time (it keeps one queued per worker), so the longest, first in the
    # collection, spread over both workers; by default it sends the first quarter of the collection in two blocks.
    # An explicit --maxschedchunk wins.
    if config.pluginmanager.hasplugin("xdist") and config.getoption("maxschedchunk", None) is None:
        config.option.maxschedchunk = 1


@pytest.fixture
def python_sigint():
    """SIGINT as Python's own Ctrl-C handler for one test (restored after): an xdist worker ignores SIGINT (execnet
    sets it so), and a test that interrupts itself, or a server child that must stop on Ctrl-C, needs it handled."""
    import signal
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture
def whole_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """A memory target no packed copy in a small test program exceeds: a test of the packing or tiling decisions
    for one matmul over a large weight (whose copy alone is over 1.5x its inputs + outputs) sees the copy whole,
    not in column parts (`tgc.engine.schedule.split_large_copies`, tests/test_copy_parts.py)."""
    from tgc.engine import schedule
    monkeypatch.setattr(schedule, "MEMORY_LIMIT", 100.0)
