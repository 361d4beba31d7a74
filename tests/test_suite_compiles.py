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


# --- tests/compile_only.py's batches: a batch reports what one check per kernel would

_GOOD = 'extern "C" __global__ void {name}(float* out) {{ out[threadIdx.x] = {value}; }}\n'


@pytest.fixture
def cuda_batches(tmp_path, monkeypatch):
    from tgc.backends.cuda import nvrtc_compiler, nvrtc_error
    if nvrtc_error() is not None:
        pytest.skip(nvrtc_error())
    import compile_only
    monkeypatch.setattr(compile_only, "BATCH_KERNELS", 3)
    batches = compile_only.cuda_batches(str(tmp_path / "report.jsonl"), nvrtc_compiler)

    def rows() -> list[dict]:
        batches.flush()
        return [json.loads(line) for line in (tmp_path / "report.jsonl").read_text().splitlines()]
    return batches, rows


def _row(test: str, target: str = "CUDA") -> dict:
    return {"target": target, "test": test, "kernels": 0, "binaries": 0, "errors": []}


def test_cuda_batch_compiles_kernels_of_equal_names_and_equal_helpers(cuda_batches):
    batches, rows = cuda_batches
    helper = "#define SCALE 2.0f\n__device__ float twice(float x) { return SCALE * x; }\n"
    for value in ("1.0f", "twice(3.0f)", "twice(4.0f)", "5.0f"):  # one batch of 3 and one of 1, same kernel name
        batches.add(_row(value), [(helper if "twice" in value else "") + _GOOD.format(name="E_4", value=value)])
    got = rows()
    assert [(r["test"], r["kernels"], r["binaries"], r["errors"]) for r in got] == [
        (v, 1, 1, []) for v in ("1.0f", "twice(3.0f)", "twice(4.0f)", "5.0f")]


def test_cuda_batch_reports_a_bad_kernel_for_its_own_program_only(cuda_batches):
    batches, rows = cuda_batches
    batches.add(_row("good"), [_GOOD.format(name="a", value="1.0f")])
    batches.add(_row("bad"), [_GOOD.format(name="b", value="2.0f"), _GOOD.format(name="c", value="undeclared_name")])
    got = {r["test"]: r for r in rows()}
    assert (got["good"]["kernels"], got["good"]["binaries"], got["good"]["errors"]) == (1, 1, [])
    assert (got["bad"]["kernels"], got["bad"]["binaries"]) == (2, 1)
    assert len(got["bad"]["errors"]) == 1 and "undeclared_name" in got["bad"]["errors"][0]


def test_cuda_batch_gives_no_kernel_a_macro_of_another(cuda_batches):
    """A kernel that uses a macro only an earlier kernel of its batch defines fails, as it would alone."""
    batches, rows = cuda_batches
    batches.add(_row("defines"), ["#define ONE 1.0f\n" + _GOOD.format(name="a", value="ONE")])
    batches.add(_row("uses"), [_GOOD.format(name="b", value="ONE")])
    got = {r["test"]: r for r in rows()}
    assert got["defines"]["errors"] == [] and got["defines"]["binaries"] == 1
    assert got["uses"]["binaries"] == 0 and "ONE" in got["uses"]["errors"][0]


def test_metal_batch_type_checks_each_kernel_as_alone(tmp_path, monkeypatch):
    """Equal names and helpers pass together; a type error, a macro of another kernel, an unknown attribute (a
    warning Metal's lint raises) and a source without the prelude are each the error of their own program."""
    from tgc.backends.clang_lint import libclang_error
    if libclang_error() is not None:
        pytest.skip(libclang_error())
    import compile_only

    from tgc.backends.metal import MetalLinter
    monkeypatch.setattr(compile_only, "BATCH_KERNELS", 4)
    linter = MetalLinter()
    batches = compile_only.metal_batches(str(tmp_path / "report.jsonl"), linter, linter.lint)
    kernel = "kernel void k(device float* out [[buffer(0)]]) {{ out[0] = {value}; }}\n"
    prelude = compile_only.METAL_PRELUDE
    cases = {
        "plain": prelude + kernel.format(value="1.0f"),
        "helper": prelude + "#define TWO 2.0f\ninline float twice(float x) { return TWO * x; }\n"
        + kernel.format(value="twice(1.0f)"),
        "helper again": prelude + "#define TWO 2.0f\ninline float twice(float x) { return TWO * x; }\n"
        + kernel.format(value="twice(3.0f)"),
        "other's macro": prelude + kernel.format(value="TWO"),
        "type error": prelude + kernel.format(value="out"),
        "unknown attribute": prelude + "kernel void k(device float* out [[bufer(0)]]) { out[0] = 1.0f; }\n",
        "no prelude": kernel.format(value="1.0f"),
    }
    for name, src in cases.items():
        batches.add(_row(name, "METAL"), [src])
    batches.flush()
    got = {r["test"]: r for r in map(json.loads, (tmp_path / "report.jsonl").read_text().splitlines())}
    assert {n: (r["kernels"], r["binaries"], bool(r["errors"])) for n, r in got.items()} == {
        "plain": (1, 0, False), "helper": (1, 0, False), "helper again": (1, 0, False), "other's macro": (1, 0, True),
        "type error": (1, 0, True), "unknown attribute": (1, 0, True), "no prelude": (1, 0, True)}
    assert "TWO" in got["other's macro"]["errors"][0] and "bufer" in got["unknown attribute"]["errors"][0]
