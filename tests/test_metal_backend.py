"""The METAL backend.

Off macOS nothing can run: these tests render every kernel of many programs (every op and dtype the Metal
renderer emits, the `kernels/*.tg` examples, and the programs of the language suite) and type-check each with
clang against the stub `<metal_stdlib>`. The tests that run kernels need macOS with pyobjc-framework-Metal.

The language suite's programs are type-checked by tests/test_suite_compiles.py.
"""

from __future__ import annotations

import glob
import os
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

import tgc
from tgc.backends import get_device
from tgc.backends import metal as metal_mod
from tgc.backends.cstyle import MetalRenderer
from tgc.backends.metal import IS_MACOS, NOT_MACOS, PROBE_NOT_MACOS, MetalDevice, metal_linter
from tgc.errors import CompileError, DeviceError, TgcError

ROOT = Path(__file__).resolve().parents[1]
LINT_ERROR = metal_mod.libclang_error()
needs_libclang = pytest.mark.skipif(LINT_ERROR is not None, reason=f"no libclang: {LINT_ERROR}")
off_macos = pytest.mark.skipif(IS_MACOS, reason="checks the behaviour off macOS")
_OK, _WHY = MetalDevice.probe()
needs_metal = pytest.mark.skipif(not _OK, reason=f"no Metal here: {_WHY}")

INTS = ["i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"]
FLOATS = ["f16", "bf16", "f32"]  # Metal has no f64
ALL = ["bool", *INTS, *FLOATS]
BITS = {"bool": 8, "i8": 8, "u8": 8, "i16": 16, "u16": 16, "i32": 32, "u32": 32, "i64": 64, "u64": 64,
        "f16": 16, "bf16": 16, "f32": 32}
UNARY = ("exp log exp2 log2 sqrt rsqrt sin cos tan tanh sigmoid relu gelu abs sign recip floor ceil trunc round "
         "square").split()
DIMS = {"N": 5, "M": 3, "K": 4, "C": 2, "H": 6, "W": 6, "O": 3}


