"""A conv weight that several convs share, packed on the CPU (tgc/engine/schedule.py `pack_conv_operands`): one
packed copy per distinct weight, served to every conv that reads it; packing rebuilds no layer below a conv (so
nothing is computed twice: a recompute factor of exactly 1.0), and every kernel's output and buffers other than
the copies are nodes of the traced graph (the scheduler's map back). Programs in .tg and ONNX models made with
onnx.helper (weights filled by ConstantOfShape, as ONNX's light models' are, and a tied initializer), results
against numpy and onnx.reference. Also: ONNX MaxPool pads floats with -inf, without an overflow warning."""

from __future__ import annotations

import numpy as np
import pytest
from convkit import conv_np

import tgc
from tgc.api import _device
from tgc.codegen.kernel import graph_flops
from tgc.engine import schedule
from tgc.engine.flops import written_flops
from tgc.ir.uop import Ops, UOp


@pytest.fixture(autouse=True)
def pack_small(monkeypatch):
    """Pack convolutions of every size (the test shapes are below the size where packing pays)."""
    monkeypatch.setattr(schedule, "CONV_MIN_FLOPS", 0)


def schedule_facts(prog) -> dict:
    """The CPU schedule's kernels, packing copies, copies marked `serves`, recompute factor (executed graph ops
    over written ones, as `Program.recompute` counts them) and the kernel nodes outside the traced graph."""
    cpu = _device("CPU")
    outs, _ = prog._trace(prog.resolve_dims(None))
    items = [it for it in prog.schedule(None, "CPU") if it.ast.src]
    graph = set(UOp(Ops.SINK, None, tuple(outs)).toposort())
    copies = {it.output for it in items if it.output.op is Ops.CONTIGUOUS}
    outside = {b for it in items for b in (it.output, *it.bufs) if b not in graph and b not in copies}
    return {"kernels": len(items), "copies": len(copies), "served": sum("serves" in it.meta for it in items),
            "factor": sum(graph_flops(it, cpu) for it in items) / written_flops(outs), "outside": outside}


def relu(a: np.ndarray) -> np.ndarray:
    return np.maximum(a, 0)


X = np.random.default_rng(0).standard_normal((1, 16, 8, 8)).astype(np.float32)
W = (np.random.default_rng(1).standard_normal((16, 16, 3, 3)) / 12).astype(np.float32)

