"""Every kernel of the language suite compiles to a cubin with NVRTC, type-checks as Metal, and type-checks as
OpenCL C 1.2, on every machine, whether or not it has those devices.

The suite runs once, in a subprocess with the `compile_only` plugin (see tests/compile_only.py), which compiles
each program for every target and lets the CPU answer.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _targets() -> tuple[list[str], dict[str, str]]:
    """The targets this machine can check, and why each other one is skipped."""
    from tgc.backends.clang_lint import libclang_error
    from tgc.backends.cuda import nvrtc_error
    why = {"CUDA": nvrtc_error(), "METAL": libclang_error(), "OPENCL": libclang_error()}
    return [t for t, w in why.items() if w is None], {t: w for t, w in why.items() if w is not None}


def _suite_rows(targets: list[str], tmp_path, part: int = 0, parts: int = 1) -> dict[str, list[dict]]:
    files = sorted(glob.glob(str(ROOT / "tests" / "test_lang_*.py")))[part::parts]
    report = tmp_path / "report.jsonl"
    env = {**os.environ, "TGC_TEST_DEVICES": "CPU", "TGC_COMPILE_ONLY": ",".join(targets),
           "TGC_COMPILE_ONLY_REPORT": str(report),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "compile_only", "-p", "no:cacheprovider",
                           "-p", "no:xdist", *files], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    if not report.exists():
        pytest.fail(f"the language suite produced no report:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
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


PARTS = 2  # the suite's files in two halves, one test each, so that two xdist workers share the work


@pytest.mark.slow
@pytest.mark.parametrize("part", range(PARTS))
def test_every_language_suite_kernel_compiles_for_every_gpu_target(tmp_path, part):
    """One run of (half of) the suite in a subprocess: CUDA cubins, METAL and OPENCL type-checks, for every target
    this machine can check (the test below says which it cannot)."""
    targets, _ = _targets()
    if not targets:
        pytest.skip("no GPU target can be checked here")
    rows = _suite_rows(targets, tmp_path, part, PARTS)
    for target in targets:
        _check(target, rows[target], PARTS)


@pytest.mark.parametrize("target", ["CUDA", "METAL", "OPENCL"])
def test_gpu_target_can_be_checked_here(target):
    _, skipped = _targets()
    if target in skipped:
        pytest.skip(f"{target} kernels cannot be checked here: {skipped[target]}")
