"""max, min, maximum, minimum, relu, max_pool2d, softmax and everything else built on Ops.MAX propagate nan as
numpy's max/maximum do (docs/LANGUAGE.md, Semantics): a nan anywhere among the reduced elements, or on either
side of an elementwise max, gives nan, whatever its position (first, middle, last element, any lane of a vector
tile), on every device of TGC_TEST_DEVICES. Expectations are numpy's own results. Before this, the CPU's
`llvm.maxnum` under `nnan` gave nan only where the nan was the last element, C-style devices' fmax and the
emulator's np.fmax never did, and `tgc run --check` compared against np.fmax."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from langkit import assert_close, assert_exact, run

import tgc

sys.path.insert(0, str(Path(__file__).parent))

NAN = np.nan


def _rows_with_one_nan(n: int, seed: int) -> np.ndarray:
    """Rows of length n: one without nan, then one per nan position (every position up to 40 elements, else the
    first 17 (a vector tile's every lane and the next), a middle pair and the last two), one all-nan row."""
    rng = np.random.default_rng(seed)
    positions = list(range(n)) if n <= 40 else [*range(17), n // 2 - 1, n // 2, n - 2, n - 1]
    x = rng.standard_normal((len(positions) + 2, n)).astype(np.float32)
    for r, p in enumerate(positions):
        x[r + 1, p] = NAN
    x[-1] = NAN
    return x


@pytest.mark.parametrize("n", [1, 7, 8, 33, 1000])
def test_max_min_reductions_along_rows_and_columns(device, n):
    x = _rows_with_one_nan(n, n)
    out = run("x: f32[R, N]\nreturn x.max(axis=1), x.min(axis=1), max(x, axis=0), min(x.T, axis=1), x.max()",
              device, x=x)
    assert_exact(out["out0"], np.max(x, axis=1), "f32")
    assert_exact(out["out1"], np.min(x, axis=1), "f32")
    assert_exact(out["out2"], np.max(x, axis=0), "f32")
    assert_exact(out["out3"], np.min(x.T, axis=1), "f32")
    assert np.isnan(out["out4"])
    # the columns' reduction with nan only in the first and last column's rows
    y = x[:-1].T.copy()  # (n, rows): nan in column r+1 at row p
    out = run("y: f32[N, R]\nreturn y.max(axis=0), y.min(axis=0)", device, y=y)
    assert_exact(out["out0"], np.max(y, axis=0), "f32")
    assert_exact(out["out1"], np.min(y, axis=0), "f32")


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_whole_array_max_min_with_one_nan(device, where):
    x = np.arange(1000, dtype=np.float32)
    x[{"first": 0, "middle": 500, "last": 999}[where]] = NAN
    out = run("x: f32[N]\nreturn x.max(), x.min(), min(x), argmax(x), x[argmax(x)]", device, x=x)
    for k in ("out0", "out1", "out2", "out4"):
        assert np.isnan(out[k]), (k, out[k])
    assert_exact(out["out3"], np.argmax(x), "i32")


def test_no_nan_max_min_unchanged(device):
    x = np.random.default_rng(3).standard_normal((5, 1000)).astype(np.float32)
    x[2, 17] = np.inf
    x[3, :] = -np.inf
    out = run("x: f32[R, N]\nreturn x.max(axis=1), x.min(axis=1), x.max()", device, x=x)
    assert_exact(out["out0"], x.max(axis=1), "f32")
    assert_exact(out["out1"], x.min(axis=1), "f32")
    assert_exact(out["out2"], x.max(), "f32")


@pytest.mark.parametrize("n", [7, 8, 33])
def test_maximum_minimum_relu_elementwise(device, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((4, n)).astype(np.float32)
    y = rng.standard_normal((4, n)).astype(np.float32)
    x[0, :] = NAN  # nan on the left
    y[1, :] = NAN  # nan on the right
    x[2, ::2], y[2, 1::2] = NAN, NAN  # alternating
    x[3, n - 1], y[3, 0] = NAN, NAN
    out = run("x: f32[4, N]\ny: f32[4, N]\nreturn maximum(x, y), minimum(x, y), maximum(y, x), relu(x), "
              "maximum(x, 0.0), maximum(0.0, y), clip(x, -0.5, 0.5)", device, x=x, y=y)
    assert_exact(out["out0"], np.maximum(x, y), "f32")
    assert_exact(out["out1"], np.minimum(x, y), "f32")
    assert_exact(out["out2"], np.maximum(y, x), "f32")
    assert_exact(out["out3"], np.maximum(x, 0), "f32")
    assert_exact(out["out4"], np.maximum(x, 0), "f32")
    assert_exact(out["out5"], np.maximum(0, y), "f32")
    assert_exact(out["out6"], np.clip(x, -0.5, 0.5), "f32")


def test_softmax_of_a_row_with_a_nan(device):
    x = np.random.default_rng(5).standard_normal((4, 33)).astype(np.float32)
    x[1, 0], x[2, 17], x[3, 32] = NAN, NAN, NAN
    got = run("x: f32[4, 33]\nreturn softmax(x, axis=1)", device, x=x)["out0"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    assert_close(got, e / e.sum(axis=1, keepdims=True), "f32")  # rows 1-3 all nan, row 0 a softmax
    assert np.isnan(got[1:]).all() and not np.isnan(got[0]).any()


def test_max_pool2d_with_one_nan(device):
    x = np.random.default_rng(6).standard_normal((1, 2, 8, 8)).astype(np.float32)
    x[0, 0, 3, 5] = NAN
    x[0, 1, 0, 0] = NAN
    got = run("x: f32[1, 2, 8, 8]\nreturn max_pool2d(x, 2), max_pool2d(relu(x), 3, 1)", device, x=x)
    want2 = x.reshape(1, 2, 4, 2, 4, 2).max(axis=(3, 5))
    r = np.maximum(x, 0)
    want3 = np.stack([np.stack([r[:, :, i:i + 3, j:j + 3].max(axis=(2, 3)) for j in range(6)], -1)
                      for i in range(6)], -2)
    assert_exact(got["out0"], want2, "f32")
    assert_exact(got["out1"], want3, "f32")
    assert np.isnan(got["out0"]).sum() == 2
    assert np.isnan(got["out1"]).sum() == 9 + 1  # the 3x3 windows over (3, 5) and (0, 0)


def test_matmul_bias_relu_with_a_nan_in_the_bias(device):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((64, 48)).astype(np.float32)
    w = rng.standard_normal((48, 40)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    b[0], b[17], b[39] = NAN, NAN, NAN
    got = run("a: f32[64, 48]\nw: f32[48, 40]\nb: f32[40]\nreturn relu(a @ w + b)", device, a=a, w=w, b=b)["out0"]
    want = np.maximum(a.astype(np.float64) @ w + b, 0)
    assert_close(got, want, "f32", scale=np.abs(a) @ np.abs(w))
    assert np.isnan(got[:, [0, 17, 39]]).all() and np.isnan(got).sum() == 3 * 64


def test_isnan_of_a_max_and_a_sum_is_not_folded(device):
    x = np.ones((3, 40), np.float32)
    x[1, 9] = NAN
    out = run("x: f32[3, 40]\nm = x.max(axis=1)\ns = x.sum(axis=1)\nreturn m != m, s != s", device, x=x)
    assert_exact(out["out0"], [False, True, False], "bool")
    assert_exact(out["out1"], [False, True, False], "bool")


def test_run_check_with_a_nan_input_passes_and_prints_nan(tmp_path):
    from test_cli import tgc_here
    (tmp_path / "m.tg").write_text("x: f32[N]\nreturn x.max(), relu(x), x.min()\n")
    np.save(tmp_path / "x.npy", np.array([NAN, -1, 2, NAN, 5], np.float32))
    r = tgc_here("run", "m.tg", "-i", "x=x.npy", "--check", "-o", "o.npz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "check: ok" in r.stderr
    got = np.load(tmp_path / "o.npz")
    assert np.isnan(got["out0"]) and np.isnan(got["out2"])
    np.testing.assert_array_equal(got["out1"], [NAN, 0, 2, NAN, 5])
    r = tgc_here("run", "m.tg", "-i", "x=x.npy", "--check", cwd=tmp_path)
    assert r.returncode == 0 and "nan" in r.stdout, r.stdout + r.stderr


def test_a_literal_on_the_left_of_a_gpu_max_is_tested_once():
    """A literal left operand's `a != a` is a constant, which PoCL warns of (`||` with a constant operand): the
    renderer tests `a > b` alone (a nan b fails it: b wins), and a nan literal is the result itself."""
    srcs = [k.src for k in tgc.loads("x: f32[3]\nreturn x + maximum(nan, 1.0), maximum(x, 2.0)").compile("OPENCL")]
    text = "\n".join(srcs)
    assert "(1.0f) != (1.0f)" not in text and "(NAN) != (NAN)" not in text, text
    assert re.search(r"\(\(\(1\.0f\) > \(NAN\)\) \? \(1\.0f\) : \(NAN\)\)", text), text
    assert re.search(r"\|\| \((v\d+)\) != \(\1\)\) \?", text), text  # a name on the left keeps its nan test
