"""ONNX models with symbolic dims (`dim_param`) that compute with their shapes, as exported models do: Shape ->
Gather -> Unsqueeze -> Concat -> Reshape, Expand/ConstantOfShape/Range/Tile/Slice with sizes from Shape, TopK's k
from a shape, Resize's sizes from a shape, and a tiny attention block (issue 23). Where ONNX's shape inference
gives the shape in the dims, the model stays one symbolic program (runs with `symbolic=True`); else it is
translated per size once the dims are known, and its symbolic path is one clear error. Compared with numpy at
two or three sizes each."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from clikit import assert_clean, invoke  # noqa: E402
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

import tgc  # noqa: E402
from tgc.api import Program  # noqa: E402
from tgc.staged import StagedModel  # noqa: E402

RNG = np.random.default_rng(0)


def _c(name, arr):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.asarray(arr), name + "_v"))


def _vi(name, shape, t=TP.FLOAT):
    return h.make_tensor_value_info(name, t, [None] * shape if isinstance(shape, int) else shape)


def _save(tmp_path, name, nodes, inputs, outputs, inits=()):
    g = h.make_graph(nodes, name, inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(m, path)
    return path


def _heads(tmp_path):
    """x[batch, seq, 32] -> [batch, 4, seq, 8]: the head split of an exported attention layer."""
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i0", np.array(0, np.int64)), _c("i1", np.array(1, np.int64)),
             h.make_node("Gather", ["s", "i0"], ["b"]), h.make_node("Gather", ["s", "i1"], ["q"]),
             _c("ax0", np.array([0], np.int64)),
             h.make_node("Unsqueeze", ["b", "ax0"], ["bu"]), h.make_node("Unsqueeze", ["q", "ax0"], ["qu"]),
             _c("tail", np.array([4, 8], np.int64)), h.make_node("Concat", ["bu", "qu", "tail"], ["shp"], axis=0),
             h.make_node("Reshape", ["x", "shp"], ["r"]), h.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])]
    return _save(tmp_path, "heads", nodes, [_vi("x", ["batch", "seq", 32])], [_vi("y", 4)])


def _expand(tmp_path):
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Expand", ["v", "s"], ["e"]),
             h.make_node("ConstantOfShape", ["s"], ["z"], value=nh.from_array(np.array([2.0], np.float32))),
             h.make_node("Add", ["e", "z"], ["y"])]
    return _save(tmp_path, "expand", nodes, [_vi("x", ["batch", "seq"]), _vi("v", [1, "seq"])], [_vi("y", 2)])


def _attention(tmp_path, d=16, heads=2):
    """Projections, heads by Shape/Gather/Concat/Reshape, MatMul, Softmax, the heads merged back, and TopK (k=2)
    over the seq axis of a score."""
    hd = d // heads
    ws = {n: (RNG.standard_normal((d, d)) / 4).astype(np.float32) for n in ("wq", "wk", "wv", "wo")}
    nodes = [_c("red", np.array([2], np.int64)), h.make_node("Shape", ["x"], ["s"]),
             _c("i0", np.array([0], np.int64)), _c("i1", np.array([1], np.int64)),
             h.make_node("Gather", ["s", "i0"], ["b"]), h.make_node("Gather", ["s", "i1"], ["n"]),
             _c("hh", np.array([heads, hd], np.int64)), h.make_node("Concat", ["b", "n", "hh"], ["shp"], axis=0),
             _c("dd", np.array([d], np.int64)), h.make_node("Concat", ["b", "n", "dd"], ["shp2"], axis=0)]
    for p in "qkv":
        nodes += [h.make_node("MatMul", ["x", "w" + p], [p + "0"]), h.make_node("Reshape", [p + "0", "shp"], [p + "1"]),
                  h.make_node("Transpose", [p + "1"], [p], perm=[0, 2, 1, 3] if p != "k" else [0, 2, 3, 1])]
    nodes += [h.make_node("MatMul", ["q", "k"], ["a0"]), _c("scale", np.array(1 / np.sqrt(hd), np.float32)),
              h.make_node("Mul", ["a0", "scale"], ["a1"]), h.make_node("Softmax", ["a1"], ["a"], axis=-1),
              h.make_node("MatMul", ["a", "v"], ["o0"]), h.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
              h.make_node("Reshape", ["o1", "shp2"], ["o2"]), h.make_node("MatMul", ["o2", "wo"], ["y"]),
              _c("kk", np.array([2], np.int64)), h.make_node("ReduceSum", ["y", "red"], ["score"], keepdims=0),
              h.make_node("TopK", ["score", "kk"], ["tv", "ti"], axis=1)]
    path = _save(tmp_path, "attention", nodes, [_vi("x", ["batch", "seq", d])],
                 [_vi("y", 3), _vi("tv", 2), _vi("ti", 2, TP.INT64)], [nh.from_array(w, n) for n, w in ws.items()])

    def ref(x):
        b, n, _ = x.shape
        q, k, v = ((x @ ws[w]).reshape(b, n, heads, hd).transpose(0, 2, 1, 3) for w in ("wq", "wk", "wv"))
        a = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        y = (a @ v).transpose(0, 2, 1, 3).reshape(b, n, d) @ ws["wo"]
        ti = np.argsort(-y.sum(2), axis=1, kind="stable")[:, :2]
        return {"y": y, "tv": np.take_along_axis(y.sum(2), ti, 1), "ti": ti}
    return path, ref


@pytest.mark.parametrize("sizes", [(1, 5), (3, 4)])
def test_shape_subgraphs_the_inference_types_stay_symbolic(tmp_path, sizes):
    """Reshape, Expand and ConstantOfShape by shapes from Shape: one Program (not per size) whose source has the
    dims as size expressions; plain and symbolic runs equal numpy."""
    b, n = sizes
    x = RNG.standard_normal((b, n, 32)).astype(np.float32)
    prog = tgc.load(_heads(tmp_path))
    assert isinstance(prog, Program) and "reshape(x, (batch, seq, 4, 8))" in prog.source
    want = x.reshape(b, n, 4, 8).transpose(0, 2, 1, 3)
    for sym in (False, True):
        np.testing.assert_array_equal(prog.run(device="CPU", x=x, symbolic=sym)["y"], want)
    assert prog.last_run == "symbolic"
    x2, v = RNG.standard_normal((b, n)).astype(np.float32), RNG.standard_normal((1, n)).astype(np.float32)
    prog = tgc.load(_expand(tmp_path))
    assert isinstance(prog, Program)
    for sym in (False, True):
        np.testing.assert_allclose(prog.run(device="CPU", x=x2, v=v, symbolic=sym)["y"],
                                   np.broadcast_to(v, (b, n)) + 2.0, rtol=1e-6)


def test_attention_block_with_topk_on_the_seq_axis(tmp_path):
    """The tiny attention block at three sizes, plain and symbolic (TopK over a symbolic axis used to stop the
    translation with "the type of 'tv' is unknown")."""
    path, ref = _attention(tmp_path)
    prog = tgc.load(path)
    assert isinstance(prog, Program)
    for b, n in ((1, 3), (2, 5), (3, 4)):
        x = RNG.standard_normal((b, n, 16)).astype(np.float32)
        want = ref(x)
        for sym in (False, True):
            got = prog.run(device="CPU", x=x, symbolic=sym)
            np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(got["tv"], want["tv"], rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(got["ti"], want["ti"])


def _per_size_models(tmp_path):
    """(path, inputs at a size, numpy reference) for the patterns that need a dim's value as a number."""
    i64 = np.int64
    out = []
    # Range(0, seq) added to x, and Tile by [batch, 2] from the shape
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i1", np.array(1, i64)), h.make_node("Gather", ["s", "i1"], ["n"]),
             _c("zero", np.array(0, i64)), _c("one", np.array(1, i64)),
             h.make_node("Range", ["zero", "n", "one"], ["ar"]),
             h.make_node("Cast", ["ar"], ["arf"], to=TP.FLOAT), h.make_node("Add", ["x", "arf"], ["y"]),
             _c("i0", np.array([0], i64)), h.make_node("Gather", ["s", "i0"], ["b"]), _c("two", np.array([2], i64)),
             h.make_node("Concat", ["b", "two"], ["reps"], axis=0), h.make_node("Tile", ["v", "reps"], ["t"])]
    out.append((_save(tmp_path, "range_tile", nodes, [_vi("x", ["batch", "seq"]), _vi("v", [1, 3])],
                      [_vi("y", 2), _vi("t", 2)]),
                lambda b, n: {"x": RNG.standard_normal((b, n)).astype(np.float32),
                              "v": RNG.standard_normal((1, 3)).astype(np.float32)},
                lambda a: {"y": a["x"] + np.arange(a["x"].shape[1]), "t": np.tile(a["v"], (a["x"].shape[0], 2))}))
    # x[:, :seq - 1] by Shape -> Gather -> Sub -> Unsqueeze -> Slice
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i1", np.array(1, i64)), h.make_node("Gather", ["s", "i1"], ["n"]),
             _c("one", np.array(1, i64)), h.make_node("Sub", ["n", "one"], ["m"]), _c("ax0", np.array([0], i64)),
             h.make_node("Unsqueeze", ["m", "ax0"], ["end"]), _c("st", np.array([0], i64)),
             _c("axes", np.array([1], i64)), h.make_node("Slice", ["x", "st", "end", "axes"], ["y"])]
    out.append((_save(tmp_path, "slice", nodes, [_vi("x", ["batch", "seq"])], [_vi("y", 2)]),
                lambda b, n: {"x": RNG.standard_normal((b, n)).astype(np.float32)},
                lambda a: {"y": a["x"][:, :-1]}))
    # TopK with k = seq // 2 from the shape
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i1", np.array([1], i64)),
             h.make_node("Gather", ["s", "i1"], ["n"]), _c("two", np.array([2], i64)),
             h.make_node("Div", ["n", "two"], ["k"]),
             h.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)]

    def topk(a):
        x = a["x"]
        i = np.argsort(-x, axis=1, kind="stable")[:, :x.shape[1] // 2]
        return {"v": np.take_along_axis(x, i, 1), "i": i}
    out.append((_save(tmp_path, "topk", nodes, [_vi("x", ["batch", "seq"])], [_vi("v", 2), _vi("i", 2, TP.INT64)]),
                lambda b, n: {"x": RNG.permutation(b * n).reshape(b, n).astype(np.float32)}, topk))
    # Resize (nearest) to twice the input's sizes, computed from its shape
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("f", np.array([1, 1, 2, 2], i64)),
             h.make_node("Mul", ["s", "f"], ["sz"]), h.make_node("Resize", ["x", "", "", "sz"], ["y"], mode="nearest")]
    out.append((_save(tmp_path, "resize", nodes, [_vi("x", ["batch", 2, "seq", "seq"])], [_vi("y", 4)]),
                lambda b, n: {"x": RNG.standard_normal((b, 2, n, n)).astype(np.float32)},
                lambda a: {"y": a["x"].repeat(2, axis=2).repeat(2, axis=3)}))
    return out


