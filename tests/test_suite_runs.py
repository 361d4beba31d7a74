"""tests/suite_runs.py: each part of the session's language-suite run runs once, and a test whose part another
process is running runs the parts no one has started before it waits (the subprocess run itself is replaced by a
recorder here; tests/test_suite_compiles.py and tests/test_package.py use the real one)."""

from __future__ import annotations

import fcntl
import json
import threading
import time

import pytest
import suite_runs


@pytest.fixture
def runs(tmp_path, monkeypatch) -> list[int]:
    monkeypatch.setenv("TGC_TEST_SHARED_DIR", str(tmp_path))
    ran: list[int] = []

    def fake_run(out, part, parts):
        ran.append(part)
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps({"returncode": 0, "targets": [], "out": f"part {part}"}))

    monkeypatch.setattr(suite_runs, "_run", fake_run)
    return ran


def test_each_part_runs_once_and_later_callers_read_its_result(runs):
    out, result = suite_runs.language_suite(1, 3)
    assert result["out"] == "part 1" and out.name == "language-suite-1-of-3"
    assert suite_runs.language_suite(1, 3)[1]["out"] == "part 1"
    assert [r["out"] for _, r in suite_runs.language_suite_all(3)] == ["part 0", "part 1", "part 2"]
    assert runs == [1, 0, 2]


def test_a_part_running_elsewhere_is_waited_for_after_the_free_parts_ran(runs, tmp_path):
    lock = open(tmp_path / "language-suite-0-of-3.lock", "a+")  # another process running part 0
    fcntl.flock(lock, fcntl.LOCK_EX)
    done: list = []
    caller = threading.Thread(target=lambda: done.append(suite_runs.language_suite(0, 3)))
    caller.start()
    deadline = time.monotonic() + 30
    while runs != [1, 2] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runs == [1, 2] and not done  # the free parts ran; part 0 is still awaited
    out = tmp_path / "language-suite-0-of-3"  # the other process finishes part 0
    out.mkdir()
    (out / "result.json").write_text(json.dumps({"returncode": 0, "targets": [], "out": "elsewhere"}))
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()
    caller.join(30)
    assert done and done[0][1]["out"] == "elsewhere" and runs == [1, 2]  # read, not run again


# --- the session's one compile cache (tests/session_cache.py) and the order tests start in (tests/conftest.py)


def test_a_pytest_process_of_the_session_uses_the_sessions_compile_cache():
    """The language suite's subprocess run (and an xdist worker) loads conftest.py with the session's
    TGC_TEST_SHARED_DIR inherited: it compiles into the same cache as this process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from session_cache import session_cache_dir

    assert os.environ["TGC_CACHE_DIR"] == session_cache_dir()
    assert session_cache_dir().startswith(os.environ["TGC_TEST_SHARED_DIR"])
    tests = Path(__file__).parent
    env = {k: v for k, v in os.environ.items() if k not in ("TGC_CACHE_DIR", "TGC_STANDIN_DIR")}
    r = subprocess.run([sys.executable, "-c", "import os, conftest; print(os.environ['TGC_CACHE_DIR'])"],
                       cwd=tests, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == session_cache_dir()


def test_cuda_stand_in_processes_get_a_cache_of_their_own():
    """A cubin compiled without the stand-in has no host build for it to launch: stand-in processes never read
    the session's shared cache, but a cache the caller chose stays theirs."""
    import cuda_standin
    from session_cache import session_cache_dir

    assert cuda_standin.env()["TGC_CACHE_DIR"] == session_cache_dir(standin=True) != session_cache_dir()
    assert cuda_standin.env(TGC_CACHE_DIR="/elsewhere")["TGC_CACHE_DIR"] == "/elsewhere"
    assert cuda_standin.env({"TGC_CACHE_DIR": "/mine"})["TGC_CACHE_DIR"] == "/mine"


def test_every_test_named_to_start_first_exists():
    """conftest.LONGEST_FIRST names tests by node id: a renamed or removed test would silently fall back to its
    place in file order (the end of the run, for the longest ones)."""
    import re
    from pathlib import Path

    import conftest

    root = Path(__file__).parent.parent
    missing = []
    for prefix in conftest.LONGEST_FIRST:
        path, _, name = prefix.partition("::")
        func = re.split(r"[\[]", name)[0]
        source = (root / path).read_text() if (root / path).exists() else ""
        if not re.search(rf"^def {re.escape(func)}\w*\(", source, re.M):
            missing.append(prefix)
    assert not missing, missing
    assert conftest._start_rank(conftest.LONGEST_FIRST[2] + "[x]") == 2
    assert conftest._start_rank("tests/test_alu.py::test_anything") == len(conftest.LONGEST_FIRST)