def _snippets() -> dict[str, str]:
    """Programs covering every op, dtype, cast and bitcast the Metal renderer emits, by a readable id."""
    out: dict[str, str] = {}
    for d in ALL:
        cmp = "a < b, a <= b, a == b, a != b, a > b, maximum(a, b), minimum(a, b), where(a > b, a, b)"
        out[f"compare-{d}"] = f"a: {d}[N]\nb: {d}[N]\nreturn {cmp}"
        arith = "a + b, a * b, a / b" if d == "bool" else "a + b, a - b, a * b, a / b"
        out[f"arith-{d}"] = f"a: {d}[N]\nb: {d}[N]\nreturn {arith}"
        if d != "bool":
            out[f"floordiv-{d}"] = f"a: {d}[N]\nb: {d}[N]\nreturn a // b, a % b, -a, abs(a), sign(a), a ** 2, " \
                                   f"a * 3, clip(a, 1, 2)"
        out[f"reduce-{d}"] = f"a: {d}[N, M]\nreturn a.sum(axis=1), a.max(axis=0), a.min(), a.prod(axis=1), " \
                             f"a.argmax(axis=1), a.argmin(), a.mean(axis=1)"
        # long reductions into few outputs: a work-group shares them through threadgroup memory and a barrier
        out[f"group-reduce-{d}"] = f"a: {d}[N, 1024]\nreturn a.sum(axis=1), a.max(axis=1), a.prod(axis=1), " \
                                   f"a.argmax(axis=1)"
        out[f"cast-from-{d}"] = f"a: {d}[N]\nreturn " + ", ".join(f"cast(a, {e})" for e in ALL)
        same = [e for e in ALL if e != "bool" and BITS[e] == BITS[d]]
        if d != "bool":
            out[f"bitcast-from-{d}"] = f"a: {d}[N]\nreturn " + ", ".join(f"bitcast(a, {e})" for e in same)
        if d in INTS or d == "bool":
            out[f"bitwise-{d}"] = f"a: {d}[N]\nb: {d}[N]\nreturn a & b, a | b, a ^ b, ~a"
        if d in INTS:
            out[f"shift-{d}"] = f"a: {d}[N]\nb: {d}[N]\nreturn a << b, a >> b, a << 3, a >> 1"
        if d in FLOATS:
            out[f"unary-{d}"] = f"a: {d}[N]\nb: {d}[N]\nreturn " + ", ".join(f"{f}(a)" for f in UNARY) + \
                ", pow(a, b), a ** b, a // b, a % b, a ** -3, a ** 0.5"
            out[f"nn-{d}"] = f"a: {d}[N, K]\nb: {d}[K, M]\nreturn a @ b, softmax(a, axis=1), " \
                             f"logsumexp(a, axis=1), log_softmax(a, axis=0), var(a, axis=1), std(a), layernorm(a)"
    out.update({
        "creation": "return arange(10), arange(2, 20, 3), eye(4), zeros((2, 3)), ones((3,), dtype=i64), "
                    "full((2, 2), 7, dtype=u8)",
        "inf-nan-consts": "x: f32[N]\nreturn x / 0.0, x * (1.0 / 0.0), x + (0.0 / 0.0), -(1.0 / 0.0) + x",
        "i64-extremes": "x: i64[N]\nreturn x + (-9223372036854775807 - 1), x & 9223372036854775807, "
                        "x * -2147483648",
        "u64-extremes": "x: u64[N]\nreturn x + 18446744073709551615, x >> 63, x // 3",
        "i32-extremes": "x: i32[N]\nreturn x + (-2147483647 - 1), x % -7, x // -7",
        "conv-pool": "x: f32[N, C, H, W]\nw: f32[O, C, 3, 3]\n"
                     "return conv2d(x, w, stride=2, padding=1), max_pool2d(x, 2), avg_pool2d(x, 2, stride=1)",
        "conv-f16": "x: f16[N, C, H, W]\nw: f16[O, C, 3, 3]\nreturn conv2d(x, w, padding=1)",
        "indexing-bf16": "x: bf16[N, M]\nreturn x[1:-1, ::2], x[::-1], x[0], x[None, ..., 1], flip(x, 0), "
                         "pad(x, ((1, 2), (0, 1)), value=3.0)",
        "shapes": "x: f32[N, M]\ny: f32[N, M]\nreturn cat(x, y, axis=1), stack(x, y, axis=0), x.T, "
                  "reshape(x, (-1,)), permute(x, (1, 0))",
        "scalars": "x: f32\ny: i32\nreturn x * y, x.exp()",
        "bool-reduce": "x: bool[N]\nreturn x.sum(), x.max(), x.min(), x.prod(), ~x, x & True",
        "reduce-all-axes": "x: f32[N, M]\nreturn x.argmax(), x.argmin(axis=0), x.sum(axis=(0, 1)), x.mean(), "
                           "x.var(axis=0, correction=0)",
        "mixed-u8-i8": "x: u8[N]\ny: i8[N]\nreturn x + y, x * y, x < y, maximum(x, y)",
        "mixed-u32-i32": "x: u32[N]\ny: i32[N]\nreturn x + y, x // y, x % y",
        "mixed-halves": "x: f16[N]\ny: bf16[N]\nreturn x + y, x * y, maximum(x, y)",
        "conditional-pow": "x: f32[N]\nreturn x if x > 0 else -x, x ** 0.5, x ** 3, x ** -1, (-x) ** 2.5",
        "empty-dim": "x: f32[0, N]\nreturn x.sum(axis=0), x * 2",
        "big-grid": "x: f32[N, 1000]\nreturn x * 2 + 1, x.sum(axis=1)",
    })
    return out


SNIPPETS = _snippets()


def _lint_all(kernels: list) -> list[str]:
    """Every clang error of the kernels, as text (empty when all type-check)."""
    errors = []
    for k in kernels:
        errors += [f"{k.name}: {d}" for d in metal_linter().diagnostics(k.src)]
    return errors


# programs whose dims are tied to each other (4 heads of C // 4)
TIED_DIMS = {"transformer_block.tg": {"B": 2, "T": 6, "C": 8}, "tiny_gpt.tg": {"B": 2, "T": 5, "V": 11, "C": 8, "L": 2}}


def _dims_for(prog: tgc.Program) -> dict[str, int]:
    """Small distinct sizes that the program traces with (windowed ops need a few more)."""
    if os.path.basename(prog.filename) in TIED_DIMS:
        return TIED_DIMS[os.path.basename(prog.filename)]
    for base in (4, 8, 16, 32):
        dims = {name: base + i for i, name in enumerate(prog.dim_names)}
        try:
            prog.schedule(dims)
            return dims
        except TgcError:
            continue
    raise AssertionError(f"no dims found that trace {prog.filename}")


