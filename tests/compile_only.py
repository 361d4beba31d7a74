"""A pytest plugin that turns the language suite into a compile check for devices this machine cannot run.

`TGC_COMPILE_ONLY=CUDA,METAL,OPENCL TGC_COMPILE_ONLY_REPORT=out.jsonl pytest -p compile_only tests/test_lang_*.py`
makes every `Program.run(device=...)` of the suite compile the program's kernels for each target (CUDA to cubins
with NVRTC, METAL and OPENCL type-checked with clang), write one report line per target, and answer with the
CPU's results so that the test goes on to its next run. `tests/test_suite_compiles.py` runs this and reads the
report.

OPENCL is always type-checked with clang here, never built by a driver, even where an OpenCL device runs (that
device runs the whole suite for real through TGC_TEST_DEVICES): this is the check every machine can make.
"""

from __future__ import annotations

import json
import os

from tgc.errors import CompileError, TgcError


def _compile_then_answer(targets: list[str], report_path: str) -> None:
    from tgc import api

    if "OPENCL" in targets:
        from tgc.backends import opencl
        opencl.probe_device = lambda index=0: (False, "compile-only check: clang type-checks the OpenCL C")

    original = api.Program.run

    def run(self, device=None, dims=None, cast=False, inputs=None, shard=None, symbolic=False, **kw_inputs):
        inputs = {**(inputs or {}), **kw_inputs}
        if shard is not None or symbolic or not isinstance(device, (str, type(None))) or "," in (device or ""):
            # device lists and symbolic sizes run as asked, on the CPU (this check compiles one-device programs)
            extra = {**({"shard": shard} if shard is not None else {}), **({"symbolic": True} if symbolic else {})}
            return original(self, device, dims, cast, inputs=inputs, **extra)
        rows = []
        for target in targets:
            row = {"target": target, "test": os.environ.get("PYTEST_CURRENT_TEST", "?"), "src": self.source,
                   "kernels": 0, "binaries": 0, "errors": [], "unsupported": None}
            try:
                bound, _ = self.bind(inputs, dims, cast=cast)
                kernels = self.compile(device=target, dims=bound)
            except CompileError as e:
                if "64-bit floats" in e.msg:  # Metal has no f64: a known limit, reported apart
                    row["unsupported"] = e.msg
                else:
                    row["errors"] = [e.format()]
            except TgcError:  # an error in the program or its inputs, which the test expects: the CPU raises it too
                return original(self, "CPU", dims, cast, inputs=inputs)
            else:
                row["kernels"] = len(kernels)
                row["binaries"] = sum(k.binary is not None for k in kernels)
            rows.append(row)
        with open(report_path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        return original(self, "CPU", dims, cast, inputs=inputs)

    api.Program.run = run


def pytest_configure(config):
    targets, report = os.environ.get("TGC_COMPILE_ONLY"), os.environ.get("TGC_COMPILE_ONLY_REPORT")
    if targets and report:
        _compile_then_answer([t.strip().upper() for t in targets.split(",") if t.strip()], report)
