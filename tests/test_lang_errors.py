"""Errors in `.tg` programs: each error class of DSL.md, with its exact line, column and span, and the
clang-style `format()` with carets. Nothing here needs a device: errors come before any kernel runs."""

from __future__ import annotations

import pytest
from langkit import source_error

import tgc


def _where(e: tgc.TgcError) -> tuple[int | None, int | None]:
    return e.line, e.col


@pytest.mark.parametrize("src, line, col", [
    ("x: f32[4]\ny = x +\nreturn y", 2, 8),
    ("x: f32[4]\nreturn x +* 2", 2, 11),
    ("x: f32[4]\n  y = x\nreturn y", 2, 3),
    ("x: f32[4]\ny = (x\nreturn y", 2, 5),
    ("x: f32[4]\nreturn x $ 2", 2, 10),
])
def test_syntax_errors(src, line, col):
    e = source_error(src)
    assert e.msg.startswith("syntax error")
    assert e.line == line
    assert abs(e.col - col) <= 1  # Python's parser places some carets one column apart across versions


@pytest.mark.parametrize("src, line, col, end_col, name", [
    ("x: f32[4]\nreturn x + z", 2, 12, 12, "z"),
    ("x: f32[4]\ny = x\nw = exp(y * undefined_thing)\nreturn w", 3, 13, 27, "undefined_thing"),
    ("x: f32[4]\nreturn xx", 2, 8, 9, "xx"),
])
def test_unknown_names(src, line, col, end_col, name):
    e = source_error(src)
    assert (e.line, e.col, e.end_col) == (line, col, end_col)
    assert f"'{name}'" in e.msg and "unknown name" in e.msg


def test_unknown_name_suggests_a_close_one():
    e = source_error("value: f32[4]\nreturn valeu + 1")
    assert e.hint is not None and "value" in e.hint


@pytest.mark.parametrize("src, line, col, name", [
    ("x: f32[4]\nreturn foo(x)", 2, 8, "foo"),
    ("x: f32[4]\ny = 1 + expp(x)\nreturn y", 2, 9, "expp"),
    ("x: f32[4]\nreturn x.foo()", 2, 8, "foo"),
])
def test_unknown_functions(src, line, col, name):
    e = source_error(src)
    assert _where(e) == (line, col)
    assert f"'{name}'" in e.msg and ("function" in e.msg or "method" in e.msg)


@pytest.mark.parametrize("src, want", [
    ("x: f32[4]\nreturn concat(x, x)", "cat"), ("x: f32[4]\nreturn concatenate(x, x, axis=0)", "cat"),
    ("x: f32[4]\nreturn x.concat(x)", "cat"), ("x: f32[2, 3]\nreturn x.amax(axis=1)", "max"),
    ("x: f32[2, 3]\nreturn swapaxes(x, 0, 1)", "transpose"), ("x: f32[4]\nreturn x.view(2, 2)", "reshape"),
])
def test_other_libraries_names_suggest_the_languages(src, want):
    """numpy's and PyTorch's names for a function get a did-you-mean of the language's own (not an alias)."""
    e = source_error(src)
    assert "unknown" in e.msg and e.hint == f"did you mean '{want}'?", (e.msg, e.hint)


@pytest.mark.parametrize("src, line, col, word", [
    ("x: f32[4]\nif x:\n    y = x\nreturn x", 2, 1, "if"),
    ("x: f32[4]\nasync def f(v):\n    return v\nreturn x", 2, 1, "function"),
    ("x: f32[4]\nwhile x:\n    y = x\nreturn x", 2, 1, "while"),
    ("x: f32[4]\nf = lambda v: v\nreturn x", 2, 5, "lambda"),
    ("import numpy\nx: f32[4]\nreturn x", 1, 1, "import"),
    ("from math import pi\nx: f32[4]\nreturn x", 1, 1, "import"),
    ("x: f32[4]\nreturn 'abc'", 2, 8, "string"),
    ("x: f32[4]\ny = x + len(\"s\")\nreturn y", 2, 13, "string"),
    ("x: f32[4]\nreturn [v for v in x]", 2, 8, "comprehension"),
    ("x: f32[4]\ny = sum(v for v in x)\nreturn y", 2, 8, "generator"),  # the call's parentheses
    ("x: f32[4]\nreturn {1: x}", 2, 8, "dict"),
    ("x: f32[4]\nfor i in range(2):\n    while x:\n        y = x\nreturn x", 3, 5, "while"),
    ("x: f32[4]\ny = x and x\nreturn y", 2, 5, "and"),
    ("x: f32[4]\nreturn not x", 2, 8, "not"),
    ("x: f32[4]\nreturn (y := x)", 2, 9, "walrus"),
    ("x: f32[4]\nwith x:\n    y = x\nreturn x", 2, 1, "with"),
    ("x: f32[4]\nreturn f'{x}'", 2, 8, "f-string"),
    ("class A:\n    pass\nx: f32[4]\nreturn x", 1, 1, "class"),
])
def test_unsupported_constructs_are_named(src, line, col, word):
    e = source_error(src)
    assert _where(e) == (line, col)
    assert word in e.msg and "not part of the .tg language" in e.msg