# ---------------------------------------------------------------- the device off macOS


def test_device_surface():
    dev = get_device("METAL")
    assert isinstance(dev, MetalDevice)
    assert dev.kind == "METAL" and dev.launch_style == "gpu"
    assert isinstance(dev.renderer, MetalRenderer)


@off_macos
def test_probe_says_macos_only():
    assert MetalDevice.probe() == (False, PROBE_NOT_MACOS)


@off_macos
def test_no_compiler_off_macos_and_the_reason():
    dev = get_device("METAL")
    assert dev.compiler is None
    if LINT_ERROR is None:
        assert dev.compile_error == NOT_MACOS
    info = dev.info()
    assert info["available"] is False and info["renderer"] == "metal"


@off_macos
def test_missing_libclang_says_how_to_install(monkeypatch):
    monkeypatch.setattr(metal_mod, "libclang_error", lambda: "libclang is not installed (test); install it with "
                                                          f"{metal_mod.INSTALL_HINT}")
    dev = get_device("METAL")
    assert "pip install 'tgc[metal]'" in dev.compile_error
    assert "not type-checked" in dev.compile_error
    dev.lint("this is not C++")  # no libclang: nothing to check with, no error


@off_macos
def test_kernels_have_no_binary_and_say_why():
    kernels = tgc.loads("x: f32[N]\nreturn x * 2").compile(device="METAL", dims={"N": 8})
    assert kernels and all(k.binary is None for k in kernels)
    assert "macOS" in kernels[0].compile_error
    with pytest.raises(CompileError, match="macOS"):
        kernels[0].program()


@off_macos
def test_running_needs_macos():
    prog = tgc.loads("x: f32[N]\nreturn x + 1")
    with pytest.raises(DeviceError, match="macOS") as e:
        prog.run(device="METAL", x=np.ones(4, np.float32))
    assert 'Program.compile("METAL")' in (e.value.hint or "")  # the API's words; the CLI names its flag
    assert "tgc compile -d METAL" in (e.value.cli_hint or "")
    with pytest.raises(DeviceError, match="macOS"):
        get_device("METAL").program("E_4", b"")


# ---------------------------------------------------------------- rendering and type-checking


@needs_libclang
@pytest.mark.parametrize("key", list(SNIPPETS))
def test_snippet_kernels_type_check(key):
    kernels = tgc.loads(SNIPPETS[key]).compile(device="METAL", dims=DIMS)
    assert kernels
    for k in kernels:
        assert "#include <metal_stdlib>" in k.src
        assert f"kernel void {k.name}(" in k.src
        assert "double" not in k.src
    assert _lint_all(kernels) == []


def test_every_dtype_and_op_is_covered():
    """The snippets load buffers of every dtype and emit the renderer's every ALU op."""
    from tgc.ir.uop import Ops
    seen_ops, seen_dtypes = set(), set()
    for src in SNIPPETS.values():
        for k in tgc.loads(src).compile(device="METAL", dims=DIMS):
            for u in k.uops:
                seen_ops.add(u.op)
                if u.op is Ops.DEFINE_GLOBAL:
                    seen_dtypes.add(u.dtype.name)
    assert set(ALL) <= seen_dtypes
    wanted = {"ADD", "SUB", "MUL", "FDIV", "IDIV", "MOD", "CMPLT", "CMPNE", "AND", "OR", "XOR", "MAX", "SHL",
              "SHR", "NEG", "NOT", "EXP2", "LOG2", "SIN", "SQRT", "TRUNC", "RECIP", "WHERE", "CAST", "BITCAST",
              "LOAD", "STORE", "RANGE", "DEFINE_ACC", "ACCUMULATE", "SPECIAL", "DEFINE_LOCAL", "BARRIER"}
    missing = {name for name in wanted if hasattr(Ops, name)} - {op.name for op in seen_ops}
    assert not missing, f"no snippet emits {sorted(missing)}"


EXAMPLES = sorted(glob.glob(str(ROOT / "kernels" / "*.tg")))


