"""The language suite run once per test session in a subprocess, shared by the tests that check it whole.

Two checks need every program the language suite (tests/test_lang_*.py) runs, on the CPU, in a process of their
own: tests/test_suite_compiles.py (each kernel compiled for the GPU targets, plugin tests/compile_only.py) and
tests/test_package.py (each program packaged, then run from its package, plugin tests/package_suite.py). Both
plugins ride on one run of the suite: `language_suite(part, parts)` runs one part of the suite's files with both,
once per session, and gives the directory holding the compile report (`report.jsonl`) and the packages.

Sharing: the directory is under `TGC_TEST_SHARED_DIR` (made by tests/conftest.py in the first process, so that
xdist workers and the controller agree on it), one per part, guarded by an exclusive `fcntl` lock: the first test
to ask for a part runs it; a test that finds its part running elsewhere runs the parts no one has started, then
waits; every later test reads the finished result. A part runs once whatever the number of workers; its outcome
(the subprocess' exit status and output tail) is in `result.json`.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent
PARTS = 2  # the suite's files in two parts, so that two xdist workers share the work
TIMEOUT_S = 3600  # (a part takes ~60 s of one core; the 2-core machine, shared, has taken 30 min)


def gpu_targets() -> tuple[list[str], dict[str, str]]:
    """The GPU targets this machine can check (CUDA cubins with NVRTC, METAL and OPENCL C type-checked by
    libclang), and why each other one is skipped."""
    from tgc.backends.clang_lint import libclang_error
    from tgc.backends.cuda import nvrtc_error
    why = {"CUDA": nvrtc_error(), "METAL": libclang_error(), "OPENCL": libclang_error()}
    return [t for t, w in why.items() if w is None], {t: w for t, w in why.items() if w is not None}


def suite_files(part: int, parts: int = PARTS) -> list[str]:
    return sorted(glob.glob(str(ROOT / "tests" / "test_lang_*.py")))[part::parts]


def _shared_dir() -> pathlib.Path:
    root = os.environ.get("TGC_TEST_SHARED_DIR")
    if not root:
        raise RuntimeError("TGC_TEST_SHARED_DIR is not set: tests/conftest.py sets it")
    return pathlib.Path(root)


@contextlib.contextmanager
def _locked(path: pathlib.Path, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive lock on `path` (True), or, with wait=False and another process holding it, yield False."""
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _part_dir(part: int, parts: int) -> pathlib.Path:
    return _shared_dir() / f"language-suite-{part}-of-{parts}"


def _run_if_free(part: int, parts: int) -> bool:
    """Run the part unless it is done; False (at once) where another process holds it (running it now)."""
    out = _part_dir(part, parts)
    with _locked(out.with_suffix(".lock"), wait=False) as free:
        if free and not (out / "result.json").exists():
            _run(out, part, parts)
    return free


def language_suite(part: int, parts: int = PARTS) -> tuple[pathlib.Path, dict]:
    """(the directory of this part's run, its result: `returncode`, `targets`, `out` (the output's tail)).
    Runs the part unless a process of this session ran it already. Where another process is running it now,
    first runs the parts no one has started (work the session needs anyway, so no worker waits idle), then
    waits for it."""
    if not _run_if_free(part, parts):
        for other in range(parts):
            if other != part:
                _run_if_free(other, parts)
    out = _part_dir(part, parts)
    with _locked(out.with_suffix(".lock")):
        if not (out / "result.json").exists():  # (the process running it died before writing its result)
            _run(out, part, parts)
    return out, json.loads((out / "result.json").read_text())


def language_suite_all(parts: int = PARTS) -> list[tuple[pathlib.Path, dict]]:
    """Every part's `language_suite`."""
    return [language_suite(part, parts) for part in range(parts)]


def _run(out: pathlib.Path, part: int, parts: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    targets, _ = gpu_targets()
    env = {**os.environ, "TGC_TEST_DEVICES": "CPU", "TGC_PACKAGE_SUITE": str(out),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    plugins = ["-p", "package_suite"]
    if targets:
        env.update(TGC_COMPILE_ONLY=",".join(targets), TGC_COMPILE_ONLY_REPORT=str(out / "report.jsonl"))
        plugins += ["-p", "compile_only"]
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", *plugins, "-p", "no:cacheprovider",
                               "-p", "no:xdist", *suite_files(part, parts)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
        returncode, tail = proc.returncode, proc.stdout[-3000:] + proc.stderr[-3000:]
    except subprocess.TimeoutExpired as e:  # (recorded too: the next test does not run it again)
        returncode, tail = -1, f"the language suite's part {part} timed out after {e.timeout} s"
    result = {"returncode": returncode, "targets": targets, "out": tail}
    (out / "result.json").write_text(json.dumps(result))
