"""Pads that tile an axis, summed, then a strided conv: the upcast copies of the output fold whole pads away.

The CPU once gave wrong numbers for the program below: after upcasting the output rows, each copy's constant
row decided the pads' gates, so every load of `x1` folded away *after* the buffers had been renumbered. The
kernel then declared parameters data0, data1, data3, data4 while the launch passed five buffers in order, so
`x1` was read as `x2` and `x2` as the weight. PYTHON (which indexes buffers by number) was right.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langkit import assert_close, run1

import tgc

THREE_PADS = """\
x0: f32[1, 1, 2, 6]
x1: f32[1, 1, 2, 6]
x2: f32[1, 1, 2, 6]
w: f32[1, 1, 2, 2]
full = pad(x0, ((0,0),(0,0),(0,4),(0,0))) + pad(x1, ((0,0),(0,0),(2,2),(0,0))) + pad(x2, ((0,0),(0,0),(4,0),(0,0)))
return conv2d(full, w, stride=4)
"""


def conv2d_ref(x: np.ndarray, w: np.ndarray, stride: int) -> np.ndarray:
    """NCHW input, OIHW weight, no padding (float64)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw].astype(np.float64)
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w.astype(np.float64))
    return out


def _pads(h: int, n: int, axis: int = 2) -> list[tuple[tuple[int, int], ...]]:
    """Pad widths that place n pieces of height h one after the other along `axis`."""
    out = []
    for i in range(n):
        widths = [(0, 0)] * 4
        widths[axis] = (i * h, (n - 1 - i) * h)
        out.append(tuple(widths))
    return out


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_three_pads_then_a_strided_conv_match_numpy(device):
    rng = np.random.default_rng(0)
    ins = {k: rng.standard_normal((1, 1, 2, 6)).astype(np.float32) for k in ("x0", "x1", "x2")}
    ins["w"] = rng.standard_normal((1, 1, 2, 2)).astype(np.float32)
    full = sum(np.pad(ins[f"x{i}"], p) for i, p in enumerate(_pads(2, 3)))
    want = conv2d_ref(full, ins["w"], 4)
    ref = next(iter(tgc.loads(THREE_PADS).reference(**ins).values()))  # the float64 evaluator agrees
    np.testing.assert_allclose(ref, want, rtol=1e-6, atol=1e-6)
    got = run1(THREE_PADS, device, **ins)
    assert_close(got, want, "f32", scale=np.abs(full).max() * np.abs(ins["w"]).sum())


def test_three_pads_kernel_declares_every_buffer_it_is_passed():
    """The kernel's parameters are exactly the buffers a launch passes (here x1 is never read: dropped)."""
    (k,) = tgc.loads(THREE_PADS).compile(device="CPU")
    params = sorted(u.arg for u in k.uops if u.op.name == "DEFINE_GLOBAL")
    assert params == list(range(len(k.bufs)))
    assert "%data4" not in k.src and "%data3" in k.src  # renumbered after the last fold, not before
    assert k.bytes_moved == (4 + 12 + 12 + 4) * 4  # out, x0 and x2 (spans of their indices), w; x1 not at all


@st.composite
def pad_add_conv(draw):
    """n pieces tiled along H or W by pads, summed, then a conv whose stride and kernel skip some pieces."""
    n = draw(st.integers(2, 4))
    axis = draw(st.sampled_from([2, 3]))
    piece = draw(st.integers(1, 3))
    other = draw(st.integers(1, 6))
    c = draw(st.integers(1, 2))
    o = draw(st.integers(1, 2))
    shape = (1, c, piece, other) if axis == 2 else (1, c, other, piece)
    full_hw = [shape[2], shape[3]]
    full_hw[axis - 2] *= n
    k = draw(st.integers(1, min(3, *full_hw)))
    stride = draw(st.integers(1, 5))
    return n, axis, piece, shape, (o, c, k, k), stride


@settings(max_examples=30, deadline=None, database=None)
@given(case=pad_add_conv(), seed=st.integers(0, 2**16))
@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_random_pad_add_strided_conv_match_numpy(device, case, seed):
    n, axis, piece, shape, wshape, stride = case
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]
    w = rng.standard_normal(wshape).astype(np.float32)
    pads = _pads(piece, n, axis)
    decl = [f"x{i}: f32[{', '.join(map(str, shape))}]" for i in range(n)]
    decl.append(f"w: f32[{', '.join(map(str, wshape))}]")
    terms = " + ".join(f"pad(x{i}, {pads[i]})" for i in range(n))
    src = "\n".join([*decl, f"full = {terms}", f"return conv2d(full, w, stride={stride})"])
    full = sum(np.pad(x, p) for x, p in zip(xs, pads))
    want = conv2d_ref(full, w, stride)
    got = run1(src, device, w=w, **{f"x{i}": x for i, x in enumerate(xs)})
    assert_close(got, want, "f32", scale=np.abs(full).max() * np.abs(w).sum() + 1)


@pytest.mark.parametrize("device", ["CPU", "CUDA", "OPENCL", "METAL", "PYTHON"])
@pytest.mark.parametrize("opts", [[("UPCAST", 0, 2)], [("UPCAST", 0, 2), ("UPCAST", 1, 2)]])
def test_every_renderer_gets_dense_parameters_when_an_upcast_folds_a_buffer_away(device, opts):
    """Compile only: upcasting the output rows (as BEAM may on any device) folds x1's loads away; every
    renderer names parameters by buffer number, so the kernel must declare exactly data0..data3."""
    from tgc.backends import get_device
    from tgc.codegen.opt import Opt
    from tgc.codegen.pipeline import lower
    item = tgc.loads(THREE_PADS).schedule({}, "CPU")[0]
    low = lower(item.ast, get_device(device), item.bufs, item.name, opts=[Opt(*o) for o in opts])
    assert sorted(u.arg for u in low.uops if u.op.name == "DEFINE_GLOBAL") == [0, 1, 2, 3]
    assert [item.bufs.index(b) for b in low.bufs] == [0, 1, 3, 4]  # out, x0, x2, w: x1 dropped
    if device != "PYTHON":
        assert "data3" in low.src and "data4" not in low.src
