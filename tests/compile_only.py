"""A pytest plugin that turns the language suite into a compile check for devices this machine cannot run.

`TGC_COMPILE_ONLY=CUDA,METAL,OPENCL TGC_COMPILE_ONLY_REPORT=out.jsonl pytest -p compile_only tests/test_lang_*.py`
makes every `Program.run(device=...)` of the suite compile the program's kernels for each target (CUDA to cubins
with NVRTC, METAL and OPENCL type-checked with clang), write one report line per target, and answer with the
CPU's results so that the test goes on to its next run. `tests/test_suite_compiles.py` runs this and reads the
report.

OPENCL is always type-checked with clang here, never built by a driver, even where an OpenCL device runs (that
device runs the whole suite for real through TGC_TEST_DEVICES): this is the check every machine can make.

CUDA kernels are compiled, and METAL kernels type-checked, in batches (`Batches`): NVRTC's fixed cost per program
(~25 ms of its ~30 ms for a small kernel) and clang's per parse (~3 ms of Metal's ~3.7 ms: the stub header) are
paid once per `BATCH_KERNELS` kernels. Each kernel's source goes into one C++ translation unit as it is
(`batch_source`), in a namespace of its own, a CUDA kernel without `extern "C"` (names and helpers of different
kernels cannot clash), with every macro it defines undefined after it (no kernel sees another's); Metal's
`#include <metal_stdlib>` and `using namespace metal;` come once, first (a source without them is checked
alone). A CUDA batch must give a cubin with one entry per kernel, a Metal batch no diagnostic that `lint` would
raise. A batch that fails is checked again kernel by kernel, each source exactly as rendered, so an error is
reported for the program it belongs to, as one check per kernel would. Each distinct source is checked once per
run (as the compile cache and the linter's cache did). OPENCL stays one parse per kernel (OpenCL C has no
namespaces). Rows of CUDA and METAL are written when their batch is done (at the latest when the session ends).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from tgc.errors import CompileError, TgcError

BATCH_KERNELS = 40  # kernels per batch (CUDA: ~0.006 s of CPU a kernel against ~0.03 s one by one; Metal 0.4 ms, 3.7)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", re.M)
_ENTRY = re.compile(r"^\.(?:visible )?\.entry\s", re.M)


def batch_source(sources: list[str]) -> str:
    """One C++ translation unit (CUDA or Metal) holding every source of `sources`, each in a namespace of its own
    (a CUDA kernel without C linkage, so that equal names do not clash) and followed by an `#undef` of every macro
    it defines."""
    parts = []
    for i, src in enumerate(sources):
        body = src.replace('extern "C" __global__', "__global__")
        undefs = "".join(f"#undef {name}\n" for name in dict.fromkeys(_DEFINE.findall(src)))
        parts.append(f"namespace tgc_batch_{i} {{\n{body}\n}}\n{undefs}")
    return "".join(parts)


class Batches:
    """The rows of one target's report, each waiting for its kernels' batch: `add(row, sources)`, then `flush()`.
    `check_batch(sources)` is True where every source of the batch passes; `check_one(src)` is None where `src`
    passes alone, else its error."""

    def __init__(self, report_path: str, check_batch: Any, check_one: Any) -> None:
        self.report_path = report_path
        self.check_batch, self.check_one = check_batch, check_one
        self.rows: list[tuple[dict, list[str]]] = []  # (row, its kernels' sources), in order, not yet written
        self.queued: list[str] = []  # distinct sources not checked yet
        self.result: dict[str, str | None] = {}  # source -> None (it passed) or its error

    def add(self, row: dict, sources: list[str]) -> None:
        for src in sources:
            if src not in self.result and src not in self.queued:
                self.queued.append(src)
        self.rows.append((row, sources))
        if len(self.queued) >= BATCH_KERNELS:
            self.flush()

    def _check(self, sources: list[str]) -> None:
        if self.check_batch(sources):
            self.result.update(dict.fromkeys(sources))
        else:  # one by one, as rendered: the error belongs to its own kernel
            self.result.update({src: self.check_one(src) for src in sources})

    def flush(self) -> None:
        """Check every queued source, then write every waiting row (kernels, those that passed, errors)."""
        for start in range(0, len(self.queued), BATCH_KERNELS):
            self._check(self.queued[start:start + BATCH_KERNELS])
        self.queued = []
        with open(self.report_path, "a", encoding="utf-8") as f:
            for row, sources in self.rows:
                errors = [self.result[s] for s in sources if self.result[s] is not None]
                row.update(kernels=len(sources), errors=errors[:1])
                row["binaries"] = len(sources) - len(errors) if row["target"] == "CUDA" else 0
                f.write(json.dumps(row) + "\n")
        self.rows = []


def cuda_batches(report_path: str, compiler: Any) -> Batches:
    """CUDA's rows: each batch one NVRTC program (`batch_source`) whose cubin must have an entry per kernel
    (`compiler()`: the CUDA device's NVRTC compiler)."""
    def is_cubin(src: str) -> bool:
        return compiler().compile(src)[:4] == b"\x7fELF"

    def check_batch(sources: list[str]) -> bool:
        try:
            cubin = compiler().compile(batch_source(sources))
        except CompileError:
            return False
        return cubin[:4] == b"\x7fELF" and len(_ENTRY.findall(compiler().disassemble(cubin))) == len(sources)

    def check_one(src: str) -> str | None:
        try:
            return None if is_cubin(src) else "NVRTC gave no cubin"
        except CompileError as e:
            return e.format()
    return Batches(report_path, check_batch, check_one)


METAL_PRELUDE = "#include <metal_stdlib>\nusing namespace metal;\n"


def metal_batches(report_path: str, linter: Any, lint_one: Any) -> Batches:
    """METAL's rows: each batch one clang parse (`linter.diagnostics`) of the sources that begin with
    `METAL_PRELUDE`, the prelude once, then each source's rest as `batch_source` puts it; on any diagnostic (one
    that `lint` would raise) each source is linted alone (`lint_one`), as are batches with a source without it."""
    def check_batch(sources: list[str]) -> bool:
        if not all(src.startswith(METAL_PRELUDE) for src in sources):
            return False
        rest = [src[len(METAL_PRELUDE):] for src in sources]
        return not linter.diagnostics(METAL_PRELUDE + batch_source(rest), "tgc_batch.metal")

    def check_one(src: str) -> str | None:
        try:
            lint_one(src)
        except CompileError as e:
            return e.format()
        return None
    return Batches(report_path, check_batch, check_one)


def _compile_then_answer(targets: list[str], report_path: str) -> list[Batches]:
    from tgc import api
    from tgc.backends import get_device

    if "OPENCL" in targets:
        from tgc.backends import opencl
        opencl.probe_device = lambda index=0: (False, "compile-only check: clang type-checks the OpenCL C")

    original = api.Program.run
    batched: dict[str, Batches] = {}  # target -> its rows waiting for their batches
    deferred_lint = [False]  # True while this plugin compiles for METAL: the linter's checks wait for a batch
    if "CUDA" in targets:
        batched["CUDA"] = cuda_batches(report_path, lambda: get_device("CUDA").compiler)
    if "METAL" in targets:
        from tgc.backends.metal import metal_linter
        linter = metal_linter()
        lint_one = linter.lint

        def lint(src: str, filename: str | None = None) -> None:
            if not deferred_lint[0]:
                lint_one(src, filename)
        linter.lint = lint
        batched["METAL"] = metal_batches(report_path, linter, lint_one)

    def run(self, device=None, dims=None, cast=False, inputs=None, shard=None, symbolic=False, **kw_inputs):
        inputs = {**(inputs or {}), **kw_inputs}
        if shard is not None or symbolic or not isinstance(device, (str, type(None))) or "," in (device or ""):
            # device lists and symbolic sizes run as asked, on the CPU (this check compiles one-device programs)
            extra = {**({"shard": shard} if shard is not None else {}), **({"symbolic": True} if symbolic else {})}
            return original(self, device, dims, cast, inputs=inputs, **extra)
        rows, waiting = [], []
        for target in targets:
            row = {"target": target, "test": os.environ.get("PYTEST_CURRENT_TEST", "?"), "src": self.source,
                   "kernels": 0, "binaries": 0, "errors": [], "unsupported": None}
            try:
                bound, _ = self.bind(inputs, dims, cast=cast)
                # CUDA's and METAL's kernels are rendered here, compiled or type-checked in batches (`Batches`)
                deferred_lint[0] = target == "METAL"
                kernels = self.compile(device=target, dims=bound, defer=target == "CUDA")
            except CompileError as e:
                if "64-bit floats" in e.msg:  # Metal has no f64: a known limit, reported apart
                    row["unsupported"] = e.msg
                else:
                    row["errors"] = [e.format()]
            except TgcError:  # an error in the program or its inputs, which the test expects: the CPU raises it too
                return original(self, "CPU", dims, cast, inputs=inputs)
            else:
                if target in batched:
                    waiting.append((target, row, [k.src for k in kernels]))
                    continue
                row["kernels"] = len(kernels)
                row["binaries"] = sum(k.binary is not None for k in kernels)
            finally:
                deferred_lint[0] = False
            rows.append(row)
        for target, row, sources in waiting:
            batched[target].add(row, sources)
        with open(report_path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        return original(self, "CPU", dims, cast, inputs=inputs)

    api.Program.run = run
    return list(batched.values())


_BATCHES: list[Batches] = []


def pytest_configure(config):
    targets, report = os.environ.get("TGC_COMPILE_ONLY"), os.environ.get("TGC_COMPILE_ONLY_REPORT")
    if targets and report:
        _BATCHES.extend(_compile_then_answer([t.strip().upper() for t in targets.split(",") if t.strip()], report))


def pytest_sessionfinish(session, exitstatus):
    for batches in _BATCHES:
        batches.flush()
