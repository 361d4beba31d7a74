"""`def` functions and `for i in range(N)` loops (issue 22, item 3): unrolled and inlined when compiling, so a
loop program has the same kernels and the same outputs as the program written out; every error has a span."""

from __future__ import annotations

import math

import numpy as np
import pytest
from langkit import assert_close, run, source_error

import tgc
from tgc.baselines.numpy_eval import numpy_program

LOOPED = """\
x: f32[B, C]
w1: f32[L, C, 2 * C]
b1: f32[L, 2 * C]
w2: f32[L, 2 * C, C]

def block(h, w1, b1, w2):
    return h + gelu(layernorm(h) @ w1 + b1) @ w2

h = x
for i in range(L):
    h = block(h, w1[i], b1[i], w2[i])
return h
"""


def _written_out(layers: int) -> str:
    lines = ["x: f32[B, C]", "w1: f32[L, C, 2 * C]", "b1: f32[L, 2 * C]", "w2: f32[L, 2 * C, C]", "h = x"]
    lines += [f"h = h + gelu(layernorm(h) @ w1[{i}] + b1[{i}]) @ w2[{i}]" for i in range(layers)]
    return "\n".join(lines + ["return h"])


def _gelu(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))


def _model_inputs(layers: int, b: int = 3, c: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"x": rng.standard_normal((b, c)).astype(np.float32),
            "w1": (rng.standard_normal((layers, c, 2 * c)) / np.sqrt(c)).astype(np.float32),
            "b1": rng.standard_normal((layers, 2 * c)).astype(np.float32) * 0.1,
            "w2": (rng.standard_normal((layers, 2 * c, c)) / np.sqrt(2 * c)).astype(np.float32)}


def _numpy_model(inp: dict[str, np.ndarray]) -> np.ndarray:
    h = inp["x"].astype(np.float64)
    for i in range(inp["w1"].shape[0]):
        n = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
        h = h + _gelu(n @ inp["w1"][i] + inp["b1"][i]) @ inp["w2"][i]
    return h


def test_twelve_layer_loop_equals_its_written_out_form():
    inp = _model_inputs(12)
    looped, flat = tgc.loads(LOOPED), tgc.loads(_written_out(12))
    a = looped.run(device="CPU", **inp)["h"]
    b = flat.run(device="CPU", **inp)["h"]
    np.testing.assert_array_equal(a, b)  # the same kernels give the same bits
    assert_close(a, _numpy_model(inp), "f32", scale=np.abs(_numpy_model(inp)).max())
    dims = {"B": 3, "C": 8, "L": 12}
    ka, kb = looped.compile(device="CPU", dims=dims), flat.compile(device="CPU", dims=dims)
    assert len(ka) == len(kb) >= 12
    assert [k.src for k in ka] == [k.src for k in kb]


def test_loop_program_on_every_device(device):
    inp = _model_inputs(3, b=2, c=4)
    out = run(LOOPED, device, **inp)["h"]
    want = _numpy_model(inp)
    assert_close(out, want, "f32", scale=np.abs(want).max())


def test_numpy_baseline_runs_loops_and_functions():
    inp = _model_inputs(4, b=2, c=4)
    got = numpy_program(tgc.loads(LOOPED), {"B": 2, "C": 4, "L": 4})(inp)["h"]
    np.testing.assert_allclose(got, _numpy_model(inp), rtol=1e-4, atol=1e-4)


def test_functions_with_several_returns_and_integer_arguments(device):
    src = """\
x: f32[N]

def scaled(v, times):
    for _ in range(times):
        v = v * 2
    return v, times + 1

def stats(v):
    m = v.mean()
    return m, v - m, v.max()

y, k = scaled(x, 3)
m, centred, top = stats(v=y)
z = y * k
return y, m, centred, top, z
"""
    x = np.array([1.0, -2.0, 3.5, 0.25], np.float32)
    out = run(src, device, x=x)
    np.testing.assert_array_equal(out["y"], x * 8)
    assert out["m"] == pytest.approx(float((x * 8).mean()))
    np.testing.assert_allclose(out["centred"], x * 8 - (x * 8).mean(), rtol=1e-6)
    assert out["top"] == 28.0
    np.testing.assert_array_equal(out["z"], x * 8 * 4)


def test_loops_nest_and_use_start_stop_step(device):
    src = """\
x: i32[N]
acc = x * 0
for i in range(1, 7, 2):
    for j in range(i):
        acc = acc + x * i
acc += N
return acc
"""
    x = np.array([1, 2, 3], np.int32)
    out = run(src, device, x=x)["acc"]
    assert out.tolist() == (x * (1 * 1 + 3 * 3 + 5 * 5) + 3).tolist()


def test_stacked_weights_passed_whole_and_empty_loop(device):
    src = """\
x: f32[C]
w: f32[L, C, C]

def apply_all(h, ws, n):
    for i in range(n):
        h = relu(h @ ws[i])
    return h

return apply_all(x, w, L), apply_all(x, w, 0)
"""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(4).astype(np.float32), rng.standard_normal((3, 4, 4)).astype(np.float32)
    out = run(src, device, x=x, w=w)
    h = x.astype(np.float64)
    for i in range(3):
        h = np.maximum(h @ w[i], 0)
    assert_close(out["out0"], h, "f32", scale=np.abs(h).max())
    np.testing.assert_array_equal(out["out1"], x)