def test_shape_values_as_numbers(tmp_path):
    """Range(0, seq), Tile by [batch, 2] and TopK's k = seq // 2 from the shape are size expressions: one Program,
    plain and symbolic runs equal numpy (a symbolic run may fall back to size-specialized kernels: `last_run`
    says so). Slice's end seq - 1 and Resize's sizes need the dims' values: translated per size once the arrays
    give them, equal to numpy at each size; their symbolic path is one clear error naming the node and op."""
    kinds = {"range_tile": Program, "topk": Program, "slice": StagedModel, "resize": StagedModel}
    for path, make, ref in _per_size_models(tmp_path):
        m = tgc.load(path)
        kind = kinds[path.rsplit("/", 1)[1][:-5]]
        assert isinstance(m, kind), path
        for b, n in ((1, 4), (2, 5), (3, 2)):
            arrays = make(b, n)
            want = ref(arrays)
            for sym in (False, True) if kind is Program else (False,):
                got = m.run(device="CPU", inputs=arrays, symbolic=sym)
                for k, w in want.items():
                    assert got[k].shape == w.shape, (path, k)
                    np.testing.assert_allclose(got[k], w, rtol=1e-6, err_msg=f"{path} {k}")
        if kind is StagedModel:
            assert m.per_size
            with pytest.raises(tgc.TgcError, match="symbolic sizes are not available .*opset 17"):
                m.run(device="CPU", inputs=arrays, symbolic=True)
            with pytest.raises(tgc.TgcError, match="symbolic sizes are not available"):
                m.compile_symbolic()