@needs_libclang
def test_example_folder_kernels_type_check(record_property):
    """Every kernel of every `kernels/*.tg` example type-checks; lint time per kernel is a few ms."""
    if not EXAMPLES:
        pytest.skip("no kernels/*.tg examples yet")
    linter = metal_mod.MetalLinter()  # a fresh one: no cached results, so the timing is real
    times, errors, unsupported = [], [], []
    for path in EXAMPLES:
        prog = tgc.load(path)
        try:
            kernels = prog.compile(device="METAL", dims=_dims_for(prog))
        except CompileError as e:
            if "64-bit floats" not in e.msg:
                raise
            unsupported.append(os.path.basename(path))
            continue
        for k in kernels:
            st = time.perf_counter()
            errors += [f"{os.path.basename(path)}: {d}" for d in linter.diagnostics(k.src)]
            times.append(time.perf_counter() - st)
    assert not errors, "\n".join(errors)
    assert times, f"every example uses f64: {unsupported}"
    median_ms = statistics.median(times) * 1e3
    record_property("metal_lint_median_ms", round(median_ms, 2))
    record_property("metal_lint_kernels", len(times))
    print(f"\nMETAL lint: {len(times)} kernels of {len(EXAMPLES)} examples, median {median_ms:.1f} ms, "
          f"max {max(times) * 1e3:.1f} ms")
    assert median_ms < 250, f"clang type-check is slow: median {median_ms:.1f} ms a kernel"


@pytest.mark.parametrize("src", ["x: f64[N]\nreturn x + 1", "x: f32[N]\nreturn cast(x, f64)",
                                 "x: i32[N]\nreturn cast(x, f64) * 2"])
def test_f64_is_a_clear_error(src):
    with pytest.raises(CompileError, match="Metal has no 64-bit floats") as e:
        tgc.loads(src).compile(device="METAL", dims={"N": 4})
    assert "f32" in (e.value.hint or "")


# ---------------------------------------------------------------- the linter on hand-written MSL

GOOD_MSL = """#include <metal_stdlib>
using namespace metal;
kernel void k(device float* out [[buffer(0)]], device const half* a [[buffer(1)]],
              device const long* b [[buffer(2)]], constant int& n [[buffer(3)]],
              uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup float tile[64];
  int i = int(gid.x) * 64 + int(lid.x);
  tile[lid.x] = float(a[i]) + float(b[i]);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float v = fmax(tile[lid.x], -INFINITY) + exp2(1.5f) + sqrt(2.0f) + trunc(v) + sin(0.5f);
  uint bits = as_type<uint>(v) ^ as_type<uint>(NAN);
  ushort h = as_type<ushort>(half(v));
  out[i] = isnan(v) ? 0.0f : as_type<float>(bits) + float(h) + float(max(char(1), char(n))) + float(ulong(3));
}
"""


@needs_libclang
def test_handwritten_msl_type_checks():
    assert metal_linter().diagnostics(GOOD_MSL) == []


# (what to change in GOOD_MSL, into what, a piece of the clang error it must give)
BROKEN_MSL = {
    "undeclared-function": ("float(a[i])", "undefined_fn(a[i])", "undeclared identifier 'undefined_fn'"),
    "write-to-constant": ("out[i] = ", "n = ", "cannot assign"),
    "as_type-size": ("as_type<uint>(v)", "as_type<ushort>(v)", "as_type: the source and destination types differ"),
    "misspelt-attribute": ("thread_position_in_threadgroup", "thread_positon_in_threadgroup",
                           "unknown Metal attribute 'thread_positon_in_threadgroup'"),
    "double": ("float v =", "double v =", "Metal has no 'double'"),
    "mixed-max": ("max(char(1), char(n))", "max(char(1), n)", "no matching function for call to 'max'"),
    "address-space": ("float(a[i]) +", "first(a) +", "cannot pass pointer to device address space"),
}


@needs_libclang
@pytest.mark.parametrize("case", list(BROKEN_MSL))
def test_broken_msl_gives_clang_errors(case):
    old, new, message = BROKEN_MSL[case]
    src = GOOD_MSL.replace(old, new)
    if case == "address-space":  # a device pointer handed to a function that takes a thread-space pointer
        src = src.replace("kernel void", "inline float first(const half* p) { return float(p[0]); }\nkernel void")
    assert src != GOOD_MSL
    with pytest.raises(CompileError) as e:
        metal_linter().lint(src, "broken.metal")
    err = e.value
    assert err.file == "broken.metal" and err.line is not None and err.col is not None
    assert err.text is not None and err.text.strip()
    everything = "\n".join(str(d) for d in err.diagnostics)
    assert message in everything, everything
    assert f"broken.metal:{err.line}:{err.col}: error:" in err.format()


