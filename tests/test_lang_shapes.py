"""Shape functions, basic indexing, tensor attributes and creation functions of the `.tg` language,
against the same operations in numpy (ints, so every comparison is exact)."""

from __future__ import annotations

import numpy as np
import pytest
from langkit import assert_close, assert_exact, run, run1, source_error

import tgc

X = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4) * 3 - 20
DECL = "x: i32[2, 3, 4]\n"


@pytest.mark.parametrize("expr, ref", [
    ("reshape(x, (4, 6))", lambda x: x.reshape(4, 6)),
    ("reshape(x, 6, -1)", lambda x: x.reshape(6, -1)),
    ("x.reshape((-1,))", lambda x: x.reshape(-1)),
    ("x.reshape(2, -1, 3)", lambda x: x.reshape(2, -1, 3)),
    ("reshape(x, [24, 1])", lambda x: x.reshape(24, 1)),
    ("permute(x, (2, 0, 1))", lambda x: x.transpose(2, 0, 1)),
    ("x.permute(1, 2, 0)", lambda x: x.transpose(1, 2, 0)),
    ("x.permute(-1, 0, 1)", lambda x: x.transpose(2, 0, 1)),
    ("transpose(x, 0, 2)", lambda x: x.swapaxes(0, 2)),
    ("x.transpose()", lambda x: x.swapaxes(-2, -1)),
    ("x.T", lambda x: x.T),
    ("expand(x[:, :1, :], (2, 5, 4))", lambda x: np.broadcast_to(x[:, :1, :], (2, 5, 4))),
    ("x[0].expand(3, 3, 4)", lambda x: np.broadcast_to(x[0], (3, 3, 4))),
    ("expand(x[:, :, :1], (2, 3, 6)) + 0", lambda x: np.broadcast_to(x[:, :, :1], (2, 3, 6))),
    ("squeeze(x[:, :1], 1)", lambda x: x[:, :1].squeeze(1)),
    ("x[:1, :, :1].squeeze()", lambda x: x[:1, :, :1].squeeze()),
    ("x[:1, :, :1].squeeze((0, -1))", lambda x: x[:1, :, :1].squeeze((0, 2))),
    ("unsqueeze(x, 0)", lambda x: x[None]),
    ("x.unsqueeze(-1)", lambda x: x[..., None]),
    ("x.unsqueeze(2)", lambda x: np.expand_dims(x, 2)),
    ("flatten(x)", lambda x: x.reshape(-1)),
    ("x.flatten(1)", lambda x: x.reshape(2, 12)),
    ("flip(x, 0)", lambda x: np.flip(x, 0)),
    ("x.flip((1, 2))", lambda x: np.flip(x, (1, 2))),
    ("flip(x, -1)", lambda x: np.flip(x, -1)),
    ("pad(x, ((0, 0), (1, 2), (0, 1)))", lambda x: np.pad(x, ((0, 0), (1, 2), (0, 1)))),
    ("pad(x, ((1, 0), (0, 0), (2, 2)), value=-7)", lambda x: np.pad(x, ((1, 0), (0, 0), (2, 2)), constant_values=-7)),
    ("x.pad(((0, 1), (1, 0), (0, 0)), 5)", lambda x: np.pad(x, ((0, 1), (1, 0), (0, 0)), constant_values=5)),
    ("cat(x, x * 2, axis=1)", lambda x: np.concatenate([x, x * 2], 1)),
    ("cat(x[:, :1], x, x[:, 1:], axis=1)", lambda x: np.concatenate([x[:, :1], x, x[:, 1:]], 1)),
    ("cat(x, x)", lambda x: np.concatenate([x, x], 0)),
    ("cat(x, -x, axis=-1)", lambda x: np.concatenate([x, -x], -1)),
    ("stack(x, x + 1)", lambda x: np.stack([x, x + 1])),
    ("stack(x, x + 1, x + 2, axis=2)", lambda x: np.stack([x, x + 1, x + 2], 2)),
    ("stack(x, x, axis=-1)", lambda x: np.stack([x, x], -1)),
    ("permute(reshape(x, (6, 4)), (1, 0))[1:3]", lambda x: x.reshape(6, 4).T[1:3]),
    ("flip(pad(x, ((0, 0), (1, 1), (0, 0)), 9), 1).reshape(2, -1)",
     lambda x: np.flip(np.pad(x, ((0, 0), (1, 1), (0, 0)), constant_values=9), 1).reshape(2, -1)),
])
def test_shape_functions(device, expr, ref):
    assert_exact(run1(DECL + f"return {expr}", device, x=X), ref(X), "i32")