# (program, numpy reference of x and w, kernels expected: the weight's one packing copy, and per conv a padded
# copy of its input (`schedule._reading_padded_copy`) and the conv)
PROGRAMS = {
    "tied_chain": ("a = conv2d(x, w, padding=1)\nreturn conv2d(a, w, padding=1)",
                   lambda x, w: conv_np(conv_np(x, w, 1, 1, 1, 1), w, 1, 1, 1, 1), 5),
    "three_residual": ("a = relu(conv2d(x, w, padding=1))\nb = relu(conv2d(a, w, padding=1)) + a\n"
                       "return relu(conv2d(b, w, padding=1)) + b",
                       lambda x, w: (lambda a: (lambda b: relu(conv_np(b, w, 1, 1, 1, 1)) + b)(
                           relu(conv_np(a, w, 1, 1, 1, 1)) + a))(relu(conv_np(x, w, 1, 1, 1, 1))), 7),
    "computed_weight": ("v = w * 2.0 + 1.0\na = relu(conv2d(x, v, padding=1))\n"
                        "return relu(conv2d(a, v, padding=1)) + a",
                        lambda x, w: (lambda v: (lambda a: relu(conv_np(a, v, 1, 1, 1, 1)) + a)(
                            relu(conv_np(x, v, 1, 1, 1, 1))))(w * 2.0 + 1.0), 5),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_shared_weight_is_packed_once(name):
    src, want, kernels = PROGRAMS[name]
    prog = tgc.loads(f"x: f32[1, 16, 8, 8]\nw: f32[16, 16, 3, 3]\n{src}\n")
    facts = schedule_facts(prog)
    assert (facts["kernels"], facts["copies"], facts["served"]) == (kernels, 1, 1)
    # no layer is computed twice; a relu between two convs is applied again in the padded copy (one max per value)
    assert 1.0 <= facts["factor"] < 1.01 and facts["outside"] == set()
    got = prog.run(device="CPU", x=X, w=W)["out0"]
    np.testing.assert_allclose(got, want(X, W), rtol=1e-4, atol=1e-4)


def test_distinct_weights_are_packed_each():
    """Two weights of the same shape that are different nodes: two copies, each serving its conv."""
    prog = tgc.loads("x: f32[1, 16, 8, 8]\nw: f32[16, 16, 3, 3]\nu: f32[16, 16, 3, 3]\n"
                     "a = relu(conv2d(x, w, padding=1))\nreturn conv2d(a, u, padding=1) + a\n")
    facts = schedule_facts(prog)
    assert (facts["kernels"], facts["copies"], facts["served"]) == (6, 2, 2)  # (and 2 padded inputs)
    assert 1.0 <= facts["factor"] < 1.01 and facts["outside"] == set()  # (a's relu again in its padded copy)
    u = W[::-1].copy()
    got = prog.run(device="CPU", x=X, w=W, u=u)["out0"]
    a = relu(conv_np(X, W, 1, 1, 1, 1))
    np.testing.assert_allclose(got, conv_np(a, u, 1, 1, 1, 1) + a, rtol=1e-4, atol=1e-4)


def _onnx_model(tmp_path):
    """A ResNet-like ONNX model: a ConstantOfShape weight (one node, as the light models fill every weight of a
    shape) shared by three convs with residual adds, then an initializer tied between two more convs."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    shape = nh.from_array(np.array([16, 16, 3, 3], np.int64), "wshape")
    nodes = [h.make_node("ConstantOfShape", ["wshape"], ["wc"], value=h.make_tensor("v", TP.FLOAT, [1], [0.01]))]
    prev = "x"
    for i in range(3):
        nodes += [h.make_node("Conv", [prev, "wc"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  h.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        if i:
            nodes.append(h.make_node("Add", [f"r{i}", prev], [f"s{i}"]))
        prev = f"s{i}" if i else f"r{i}"
    nodes += [h.make_node("Conv", [prev, "wt"], ["t0"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["t0"], ["t1"]),
              h.make_node("Conv", ["t1", "wt"], ["y"], pads=[1, 1, 1, 1])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 16, 8, 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 16, 8, 8])], [shape, nh.from_array(W, "wt")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    path = tmp_path / "shared.onnx"
    onnx.save(model, str(path))
    return model, str(path)


def test_onnx_weights_shared_by_several_convs(tmp_path):
    from onnx.reference import ReferenceEvaluator

    model, path = _onnx_model(tmp_path)
    prog = tgc.load(path)
    facts = schedule_facts(prog)
    # a copy per distinct weight (the constant-filled one and the tied initializer), then the five convs, each
    # after a padded copy of its input
    assert (facts["copies"], facts["served"], facts["kernels"]) == (2, 2, 12)
    assert 1.0 <= facts["factor"] < 1.01 and facts["outside"] == set()
    got = prog.run(device="CPU", inputs={"x": X})["y"]
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, {"x": X})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_onnx_maxpool_pads_with_minus_infinity(tmp_path):
    """MaxPool's padding is -inf for floats (a padded window of negative values keeps its maximum), with no
    overflow warning on the way (a -1e300 pad value overflowed f32 in the PYTHON device's constants)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx.reference import ReferenceEvaluator

    node = h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 2, 5, 5])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 2, 3, 3])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    path = tmp_path / "pool.onnx"
    onnx.save(model, str(path))
    prog = tgc.load(str(path))
    x = -1.0 - np.random.default_rng(2).random((1, 2, 5, 5)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    for device in ("PYTHON", "CPU"):
        np.testing.assert_array_equal(prog.run(device=device, inputs={"x": x})["y"], want)
    assert "value=(-inf)" in prog.source