def test_compile_time_conditionals_pick_one_branch():
    src = "x: f32[4]\nfor i in range(3):\n    h = x if i == 0 else h * 2\nreturn h"
    out = tgc.loads(src).run(device="CPU", x=np.ones(4, np.float32))
    assert out["h"].tolist() == [4, 4, 4, 4]


def _err(src: str, dims: dict[str, int] | None = None) -> tuple[str, int | None, int | None, int | None, str | None]:
    e = source_error(src, dims)
    assert e.exit_code == 2 and "Traceback" not in e.format()
    return e.msg, e.line, e.col, e.end_col, e.hint


@pytest.mark.parametrize("src, msg, line, col, end_col", [
    ("x: f32[4]\ndef f(v):\n    return f(v)\nreturn f(x)", "recursion: 'f' calls itself", 3, 12, 15),
    ("x: f32[4]\ndef f(v):\n    return g(v)\ndef g(v):\n    w = v + 1\n    return f(w)\nreturn f(x)",
     "recursion: 'f' calls 'g' calls 'f'", 6, 12, 15),
    ("x: f32[4]\nfor i in range(x.sum()):\n    x2 = x\nreturn x", None, 2, 16, 22),
    ("x: f32[4]\nfor i in range(2.5):\n    y = x\nreturn x", "range() takes integers, not float", 2, 16, 18),
    ("x: f32[4]\nfor i in range(0, 4, 0):\n    y = x\nreturn x", "range() step cannot be zero", 2, 22, 22),
    ("x: f32[4]\nfor v in x:\n    y = v\nreturn x",
     "a for loop runs over range(...): loops are unrolled when compiling", 2, 10, 10),
    ("x: f32[4]\ndef f(a, b):\n    return a + b\nreturn f(x)", "f() takes 2 arguments (a, b), but 1 was given "
     "(missing 'b')", 4, 8, 11),
    ("x: f32[4]\ndef f(a):\n    return a\nreturn f(x, x, 2)", "f() takes 1 argument (a), but 3 were given", 4, 8, 17),
    ("x: f32[4]\ndef f(a):\n    return a\nreturn f(x, c=1)", "f() has no parameter 'c'", 4, 13, 15),
    ("x: f32[4]\ndef f(a):\n    return a, a\ny, z, w = f(x)\nreturn y", "cannot unpack 2 values into 3 names", 4, 1, 7),
    ("x: f32[4]\ny, z = x\nreturn y", "cannot unpack a tensor f32[4] into 2 names", 2, 8, 8),
    ("x: f32[4]\nfor i in range(2):\n    return x\nreturn x", "'return' inside a loop", 3, 5, 12),
    ("x: f32[4]\ndef f(a):\n    def g(b):\n        return b\n    return a\nreturn f(x)",
     "functions are defined at the top level of the file, not inside a function", 3, 5, 13),
    ("x: f32[4]\ndef sum(a):\n    return a\nreturn x", "function 'sum' has the name of a built-in function", 2, 1, 11),
    ("x: f32[4]\ndef f(a):\n    y = a\nreturn f(x)", "function 'f' does not end with 'return'", 3, 5, 9),
    ("x: f32[4]\ndef f(a=1):\n    return a\nreturn f(x)", "parameters take no default values", 2, 9, 9),
    ("x: f32[4]\ndef f(a):\n    return a\ndef f(b):\n    return b\nreturn f(x)", "function 'f' is defined twice",
     4, 1, 9),
    ("x: f32[N]\nfor N in range(2):\n    y = x\nreturn x", "cannot assign to dim 'N'", 2, 5, 5),
    ("x: f32[4]\nfor i in range(2):\n    x = x + 1\nreturn x", "cannot assign to input 'x'", 3, 5, 5),
    ("x: f32[4]\ny = range(3)\nreturn x", "range() is only for loops", 2, 5, 9),
    ("x: f32[4]\ndef f(a):\n    return a + qq\nreturn f(x)", "unknown name 'qq'", 3, 16, 17),
])
def test_function_and_loop_errors_have_spans(src, msg, line, col, end_col):
    got_msg, got_line, got_col, got_end, hint = _err(src)
    if msg is None:  # the data-dependent loop bound
        assert got_msg.startswith("a loop bound must be an integer known when compiling, not a tensor")
        assert "data-dependent loops are not supported" in hint
    else:
        assert got_msg == msg
    assert (got_line, got_col, got_end) == (line, col, end_col)


def test_a_loop_too_long_to_unroll_is_refused():
    msg, line, *_ = _err("x: f32[4]\nfor i in range(1000000):\n    x2 = x\nreturn x")
    assert msg.startswith("the program runs more than 200000 statements once its loops are unrolled") and line == 3
