"""Whole `.tg` programs: outputs and their names, shadowing, scalar inputs, dim binding, zero-size dims,
programs without inputs, and how many kernels simple programs compile to."""

from __future__ import annotations

import numpy as np
import pytest
from langkit import assert_close, assert_exact, kernel_count, run, run1

import tgc


def test_output_names(device):
    x = np.array([1, 2, 3], np.int32)
    prog = tgc.loads("x: i32[3]\ny = x * 2\nz = y + 1\nreturn y, x + 1, z, x")
    assert prog.output_names == ["y", "out1", "z", "x"]
    out = prog.run(device=device, x=x)
    assert list(out) == ["y", "out1", "z", "x"]
    assert_exact(out["y"], x * 2, "i32")
    assert_exact(out["out1"], x + 1, "i32")
    assert_exact(out["z"], x * 2 + 1, "i32")
    assert_exact(out["x"], x, "i32")


def test_a_single_expression_output_is_out0(device):
    out = run("x: f32[2]\nreturn (x + 1)", device, x=np.array([1.0, 2.0], np.float32))
    assert list(out) == ["out0"]


def test_equal_values_under_different_names(device):
    x = np.array([1.5, -2.0], np.float32)
    out = run("x: f32[2]\na = x * 2\nb = a\nreturn a, b, x * 2, x * 2", device, x=x)
    assert list(out) == ["a", "b", "out2", "out3"]
    for got in out.values():
        assert_close(got, x * 2.0, "f32")


def test_shadowing(device):
    x = np.array([1, 2, 3], np.int32)
    out = run("x: i32[3]\ny = x + 1\ny = y * 2\nexp = y - 1\ny = exp + y\nreturn y", device, x=x)
    assert list(out) == ["y"]
    assert_exact(out["y"], ((x + 1) * 2 - 1) + (x + 1) * 2, "i32")


def test_a_later_shadow_does_not_change_earlier_uses(device):
    x = np.array([1.0, 2.0], np.float32)
    out = run("x: f32[2]\ny = x + 1\nz = y * 3\ny = z - 100\nreturn z, y", device, x=x)
    assert_close(out["z"], (x + 1.0) * 3, "f32")
    assert_close(out["y"], (x + 1.0) * 3 - 100, "f32")


def test_scalar_inputs_and_outputs(device):
    x = np.array([1.0, 2.0, 3.0], np.float32)
    out = run("x: f32[3]\ns: f32\nk: i32\nreturn x * s + k, s * 2, sum(x) + s", device, x=x, s=np.float32(0.5),
              k=np.array(3, np.int32))
    assert_close(out["out0"], x * 0.5 + 3, "f32")
    assert_close(out["out1"], np.array(1.0), "f32")
    assert out["out1"].shape == ()
    assert_close(out["out2"], np.array(6.5), "f32")


def test_programs_without_inputs(device):
    out = run("y = ones((2, 2)) * 3\nz = arange(4)\nreturn y @ y, z * z, eye(2) + y", device)
    assert_close(out["out0"], np.full((2, 2), 18.0), "f32")
    assert_exact(out["out1"], np.arange(4) ** 2, "i32")
    assert_close(out["out2"], np.eye(2) + 3, "f32")
    assert tgc.loads("return 1").inputs == []


def test_comments_blank_lines_and_trailing_commas(device):
    src = "# a program\n\nx: f32[2]  # input\n\n# comment\ny = x + 1  # add\nreturn y,\n"
    out = run(src, device, x=np.array([1.0, 2.0], np.float32))
    assert list(out) == ["y"]


# --- dims


def test_dim_names_bind_from_the_arrays(device):
    prog = tgc.loads("a: f32[N, K]\nb: f32[K, M]\nreturn a @ b")
    rng = np.random.default_rng(26)
    for n, k, m in [(2, 3, 4), (5, 1, 2)]:
        a, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
        out = prog.run(device=device, a=a, b=b)["out0"]
        assert_close(out, a.astype(np.float64) @ b, "f32", scale=np.abs(a) @ np.abs(b))


def test_dims_can_be_given_explicitly(device):
    x = np.arange(6, dtype=np.int32)
    prog = tgc.loads("x: i32[N]\nreturn x * 2")
    assert_exact(prog.run(device=device, dims={"N": 6}, x=x)["out0"], x * 2, "i32")
    assert len(prog.compile(device=device, dims={"N": 6})) == 1


@pytest.mark.parametrize("shapes, dims, words", [
    ({"x": (3,), "y": (4,)}, None, ["'y'", "axis 0", "4", "3", "N"]),
    ({"x": (3, 2), "y": (2,)}, None, ["'y'", "axis 0", "2", "3", "N"]),
    ({"x": (3,), "y": (3,)}, {"N": 5}, ["'x'", "axis 0", "3", "5", "N"]),
])
def test_dim_mismatch_names_the_input_axis_and_sizes(device, shapes, dims, words):
    decl_x = "x: f32[N]" if len(shapes["x"]) == 1 else "x: f32[N, 2]"
    prog = tgc.loads(f"{decl_x}\ny: f32[N]\nreturn y")
    with pytest.raises(tgc.TgcError) as info:
        prog.run(device=device, dims=dims, **{k: np.zeros(v, np.float32) for k, v in shapes.items()})
    for w in words:
        assert w in info.value.msg, (w, info.value.msg)
    assert info.value.line == (2 if words[0] == "'y'" else 1)


