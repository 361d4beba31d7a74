"""The ONNX ops wired onto the NN library (tgc/onnx/nnops.py): models made with onnx.helper for the cases the
plain versions lacked (3-d ConvTranspose, MaxPool's Indices, scatter reductions with repeated and negative
indices, GatherND's batch_dims, BatchNormalization in training mode), run on the CPU and compared with numpy
loops; a bad attribute value is one clear error, exit 2."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from clikit import assert_clean, invoke  # noqa: E402
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

import tgc  # noqa: E402
from tgc.errors import TgcError  # noqa: E402

RNG = np.random.default_rng(7)


def _run(tmp_path, node, inputs, outputs, feeds, inits=(), opset=18):
    g = h.make_graph([node], "g", inputs, outputs, list(inits))
    path = tmp_path / "m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", opset)]), str(path))
    return tgc.load(str(path)).run(device="CPU", inputs=feeds)


def _vi(name, shape, t=TP.FLOAT):
    return h.make_tensor_value_info(name, t, shape)


def test_conv_transpose_3d_strided_against_loops(tmp_path):
    x = RNG.standard_normal((1, 2, 2, 3, 2)).astype(np.float32)
    w = RNG.standard_normal((2, 3, 2, 2, 3)).astype(np.float32)
    s, pads = (2, 1, 2), (1, 0, 0, 0, 1, 1)
    full = np.zeros((1, 3, (2 - 1) * 2 + 2, (3 - 1) * 1 + 2, (2 - 1) * 2 + 3))
    for c, i, j, k in itertools.product(range(2), range(2), range(3), range(2)):
        full[0, :, i * s[0]:i * s[0] + 2, j * s[1]:j * s[1] + 2, k * s[2]:k * s[2] + 3] += x[0, c, i, j, k] * w[c]
    want = full[:, :, 1:full.shape[2] - 0, 0:full.shape[3] - 1, 0:full.shape[4] - 1]
    node = h.make_node("ConvTranspose", ["x", "w"], ["y"], strides=list(s), pads=list(pads))
    out = _run(tmp_path, node, [_vi("x", list(x.shape))], [_vi("y", list(want.shape))], {"x": x},
               [nh.from_array(w, "w")])
    np.testing.assert_allclose(out["y"], want, rtol=1e-4, atol=1e-5)


def test_maxpool_indices_output(tmp_path):
    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
    node = h.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 1])
    out = _run(tmp_path, node, [_vi("x", [1, 2, 4, 5])], [_vi("y", [1, 2, 2, 3]), _vi("i", [1, 2, 2, 3], TP.INT64)],
               {"x": x})
    y, idx = np.zeros((1, 2, 2, 3), np.float32), np.zeros((1, 2, 2, 3), np.int64)
    for c, a, b in itertools.product(range(2), range(2), range(3)):
        win = [(r, q) for r in range(2 * a, 2 * a + 2) for q in range(2 * b, min(2 * b + 2, 5))]
        r, q = max(win, key=lambda p: x[0, c, p[0], p[1]])
        y[0, c, a, b], idx[0, c, a, b] = x[0, c, r, q], (c * 4 + r) * 5 + q
    np.testing.assert_array_equal(out["y"], y)
    np.testing.assert_array_equal(out["i"], idx)


@pytest.mark.parametrize("reduction", ["mul", "max", "min"])
def test_scatter_elements_reductions_with_repeats_and_negatives(tmp_path, reduction):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    idx = np.array([[1, -3, 3], [0, 0, -1]], np.int64)  # -3 and 1 hit the same column in row 0
    upd = RNG.standard_normal((2, 3)).astype(np.float32)
    node = h.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction=reduction)
    out = _run(tmp_path, node, [_vi("x", [3, 4]), _vi("i", [2, 3], TP.INT64), _vi("u", [2, 3])],
               [_vi("y", [3, 4])], {"x": x, "i": idx, "u": upd})
    want = x.copy()
    combine = {"mul": np.multiply, "max": np.maximum, "min": np.minimum}[reduction]
    for r, c in itertools.product(range(2), range(3)):
        col = idx[r, c] % 4
        want[r, col] = combine(want[r, col], upd[r, c])
    np.testing.assert_allclose(out["y"], want, rtol=1e-6)


def test_scatter_nd_max_and_gather_nd_batch_dims(tmp_path):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    idx = np.array([[1], [-1], [1]], np.int64)
    upd = RNG.standard_normal((3, 3)).astype(np.float32)
    node = h.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="max")
    out = _run(tmp_path, node, [_vi("x", [4, 3]), _vi("i", [3, 1], TP.INT64), _vi("u", [3, 3])],
               [_vi("y", [4, 3])], {"x": x, "i": idx, "u": upd})
    want = x.copy()
    want[1] = np.maximum(np.maximum(want[1], upd[0]), upd[2])
    want[3] = np.maximum(want[3], upd[1])
    np.testing.assert_array_equal(out["y"], want)

    data = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    gidx = np.array([[[2, 1], [0, -1]], [[1, 3], [-3, 0]]], np.int64)
    node = h.make_node("GatherND", ["d", "g"], ["z"], batch_dims=1)
    out = _run(tmp_path, node, [_vi("d", [2, 3, 4]), _vi("g", [2, 2, 2], TP.INT64)], [_vi("z", [2, 2])],
               {"d": data, "g": gidx})
    want = np.array([[data[b, i % 3, j % 4] for i, j in gidx[b]] for b in range(2)])
    np.testing.assert_array_equal(out["z"], want)


def test_batchnorm_training_mode_outputs(tmp_path):
    x = RNG.standard_normal((3, 2, 4)).astype(np.float32)
    sc, bi, mu, var = (RNG.random(2).astype(np.float32) + 0.5 for _ in range(4))
    node = h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1,
                       momentum=0.8, epsilon=1e-3)
    inits = [nh.from_array(a, n) for a, n in zip((sc, bi, mu, var), "sbmv")]
    out = _run(tmp_path, node, [_vi("x", [3, 2, 4])], [_vi("y", [3, 2, 4]), _vi("rm", [2]), _vi("rv", [2])],
               {"x": x}, inits)
    bm, bv = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    y = (x - bm[:, None]) / np.sqrt(bv[:, None] + 1e-3) * sc[:, None] + bi[:, None]
    np.testing.assert_allclose(out["y"], y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["rm"], mu * 0.8 + bm * 0.2, rtol=1e-5)
    np.testing.assert_allclose(out["rv"], var * 0.8 + bv * 0.2, rtol=1e-5)


def test_bad_reduction_is_one_clear_error(tmp_path):
    node = h.make_node("ScatterElements", ["x", "i", "u"], ["y"], reduction="mean", name="sc")
    g = h.make_graph([node], "g", [_vi("x", [3]), _vi("i", [2], TP.INT64), _vi("u", [2])], [_vi("y", [3])])
    path = tmp_path / "bad.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 18)]), str(path))
    with pytest.raises(TgcError, match="reduction"):
        tgc.load(str(path))
    assert_clean(invoke("run", str(path), "--random"), 2, "reduction")


def test_conv_4d_against_loops(tmp_path):
    x = RNG.standard_normal((1, 2, 3, 3, 2, 3)).astype(np.float32)
    w = RNG.standard_normal((2, 2, 2, 2, 1, 2)).astype(np.float32)
    want = np.zeros((1, 2, 2, 2, 2, 2))
    for a, b, c, d in itertools.product(range(2), range(2), range(2), range(2)):
        want[0, :, a, b, c, d] = np.einsum("cijkl,mcijkl->m", x[0, :, a:a + 2, b:b + 2, c:c + 1, d:d + 2], w)
    node = h.make_node("Conv", ["x", "w"], ["y"])
    out = _run(tmp_path, node, [_vi("x", list(x.shape))], [_vi("y", list(want.shape))], {"x": x},
               [nh.from_array(w, "w")])
    np.testing.assert_allclose(out["y"], want, rtol=1e-4, atol=1e-5)


def test_empty_auto_pad_is_notset(tmp_path):
    x = RNG.standard_normal((1, 1, 3)).astype(np.float32)
    w = RNG.standard_normal((1, 1, 2)).astype(np.float32)
    node = h.make_node("ConvTranspose", ["x", "w"], ["y"], auto_pad="", pads=[1, 0])
    out = _run(tmp_path, node, [_vi("x", [1, 1, 3])], [_vi("y", [1, 1, 3])], {"x": x}, [nh.from_array(w, "w")])
    full = np.zeros(4)
    for i in range(3):
        full[i:i + 2] += x[0, 0, i] * w[0, 0]
    np.testing.assert_allclose(out["y"][0, 0], full[1:], rtol=1e-5, atol=1e-6)
