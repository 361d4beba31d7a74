"""Property tests (hypothesis) of the `.tg` language against numpy: broadcasting binary ops on random shapes,
reductions over random axes, and random basic indexing."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from langkit import assert_close, assert_exact, assert_result, run1

SETTINGS = settings(max_examples=25, deadline=None, database=None)


@st.composite
def broadcast_pair(draw):
    """Two shapes that broadcast together, and the result shape."""
    out = draw(st.lists(st.integers(1, 4), min_size=0, max_size=4))
    shapes = []
    for _ in range(2):
        drop = draw(st.integers(0, len(out)))
        shapes.append(tuple(1 if draw(st.booleans()) else s for s in out[drop:]))
    return shapes[0], shapes[1]


BINARY = {
    "a + b": np.add, "a - b": np.subtract, "a * b": np.multiply, "maximum(a, b)": np.maximum,
    "where(a < b, a, b)": lambda a, b: np.where(a < b, a, b), "a // b": None, "a % b": None,
}


def _decl(name: str, dt: str, shape: tuple[int, ...]) -> str:
    return f"{name}: {dt}[{', '.join(map(str, shape))}]" if shape else f"{name}: {dt}"


@SETTINGS
@given(shapes=broadcast_pair(), expr=st.sampled_from(sorted(BINARY)), dt=st.sampled_from(["f32", "i32", "i8"]),
       seed=st.integers(0, 2**16))
def test_broadcasting_binary_ops(device, shapes, expr, dt, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes
    if dt == "f32":
        a = rng.uniform(-4, 4, sa).astype(np.float32)
        b = (rng.uniform(0.5, 4, sb) * rng.choice([-1, 1], sb)).astype(np.float32)
    else:
        a = rng.integers(-50, 50, sa).astype(dt.replace("i", "int"))
        b = rng.integers(-9, 9, sb).astype(dt.replace("i", "int"))
    out = run1(f"{_decl('a', dt, sa)}\n{_decl('b', dt, sb)}\nreturn {expr}", device, a=a, b=b)
    x, y = a.astype(np.float64), b.astype(np.float64)
    if expr == "a // b":
        want = np.floor(x / y) if dt == "f32" else np.where(y == 0, 0, np.floor_divide(x, np.where(y == 0, 1, y)))
    elif expr == "a % b":
        want = np.mod(x, y) if dt == "f32" else np.where(y == 0, 0, np.mod(x, np.where(y == 0, 1, y)))
    else:
        want = BINARY[expr](x, y)
    if dt == "i8":
        want = want.astype(np.int64).astype(np.int8)  # products wrap
    assert_result(out, want, dt, scale=np.abs(x) + np.abs(y) if dt == "f32" else 1.0)


@st.composite
def reduction_case(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    n = len(shape)
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        axis = None
    elif kind == "int":
        axis = draw(st.integers(-n, n - 1))
    else:
        chosen = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
        axis = tuple(a - n if draw(st.booleans()) else a for a in chosen)
    return shape, axis, draw(st.booleans())


@SETTINGS
@given(case=reduction_case(), fn=st.sampled_from(["sum", "max", "min", "mean", "prod"]),
       dt=st.sampled_from(["f32", "i32"]), seed=st.integers(0, 2**16))
def test_reductions_over_random_axes(device, case, fn, dt, seed):
    shape, axis, keepdim = case
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.8, 1.25, shape) * rng.choice([-1, 1], shape)  # products stay finite in f32
    x = x.astype(np.float32) if dt == "f32" else rng.integers(-5, 6, shape).astype(np.int32)
    out = run1(f"{_decl('x', dt, shape)}\nreturn {fn}(x, axis={axis}, keepdim={keepdim})", device, x=x)
    v = x.astype(np.float64)
    want = getattr(np, fn)(v, axis=axis, keepdims=keepdim)
    if dt == "i32" and fn != "mean":  # int64 arithmetic wraps like i32, modulo 2**32
        want = getattr(np, fn)(x.astype(np.int64), axis=axis, keepdims=keepdim)
        assert_exact(out, want.astype(np.int32), "i32")
    else:
        mag = getattr(np, fn if fn in ("mean", "prod") else "sum")(np.abs(v), axis=axis, keepdims=keepdim)
        assert_close(out, want, "f32", scale=mag)


@st.composite
def basic_index(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    items = []
    for size in shape:
        kind = draw(st.sampled_from(["slice", "int", "all"]))
        if kind == "int":
            items.append(str(draw(st.integers(-size, size - 1))))
        elif kind == "slice":
            parts = [draw(st.one_of(st.none(), st.integers(-7, 7))) for _ in range(2)]
            step = draw(st.one_of(st.none(), st.integers(-3, 3).filter(bool)))
            items.append(":".join("" if p is None else str(p) for p in [*parts, step]))
        else:
            items.append(":")
    if draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), "None")
    return shape, ", ".join(items)


@SETTINGS
@given(case=basic_index())
def test_random_basic_indexing(device, case):
    shape, index = case
    y = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    out = run1(f"{_decl('y', 'i32', shape)}\nreturn y[{index}] + 0", device, y=y)
    assert_exact(out, eval(f"y[{index}]", {"y": y}), "i32")
