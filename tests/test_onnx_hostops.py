"""Data-dependent output shapes (NonZero, Unique, NonMaxSuppression): models made with onnx.helper, run in stages
by `tgc.staged.StagedModel` on the PYTHON emulator and the CPU, against numpy; the errors of the one-program path."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from tgc.errors import TgcError  # noqa: E402
from tgc.onnx.hostops import non_max_suppression, unique  # noqa: E402
from tgc.staged import StagedModel, load_staged  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None, opset: int = 13):
    g = helper.make_graph(nodes, "m", inputs, outputs, initializer=inits or [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _nonzero_model():
    """y = relu(x); idx = NonZero(y); out = float(idx^T) * 2 + 1; also relu(x) * 3 (read after the cut)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["t"]), helper.make_node("Cast", ["t"], ["tf"], to=F),
             helper.make_node("Mul", ["tf", "two"], ["m"]), helper.make_node("Add", ["m", "one"], ["out"]),
             helper.make_node("Mul", ["r", "three"], ["r3"])]
    inits = [helper.make_tensor(n, F, [], [v]) for n, v in [("two", 2.0), ("one", 1.0), ("three", 3.0)]]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [3, 4])],
                  [helper.make_tensor_value_info("out", F, ["N", 2]), helper.make_tensor_value_info("r3", F, [3, 4])],
                  inits)


@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
def test_nonzero_between_two_tgc_stages_matches_numpy(device):
    staged = StagedModel(_nonzero_model(), "nz")
    rng = np.random.default_rng(0)
    for x in [rng.standard_normal((3, 4)).astype(np.float32), np.full((3, 4), -1, np.float32)]:
        got = staged.run(device=device, inputs={"x": x})
        r = np.maximum(x, 0)
        want = np.transpose(np.array(np.nonzero(r))).astype(np.float32) * 2 + 1
        assert got["out"].shape == want.shape and np.array_equal(got["out"], want)
        np.testing.assert_allclose(got["r3"], r * 3, rtol=1e-6)
    assert staged.stages == ["tgc 1 nodes", "host NonZero", "tgc 5 nodes"]
    n = len(staged._programs)
    two = np.zeros((3, 4), np.float32)
    two[0, 1] = two[2, 3] = 1
    for x in (two, two[::-1].copy()):  # two non-zeros at other places: the same sizes
        got = staged.run(device=device, inputs={"x": x})
        want = np.transpose(np.array(np.nonzero(x))).astype(np.float32) * 2 + 1
        assert np.array_equal(got["out"], want)
    assert len(staged._programs) == n + 1  # one new stage program for the new size, none for new values


def test_nonzero_output_shape_and_dtype_follow_onnx():
    m = _model([helper.make_node("NonZero", ["x"], ["y"])], [helper.make_tensor_value_info("x", I64, [2, 3])],
               [helper.make_tensor_value_info("y", I64, [2, "N"])])
    x = np.array([[0, 5, 0], [7, 0, 0]], np.int64)
    y = StagedModel(m).run(device="PYTHON", inputs={"x": x})["y"]
    assert y.dtype == np.int64 and y.tolist() == [[0, 1], [1, 0]]
    y = StagedModel(m).run(device="PYTHON", inputs={"x": np.zeros((2, 3), np.int64)})["y"]
    assert y.shape == (2, 0)


def test_unique_with_axis_unsorted_feeds_a_later_stage():
    nodes = [helper.make_node("Unique", ["x"], ["y", "idx", "inv", "cnt"], axis=-1, sorted=0),
             helper.make_node("Cast", ["cnt"], ["cf"], to=F), helper.make_node("Mul", ["y", "cf"], ["out"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 5])],
               [helper.make_tensor_value_info(n, t, s) for n, t, s in [("out", F, [2, "U"]), ("idx", I64, ["U"]),
                                                                       ("inv", I64, [5])]],
               opset=11)
    x = np.array([[3, 1, 3, 2, 1], [0, 4, 0, 5, 4]], np.float32)
    got = StagedModel(m).run(device="PYTHON", inputs={"x": x})
    # columns in order of first occurrence: 0 ([3,0]), 1 ([1,4]), 3 ([2,5]); counts 2, 2, 1
    assert got["idx"].tolist() == [0, 1, 3] and got["inv"].tolist() == [0, 1, 0, 2, 1]
    assert np.array_equal(got["out"], x[:, [0, 1, 3]] * np.array([2, 2, 1], np.float32))


def test_unique_flat_sorted_matches_numpy():
    x = np.array([2.0, -1.0, 2.0, 0.5, -1.0, 7.0], np.float32)
    y, first, inv, cnt = unique(x)
    wy, wfirst, winv, wcnt = np.unique(x, return_index=True, return_inverse=True, return_counts=True)
    assert np.array_equal(y, wy) and np.array_equal(first, wfirst) and np.array_equal(inv, winv)
    assert np.array_equal(cnt, wcnt) and first.dtype == np.int64


