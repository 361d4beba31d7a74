"""ONNX in, the parts beyond single ops (models made here with onnx.helper, compared with numpy): control flow
resolved at load (If on a load-time condition, Loop and Scan unrolled), ops ONNX defines as functions expanded
into their bodies, an input that decides a shape named even when the shape is computed from it, the ai.onnx.ml
domain's numeric ops, and IEEE comparisons with NaN. The node conformance suite (tests/test_onnx_nodes.py)
covers each op's cases; these cover what the translation does around them, and its errors (exit 2)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from clikit import assert_clean, invoke  # noqa: E402
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

import tgc  # noqa: E402
from tgc.errors import TgcError  # noqa: E402

DEV = "PYTHON"


def _save(tmp_path, nodes, inputs, outputs, inits=(), opset=18, name="m.onnx", extra_opsets=()):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset), *extra_opsets])
    path = tmp_path / name
    onnx.save(m, str(path))
    return str(path)


def _vi(name, shape, t=TP.FLOAT):
    return h.make_tensor_value_info(name, t, shape)


def test_loop_unrolled_with_a_scan_output(tmp_path):
    """A Loop of a load-time trip count: carried y += x * i, each step's y stacked (numpy's loop as reference)."""
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"]),
         h.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
         h.make_node("Mul", ["x", "fi"], ["xi"]),
         h.make_node("Add", ["y_in", "xi"], ["y_out"]),
         h.make_node("Identity", ["y_out"], ["scan"])],
        "body", [_vi("i", [], TP.INT64), _vi("cond_in", [], TP.BOOL), _vi("y_in", [3])],
        [_vi("cond_out", [], TP.BOOL), _vi("y_out", [3]), _vi("scan", [3])])
    nodes = [h.make_node("Loop", ["n", "c", "y0"], ["y", "ys"], body=body)]
    inits = [nh.from_array(np.array(4, np.int64), "n"), nh.from_array(np.array(True), "c")]
    path = _save(tmp_path, nodes, [_vi("x", [3]), _vi("y0", [3])], [_vi("y", [3]), _vi("ys", [4, 3])], inits)
    x, y0 = np.array([1.0, 2.0, 3.0], np.float32), np.array([0.5, 0.0, -1.0], np.float32)
    out = tgc.load(path).run(device=DEV, inputs={"x": x, "y0": y0})
    want, ys = y0.copy(), []
    for i in range(4):
        want = want + x * i
        ys.append(want)
    np.testing.assert_allclose(out["y"], want, rtol=1e-6)
    np.testing.assert_allclose(out["ys"], np.stack(ys), rtol=1e-6)


def test_loop_with_a_condition_from_data_is_refused(tmp_path):
    body = h.make_graph(
        [h.make_node("ReduceSum", ["y_in"], ["s"], keepdims=0),
         h.make_node("Less", ["s", "ten"], ["cond_out"]),
         h.make_node("Add", ["y_in", "y_in"], ["y_out"])],
        "body", [_vi("i", [], TP.INT64), _vi("cond_in", [], TP.BOOL), _vi("y_in", [2])],
        [_vi("cond_out", [], TP.BOOL), _vi("y_out", [2])])
    nodes = [h.make_node("Loop", ["", "c", "y0"], ["y"], body=body, name="grow")]
    inits = [nh.from_array(np.array(True), "c"), nh.from_array(np.array(10.0, np.float32), "ten")]
    path = _save(tmp_path, nodes, [_vi("y0", [2])], [_vi("y", [2])], inits)
    with pytest.raises(TgcError, match="condition computed from data") as e:
        tgc.load(path)
    assert "node 'grow' (Loop, opset 18)" in e.value.msg
    assert_clean(invoke("run", path, "--random"), 2, "Loop")


def test_if_on_a_shape_and_scan_reverse(tmp_path):
    """If's condition folded from a shape picks its branch; a reverse Scan sums from the end."""
    then = h.make_graph([h.make_node("Neg", ["x"], ["t"])], "then", [], [_vi("t", [3, 2])])
    other = h.make_graph([h.make_node("Abs", ["x"], ["e"])], "else", [], [_vi("e", [3, 2])])
    body = h.make_graph([h.make_node("Add", ["acc_in", "row"], ["acc_out"]),
                         h.make_node("Identity", ["acc_out"], ["seen"])], "scan_body",
                        [_vi("acc_in", [2]), _vi("row", [2])], [_vi("acc_out", [2]), _vi("seen", [2])])
    nodes = [h.make_node("Shape", ["x"], ["shp"]),
             h.make_node("ReduceProd", ["shp"], ["size"], keepdims=0),
             h.make_node("Greater", ["size", "five"], ["big"]),
             h.make_node("If", ["big"], ["picked"], then_branch=then, else_branch=other),
             h.make_node("Scan", ["zero", "picked"], ["total", "partial"], body=body, num_scan_inputs=1,
                         scan_input_directions=[1])]
    inits = [nh.from_array(np.array(5, np.int64), "five"), nh.from_array(np.zeros(2, np.float32), "zero")]
    path = _save(tmp_path, nodes, [_vi("x", [3, 2])], [_vi("total", [2]), _vi("partial", [3, 2])], inits)
    x = np.arange(6, dtype=np.float32).reshape(3, 2) - 2
    out = tgc.load(path).run(device=DEV, inputs={"x": x})
    np.testing.assert_allclose(out["total"], (-x).sum(0))  # 6 elements > 5: the then branch
    np.testing.assert_allclose(out["partial"], np.cumsum((-x)[::-1], axis=0))


