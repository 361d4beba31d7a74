"""Two numeric fixes, checked against numpy and ONNX's reference evaluator (never tgc's own output):

- ONNX `Mod` is exact at large quotients: `fmod=0` is the language's `%` (numpy's mod), `fmod=1` is C's fmod
  (numpy's `np.fmod`), both built on the ALU's exact fmod, not `x - trunc(x / y) * y`.
- A half constant (f16, bf16) is rounded to its own type before half arithmetic runs in f32, so `x_f16 * 0.1`
  is numpy's `x16 * np.float16(0.1)`; bf16 by tgc's rule (`tgc.dtype.f32_to_bf16`: nearest, ties to even).
"""

from __future__ import annotations

import numpy as np
import pytest
from langkit import bf16_round, run1

import tgc

# large quotients (123456.7 / 0.1 ~ 1.2e6, 1e7 / 0.3), negative operands of each sign, zero dividends, an
# infinite divisor, a quotient below 1
A = np.array([123456.7, -123456.7, 123456.7, -123456.7, 1e7, -1e7, 5.5, -5.5, 0.0, -0.0, 2.5, -2.5, 0.25],
             np.float32)
B = np.array([0.1, 0.1, -0.1, -0.1, 0.3, 0.3, -2.0, 2.0, 3.0, 3.0, np.inf, np.inf, 7.0], np.float32)


def _mod_model(tmp_path, fmod: int, t: int, n: int) -> str:
    onnx = pytest.importorskip("onnx")
    from onnx import helper as h

    node = h.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)
    vi = [h.make_tensor_value_info(k, t, [n]) for k in ("a", "b")]
    g = h.make_graph([node], "g", vi, [h.make_tensor_value_info("y", t, [n])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    path = tmp_path / f"mod{fmod}.onnx"
    onnx.save(m, str(path))
    return str(path)


def _reference(path: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(path).run(None, {"a": a, "b": b})[0]


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_onnx_float_mod_is_exact_at_large_quotients(tmp_path, fmod, dt):
    from onnx import TensorProto as TP

    a, b = (A.astype(np.float64), B.astype(np.float64)) if dt == "f64" else (A, B)
    if dt == "f64":
        a[0], b[0] = 123456.7, 0.1  # the f64 values themselves
    path = _mod_model(tmp_path, fmod, TP.DOUBLE if dt == "f64" else TP.FLOAT, len(a))
    want = _reference(path, a, b)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(want, np.fmod(a, b) if fmod else np.mod(a, b))  # the reference is numpy's
    got = tgc.load(path).run(device="CPU", a=a, b=b)["y"]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # exact, inf divisors included
    if fmod:  # C fmod: a zero result keeps the dividend's sign (-0.0 % 3 is -0.0)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    if dt == "f32":  # f32's 123456.7 % 0.1 is fmod's 0.0012..., not the 0 or 0.1 of x - trunc(x / y) * y
        assert 0 < abs(got[0]) < 0.01


def test_onnx_float_mod_zero_divisor_and_nan(tmp_path):
    from onnx import TensorProto as TP

    a = np.array([1.5, -1.5, np.inf, np.nan, 2.0], np.float32)
    b = np.array([0.0, 0.0, 2.0, 2.0, np.nan], np.float32)
    for fmod in (0, 1):
        path = _mod_model(tmp_path, fmod, TP.FLOAT, len(a))
        got = tgc.load(path).run(device="CPU", a=a, b=b)["y"]
        assert np.isnan(got).all(), (fmod, got)


@pytest.mark.parametrize("fmod", [0, 1])
def test_onnx_half_mod_is_exact(tmp_path, fmod):
    from onnx import TensorProto as TP

    a = np.array([1000.5, -1000.5, 1000.5, -1000.5, 7.0, -0.0], np.float16)
    b = np.array([0.1, 0.1, -0.1, -0.1, -3.0, 3.0], np.float16)
    path = _mod_model(tmp_path, fmod, TP.FLOAT16, len(a))
    got = tgc.load(path).run(device="CPU", a=a, b=b)["y"]
    np.testing.assert_array_equal(got, np.fmod(a, b) if fmod else np.mod(a, b))


@pytest.mark.parametrize("fmod", [0, 1])
def test_onnx_integer_mod_unchanged(tmp_path, fmod):
    from onnx import TensorProto as TP

    a = np.array([7, -7, 7, -7, 0, 123456789], np.int32)
    b = np.array([3, 3, -3, -3, 5, -10], np.int32)
    path = _mod_model(tmp_path, fmod, TP.INT32, len(a))
    got = tgc.load(path).run(device="CPU", a=a, b=b)["y"]
    np.testing.assert_array_equal(got, np.fmod(a, b) if fmod else np.mod(a, b))
    np.testing.assert_array_equal(got, _reference(path, a, b))


X = [1.0, 3.0, 7.0, 1000.0, -5.0, 0.3, 2.0, -11.0]


@pytest.mark.parametrize("c", [0.1, 0.3, 1.7])
def test_f16_constant_is_rounded_to_f16(device, c):
    x = np.array(X, np.float16)
    got = run1(f"x: f16[{len(X)}]\nreturn x * {c}", device, x=x)
    want = x * np.float16(c)  # numpy: the constant is f16's, the product rounded to f16
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)
    got = run1(f"x: f16[{len(X)}]\nreturn x + {c}", device, x=x)
    np.testing.assert_array_equal(got, x + np.float16(c))


@pytest.mark.parametrize("c", [0.1, 0.3, 1.7])
def test_bf16_constant_is_rounded_to_bf16(device, c):
    x = bf16_round(np.array(X, np.float32))
    got = run1(f"x: bf16[{len(X)}]\nreturn x * {c}", device, x=x)
    # tgc's rule (DESIGN.md, `f32_to_bf16`): the constant and each op's result round to nearest bf16, ties even
    want = bf16_round(x * bf16_round(np.float32(c)))
    np.testing.assert_array_equal(got, want)