def test_cat_promotes_and_stack_of_scalars(device):
    a = np.array([1, 2], np.int8)
    b = np.array([300, 400, 500], np.int16)
    f = np.array([0.5], np.float32)
    out = run("a: i8[2]\nb: i16[3]\nf: f32[1]\nreturn cat(a, b), cat(a, f), stack(a[0], a[1], b[2])", device,
              a=a, b=b, f=f)
    assert_exact(out["out0"], [1, 2, 300, 400, 500], "i16")
    assert_close(out["out1"], [1, 2, 0.5], "f32")
    assert_exact(out["out2"], [1, 2, 500], "i16")


def test_pad_value_in_float_and_bool(device):
    f = np.array([[1.5, -2.0]], np.float32)
    m = np.array([True, False])
    out = run("f: f32[1, 2]\nm: bool[2]\nreturn pad(f, ((1, 0), (0, 2)), value=-inf), pad(m, ((1, 1),), value=True)",
              device, f=f, m=m)
    assert_close(out["out0"], np.pad(f, ((1, 0), (0, 2)), constant_values=-np.inf), "f32")
    assert_exact(out["out1"], [True, True, False, True], "bool")


# --- basic indexing

Y = np.arange(5 * 6 * 7, dtype=np.int32).reshape(5, 6, 7)
INDEXES = [
    "1:-1", "::2", "::-1", "::-2", "-2::-2", "3", "-1", "-5", "None", "...", "..., 1", "1, ..., None", "-100:100",
    "5:2", "4:1:-1", ":, ::-1", "1:3, ::-3, -2", "None, 2, None, :, 3", ":, :, 6:-8:-1", "..., ::3, None",
    "2:100, -100:-3", "-1, -1, -1", "0:0", "::-1, ::-1, ::-1", "1:4:2, 5:0:-2, 1::4", ":, 10:, :", "None, None",
    "::7, 0, ::-7",
]


@pytest.mark.parametrize("index", INDEXES)
def test_basic_indexing_matches_numpy(device, index):
    out = run1(f"y: i32[5, 6, 7]\nreturn y[{index}]", device, y=Y)
    assert_exact(out, eval(f"Y[{index}]", {"Y": Y}), "i32")  # numpy's own basic indexing


def test_chained_indexing_and_index_arithmetic(device):
    out = run("y: i32[5, 6, 7]\nn = y.shape[0] - 2\nreturn y[1:][::-1][0, n], y[y.ndim - 2:][-1, :, y.shape[2] // 2]",
              device, y=Y)
    assert_exact(out["out0"], Y[1:][::-1][0, 3], "i32")
    assert_exact(out["out1"], Y[1:][-1, :, 3], "i32")


@pytest.mark.parametrize("index", ["5", "-6", "0, -7", "..., 7", "None, 1, 6"])
def test_out_of_range_integer_index_is_an_error(index):
    e = source_error(f"y: i32[5, 6, 7]\nz = y[{index}] + 1\nreturn z")
    assert (e.line, e.col) == (2, 5)
    assert "out of range" in e.msg


def test_out_of_range_index_with_named_dims_is_an_error_at_run(device):
    prog = tgc.loads("y: i32[N]\nreturn y[3]")
    assert_exact(prog.run(device=device, y=np.arange(5, dtype=np.int32))["out0"], np.array(3), "i32")
    with pytest.raises(tgc.TgcError) as info:
        prog.run(device=device, y=np.arange(3, dtype=np.int32))
    assert info.value.line == 2 and "out of range" in info.value.msg


# --- attributes