def test_exported_reshape_patterns_stay_symbolic(tmp_path):
    """PyTorch's exporter writes view(b, s, -1) as Concat(b, s, [-1]) and expand's sizes through
    Where(Equal(shape, -1), 1, shape): ONNX's inference leaves both unknown; tgc follows them, so the model is
    one symbolic Program and the MatMul after the Reshape is typed in the dims."""
    w = RNG.standard_normal((32, 5)).astype(np.float32)
    i64 = np.int64
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i0", np.array([0], i64)), _c("i1", np.array([1], i64)),
             h.make_node("Gather", ["s", "i0"], ["b"]), h.make_node("Gather", ["s", "i1"], ["q"]),
             _c("m1", np.array([-1], i64)), h.make_node("Concat", ["b", "q", "m1"], ["shp"], axis=0),
             h.make_node("Reshape", ["x", "shp"], ["r"]), h.make_node("MatMul", ["r", "w"], ["y"]),
             _c("z", np.array([0, 0, 32], i64)), h.make_node("Reshape", ["x", "z"], ["y2"]),
             _c("m11", np.array([-1, -1], i64)), h.make_node("Concat", ["b", "q"], ["bq"], axis=0),
             h.make_node("Equal", ["bq", "m11"], ["eq"]), _c("ones", np.array([1, 1], i64)),
             h.make_node("Where", ["eq", "ones", "bq"], ["bq2"]), h.make_node("Expand", ["v", "bq2"], ["y3"])]
    path = _save(tmp_path, "exported", nodes, [_vi("x", ["batch", "seq", 4, 8]), _vi("v", [1, 1])],
                 [_vi("y", 3), _vi("y2", 3), _vi("y3", 2)], [nh.from_array(w, "w")])
    prog = tgc.load(path)
    assert isinstance(prog, Program) and "reshape(x, (batch, seq, 32))" in prog.source
    # the shape arithmetic the size expressions replaced is not in the text, nor the constants only it read
    assert "cat(" not in prog.source and "take(" not in prog.source and set(prog.weights) == {"w"}
    for b, n in ((1, 3), (2, 5)):
        x = RNG.standard_normal((b, n, 4, 8)).astype(np.float32)
        v = np.full((1, 1), 3.0, np.float32)
        for sym in (False, True):
            got = prog.run(device="CPU", x=x, v=v, symbolic=sym)
            np.testing.assert_allclose(got["y"], x.reshape(b, n, 32) @ w, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(got["y2"], x.reshape(b, n, 32))
            np.testing.assert_array_equal(got["y3"], np.full((b, n), 3.0, np.float32))
        assert prog.last_run == "symbolic"


def test_cli_run_with_and_without_dims(tmp_path):
    """`tgc run m.onnx -i x=x.npy` with the dims from the array or given by -D (a -D that disagrees: exit 2);
    --symbolic runs the symbolic model and is one clear usage error for a per-size one."""
    path = _heads(tmp_path)
    x = RNG.standard_normal((2, 3, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = x.reshape(2, 3, 4, 8).transpose(0, 2, 1, 3)
    for extra in ([], ["-D", "batch=2"], ["--symbolic"]):
        r = invoke("run", path, "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"), *extra)
        assert r.exit_code == 0, r.output
        np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], want)
    assert_clean(invoke("run", path, "-i", f"x={tmp_path / 'x.npy'}", "-D", "batch=4"), 2, "batch")
    (slice_path, make, ref), = [m for m in _per_size_models(tmp_path) if m[0].endswith("slice.onnx")]
    xs = make(3, 5)["x"]
    np.save(tmp_path / "xs.npy", xs)
    for extra in ([], ["-D", "batch=3", "-D", "seq=5"]):
        r = invoke("run", slice_path, "-i", f"x={tmp_path / 'xs.npy'}", "-o", str(tmp_path / "o.npz"), *extra)
        assert r.exit_code == 0, r.output
        np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], xs[:, :-1])
    assert_clean(invoke("run", slice_path, "-i", f"x={tmp_path / 'xs.npy'}", "-D", "seq=4"), 2, "seq")
    r = invoke("run", slice_path, "-i", f"x={tmp_path / 'xs.npy'}", "--symbolic")
    assert_clean(r, 2, "--symbolic", "translated per size", "node 'y' (Slice, opset 17)", "batch, seq")
    r = invoke("run", slice_path, "--random", "-D", "batch=2", "-D", "seq=4", "--check")
    assert r.exit_code == 0 and "check: ok" in r.output, r.output


