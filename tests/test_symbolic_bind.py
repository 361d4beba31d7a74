"""Symbolic sizes bound at launch (issue 21 item 0): a size class's plan is traced, scheduled and lowered once;
binding it to other dims evaluates its size expressions (buffer shapes, kernel `vals`, launch sizes) and calls
neither the front end, the scheduler nor the lowering. Results against numpy on CPU, PYTHON and OPENCL."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import tgc
import tgc.api as api

SRC = "x: f32[N, D]\nw: f32[D, K]\nb: f32[K]\nreturn (x @ w + b).softmax(axis=1), x.sum(axis=0) * 2"


def _want(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = x.astype(np.float64) @ w + b
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True), x.astype(np.float64).sum(axis=0) * 2


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Calls of the front end's trace, the scheduler and the symbolic kernels' lowering, as `tgc.api` makes them."""
    calls = {"trace": 0, "schedule": 0, "lower": 0}

    def counting(key: str, f):
        def wrapped(*a, **k):
            calls[key] += 1
            return f(*a, **k)
        return wrapped

    monkeypatch.setattr(api, "trace", counting("trace", api.trace))
    monkeypatch.setattr(api, "create_schedule", counting("schedule", api.create_schedule))
    monkeypatch.setattr(api, "build_symbolic_kernel", counting("lower", api.build_symbolic_kernel))
    return calls


