"""ONNX ops whose plain formulas gave wrong results: Pad edge/reflect/wrap with negative (cropping) pads,
Softplus and the hyperbolic functions at large |x|, integer Pow; each compared with numpy (or exact integers)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

import tgc  # noqa: E402

_TP = {np.float32: TP.FLOAT, np.float16: TP.FLOAT16, np.float64: TP.DOUBLE, np.int64: TP.INT64,
       np.int32: TP.INT32}


def _run(tmp_path, op: str, feeds: dict, inits: dict | None = None, opset: int = 18, **attrs) -> np.ndarray:
    inits = inits or {}
    ins = [h.make_tensor_value_info(k, _TP[v.dtype.type], list(v.shape)) for k, v in feeds.items()]
    g = h.make_graph([h.make_node(op, [*feeds, *inits], ["z"], **attrs)], "g", ins,
                     [h.make_tensor_value_info("z", TP.UNDEFINED, None)],
                     [nh.from_array(v, k) for k, v in inits.items()])
    m = onnx.shape_inference.infer_shapes(h.make_model(g, opset_imports=[h.make_opsetid("", opset)]))
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    return np.asarray(tgc.load(str(path)).run(device="CPU", inputs=feeds)["z"])


def _np_pad(x: np.ndarray, pads: list, mode: str) -> np.ndarray:
    r = x.ndim
    b, e = pads[:r], pads[r:]
    x = x[tuple(slice(max(-p, 0), x.shape[i] - max(-q, 0)) for i, (p, q) in enumerate(zip(b, e)))]
    return np.pad(x, [(max(p, 0), max(q, 0)) for p, q in zip(b, e)], mode=mode)


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap", "constant"])
def test_pad_with_negative_pads_crops_then_pads(tmp_path, mode):
    x = np.arange(2 * 5 * 6, dtype=np.float32).reshape(2, 5, 6)
    pads = [0, -1, 2, 0, 1, -2]  # axis 1: crop 1 before, pad 1 after; axis 2: pad 2 before, crop 2 after
    got = _run(tmp_path, "Pad", {"x": x}, {"p": np.array(pads, np.int64)}, mode=mode)
    want = _np_pad(x, pads, mode)
    assert got.shape == want.shape and np.array_equal(got, want)


def _softplus(v: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, v)


_FNS = {"Softplus": _softplus, "Mish": lambda v: v * np.tanh(_softplus(v)), "Sinh": np.sinh, "Cosh": np.cosh,
        "Asinh": np.arcsinh, "Acosh": np.arccosh, "Atanh": np.arctanh}


@pytest.mark.parametrize("dt", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("op", list(_FNS))
def test_unary_stable_over_a_wide_range(tmp_path, op, dt):
    """Softplus, Mish and the hyperbolic functions where their plain formulas overflow (exp(89), x * x of 1e20,
    exp(12) in f16) or cancel (1 + 1e-7, exp(x) - exp(-x) near 0): numpy's f64 value rounded to the dtype."""
    mag = np.logspace(-8, 30, 120)
    x = np.concatenate([-mag, mag, [0.0, 0.5, -0.5, 1.0, -1.0, 20.0, 88.5, 89.0, -1e5, 1e20, -1000.0, 12.0]])
    if op == "Atanh":
        x = np.concatenate([np.linspace(-1, 1, 201), [1e-7, -3e-6, 0.9975, -0.9999, 1.5]])
    if op == "Acosh":
        x = np.concatenate([1 + mag, [0.5, 1.0, 1e20, 1e30]])
    with np.errstate(all="ignore"):
        x = x.astype(dt)
        want = _FNS[op](x.astype(np.float64)).astype(dt).astype(np.float64)
    got = _run(tmp_path, op, {"x": x})
    assert got.dtype == dt
    rtol, atol = {np.float16: (1e-3, 0.0), np.float32: (3e-6, 1e-37), np.float64: (1e-13, 1e-300)}[dt]
    # (f32's subnormal results, below 1.2e-38, may flush to 0)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("bdt", [np.int64, np.int32])
def test_int_pow_is_exact(tmp_path, bdt):
    """Integer Pow by square and multiply: 10**18, 7**21, 3**39 exact (round(pow(f64, f64)) gave 999999999999997312
    for 10**18); a negative exponent gives the integer part, as C's pow cast to int (2**-1 is 0, (-1)**-3 is -1)."""
    a = np.array([10, 7, 3, 2, -3, 5, 2, -1, 1, 0], np.int64)
    b = np.array([18, 21, 39, 62, 39, 0, -1, -3, -7, 5], bdt)
    got = _run(tmp_path, "Pow", {"a": a, "b": b})
    want = [10 ** 18, 7 ** 21, 3 ** 39, 2 ** 62, (-3) ** 39, 1, 0, -1, 1, 0]
    assert got.dtype == np.int64 and got.tolist() == want
    a32 = np.array([3, -2, 46340], np.int32)
    got = _run(tmp_path, "Pow", {"a": a32}, {"b": np.array(2, bdt)})  # (a constant exponent 2: a * a)
    assert got.dtype == np.int32 and got.tolist() == [9, 4, 46340 ** 2]
    got = _run(tmp_path, "Pow", {"a": a32}, {"b": np.array([19, 31, 1], bdt)})
    assert got.dtype == np.int32 and got.tolist() == [3 ** 19, (-2) ** 31, 46340]