def test_no_return():
    e = source_error("x: f32[4]\ny = x * 2")
    assert "return" in e.msg and e.line == 2
    e = source_error("x: f32[4]\nreturn")
    assert "return" in e.msg and _where(e) == (2, 1)


def test_statements_after_return():
    e = source_error("x: f32[4]\nreturn x\ny = x + 1")
    assert "after 'return'" in e.msg and _where(e) == (3, 1)
    e = source_error("x: f32[4]\nreturn x\nreturn x")
    assert _where(e) == (3, 1)


@pytest.mark.parametrize("src, col, name", [
    ("x: f32[4]\ny = x\nreturn y, y", 11, "y"),
    ("x: f32[4]\ny = x\nreturn y, x + 1, y", 18, "y"),
    ("x: f32[4]\nreturn x, x", 11, "x"),
])
def test_duplicate_output_names(src, col, name):
    e = source_error(src)
    assert (e.line, e.col) == (src.count("\n") + 1, col)
    assert f"'{name}'" in e.msg


@pytest.mark.parametrize("src, line, col", [
    ("x: f32[4]\nx = x + 1\nreturn x", 2, 1),
    ("x: f32[4]\ny = x\nx += 1\nreturn y", 3, 1),
])
def test_reassigning_an_input(src, line, col):
    e = source_error(src)
    assert _where(e) == (line, col) and "'x'" in e.msg


def test_input_declarations():
    assert _where(source_error("x: f32[4]\nx: f32[4]\nreturn x")) == (2, 1)
    e = source_error("x: f32[4]\ny = x\nz: f32[3]\nreturn z")
    assert _where(e) == (3, 1) and "before" in e.msg
    assert _where(source_error("x: f32[-1]\nreturn x")) == (1, 8)
    assert _where(source_error("x: f32[1.5]\nreturn x")) == (1, 8)
    assert _where(source_error("x: f32[4] = 3\nreturn x")) == (1, 1)


def test_broadcast_error_deep_inside_an_expression_has_the_caret_span():
    src = "x: f32[4096, 2]\nm: f32[4096, 3]\ne = exp(x - m)\nreturn e"
    e = source_error(src)
    assert (e.line, e.col, e.end_col) == (3, 9, 13)
    assert e.msg == "cannot broadcast f32[4096, 2] with f32[4096, 3]"
    text = e.format()
    lines = text.splitlines()
    assert lines[0].endswith(":3:9: error: cannot broadcast f32[4096, 2] with f32[4096, 3]")
    assert lines[1].strip() == "e = exp(x - m)"
    caret = lines[2]
    assert caret.strip() == "^~~~~"
    assert caret.index("^") - lines[1].index("e = ") == 8  # under column 9 of the source line


def test_broadcast_error_in_a_nested_call_points_at_the_failing_operation():
    src = ("x: f32[N, 2]\nm: f32[N, 3]\n"
           "y = 2 * exp(sum(x, 1, keepdim=True) + (x * 3 - m)) + 1\nreturn y")
    e = source_error(src, dims={"N": 4})
    assert (e.line, e.col, e.end_col) == (3, 40, 48)  # x * 3 - m
    assert "f32[4, 2]" in e.msg and "f32[4, 3]" in e.msg


