"""What a new user's PyTorch-style GPT exported to ONNX ran into: a scalar ONNX constant packaged as a weight, a
symbolic package of a program with many weight inputs, the CLI's output piped into `head`, and repeat runs of a
per-size ONNX model."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from clikit import invoke  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tgc  # noqa: E402
from tgc import sizeexpr  # noqa: E402


def _max_model(path) -> None:
    """`Max(x, Constant(2.5))`: a 0-d constant, which the import binds as a weight `f32` (no dims)."""
    c = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(2.5, np.float32), "c"))
    m = helper.make_node("Max", ["x", "c"], ["y"])
    g = helper.make_graph([c, m], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_scalar_constant_weight_packages_and_runs(tmp_path):
    _max_model(tmp_path / "m.onnx")
    r = invoke("compile", str(tmp_path / "m.onnx"), "--package", str(tmp_path / "m.tgpkg"))
    assert r.exit_code == 0, r.stderr
    pkg = tgc.load_package(tmp_path / "m.tgpkg")
    x = np.array([[1, 2, 3], [-4, 2.5, 9]], np.float32)
    out = pkg.run(x=x)
    np.testing.assert_array_equal(next(iter(out.values())), np.maximum(x, np.float32(2.5)))


def test_combine_keeps_any_number_of_terms_shallow():
    terms = ["N"] + [16] * 300 + [["*", "N", 4]] * 3 + [f"D{i}" for i in range(200)]
    e = sizeexpr.combine("+", terms)
    sizeexpr.validate(e)  # (a left-deep chain of 504 terms is far past MAX_DEPTH)
    dims = {"N": 7, **{f"D{i}": i for i in range(200)}}
    assert sizeexpr.evaluate(e, dims) == 7 + 16 * 300 + 3 * 28 + sum(range(200))
    m = sizeexpr.combine("max", [3, "N", 9, "N", ["*", "N", 2]] + [f"D{i}" for i in range(100)])
    sizeexpr.validate(m)
    assert sizeexpr.evaluate(m, dims) == 99 and sizeexpr.evaluate(m, {**dims, "N": 60}) == 120
    assert sizeexpr.combine("+", [1, 2]) == 3 and sizeexpr.combine("+", ["N", 0]) == "N"
    assert sizeexpr.combine("max", [0, 5]) == 5 and sizeexpr.combine("+", [0]) == 0


def test_a_symbolic_package_with_60_weight_inputs(tmp_path):
    n = 60
    src = "x: f32[N, 4]\n" + "".join(f"w{i}: f32[4]\n" for i in range(n)) + \
        "y = (x + " + " + ".join(f"w{i}" for i in range(n)) + ")\nreturn y\n"
    (tmp_path / "w.tg").write_text(src)
    r = invoke("compile", str(tmp_path / "w.tg"), "--package", str(tmp_path / "w.tgpkg"))
    assert r.exit_code == 0, r.stderr
    pkg = tgc.load_package(tmp_path / "w.tgpkg")
    rng = np.random.default_rng(0)
    ws = {f"w{i}": rng.standard_normal(4).astype(np.float32) for i in range(n)}
    for rows in (1, 5):
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        want = x.copy()
        for i in range(n):
            want = want + ws[f"w{i}"]
        out = pkg.run(x=x, **ws)
        np.testing.assert_allclose(next(iter(out.values())), want, rtol=1e-5, atol=1e-5)


MLP_D = ["-D", "B=4", "-D", "IN=8", "-D", "HID=16", "-D", "OUT=8"]


@pytest.mark.parametrize("args", [["compile", "kernels/mlp.tg", *MLP_D], ["run", "kernels/mlp.tg", "--random", *MLP_D],
                                  ["bench", "kernels/mlp.tg", "--repeat", "1", *MLP_D], ["inspect", "PKG"],
                                  ["cache", "list"]], ids=lambda a: a[0])
def test_stdout_closed_by_its_reader_ends_quietly_with_exit_0(args, tmp_path):
    """`tgc ... | head -3`: the reader took what it wanted; no traceback, no error, exit 0 (as `git log | head`).
    The read end is closed before the command writes anything, so every print meets a closed pipe."""
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    if args == ["inspect", "PKG"]:
        _max_model(tmp_path / "m.onnx")
        assert invoke("compile", str(tmp_path / "m.onnx"), "--package", str(tmp_path / "m.tgpkg")).exit_code == 0
        args = ["inspect", str(tmp_path / "m.tgpkg")]
    env = {**os.environ, "PYTHONPATH": str(root), "TGC_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("DEBUG", None)
    p = subprocess.Popen([sys.executable, "-m", "tgc.cli.main", *args], cwd=root, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0, err
    assert err == "", err


def _i64(name: str, v) -> object:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int64), name))


def _vi(name: str, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _save(path, nodes, inputs, outputs) -> str:
    g = helper.make_graph(nodes, "g", inputs, outputs)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_a_per_size_model_reruns_a_seen_size_straight_from_its_program(tmp_path, monkeypatch):
    """`x[:, :seq - 1]` (a per-size model): the first run at a size translates; a repeat run at it builds no
    submodel and no key; a new size translates again; results equal numpy at every size."""
    from tgc.staged import StagedModel

    nodes = [helper.make_node("Shape", ["x"], ["s"]), _i64("i1", 1), helper.make_node("Gather", ["s", "i1"], ["n"]),
             _i64("one", 1), helper.make_node("Sub", ["n", "one"], ["m"]), _i64("ax0", [0]),
             helper.make_node("Unsqueeze", ["m", "ax0"], ["end"]), _i64("st", [0]), _i64("axes", [1]),
             helper.make_node("Slice", ["x", "st", "end", "axes"], ["y"])]
    m = tgc.load(_save(tmp_path / "slice.onnx", nodes, [_vi("x", ["batch", "seq"])], [_vi("y", ["batch", "s1"])]))
    assert isinstance(m, StagedModel) and m.per_size
    calls = []
    for fn in ("_submodel", "_key"):
        orig = getattr(StagedModel, fn)
        monkeypatch.setattr(StagedModel, fn, lambda self, *a, _o=orig, _n=fn: calls.append(_n) or _o(self, *a))
    rng = np.random.default_rng(1)
    for shape, translated in (((2, 5), True), ((2, 5), False), ((3, 4), True), ((2, 5), False), ((3, 4), False)):
        calls.clear()
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(m.run(device="CPU", x=x)["y"], x[:, :-1])
        assert ("_submodel" in calls) == translated and bool(calls) == translated, (shape, calls)
        assert len(m.stages) == 1 and len(m.stage_programs()) == 1


def test_a_stage_whose_shape_an_input_value_decides_is_not_reused_by_size(tmp_path):
    """Slice's end from an input's values: the same sizes with another end give another program, never the
    one a run before kept for those sizes."""
    nodes = [_i64("st", [0]), _i64("axes", [1]), helper.make_node("Slice", ["x", "st", "e", "axes"], ["y"])]
    from tgc.staged import load_staged

    m = load_staged(_save(tmp_path / "sl.onnx", nodes, [_vi("x", [2, 6]), _vi("e", [1], TensorProto.INT64)],
                       [_vi("y", [2, "k"])]))
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for end in (2, 2, 5, 3, 5):
        got = m.run(device="CPU", x=x, e=np.array([end], np.int64))["y"]
        np.testing.assert_array_equal(got, x[:, :end])


def _slice_model(tmp_path) -> str:
    nodes = [helper.make_node("Shape", ["x"], ["s"]), _i64("i1", 1), helper.make_node("Gather", ["s", "i1"], ["n"]),
             _i64("one", 1), helper.make_node("Sub", ["n", "one"], ["m"]), _i64("ax0", [0]),
             helper.make_node("Unsqueeze", ["m", "ax0"], ["end"]), _i64("st", [0]), _i64("axes", [1]),
             helper.make_node("Slice", ["x", "st", "end", "axes"], ["y"])]
    return _save(tmp_path / "slice.onnx", nodes, [_vi("x", ["batch", "seq"])], [_vi("y", ["batch", "s1"])])


def test_compile_of_a_per_size_model_with_every_dim_writes_and_emits(tmp_path):
    """-o DIR and --emit bin of a per-size model with every dim given: translated at those sizes and compiled as
    a Program; with a dim missing, one usage error saying every dim compiles it. Its printed kernels are headed
    as a Program's (no `// first stage:` label: it is one program)."""
    from clikit import assert_clean

    path = _slice_model(tmp_path)
    r = invoke("compile", path, "-D", "batch=2", "-D", "seq=5", "-o", str(tmp_path / "out"))
    assert r.exit_code == 0, r.stderr
    assert "translated per size: compiled at batch=2, seq=5" in r.stderr
    assert any(p.suffix == ".ll" for p in (tmp_path / "out").iterdir())
    r = invoke("compile", path, "-D", "batch=2", "-D", "seq=5", "--emit", "bin")
    assert r.exit_code == 0 and "bytes, sha256" in r.stdout, r.stderr
    for extra in (["--emit", "bin"], ["-o", str(tmp_path / "o2")]):
        assert_clean(invoke("compile", path, "-D", "batch=2", *extra), 2, "with every dim given", "at those sizes")
    r = invoke("compile", path, "-D", "batch=2", "-D", "seq=5")
    assert r.exit_code == 0, r.stderr
    assert "first stage" not in r.stdout and r.stdout.startswith("; kernel "), r.stdout[:200]