def _edge_pad(x, p):
    return np.pad(x, ((p[0], p[2]), (p[1], p[3])), mode="edge")


def _argmax_last(x):
    return (x.shape[1] - 1 - np.argmax(x[:, ::-1], axis=1))[:, None]  # (keepdims=1)


@pytest.mark.parametrize("op, extra, attrs, want", [
    ("Gather", {"i": np.array([0, 1], np.int64)}, {"axis": 1}, lambda x: x[:, [0, 1]]),
    ("Pad", {"p": np.array([0, 1, 0, 2], np.int64)}, {"mode": "edge"}, lambda x: _edge_pad(x, [0, 1, 0, 2])),
    ("ArgMax", {}, {"axis": 1, "select_last_index": 1}, _argmax_last),
])
def test_symbolic_dim_an_op_needs_as_a_number_runs_per_size(tmp_path, op, extra, attrs, want):
    """A dim_param on an axis whose size the op's translation computes with: the model is translated per size
    once the dims are known (it was one clear error before), matching numpy at each size; its symbolic path is
    one error naming the node, the op, the input's axis and the dim_param (never a leaked "bad operand type
    for unary -: 'str'"), exit 2."""
    from clikit import assert_clean, invoke

    g = h.make_graph([h.make_node(op, ["x", *extra], ["z"], name="the_node", **attrs)], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [2, "n"])],
                     [h.make_tensor_value_info("z", TP.INT64 if op == "ArgMax" else TP.FLOAT, [None, None])],
                     [nh.from_array(v, k) for k, v in extra.items()])
    path = tmp_path / "m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 18)]), str(path))
    m = tgc.load(str(path))
    for n in (3, 5):
        x = np.array([[1, 4, 4, 0, 2], [3, 3, -1, 3, 0]], np.float32)[:, :n]
        got = m.run(device="CPU", inputs={"x": x})["z"]
        np.testing.assert_array_equal(got, want(x))
    with pytest.raises(tgc.TgcError) as e:
        m.run(device="CPU", inputs={"x": x}, symbolic=True)
    for w in ("the_node", op, "axis 1 of 'x' is 'n'", "dim_param"):
        assert w in e.value.msg
    assert "TypeError" not in e.value.msg
    r = invoke("run", str(path), "--random", "-D", "n=3", "--symbolic")
    assert_clean(r, 2, "the_node", "'n'", "--symbolic")
    assert invoke("run", str(path), "--random", "-D", "n=3").exit_code == 0


def test_pad_constant_with_a_computed_value_and_a_crop(tmp_path):
    """A pad value from the graph (not a constant) with a negative pad: the mask of the inside has the cropped
    sizes (it had the input's)."""
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    v = np.array(-7.0, np.float32)
    pads = [-1, 2, 1, -2]
    g = h.make_graph([h.make_node("Pad", ["x", "p", "v"], ["z"], mode="constant")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [4, 5]), h.make_tensor_value_info("v", TP.FLOAT, [])],
                     [h.make_tensor_value_info("z", TP.FLOAT, [4, 5])], [nh.from_array(np.array(pads, np.int64), "p")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 18)]), str(tmp_path / "m.onnx"))
    got = np.asarray(tgc.load(str(tmp_path / "m.onnx")).run(device="CPU", inputs={"x": x, "v": v})["z"])
    want = np.pad(x[1:, :3], [(0, 1), (2, 0)], constant_values=-7.0)
    assert got.shape == want.shape and np.array_equal(got, want)


def test_rnn_softplus_activation_is_stable(tmp_path):
    """An RNN with a Softplus activation: h = softplus(x W^T + h R^T), finite where exp(x W^T) overflows f32."""
    x = np.array([[[100.0, -100.0]], [[-30.0, 95.0]]], np.float32)  # (seq 2, batch 1, input 2)
    w = np.array([[[1.0, 0.0], [0.0, 1.0]]], np.float32)  # (1, hidden 2, input 2)
    r = np.zeros((1, 2, 2), np.float32)
    got = _run(tmp_path, "RNN", {"x": x}, {"w": w, "r": r}, hidden_size=2, activations=["Softplus"])
    want = np.logaddexp(0, x.astype(np.float64)).reshape(2, 1, 1, 2)  # (R = 0: each step is softplus(x W^T))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=3e-6, atol=1e-37)  # (exp(-30) in f32: ~1e-6)
