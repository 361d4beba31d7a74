"""The scheduler's reuse rules for conv nets (tgc/engine/schedule.py `_stored_for_reuse`, `_moved_concat`; issue 23
item 4): a concatenation read through a conv's pad or a pool's window is one buffer its producers write in place;
a conv's epilogue (bias, relu) read several times per element by a pool is stored once, not recomputed per read;
no pad gets a copy of its own. Tiny `onnx.helper` models: the schedule's decisions exactly, and the
values against onnx's own reference evaluator on every device of TGC_TEST_DEVICES."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tgc  # noqa: E402
from tgc.ir.uop import Ops  # noqa: E402


def _weights(shapes: dict, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [nh.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n) for n, s in shapes.items()]


def _model(tmp_path, nodes: list, inits: list, x_shape: list, y_shape: list):
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, x_shape)],
                     [h.make_tensor_value_info("y", TP.FLOAT, y_shape)], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return model, tgc.load(str(path))


def _check(model, prog, device: str, x_shape: list) -> list:
    """The run against onnx's reference evaluator; the CPU schedule's kernels (the device the rules are for)."""
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = prog.run(device=device, inputs={"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return [it for it in prog.schedule({}, "CPU") if it.output.op is not Ops.CONTIGUOUS]  # (weight packing)


def _conv(x: str, w: str, b: str | None, out: str, k: int, pads: list[int]):
    return h.make_node("Conv", [x, w] + ([b] if b else []), [out], kernel_shape=[k, k], pads=pads)


CAT_NODES = [_conv("x", "w1", "b1", "c1", 1, [0, 0, 0, 0]), h.make_node("Relu", ["c1"], ["r1"]),
             _conv("x", "w2", "b2", "c2", 3, [1, 1, 1, 1]), h.make_node("Relu", ["c2"], ["r2"]),
             h.make_node("Concat", ["r1", "r2"], ["cc"], axis=1)]
CAT_W = {"w1": (4, 3, 1, 1), "b1": (4,), "w2": (4, 3, 3, 3), "b2": (4,)}


def test_concat_read_through_a_conv_pad_is_one_buffer_written_in_place(tmp_path, device):
    model, prog = _model(tmp_path, CAT_NODES + [_conv("cc", "w3", None, "y", 3, [1, 1, 1, 1])],
                         _weights({**CAT_W, "w3": (8, 8, 3, 3)}), [1, 3, 10, 10], [1, 8, 10, 10])
    items = _check(model, prog, device, [1, 3, 10, 10])
    cat_writers = [it for it in items if it.output.op is Ops.WHERE]
    # both convs (with their bias and relu) store into the one concatenated buffer: no buffer of their own
    assert len(cat_writers) == 2 and cat_writers[0].output is cat_writers[1].output
    assert all(it.name.startswith("r_") for it in cat_writers)
    assert not any(b.op is Ops.REDUCE_AXIS for it in items for b in it.bufs)
    assert items[-1].bufs[1] is cat_writers[0].output  # the last conv reads the concatenation through its pad


def test_concat_read_by_a_pool_is_one_buffer_written_in_place(tmp_path, device):
    model, prog = _model(tmp_path, CAT_NODES + [h.make_node("MaxPool", ["cc"], ["y"], kernel_shape=[3, 3],
                                                            strides=[2, 2])],
                         _weights(CAT_W), [1, 3, 11, 11], [1, 8, 5, 5])
    items = _check(model, prog, device, [1, 3, 11, 11])
    cat_writers = [it for it in items if it.output.op is Ops.WHERE]
    assert len(cat_writers) == 2 and cat_writers[0].output is cat_writers[1].output
    assert [b.op for b in items[-1].bufs[1:]] == [Ops.WHERE]  # the pool reads the concatenation only


def test_conv_epilogue_before_a_pool_is_stored_once(tmp_path, device):
    model, prog = _model(tmp_path, [_conv("x", "w1", "b1", "c1", 3, [0, 0, 0, 0]), h.make_node("Relu", ["c1"], ["r1"]),
                                    h.make_node("MaxPool", ["r1"], ["y"], kernel_shape=[3, 3], strides=[2, 2])],
                         _weights({"w1": (8, 3, 3, 3), "b1": (8,)}), [1, 3, 13, 13], [1, 8, 5, 5])
    items = _check(model, prog, device, [1, 3, 13, 13])
    assert len(items) == 2
    conv, pool = items
    # the conv's kernel stores relu(conv + bias); the pool reads that buffer alone (no bias, no recomputed relu)
    assert conv.output.op is Ops.MAX and conv.name.startswith("r_")
    assert pool.bufs[1:] == [conv.output]


def test_a_pool_that_reads_each_element_once_changes_nothing(tmp_path, device):
    """A 2x2 stride-2 pool reads each element once: the conv's result and its epilogue stay as the general rules
    put them (no extra buffer)."""
    model, prog = _model(tmp_path, [_conv("x", "w1", "b1", "c1", 3, [0, 0, 0, 0]), h.make_node("Relu", ["c1"], ["r1"]),
                                    h.make_node("MaxPool", ["r1"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                         _weights({"w1": (8, 3, 3, 3), "b1": (8,)}), [1, 3, 10, 10], [1, 8, 4, 4])
    items = _check(model, prog, device, [1, 3, 10, 10])
    assert len(items) == 2 and items[0].output.op is not Ops.MAX


def test_one_sided_pad_and_a_pools_pad_get_no_copy(tmp_path, device):
    """A conv padded on one side only (end) reads its input in place, bounds checked; a 3x3 stride-2 pool's pad
    (each element read about twice) too."""
    model, prog = _model(tmp_path, [_conv("x", "w1", None, "c1", 3, [0, 0, 2, 2]),
                                    h.make_node("MaxPool", ["c1"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                                pads=[1, 1, 1, 1])],
                         _weights({"w1": (8, 3, 3, 3)}), [1, 3, 9, 9], [1, 8, 5, 5])
    items = _check(model, prog, device, [1, 3, 9, 9])
    assert not any(it.output.op is Ops.PAD for it in items)
