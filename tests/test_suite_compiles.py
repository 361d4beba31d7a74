"""Every kernel of the language suite compiles to a cubin with NVRTC and type-checks as Metal.

The suite runs in a subprocess with the `compile_only` plugin (see tests/compile_only.py), which compiles
each program for the target and lets the CPU answer.
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


def _run_suite(target: str, tmp_path) -> list[dict]:
    files = sorted(glob.glob(str(ROOT / "tests" / "test_lang_*.py")))
    report = tmp_path / f"{target}.jsonl"
    env = {**os.environ, "TGC_TEST_DEVICES": "CPU", "TGC_COMPILE_ONLY": target, "TGC_COMPILE_ONLY_REPORT": str(report),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "compile_only", "-p", "no:cacheprovider",
                           "-p", "no:xdist", *files], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    if not report.exists():
        pytest.fail(f"the language suite produced no report:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    assert len(rows) > 300, "the language suite ran too few programs"
    return rows


def _fail_on_errors(rows: list[dict], target: str) -> None:
    bad = [r for r in rows if r["errors"]]
    assert not bad, f"{len(bad)} programs failed to compile for {target}:\n\n" + "\n\n".join(
        f"{r['test']}\n{r['src']}\n" + "\n".join(r["errors"][:3]) for r in bad[:8])


@pytest.mark.slow
def test_every_language_suite_kernel_compiles_to_a_cubin(tmp_path):
    from tgc.backends.cuda import nvrtc_error
    if nvrtc_error():
        pytest.skip(nvrtc_error())
    rows = _run_suite("CUDA", tmp_path)
    _fail_on_errors(rows, "CUDA")
    kernels = sum(r["kernels"] for r in rows)
    assert kernels > 500 and sum(r["binaries"] for r in rows) == kernels  # every kernel has its cubin


@pytest.mark.slow
def test_every_language_suite_kernel_type_checks_as_metal(tmp_path):
    from tgc.backends.metal import libclang_error
    if libclang_error():
        pytest.skip(libclang_error())
    rows = _run_suite("METAL", tmp_path)
    _fail_on_errors(rows, "METAL")
    assert sum(r["kernels"] for r in rows) > 500
