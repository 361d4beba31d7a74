"""The neural-network operators with ONNX's semantics (tgc/dsl/nnlib.py) against references computed here:
onnx.reference.ReferenceEvaluator where the `onnx` package is installed (those tests skip without it), and
direct numpy implementations written here for the others. Several operators share one `.tg` program, so a
test compiles once per device."""

from __future__ import annotations

import numpy as np
import pytest
from langkit import assert_close, assert_exact, run, source_error

NP_NAME = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64", np.dtype(np.int64): "i64",
           np.dtype(np.int32): "i32", np.dtype(np.float16): "f16", np.dtype(np.bool_): "bool"}


def program(inputs: dict[str, np.ndarray], exprs: list[str]) -> str:
    lines = [f"{n}: {NP_NAME[v.dtype]}[{', '.join(map(str, v.shape))}]" for n, v in inputs.items()]
    names = []
    for i, e in enumerate(exprs):  # an expression returning (values, indices) gives two outputs
        outs = [f"out{i}", f"out{i}b"] if "return_indices=True" in e else \
            [f"out{i}", f"out{i}b", f"out{i}c"] if "return_stats=True" in e or "training_mode=1" in e else \
            [f"out{i}"]
        lines.append(f"{', '.join(outs)} = {e}")
        names += outs
    return "\n".join(lines) + "\nreturn " + ", ".join(names) + "\n"


def run_all(device: str, inputs: dict[str, np.ndarray], exprs: list[str]) -> list[np.ndarray]:
    out = run(program(inputs, exprs), device, **inputs)
    return list(out.values())


