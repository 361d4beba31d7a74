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