def test_fixed_dim_and_rank_mismatches(device):
    prog = tgc.loads("x: f32[4, K]\nreturn x")
    with pytest.raises(tgc.TgcError) as info:
        prog.run(device=device, x=np.zeros((3, 2), np.float32))
    assert "'x'" in info.value.msg and "axis 0" in info.value.msg and "3" in info.value.msg and "4" in info.value.msg
    with pytest.raises(tgc.TgcError) as info:
        prog.run(device=device, x=np.zeros(4, np.float32))
    assert "'x'" in info.value.msg and info.value.line == 1


def test_missing_and_unknown_inputs(device):
    prog = tgc.loads("x: f32[2]\nreturn x")
    with pytest.raises(tgc.TgcError, match="'x'"):
        prog.run(device=device)
    with pytest.raises(tgc.TgcError, match="'z'"):
        prog.run(device=device, x=np.zeros(2, np.float32), z=np.zeros(2, np.float32))


def test_shape_errors_depend_on_the_bound_dims(device):
    prog = tgc.loads("x: f32[N]\ny: f32[M]\nreturn x + y")
    assert_close(prog.run(device=device, x=np.ones(3, np.float32), y=np.ones(1, np.float32))["out0"], np.full(3, 2.0),
                 "f32")
    with pytest.raises(tgc.TgcError) as info:
        prog.run(device=device, x=np.ones(3, np.float32), y=np.ones(2, np.float32))
    assert (info.value.line, info.value.col, info.value.end_col) == (3, 8, 12)
    assert "broadcast" in info.value.msg


# --- zero-size dims


def test_zero_size_reductions(device):
    x = np.zeros((3, 0), np.float32)
    i = np.zeros((0, 2), np.int8)
    out = run("x: f32[N, K]\ni: i8[K, 2]\nreturn sum(x, 1), prod(x, 1), sum(x), x + 1, sum(i, 0), prod(i, 0), "
              "x.sum(0), mean(x, 0)", device, x=x, i=i)
    assert_close(out["out0"], np.zeros(3), "f32")
    assert_close(out["out1"], np.ones(3), "f32")
    assert_close(out["out2"], np.array(0.0), "f32")
    assert out["out3"].shape == (3, 0) and out["out3"].dtype == np.float32
    assert_exact(out["out4"], [0, 0], "i32")
    assert_exact(out["out5"], [1, 1], "i32")
    assert out["out6"].shape == (0,)
    assert out["out7"].shape == (0,)


@pytest.mark.parametrize("fn", ["max", "min", "argmax"])
def test_max_over_a_zero_size_axis_is_an_error(device, fn):
    prog = tgc.loads(f"x: f32[N, K]\ny = x + 1\nreturn {fn}(y, 1)")
    assert prog.run(device=device, x=np.zeros((2, 1), np.float32))["out0"].shape == (2,)
    with pytest.raises(tgc.TgcError) as info:
        prog.run(device=device, x=np.zeros((2, 0), np.float32))
    assert (info.value.line, info.value.col) == (3, 8)
    with pytest.raises(tgc.TgcError):
        tgc.loads(f"x: f32[2, 0]\nreturn {fn}(x, 1)").compile(device=device, dims={})


def test_zero_size_matmul_and_inputs(device):
    a, b = np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32)
    out = run1("a: f32[N, K]\nb: f32[K, M]\nreturn a @ b", device, a=a, b=b)
    assert_close(out, np.zeros((2, 3)), "f32")
    out = run1("a: f32[N]\nreturn a * 2", device, a=np.zeros(0, np.float32))
    assert out.shape == (0,)


# --- kernel counts (fusion)


@pytest.mark.parametrize("src, dims, most", [
    ("a: f32[N]\nb: f32[N]\nc: f32[N]\nreturn a * b + c", {"N": 64}, 1),
    ("x: f32[N, K]\nw: f32[K, M]\nb: f32[M]\nreturn relu(x @ w + b)", {"N": 8, "K": 16, "M": 4}, 1),
    ("x: f32[N, D]\nreturn softmax(x, 1)", {"N": 4, "D": 32}, 3),
    ("x: f32[N, D]\nm = x.max(axis=1, keepdim=True)\ne = exp(x - m)\nreturn e / sum(e, axis=1, keepdim=True)",
     {"N": 4, "D": 32}, 3),
    ("x: f32[N]\nreturn sum(x * 2 + 1)", {"N": 100}, 1),
    ("x: f32[N, D]\nreturn exp(x).T + 1", {"N": 3, "D": 5}, 1),
])
def test_kernel_counts(device, src, dims, most):
    n = kernel_count(src, dims, device)
    assert 1 <= n <= most, n
    if most == 1:
        assert n == 1


def test_each_output_is_computed_even_when_fused(device):
    a = np.array([1.0, 2.0], np.float32)
    out = run("a: f32[2]\nb = a * 2\nreturn b, b + 1, sum(b)", device, a=a)
    assert_close(out["b"], a * 2, "f32")
    assert_close(out["out1"], a * 2 + 1, "f32")
    assert_close(out["out2"], np.array(6.0), "f32")


def test_compiled_kernels_have_name_source_and_binary(device):
    prog = tgc.loads("x: f32[N, D]\nreturn softmax(x, 1)")
    kernels = prog.compile(device=device, dims={"N": 4, "D": 8})
    assert kernels
    for k in kernels:
        assert isinstance(k.name, str) and k.name
        assert isinstance(k.src, str) and k.src
        assert k.binary is None or isinstance(k.binary, bytes)