def test_a_shape_from_data_stays_one_clear_error(tmp_path):
    """A Reshape whose shape mixes the input's size with another input's values is not a dim computation: the
    load names the node, the op and the input whose values decide it, exit 2 (no per-size fallback)."""
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Add", ["s", "d"], ["shp"]),
             h.make_node("Reshape", ["x", "shp"], ["y"], name="rs")]
    path = _save(tmp_path, "mixed", nodes, [_vi("x", ["batch", 4]), _vi("d", [2], TP.INT64)], [_vi("y", 2)])
    with pytest.raises(tgc.TgcError, match="node 'rs' \\(Reshape, opset 17\\).*input\\(s\\) d"):
        tgc.load(path)
    assert_clean(invoke("run", path, "--random", "-D", "batch=2"), 2, "'rs'", "Reshape")


def test_size_arithmetic_is_exact_or_unknown():
    """`tgc.onnx.symshapes`: products of dims stay products, -1 in a Reshape is solved by cancelling dims, a
    division is kept only where it is exact (or a product of dims by a positive int, as `//`), and Equal decides
    only what holds at every size (a size is never -1)."""
    from tgc.onnx import symshapes as ss

    b, s = ss.Mono(1, ("B",)), ss.Mono(1, ("S",))
    assert ss.mul(b, 4) == ss.Mono(4, ("B",)) and ss.text(ss.mul(ss.mul(b, s), 2)) == "2*B*S"
    assert ss.div(ss.Mono(8, ("B", "S")), ss.Mono(2, ("S",))) == ss.Mono(4, ("B",))
    assert ss.div(b, s) is None and ss.div(ss.sub(s, 1), 2) is None  # (not exact; seq - 1 may be negative)
    assert ss.text(ss.div(s, 2)) == "(S // 2)" and ss.div(-7, 2) == -3  # (ONNX's Div truncates)
    assert ss.text(ss.sub(s, 1)) == "(S - 1)" and ss.sub(s, s) == 0 and ss.add(b, b) == ss.Mono(2, ("B",))
    assert ss.sub(ss.add(b, s), b) == s and ss.text(ss.sub(3, ss.add(b, s))) == "(3 - B - S)"  # (like terms)
    assert ss.lower(ss.sub(s, 1)) == -1 and ss.lower(ss.sub(1, s)) is None and ss.lower(ss.add(b, 2)) == 2
    assert ss.lower(ss.mul(ss.add(b, 1), ss.add(s, 2))) == 2 and ss.lower(ss.div(s, 2)) == 0  # (a dim may be 0)
    assert ss._reshape([b, s, 4, 8], [0, 0, -1], False) == [b, s, 32]
    assert ss._reshape([b, s, 4, 8], [-1, 8], False) == [ss.Mono(4, ("B", "S")), 8]
    assert ss._reshape([b, s, 3], [-1, 2], False) is None  # (3 * B * S is not known to be even)
    assert ss._equal(b, -1) is False and ss._equal(b, 1) is None and ss._equal(b, b) is True
    assert ss._broadcast([1, s], [b, 1]) == [b, s] and ss._broadcast([b], [s]) is None
    sizes = {"e": (1, [True, False])}.get
    (rank, vals), _ = ss._node("Cast", ["e"], {"to": h.make_attribute("to", TP.INT64)}, sizes, lambda n: None)
    assert [ss.text(v) for v in vals] == ["1", "0"]  # (Equal's bools cast to ints are numbers, not "True")


