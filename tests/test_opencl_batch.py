"""A program's OpenCL kernels built together (`OpenCLCompiler.compile_batch`, `Compiler.batch_max`): PoCL's fixed
cost per build (~0.15 s) paid once for up to `batch_max` kernels, each kernel loading its own from the shared
binary, with the results of each checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.backends.opencl import OpenCLCompiler, OpenCLDevice, joined_source
from tgc.errors import CompileError

AVAILABLE, WHY_NOT = OpenCLDevice.probe()

PRELUDE = """#pragma OPENCL FP_CONTRACT OFF
inline float tg_twice(float x) { return x * 2.0f; }
inline float tg_plus1(float x) { return x + 1.0f; }
"""


def kernel_src(name: str, expr: str, prelude: str = PRELUDE) -> str:
    return (f"{prelude}\n__kernel void {name}(__global float* restrict out, __global const float* restrict a) {{\n"
            f"  int i = get_global_id(0);\n  float x = a[i];\n  out[i] = {expr};\n}}\n")


@pytest.fixture(scope="module")
def dev() -> OpenCLDevice:
    if not AVAILABLE:
        pytest.skip(f"no OpenCL here: {WHY_NOT}")
    return OpenCLDevice(0)


def run_kernel(dev: OpenCLDevice, name: str, lib: bytes, a: np.ndarray) -> np.ndarray:
    out, inp = dev.allocator.alloc(a.nbytes), dev.allocator.alloc(a.nbytes)
    dev.allocator.copyin(inp, memoryview(a))
    dev.program(name, lib)(out, inp, global_size=(a.size,), wait=True)
    got = np.empty_like(a)
    dev.allocator.copyout(memoryview(got), out)
    return got


def test_joined_source_writes_each_helper_once_and_keeps_every_directive_in_place():
    fp64 = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    srcs = [kernel_src("k0", "tg_twice(x)"), kernel_src("k1", "tg_plus1(x)", PRELUDE + fp64),
            kernel_src("k2", "x", "inline float tg_other(float x) { return x; }\n")]
    joined = joined_source(srcs)
    assert joined is not None
    lines = joined.split("\n")
    assert lines.count("inline float tg_twice(float x) { return x * 2.0f; }") == 1
    assert lines.count("inline float tg_other(float x) { return x; }") == 1
    # each source's directives stay before its own kernel (a pragma holds from where it is written)
    assert lines.count("#pragma OPENCL FP_CONTRACT OFF") == 2
    assert lines.index(fp64.strip()) < lines.index("__kernel void k1(__global float* restrict out, "
                                                    "__global const float* restrict a) {")
    assert [ln.split("(")[0] for ln in lines if ln.startswith("__kernel")] == \
        ["__kernel void k0", "__kernel void k1", "__kernel void k2"]


@pytest.mark.parametrize("srcs", [
    [kernel_src("k0", "x"), kernel_src("k0", "x + 1.0f")],  # two kernels of one name
    [kernel_src("k0", "x"), "inline float f(float x) {\n  return x;\n}\n" + kernel_src("k1", "f(x)", "")],
    [kernel_src("k0", "x"), "inline float f(float x) { return x; }\n"],  # no kernel
    [kernel_src("k0", "x") + kernel_src("k1", "x", "")],  # two in one source
], ids=["equal-names", "multi-line-helper", "no-kernel", "two-kernels"])
def test_joined_source_refuses_sources_it_cannot_join(srcs):
    assert joined_source(srcs + [kernel_src("k9", "x")]) is None


def test_a_batch_is_one_build_and_each_kernel_runs_from_its_binary(dev, monkeypatch):
    builds = []
    plain = OpenCLCompiler.compile
    monkeypatch.setattr(OpenCLCompiler, "compile", lambda self, src: builds.append(src) or plain(self, src))
    exprs = {"b0": ("tg_twice(x)", lambda a: a * 2), "b1": ("tg_plus1(x)", lambda a: a + 1),
             "b2": ("tg_twice(tg_plus1(x)) - x", lambda a: (a + 1) * 2 - a)}
    libs = dev.compiler.compile_batch([kernel_src(name, e) for name, (e, _) in exprs.items()])
    assert len(builds) == 1 and len(libs) == 3
    a = np.linspace(-3, 3, 64, dtype=np.float32)
    for (name, (_, want)), lib in zip(exprs.items(), libs):
        np.testing.assert_array_equal(run_kernel(dev, name, lib, a), want(a))
    assert dev.loaded(libs[0]) is dev.loaded(libs[2])  # one load serves the batch's kernels
    np.testing.assert_array_equal(run_kernel(dev, "b1", bytearray(libs[1]), a), a + 1)  # (not a dict key itself)
    ir = dev.compiler.disassemble(libs[1], src=kernel_src("b1", "tg_plus1(x)"))
    if ir.startswith("define"):  # LLVM IR from PoCL's binary: only this kernel's function
        assert "@b1(" in ir and "@b0(" not in ir and "@b2(" not in ir


def test_a_batch_that_does_not_build_together_builds_each_alone(dev):
    # equal helper names, other bodies: the joined source redefines one, so each source is built alone
    srcs = [kernel_src("h0", "tg_h(x)", "inline float tg_h(float x) { return x * 3.0f; }\n"),
            kernel_src("h1", "tg_h(x)", "inline float tg_h(float x) { return x - 5.0f; }\n")]
    libs = dev.compiler.compile_batch(srcs)
    a = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(run_kernel(dev, "h0", libs[0], a), a * 3)
    np.testing.assert_array_equal(run_kernel(dev, "h1", libs[1], a), a - 5)
    bad = kernel_src("h2", "not_declared_anywhere")
    with pytest.raises(CompileError, match="not_declared_anywhere"):
        dev.compiler.compile_batch([srcs[0], bad, srcs[1]])


def test_a_program_of_many_kernels_builds_its_cache_misses_in_batches(dev, monkeypatch):
    builds = []
    plain = OpenCLCompiler.compile
    monkeypatch.setattr(OpenCLCompiler, "compile", lambda self, src: builds.append(src) or plain(self, src))
    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")  # every kernel a miss, whatever ran before
    outs = [f"a * {k}.5 + b" for k in range(11)]  # 11 kernels of one output each: batches of 8 and 3
    src = "a: f32[N]\nb: f32[N]\nreturn " + ", ".join(outs) + "\n"
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(37).astype(np.float32), rng.standard_normal(37).astype(np.float32)
    prog = tgc.loads(src)
    events = []
    kernels = prog.compile(device="OPENCL", dims={"N": 37}, progress=events.append)
    assert len(kernels) == 11
    # (a progress bar hears of each batched kernel's compile, as of a worker's)
    assert len([e for e in events if e.get("stage") == "compiled"]) == 11
    assert 1 < OpenCLCompiler.batch_max < 11 and len(builds) == -(-11 // OpenCLCompiler.batch_max)
    got = prog.run(device="OPENCL", a=a, b=b)
    for k, name in enumerate(got):
        np.testing.assert_allclose(got[name], a * np.float32(k + 0.5) + b, rtol=1e-6)