def test_shape_ndim_dtype_T_attributes(device):
    x = np.arange(6, dtype=np.int16).reshape(2, 3)
    f = np.array([0.5, 1.5, 2.5], np.float32)
    src = ("x: i16[A, B]\nf: f32[B]\n"
           "return reshape(x, (x.shape[0] * x.shape[1],)), zeros(x.shape, dtype=x.dtype), cast(f, x.dtype), "
           "sum(x, axis=x.ndim - 1), x.T, full(x.T.shape, x.ndim), x.shape[-1] + f, ones(f.shape[0], x.shape[0])")
    out = run(src, device, x=x, f=f)
    assert_exact(out["out0"], x.reshape(6), "i16")
    assert_exact(out["out1"], np.zeros((2, 3)), "i16")
    assert_exact(out["out2"], [0, 1, 2], "i16")
    assert_exact(out["out3"], x.sum(1), "i32")
    assert_exact(out["out4"], x.T, "i16")
    assert_exact(out["out5"], np.full((3, 2), 2), "i32")
    assert_close(out["out6"], 3 + f.astype(np.float64), "f32")
    assert_close(out["out7"], np.ones((3, 2)), "f32")


# --- creation


@pytest.mark.parametrize("expr, want, dt", [
    ("zeros((2, 3))", np.zeros((2, 3)), "f32"),
    ("zeros(2, 3, dtype=i8)", np.zeros((2, 3)), "i8"),
    ("ones(4)", np.ones(4), "f32"),
    ("ones((2, 2), dtype=u16)", np.ones((2, 2)), "u16"),
    ("ones(3, dtype=bool)", np.ones(3, bool), "bool"),
    ("full((2, 2), 7, dtype=i8)", np.full((2, 2), 7), "i8"),
    ("full((3,), 2.5)", np.full(3, 2.5), "f32"),
    ("full((2,), 4)", np.full(2, 4), "i32"),
    ("full((2, 1), True)", np.full((2, 1), True), "bool"),
    ("full((2,), -1, dtype=u8)", np.full(2, 255), "u8"),
    ("full((2,), 3, dtype=f16)", np.full(2, 3.0), "f16"),
    ("full((2,), 1.5, dtype=f64)", np.full(2, 1.5), "f64"),
    ("arange(5)", np.arange(5), "i32"),
    ("arange(1, 8, 2)", np.arange(1, 8, 2), "i32"),
    ("arange(5, 0, -1)", np.arange(5, 0, -1), "i32"),
    ("arange(10, 0, -3)", np.arange(10, 0, -3), "i32"),
    ("arange(0.0, 1.0, 0.25)", np.arange(0.0, 1.0, 0.25), "f32"),
    ("arange(2.5)", np.arange(2.5), "f32"),
    ("arange(-1, 1, 0.5)", np.arange(-1, 1, 0.5), "f32"),
    ("arange(3, 3)", np.arange(3, 3), "i32"),
    ("eye(3)", np.eye(3), "f32"),
    ("eye(1)", np.eye(1), "f32"),
    ("eye(4) * arange(4)", np.eye(4) * np.arange(4), "f32"),
    ("zeros(()) + 1", np.array(1.0), "f32"),
])
def test_creation_functions(device, expr, want, dt):
    out = run1(f"return {expr}", device)
    if dt.startswith("f"):
        assert_close(out, want, dt)
    else:
        assert_exact(out, want, dt)


def test_bf16_constants(device):
    out = run("return full((2,), 1.5, dtype=bf16), ones(3, dtype=bf16)", device)
    assert_exact(out["out0"], [1.5, 1.5], "bf16")
    assert_exact(out["out1"], [1, 1, 1], "bf16")


def test_creation_mixed_with_inputs(device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = run("x: f32[3, 4]\nreturn x + arange(4), x * eye(3, 4), x @ ones((4, 2)), x + zeros((2, 1, 1))", device,
              x=x)
    assert_close(out["out0"], x + np.arange(4), "f32")
    assert_close(out["out1"], x * np.eye(3, 4), "f32")
    assert_close(out["out2"], x @ np.ones((4, 2)), "f32", scale=np.abs(x).sum(1, keepdims=True))
    assert_close(out["out3"], x + np.zeros((2, 1, 1)), "f32")