def test_a_package_hint_for_an_onnx_model_never_offers_a_symbolic_package(tmp_path):
    """An ONNX model with weights has no symbolic package: `-D batch=2 --package` asks for every dim, not
    for none."""
    from clikit import assert_clean

    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [_vi("x", ["batch", "seq", 4])],
                          [_vi("y", ["batch", "seq", 3])], initializer=[w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "mm.onnx"))
    r = invoke("compile", str(tmp_path / "mm.onnx"), "-D", "batch=2", "--package", str(tmp_path / "mm.tgpkg"))
    assert_clean(r, 2, "seq", "needs every dim")
    assert "give no -D" not in r.stderr, r.stderr


def test_import_of_a_per_size_model_names_only_the_dim_it_needs(tmp_path):
    """`x[:, :seq - 1]`: its import needs seq's value, not batch's: the hint says `tgc import -D seq=INT`; a
    --symbolic run is refused saying to drop it; a plain run's note says why it is translated per size."""
    from clikit import assert_clean

    path = _slice_model(tmp_path)
    r = invoke("import", path, "-o", str(tmp_path / "s.tg"))
    assert_clean(r, 2, "tgc import -D seq=INT (the other dims stay symbolic)")
    assert "batch=INT" not in r.stderr, r.stderr
    assert invoke("import", path, "-D", "seq=5", "-o", str(tmp_path / "s.tg")).exit_code == 0
    assert_clean(invoke("run", path, "--random", "-D", "batch=2", "-D", "seq=5", "--symbolic"), 2,
                 "drop --symbolic to run it at the sizes given")
    r = invoke("run", path, "--random", "-D", "batch=2", "-D", "seq=5")
    assert r.exit_code == 0, r.stderr
    assert "note: one program, translated for these sizes, as its shapes need the dims' values: " in r.stderr
    assert "node 'y' (Slice" in r.stderr, r.stderr