@pytest.mark.parametrize("device", ["CPU", "PYTHON", "OPENCL"])
def test_binding_other_dims_traces_schedules_and_lowers_nothing(device, counted):
    prog = tgc.loads(SRC)
    rng = np.random.default_rng(7)
    seen = None
    # odd sizes of one class (every dim >= 2, not a multiple of 32), all above the plan's trusted_from
    for n, d, k in [(9, 7, 11), (13, 8, 10), (7, 19, 9)]:
        x, w, b = (rng.standard_normal(s).astype(np.float32) for s in [(n, d), (d, k), (k,)])
        got = prog.run(device=device, symbolic=True, x=x, w=w, b=b)
        assert prog.last_run == "symbolic", prog.last_run
        want0, want1 = _want(x, w, b)
        np.testing.assert_allclose(got["out0"], want0, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(got["out1"], want1, rtol=2e-5, atol=1e-5)
        if seen is None:  # the first run built the class's plan (one trace here: tests/test_symbolic_onetrace.py)
            assert counted["trace"] >= 1 and counted["schedule"] >= 1 and counted["lower"] >= 1
            seen = dict(counted)
        else:
            assert counted == seen, f"binding {n, d, k} called {counted} (after the plan: {seen})"
    plan = prog.compile_symbolic(device)
    assert plan.trusted_from == 6  # the graph's largest plain constant (1) + the offsets' 4 + 1


def test_lower_symbolic_sizes_are_the_dims():
    """The executable's buffers and kernel values are the plan's expressions evaluated at the dims."""
    prog = tgc.loads(SRC)
    for dims in ({"N": 9, "D": 7, "K": 11}, {"N": 21, "D": 8, "K": 5}):
        exe, why = prog.lower_symbolic("CPU", dims)
        assert exe is not None, why
        shapes = {name: tuple(key.arg[2]) for key, name in exe.inputs}
        assert shapes == {"x": (dims["N"], dims["D"]), "w": (dims["D"], dims["K"]), "b": (dims["K"],)}
        outs = {name: tuple(key.arg[2]) for name, key in exe.outputs}
        assert outs == {"out0": (dims["N"], dims["K"]), "out1": (dims["D"],)}
        assert exe.kernels
        for k in exe.kernels:
            assert any(n in dims for n in k.var_names), k.name
            for n, v in zip(k.var_names, k.vals):
                if n in dims:
                    assert v == dims[n], (k.name, n, v)


def test_small_dims_are_checked_with_the_source_once_each(counted):
    """Below trusted_from a slice may clamp: those dims are traced once (then remembered); larger dims never."""
    prog = tgc.loads("x: f32[N]\nreturn x[:5] * 2")
    plan = prog.compile_symbolic("CPU")
    assert plan.trusted_from == 10  # 5 + the offsets' 4 + 1
    base = dict(counted)
    for n in (12, 40, 12):
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(prog.run(device="CPU", symbolic=True, x=x)["out0"], x[:5] * 2)
        assert prog.last_run == "symbolic"
    assert counted["trace"] == base["trace"] and counted["schedule"] == base["schedule"]
    for n in (7, 7, 3):
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(prog.run(device="CPU", symbolic=True, x=x)["out0"], x[:5] * 2)
    assert prog.last_run.startswith("specialized: the program's operations differ")
    # 7 is checked once (symbolic: x[:5] has 5 elements there), 3 once (it clamps, then runs specialized)
    assert set(plan._source_checked) == {(("N", 7),), (("N", 3),)}
    assert plan._source_checked[(("N", 7),)] == ""


def test_equal_dims_below_the_trusted_size_run_the_class_plan():
    """Two dims of the same size merge equal operations of the traced graph (`cast(T)` and `cast(D)` one constant
    at T = D = 3), which the source check read as another graph, "a slice or index that clamps" (a new-user
    trial: llama_block at T = D = 16). The graphs are compared with equal operations merged (`sizes.same_graph`):
    the plan runs there; a slice that does clamp is still refused, saying from where the check is not made."""
    prog = tgc.loads("x: f32[T, D]\nreturn x * cast(T, f32) + cast(D, f32)\n")
    for t, d in ((3, 3), (2, 2), (3, 4), (12, 12)):
        x = np.arange(t * d, dtype=np.float32).reshape(t, d)
        np.testing.assert_array_equal(prog.run(device="CPU", symbolic=True, x=x)["out0"], x * t + d)
        assert prog.last_run == "symbolic", (t, d, prog.last_run)
    prog = tgc.loads("x: f32[T, D]\nreturn x[:5] * cast(T, f32) + cast(D, f32)\n")
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    np.testing.assert_array_equal(prog.run(device="CPU", symbolic=True, x=x)["out0"], x[:5] * 3 + 3)
    assert prog.last_run == "specialized: the program's operations differ at these sizes (a slice or index that " \
        "clamps, or another decision on the sizes); the class's kernels run unchecked where T and D are at least " \
        "10 (here T = 3, D = 3)", prog.last_run


def test_the_memory_plan_is_the_class_layout_sized_at_the_dims():
    """Which buffers share a slot is decided once for the class; each slot is as large as its largest buffer at
    the dims bound, and no slot holds two buffers alive at once (but an in-place pair at its one kernel)."""
    prog = tgc.loads("x: f32[N, D]\nw: f32[D, D]\nh = (x @ w).relu()\ng = (h @ w).exp()\n"
                     "return (g @ w).sum(axis=1), h.max(axis=0)")
    rng = np.random.default_rng(3)
    plan = None
    for n, d in [(9, 13), (17, 7), (40, 11)]:
        exe, why = prog.lower_symbolic("CPU", {"N": n, "D": d})
        assert exe is not None, why
        plan = prog.compile_symbolic("CPU")
        mem = exe.memory_plan()
        assert mem is exe.memory  # given by the size class, not planned by the executable
        assert {name: mem.sizes[key] for key, name in exe.inputs} == {"x": n * d * 4, "w": d * d * 4}
        assert {name: mem.sizes[key] for name, key in exe.outputs} == {"out0": n * 4, "out1": d * 4}
        pairs = {frozenset(p) for p in mem.inplace}
        for key, s in mem.slot_of.items():
            assert mem.sizes[key] == 4 * int(np.prod(key.arg[2])) <= mem.slots[s]
            for other, t in mem.slot_of.items():
                if other is not key and s == t and frozenset((key, other)) not in pairs:
                    (a0, a1), (b0, b1) = mem.lifetimes[key], mem.lifetimes[other]
                    assert a1 < b0 or b1 < a0, (key.arg, other.arg)
        assert mem.peak_bytes == sum(mem.slots) < sum(mem.sizes.values())  # the intermediates share
        x, w = rng.standard_normal((n, d)).astype(np.float32), rng.standard_normal((d, d)).astype(np.float32) / d
        got = prog.run(device="CPU", symbolic=True, x=x, w=w)
        assert prog.last_run == "symbolic"
        h = np.maximum(x.astype(np.float64) @ w, 0)
        np.testing.assert_allclose(got["out0"], (np.exp(h @ w) @ w).sum(axis=1), rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(got["out1"], h.max(axis=0), rtol=2e-5, atol=1e-6)
    # one layout per set of launches (a split's tails are not launched where its split divides): kept
    assert plan is not None and 1 <= len(plan._layouts) <= 3
    layouts = dict(plan._layouts._made)
    for n, d in [(9, 13), (40, 11), (11, 15)]:
        prog.lower_symbolic("CPU", {"N": n, "D": d})
    assert all(plan._layouts._made[k] is v for k, v in layouts.items())


def test_a_fallback_below_the_trusted_size_says_what_the_scheduler_cut():
    """llama_block below its trusted size (8): at B = 2 the scheduler fuses the attention (its head dim a
    constant there), which the size class's plan (the head dim D = 2 * D_2 a dim) computes unfused, so the run
    falls back; the reason says so and from where the class's kernels run unchecked (it said "a slice or index
    that clamps" at T = D = 16, where nothing clamps)."""
    prog = tgc.load(str(pathlib.Path(__file__).resolve().parent.parent / "bench" / "models" / "llama_block.tg"))
    tail = "; the class's kernels run unchecked where B, T, C // D, D // 2 and F are at least 8 (here B = 2)"
    for dims in ({"B": 2, "T": 16, "C": 176, "D": 16, "F": 43}, {"B": 2, "T": 17, "C": 176, "D": 16, "F": 43}):
        exe, why = prog.lower_symbolic("CPU", dims)
        assert exe is None and why == "the scheduler cuts other kernels at these sizes (11 kernels, one a fused " \
            "attention, where the size class has 15 kernels)" + tail, why
    exe, why = prog.lower_symbolic("CPU", {"B": 8, "T": 16, "C": 176, "D": 16, "F": 43})
    assert exe is not None, why