def test_import_with_dims_fixed(tmp_path):
    """`tgc import -D seq=5` fixes that dim_param: the Slice whose end is seq - 1 is then x[:, 0:4] (typed, the
    batch still a dim), where without -D the import is one clear error; a -D the model has no dim of: exit 2."""
    (path, make, ref), = [m for m in _per_size_models(tmp_path) if m[0].endswith("slice.onnx")]
    out = str(tmp_path / "s.tg")
    assert_clean(invoke("import", path, "-o", out), 2, "node 'y' (Slice, opset 17)", "batch, seq")
    r = invoke("import", path, "-o", out, "-D", "seq=5")
    assert r.exit_code == 0, r.output
    text = open(out).read()
    assert "x: f32[batch, 5]" in text and "x[:, 0:4]" in text
    for b in (2, 3):
        x = make(b, 5)["x"]
        np.save(tmp_path / "x.npy", x)
        r = invoke("run", out, "--inputs", str(tmp_path / "s.npz"), "-i", f"x={tmp_path / 'x.npy'}",
                   "-o", str(tmp_path / "o.npz"))
        assert r.exit_code == 0, r.output
        np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], x[:, :4])
    assert_clean(invoke("import", path, "-o", out, "-D", "sequence=5"), 2, "sequence", "batch, seq")


def test_slice_bounds_from_fixed_sizes_of_a_symbolic_input(tmp_path):
    """Bounds computed from an input's fixed axis (Shape(x)[1] = 6, batch symbolic) are numbers: a reversed Slice
    whose start is 6 * -20 and end 6 * -40 clamps as ONNX's spec and onnxruntime say (start to 0, end to before
    0: one element; onnx.reference gives none), and the program stays symbolic in batch."""
    i64 = np.int64
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i1", np.array([1], i64)),
             h.make_node("Gather", ["s", "i1"], ["n"]), _c("m", np.array([-20], i64)),
             h.make_node("Mul", ["n", "m"], ["st"]), _c("two", np.array([2], i64)),
             h.make_node("Mul", ["st", "two"], ["en"]), _c("ax", np.array([1], i64)),
             _c("step", np.array([-1], i64)), h.make_node("Slice", ["x", "st", "en", "ax", "step"], ["y"]),
             _c("one", np.array([1], i64)), h.make_node("Sub", ["n", "one"], ["e2"]),
             h.make_node("Slice", ["x", "one", "e2", "ax"], ["y2"])]
    path = _save(tmp_path, "sl2", nodes, [_vi("x", ["batch", 6])], [_vi("y", 2), _vi("y2", 2)])
    prog = tgc.load(path)
    assert isinstance(prog, Program) and "batch" in prog.dim_names
    for b in (1, 3):
        x = RNG.standard_normal((b, 6)).astype(np.float32)
        for sym in (False, True):
            got = prog.run(device="CPU", x=x, symbolic=sym)
            np.testing.assert_array_equal(got["y"], x[:, 0:1])
            np.testing.assert_array_equal(got["y2"], x[:, 1:5])


