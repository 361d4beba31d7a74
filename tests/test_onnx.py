"""The ONNX front end: models made with onnx.helper, loaded by `tgc.load`, run on real devices and compared with
numpy (or onnxruntime where installed); `tgc import`/`inspect`/`run` on the command line; bad models give one
clear error with exit 2."""

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

RNG = np.random.default_rng(0)


def _save(tmp_path, nodes, inputs, outputs, inits=(), opset=13, name="m.onnx"):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    path = tmp_path / name
    onnx.save(m, str(path))
    return str(path)


def _vi(name, shape, t=TP.FLOAT):
    return h.make_tensor_value_info(name, t, shape if shape is not None else ["unknown"])


@pytest.fixture
def convnet(tmp_path):
    """conv (pads) -> relu -> maxpool -> flatten -> gemm -> softmax, with names that are not identifiers."""
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    fc = RNG.standard_normal((5, 64)).astype(np.float32)
    b = RNG.standard_normal(5).astype(np.float32)
    nodes = [h.make_node("Conv", ["input.1", "conv/W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             h.make_node("Relu", ["c"], ["r"]),
             h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Flatten", ["p"], ["f"]),
             h.make_node("Gemm", ["f", "fc", "b"], ["g"], transB=1),
             h.make_node("Softmax", ["g"], ["out/prob"], axis=1)]
    path = _save(tmp_path, nodes, [_vi("input.1", [2, 3, 8, 8])], [_vi("out/prob", [2, 5])],
                 [nh.from_array(w, "conv/W"), nh.from_array(fc, "fc"), nh.from_array(b, "b")])
    return path, (w, fc, b)


def _reference(x, w, fc, b):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    c = np.zeros((x.shape[0], 4, 8, 8))
    for i in range(3):
        for j in range(3):
            c += np.einsum("nchw,oc->nohw", xp[:, :, i:i + 8, j:j + 8], w[:, :, i, j])
    r = np.maximum(c, 0)
    p = r.reshape(x.shape[0], 4, 4, 2, 4, 2).max(axis=(3, 5)).reshape(x.shape[0], 64)
    g = p @ fc.T + b
    e = np.exp(g - g.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_load_runs_with_onnx_names_and_weights_bound(convnet):
    path, (w, fc, b) = convnet
    prog = tgc.load(path)
    assert [d.name for d in prog.inputs] == ["input.1"]  # weights are not inputs the caller passes
    assert prog.output_names == ["out/prob"]
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    out = prog.run(device="CPU", inputs={"input.1": x})
    np.testing.assert_allclose(out["out/prob"], _reference(x, w, fc, b), rtol=1e-4, atol=1e-6)
    assert "W" not in prog.source.split("return")[0].split("\n")[3]  # the input line declares only the input


def test_import_round_trip_cli(convnet, tmp_path):
    path, (w, fc, b) = convnet
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = invoke("import", path, "-o", str(tmp_path / "model.tg"))
    assert r.exit_code == 0, r.output
    text = (tmp_path / "model.tg").read_text()
    assert "conv2d(" in text and "softmax(" in text and "# onnx-name: input_1 = input.1" in text
    r1 = invoke("run", path, "-i", f"input.1={tmp_path / 'x.npy'}", "-o", str(tmp_path / "a.npz"))
    assert r1.exit_code == 0, r1.output
    r2 = invoke("run", str(tmp_path / "model.tg"), "--inputs", str(tmp_path / "model.npz"), "-i",
                f"input_1={tmp_path / 'x.npy'}", "-o", str(tmp_path / "b.npz"))
    assert r2.exit_code == 0, r2.output
    a, b2 = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    np.testing.assert_array_equal(a["out/prob"], b2["out_prob"])
    np.testing.assert_allclose(a["out/prob"], _reference(x, w, fc, b), rtol=1e-4, atol=1e-6)


def test_inspect_lists_ops_and_missing(tmp_path):
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Multinomial", ["r"], ["y"]),
             h.make_node("Unique", ["r"], ["u"])]
    path = _save(tmp_path, nodes, [_vi("x", ["batch", 4])], [_vi("y", None), _vi("u", None)])
    r = invoke("inspect", path)
    assert r.exit_code == 0, r.output
    assert "opset 13" in r.output and "x                f32[batch, 4]" in r.output
    assert "Relu x1" in r.output and "not supported by tgc (1): Multinomial" in r.output
    assert "data-dependent output shapes (1): Unique" in r.output


def test_symbolic_dim_param(tmp_path):
    nodes = [h.make_node("Mul", ["x", "x"], ["s"]), h.make_node("ReduceSum", ["s", "axes"], ["y"], keepdims=0)]
    path = _save(tmp_path, nodes, [_vi("x", ["batch", 3])], [_vi("y", ["batch"])],
                 [nh.from_array(np.array([1], np.int64), "axes")])
    prog = tgc.load(path)
    assert prog.dim_names == ["batch"]
    for n in (2, 5):
        x = RNG.standard_normal((n, 3)).astype(np.float32)
        np.testing.assert_allclose(prog.run(device="CPU", x=x)["y"], (x * x).sum(1), rtol=1e-5)


def test_cli_shard_takes_onnx_input_names(tmp_path):
    """--shard takes an input by its ONNX name, as -i does (`input.1=0` was refused as not NAME=AXIS)."""
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    path = _save(tmp_path, [h.make_node("MatMul", ["input.1", "w"], ["m"]), h.make_node("Relu", ["m"], ["out"])],
                 [_vi("input.1", [5, 3])], [_vi("out", [5, 4])], [nh.from_array(w, "w")])
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = invoke("run", path, "-d", "CPU:0,CPU:1", "--shard", "input.1=0", "-i", f"input.1={tmp_path / 'x.npy'}",
               "-o", str(tmp_path / "o.npz"))
    assert r.exit_code == 0, r.output
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["out"], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)
    assert_clean(invoke("run", path, "-d", "CPU:0,CPU:1", "--shard", "input.2=0", "--random"), 2, "input.2",
                 "did you mean 'input.1'")


@pytest.mark.parametrize("op,a,b,want", [
    ("Div", [7, -7, 7, -7], [2, 2, -2, -2], [3, -3, -3, 3]),  # C division: truncates
    ("Mod", [7, -7, 7, -7], [3, 3, -3, -3], [1, 2, -2, -1]),  # fmod=0: the divisor's sign
])
def test_integer_division_semantics(tmp_path, op, a, b, want):
    path = _save(tmp_path, [h.make_node(op, ["a", "b"], ["y"])], [_vi("a", [4], TP.INT32), _vi("b", [4], TP.INT32)],
                 [_vi("y", [4], TP.INT32)])
    out = tgc.load(path).run(device="CPU", a=np.array(a, np.int32), b=np.array(b, np.int32))["y"]
    np.testing.assert_array_equal(out, want)


def test_pool_ceil_mode_and_count_include_pad(tmp_path):
    x = RNG.standard_normal((1, 1, 5, 5)).astype(np.float32)
    nodes = [h.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 0, 0],
                         ceil_mode=1, count_include_pad=0)]
    path = _save(tmp_path, nodes, [_vi("x", [1, 1, 5, 5])], [_vi("y", None)], opset=19)
    got = tgc.load(path).run(device="CPU", x=x)["y"]
    # windows over the padded (top/left by 1) input, the last ones cut at the edge: mean of the real cells
    xp = np.full((7, 7), np.nan)
    xp[1:6, 1:6] = x[0, 0]
    want = np.array([[np.nanmean(xp[i * 2:i * 2 + 2, j * 2:j * 2 + 2]) for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(got[0, 0], want, rtol=1e-5)


@pytest.mark.parametrize("op, attrs", [
    ("AveragePool", dict(kernel_shape=[7, 7])),  # the whole image (ResNet's last pool): a mean over the window
    ("AveragePool", dict(kernel_shape=[5, 5], strides=[2, 2], pads=[2, 1, 2, 2], count_include_pad=0)),
    ("AveragePool", dict(kernel_shape=[5, 5], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[4, 5], strides=[3, 3], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[5, 5], strides=[2, 2], pads=[2, 2, 1, 1])),
    ("MaxPool", dict(kernel_shape=[5, 5], strides=[3, 3], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2])),  # 9 taps: still slices
])
def test_large_pool_windows_are_reductions(tmp_path, op, attrs):
    """Windows of more than WINDOW_SLICES_MAX taps are one reduction over the window (not a slice per tap), with
    ONNX's padding, ceil_mode and count_include_pad; checked against ONNX's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    from tgc.onnx.ops import WINDOW_SLICES_MAX

    x = RNG.standard_normal((1, 3, 7, 8 if attrs["kernel_shape"] != [7, 7] else 7)).astype(np.float32)
    path = _save(tmp_path, [h.make_node(op, ["x"], ["y"], **attrs)], [_vi("x", list(x.shape))], [_vi("y", None)],
                 opset=19)
    prog = tgc.load(path)
    window = "max_pool2d(" if op == "MaxPool" else "avg_pool2d("
    assert (window in prog.source) == (np.prod(attrs["kernel_shape"]) > WINDOW_SLICES_MAX)
    want = ReferenceEvaluator(onnx.load(path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(prog.run(device="CPU", x=x)["y"], want, rtol=1e-5, atol=1e-6)


def _assert_load_error(path, *words):
    with pytest.raises(TgcError) as e:
        tgc.load(path)
    for w in words:
        assert w in e.value.msg, e.value.msg
    r = invoke("run", path, "--random")
    assert_clean(r, 2, *words)


def test_not_onnx(tmp_path):
    p = tmp_path / "junk.onnx"
    p.write_bytes(b"\xff\xfe this is not a protobuf \x00\x01")
    _assert_load_error(str(p), "not an ONNX model")


def test_checker_failure(tmp_path):
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [_vi("x", [2])], [_vi("y", [2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.graph.node[0].input[0] = "nowhere"  # an input nothing produces
    p = tmp_path / "bad.onnx"
    p.write_bytes(m.SerializeToString())
    _assert_load_error(str(p), "ONNX checker rejects the model")


def test_unsupported_op_names_op_node_opset(tmp_path):
    path = _save(tmp_path, [h.make_node("Multinomial", ["x"], ["y"], name="draw")], [_vi("x", [1, 4])],
                 [_vi("y", None)])
    _assert_load_error(path, "unsupported op 'Multinomial'", "node 'draw'", "opset 13")


def test_unsupported_attribute(tmp_path):
    nodes = [h.make_node("Dropout", ["x", "ratio", "train"], ["y"], name="dp")]
    inits = [nh.from_array(np.array(0.5, np.float32), "ratio"), nh.from_array(np.array(True), "train")]
    path = _save(tmp_path, nodes, [_vi("x", [1, 4])], [_vi("y", None)], inits)
    _assert_load_error(path, "unsupported", "training mode", "node 'dp'", "Dropout, opset 13")


def test_missing_input_and_wrong_shape_and_dtype(convnet, tmp_path):
    path, _ = convnet
    prog = tgc.load(path)
    with pytest.raises(TgcError, match="missing input 'input.1'"):
        prog.run(device="CPU")
    with pytest.raises(TgcError, match="input 'input.1' axis 2 has size 7"):
        prog.run(device="CPU", inputs={"input.1": np.zeros((2, 3, 7, 8), np.float32)})
    with pytest.raises(TgcError, match="input .input.1. is i32, but the program declares it f32"):
        prog.run(device="CPU", inputs={"input.1": np.zeros((2, 3, 8, 8), np.int32)})
    np.save(tmp_path / "bad.npy", np.zeros((2, 3, 8, 8), np.float64))
    assert_clean(invoke("run", path), 2, "input.1")
    assert_clean(invoke("run", path, "-i", f"input.1={tmp_path / 'bad.npy'}"), 2, "input.1")


def test_reshape_shape_from_graph_input_is_a_clear_error(tmp_path):
    nodes = [h.make_node("Reshape", ["x", "shape"], ["y"], name="rs")]
    path = _save(tmp_path, nodes, [_vi("x", [2, 3]), _vi("shape", [2], TP.INT64)], [_vi("y", None)])
    _assert_load_error(path, "must be a constant", "node 'rs'")


def test_cli_compile_and_package_with_weights(convnet, tmp_path):
    """A package of a model holds its weights: `tgc run out.tgpkg` equals `tgc run model.onnx` (and the model's
    reference), its callers pass only the model's inputs. (`tgc bench`/`beam` of a model take the same path
    through `tgc.load`; they are slow for a unit test.)"""
    path, (w, fc, b) = convnet
    r = invoke("compile", path, "-d", "CPU", "--emit", "src")
    assert r.exit_code == 0, r.output
    assert "define void" in r.output  # LLVM IR of the model's kernels
    pkg = tmp_path / "m.tgpkg"
    r = invoke("compile", path, "-d", "CPU", "--package", str(pkg))
    assert r.exit_code == 0, r.output
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r1 = invoke("run", path, "-i", f"input.1={tmp_path / 'x.npy'}", "-o", str(tmp_path / "a.npz"))
    r2 = invoke("run", str(pkg), "-i", f"input.1={tmp_path / 'x.npy'}", "-o", str(tmp_path / "b.npz"))
    assert r1.exit_code == 0 and r2.exit_code == 0, r1.output + r2.output
    a, b2 = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    np.testing.assert_array_equal(a["out/prob"], b2["out/prob"])
    np.testing.assert_allclose(b2["out/prob"], _reference(x, w, fc, b), rtol=1e-4, atol=1e-6)
    loaded = tgc.load_package(str(pkg))
    assert [d.name for d in loaded.inputs] == ["input.1"] and len(loaded.weights) == 3
    r = invoke("run", str(pkg), "-i", f"input.1={tmp_path / 'x.npy'}", "-i", f"fc={tmp_path / 'x.npy'}")
    assert_clean(r, 2, "fc")  # a weight is not an input a caller passes


def test_package_weights_are_checked(convnet, tmp_path):
    """A package whose weight member does not match its manifest (or is not an array) is refused, exit 2."""
    import zipfile

    from tgc import package

    path, _ = convnet
    data = package.build(tgc.load(path), "PYTHON", {})
    manifest, members = package.read_members(data, "m")
    assert sorted(m for m in members if m.startswith("weights/")) == ["weights/0.npy", "weights/1.npy",
                                                                       "weights/2.npy"]
    assert all(members[m][:6] == b"\x93NUMPY" for m in members if m.startswith("weights/"))  # .npy, no pickle
    # rebuild the archive with one weight replaced by an array of another shape (hashes made to match)
    import hashlib
    import io
    import json

    f = io.BytesIO()
    np.save(f, np.zeros(3, np.float32), allow_pickle=False)
    members["weights/0.npy"] = f.getvalue()
    manifest["files"]["weights/0.npy"] = {"size": len(f.getvalue()),
                                          "sha256": hashlib.sha256(f.getvalue()).hexdigest()}
    manifest.pop("content_hash")
    manifest["content_hash"] = package.content_hash(manifest)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr(package.MANIFEST, json.dumps(manifest))
        for k, v in members.items():
            z.writestr(k, v)
        z.comment = b"0" * package.CHECKSUM_LEN
    raw = out.getvalue()
    raw = raw[:-package.CHECKSUM_LEN] + package.file_checksum(raw)
    with pytest.raises(package.PackageError, match="weight .* buffer"):
        package.loads_package(raw)


def test_program_cache_keys_a_model_by_its_weights(tmp_path, monkeypatch):
    """The program cache serves a model (its entry holds no weights); two models that differ only in their
    weights have two keys, so neither runs with the other's weights."""
    from tgc import cache

    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("TGC_VERIFY_BOUNDS", "DISABLE_COMPILER_CACHE", "BEAM", "NOOPT", "DEBUG"):
        monkeypatch.delenv(name, raising=False)
    cache._reset_for_tests()
    x = np.array([[1.0, 2.0]], np.float32)
    outs = []
    for i, scale in enumerate((2.0, 3.0)):  # the same graph, the same file name (the same .tg source)
        wt = nh.from_array(np.array([[scale, 0.0], [0.0, scale]], np.float32), "w")
        (tmp_path / f"d{i}").mkdir()
        path = _save(tmp_path / f"d{i}", [h.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [1, 2])],
                     [_vi("y", [1, 2])], [wt])
        first = tgc.load(path)
        assert not first.cached("CPU")
        outs.append(first.run(device="CPU", inputs={"x": x})["y"])
        again = tgc.load(path)  # a fresh Program: the cache's entry, not the Program's own kernels
        assert again.cached("CPU")
        np.testing.assert_array_equal(again.run(device="CPU", inputs={"x": x})["y"], outs[-1])
    np.testing.assert_array_equal(outs[0], x * 2.0)
    np.testing.assert_array_equal(outs[1], x * 3.0)
    assert len(cache.entries("program")) == 2
    cache._reset_for_tests()