@needs_libclang
def test_error_position_points_at_the_fault():
    src = "#include <metal_stdlib>\nusing namespace metal;\nkernel void k(device float* o [[buffer(0)]]) {\n" \
          "  o[0] = nope;\n}\n"
    with pytest.raises(CompileError) as e:
        metal_linter().lint(src)
    assert (e.value.file, e.value.line, e.value.col) == ("k.metal", 4, 10)
    assert "use of undeclared identifier 'nope'" in e.value.msg


@needs_libclang
def test_rendered_kernel_with_a_typo_fails_the_lint():
    k = tgc.loads("x: f32[N]\nreturn exp(x)").compile(device="METAL", dims={"N": 300})[0]
    assert "exp2(" in k.src
    with pytest.raises(CompileError, match="exp3"):
        get_device("METAL").lint(k.src.replace("exp2(", "exp3("))


def test_stub_header_ships_with_the_package():
    text = metal_mod.STUB_HEADER.read_text()
    for name in ("address_space", "_Float16", "ext_vector_type", "as_type", "INFINITY", "NAN", "poison double"):
        assert name in text


@off_macos
@needs_libclang
def test_compile_runs_the_lint_when_kernel_py_calls_it(monkeypatch):
    """The kernel compile step type-checks what it cannot compile (the `device.lint` hook)."""
    dev = get_device("METAL")
    render = MetalRenderer.render
    monkeypatch.setattr(dev, "renderer", type("Broken", (MetalRenderer,), {
        "render": lambda self, name, uops: render(self, name, uops).replace("data0[", "dta0[")})())
    with pytest.raises(CompileError, match="dta0"):
        tgc.loads("x: f32[N]\nreturn x * 3").compile(device="METAL", dims={"N": 5})


def test_cli_compile_shows_the_source_and_the_note():
    from click.testing import CliRunner

    from tgc.cli.main import main
    path = EXAMPLES[0] if EXAMPLES else None
    if path is None:
        pytest.skip("no kernels/*.tg examples yet")
    prog = tgc.load(path)
    args = ["compile", "-d", "METAL", path] + [a for k, v in _dims_for(prog).items() for a in ("-D", f"{k}={v}")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "kernel void" in result.output
    if not IS_MACOS:
        assert "macOS" in result.output


# ---------------------------------------------------------------- running (macOS with pyobjc only)


@needs_metal
@pytest.mark.gpu
@pytest.mark.parametrize("src, inputs", [
    ("x: f32[N]\ny: f32[N]\nreturn x * y + 1, exp(x), x.sum()", {"x": np.linspace(-1, 1, 300, dtype=np.float32),
                                                                  "y": np.linspace(2, 3, 300, dtype=np.float32)}),
    ("x: f16[N, M]\nreturn x.max(axis=1), cast(x, f32) * 2", {"x": np.arange(12, dtype=np.float16).reshape(3, 4)}),
    ("x: bf16[N]\nreturn x + x", {"x": np.array([1.5, -2.25, 3.0], dtype=np.float32)}),
    ("x: i64[N]\nm: bool[N]\nreturn where(m, x * 3, x // 2), m.sum()",
     {"x": np.array([-7, 5, 2**40], dtype=np.int64), "m": np.array([True, False, True])}),
    ("a: f32[N, K]\nb: f32[K, M]\nreturn a @ b", {"a": np.ones((5, 7), np.float32), "b": np.ones((7, 3), np.float32)}),
])
def test_runs_like_the_cpu(src, inputs):
    prog = tgc.loads(src)
    got = prog.run(device="METAL", **inputs)
    want = prog.run(device="CPU", **inputs)
    for name in want:
        np.testing.assert_allclose(np.asarray(got[name], np.float64), np.asarray(want[name], np.float64),
                                   rtol=1e-2 if "16" in src else 1e-5)


@needs_metal
@pytest.mark.gpu
def test_timed_launch_and_info():
    dev = get_device("METAL")
    k = tgc.loads("x: f32[N]\nreturn x * 2").compile(device="METAL", dims={"N": 1024})[0]
    assert k.binary is not None
    bufs = [dev.allocator.alloc(4096) for _ in k.bufs]
    t = k.program()(*bufs, global_size=k.global_size, local_size=k.local_size, vals=k.vals, wait=True)
    assert t is not None and t >= 0
    for b in bufs:
        dev.allocator.free(b, 4096)
    info = dev.info()
    assert info["available"] and info["compiler"]