def test_non_max_suppression_thresholds_and_center_format():
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 10, 1, 11], [0, 0, 0, 0]]], np.float32)
    scores = np.array([[[0.9, 0.95, 0.3, 0.8], [0.1, 0.2, 0.6, 0.05]]], np.float32)
    # class 0: box 1 first, box 0 overlaps it (IoU 0.82) and goes, box 3 has no area and stays, then box 2
    got = non_max_suppression(boxes, scores, 10, 0.5, None, 0)
    assert got.tolist() == [[0, 0, 1], [0, 0, 3], [0, 0, 2], [0, 1, 2], [0, 1, 1], [0, 1, 3]]
    got = non_max_suppression(boxes, scores, 2, 0.5, 0.25, 0)  # at most 2 a class, scores above 0.25
    assert got.tolist() == [[0, 0, 1], [0, 0, 3], [0, 1, 2]]
    centers = np.array([[[0.5, 0.5, 1, 1], [0.5, 0.6, 1, 1], [0.5, 10.5, 1, 1]]], np.float32)
    assert non_max_suppression(centers, scores[:, :, :3], 10, 0.5, None, 1)[:, 2].tolist() == [1, 2, 2, 1]


def test_non_max_suppression_through_the_staged_model():
    ins = [helper.make_tensor_value_info("boxes", F, [1, 3, 4]), helper.make_tensor_value_info("scores", F, [1, 1, 3])]
    inits = [helper.make_tensor("k", I64, [1], [2]), helper.make_tensor("iou", F, [1], [0.5])]
    m = _model([helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou"], ["sel"])], ins,
               [helper.make_tensor_value_info("sel", I64, ["N", 3])], inits, opset=11)
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 10, 1, 11]]], np.float32)
    got = StagedModel(m).run(device="PYTHON", inputs={"boxes": boxes, "scores": np.array([[[0.9, 0.95, 0.3]]],
                                                                                       np.float32)})
    assert got["sel"].tolist() == [[0, 0, 1], [0, 0, 2]]


def test_load_of_a_staged_model_runs_it_in_stages(tmp_path):
    import tgc

    path = tmp_path / "nz.onnx"
    onnx.save(_nonzero_model(), str(path))
    m = tgc.load(str(path))
    assert isinstance(m, StagedModel) and m.input_names == ["x"] == load_staged(str(path)).input_names
    x = np.ones((3, 4), np.float32)
    got = m.run(device="PYTHON", inputs={"x": x})
    assert np.array_equal(got["out"], np.transpose(np.array(np.nonzero(x))).astype(np.float32) * 2 + 1)


def test_staged_model_input_errors():
    staged = StagedModel(_nonzero_model(), "nz")
    with pytest.raises(TgcError, match="missing input 'x'"):
        staged.run(device="PYTHON", inputs={})
    with pytest.raises(TgcError, match="dtype"):
        staged.run(device="PYTHON", inputs={"x": np.zeros((3, 4), np.int32)})
    with pytest.raises(TgcError, match="shape"):
        staged.run(device="PYTHON", inputs={"x": np.zeros((4, 3), np.float32)})
    with pytest.raises(TgcError, match="unknown input"):
        staged.run(device="PYTHON", inputs={"x": np.zeros((3, 4), np.float32), "z": 1})


def test_an_input_that_decides_a_shape_is_read_at_run_time():
    """Reshape by a shape given at run time: a constant of the stage it is read in, one program per value."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 6]), helper.make_tensor_value_info("shape", I64, [2])],
               [helper.make_tensor_value_info("y", F, ["A", "B"])])
    staged = StagedModel(m)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for shape in ([3, 4], [4, 3], [3, 4]):
        y = staged.run(device="PYTHON", inputs={"x": x, "shape": np.array(shape, np.int64)})["y"]
        assert np.array_equal(y, -x.reshape(shape))
    assert len(staged._programs) == 2  # (the third run reused the first one's program)
    with pytest.raises(TgcError):
        staged.run(device="PYTHON", inputs={"x": x, "shape": np.array([5, 5], np.int64)})


def test_nonzero_of_a_constant_folds_into_one_program(tmp_path):
    import tgc

    nodes = [helper.make_node("NonZero", ["c"], ["nz"]), helper.make_node("Add", ["nz", "x"], ["y"])]
    c = helper.make_tensor("c", I64, [4], [0, 3, 0, 1])
    m = _model(nodes, [helper.make_tensor_value_info("x", I64, [1, 2])],
               [helper.make_tensor_value_info("y", I64, [1, 2])], [c])
    onnx.save(m, str(tmp_path / "c.onnx"))
    got = tgc.load(str(tmp_path / "c.onnx")).run(device="PYTHON", x=np.array([[10, 20]], np.int64))["y"]
    assert got.tolist() == [[11, 23]]