def test_error_format_names_the_file():
    try:
        tgc.loads("x: f32[4]\nreturn foo(x)", filename="prog.tg")
    except tgc.TgcError as e:
        assert e.format().startswith("prog.tg:2:8: error: unknown function 'foo'")
        assert "^~~" in e.format()
        assert e.exit_code == 2
    else:
        raise AssertionError("no error")


@pytest.mark.parametrize("src, line, col, words", [
    ("x: f32[N]\nreturn ~x", 2, 8, ["f32"]),
    ("x: f32[N]\nreturn x << 1", 2, 8, ["f32"]),
    ("x: f32[N]\ny: i32[N]\nreturn y & x", 3, 8, ["f32"]),
    ("x: bool[N]\nreturn -x", 2, 8, ["bool"]),
    ("x: bool[N]\nreturn x - x", 2, 8, ["bool"]),
    ("x: f32[N]\nreturn bitcast(x, f16)", 2, 8, ["f32", "f16"]),
    ("x: i64[N]\ny: u64[N]\nreturn where(x > 0, x, y)", 3, 8, ["i64", "u64"]),
    ("x: i64[N]\ny: u64[N]\nz = x\nreturn maximum(z * 2, y)", 4, 8, ["i64", "u64"]),
    ("x: f32[N]\nreturn cast(x, 3)", 2, 8, ["dtype"]),
    ("x: i32[N]\nreturn x ** -1", 2, 8, ["negative"]),
])
def test_dtype_errors(src, line, col, words):
    e = source_error(src, dims={"N": 3})
    assert _where(e) == (line, col)
    for w in words:
        assert w in e.msg, (w, e.msg)


@pytest.mark.parametrize("src, line, col, end_col", [
    ("x: f32[4, 3]\nreturn sum(x, 2)", 2, 8, 16),
    ("x: f32[4, 3]\nreturn x.max(axis=-3)", 2, 8, 21),
    ("x: f32[4, 3]\nreturn reshape(x, (5,))", 2, 8, 23),
    ("x: f32[4, 3]\nreturn reshape(x, (-1, -1))", 2, 8, 27),
    ("x: f32[4, 3]\nreturn x @ x", 2, 8, 12),
    ("x: f32[4, 3]\nreturn permute(x, (0, 0))", 2, 8, 25),
    ("x: f32[4, 3]\nreturn expand(x, (2, 3))", 2, 8, 24),
    ("x: f32[4, 3]\nreturn squeeze(x, 0)", 2, 8, 20),
    ("x: f32[4, 3]\nreturn cat(x, x[:, :2])", 2, 8, 23),
    ("x: f32[4, 3]\nreturn pad(x, ((1, 1),))", 2, 8, 24),
    ("x: f32[4, 3]\nreturn x[4]", 2, 8, 11),
    ("x: f32[4, 3]\nreturn x[0, -4]", 2, 8, 15),
    ("x: f32[4, 3]\nreturn x[1, 2, 3]", 2, 8, 17),
    ("x: f32[4, 3]\nreturn x[::0]", 2, 12, 12),
    ("x: f32[4, 3]\nreturn x[..., ...]", 2, 8, 18),
    ("x: f32[4, 3]\nreturn 1 < x < 2", 2, 8, 16),
    ("x: f32[4, 3]\nreturn sum(x, foo=1)", 2, 8, 20),
    ("x: f32[4, 3]\nreturn x.exp(1)", 2, 8, 15),
    ("x: f32[4, 3]\nreturn exp", 2, 8, 10),
    ("x: f32[4, 3]\nreturn x.shape", 2, 8, 14),
    ("x: f32[4, 3]\nreturn x.nope", 2, 8, 13),
    ("x: f32[4, 3]\nreturn x.zeros(3)", 2, 8, 14),
    ("x: f32[4, 3]\nreturn zeros(x.shape, dtype=x)", 2, 8, 30),
    ("x: f32[4, 0]\nreturn x.max(1)", 2, 8, 15),
])
def test_shape_and_argument_errors(src, line, col, end_col):
    e = source_error(src)
    assert (e.line, e.col, e.end_col) == (line, col, end_col), e.format()


def test_runtime_errors_never_look_like_python_tracebacks():
    e = source_error("x: f32[4]\nreturn x.sum(axis=(0, 0))")
    assert "Traceback" not in e.format() and e.line == 2