def test_range_count_negative_at_small_sizes_is_zero(tmp_path):
    """Range's count is max(ceil((limit - start) / delta), 0): Range(0, seq - 3) and Range(seq - 3, 0) are empty
    at seq = 2 (Size 0, Shape [0], ConstantOfShape and Expand by that shape empty), as onnxruntime gives; such a
    count is not a size at every seq, so the model is translated per size. Range(past, past + seq) stays one
    symbolic program ((past + seq) - past is seq, at least 0)."""
    i64 = np.int64
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i1", np.array(1, i64)), h.make_node("Gather", ["s", "i1"], ["n"]),
             _c("three", np.array(3, i64)), h.make_node("Sub", ["n", "three"], ["m"]), _c("zero", np.array(0, i64)),
             _c("one", np.array(1, i64)), h.make_node("Range", ["zero", "m", "one"], ["r"]),
             h.make_node("Size", ["r"], ["sz"]), h.make_node("Shape", ["r"], ["rs"]),
             h.make_node("ConstantOfShape", ["rs"], ["c"], value=nh.from_array(np.array([5.0], np.float32))),
             h.make_node("Range", ["m", "zero", "one"], ["r2"]), h.make_node("Shape", ["r2"], ["rs2"]),
             h.make_node("Expand", ["v", "rs2"], ["e"])]
    path = _save(tmp_path, "rneg", nodes, [_vi("x", ["batch", "seq"]), _vi("v", [1])],
                 [_vi("r", 1, TP.INT64), _vi("sz", 0, TP.INT64), _vi("rs", 1, TP.INT64), _vi("c", 1), _vi("e", 1)])
    m = tgc.load(path)
    v = np.array([1.5], np.float32)
    for n in (5, 2, 1, 3):
        got = m.run(device="CPU", x=np.zeros((1, n), np.float32), v=v)
        cnt, cnt2 = max(n - 3, 0), max(3 - n, 0)
        np.testing.assert_array_equal(got["r"], np.arange(cnt))
        assert int(got["sz"]) == cnt and list(got["rs"]) == [cnt]
        np.testing.assert_array_equal(got["c"], np.full(cnt, 5.0, np.float32))
        np.testing.assert_array_equal(got["e"], np.full(cnt2, 1.5, np.float32))
    with pytest.raises(tgc.TgcError, match=r"the limit \('m'\) of node 'r' \(Range, opset 17\): computed from the "
                       r"inputs' sizes .*; the translation takes the values of the symbolic dims batch, seq"):
        m.run(device="CPU", x=np.zeros((1, 5), np.float32), v=v, symbolic=True)
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i1", np.array(1, i64)), h.make_node("Gather", ["s", "i1"], ["n"]),
             h.make_node("Shape", ["pk"], ["ps"]), _c("i0", np.array(0, i64)),
             h.make_node("Gather", ["ps", "i0"], ["p"]),
             h.make_node("Add", ["p", "n"], ["pn"]), _c("one", np.array(1, i64)),
             h.make_node("Range", ["p", "pn", "one"], ["pos"]), h.make_node("Cast", ["pos"], ["pf"], to=TP.FLOAT),
             h.make_node("Add", ["x", "pf"], ["y"])]
    path = _save(tmp_path, "pos", nodes, [_vi("x", ["batch", "seq"]), _vi("pk", ["past", 2])], [_vi("y", 2)])
    prog = tgc.load(path)
    assert isinstance(prog, Program)
    for b, n, p in ((2, 3, 4), (1, 1, 0)):
        x, pk = RNG.standard_normal((b, n)).astype(np.float32), np.zeros((p, 2), np.float32)
        for sym in (False, True):
            np.testing.assert_allclose(prog.run(device="CPU", x=x, pk=pk, symbolic=sym)["y"],
                                       x + np.arange(p, p + n, dtype=np.float32), rtol=1e-6)


def test_squeeze_without_axes_on_symbolic_dims(tmp_path):
    """Squeeze without axes drops the axes of size 1, which the sizes decide: x[batch, one, 3] is translated per
    size (it kept all three axes at (3, 1, 3)); numpy's squeeze at each size, and the symbolic path one clear
    error naming the need."""
    path = _save(tmp_path, "sq", [h.make_node("Squeeze", ["x"], ["y"])], [_vi("x", ["batch", "one", 3])],
                 [_vi("y", 2)])
    m = tgc.load(path)
    assert isinstance(m, StagedModel)
    for shape in ((3, 1, 3), (1, 1, 3), (2, 2, 3)):
        x = RNG.standard_normal(shape).astype(np.float32)
        got = m.run(device="CPU", x=x)["y"]
        assert got.shape == np.squeeze(x).shape
        np.testing.assert_array_equal(got, np.squeeze(x))
    with pytest.raises(tgc.TgcError, match="Squeeze without axes drops those of size 1"):
        m.run(device="CPU", x=x, symbolic=True)


def test_per_size_model_checks_a_shared_dim(tmp_path):
    """Two inputs sharing a dim_param given different sizes: a per-size model says which (as a Program does:
    `dim seq mismatch: ...`), exit 2 on the CLI; consistent sizes run and equal numpy."""
    i64 = np.int64
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i1", np.array([1], i64)),
             h.make_node("Gather", ["s", "i1"], ["n"]), _c("one", np.array([1], i64)),
             h.make_node("Sub", ["n", "one"], ["e"]), _c("z", np.array([0], i64)),
             h.make_node("Slice", ["v", "z", "e", "one"], ["y"])]
    path = _save(tmp_path, "shared", nodes, [_vi("x", ["batch", "seq"]), _vi("v", [2, "seq"])], [_vi("y", 2)])
    m = tgc.load(path)
    assert isinstance(m, StagedModel) and m.per_size
    x, v = np.zeros((1, 4), np.float32), RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_array_equal(m.run(device="CPU", x=x, v=v)["y"], v[:, :3])
    for x2, v2 in ((x, RNG.standard_normal((2, 6)).astype(np.float32)), (np.zeros((1, 6), np.float32), v)):
        with pytest.raises(tgc.TgcError, match="dim seq mismatch: input 'v' axis 1 has size .*from input 'x'"):
            m.run(device="CPU", x=x2, v=v2)
    with pytest.raises(tgc.TgcError, match="dim seq mismatch: input 'x' axis 1 has size 4, but seq = 5 from the"):
        m.run(device="CPU", x=x, v=v, dims={"seq": 5})
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "v.npy", np.zeros((2, 6), np.float32))
    assert_clean(invoke("run", path, "-i", f"x={tmp_path / 'x.npy'}", "-i", f"v={tmp_path / 'v.npy'}"), 2,
                 "dim seq mismatch", "input 'v'")


