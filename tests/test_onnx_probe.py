"""The type of a value ONNX gave no type (`tgc.onnx.translate._probe`): the program so far is traced once, as it
grows (`tgc.dsl.frontend.trace_onto`), and each probe gives the same dtype and shape a trace of the whole program
would; errors name the node, and a failed probe leaves the traced state usable."""

from __future__ import annotations

import pytest

from tgc.dsl.frontend import parse, trace, trace_onto
from tgc.dtype import dtypes
from tgc.errors import TgcError
from tgc.ir.shapes import shape_of
from tgc.onnx.core import Ctx
from tgc.onnx.translate import _probe


def test_trace_onto_continues_a_program():
    env: dict = {}
    buffers: list = []
    first = parse("x: f32[2, 3]\na = x + 1.0\nreturn a\n")
    (a,) = trace_onto(first, env, buffers)
    assert (a.uop.dtype, shape_of(a.uop)) == (dtypes.f32, (2, 3))
    # the second part reads `a` from the first and declares one more input
    second = parse("w: f32[3, 4]\nb = a @ w\nreturn b.sum(axis=0), 3\n")
    b, three = trace_onto(second, env, buffers)
    assert shape_of(b.uop) == (4,) and shape_of(three.uop) == ()
    assert [u.arg[:2] for u in buffers] == [(0, "x"), (1, "w")]
    # the same as tracing the whole program at once
    whole, _ = trace(parse("x: f32[2, 3]\nw: f32[3, 4]\na = x + 1.0\nb = a @ w\nreturn b.sum(axis=0)\n"), {})
    assert whole[0] is b.uop


def test_probe_traces_only_new_lines_and_survives_errors():
    cx = Ctx(17, {}, {})
    cx.decls.append("x: f32[2, 3]")
    cx.lines.append("t = x.sum(axis=1)")
    assert _probe(cx, "t * 2.0", "y") == (dtypes.f32, (2,))
    assert cx.traced_upto == (1, 1)
    cx.decls.append("k: i32[3, 5]")
    cx.lines.append("u = x @ k.cast(f32)")
    assert _probe(cx, "u > 0.0", "z") == (dtypes.bool, (2, 5))
    assert "u" in cx.traced and "probe_value_" not in cx.traced
    with pytest.raises(TgcError, match="cannot translate the graph: cannot broadcast"):
        _probe(cx, "u + x", "bad")  # (2, 5) and (2, 3) do not broadcast
    cx.lines.append("v = u.reshape((10,))")
    assert _probe(cx, "v", "ok") == (dtypes.f32, (10,))


def test_probe_refuses_symbolic_dims():
    cx = Ctx(17, {}, {"batch": "B"})
    cx.decls.append("x: f32[B]")
    with pytest.raises(TgcError, match="type of 'y' .* is unknown"):
        _probe(cx, "x + 1.0", "y")
