"""A second run (or bench) of a program at the same device, dims and kernel environment reuses the executable
its first run built or loaded (`Program._ready_for`): nothing is traced, scheduled, lowered or looked up in a
cache again. Results are compared with numpy; changing the device, a dim or a kernel variable builds anew."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc import api, cache, progcache
from tgc.package import Package

SOFTMAX = "x: f32[N, D]\nm = x.max(axis=1, keepdim=True)\ne = exp(x - m)\nreturn e / sum(e, axis=1, keepdim=True)\n"


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("TGC_VERIFY_BOUNDS", "DISABLE_COMPILER_CACHE", "BEAM", "NOOPT", "DEBUG", "TGC_CHUNK"):
        monkeypatch.delenv(name, raising=False)
    cache._reset_for_tests()
    yield
    cache._reset_for_tests()


def _forbid_lowering(monkeypatch, program_level: bool = True) -> None:
    """Every entry point of tracing, scheduling, lowering and cache look-ups raises."""
    def boom(*_a, **_k):
        raise AssertionError("a second run lowered or looked up again")

    for name in ("trace", "create_schedule", "build_kernels", "build_kernel", "split_large_reduces"):
        monkeypatch.setattr(api, name, boom)
    monkeypatch.setattr(api.Program, "lower", boom)
    monkeypatch.setattr(api.Program, "_chunking", boom)
    if program_level:  # (bench reads the compiled kernels' counts through `compile`'s memo)
        monkeypatch.setattr(api.Program, "compile", boom)
        monkeypatch.setattr(api.Program, "_trace", boom)
        monkeypatch.setattr(cache, "get", boom)  # (bench reads the device's measured peak from the cache)
    monkeypatch.setattr(progcache, "lookup", boom)
    monkeypatch.setattr(Package, "lower", boom)


def test_second_run_after_a_cold_run_lowers_nothing(monkeypatch):
    prog = tgc.loads(SOFTMAX)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(next(iter(prog.run(device="CPU", x=x).values())), _softmax(x), rtol=1e-5, atol=1e-6)
    _forbid_lowering(monkeypatch)
    for seed in (1, 2, 3):  # (the third and later runs replay the launch plan: new inputs each time)
        x = np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)
        got = next(iter(prog.run(device="CPU", x=x).values()))
        np.testing.assert_allclose(got, _softmax(x), rtol=1e-5, atol=1e-6)


def test_second_run_from_the_program_cache_loads_once(monkeypatch):
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    tgc.loads(SOFTMAX).run(device="CPU", x=x)  # stores the program cache's entry
    prog = tgc.loads(SOFTMAX)
    prog.run(device="CPU", x=x)
    assert prog._ready and next(iter(prog._ready.values())).entry is not None  # (it came from the entry)
    _forbid_lowering(monkeypatch)
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)
        np.testing.assert_allclose(next(iter(prog.run(device="CPU", x=x).values())), _softmax(x), rtol=1e-5,
                                   atol=1e-6)


def test_second_bench_reuses_the_run_executable(monkeypatch):
    prog = tgc.loads(SOFTMAX)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    prog.run(device="CPU", x=x)
    prog.bench(device="CPU", inputs={"x": x}, repeat=2)
    _forbid_lowering(monkeypatch, program_level=False)
    r = prog.bench(device="CPU", inputs={"x": x}, repeat=2)
    assert r["program"]["median_s"] > 0
    np.testing.assert_allclose(next(iter(prog.run(device="CPU", x=x).values())), _softmax(x), rtol=1e-5, atol=1e-6)


def test_a_new_device_dim_or_kernel_variable_builds_anew(monkeypatch):
    prog = tgc.loads(SOFTMAX)
    built = []  # per run: whether it built (or loaded) its executable instead of reusing one
    real_ready = api.Program._ready_for

    def watched(self, *a, **k):
        found = real_ready(self, *a, **k)
        built.append(found[1])
        return found

    monkeypatch.setattr(api.Program, "_ready_for", watched)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    prog.run(device="CPU", x=x)
    prog.run(device="CPU", x=x)
    assert built == [True, False]
    for device, shape in (("PYTHON", (4, 8)), ("CPU", (6, 8)), ("CPU", (4, 3))):
        y = rng.standard_normal(shape).astype(np.float32)
        built.clear()
        for _ in range(2):
            np.testing.assert_allclose(next(iter(prog.run(device=device, x=y).values())), _softmax(y), rtol=1e-5,
                                       atol=1e-6)
        assert built == [True, False], (device, shape)
    monkeypatch.setenv("TGC_CHUNK", "0")  # a variable the plan depends on: not the executable kept without it
    built.clear()
    for _ in range(2):
        np.testing.assert_allclose(next(iter(prog.run(device="CPU", x=x).values())), _softmax(x), rtol=1e-5,
                                   atol=1e-6)
    assert built == [True, False]
    prog.release()  # gives back what the runs keep: the next run builds again, correctly
    built.clear()
    np.testing.assert_allclose(next(iter(prog.run(device="CPU", x=x).values())), _softmax(x), rtol=1e-5, atol=1e-6)
    assert built == [True]