def test_resize_by_float_scales_beside_a_reshape_by_shape(tmp_path, monkeypatch):
    """A Resize of a fixed-size input by a float scales initializer, beside a Reshape by Shape (which makes the
    translation re-run ONNX's inference without the weights): the Resize keeps its type (it lost it: the model
    went per size), one symbolic Program equal to numpy; also where the re-inference has no initializer values
    at all (the first inference's types are kept)."""
    import importlib

    tr_mod = importlib.import_module("tgc.onnx.translate")  # (tgc.onnx.translate is also the function)
    keep = tr_mod._without_big_weights

    def no_values(m, out):
        keep(m, out)
        del out.graph.initializer[:]
    i64 = np.int64
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i0", np.array([0], i64)),
             h.make_node("Gather", ["s", "i0"], ["b"]), _c("m1", np.array([-1], i64)),
             h.make_node("Concat", ["b", "m1"], ["shp"], axis=0), h.make_node("Reshape", ["x", "shp"], ["y"]),
             h.make_node("Resize", ["z", "", "scales"], ["rs"], mode="nearest"), h.make_node("Relu", ["rs"], ["y2"])]
    path = _save(tmp_path, "rsz", nodes, [_vi("x", ["batch", 8, 3]), _vi("z", [1, 2, 4, 3])],
                 [_vi("y", 2), _vi("y2", 4)],
                 [nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    z = RNG.standard_normal((1, 2, 4, 3)).astype(np.float32)
    want2 = np.maximum(z.repeat(2, axis=2).repeat(2, axis=3), 0)
    for weightless in (False, True):
        if weightless:
            monkeypatch.setattr(tr_mod, "_without_big_weights", no_values)
        prog = tgc.load(path)
        assert isinstance(prog, Program), weightless
        for b in (2, 1):
            x = RNG.standard_normal((b, 8, 3)).astype(np.float32)
            for sym in (False, True):
                got = prog.run(device="CPU", x=x, z=z, symbolic=sym)
                np.testing.assert_array_equal(got["y"], x.reshape(b, -1))
                np.testing.assert_array_equal(got["y2"], want2)


@pytest.mark.parametrize("dt,val", [(np.float32, np.nan), (np.float32, -np.inf), (np.float16, np.inf),
                                    (np.float64, np.nan)])
def test_constant_of_shape_nan_and_inf_in_the_dims(tmp_path, dt, val):
    """ConstantOfShape(Shape(x)) of nan or +-inf: `full((batch, seq), nan, ...)` in the .tg (`(0.0 / 0.0)` was a
    tensor, which `full` refuses); plain and symbolic runs give numpy's full."""
    nodes = [h.make_node("Shape", ["x"], ["s"]),
             h.make_node("ConstantOfShape", ["s"], ["y"], value=nh.from_array(np.array([val], dt)))]
    path = _save(tmp_path, "cnan", nodes, [_vi("x", ["batch", "seq"])],
                 [_vi("y", 2, h.np_dtype_to_tensor_dtype(np.dtype(dt)))])
    prog = tgc.load(path)
    assert isinstance(prog, Program)
    for b, n in ((2, 3), (1, 5)):
        for sym in (False, True):
            got = prog.run(device="CPU", x=np.zeros((b, n), np.float32), symbolic=sym)["y"]
            assert got.dtype == dt
            np.testing.assert_array_equal(got, np.full((b, n), val, dt))


def test_a_long_chain_of_reshapes_by_shape_stays_symbolic(tmp_path):
    """Six layers of view(b, s, -1, 2) by Shape -> Gather -> Concat, then TopK's k = Shape[1] // 2: each pinned
    shape types the next layer's Shape, one round each; the rounds go on until nothing new is pinned (four
    rounds stopped at the fifth layer: per size). One Program, equal to numpy, plain and symbolic."""
    i64 = np.int64
    nodes, cur = [], "x"
    for i in range(6):
        nodes += [h.make_node("Shape", [cur], [f"s{i}"]), _c(f"i{i}", np.array([0, 1], i64)),
                  h.make_node("Gather", [f"s{i}", f"i{i}"], [f"g{i}"]), _c(f"m{i}", np.array([-1, 2], i64)),
                  h.make_node("Concat", [f"g{i}", f"m{i}"], [f"shp{i}"], axis=0),
                  h.make_node("Reshape", [cur, f"shp{i}"], [f"r{i}"]), h.make_node("Relu", [f"r{i}"], [f"a{i}"])]
        cur = f"a{i}"
    nodes += [h.make_node("Shape", [cur], ["sl"]), _c("il", np.array([1], i64)),
              h.make_node("Gather", ["sl", "il"], ["k"]), _c("two", np.array([2], i64)),
              h.make_node("Div", ["k", "two"], ["k2"]),
              h.make_node("TopK", [cur, "k2"], ["y", "yi"], axis=1)]
    path = _save(tmp_path, "chain", nodes, [_vi("x", ["batch", "seq", 4, 2])], [_vi("y", 4)])
    prog = tgc.load(path)
    assert isinstance(prog, Program)
    for b, n in ((2, 4), (1, 5)):
        x = RNG.standard_normal((b, n, 4, 2)).astype(np.float32)
        want = -np.sort(-np.maximum(x, 0), axis=1, kind="stable")[:, :n // 2]
        for sym in (False, True):
            np.testing.assert_array_equal(prog.run(device="CPU", x=x, symbolic=sym)["y"], want)


def test_pytorch_expand_with_constant_of_shape_ones(tmp_path):
    """PyTorch's expand(b, -1, s): size = Concat(b, [-1], s); ones = ConstantOfShape(Shape(size), 1);
    Where(Equal(size, ones * -1), ones, size) -> Expand. The ones are values (a small int list), so the shape is
    [batch, 1, seq] and the model one symbolic Program (it went per size), equal to numpy's broadcast."""
    i64 = np.int64
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i0", np.array([0], i64)), _c("i1", np.array([1], i64)),
             h.make_node("Gather", ["s", "i0"], ["b"]), h.make_node("Gather", ["s", "i1"], ["n"]),
             _c("m1", np.array([-1], i64)), h.make_node("Concat", ["b", "m1", "n"], ["size"], axis=0),
             h.make_node("Shape", ["size"], ["ss"]),
             h.make_node("ConstantOfShape", ["ss"], ["ones"], value=nh.from_array(np.array([1], i64))),
             _c("neg", np.array(-1, i64)), h.make_node("Mul", ["ones", "neg"], ["negones"]),
             h.make_node("Equal", ["size", "negones"], ["eq"]), h.make_node("Where", ["eq", "ones", "size"], ["size2"]),
             h.make_node("Expand", ["m", "size2"], ["y"])]
    path = _save(tmp_path, "texp", nodes, [_vi("x", ["batch", "seq"]), _vi("m", [1, 3, 1])], [_vi("y", 3)])
    prog = tgc.load(path)
    assert isinstance(prog, Program)
    m = RNG.standard_normal((1, 3, 1)).astype(np.float32)
    for b, n in ((2, 4), (1, 1)):
        for sym in (False, True):
            got = prog.run(device="CPU", x=np.zeros((b, n), np.float32), m=m, symbolic=sym)["y"]
            np.testing.assert_array_equal(got, np.broadcast_to(m, (b, 3, n)))


def test_package_a_per_size_model_at_the_sizes_given(tmp_path):
    """`tgc compile --package` of a per-size model with every dim given (-D) translates it at those sizes and
    packages it (a note says so); the package runs at those sizes, equal to numpy; with a dim missing, the
    refusal says how (exit 2)."""
    (path, make, ref), = [m for m in _per_size_models(tmp_path) if m[0].endswith("slice.onnx")]
    pkg = str(tmp_path / "s.tgpkg")
    r = invoke("compile", path, "-D", "batch=2", "-D", "seq=5", "--package", pkg)
    assert r.exit_code == 0, r.output
    assert "packaged at batch=2, seq=5" in r.output
    x = make(2, 5)["x"]
    np.save(tmp_path / "x.npy", x)
    r = invoke("run", pkg, "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"))
    assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], x[:, :4])
    assert_clean(invoke("compile", path, "-D", "batch=2", "--package", str(tmp_path / "t.tgpkg")), 2,
                 "--package is not available", "with every dim given")


def test_range_of_a_fixed_count_from_a_size(tmp_path):
    """Range(seq, seq + 5): its count is 5 at every size and its start is seq: `arange(5) + seq`, one symbolic
    Program (it went per size), equal to numpy."""
    i64 = np.int64
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i1", np.array(1, i64)), h.make_node("Gather", ["s", "i1"], ["n"]),
             _c("five", np.array(5, i64)), h.make_node("Add", ["n", "five"], ["n5"]), _c("one", np.array(1, i64)),
             h.make_node("Range", ["n", "n5", "one"], ["r"]), _c("v", np.arange(5, dtype=i64) * 10),
             h.make_node("Add", ["r", "v"], ["y"])]
    path = _save(tmp_path, "rfix", nodes, [_vi("x", ["batch", "seq"])], [_vi("y", 1, TP.INT64)])
    prog = tgc.load(path)
    assert isinstance(prog, Program)
    for n in (3, 7):
        for sym in (False, True):
            got = prog.run(device="CPU", x=np.zeros((2, n), np.float32), symbolic=sym)["y"]
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, np.arange(n, n + 5) + np.arange(5) * 10)
