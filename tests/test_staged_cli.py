"""An ONNX model with a data-dependent output shape (NonZero on a run-time value) through `tgc.load` and every
command (`tgc run|compile|bench|beam|inspect`): results against numpy, `--check` against ONNX's reference
evaluator, the errors (exit 2, one message). Runs on the PYTHON emulator except where a compile is the point."""

from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from clikit import assert_clean, invoke  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from tgc.dtype import dtypes  # noqa: E402
from tgc.engine.inputs import random_values  # noqa: E402

F = TensorProto.FLOAT


def _nonzero_model(rows: int | str = 3):
    """r = relu(x); out = float(NonZero(r)^T) * 2 + 1 (N x 2); r3 = r * 3 (read after the cut)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["t"]), helper.make_node("Cast", ["t"], ["tf"], to=F),
             helper.make_node("Mul", ["tf", "two"], ["m"]), helper.make_node("Add", ["m", "one"], ["out"]),
             helper.make_node("Mul", ["r", "three"], ["r3"])]
    inits = [helper.make_tensor(n, F, [], [v]) for n, v in [("two", 2.0), ("one", 1.0), ("three", 3.0)]]
    g = helper.make_graph(nodes, "nz", [helper.make_tensor_value_info("x", F, [rows, 4])],
                          [helper.make_tensor_value_info("out", F, ["N", 2]),
                           helper.make_tensor_value_info("r3", F, [rows, 4])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(m)
    return m


def _want(x: np.ndarray) -> dict[str, np.ndarray]:
    r = np.maximum(x, 0)
    return {"out": np.transpose(np.array(np.nonzero(r))).astype(np.float32) * 2 + 1, "r3": r * 3}


X = np.array([[1, -1, 2, 0], [0, 3, -2, 1], [-1, -1, 5, 0]], np.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("staged")
    onnx.save(_nonzero_model(), str(d / "nz.onnx"))
    onnx.save(_nonzero_model("B"), str(d / "nzb.onnx"))
    np.save(d / "x.npy", X)
    np.save(d / "xi.npy", X.astype(np.int32))
    np.save(d / "x43.npy", np.ones((4, 3), np.float32))
    (d / "p.tg").write_text("a: f32[4]\nreturn a * 2\n")
    return d


def test_load_gives_a_model_that_runs_and_benches_like_a_program(files):
    import tgc

    m = tgc.load(str(files / "nz.onnx"))
    assert [d.name for d in m.inputs] == ["x"] and m.output_names == ["out", "r3"]
    got = m.run(device="PYTHON", x=X)
    for name, want in _want(X).items():
        assert got[name].shape == want.shape and np.array_equal(got[name], want), name
    assert m.stages == ["tgc 1 nodes", "host NonZero", "tgc 5 nodes"]
    result = m.bench(device="PYTHON", inputs={"x": X}, repeat=2)
    assert result["runs"] == 2 and result["stages"] == m.stages and 0 < result["min_s"] <= result["median_s"]


def test_run_with_inputs_saves_outputs_by_onnx_name(files, tmp_path):
    r = invoke("run", str(files / "nz.onnx"), "-d", "PYTHON", "-i", f"x={files / 'x.npy'}", "-o",
               str(tmp_path / "o.npz"))
    assert r.exit_code == 0, r.stderr
    assert "host NonZero" in r.stderr
    with np.load(tmp_path / "o.npz") as z:
        for name, want in _want(X).items():
            assert np.array_equal(z[name], want), name


def test_run_random_with_dims_and_check(files, tmp_path):
    r = invoke("run", str(files / "nzb.onnx"), "-d", "PYTHON", "--random", "--seed", "3", "-D", "B=5", "--check",
               "-o", f"out={tmp_path / 'out.npy'}")
    assert r.exit_code == 0, r.stderr
    assert "check: ok" in r.stderr
    x = random_values(dtypes.f32, [5, 4], 3, 0)  # the values --random --seed 3 draws for input 0
    assert np.array_equal(np.load(tmp_path / "out.npy"), _want(x)["out"])


def test_check_reports_a_mismatch_with_exit_1(files, monkeypatch):
    from tgc.staged import StagedModel

    real = StagedModel.reference
    monkeypatch.setattr(StagedModel, "reference", lambda self, inputs: {k: v + 1 for k, v in
                                                                        real(self, inputs).items()})
    r = invoke("run", str(files / "nz.onnx"), "-d", "PYTHON", "-i", f"x={files / 'x.npy'}", "--check")
    assert_clean(r, 1, "check failed")


@pytest.mark.parametrize("args,words", [
    ((), ("missing input 'x'",)),
    (("-i", "x={d}/xi.npy"), ("dtype int32", "float32")),
    (("-i", "x={d}/x43.npy"), ("shape [4, 3]",)),
    (("-i", "z={d}/x.npy"), ("unknown input 'z'",)),
    (("--random", "-d", "PYTHON,PYTHON"), ("device list",)),
    (("--random", "--symbolic"), ("--symbolic",)),
])
def test_run_errors_exit_2(files, args, words):
    args = tuple(a.format(d=files) for a in args)
    device = () if "-d" in args else ("-d", "PYTHON")
    assert_clean(invoke("run", str(files / "nz.onnx"), *device, *args), 2, *words)


def test_other_commands_refuse_or_need_dims_clearly(files, tmp_path):
    assert_clean(invoke("viz", str(files / "nz.onnx"), "--no-measure", "-o", str(tmp_path / "v.html")), 2,
                 "tgc viz does not take", "run, compile, bench, beam")
    assert_clean(invoke("beam", str(files / "nzb.onnx"), "-d", "PYTHON"), 2, "dim B is unknown", "-D B=")
    assert_clean(invoke("compile", str(files / "nz.onnx"), "--package", str(tmp_path / "p.tgpkg")), 2, "--package")
    assert_clean(invoke("compile", str(files / "nz.onnx"), "-o", str(tmp_path / "k")), 2, "compile -o")
    assert_clean(invoke("compile", str(files / "p.tg"), "--random"), 2, "data-dependent")


def test_bench_and_inspect(files):
    r = invoke("bench", str(files / "nz.onnx"), "-d", "PYTHON", "--repeat", "2", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["stages"] == ["tgc 1 nodes", "host NonZero", "tgc 5 nodes"] and doc["runs"] == 2
    r = invoke("inspect", str(files / "nz.onnx"))
    assert r.exit_code == 0, r.stderr
    assert "NonZero" in r.stdout and "run in stages" in r.stdout


def test_compile_first_stage_then_every_stage_with_inputs(files):
    r = invoke("compile", str(files / "nz.onnx"), "-d", "CPU", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [s["stage"] for s in doc["stages"]] == ["first stage"] and doc["later"][0] == "host NonZero"
    assert all(k["binary_bytes"] > 0 for k in doc["stages"][0]["kernels"])
    r = invoke("compile", str(files / "nz.onnx"), "-d", "CPU")
    assert r.exit_code == 0 and "define void" in r.stdout and "compiled at run time" in r.stderr
    r = invoke("compile", str(files / "nz.onnx"), "-d", "CPU", "-i", f"x={files / 'x.npy'}", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [s["stage"] for s in doc["stages"]] == ["tgc 1 nodes", "tgc 5 nodes"] and doc["later"] == []
    assert all(s["kernels"] for s in doc["stages"])


def test_beam_searches_every_stage_a_random_run_reaches(files):
    r = invoke("beam", str(files / "nz.onnx"), "-d", "PYTHON", "--width", "1", "--budget", "2", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [s["stage"] for s in doc["stages"]] == ["tgc 1 nodes", "tgc 5 nodes"]
    assert all(s["kernels"] for s in doc["stages"])


def test_profile_of_a_staged_run_says_where_it_wrote_the_trace(files, tmp_path):
    trace = tmp_path / "t.json"
    r = invoke("run", str(files / "nz.onnx"), "-d", "PYTHON", "-i", f"x={files / 'x.npy'}", "--profile", str(trace))
    assert r.exit_code == 0, r.stderr
    assert f"wrote {trace} (profile trace: " in r.stderr, r.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)
