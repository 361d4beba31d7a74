"""A pytest plugin that packages every program the language suite runs, for `tests/test_package.py`.

`TGC_PACKAGE_SUITE=DIR pytest -p package_suite tests/test_lang_*.py` makes every `Program.run(device="CPU")` of
the suite (`device=KIND` where `TGC_PACKAGE_DEVICE=KIND` is set: `CUDA` on a GPU, tools/gpu_check.py) that
succeeds also write, into DIR, the program compiled as a package (`<n>.tgpkg`), the inputs it ran
with (`<n>.in.npz`) and the outputs it returned (`<n>.out.npz`), and one line of `index.jsonl`. The test then
runs every package in one fresh process (`python tests/package_suite.py DIR...`, `check_all`) and compares.
The test session runs the suite with this plugin once (tests/suite_runs.py), together with tests/compile_only.py.
"""

from __future__ import annotations

import json
import os

import numpy as np


def _install(outdir: str) -> None:
    from tgc import api
    from tgc.package import write

    kind = (os.environ.get("TGC_PACKAGE_DEVICE") or "CPU").upper()

    original = api.Program.run
    count = [0]

    def run(self, device=None, dims=None, cast=False, inputs=None, **kw_inputs):
        out = original(self, device, dims, cast, inputs=inputs, **kw_inputs)
        if (device or "CPU").upper() != kind:
            return out
        bound, arrays = self.bind({**(inputs or {}), **kw_inputs}, dims, cast=cast)
        worker = os.environ.get("PYTEST_XDIST_WORKER")  # workers write into the same DIR: names of their own
        n = f"{worker}-{count[0]}" if worker else count[0]
        count[0] += 1
        base = os.path.join(outdir, str(n))
        write(self, base + ".tgpkg", kind, bound)
        np.savez(base + ".in.npz", **{"a_" + k: v for k, v in arrays.items()})  # (prefixed: no name clashes with
        np.savez(base + ".out.npz", **{"a_" + k: v for k, v in out.items()})  # np.savez's own parameters)
        row = {"n": n, "test": os.environ.get("PYTEST_CURRENT_TEST", "?"), "outputs": list(out)}
        with open(os.path.join(outdir, "index.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        return out

    api.Program.run = run


def pytest_configure(config):
    outdir = os.environ.get("TGC_PACKAGE_SUITE")
    if outdir:
        _install(outdir)


def check_all(outdir: str) -> dict:
    """Run every package of `outdir` from its inputs; compare with the outputs the `.tg` run returned (bit for bit:
    the same kernels on the same inputs). Returns a summary; what this process imported is part of it."""
    import sys

    import tgc

    rows = [json.loads(line) for line in open(os.path.join(outdir, "index.jsonl"), encoding="utf-8") if line.strip()]
    bad = []
    for row in rows:
        base = os.path.join(outdir, str(row["n"]))
        try:
            pkg = tgc.load_package(base + ".tgpkg")
            with np.load(base + ".in.npz") as z:
                arrays = {k[2:]: z[k] for k in z.files}
            with np.load(base + ".out.npz") as z:
                want = {k[2:]: z[k] for k in z.files}
            got = pkg.run(inputs=arrays)
        except Exception as e:  # noqa: BLE001 - every failure is reported with its test
            bad.append(f"{row['test']}: {type(e).__name__}: {e}")
            continue
        if list(got) != list(want):
            bad.append(f"{row['test']}: outputs {list(got)} != {list(want)}")
            continue
        for name, w in want.items():
            g = got[name]
            if g.dtype != w.dtype or g.shape != w.shape or not np.array_equal(g, w, equal_nan=w.dtype.kind == "f"):
                bad.append(f"{row['test']}: output {name} differs")
    return {"packages": len(rows), "bad": bad, "llvmlite": "llvmlite" in sys.modules,
            "codegen": any(m.startswith("tgc.codegen") for m in sys.modules),
            "api": "tgc.api" in sys.modules}


if __name__ == "__main__":  # `python tests/package_suite.py DIR...`: every directory's packages, in one process
    import sys

    summaries = [check_all(d) for d in sys.argv[1:]]
    print(json.dumps({"packages": sum(s["packages"] for s in summaries),
                      "bad": [b for s in summaries for b in s["bad"]],
                      **{k: any(s[k] for s in summaries) for k in ("llvmlite", "codegen", "api")}}))