def test_function_op_expands_into_its_body(tmp_path):
    """CenterCropPad has no op function in tgc: ONNX's own function body for it is translated instead."""
    nodes = [h.make_node("CenterCropPad", ["x", "shape"], ["y"])]
    inits = [nh.from_array(np.array([2, 5], np.int64), "shape")]
    path = _save(tmp_path, nodes, [_vi("x", [4, 3])], [_vi("y", [2, 5])], inits)
    prog = tgc.load(path)
    assert "CenterCropPad" in prog.onnx.ops
    r = invoke("inspect", path)
    assert r.exit_code == 0 and "not supported by tgc: none" in r.output
    x = np.arange(12, dtype=np.float32).reshape(4, 3) + 1
    want = np.zeros((2, 5), np.float32)
    want[:, 1:4] = x[1:3]
    np.testing.assert_array_equal(prog.run(device=DEV, inputs={"x": x})["y"], want)


def test_shape_computed_from_an_input_names_that_input(tmp_path):
    nodes = [h.make_node("Add", ["s", "one"], ["s1"]), h.make_node("Reshape", ["x", "s1"], ["y"], name="rs")]
    inits = [nh.from_array(np.array([0, 0], np.int64), "one")]
    path = _save(tmp_path, nodes, [_vi("x", [2, 3]), _vi("s", [2], TP.INT64)], [_vi("y", [3, 2])], inits)
    with pytest.raises(TgcError) as e:
        tgc.load(path)
    assert "computed from the input(s) s" in e.value.msg and "node 'rs'" in e.value.msg


def test_ml_domain_binarizer_and_unknown_ml_op(tmp_path):
    ml = [h.make_opsetid("ai.onnx.ml", 3)]
    path = _save(tmp_path, [h.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.5)],
                 [_vi("x", [4])], [_vi("y", [4])], extra_opsets=ml)
    x = np.array([0.1, 0.5, 0.7, np.nan], np.float32)
    np.testing.assert_array_equal(tgc.load(path).run(device=DEV, inputs={"x": x})["y"], [0, 0, 1, 0])
    path = _save(tmp_path, [h.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", name="nm")],
                 [_vi("x", [1, 4])], [_vi("y", [1, 4])], extra_opsets=ml, name="n.onnx")
    with pytest.raises(TgcError, match="unsupported op 'ai.onnx.ml.Normalizer' .node 'nm'"):
        tgc.load(path)


def test_comparisons_with_nan_follow_ieee(tmp_path):
    """LessOrEqual/GreaterOrEqual with NaN give False (tgc's `<=` of floats once negated `>`, giving True)."""
    nodes = [h.make_node("LessOrEqual", ["a", "b"], ["le"]), h.make_node("GreaterOrEqual", ["a", "b"], ["ge"])]
    path = _save(tmp_path, nodes, [_vi("a", [4]), _vi("b", [4])], [_vi("le", [4], TP.BOOL), _vi("ge", [4], TP.BOOL)])
    a = np.array([1.0, np.nan, 2.0, 3.0], np.float32)
    b = np.array([1.0, 1.0, np.nan, 2.0], np.float32)
    for dev in ("PYTHON", "CPU"):
        out = tgc.load(path).run(device=dev, inputs={"a": a, "b": b})
        np.testing.assert_array_equal(out["le"], a <= b)
        np.testing.assert_array_equal(out["ge"], a >= b)
