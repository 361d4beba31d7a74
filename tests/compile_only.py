"""A pytest plugin that turns the language suite into a compile check for devices this machine cannot run.

`TGC_COMPILE_ONLY=CUDA,METAL,OPENCL TGC_COMPILE_ONLY_REPORT=out.jsonl pytest -p compile_only tests/test_lang_*.py`
makes every `Program.run(device=...)` of the suite compile the program's kernels for each target (CUDA to cubins
with NVRTC, METAL and OPENCL type-checked with clang), write one report line per target, and answer with the
CPU's results so that the test goes on to its next run. `tests/test_suite_compiles.py` runs this and reads the
report.

OPENCL is always type-checked with clang here, never built by a driver, even where an OpenCL device runs (that
device runs the whole suite for real through TGC_TEST_DEVICES): this is the check every machine can make.

CUDA kernels are compiled in batches (`CudaBatches`): NVRTC's fixed cost per program (~25 ms of its ~30 ms for a
small kernel) is paid once per `BATCH_KERNELS` kernels. Each kernel's source goes into one translation unit
as it is, in a namespace of its own, without `extern "C"` (names and helpers of different kernels cannot clash)
and with every macro it defines undefined after it (no kernel sees another's). A batch must give a cubin with one
entry per kernel; a batch NVRTC rejects is compiled again kernel by kernel, each source exactly as rendered, so an
error is reported for the program it belongs to, as one compile per kernel would. Each distinct source is
compiled once per run (as the compile cache did). Rows of the CUDA target are written when their batch is done
(at the latest when the session ends).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from tgc.errors import CompileError, TgcError

BATCH_KERNELS = 40  # kernels per NVRTC program (40: ~0.006 s a kernel against ~0.03 s one by one)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", re.M)
_ENTRY = re.compile(r"^\.(?:visible )?\.entry\s", re.M)


def batch_source(sources: list[str]) -> str:
    """One CUDA translation unit holding every source of `sources`, each in a namespace of its own (its kernel
    without C linkage, so that equal names do not clash) and followed by an `#undef` of every macro it defines."""
    parts = []
    for i, src in enumerate(sources):
        body = src.replace('extern "C" __global__', "__global__")
        undefs = "".join(f"#undef {name}\n" for name in dict.fromkeys(_DEFINE.findall(src)))
        parts.append(f"namespace tgc_batch_{i} {{\n{body}\n}}\n{undefs}")
    return "".join(parts)


class CudaBatches:
    """The CUDA rows of the report, each waiting for its kernels' batch: `add(row, kernels)`, then `flush()`."""

    def __init__(self, report_path: str) -> None:
        self.report_path = report_path
        self.rows: list[tuple[dict, list[str]]] = []  # (row, its kernels' sources), in order, not yet written
        self.queued: list[str] = []  # distinct sources not compiled yet
        self.result: dict[str, str | None] = {}  # source -> None (compiled to a cubin) or NVRTC's error
        self.compiler: Any = None

    def add(self, row: dict, kernels: list[Any]) -> None:
        sources = [k.src for k in kernels]
        if kernels:
            self.compiler = kernels[0].device.compiler
        for src in sources:
            if src not in self.result and src not in self.queued:
                self.queued.append(src)
        self.rows.append((row, sources))
        if len(self.queued) >= BATCH_KERNELS:
            self.flush()

    def _compile(self, sources: list[str]) -> None:
        try:
            cubin = self.compiler.compile(batch_source(sources))
            entries = len(_ENTRY.findall(self.compiler.disassemble(cubin)))
            if cubin[:4] != b"\x7fELF" or entries != len(sources):
                raise CompileError(f"a batch of {len(sources)} kernels gave a cubin with {entries} entries")
        except CompileError:  # one by one, as rendered: the error belongs to its own kernel
            for src in sources:
                try:
                    self.result[src] = None if self.compiler.compile(src)[:4] == b"\x7fELF" else "not a cubin"
                except CompileError as e:
                    self.result[src] = e.format()
        else:
            self.result.update(dict.fromkeys(sources))

    def flush(self) -> None:
        """Compile every queued source, then write every waiting row (kernels, cubins, errors)."""
        for start in range(0, len(self.queued), BATCH_KERNELS):
            self._compile(self.queued[start:start + BATCH_KERNELS])
        self.queued = []
        with open(self.report_path, "a", encoding="utf-8") as f:
            for row, sources in self.rows:
                errors = [self.result[s] for s in sources if self.result[s] is not None]
                row.update(kernels=len(sources), binaries=len(sources) - len(errors), errors=errors[:1])
                f.write(json.dumps(row) + "\n")
        self.rows = []


def _compile_then_answer(targets: list[str], report_path: str) -> CudaBatches:
    from tgc import api

    if "OPENCL" in targets:
        from tgc.backends import opencl
        opencl.probe_device = lambda index=0: (False, "compile-only check: clang type-checks the OpenCL C")

    original = api.Program.run
    cuda = CudaBatches(report_path)

    def run(self, device=None, dims=None, cast=False, inputs=None, shard=None, symbolic=False, **kw_inputs):
        inputs = {**(inputs or {}), **kw_inputs}
        if shard is not None or symbolic or not isinstance(device, (str, type(None))) or "," in (device or ""):
            # device lists and symbolic sizes run as asked, on the CPU (this check compiles one-device programs)
            extra = {**({"shard": shard} if shard is not None else {}), **({"symbolic": True} if symbolic else {})}
            return original(self, device, dims, cast, inputs=inputs, **extra)
        rows, batched = [], []
        for target in targets:
            row = {"target": target, "test": os.environ.get("PYTEST_CURRENT_TEST", "?"), "src": self.source,
                   "kernels": 0, "binaries": 0, "errors": [], "unsupported": None}
            try:
                bound, _ = self.bind(inputs, dims, cast=cast)
                # CUDA's kernels are rendered here and compiled in a batch (`CudaBatches`)
                kernels = self.compile(device=target, dims=bound, defer=target == "CUDA")
            except CompileError as e:
                if "64-bit floats" in e.msg:  # Metal has no f64: a known limit, reported apart
                    row["unsupported"] = e.msg
                else:
                    row["errors"] = [e.format()]
            except TgcError:  # an error in the program or its inputs, which the test expects: the CPU raises it too
                return original(self, "CPU", dims, cast, inputs=inputs)
            else:
                if target == "CUDA":
                    batched.append((row, kernels))
                    continue
                row["kernels"] = len(kernels)
                row["binaries"] = sum(k.binary is not None for k in kernels)
            rows.append(row)
        for row, kernels in batched:
            cuda.add(row, kernels)
        with open(report_path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        return original(self, "CPU", dims, cast, inputs=inputs)

    api.Program.run = run
    return cuda


_BATCHES: list[CudaBatches] = []


def pytest_configure(config):
    targets, report = os.environ.get("TGC_COMPILE_ONLY"), os.environ.get("TGC_COMPILE_ONLY_REPORT")
    if targets and report:
        _BATCHES.append(_compile_then_answer([t.strip().upper() for t in targets.split(",") if t.strip()], report))


def pytest_sessionfinish(session, exitstatus):
    for batches in _BATCHES:
        batches.flush()
