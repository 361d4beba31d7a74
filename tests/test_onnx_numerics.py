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