def onnx_ref(op: str, inputs: list, attrs: dict | None = None, nout: int = 1, opset: int = 21) -> list[np.ndarray]:
    """One ONNX node run by onnx's own reference evaluator (an empty name: an omitted optional input)."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    names = ["" if v is None else f"in{i}" for i, v in enumerate(inputs)]
    given = [(n, v) for n, v in zip(names, inputs) if v is not None]
    node = helper.make_node(op, names, [f"out{i}" for i in range(nout)], **(attrs or {}))
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                      for n, v in given],
        [helper.make_tensor_value_info(f"out{i}", onnx.TensorProto.UNDEFINED, None) for i in range(nout)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, dict(given))


def _have_onnx() -> bool:
    try:
        import onnx  # noqa: F401
    except ImportError:
        return False
    return True


def close(got: np.ndarray, want: np.ndarray, scale: float = 1.0) -> None:
    assert_close(got, want, NP_NAME[got.dtype], scale=scale)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(23)


def f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1, 1, shape).astype(np.float32)


# ------------------------------------------------------------------------------------------------ conv


def test_conv_and_conv_transpose(device, rng):
    x2, w2, b6 = f32(rng, 2, 4, 7, 6), f32(rng, 6, 2, 3, 2), f32(rng, 6)
    x1, w1 = f32(rng, 1, 3, 9), f32(rng, 2, 3, 4)
    x3, w3 = f32(rng, 1, 2, 4, 5, 4), f32(rng, 3, 2, 2, 3, 2)
    xt, wt, bt = f32(rng, 1, 4, 3, 4), f32(rng, 4, 3, 3, 2), f32(rng, 6)
    inputs = dict(x2=x2, w2=w2, b6=b6, x1=x1, w1=w1, x3=x3, w3=w3, xt=xt, wt=wt, bt=bt)
    cases = [
        ("conv(x2, w2, b6, strides=(2, 1), pads=(1, 0, 2, 1), dilations=(1, 2), group=2)",
         "Conv", [x2, w2, b6], dict(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2], group=2)),
        ('conv(x1, w1, auto_pad="SAME_LOWER", strides=2)', "Conv", [x1, w1], dict(auto_pad="SAME_LOWER",
                                                                                  strides=[2])),
        ('conv(x1, w1, auto_pad="VALID", dilations=2)', "Conv", [x1, w1], dict(auto_pad="VALID", dilations=[2])),
        ("conv(x3, w3, pads=(1, 0, 1, 0, 1, 1), strides=(1, 2, 1))", "Conv", [x3, w3],
         dict(pads=[1, 0, 1, 0, 1, 1], strides=[1, 2, 1])),
        ("conv_transpose(xt, wt, bt, strides=(2, 3), pads=(1, 0, 0, 1), output_padding=(1, 2), group=2)",
         "ConvTranspose", [xt, wt, bt], dict(strides=[2, 3], pads=[1, 0, 0, 1], output_padding=[1, 2], group=2)),
        ("conv_transpose(xt, wt, strides=(2, 2), dilations=(2, 1), output_shape=(8, 8), group=2)",
         # the spec's rule for output_shape: total pads (9, 8) - (8, 8) = (1, 0), the odd one before
         "ConvTranspose", [xt, wt], dict(strides=[2, 2], dilations=[2, 1], pads=[1, 0, 0, 0], group=2)),
        ('conv_transpose(xt, wt, strides=(2, 1), auto_pad="SAME_UPPER", group=2)', "ConvTranspose", [xt, wt],
         dict(strides=[2, 1], auto_pad="SAME_UPPER", group=2)),
    ]
    wants = [_grouped_ref(op, ins, attrs) for _, op, ins, attrs in cases]
    # output_shape one past the full output (7, 8): the spec's pads (0 before, -1 after) add a zero row/column
    cases.append(("conv_transpose(xt, wt, strides=2, output_shape=(8, 9), group=2)", "", [], {}))
    wants.append(np.pad(_grouped_ref("ConvTranspose", [xt, wt], dict(strides=[2, 2], group=2)),
                        ((0, 0), (0, 0), (0, 1), (0, 1))))
    got = run_all(device, inputs, [c[0] for c in cases])
    for g, w, c in zip(got, wants, cases):
        assert g.shape == w.shape, c[0]
        close(g, w, scale=10.0)


def _grouped_ref(op: str, ins: list, attrs: dict) -> np.ndarray:
    """onnx.reference, one group at a time for ConvTranspose (its own grouped path slices the weight wrongly)."""
    group = attrs.get("group", 1)
    if op != "ConvTranspose" or group == 1:
        return onnx_ref(op, ins, attrs)[0]
    x, w, *b = ins
    cg, mg = x.shape[1] // group, w.shape[1]
    one = {k: v for k, v in attrs.items() if k != "group"}
    parts = [onnx_ref(op, [x[:, g * cg:(g + 1) * cg], w[g * cg:(g + 1) * cg]] +
                      [bb[g * mg:(g + 1) * mg] for bb in b], one)[0] for g in range(group)]
    return np.concatenate(parts, axis=1)


def _conv_numpy(x, w, strides, pads, dilations, group):
    """A direct N-d convolution: explicit loops over the output positions (independent of tgc)."""
    n = x.ndim - 2
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(pads[i], pads[n + i]) for i in range(n)])
    ks = w.shape[2:]
    outs = [(xp.shape[2 + i] - (ks[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(n)]
    m, cg = w.shape[:2]
    mg = m // group
    y = np.zeros((x.shape[0], m, *outs))
    for o in np.ndindex(*outs):
        sl = tuple(slice(o[i] * strides[i], o[i] * strides[i] + (ks[i] - 1) * dilations[i] + 1, dilations[i])
                   for i in range(n))
        for oc in range(m):
            g = oc // mg
            patch = xp[(slice(None), slice(g * cg, (g + 1) * cg)) + sl]
            y[(slice(None), oc) + o] = (patch * w[oc]).reshape(x.shape[0], -1).sum(axis=1)
    return y


def test_conv_against_numpy_loops(device, rng):
    """Without onnx: conv 1-d/3-d with asymmetric pads, dilation and groups against explicit loops."""
    x1, w1 = f32(rng, 2, 4, 10), f32(rng, 4, 2, 3)
    x3, w3 = f32(rng, 1, 2, 4, 4, 5), f32(rng, 2, 1, 2, 2, 3)
    got = run_all(device, dict(x1=x1, w1=w1, x3=x3, w3=w3), [
        "conv(x1, w1, pads=(2, 0), strides=3, dilations=2, group=2)",
        "conv(x3, w3, pads=(0, 1, 2, 1, 0, 0), dilations=(1, 2, 1), group=2)"])
    close(got[0], _conv_numpy(x1, w1, [3], [2, 0], [2], 2), scale=4.0)
    close(got[1], _conv_numpy(x3, w3, [1, 1, 1], [0, 1, 2, 1, 0, 0], [1, 2, 1], 2), scale=4.0)


# ------------------------------------------------------------------------------------------------ pooling


def test_pools(device, rng):
    x = f32(rng, 2, 3, 7, 8)
    x1 = f32(rng, 1, 2, 9)
    x3 = f32(rng, 1, 2, 4, 5, 3)
    inputs = dict(x=x, x1=x1, x3=x3)
    cases = [
        ("max_pool(x, kernel_shape=(3, 2), strides=(2, 2), pads=(1, 0, 0, 1), dilations=(1, 2), ceil_mode=1)",
         "MaxPool", [x], dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 0, 1], dilations=[1, 2],
                              ceil_mode=1)),
        ("avg_pool(x, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), count_include_pad=1)",
         "AveragePool", [x], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
        ("avg_pool(x, kernel_shape=(3, 2), strides=(2, 2), pads=(1, 0, 1, 1), ceil_mode=1)",
         "AveragePool", [x], dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1)),
        ('avg_pool(x1, kernel_shape=4, strides=2, auto_pad="SAME_UPPER")',
         "AveragePool", [x1], dict(kernel_shape=[4], strides=[2], auto_pad="SAME_UPPER")),
        ("lp_pool(x, kernel_shape=(2, 3), strides=(1, 2), pads=(0, 1, 1, 0), p=3)",
         "LpPool", [x], dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 0], p=3)),
        ("max_pool(x3, kernel_shape=(2, 2, 2), strides=(2, 1, 2), pads=(1, 1, 0, 0, 0, 1))",
         "MaxPool", [x3], dict(kernel_shape=[2, 2, 2], strides=[2, 1, 2], pads=[1, 1, 0, 0, 0, 1])),
        ('avg_pool(x, kernel_shape=(2, 3), auto_pad="SAME_LOWER")',
         "AveragePool", [x], dict(kernel_shape=[2, 3], auto_pad="SAME_LOWER")),
        ("global_avg_pool(x3)", "GlobalAveragePool", [x3], {}),
        ("global_max_pool(x)", "GlobalMaxPool", [x], {}),
    ]
    wants = [onnx_ref(op, ins, attrs)[0] for _, op, ins, attrs in cases]
    cases.append(("global_lp_pool(x1, p=3)", "", [], {}))
    wants.append((np.abs(x1.astype(np.float64)) ** 3).sum(axis=2, keepdims=True) ** (1 / 3))
    got = run_all(device, inputs, [c[0] for c in cases])
    for g, w, c in zip(got, wants, cases):
        assert g.shape == w.shape, c[0]
        close(g, w, scale=2.0)


def test_max_pool_indices(device, rng):
    x = f32(rng, 2, 2, 5, 6)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = 5.0  # a tie: the first in window order wins
    got = run_all(device, dict(x=x), [
        "max_pool(x, kernel_shape=(2, 3), strides=(2, 2), pads=(1, 1, 0, 0), return_indices=True)",
        "max_pool(x, kernel_shape=(3, 3), strides=(2, 2), storage_order=1, ceil_mode=1, return_indices=True)"])
    for (v, i), attrs in zip((got[:2], got[2:]), (
            dict(kernel_shape=[2, 3], strides=[2, 2], pads=[1, 1, 0, 0]),
            dict(kernel_shape=[3, 3], strides=[2, 2], storage_order=1, ceil_mode=1))):
        want_v, want_i = onnx_ref("MaxPool", [x], attrs, nout=2)
        close(v, want_v)
        assert_exact(i, want_i, "i64")


def test_max_pool_against_numpy_with_ceil_and_dilation(device, rng):
    """Without onnx: windows start at -pad and step by the stride; ceil_mode keeps a last partial window."""
    x = f32(rng, 1, 2, 8, 7)
    (got,) = run_all(device, dict(x=x), [
        "max_pool(x, kernel_shape=(2, 3), strides=(3, 2), pads=(1, 0, 0, 1), dilations=(2, 1), ceil_mode=1)"])
    xp = np.pad(x, ((0, 0), (0, 0), (1, 10), (0, 10)), constant_values=-np.inf)
    want = np.zeros((1, 2, 3, 4), np.float32)  # h: ceil((8 + 1 - 3) / 3) + 1 = 3; w: ceil((7 + 1 - 3) / 2) + 1 = 4
    for i in range(3):
        for j in range(4):
            want[:, :, i, j] = xp[:, :, i * 3:i * 3 + 3:2, j * 2:j * 2 + 3].max(axis=(2, 3))
    assert got.shape == want.shape
    close(got, want)


# ------------------------------------------------------------------------------------------------ normalization


def test_normalizations(device, rng):
    x = f32(rng, 2, 6, 3, 4)
    s6, b6, m6, v6 = f32(rng, 6), f32(rng, 6), f32(rng, 6), rng.uniform(0.5, 2, 6).astype(np.float32)
    s34, b34 = f32(rng, 3, 4), f32(rng, 3, 4)
    got = run_all(device, dict(x=x, s6=s6, b6=b6, m6=m6, v6=v6, s34=s34, b34=b34), [
        "batch_norm(x, s6, b6, m6, v6, epsilon=1e-3)",
        "instance_norm(x, s6, b6)",
        "group_norm(x, s6, b6, num_groups=3, epsilon=1e-4)",
        "layer_norm(x, s34, b34, axis=2)",
        "layer_norm(x, s34, axis=-2)",
        "x.lrn(size=3, alpha=0.01, beta=0.6, bias=2.0)",
        "mean_variance_normalization(x)",
        "mean_variance_normalization(x, axes=(1, 3))",
        "layer_norm(x, s34, b34, axis=-2, return_stats=True)",
        "batch_norm(x, s6, b6, m6, v6, training_mode=1, momentum=0.8)"])
    xd = x.astype(np.float64)
    r = (1, 6, 1, 1)
    close(got[0], (xd - m6.reshape(r)) / np.sqrt(v6.reshape(r) + 1e-3) * s6.reshape(r) + b6.reshape(r))

    def norm(a, axes, eps):
        return (a - a.mean(axes, keepdims=True)) / np.sqrt(a.var(axes, keepdims=True) + eps)
    close(got[1], norm(xd, (2, 3), 1e-5) * s6.reshape(r) + b6.reshape(r), scale=2.0)
    grouped = norm(xd.reshape(2, 3, -1), (2,), 1e-4).reshape(x.shape)
    close(got[2], grouped * s6.reshape(r) + b6.reshape(r), scale=2.0)
    close(got[3], norm(xd, (2, 3), 1e-5) * s34 + b34, scale=2.0)
    close(got[4], norm(xd, (2, 3), 1e-5) * s34, scale=2.0)
    sq = np.pad(xd ** 2, ((0, 0), (1, 1), (0, 0), (0, 0)))
    sums = sum(sq[:, k:k + 6] for k in range(3))
    close(got[5], xd / (2.0 + 0.01 / 3 * sums) ** 0.6)
    close(got[6], (xd - xd.mean((0, 2, 3), keepdims=True)) / (xd.std((0, 2, 3), keepdims=True) + 1e-9), scale=2.0)
    close(got[7], (xd - xd.mean((1, 3), keepdims=True)) / (xd.std((1, 3), keepdims=True) + 1e-9), scale=2.0)
    y, run_mean, run_var = got[11:14]  # training mode: the batch's statistics, and the running ones updated
    bm, bv = xd.mean(axis=(0, 2, 3)), xd.var(axis=(0, 2, 3))
    close(y, (xd - bm.reshape(r)) / np.sqrt(bv.reshape(r) + 1e-5) * s6.reshape(r) + b6.reshape(r), scale=2.0)
    close(run_mean, m6 * 0.8 + bm * 0.2)
    close(run_var, v6 * 0.8 + bv * 0.2)
    y, mean, inv = got[8:11]
    close(y, got[3], scale=2.0)
    close(mean, xd.mean(axis=(2, 3), keepdims=True))
    close(inv, 1 / np.sqrt(xd.var(axis=(2, 3), keepdims=True) + 1e-5))
    if device == "CPU" and _have_onnx():  # also onnx's reference where installed (its LRN loops over N, not C)
        for g, w in zip(got[8:11], onnx_ref("LayerNormalization", [x, s34, b34], dict(axis=2), nout=3, opset=17)):
            close(g, w, scale=2.0)


# ------------------------------------------------------------------------------------------------ resize


def test_resize(device, rng):
    x = f32(rng, 1, 2, 4, 5)
    f32c = lambda *v: np.array(v, np.float32)  # noqa: E731
    i64c = lambda *v: np.array(v, np.int64)  # noqa: E731
    cases = [
        ("resize(x, scales=(1, 1, 2, 1.5))", dict(mode="nearest"), None, f32c(1, 1, 2, 1.5), None),
        ('resize(x, sizes=(1, 2, 3, 7), mode="nearest", nearest_mode="ceil", '
         'coordinate_transformation_mode="asymmetric")',
         dict(mode="nearest", nearest_mode="ceil", coordinate_transformation_mode="asymmetric"), None, None,
         i64c(1, 2, 3, 7)),
        ('resize(x, scales=(2, 0.6), axes=(2, 3), mode="nearest", nearest_mode="round_prefer_ceil")',
         dict(mode="nearest", nearest_mode="round_prefer_ceil", axes=[2, 3]), None, f32c(2, 0.6), None),
        ('resize(x, sizes=(7, 3), axes=(2, 3), mode="linear", coordinate_transformation_mode="align_corners")',
         dict(mode="linear", coordinate_transformation_mode="align_corners", axes=[2, 3]), None, None,
         i64c(7, 3)),
        ('resize(x, scales=(1, 1, 1.7, 0.8), mode="linear", coordinate_transformation_mode="pytorch_half_pixel")',
         dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"), None, f32c(1, 1, 1.7, 0.8),
         None),
        ('resize(x, scales=(1, 1, 2, 2), mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1)',
         dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1), None, f32c(1, 1, 2, 2), None),
        ('resize(x, sizes=(6, 6), axes=(2, 3), mode="cubic", keep_aspect_ratio_policy="not_larger")',
         dict(mode="cubic", axes=[2, 3], keep_aspect_ratio_policy="not_larger"), None, None, i64c(6, 6)),
        ('resize(x, sizes=(5, 4), axes=(2, 3), mode="linear", coordinate_transformation_mode="tf_crop_and_resize", '
         'roi=(0.2, -0.3, 1.2, 0.9), extrapolation_value=7.0)',
         dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize", axes=[2, 3],
              extrapolation_value=7.0), f32c(0.2, -0.3, 1.2, 0.9), None, i64c(5, 4)),
        ('resize(x, scales=(1, 1, 0.6, 0.5), mode="linear", antialias=1)',
         dict(mode="linear", antialias=1), None, f32c(1, 1, 0.6, 0.5), None),
        ('resize(x, sizes=(3, 2), axes=(2, 3), mode="cubic", antialias=1)',
         dict(mode="cubic", antialias=1, axes=[2, 3]), None, None, i64c(3, 2)),
        ('resize(x, scales=(1, 1, 1.5, 1.5), mode="linear", coordinate_transformation_mode="half_pixel_symmetric")',
         dict(mode="linear", coordinate_transformation_mode="half_pixel_symmetric"), None, f32c(1, 1, 1.5, 1.5),
         None),
    ]
    wants = [onnx_ref("Resize", [x, roi, scales, sizes], attrs, opset=19)[0]
             for _, attrs, roi, scales, sizes in cases]
    got = run_all(device, dict(x=x), [c[0] for c in cases])
    for g, w, c in zip(got, wants, cases):
        assert g.shape == w.shape, c[0]
        close(g, w, scale=2.0)


# ------------------------------------------------------------------------------------------------ indices


def test_gather_scatter_one_hot(device, rng):
    x = f32(rng, 3, 4)
    gi = np.array([[2, -1, 0], [-3, 1, 1]], np.int64)  # negative: from the end
    nd = f32(rng, 2, 3, 4)
    ndi = np.array([[[1, -1]], [[0, 2]]], np.int64)  # batch_dims=1: (2, 1, 2)
    si = np.array([[1, 0, -2, 1], [0, 2, 2, -3]], np.int64)
    su = f32(rng, 2, 4)
    snd_i = np.array([[1], [-3], [1]], np.int64)
    snd_u = f32(rng, 3, 4)
    oh = np.array([[1, -1, 5], [0, -4, 3]], np.int64)
    got = run_all(device, dict(x=x, gi=gi, nd=nd, ndi=ndi, si=si, su=su, snd_i=snd_i, snd_u=snd_u, oh=oh), [
        "gather_elements(x, gi, axis=1)",
        "gather_elements(x, gi.T[0:2, 0:1] % 3, axis=0)",
        "gather_nd(nd, ndi, batch_dims=1)",
        "gather_nd(nd, ((1, 2), (-1, 0)))",
        "scatter_elements(x, si[0:2, 0:3] % 4, su[0:2, 0:3], axis=1)",
        'scatter_elements(x, si, su, axis=0, reduction="add")',
        'scatter_elements(x, si, su, axis=0, reduction="mul")',
        'scatter_elements(x, si, su, axis=0, reduction="max")',
        'scatter_elements(x, si, su, axis=0, reduction="min")',
        'scatter_nd(x, snd_i, snd_u, reduction="add")',
        "scatter_nd(nd, ((0, 1), (1, -1)), nd[0, 0:2] * 10)",
        "one_hot(oh, 4, values=(-1.0, 2.0))",
        "one_hot(oh, 4, axis=0, dtype=i64)"])
    n = 3
    close(got[0], np.take_along_axis(x[:2], gi % 4, axis=1))  # the leading part of x, as ONNX reads it
    close(got[1], np.take_along_axis(x[:, :1], (gi.T[0:2, 0:1] % 3), axis=0))
    want_nd = np.stack([nd[0][[1], [3]], nd[1][[0], [2]]])
    close(got[2], want_nd.reshape(2, 1))
    close(got[3], np.stack([nd[1, 2], nd[1, 0]]))
    w = x.copy()
    for i in range(2):
        for j in range(3):
            w[i, si[i, j] % 4] = su[i, j]
    close(got[4], w)
    for k, op in zip(range(5, 9), (np.add, np.multiply, np.maximum, np.minimum)):
        w = x.astype(np.float64)
        for i in range(2):
            for j in range(4):
                w[si[i, j] % n, j] = op(w[si[i, j] % n, j], su[i, j])
        close(got[k], w)
    w = x.astype(np.float64)
    for q in range(3):
        w[snd_i[q, 0] % 3] += snd_u[q]
    close(got[9], w)
    w = nd.copy()
    w[0, 1] = nd[0, 0] * 10
    w[1, 2] = nd[0, 1] * 10
    close(got[10], w)
    hot = np.array([[[(k == (v % 4 if -4 <= v < 4 else 99)) for k in range(4)] for v in row] for row in oh])
    close(got[11], np.where(hot, 2.0, -1.0).astype(np.float32))
    assert_exact(got[12], np.moveaxis(hot, -1, 0).astype(np.int64), "i64")


def test_rearranging_and_hardmax(device, rng):
    x = f32(rng, 2, 8, 2, 3)
    t = np.array([[1, 3, 3, 0], [2, 2, 1, 2]], np.int32)
    got = run_all(device, dict(x=x, t=t), [
        "depth_to_space(x, 2)", 'depth_to_space(x, 2, mode="CRD")', "space_to_depth(x[:, :, :, 0:2], 2)",
        "hardmax(x, axis=1)", "hardmax(t)", 'space_to_depth(depth_to_space(x, 2, mode="CRD"), 2, mode="CRD")',
        "one_hot(cast(t, f32) * 0.75 - 0.5, 3)"])
    n, c, h, w = x.shape
    dcr = x.reshape(n, 2, 2, c // 4, h, w).transpose(0, 3, 4, 1, 5, 2).reshape(n, c // 4, h * 2, w * 2)
    crd = x.reshape(n, c // 4, 2, 2, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, c // 4, h * 2, w * 2)
    s = x[:, :, :, 0:2]
    s2d = s.reshape(n, c, 1, 2, 1, 2).transpose(0, 3, 5, 1, 2, 4).reshape(n, c * 4, 1, 1)
    assert_exact(got[0], dcr, "f32")
    assert_exact(got[1], crd, "f32")
    assert_exact(got[2], s2d, "f32")
    hm = (np.arange(c).reshape(1, c, 1, 1) == x.argmax(axis=1)[:, None]).astype(np.float32)
    assert_exact(got[3], hm, "f32")
    assert_exact(got[4], np.array([[0, 1, 0, 0], [1, 0, 0, 0]], np.int32), "i32")
    assert_exact(got[5], x, "f32")  # CRD there and back
    truncated = (t * 0.75 - 0.5).astype(np.int64)  # float indices truncate toward zero: -0.5 -> 0, 1.75 -> 1
    assert_exact(got[6], (truncated[..., None] == np.arange(3)).astype(np.int32), "i32")


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("expr, message", [
    ('conv(x, w, auto_pad="SAME_UPER")', "did you mean 'SAME_UPPER'"),
    ('conv(x, w, auto_pad="VALID", pads=(1, 1, 1, 1))', "not both"),
    ("conv(x, w, group=3)", "groups"),
    ("conv(x, w, pads=(1, 1))", "pads needs 4 values"),
    ("conv(x, w, strides=0)", "strides must be positive"),
    ("max_pool(x)", "needs kernel_shape"),
    ("max_pool(x, kernel_shape=(2, 2), pads=(2, 0, 0, 0))", "smaller than the window"),
    ("avg_pool(x, kernel_shape=(9, 2))", "larger than the padded input"),
    ("max_pool(x, kernel_shape=(2, 2), ceil_mode=2)", "ceil_mode must be 0 or 1"),
    ('resize(x, scales=(1, 1, 2, 2), mode="bilinear")', "did you mean 'linear'"),
    ("resize(x, scales=(2, 2))", "2 scales for 4 axes"),
    ("resize(x)", "needs scales or sizes"),
    ("gather_elements(x, ((((0, 7),),),), axis=3)", "index 7 is out of range"),
    ("gather_nd(x, ((0, 5),))", "index 5 is out of range"),
    ('scatter_elements(x, ((((0,),),),), 1.0, reduction="maxx")', "did you mean 'max'"),
    ("scatter_elements(x, ((((-9,),),),), ((((1.0,),),),), axis=3)", "index -9 is out of range"),
    ("depth_to_space(x, 2)", "divisible"),
    ("batch_norm(x, w, w, w, w)", "one value per channel"),
    ("one_hot(x > 0, 3)", "indices are bool"),
    ("one_hot(cast(x, i32), 0)", "depth must be positive"),
])
def test_bad_arguments_are_one_clear_error(expr, message):
    src = f"x: f32[1, 2, 5, 6]\nw: f32[3, 2, 3, 3]\nreturn {expr}\n"
    err = source_error(src)
    assert message in err.format(), err.format()


# ------------------------------------------------------------------------------------------------ numpy twins


def test_numpy_baseline_twins_agree(rng):
    """`tgc bench --vs numpy` runs the numpy twins (tgc/baselines/numpy_nnlib.py): they agree with tgc."""
    import tgc
    from tgc.baselines.numpy_eval import numpy_program
    inputs = dict(x=f32(rng, 2, 4, 6, 5), w=f32(rng, 6, 2, 3, 2), wt=f32(rng, 4, 3, 2, 2), c4=f32(rng, 4),
                  v4=rng.uniform(0.5, 2, 4).astype(np.float32), i=np.array([[1, -1], [0, 2]], np.int64),
                  s=np.array([[2, 0, -1, 1, 0]], np.int64), ln=f32(rng, 6, 5))
    exprs = [
        'conv(x, w, c4[0:2].sum() + zeros(6), strides=(2, 1), pads=(1, 0, 0, 1), group=2, auto_pad="NOTSET")',
        "conv_transpose(x, wt, strides=2, pads=(1, 0, 0, 1), output_padding=1, group=2)",
        "max_pool(x, kernel_shape=(3, 2), strides=2, pads=(1, 1, 0, 0), ceil_mode=1, return_indices=True)",
        "max_pool(x, kernel_shape=(2, 2), storage_order=1, return_indices=True)",
        "avg_pool(x, kernel_shape=(3, 3), strides=2, pads=(1, 1, 1, 1), ceil_mode=1)",
        'avg_pool(x, kernel_shape=(2, 3), auto_pad="SAME_UPPER", count_include_pad=1)',
        "lp_pool(x, kernel_shape=(2, 2), p=3)", "global_avg_pool(x)", "global_max_pool(x)", "global_lp_pool(x)",
        "batch_norm(x, c4, c4, c4, v4)", "instance_norm(x, c4, v4)", "group_norm(x, c4, v4, num_groups=2)",
        "layer_norm(x, ln, c4[0], axis=2)", "lrn(x, size=3)", "mean_variance_normalization(x)",
        'resize(x, scales=(1, 1, 1.5, 2), mode="linear")', 'resize(x, sizes=(4, 7), axes=(2, 3), mode="cubic")',
        'resize(x, scales=(0.5, 2), axes=(2, 3), nearest_mode="floor")',
        "gather_elements(x, i.reshape(2, 2, 1, 1), axis=1)", "gather_nd(x, i, batch_dims=1)",
        'scatter_elements(x[0, 0, 0:1], s, ln[0:1], axis=1, reduction="add")',
        "scatter_elements(x[0, 0, 0:1], s, ln[0:1], axis=1)",
        'scatter_nd(x, i, x[0:2, 0] * 2, reduction="max")',
        "one_hot(i, 3, axis=0)", "depth_to_space(x, 2)", "space_to_depth(x[:, :, :, 0:4], 2)", "hardmax(x, axis=2)"]
    prog = tgc.loads(program(inputs, exprs))
    want = prog.run(device="CPU", **inputs)
    dims, _ = prog.bind(inputs)
    got = numpy_program(prog, dims)(inputs)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_allclose(np.asarray(got[name], np.float64), np.asarray(want[name], np.float64),
                                   rtol=1e-4, atol=1e-5, err_msg=name)


def test_int_half_and_bool_inputs(device, rng):
    """Max pools, nearest resize, gathers and scatters keep ints and bools exact; f16 rounds once."""
    xi = rng.integers(-10, 10, (1, 2, 5, 5)).astype(np.int32)
    xh = rng.uniform(-2, 2, (1, 2, 5, 5)).astype(np.float16)
    b = rng.random((2, 5)) < 0.5
    got = run_all(device, dict(xi=xi, xh=xh, b=b), [
        "max_pool(xi, kernel_shape=(2, 2), pads=(1, 1, 1, 1))", "resize(xi, scales=(1, 1, 2, 1.5))",
        'scatter_elements(xi, xi % 5, xi * 3, axis=3, reduction="max")', "gather_nd(b, ((0, 1), (1, -1)))",
        "hardmax(xi)", "max_pool(b.reshape(1, 2, 5), kernel_shape=2)",
        "avg_pool(xh, kernel_shape=(2, 2), strides=2, ceil_mode=1)",
        'resize(xi, sizes=(8,), axes=(3,), coordinate_transformation_mode="tf_half_pixel_for_nn")'])
    xp = np.pad(xi, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=np.iinfo(np.int32).min)
    from numpy.lib.stride_tricks import sliding_window_view as windows
    assert_exact(got[0], windows(xp, (2, 2), axis=(2, 3)).max(axis=(-2, -1)), "i32")
    rows = np.arange(10) // 2
    cols = np.where((np.arange(7) + 0.5) / 1.5 - 0.5 - np.floor((np.arange(7) + 0.5) / 1.5 - 0.5) <= 0.5,
                    np.floor((np.arange(7) + 0.5) / 1.5 - 0.5), np.ceil((np.arange(7) + 0.5) / 1.5 - 0.5))
    assert_exact(got[1], xi[:, :, rows][:, :, :, cols.clip(0, 4).astype(int)], "i32")  # round_prefer_floor
    want = xi.copy()
    for idx in np.ndindex(xi.shape):
        j = idx[:3] + (xi[idx] % 5,)
        want[j] = max(want[j], xi[idx] * 3)
    assert_exact(got[2], want, "i32")
    assert_exact(got[3], np.array([b[0, 1], b[1, 4]]), "bool")
    hm = (np.arange(5) == xi.argmax(axis=3)[..., None]).astype(np.int32)
    assert_exact(got[4], hm, "i32")
    assert_exact(got[5], b.reshape(1, 2, 5)[..., :4] | b.reshape(1, 2, 5)[..., 1:], "bool")
    xf = np.pad(xh.astype(np.float64), ((0, 0), (0, 0), (0, 1), (0, 1)))
    sums = windows(xf, (2, 2), axis=(2, 3))[:, :, ::2, ::2].sum(axis=(-2, -1))
    counts = np.outer([2, 2, 1], [2, 2, 1])  # the last window of each axis covers 1 element of the input
    assert_close(got[6], sums / counts, "f16", scale=2.0)
    src = (np.arange(8) + 0.5) / 1.6  # opset 11's tf_half_pixel_for_nn: no -0.5; round_prefer_floor
    src = np.where(src - np.floor(src) <= 0.5, np.floor(src), np.ceil(src)).clip(0, 4).astype(int)
    assert_exact(got[7], xi[..., src], "i32")


def test_python_callers_may_pass_onnx_attribute_values():
    """An importer calls these functions from Python with ONNX's attribute values: lists, numpy arrays and
    bytes strings mean what the language's tuples and strings mean."""
    from tgc.dsl import nnlib
    assert nnlib.window_geometry("conv", (5, 6), (3, 3), (2, 1), (1, 1), [1, 0, 1, 1], b"NOTSET") == \
        nnlib.window_geometry("conv", (5, 6), (3, 3), (2, 1), (1, 1), (1, 0, 1, 1), "NOTSET")
    as_onnx = nnlib.resize_plan((1, 2, 4, 4), scales=np.array([1, 1, 2, 1.5], np.float32), mode=b"linear",
                                coordinate_transformation_mode=b"align_corners")
    as_tg = nnlib.resize_plan((1, 2, 4, 4), scales=(1, 1, 2, 1.5), mode="linear",
                              coordinate_transformation_mode="align_corners")
    assert len(as_onnx) == len(as_tg) == 2
    for a, b in zip(as_onnx, as_tg):
        assert a[:2] == b[:2]
        np.testing.assert_array_equal(a[2], b[2])
        np.testing.assert_array_equal(a[3], b[3])
    with pytest.raises(nnlib.DslError, match="got 'SAME_LOWR'") as err:
        nnlib.window_geometry("conv", (5,), (3,), (1,), (1,), None, b"SAME_LOWR")
    assert err.value.hint == "did you mean 'SAME_LOWER'?"


def test_a_bad_attribute_on_the_command_line_is_exit_2(tmp_path):
    from clikit import assert_clean, invoke
    bad = tmp_path / "bad.tg"
    bad.write_text('x: f32[1, 2, 5, 5]\nreturn resize(x, scales=(1, 1, 2, 2), mode="bicubic")\n')
    assert_clean(invoke("run", str(bad), "--random"), 2, "mode must be one of", "did you mean 'cubic'")
