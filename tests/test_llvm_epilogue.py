"""A register tile's epilogue as a function of its own (`tgc/backends/llvmir.py`, `_Renderer.outline`): the
straight-line code after a tile's reduction loops that ends the enclosing loop's body, with at least
`OUTLINE_MIN_MEMORY_OPS` buffer loads and stores, is rendered as an internal `noinline` function called once per
tile, so LLVM's loop passes no longer analyse its memory ops (the first call's LLVM time). Convolution tiles
against numpy (residual, stride, 1x1, sizes as kernel arguments), what is left in place (gated stores, small
epilogues, scalar kernels), and kernels equal but for their names still sharing one binary."""

from __future__ import annotations

import numpy as np
import pytest
from convkit import conv_np

import tgc
from tgc.backends import llvmir
from tgc.engine import schedule


@pytest.fixture
def pack_small(monkeypatch):
    """Pack convolutions of every size (these shapes are below the size where packing pays): register tiles."""
    monkeypatch.setattr(schedule, "CONV_MIN_FLOPS", 0)


def _case(n: int, c: int, hw: int, o: int, k: int, stride: int, pad: int, residual: bool, dims: bool = False,
          seed: int = 0) -> tuple[str, dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = rng.standard_normal((o, c, k, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    want = conv_np(x, w, stride, pad) + b.reshape(1, -1, 1, 1)
    batch = "N" if dims else str(n)
    src = f"x: f32[{batch}, {c}, {hw}, {hw}]\nw: f32[{o}, {c}, {k}, {k}]\nb: f32[{o}]\n"
    y = f"conv2d(x, w, stride={stride}, padding={pad}) + b.reshape(1, -1, 1, 1)"
    inputs = {"x": x, "w": w, "b": b}
    if residual:
        r = rng.standard_normal(want.shape).astype(np.float32)
        src += f"r: f32[{batch}, {', '.join(map(str, want.shape[1:]))}]\n"
        y = f"{y} + r"
        inputs["r"] = r
        want = want + r
    return src + f"return relu({y})", inputs, np.maximum(want, 0)


def _functions(src: str) -> tuple[str, list[str]]:
    """The kernel's own function and its outlined epilogues, as text."""
    parts = src.split("\ndefine internal void ")
    return parts[0], parts[1:]


CASES = [  # (N, C, H=W, O, K, stride, padding, residual)
    (1, 16, 14, 32, 3, 1, 1, True),  # ResNet's 3x3 at 14x14: 2 x 16 channels x 7 columns a tile, a residual
    (2, 8, 15, 16, 3, 2, 1, False),  # stride 2, 8 output columns
    (1, 24, 8, 48, 1, 1, 0, True),  # 1x1 at 8 columns, 3 vectors of channels
]


def _id(c: tuple) -> str:
    return "x".join(map(str, c[:5])) + f"_s{c[5]}" + ("_res" if c[7] else "")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_a_conv_tiles_epilogue_is_a_function_of_its_own_and_right(case, pack_small, monkeypatch):
    src, inputs, want = _case(*case)
    conv = tgc.loads(src).compile(device="CPU", tuned=False)[-1].src
    kernel, epilogues = _functions(conv)
    assert len(epilogues) == 1 and epilogues[0].startswith("@tgc_epilogue0(")
    assert kernel.count("call void @tgc_epilogue0(") == 1
    assert "noinline" in conv.split("attributes #1", 1)[1]
    # every store to a buffer is in the epilogue: the kernel's loops store only to their accumulators
    assert all("ptr %acc" in ln for ln in kernel.splitlines() if ln.lstrip().startswith("store "))
    assert sum(ln.lstrip().startswith("store ") for ln in epilogues[0].splitlines()) >= llvmir.OUTLINE_MIN_MEMORY_OPS
    got = tgc.loads(src).run(device="CPU", **inputs)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # the same tile with its epilogue left in place computes the same values, bit for bit
    monkeypatch.setattr(llvmir, "OUTLINE_MIN_MEMORY_OPS", 1 << 30)
    inline = tgc.loads(src)
    assert "define internal" not in inline.compile(device="CPU", tuned=False)[-1].src
    np.testing.assert_array_equal(inline.run(device="CPU", **inputs)["out0"], got)


def test_a_tile_compiled_for_every_size_keeps_its_epilogue_outlined_and_right(pack_small, monkeypatch):
    """Compiled once for every batch size (`symbolic=True`, the size a kernel argument, indices i64): the tiled
    form's epilogue takes the kernel's i64 values like any other. (The bounds checker the tests turn on keeps
    symbolic plans to their general forms: off here, so the tiled form is built.)"""
    monkeypatch.setenv("TGC_VERIFY_BOUNDS", "0")
    src, _, _ = _case(1, 16, 14, 32, 3, 1, 1, True, dims=True)
    prog = tgc.loads(src)
    plan = prog.compile_symbolic(device="CPU")
    fast = [k.src for k in plan.fast if k is not None and "define internal" in k.src]
    assert fast and "i64 %" in _functions(fast[0])[1][0].split("\n", 1)[0]
    for n in (2, 3):
        _, inputs, want = _case(n, 16, 14, 32, 3, 1, 1, True, dims=True, seed=n)
        got = prog.run(device="CPU", dims={"N": n}, symbolic=True, **inputs)["out0"]
        assert prog.last_run == "symbolic"
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_gated_and_small_epilogues_and_scalar_kernels_stay_in_place(pack_small):
    """Where the epilogue is not straight-line (13 columns padded to 14: the extra column's stores are gated, each
    a branch), or has few memory ops (a matmul tile's rows of whole vectors, a matrix-vector product's one
    store), the kernel is one function as before, and right."""
    src, inputs, want = _case(1, 8, 13, 32, 3, 1, 1, True)
    prog = tgc.loads(src)
    assert all("define internal" not in k.src for k in prog.compile(device="CPU", tuned=False))
    np.testing.assert_allclose(prog.run(device="CPU", **inputs)["out0"], want, rtol=1e-4, atol=1e-4)
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 32)).astype(np.float32)
    mm = tgc.loads("x: f32[16, 32]\nw: f32[32, 32]\nreturn relu(x @ w)")
    srcs = [k.src for k in mm.compile(device="CPU", tuned=False)]
    assert any("store <16 x float>" in s for s in srcs) and all("define internal" not in s for s in srcs)
    np.testing.assert_allclose(mm.run(device="CPU", x=x, w=w)["out0"], np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)
    a, v = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    mv = tgc.loads("a: f32[64, 96]\nv: f32[96]\nreturn exp(a) @ v")
    assert all("define internal" not in k.src for k in mv.compile(device="CPU", tuned=False))
    np.testing.assert_allclose(mv.run(device="CPU", a=a, v=v)["out0"], np.exp(a.astype(np.float64)) @ v, rtol=1e-4)


def test_kernels_equal_but_for_their_names_share_one_binary(pack_small):
    """The outlined epilogue is internal, with a name of its own (not the kernel's): two layers that differ only in
    their kernels' names have one canonical source (one compile, one binary, loaded under either name)."""
    from tgc.backends import get_device

    rng = np.random.default_rng(2)
    x, r = (rng.standard_normal((1, 32, 14, 14)).astype(np.float32) for _ in range(2))
    w = (rng.standard_normal((32, 32, 1, 1)) / 16).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    # 1x1 convs: a padded conv reads a padded copy of its input (schedule._reading_padded_copy), into which the
    # layer before's epilogue then fuses, so two padded layers' conv kernels differ in more than their names
    layer = "relu(conv2d({}, w, padding=0) + b.reshape(1, -1, 1, 1) + r)"
    prog = tgc.loads("x: f32[1, 32, 14, 14]\nw: f32[32, 32, 1, 1]\nb: f32[32]\nr: f32[1, 32, 14, 14]\n"
                     f"h = {layer.format('x')}\nreturn {layer.format('h')}")
    convs = [k for k in prog.compile(device="CPU", tuned=False) if "define internal" in k.src]
    assert len(convs) == 2 and convs[0].name != convs[1].name and convs[0].src != convs[1].src
    canon = {get_device("CPU").canonical_source(k.src) for k in convs}
    assert len(canon) == 1 and "@tgc_kernel(" in next(iter(canon))
    assert convs[0].binary == convs[1].binary
    h = np.maximum(conv_np(x, w, 1, 0) + b.reshape(1, -1, 1, 1) + r, 0)
    want = np.maximum(conv_np(h.astype(np.float32), w, 1, 0) + b.reshape(1, -1, 1, 1) + r, 0)
    np.testing.assert_allclose(prog.run(device="CPU", x=x, w=w, b=b, r=r)["out0"], want, rtol=1e-4, atol=1e-4)