def test_opset_too_old_and_foreign_domain(tmp_path):
    # Add changed at opset 7 (numpy broadcasting): refused; Relu is the same at opset 6 as at 7: runs
    path = _save(tmp_path, [h.make_node("Add", ["x", "x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])], opset=6)
    _assert_load_error(path, "opset 6 is older than tgc supports", "'Add'")
    path = _save(tmp_path, [h.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])], opset=6)
    x = np.array([-1.0, 2.0], np.float32)
    assert np.array_equal(tgc.load(path).run(device="PYTHON", inputs={"x": x})["y"], np.maximum(x, 0))
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [_vi("x", [2])], [_vi("y", [2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("com.example", 1)])
    p = tmp_path / "ml.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(TgcError):
        tgc.load(str(p))


def test_package_of_a_model_with_symbolic_dims(tmp_path):
    """Without its dims a model's package would be symbolic, which has no place for weights: refused, exit 2;
    with them it holds the weights and runs."""
    wt = np.array([1.0, 2.0, 3.0], np.float32)
    path = _save(tmp_path, [h.make_node("Mul", ["x", "w"], ["y"])], [_vi("x", ["batch", 3])], [_vi("y", ["batch", 3])],
                 [nh.from_array(wt, "w")])
    assert_clean(invoke("compile", path, "-d", "CPU", "--package", str(tmp_path / "s.tgpkg")), 2,
                 "symbolic package of an ONNX model")
    r = invoke("compile", path, "-d", "CPU", "-D", "batch=2", "--package", str(tmp_path / "f.tgpkg"))
    assert r.exit_code == 0, r.output
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(tgc.load_package(str(tmp_path / "f.tgpkg")).run(x=x)["y"], x * wt)
