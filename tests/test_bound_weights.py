"""Work on bound weights runs once (`tgc.engine.bound`, issue 23 "weights bound once at load"): kernels whose
inputs are only a program's bound weights (the CPU's packing of a convolution's weight, a reduction of a weight)
launch at a launch plan's first run and never again while the weights stay the same arrays; every run launches
the rest. Launches are counted at the realizer's one launch call (`realize._call`; TGC_GRAPH=0, so that no run
goes as one device graph), results compared with numpy."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

import tgc  # noqa: E402
from tgc.api import Program  # noqa: E402
from tgc.engine import bound, executable, realize  # noqa: E402

RNG = np.random.default_rng(7)
C_IN, C_OUT, HW = 32, 64, 20  # 3x3 conv: 7.4M multiply-adds, over schedule.CONV_MIN_FLOPS: its weight is packed


@pytest.fixture
def launches(monkeypatch):
    """Every kernel launch by name, each kernel launched on its own (no device graphs)."""
    monkeypatch.setenv("TGC_GRAPH", "0")
    counted: Counter = Counter()
    call = realize._call

    def counting(k, prog, handles, wait):
        counted[k.name] += 1
        return call(k, prog, handles, wait)

    monkeypatch.setattr(realize, "_call", counting)
    return counted


@pytest.fixture(scope="module")
def conv_model(tmp_path_factory):
    w = (RNG.standard_normal((C_OUT, C_IN, 3, 3)) * 0.1).astype(np.float32)
    b = RNG.standard_normal(C_OUT).astype(np.float32)
    g = h.make_graph([h.make_node("Conv", ["x", "W", "B"], ["y"], pads=[1, 1, 1, 1])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [1, C_IN, HW, HW])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, C_OUT, HW, HW])],
                     [nh.from_array(w, "W"), nh.from_array(b, "B")])
    path = tmp_path_factory.mktemp("bound") / "conv.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return str(path), w, b


def _conv_reference(x, w, b):
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = np.zeros((1, C_OUT, HW, HW)) + b.reshape(1, -1, 1, 1)
    for i in range(3):
        for j in range(3):
            y += np.einsum("nchw,oc->nohw", xp[:, :, i:i + HW, j:j + HW], w[:, :, i, j])
    return y


def _check_runs(run, launches, prelude_names, rest_names, w, b, runs=3):
    for _ in range(runs):
        x = RNG.standard_normal((1, C_IN, HW, HW)).astype(np.float32)
        np.testing.assert_allclose(run(x), _conv_reference(x, w, b), rtol=1e-4, atol=1e-4)
    for name in prelude_names:
        assert launches[name] == 1, (name, launches)
    for name in rest_names:
        assert launches[name] == runs, (name, launches)


def test_packing_of_a_models_weight_runs_once(conv_model, launches):
    """An ONNX convolution on the CPU: its weight's packing kernel is a prelude launched at the first run only; the
    convolution every run; the outputs equal numpy's convolution each time."""
    path, w, b = conv_model
    prog = tgc.load(path)
    exe = prog.lower("CPU")
    split = bound.split(exe)
    assert split.prelude and split.rest, "the CPU packs this convolution's weight: one kernel on weights only"
    names = [k.name for k in split.rest]
    # the original weight is read only by its packing: on the device only while the prelude runs; the bias stays
    assert {name for b, name in exe.inputs if b in split.temporary} == {"W"}
    assert {name for b, name in exe.inputs if b in split.kept} == {"B"}
    _check_runs(lambda x: prog.run(device="CPU", x=x)["y"], launches, [k.name for k in split.prelude], names, w, b)


def test_program_cache_and_package_run_the_packing_once(conv_model, launches, tmp_path, monkeypatch):
    """The same from the program cache's entry (a second load of the model) and from a package of the model
    (which holds the original weights and the packing kernel, run at its first run)."""
    monkeypatch.delenv("TGC_VERIFY_BOUNDS", raising=False)  # (the tests' bounds checks turn the program cache off)
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))
    path, w, b = conv_model
    first = tgc.load(path)
    first.run(device="CPU", x=np.zeros((1, C_IN, HW, HW), np.float32))  # (stores the program cache's entry)
    split = bound.split(first.lower("CPU"))
    prelude, rest = [k.name for k in split.prelude], [k.name for k in split.rest]
    again = tgc.load(path)
    assert again.cached("CPU")
    launches.clear()
    _check_runs(lambda x: again.run(device="CPU", x=x)["y"], launches, prelude, rest, w, b)

    from tgc import package

    pkg_path = tmp_path / "conv.tgpkg"
    pkg_path.write_bytes(package.build(first, "CPU", {}))
    pkg = tgc.load_package(str(pkg_path))
    launches.clear()
    _check_runs(lambda x: pkg.run(device="CPU", x=x)["y"], launches, [], [], w, b)
    assert sorted(launches.values()) == [1] * len(prelude) + [3] * len(rest), launches


def test_bound_weights_of_a_program_and_new_weight_arrays():
    """Any Program with weights (no ONNX): a reduction of the weight runs once per launch plan, on the PYTHON
    emulator; a bound input that comes as another array runs the prelude again, so results follow it."""
    src = "x: f32[4, 16]\nw: f32[8, 16]\ny = x @ w.T + w.sum(axis=1)\nreturn y\n"
    w = RNG.standard_normal((8, 16)).astype(np.float32)
    prog = Program(src, weights={"w": w})
    exe = prog.lower("PYTHON")
    assert exe.bound == {"w"} and len(bound.split(exe).prelude) == 1
    plans = realize.LaunchPlans()
    for w_now in (w, w, w * 2 + 1):
        x = RNG.standard_normal((4, 16)).astype(np.float32)
        out = executable.run(exe, {"x": x, "w": w_now}, replay=plans, key="k")["y"]
        np.testing.assert_allclose(out, x @ w_now.T + w_now.sum(axis=1), rtol=1e-5, atol=1e-4)
    assert plans.plans["k"].prelude_runs == 2  # the first run, and the new array
    assert plans.plans["k"].runs == 3


def test_kernels_on_inputs_of_the_caller_are_never_a_prelude():
    """Without bound inputs nothing is a prelude: the same program with `w` as the caller's input."""
    src = "x: f32[4, 16]\nw: f32[8, 16]\ny = x @ w.T + w.sum(axis=1)\nreturn y\n"
    exe = Program(src).lower("PYTHON")
    split = bound.split(exe)
    assert not split.prelude and len(split.rest) == len(exe.kernels)


def test_the_caller_inputs_are_built_once_and_each_call_gets_its_own_list():
    """`Program.inputs` (read by every `bind`) lists the caller's inputs by their names, weights left out, the
    same declarations on every call, in a list the caller may change without changing the program's."""
    src = "x: f32[N, 4]\nw: f32[4, 3]\nb: f32[3]\nreturn x @ w + b"
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    prog = Program(src, weights={"w": w}, names={"x": "input.1"})
    first = prog.inputs
    assert [d.name for d in first] == ["input.1", "b"]
    first.clear()
    again = prog.inputs
    assert [d.name for d in again] == ["input.1", "b"] and again is not first
    assert all(a is b for a, b in zip(again, prog.inputs))  # the declarations built once
    names = prog.dim_names
    names.append("Z")
    assert prog.dim_names == ["N"]
    x = np.ones((2, 4), np.float32)
    bias = np.array([1, 2, 3], np.float32)
    got = prog.run(device="CPU", inputs={"input.1": x, "b": bias})
    np.testing.assert_allclose(got["out0"], x @ w + bias, rtol=1e-6)
