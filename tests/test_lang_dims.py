"""Dims are values (DSL.md "Dims"): integer arithmetic of dims in declarations (`w: f32[C, 3 * C]`), checked
against the arrays given, and dim names as integer values in expressions (`reshape(x, (B, T, H, C // H))`).
Results against numpy computed here; errors with their exact spans."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from langkit import source_error

import tgc
from tgc.errors import BindError

RNG = np.random.default_rng(7)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def err_of(src: str, dims: dict[str, int] | None = None, **inputs) -> tgc.TgcError:
    with pytest.raises(tgc.TgcError) as info:
        tgc.loads(src).run(device="PYTHON" if not inputs else "CPU", dims=dims, **inputs)
    return info.value


# --- declarations with dim arithmetic


def test_declared_multiples_bind_from_the_plain_dim(device):
    src = "x: f32[N, C]\nw: f32[C, 3 * C]\nb: f32[3 * C]\nreturn x @ w + b"
    x, w, b = f32(4, 5), f32(5, 15), f32(15)
    got = tgc.loads(src).run(device=device, x=x, w=w, b=b)["out0"]
    np.testing.assert_allclose(got, x @ w + b, rtol=1e-4, atol=1e-4)


def test_the_plain_dim_may_be_declared_after_its_multiple(device):
    src = "w: f32[2 * C + 1]\nx: f32[C]\nreturn sum(w) + sum(x)"
    w, x = f32(7), f32(3)
    got = tgc.loads(src).run(device=device, w=w, x=x)["out0"]
    np.testing.assert_allclose(got, w.sum() + x.sum(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("decl, size, dim", [
    ("C + 1", 9, 8), ("3 * C", 12, 4), ("C * 2 - 1", 7, 4), ("10 - C", 3, 7), ("(C + 2) * 3", 15, 3),
])
def test_an_expression_with_one_unbound_dim_through_add_sub_mul_binds_it(decl, size, dim):
    prog = tgc.loads(f"w: f32[{decl}]\nreturn w * C")
    w = f32(size)
    dims, _ = prog.bind({"w": w})
    assert dims == {"C": dim}
    np.testing.assert_allclose(prog.run(device="PYTHON", w=w)["out0"], w * dim, rtol=1e-6)


def test_floor_division_and_parentheses_evaluate_like_python():
    src = "x: f32[N]\nh: f32[(N + 1) // 2, N // 3, N - N // 2 * 2]\nreturn sum(h) + N"
    for n in (1, 6, 7):
        h = f32((n + 1) // 2, n // 3, n % 2)
        got = tgc.loads(src).run(device="PYTHON", x=f32(n), h=h)["out0"]
        np.testing.assert_allclose(got, h.sum() + n, rtol=1e-5, atol=1e-5)


def test_a_constant_expression_folds_to_its_size():
    prog = tgc.loads("x: f32[2 * 3, 8 // 2 - 1]\nreturn x")
    assert prog.inputs[0].shape == (6, 3)
    assert prog.dim_names == []


def test_declarations_print_their_expressions():
    prog = tgc.loads("w: f32[C, 3 * C, (C + 1) // 2, C - (N - 1)]\nreturn w")
    assert str(prog.inputs[0]) == "w: f32[C, 3 * C, (C + 1) // 2, C - (N - 1)]"
    assert prog.dim_names == ["C", "N"]


def test_dims_given_fix_expression_dims_for_compile_and_random_inputs():
    prog = tgc.loads("w: f32[C, 4 * C]\nreturn w.sum(axis=1)")
    assert len(prog.compile(device="PYTHON", dims={"C": 3})) >= 1
    assert prog.output_types({"C": 3})[0][2] == (3,)


# --- dim names as values


def test_dims_are_integer_values_in_expressions(device):
    src = ("x: f32[B, T, C]\n"
           "h = reshape(x, (B, T, 2, C // 2))\n"
           "s = h.sum(axis=3) * C + T\n"
           "return s, arange(T) * B")
    x = f32(2, 3, 6)
    out = tgc.loads(src).run(device=device, x=x)
    np.testing.assert_allclose(out["s"], x.reshape(2, 3, 2, 3).sum(axis=3) * 6 + 3, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out["out1"], np.arange(3) * 2)
    assert out["out1"].dtype == np.int32


def test_a_dim_alone_is_an_i32_output():
    out = tgc.loads("x: f32[N, M]\nreturn N * M - 1, N // 2").run(device="PYTHON", x=f32(5, 3))
    assert out["out0"] == 14 and out["out0"].dtype == np.int32
    assert out["out1"] == 2


def test_transformer_block_reads_its_dims():
    text = (Path(__file__).resolve().parents[1] / "kernels" / "transformer_block.tg").read_text()
    assert "C3" not in text and "C4" not in text and "3 * C" in text and "4 * C" in text
    assert tgc.load(Path(__file__).resolve().parents[1] / "kernels" / "transformer_block.tg").dim_names == \
        ["B", "T", "C"]


def test_the_numpy_baseline_knows_dim_values():
    from tgc.baselines.numpy_eval import numpy_program
    prog = tgc.loads("x: f32[N]\nw: f32[2 * N]\nreturn reshape(w, (N, 2)).sum(axis=1) * N + x")
    x, w = f32(3), f32(6)
    got = numpy_program(prog, {})({"x": x, "w": w})["out0"]
    np.testing.assert_allclose(got, w.reshape(3, 2).sum(axis=1) * 3 + x, rtol=1e-5)


# --- errors


def test_an_expression_dim_that_disagrees_points_at_the_dim():
    src = "x: f32[N, C]\nw: f32[C, 3 * C]\nreturn x @ w"
    e = err_of(src, x=f32(2, 4), w=f32(4, 11))
    assert (e.line, e.col, e.end_col) == (2, 11, 15)
    assert e.msg == "input 'w' axis 1 has size 11, but is declared 3 * C = 12 (C = 4 from input 'x')"
    assert e.exit_code == 2


def test_dims_given_that_disagree_with_an_expression_are_named():
    e = err_of("w: f32[C + 1]\nreturn w", dims={"C": 5}, w=f32(4))
    assert "declared C + 1 = 6 (C = 5 from the dims given)" in e.msg and (e.col, e.end_col) == (8, 12)


def test_no_integer_solution_is_an_error():
    e = err_of("w: f32[3 * C]\nreturn w", w=f32(7))
    assert e.msg == "input 'w' axis 0 has size 7: no size of C makes 3 * C equal 7" and e.col == 8
    e = err_of("w: f32[C + 4]\nreturn w", w=f32(2))
    assert "no size of C makes C + 4 equal 2" in e.msg


@pytest.mark.parametrize("decl", ["N // 2", "N * N", "N + M"])
def test_an_expression_that_does_not_determine_its_dim_asks_for_it(decl):
    e = err_of(f"w: f32[{decl}]\nreturn w", w=f32(4))
    assert isinstance(e, BindError) and e.need == "dim" and e.name == "N"
    assert "does not determine N" in e.msg and e.col == 8


def test_a_dim_given_makes_an_unsolvable_expression_checkable():
    w = f32(4)
    np.testing.assert_array_equal(tgc.loads("w: f32[N // 2]\nreturn w").run(device="PYTHON", dims={"N": 9},
                                                                            w=w)["w"], w)


@pytest.mark.parametrize("src, dims, msg, col, end_col", [
    ("w: f32[N - 2]\nreturn w", {"N": 1}, "input 'w': the dim N - 2 is -1: a size cannot be negative", 8, 12),
    ("w: f32[N // (M - 1)]\nreturn w", {"N": 4, "M": 1}, "the dim N // (M - 1) divides by zero (M - 1 = 0)", 8, 19),
])
def test_sizes_that_do_not_exist_for_the_dims_given(src, dims, msg, col, end_col):
    e = source_error(src, dims)
    assert msg in e.msg and (e.line, e.col, e.end_col) == (1, col, end_col) and e.exit_code == 2


@pytest.mark.parametrize("src, msg, col, end_col", [
    ("w: f32[N / 2]\nreturn w", "'/' is not allowed in a dim", 8, 12),
    ("w: f32[N % 2]\nreturn w", "'%' is not allowed in a dim", 8, 12),
    ("w: f32[N ** 2]\nreturn w", "'**' is not allowed in a dim", 8, 13),
    ("w: f32[1.5]\nreturn w", "a dim is an integer, not 1.5", 8, 10),
    ("w: f32[2 * 1.5]\nreturn w", "a dim is an integer, not 1.5", 12, 14),
    ("w: f32[2 - 3]\nreturn w", "this dim is -1: a size cannot be negative", 8, 12),
    ("w: f32[N, 4 // 0]\nreturn w", "division by zero in a dim", 11, 16),
    ("w: f32[N // (2 - 2)]\nreturn w", "division by zero in a dim", 8, 19),
    ("w: f32[f32 * 2]\nreturn w", "'f32' cannot be a dim name: it names a dtype", 8, 10),
    ("w: f32[x.shape]\nreturn w", "a dim is a non-negative integer or a dim name", 8, 14),
])
def test_bad_dim_expressions(src, msg, col, end_col):
    e = source_error(src)
    assert e.msg == msg and (e.line, e.col, e.end_col) == (1, col, end_col), e.format()


def test_unknown_dim_name_in_an_expression_suggests_the_close_one():
    e = source_error("x: f32[BATCH, C]\nreturn reshape(x, (BATCH * C, BATHC))")
    assert e.msg == "unknown name 'BATHC'" and e.hint == "did you mean 'BATCH'?" and (e.line, e.col) == (2, 31)


def test_a_dim_cannot_be_assigned_or_be_an_input():
    e = source_error("x: f32[N]\nN = 3\nreturn x")
    assert e.msg == "cannot assign to dim 'N'" and (e.line, e.col) == (2, 1)
    e = source_error("x: f32[N]\nN += 1\nreturn x")
    assert e.msg == "cannot assign to dim 'N'"
    e = source_error("x: f32[3 * N]\nN: i32\nreturn x")
    assert e.msg == "'N' is both an input and a dim name" and (e.line, e.col) == (2, 1)


def test_dim_values_are_not_load_time_errors_at_trial_sizes():
    """`zeros(N - 4)` has no size at small trial dims; it is only an error for a real N that small."""
    prog = tgc.loads("x: f32[N]\nreturn x[:N - 4] + zeros((N - 4,))")
    np.testing.assert_array_equal(prog.run(device="PYTHON", x=np.arange(6, dtype=np.float32))["out0"], [0, 1])
    e = source_error("x: f32[N]\nreturn x[:N - 4] + zeros((N - 4,))", {"N": 3})
    assert "negative size" in e.msg and e.line == 2


def test_cli_reports_a_disagreeing_expression_dim_with_exit_2(tmp_path):
    prog = tmp_path / "p.tg"
    prog.write_text("x: f32[N, C]\nw: f32[C, 3 * C]\nreturn x @ w\n")
    np.save(tmp_path / "x.npy", f32(2, 4))
    np.save(tmp_path / "w.npy", f32(4, 10))
    r = subprocess.run([sys.executable, "-m", "tgc.cli.main", "run", str(prog), "-i", f"x={tmp_path / 'x.npy'}",
                        "-i", f"w={tmp_path / 'w.npy'}", "-d", "PYTHON"], capture_output=True, text=True,
                       timeout=120, env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin",
                                         "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert r.returncode == 2, r.stderr
    assert "p.tg:2:11: error: input 'w' axis 1 has size 10, but is declared 3 * C = 12" in r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "tgc.cli.main", "run", str(prog), "--random", "-D", "N=2", "-D", "C=3",
                        "-d", "PYTHON"], capture_output=True, text=True, timeout=120,
                       env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin",
                            "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert r.returncode == 0, r.stderr
    assert "(2, 9)" in r.stdout


def test_cli_random_inputs_take_dims_an_expression_binds(tmp_path):
    """`w: f32[3 * C]` from a file binds C = 4, so the random `x: f32[C]` has 4 elements."""
    prog = tmp_path / "p.tg"
    prog.write_text("w: f32[3 * C]\nx: f32[C]\nreturn sum(w) + x\n")
    np.save(tmp_path / "w.npy", np.ones(12, np.float32))
    r = subprocess.run([sys.executable, "-m", "tgc.cli.main", "run", str(prog), "-i", f"w={tmp_path / 'w.npy'}",
                        "--random", "-d", "PYTHON"], capture_output=True, text=True, timeout=120,
                       env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin",
                            "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert r.returncode == 0, r.stderr
    assert "(4,)" in r.stdout
