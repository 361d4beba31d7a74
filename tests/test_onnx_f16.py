"""f16 product-sums of ONNX models (MatMul, Gemm, Conv, Softmax) compute in f32 and round once at the op's result,
as ONNX's reference and onnxruntime do: checked on data where rounding every f16 product first gives another
f16 number."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from tgc.api import Program  # noqa: E402
from tgc.onnx import translate  # noqa: E402

H = TensorProto.FLOAT16
A = np.array([[3.3, 3.3, 1.1]], np.float16)
B = np.array([[1.7], [-1.69], [0.3]], np.float16)


def _run(node, inputs: dict, out_shape: list) -> np.ndarray:
    g = helper.make_graph([node], "m", [helper.make_tensor_value_info(k, H, list(v.shape)) for k, v in inputs.items()],
                          [helper.make_tensor_value_info("y", H, out_shape)])
    tr = translate(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    names = {tg: n for n, tg in [*tr.inputs.items(), *tr.outputs.items()]}
    return Program(tr.source, weights=tr.weights, names=names).run(device="PYTHON", inputs=inputs)["y"]


def test_f16_matmul_and_gemm_round_once():
    once = (A.astype(np.float32) @ B.astype(np.float32)).astype(np.float16)
    each = (A.T * B).astype(np.float16).astype(np.float32).sum(0).astype(np.float16)
    assert once.item() != each.item()  # (the data tells the two apart)
    assert _run(helper.make_node("MatMul", ["a", "b"], ["y"]), {"a": A, "b": B}, [1, 1]).item() == once.item()
    assert _run(helper.make_node("Gemm", ["a", "b"], ["y"]), {"a": A, "b": B}, [1, 1]).item() == once.item()


def test_f16_conv_rounds_once():
    x, w = A.reshape(1, 1, 3), B.reshape(1, 1, 3)
    once = (A.astype(np.float32) @ B.astype(np.float32)).astype(np.float16)
    got = _run(helper.make_node("Conv", ["x", "w"], ["y"]), {"x": x, "w": w}, [1, 1, 1])
    assert got.dtype == np.float16 and got.item() == once.item()


def test_f16_softmax_rounds_each_step_as_the_reference():
    """ONNX's reference Softmax of f16: the shift, exp, sum and divide each rounded to f16."""
    x = np.array([[0.1, 2.3, -1.7, 4.4, 4.41], [1, 1, 1, 1, -np.inf]], np.float16)
    d = (x.astype(np.float32) - x.astype(np.float32).max(1, keepdims=True)).astype(np.float16)
    e = np.exp(d.astype(np.float32)).astype(np.float16).astype(np.float32)
    want = (e / e.sum(1, keepdims=True).astype(np.float16).astype(np.float32)).astype(np.float16)
    got = _run(helper.make_node("Softmax", ["x"], ["y"]), {"x": x}, [2, 5])
    assert got.dtype == np.float16 and np.array_equal(got, want)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceL2", "ReduceLogSum", "ReduceL1", "ReduceSumSquare",
                                "GlobalAveragePool", "GlobalLpPool"])
def test_f16_reductions_accumulate_in_f32(op):
    """Reductions of 4000 f16 values near 20: their sums pass 65504, the results (a mean, a norm, a log) do not;
    onnxruntime accumulates in f32 and rounds once, so no inf where the result is an ordinary f16 number."""
    x = (np.random.default_rng(1).standard_normal((2, 1, 4000)) + 20).astype(np.float16)
    v = x.astype(np.float64).reshape(2, 4000)
    want = {"ReduceMean": v.mean(1), "ReduceL2": np.sqrt((v * v).sum(1)), "ReduceLogSum": np.log(v.sum(1)),
            "ReduceL1": np.abs(v).sum(1), "ReduceSumSquare": (v * v).sum(1), "GlobalAveragePool": v.mean(1),
            "GlobalLpPool": np.sqrt((v * v).sum(1))}[op]
    if op.startswith("Global"):
        node = helper.make_node(op, ["x"], ["y"])
    else:
        node = helper.make_node(op, ["x"], ["y"], axes=[2], keepdims=1)
    g = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", H, [2, 1, 4000])],
                          [helper.make_tensor_value_info("y", H, [2, 1, 1])])
    tr = translate(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    names = {tg: n for n, tg in [*tr.inputs.items(), *tr.outputs.items()]}
    got = Program(tr.source, weights=tr.weights, names=names).run(device="CPU", inputs={"x": x})["y"]
    assert got.dtype == np.float16
    with np.errstate(over="ignore"):
        want16 = want.astype(np.float16)  # (ReduceL1 and ReduceSumSquare: their f16 results are inf too)
    np.testing.assert_allclose(got.reshape(2).astype(np.float64), want16.astype(np.float64), rtol=2e-3)
