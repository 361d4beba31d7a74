"""A pytest plugin for tools/gpu_check.py: every test's outcome appended, as it happens, to a JSON-lines file.

`TGC_GPU_CHECK_RESULTS=FILE pytest -p gpu_check_pytest ...` writes one line per test (`test`, `outcome`:
passed, failed, skipped, xfailed, xpassed or error, `seconds`, and the failure's text for a failure), so a
part of the check that runs out of time or crashes still says what ran. Under pytest-xdist only the controller
writes (the workers' reports reach it). `TGC_GPU_CHECK_SAMPLE=N` keeps every N-th collected test (a quick
run's deterministic sample; each xdist worker collects the same list, so they agree).
"""

from __future__ import annotations

import json
import os

import pytest

_config: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _config.append(config)


def _write(row: dict) -> None:
    path = os.environ.get("TGC_GPU_CHECK_RESULTS")
    if not path or (_config and hasattr(_config[0], "workerinput")):  # an xdist worker: the controller writes
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    every = int(os.environ.get("TGC_GPU_CHECK_SAMPLE", "1") or 1)
    if every > 1:
        kept = items[::every]
        config.hook.pytest_deselected(items=[it for i, it in enumerate(items) if i % every])
        items[:] = kept


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write({"test": report.nodeid, "outcome": "error", "when": "collect",
                "message": str(report.longreprtext)[-1500:]})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        outcome = ("xfailed" if report.skipped else "xpassed") if hasattr(report, "wasxfail") else report.outcome
    elif report.failed:
        outcome = "error"  # in a fixture's set-up or tear-down
    elif report.skipped and report.when == "setup":
        outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    else:
        return
    row = {"test": report.nodeid, "outcome": outcome, "when": report.when, "seconds": round(report.duration, 3)}
    if report.failed:
        row["message"] = str(report.longreprtext)[-1500:]
    elif report.skipped and isinstance(report.longrepr, tuple):
        row["message"] = str(report.longrepr[2])[:300]
    _write(row)
