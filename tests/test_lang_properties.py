"""Property tests (hypothesis) of the `.tg` language against numpy: broadcasting binary ops on random shapes,
reductions over random axes, and random basic indexing."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
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


# --- random programs: chains of movement ops (pad, slices with steps, flip, permute, reshape, expand, cat) mixed
# with elementwise ops, reductions and matmuls. Values are small integers, so every result is exact in f32 too.
# Run under the bounds verifier (tests/conftest.py), each program also checks that no kernel reads or writes
# outside a buffer: padding and slices make the gated loads whose gates fold in odd ways.

MAX_ELEMENTS = 2048


def _shape_str(shape) -> str:
    return "(" + "".join(f"{s}, " for s in shape) + ")"


@st.composite
def _step(draw, shape: tuple[int, ...]):
    """One random operation on a value of `shape`: (DSL text with `{}` for the value, numpy function, new shape)."""
    n = len(shape)
    kinds = ["pad", "pad", "slice", "crop", "crop", "flip", "reshape", "unary", "combine", "cat"]
    if n >= 2:
        kinds += ["permute", "reduce"]
    if n == 2:
        kinds += ["matmul"]
    if n <= 2:
        kinds += ["expand"]
    if n == 1:
        kinds += ["reduce"]
    kind = draw(st.sampled_from(kinds))
    if kind == "pad":
        pads = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in shape)
        value = draw(st.integers(-3, 3))
        new = tuple(s + a + b for s, (a, b) in zip(shape, pads))
        return (f"pad({{}}, {_shape_str(_shape_str(p) for p in pads)}, value={value})",
                lambda v: np.pad(v, pads, constant_values=value), new)
    if kind == "slice":
        items = []
        for s in shape:
            step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
            start, stop = draw(st.integers(-s - 2, s + 2)), draw(st.integers(-s - 2, s + 2))
            items.append(slice(start, stop, step))
        text = ", ".join(f"{sl.start}:{sl.stop}:{sl.step}" for sl in items)
        new = np.empty(shape)[tuple(items)].shape
        return f"{{}}[{text}]", lambda v: v[tuple(items)], new
    if kind == "crop":  # a window anywhere, often one that only padding covers
        starts = [draw(st.integers(0, s - 1)) for s in shape]
        stops = [draw(st.integers(a + 1, s)) for a, s in zip(starts, shape)]
        items = tuple(slice(a, b) for a, b in zip(starts, stops))
        text = ", ".join(f"{a}:{b}" for a, b in zip(starts, stops))
        return f"{{}}[{text}]", lambda v: v[items], tuple(b - a for a, b in zip(starts, stops))
    if kind == "flip":
        axis = draw(st.integers(0, n - 1))
        return f"flip({{}}, {axis})", lambda v: np.flip(v, axis), shape
    if kind == "permute":
        order = tuple(draw(st.permutations(range(n))))
        return f"permute({{}}, {_shape_str(order)})", lambda v: v.transpose(order), tuple(shape[i] for i in order)
    if kind == "reshape":
        total = int(np.prod(shape))
        first = draw(st.sampled_from([d for d in range(1, total + 1) if total % d == 0] or [1]))
        new = (first, -1) if draw(st.booleans()) else (total,)
        out = np.empty(shape).reshape(new).shape
        return f"reshape({{}}, {_shape_str(new)})", lambda v: v.reshape(new), out
    if kind == "expand":
        k = draw(st.integers(1, 3))
        return (f"expand(unsqueeze({{}}, 0), {_shape_str((k, *shape))})",
                lambda v: np.broadcast_to(v[None], (k, *shape)), (k, *shape))
    if kind == "unary":
        text, fn = draw(st.sampled_from([("{} + 1", lambda v: v + 1), ("-{}", lambda v: -v),
                                         ("maximum({}, 0)", lambda v: np.maximum(v, 0)),
                                         ("where({} < 1, 2, {})", None)]))
        if fn is None:
            return "where({0} < 1, 2, {0})", lambda v: np.where(v < 1, 2, v), shape
        return text, fn, shape
    if kind == "combine":  # the value with a flipped copy of itself: two different index maps of one buffer
        axis = draw(st.integers(0, n - 1))
        return "({0} - flip({0}, " + str(axis) + "))", lambda v: v - np.flip(v, axis), shape
    if kind == "cat":
        axis = draw(st.integers(0, n - 1))
        new = tuple(s * 2 if i == axis else s for i, s in enumerate(shape))
        return ("cat({0}, {0} * 2, axis=" + str(axis) + ")",
                lambda v: np.concatenate([v, v * 2], axis), new)
    if kind == "reduce":
        axis = draw(st.integers(0, n - 1))
        fn = draw(st.sampled_from(["sum", "max"]))
        keep = draw(st.booleans())
        new = tuple(1 if i == axis else s for i, s in enumerate(shape) if keep or i != axis)
        return (f"{fn}({{}}, axis={axis}, keepdim={keep})",
                lambda v: getattr(np, fn)(v, axis=axis, keepdims=keep), new)
    # matmul with its own transpose, padded: the shape that made PYTHON fail ("range used outside its loop")
    p = draw(st.integers(0, 7))
    return (f"(pad({{0}}, ((0, {p}), (0, {p}))) @ permute(pad({{0}}, ((0, {p}), (0, {p}))), (1, 0)))",
            lambda v: np.pad(v, ((0, p), (0, p))) @ np.pad(v, ((0, p), (0, p))).T, (shape[0] + p, shape[0] + p))


@st.composite
def random_program(draw):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    lines, fns, cur = [], [], shape
    for _ in range(draw(st.integers(1, 5))):
        text, fn, new = draw(_step(cur))
        if not new or 0 in new or int(np.prod(new)) > MAX_ELEMENTS or len(new) > 4:
            continue
        prev = "x" if not lines else f"t{len(lines) - 1}"
        lines.append(f"t{len(lines)} = " + text.format(prev))
        fns.append(fn)
        cur = new
    return shape, lines, fns


@settings(max_examples=50, deadline=None, database=None)
@given(prog=random_program(), dt=st.sampled_from(["f32", "i32"]), seed=st.integers(0, 2**16))
def test_random_programs_match_numpy(device, prog, dt, seed):
    shape, lines, fns = prog
    x = np.random.default_rng(seed).integers(-3, 4, shape).astype(np.float32 if dt == "f32" else np.int32)
    last = f"t{len(lines) - 1}" if lines else "x + 0"
    src = "\n".join([_decl("x", dt, shape), *lines, f"return {last}"])
    want = x.astype(np.int64)
    for fn in fns:
        want = fn(want)
        assume(want.size == 0 or np.abs(want).max() < 2**22)  # exact in f32, no i32 wrap-around
    out = run1(src, device, x=x)
    assert_exact(out, np.asarray(want), dt)
