"""Every kernel of the language suite compiles to a cubin with NVRTC, type-checks as Metal, and type-checks as
OpenCL C 1.2, on every machine, whether or not it has those devices.

The suite runs once per session, in a subprocess with the `compile_only` plugin (see tests/compile_only.py),
which compiles each program for every target and lets the CPU answer; the same run packages every program for
tests/test_package.py (tests/suite_runs.py runs it, once, for whichever test asks first).
"""

from __future__ import annotations

import json

import pytest
from suite_runs import PARTS, gpu_targets, language_suite


def _suite_rows(targets: list[str], part: int = 0, parts: int = 1) -> dict[str, list[dict]]:
    out, result = language_suite(part, parts)
    assert result["returncode"] != -1, result["out"]  # timed out: its report is partial (inner test failures are
    report = out / "report.jsonl"  # the language suite's own to report, and tests/test_package.py's)
    if not report.exists():
        pytest.fail(f"the language suite produced no report:\n{result['out']}")
    assert result["targets"] == targets
    rows: dict[str, list[dict]] = {t: [] for t in targets}
    for line in report.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["target"]].append(row)
    return rows


def _check(target: str, rows: list[dict], parts: int = 1) -> None:
    assert len(rows) > 300 // parts, f"the language suite ran too few programs for {target}"
    bad = [r for r in rows if r["errors"]]
    assert not bad, f"{len(bad)} programs failed to compile for {target}:\n\n" + "\n\n".join(
        f"{r['test']}\n{r['src']}\n" + "\n".join(r["errors"][:3]) for r in bad[:8])
    kernels = sum(r["kernels"] for r in rows)
    assert kernels > 500 // parts, f"too few {target} kernels"
    if target == "CUDA":
        assert sum(r["binaries"] for r in rows) == kernels  # every kernel has its cubin
    if target == "OPENCL":
        assert sum(r["binaries"] for r in rows) == 0  # type-checked by clang, never built by a driver here


@pytest.mark.slow
@pytest.mark.parametrize("part", range(PARTS))
def test_every_language_suite_kernel_compiles_for_every_gpu_target(part):
    """One run of (half of) the suite in a subprocess: CUDA cubins, METAL and OPENCL type-checks, for every target
    this machine can check (the test below says which it cannot)."""
    targets, _ = gpu_targets()
    if not targets:
        pytest.skip("no GPU target can be checked here")
    rows = _suite_rows(targets, part, PARTS)
    for target in targets:
        _check(target, rows[target], PARTS)


@pytest.mark.parametrize("target", ["CUDA", "METAL", "OPENCL"])
def test_gpu_target_can_be_checked_here(target):
    _, skipped = gpu_targets()
    if target in skipped:
        pytest.skip(f"{target} kernels cannot be checked here: {skipped[target]}")
