"""Dims as front-end size variables (`tgc.ir.symsize.SymSize`): a size class found by ONE trace and one schedule
(`Program._build_one_trace`) instead of the probes' three, with the same kernels (the same AST nodes, sources,
fast variants, buffers and graph signature) as the probe path and the same results as numpy at sizes of 1, odd
and large, in classes n and 32n; programs outside the rule (a loop over a dim, a floor division of a dim in a
product of sizes of a 32n class, a remainder) keep the probes and say why."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import tgc
import tgc.api as api
from tgc.baselines.numpy_eval import numpy_program
from tgc.codegen import sizes
from tgc.dtype import dtypes
from tgc.engine.compare import compare
from tgc.engine.inputs import random_inputs
from tgc.ir.symsize import (
    NotTraceable,
    SymFloat,
    SymSize,
    answering_at,
    checked_at,
    decided_across,
    decided_by_remainder,
    decided_from,
    decided_upto,
    recording,
)
from tgc.ir.uop import Ops, UOp

KERNELS = pathlib.Path(__file__).resolve().parent.parent / "kernels"
P = {"N": 211, "D": 223}
Q = {"N": 223, "D": 211}


def _counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times the front end traced and the scheduler ran (patched where tgc.api calls them)."""
    counts = {"trace": 0, "schedule": 0}
    trace, schedule = api.trace, api.create_schedule

    def counted_trace(*a, **k):
        counts["trace"] += 1
        return trace(*a, **k)

    def counted_schedule(*a, **k):
        counts["schedule"] += 1
        return schedule(*a, **k)

    monkeypatch.setattr(api, "trace", counted_trace)
    monkeypatch.setattr(api, "create_schedule", counted_schedule)
    return counts


def _check(prog: tgc.Program, got: dict, dims: dict, inputs: dict) -> None:
    want = numpy_program(prog, dims)(inputs)
    for name in prog.output_names:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        assert g.shape == w.shape, (dims, name)
        bad, _ = compare(name, g, w, "f32")
        assert bad is None, f"{dims}: {bad.describe()}"


def _src(k) -> str | None:
    return None if k is None else k.src


def test_sizes_are_polynomials_of_the_dims():
    n, d = SymSize.dim("N", 211), SymSize.dim("D", 223)
    assert (n * d).mono == (1, ("D", "N"), 0, 1) and str(3 * n) == "3N" and f"r_{n}_{d}" == "r_N_D"
    assert (n * d) // d == n and (2 * n + 4) // 2 == n + 2 and (n * d) % d == 0 and (3 * n + 5) % 3 == 2
    assert str((n - 1) * d) == "DN-D" and n - n == 0 and type(n - n) is int
    assert n != 212 and hash(n) != hash(211) and {n: 1}.get(211) is None  # never merged with a literal
    assert n > 1 and n != 1 and not n == 0 and n * d > n
    assert type(1.0 / n) is float  # Python asks float's division first: the front end writes n.__rtruediv__(1.0)
    recip = n.__rtruediv__(1.0)
    assert isinstance(recip, SymFloat) and recip.kind == "recip" and recip.mono == n.mono
    assert n % 32  # a dim of class n is no multiple of 32
    with checked_at((P, Q)):
        assert n * d > 2 * d and n + 1 > n
        for refused in (lambda: n < d, lambda: (n * n) // 2, lambda: n % 7 == 3, lambda: n == 211, lambda: int(n),
                        lambda: float(n), lambda: n / 2, lambda: n ** 2, lambda: recip * 2.0):
            with pytest.raises(NotTraceable):
                refused()


def test_a_lost_size_is_seen():
    """A plain constant that is a size at the traced sizes (a dim read as a raw number) refuses the one trace."""
    def ast(v) -> UOp:
        return UOp(Ops.SINK, None, (UOp.const(dtypes.f32, v),))

    for lost in (211.0, 0.5 * 211, 1.0 / 211, 2.0 / (211 * 223), 3 * 223 - 1):
        assert sizes.lost_sizes(ast(lost), P, ["N", "D"]) is not None, lost
    for kept in (17.0, 0.5, 1e-5, 3.14159):
        assert sizes.lost_sizes(ast(kept), P, ["N", "D"]) is None, kept


@pytest.mark.parametrize("name", ["elementwise.tg", "softmax.tg", "matmul.tg", "layernorm.tg"])
def test_traced_once_same_kernels_and_results_as_the_probes(name, device, monkeypatch):
    if device.upper().startswith("REMOTE"):
        pytest.skip("kernels with symbolic sizes are not built for REMOTE devices (a server checks each launch "
                    "against the sizes its kernel was compiled for)")
    prog = tgc.load(KERNELS / name)  # (loading checks the program once at small sizes: not counted)
    probed = tgc.load(KERNELS / name)
    probed.one_trace = False
    counts = _counted(monkeypatch)
    plan = prog.compile_symbolic(device)
    assert list(prog.symbolic_paths.values()) == ["one trace"]
    assert counts == {"trace": 1, "schedule": 1}

    counts.update(trace=0, schedule=0)
    other = probed.compile_symbolic(device)
    assert counts["trace"] == 4  # the two probes, the representative size and the front end's size decisions
    assert list(probed.symbolic_paths.values())[0].startswith("probes")

    assert all(a is b for a, b in zip(plan.asts, other.asts)) and len(plan.asts) == len(other.asts)
    assert [k.name for k in plan.kernels] == [k.name for k in other.kernels]
    assert [k.src for k in plan.kernels] == [k.src for k in other.kernels]
    assert [_src(k) for k in plan.fast] == [_src(k) for k in other.fast]
    assert [_src(k) for k in plan.unthreaded] == [_src(k) for k in other.unthreaded]
    assert [[k.src for k in t] for t in plan.tails] == [[k.src for k in t] for t in other.tails]
    assert plan.derived.keys() == other.derived.keys()
    assert plan.signature == other.signature and plan.trusted_from == other.trusted_from
    assert [(s.dtype, s.shape, s.input) for s in plan.slots] == [(s.dtype, s.shape, s.input) for s in other.slots]
    assert plan.kernel_slots == other.kernel_slots and plan.input_shapes == other.input_shapes
    assert plan.shapes == other.shapes
    # another class of the same Program (a dim of 1: the others traced at other probe sizes) is its own trace,
    # never nodes of the first one's (kernels' launch contracts state the buffer sizes at the probes)
    ones = ((prog.dim_names[0], "1"),) + tuple((n, "n") for n in prog.dim_names[1:])
    if len(ones) > 1:
        assert [k.src for k in prog.compile_symbolic(device, size_class=ones).kernels] == \
            [k.src for k in probed.compile_symbolic(device, size_class=ones).kernels]
        assert prog.symbolic_paths[(plan.device.name, ones)] == "one trace"

    # results at sizes of 1, odd and large (above the trusted size) against numpy
    for size in (1, 7, 97):
        dims = {n: (size if i % 2 == 0 else 9) if size == 1 else size + i for i, n in enumerate(prog.dim_names)}
        inputs = random_inputs(prog, dims, seed=5)
        got = prog.run(device=device, symbolic=True, **inputs)
        if min(dims.values()) >= plan.trusted_from or size == 1:  # (below it the source may cut other kernels)
            assert prog.last_run == "symbolic", (dims, prog.last_run)
        _check(prog, got, dims, inputs)


@pytest.mark.parametrize("source, why", [
    ("x: f32[N]\ny = x\nfor i in range(N):\n    y = y + 1.0\nreturn y", "a loop runs over a dim"),
    # N // 2 is a variable of its own (`symsize.atom`), but the length N - N//2 is 1 at N = 2 and 3, which the
    # scheduler's `> 1` decision meets: a decision on a dim and its floor division that does not hold at every
    # size is refused (`x[: N // 2]`, whose clamp `N//2 < N` holds everywhere, traces once)
    ("x: f32[N]\nreturn x[N // 2:] * 2.0", "a remainder of a dim"),
])
def test_programs_outside_the_rule_keep_the_probes(source, why):
    prog = tgc.loads(source)
    for n in (3, 8):
        inputs = {"x": np.arange(n, dtype=np.float32)}
        got = prog.run(device="CPU", symbolic=True, **inputs)
        _check(prog, got, {"N": n}, inputs)
    (path,) = prog.symbolic_paths.values()
    assert path.startswith("probes") and why in path


@pytest.mark.parametrize("name, runs", [
    ("elementwise.tg", [{"N": 32}, {"N": 96}, {"N": 320}]),
    ("softmax.tg", [{"N": 32, "D": 32}, {"N": 64, "D": 96}, {"N": 320, "D": 32}, {"N": 7, "D": 64}]),
    ("layernorm.tg", [{"N": 32, "D": 64}, {"N": 96, "D": 32}, {"N": 1, "D": 320}, {"N": 64, "D": 45}]),
    # packed panels of N // 32 (exact in the class: `Nd32` in the probe path's names and shapes)
    ("matmul.tg", [{"M": 32, "K": 32, "N": 32}, {"M": 96, "K": 64, "N": 160}, {"M": 7, "K": 32, "N": 64},
                   {"M": 1, "K": 96, "N": 32}, {"M": 320, "K": 288, "N": 352}]),
    ("batched_matmul.tg", [{"B": 32, "M": 32, "K": 32, "N": 32}, {"B": 3, "M": 64, "K": 96, "N": 32}]),
    # windows of H // 2 and a slice's (C + 1) // 2: exact, N / 2 and C / 2 as the probe path writes them
    ("pooling.tg", [{"N": 32, "C": 32, "H": 32, "W": 64}, {"N": 3, "C": 32, "H": 96, "W": 32}]),
    ("slicing.tg", [{"N": 32, "R": 32, "C": 32}, {"N": 640, "R": 64, "C": 96}]),
])
def test_a_class_of_multiples_of_32_traces_once_as_the_probes(name, runs, monkeypatch):
    """A `32n` class (every dim a multiple of 32, or some of them) traces once: the probe path's plan (the same
    AST nodes, names, sources, fast variants, buffers, signature and trusted size), and numpy's results at its
    smallest members (32), odd multiples, mixed with n and 1 dims, and large."""
    prog = tgc.load(KERNELS / name)
    probed = tgc.load(KERNELS / name)
    probed.one_trace = False
    classes = [tuple((n, "32n") for n in prog.dim_names)]
    if len(prog.dim_names) > 1 and name not in ("pooling.tg", "slicing.tg"):  # (their five kernels: < 20 s)
        classes.append(((prog.dim_names[0], "n"),) + tuple((n, "32n") for n in prog.dim_names[1:]))
    for cls in classes:
        plan, other = _traced_once_like_the_probes(prog, probed, cls, monkeypatch)
        assert plan.bound == other.bound and plan.derived.keys() == other.derived.keys()
    for dims in runs:
        inputs = random_inputs(prog, dims, seed=4)
        got = prog.run(device="CPU", symbolic=True, **inputs)
        _check(prog, got, dims, inputs)
        if min(dims.values()) >= 32:
            assert prog.last_run == "symbolic", (dims, prog.last_run)


@pytest.mark.parametrize("src, numpy_fn, shapes, path", [
    # an exact floor division standing alone in a size: `N / 2` as the probe path writes it
    ("x: f32[N]\nreturn x[N // 2 - 1 : N // 2 + 1] * 2.0", lambda x: x[len(x) // 2 - 1: len(x) // 2 + 1] * 2,
     [(32,), (96,), (640,)], "one trace"),
    ("x: f32[N]\nreturn x[: N // 32] * 2.0", lambda x: x[: len(x) // 32] * 2, [(32,), (96,), (640,)], "one trace"),
    ("x: f32[N, M]\nreturn avg_pool2d(reshape(x, (1, 1, N, M)), 2)", None, [(32, 64), (96, 32), (64, 160)],
     "one trace"),
    # by a number that is no divisor of 32 (a remainder): the probes, with no plan
    ("x: f32[N]\nreturn x[: N // 3] * 2.0", lambda x: x[: len(x) // 3] * 2, [(32,), (96,), (64,)], "probes"),
    # the heads' `C // 4`: the simplifier's `CT % T(C//4)` is 0, `C` and `C//4` both multiples of `C//32` with
    # the common factor `T(C//32)` cancelled exactly (`SymSize._cancelled`): one trace, the probe path's plan
    ("x: f32[T, C]\nreturn reshape(x, (T, 4, C // 4)).sum(axis=2)", lambda x: x.reshape(x.shape[0], 4, -1).sum(axis=2),
     [(5, 64), (32, 32), (3, 320), (96, 256)], "one trace"),
])
def test_floor_divisions_of_a_32n_dim(src, numpy_fn, shapes, path, monkeypatch):
    """`N // k` of a dim of a `32n` class is exact for k a divisor of 32 (`a * N / k`): alone in a size it
    traces once with the probe path's kernels; in a product of sizes (written otherwise by the probe path), or
    by another k (a remainder), the probes decide. Right against numpy either way."""
    prog = tgc.loads(src)
    probed = tgc.loads(src)
    probed.one_trace = False
    cls = tuple((n, "32n") for n in prog.dim_names)
    plan = prog.compile_symbolic("CPU", size_class=cls) if path == "one trace" else None
    if plan is not None:
        _same_plan(plan, probed.compile_symbolic("CPU", size_class=cls))
    for shape in shapes:
        x = np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape)
        got = prog.run(device="CPU", symbolic=True, x=x)
        dims = dict(zip(prog.dim_names, shape))
        if numpy_fn is None:
            _check(prog, got, dims, {"x": x})
        else:
            np.testing.assert_allclose(np.asarray(got["out0"]), numpy_fn(x), rtol=1e-5, atol=1e-6, err_msg=src)
    assert prog.symbolic_paths[("CPU", cls)].startswith(path), prog.symbolic_paths


def test_a_clamp_bounds_a_32n_class_as_a_class_n():
    """`x[:300]` is 300 elements at the 32n probes (6752, 7136): the clamp's decision `N > 300` bounds the plan
    from below (trusted from 305; below, the source is checked and the sizes run specialized), right at the
    class's smallest member, at both sides of the clamp and large."""
    prog = tgc.loads("x: f32[N]\nreturn x[:300] * 2.0")
    plan = prog.compile_symbolic("CPU", size_class=(("N", "32n"),))
    assert prog.symbolic_paths[("CPU", (("N", "32n"),))] == "one trace" and plan.trusted_from > 300
    for n in (32, 288, 320, 640):
        x = np.linspace(-1, 1, n, dtype=np.float32)
        got = np.asarray(prog.run(device="CPU", symbolic=True, x=x)["out0"])
        np.testing.assert_allclose(got, x[:300] * 2, rtol=1e-6, err_msg=f"N={n}")
        assert (prog.last_run == "symbolic") == (n > 300), (n, prog.last_run)


ATTENTION_64 = """q: f32[B, T, 64]
k: f32[B, T, 64]
v: f32[B, T, 64]
return softmax(q @ k.transpose(-2, -1) * 0.125, axis=-1) @ v
"""


@pytest.mark.parametrize("source, classes, runs", [
    # the head dim a dim: the plain lowering (as the probe path's `_symbolic_ast`); at the representative size
    # (509 > MAX_HEAD_DIM) the scheduler fuses no attention: no fast variants, as the probe path finds there
    ((KERNELS / "attention.tg").read_text(), [tuple((n, "n") for n in "BHTD"), (("B", "1"),) +
                                             tuple((n, "n") for n in "HTD")],
     [{"B": 1, "H": 2, "T": 7, "D": 5}, {"B": 2, "H": 3, "T": 33, "D": 16}]),
    # a constant head dim: the fused online-softmax kernel and its fast variant (fused at 509 too)
    (ATTENTION_64, [(("B", "n"), ("T", "n")), (("B", "1"), ("T", "n"))], [{"B": 1, "T": 7}, {"B": 3, "T": 300}]),
])
def test_a_fused_attention_traces_once_as_the_probes(source, classes, runs, monkeypatch):
    """A fused attention traces once: its kernel (fused, or its plain lowering where a head dim is a dim) and
    its fast variant's opts where the scheduler's fusion rule, answered at the representative size
    (`symsize.answering_at`), fuses the same attentions there; the probe path's plan, and numpy's results."""
    prog = tgc.loads(source)
    probed = tgc.loads(source)
    probed.one_trace = False
    for cls in classes:
        counts = _counted(monkeypatch)
        plan = prog.compile_symbolic("CPU", size_class=cls)
        # (ATTENTION_64's index T * T * 64 passes 64 bits at the first bound: scheduled again at a smaller one,
        # from the same trace; the probe path does so too)
        assert prog.symbolic_paths[("CPU", cls)] == "one trace" and counts["trace"] == 1, cls
        assert counts["schedule"] == 1 or (source == ATTENTION_64 and counts["schedule"] == 2), (cls, counts)
        other = probed.compile_symbolic("CPU", size_class=cls)
        assert probed.symbolic_paths[("CPU", cls)].startswith("probes")
        _same_plan(plan, other)
        assert plan.bound == other.bound and [k is None for k in plan.fast] == [k is None for k in other.fast]
    for dims in runs:
        inputs = random_inputs(prog, dims, seed=8)
        got = prog.run(device="CPU", symbolic=True, **inputs)
        _check(prog, got, dims, inputs)


def test_a_matmul_of_no_softmax_makes_no_fusion_decision(monkeypatch):
    """The scheduler's attention rule compared a matmul's last dim with MAX_HEAD_DIM (256) before it saw no
    softmax there: mixer_block's token mixing (S = 227 and 257 at the probes) kept the probes. Now the rule
    reads the softmax first: one trace, the probe path's plan, numpy's results."""
    model = KERNELS.parent / "bench" / "models" / "mixer_block.tg"
    prog, probed = tgc.load(model), tgc.load(model)
    probed.one_trace = False
    cls = tuple((n, "n") for n in prog.dim_names)
    counts = _counted(monkeypatch)
    plan = prog.compile_symbolic("CPU", size_class=cls)
    assert prog.symbolic_paths[("CPU", cls)] == "one trace" and counts == {"trace": 1, "schedule": 1}
    _same_plan(plan, probed.compile_symbolic("CPU", size_class=cls))
    for dims in ({"B": 2, "S": 7, "C": 5, "DS": 3, "DC": 9}, {"B": 3, "S": 300, "C": 4, "DS": 2, "DC": 5}):
        dims = {n: dims[n] for n in prog.dim_names}
        inputs = random_inputs(prog, dims, seed=9)
        _check(prog, prog.run(device="CPU", symbolic=True, **inputs), dims, inputs)


def test_sizes_answered_at_other_dims():
    n, d = SymSize.dim("N", 211), SymSize.dim("D", 223)
    with checked_at(({"N": 211, "D": 223}, {"N": 223, "D": 211})):
        assert n < 256 and d < 256 and n != d
        with answering_at({"N": 509, "D": 509}):
            assert not n < 256 and n > 256 and n == d and n * d == 509 * 509
        assert n < 256  # (the context reset)


@pytest.mark.parametrize("expr, numpy_expr, symbolic", [
    # N % 32 is 0 at every size of the class: answered exactly (a dim of class n answers "not 0")
    ("x * 2.0 if N % 32 == 0 else x * 3.0", lambda x: x * (2 if len(x) % 32 == 0 else 3), True),
    ("x[: N - N % 32 + 1] * 2.0", lambda x: x[: len(x) - len(x) % 32 + 1] * 2, True),
    # N % 64 is 32 at both probes (odd multiples of 32), 0 at N = 64: a remainder, no symbolic form
    ("x * 2.0 if N % 64 == 0 else x * 3.0", lambda x: x * (2 if len(x) % 64 == 0 else 3), False),
    ("x * 2.0 if N % 64 else x * 3.0", lambda x: x * (2 if len(x) % 64 else 3), False),
])
def test_remainders_in_a_class_of_multiples_of_32(expr, numpy_expr, symbolic):
    for one_trace in (True, False):
        prog = tgc.loads(f"x: f32[N]\nreturn {expr}")
        prog.one_trace = one_trace
        for n in (32, 64, 96, 128):
            x = np.linspace(-1, 1, n, dtype=np.float32)
            got = np.asarray(prog.run(device="CPU", symbolic=True, x=x)["out0"])
            want = np.asarray(numpy_expr(x), dtype=np.float32)
            assert got.shape == want.shape, (expr, one_trace, n)
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{expr} N={n} one_trace={one_trace}")
            if symbolic:
                assert prog.last_run == "symbolic", (expr, n, prog.last_run)
            else:
                assert prog.last_run.startswith("specialized") and "remainder of a dim" in prog.last_run
        if one_trace and symbolic:
            assert prog.symbolic_paths[("CPU", (("N", "32n"),))] == "one trace"


@pytest.mark.parametrize("source", [
    "x: f32[N]\nreturn x * (0.5 * N)",  # a float times a dim: a tensor constant of the size, not a lost number
    "x: f32[N]\nreturn x.sum() * (1.0 / N) + x * x.shape[0]",
    "x: f32[N]\nreturn x[:5] * 2.0",  # clamps below 5: checked against the source there
    "x: f32[N]\nreturn x[1:] - x[:-1], x[-3:] * 2.0, x[-1] + x[2], x[:, None] * x[None, :]",  # slices of a dim
])
def test_sizes_read_as_numbers_trace_once_and_stay_right(source, monkeypatch):
    prog = tgc.loads(source)
    counts = _counted(monkeypatch)
    prog.compile_symbolic("CPU")
    assert list(prog.symbolic_paths.values()) == ["one trace"] and counts["trace"] == 1
    for n in (3, 7, 300):
        inputs = {"x": np.linspace(-1, 1, n, dtype=np.float32)}
        got = prog.run(device="CPU", symbolic=True, **inputs)
        _check(prog, got, {"N": n}, inputs)


def test_a_loop_over_a_sum_of_dims_names_its_kernel_by_an_identifier(tmp_path):
    # x[2:] loops N-2 times: the one trace's size prints as `N-2`, which no dialect or package manifest takes in
    # a kernel name (a package of it failed its own load check); the name shows the traced size instead
    from tgc.package import write
    prog = tgc.loads("x: f32[N]\nreturn x[2:] + x[:-2]\n")
    plan = prog.compile_symbolic("CPU")
    assert list(prog.symbolic_paths.values()) == ["one trace"]
    assert all(k.name.isidentifier() for k in plan.kernels), [k.name for k in plan.kernels]
    write(prog, tmp_path / "s.tgpkg", "CPU", None)
    x = np.arange(11, dtype=np.float32)
    np.testing.assert_array_equal(tgc.load_package(tmp_path / "s.tgpkg").run(x=x)["out0"], x[2:] + x[:-2])


def _same_plan(plan, other) -> None:
    """The one trace's plan is the probe path's: the same AST nodes, sources, fast variants, buffers, signature."""
    assert len(plan.asts) == len(other.asts) and all(a is b for a, b in zip(plan.asts, other.asts))
    assert [k.name for k in plan.kernels] == [k.name for k in other.kernels]
    assert [k.src for k in plan.kernels] == [k.src for k in other.kernels]
    assert [_src(k) for k in plan.fast] == [_src(k) for k in other.fast]
    assert [_src(k) for k in plan.unthreaded] == [_src(k) for k in other.unthreaded]
    assert plan.signature == other.signature and plan.trusted_from == other.trusted_from
    assert [(s.dtype, s.shape, s.input) for s in plan.slots] == [(s.dtype, s.shape, s.input) for s in other.slots]
    assert plan.kernel_slots == other.kernel_slots and plan.input_shapes == other.input_shapes
    assert plan.shapes == other.shapes


def _traced_once_like_the_probes(prog, probed, cls, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """(plan, the probe path's plan) of class `cls`: `prog` traced and scheduled once, `probed` (`one_trace`
    off) on the probes, and the two plans the same (`_same_plan`)."""
    counts = _counted(monkeypatch)
    plan = prog.compile_symbolic("CPU", size_class=cls)
    assert prog.symbolic_paths[("CPU", cls)] == "one trace" and counts == {"trace": 1, "schedule": 1}, cls
    other = probed.compile_symbolic("CPU", size_class=cls)
    assert probed.symbolic_paths[("CPU", cls)].startswith("probes")
    _same_plan(plan, other)
    return plan, other


@pytest.mark.parametrize("name, classes, runs", [
    # argmax: its countdown is arange(K) (an integer length, no float division of the size)
    ("argmax.tg", [(("N", "n"), ("K", "n")), (("N", "1"), ("K", "n"))],
     [{"N": 1, "K": 33}, {"N": 33, "K": 300}, {"N": 300, "K": 7}]),
    # conv2d: the scheduler's read count of the padded window (9HW // (H+2)(W+2)) is the same at both probes
    ("conv2d.tg", [tuple((n, "n") for n in "NCHWO"), (("N", "1"),) + tuple((n, "n") for n in "CHWO")],
     [{"N": 1, "C": 3, "H": 33, "W": 5, "O": 2}, {"N": 2, "C": 1, "H": 7, "W": 300, "O": 3},
      {"N": 3, "C": 2, "H": 33, "W": 33, "O": 5}]),
])
def test_argmax_and_conv2d_trace_once_as_the_probes(name, classes, runs, monkeypatch):
    prog = tgc.load(KERNELS / name)
    probed = tgc.load(KERNELS / name)
    probed.one_trace = False
    for cls in classes:
        _traced_once_like_the_probes(prog, probed, cls, monkeypatch)
    for dims in runs:
        inputs = random_inputs(prog, dims, seed=3)
        got = prog.run(device="CPU", symbolic=True, **inputs)
        _check(prog, got, dims, inputs)


def test_a_slice_past_both_ends_is_checked_where_it_clamps():
    """`y[-100:100]`: traced at the probes (N > 200) it is empty, its start N - 100 and its stop 100; below
    N = 201 those clamps differ (numpy gives all of y at 33, y[50:100] at 150): the plan is trusted only from
    where its size decisions hold, and checked against the source below (it gave an empty array at 33)."""
    prog = tgc.loads("y: f32[N]\nreturn y[-100:100] * 2.0")
    plan = prog.compile_symbolic("CPU")
    assert list(prog.symbolic_paths.values()) == ["one trace"] and plan.trusted_from > 200
    for n in (1, 33, 100, 150, 200, 201, 300):
        y = np.linspace(-1, 1, n, dtype=np.float32)
        got = np.asarray(prog.run(device="CPU", symbolic=True, y=y)["out0"])
        np.testing.assert_array_equal(got, y[-100:100] * 2, err_msg=f"N={n}")


def test_size_decisions_bound_the_trusted_sizes():
    n = SymSize.dim("N", 211)
    with checked_at(({"N": 211}, {"N": 223})) as decided:
        assert n - 100 > 0 and not 200 - n > 0 and n != 100 and n > 1 and n < 2 ** 31
    assert decided_from(decided) == 201  # (N < 2**31 bounds from above: not counted)
    with checked_at(({"N": 211}, {"N": 223})):
        assert (9 * n * n) // ((n + 2) * (n + 2)) == 8  # the same quotient at both probes: a plain int
        with pytest.raises(NotTraceable):
            (n * n) // (n + 7)  # 204 at N = 211, 216 at N = 223


@pytest.mark.parametrize("expr", ["x[:300]", "x[-300:]", "x[5:300]"])
def test_a_slice_that_is_all_of_x_at_the_probes_is_trusted_only_below_its_constant(expr):
    """`x[:300]` traced at the probes (N of 211, 223) is all of x: the plan held above N = 300 too and gave 400
    elements at N = 400 (numpy: 300), on both paths. The front end's decision `N < 300` now bounds the class's
    range from above (size-specialized kernels run above it); the scheduler's thresholds do not."""
    for one_trace in (True, False):
        prog = tgc.loads(f"x: f32[N]\nreturn {expr} * 2.0")
        prog.one_trace = one_trace
        for n in (1, 33, 299, 300, 301, 400, 1000):
            x = np.linspace(-1, 1, n, dtype=np.float32)
            got = np.asarray(prog.run(device="CPU", symbolic=True, x=x)["out0"])
            want = eval(expr, {"x": x}) * 2
            assert got.shape == want.shape, (expr, one_trace, n)
            np.testing.assert_array_equal(got, want, err_msg=f"{expr} N={n} one_trace={one_trace}")
        if one_trace:
            assert prog.symbolic_paths[("CPU", (("N", "n"),))] == "one trace"
            assert prog.compile_symbolic("CPU").bound == 299
            assert prog.run(device="CPU", symbolic=True, x=np.ones(299, np.float32)) and prog.last_run == "symbolic"
        else:
            assert prog.symbolic_paths[("CPU", (("N", "n"),))].startswith("probes")
            plan = prog._symbolic(api._device("CPU"), (("N", "n"),))
            assert isinstance(plan, str) or plan.bound == 299  # (x[5:300]: no probe-path plan at all)
    # a program-cache class entry (saved by the runs above) is bound by its range too
    again = tgc.loads(f"x: f32[N]\nreturn {expr} * 2.0")
    x = np.arange(400, dtype=np.float32)
    np.testing.assert_array_equal(again.run(device="CPU", symbolic=True, x=x)["out0"], eval(expr) * 2)


def test_front_end_decisions_bound_the_range_and_heuristics_do_not():
    """`decided_upto`: a decision bounding the dims from above keeps its answer up to the largest box of dims it
    holds on; only the front end's decisions (`recording`) are given it, not the scheduler's thresholds:
    reductions.tg (a split-reduce threshold met in its trace) and matmul keep the whole range."""
    n, m = SymSize.dim("N", 211), SymSize.dim("M", 223)
    with checked_at(({"N": 211, "M": 223}, {"N": 223, "M": 211})):
        with recording() as front:
            assert n < 300 and not n >= 300 and n > 100
        with recording() as both:
            assert m * n < 65536 and 2 * n - 1000 < 0
        with recording() as none:
            assert n > 1 and m - n != 0
    assert decided_upto(front) == 299 and decided_from(front) == 101
    assert decided_upto(both) == 255  # 255 * 255 < 65536 <= 256 * 256; 2N - 1000 < 0 holds to 499
    assert decided_upto(none) is None and decided_upto([]) is None
    for name, dims in (("reductions.tg", 2), ("matmul.tg", 3)):
        plan = tgc.load(KERNELS / name).compile_symbolic("CPU")
        assert plan.bound == sizes.var_bound(dims) and plan.trusted_from < 10, name


def test_slices_with_a_step_of_minus_one_trace_once():
    """A reversed slice over a dim (`x[::-1]`, `x[-2::-1]`) is traced once, as the probes' plan; one the probes
    cannot serve (`x[:3:-1]`, `x[5:-300:-1]`: constants past the sizes) is traced once too, right at every size
    (checked against the source where its clamps differ)."""
    decl = "x: f32[N]\nm: f32[R, C]\nreturn "
    for expr in ("x[::-1] * 2.0", "x[-2::-1] + m[::-1, 1:].sum()", "m[:, -1:0:-1] * 2.0"):
        prog, probed = tgc.loads(decl + expr), tgc.loads(decl + expr)
        probed.one_trace = False
        plan, other = prog.compile_symbolic("CPU"), probed.compile_symbolic("CPU")
        assert list(prog.symbolic_paths.values()) == ["one trace"], expr
        _same_plan(plan, other)
    prog = tgc.loads(decl + "x[::-1] * 2.0, x[:3:-1], x[5:-300:-1] + 1.0, m[::-1, 1:], m[:, -1:0:-1]")
    prog.compile_symbolic("CPU")
    assert list(prog.symbolic_paths.values()) == ["one trace"]
    for n in (1, 2, 5, 33, 300):
        x = np.linspace(-1, 1, n, dtype=np.float32)
        m = np.arange(n * 7, dtype=np.float32).reshape(n, 7)
        got = prog.run(device="CPU", symbolic=True, x=x, m=m)
        want = [x[::-1] * 2, x[:3:-1], x[5:-300:-1] + 1, m[::-1, 1:], m[:, -1:0:-1]]
        for i, w in enumerate(want):
            np.testing.assert_array_equal(np.asarray(got[f"out{i}"]), w, err_msg=f"N={n} out{i}")
    # a step of 2: its length is a floor division of the size (`(N + 1) // 2`), traced once since onetrace3
    # (`test_floor_divisions_of_a_dim_trace_once`)


@pytest.mark.parametrize("expr, numpy_expr", [
    ("x[:2 * M] * 2.0 + y.sum()", lambda x, y: x[:2 * len(y)] * 2 + y.sum()),  # 2M - N > 0 at both probes
    ("(x * 2.0 if M == N else x * 3.0) + y.sum()", lambda x, y: x * (2 if len(x) == len(y) else 3) + y.sum()),
])
def test_a_decision_comparing_dims_has_no_symbolic_form(expr, numpy_expr):
    """A front-end decision whose dim terms have both signs (`2M - N > 0`: `x[:2 * M]` is all of x at the probes;
    `M == N`, false at the probes) holds on no range of sizes: both paths gave the probes' answer where it flips
    (100 elements at N = 100, M = 30, numpy 60; `x * 3` at M = N = 50). The class now has no symbolic form and
    size-specialized kernels run."""
    for one_trace in (True, False):
        prog = tgc.loads(f"x: f32[N]\ny: f32[M]\nreturn {expr}")
        prog.one_trace = one_trace
        for n, m in ((100, 30), (50, 50), (1000, 300), (5, 3), (7, 9)):
            x, y = np.linspace(-1, 1, n, dtype=np.float32), np.linspace(0, 1, m, dtype=np.float32)
            got = np.asarray(prog.run(device="CPU", symbolic=True, x=x, y=y)["out0"])
            want = numpy_expr(x, y)
            assert got.shape == want.shape, (expr, one_trace, n, m)
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{expr} N={n} M={m}")
            assert prog.last_run.startswith("specialized") and "compares dims" in prog.last_run
        path = prog.symbolic_paths[("CPU", (("N", "n"), ("M", "n")))]
        assert path.startswith("probes") and ("compares dims" in path) == one_trace
    n, m = SymSize.dim("N", 211), SymSize.dim("M", 223)
    with checked_at(({"N": 211, "M": 223}, {"N": 227, "M": 229})) as decided:
        assert 2 * m - n > 0 and n > 100
    assert decided_across(decided) == "a size decision on 2M-N compares dims with each other (no range of sizes " \
        "keeps its answer)"
    assert decided_across(decided[1:]) is None and decided_across([({(): -2, ("N",): 0}, -1)]) is None  # (a bound)
    # terms of both signs that grow together over the class (dims >= 2) bound it as one sign does: N(M - 1) - 100
    # > 0 holds from every dim at 11 (11 * 10 - 100 > 0), N(M - 1) < 300 up to 17 (17 * 16 < 300 <= 18 * 17)
    grows, shrinks = {("M", "N"): 1, ("N",): -1, (): -100}, {("M", "N"): 1, ("N",): -1, (): -300}
    assert decided_across([(grows, 1), (shrinks, -1)]) is None
    assert decided_from([(grows, 1)]) == 11 and decided_upto([(shrinks, -1)]) == 17


def test_a_floor_division_of_a_dim_is_a_variable_of_its_own():
    """`symsize.atom`: `(a * N + r) // k` for a dim N, a variable of the polynomials whose value at any dims is
    known; a decision that compares it with its dim depends on a remainder and refuses."""
    h, c = SymSize.dim("H", 211), SymSize.dim("C", 223)
    with checked_at(({"H": 211, "C": 223}, {"H": 229, "C": 227})) as decided:
        pooled = (h - 2) // 2 + 1  # a 2x2 window of stride 2
        half = (c + 1) // 2  # the length of `m[:, ::2]`
        assert pooled.terms == ((("(1*H+0)//2",), 1),) and pooled.value == 105 and half.value == 112
        assert (2 * h + 1) // 2 == h and (-h) // 2 == h // 2 - h and ((-h) // 2).value == -106
        assert (3 * h + 4) // 2 == h + (h // 2) + 2 and sizes.mono_value(half.mono, {"C": 10}) == 5
        assert pooled * c > pooled and pooled > 3
        with pytest.raises(NotTraceable):
            bool(2 * half - 1 == c)  # true at the odd probes only: refused as any equality that holds there
        with pytest.raises(NotTraceable):
            (h * c) // 2  # a product of dims is no atom
        assert h - 2 * (h // 2) > 0  # (true at both probes: an odd H's remainder)
        assert h // 2 < h and h // 2 - h < 2 ** 62  # (at every size: their bounds H/2 - H and (H - 1)/2 - H)
    assert decided_by_remainder(decided) == \
        "a size decision on -2(H//2)+H depends on a remainder of a dim"
    assert decided_by_remainder(decided[:-3]) is None and decided_by_remainder(decided[-2:]) is None
    assert decided_from([({("(1*H+0)//2",): 1, (): -3}, 1)]) == 8  # H//2 > 3 holds from H = 8 (not 4)
    assert decided_upto([({("(1*H+0)//2",): 1, (): -300}, -1)]) == 599  # H//2 < 300 holds up to H = 599


@pytest.mark.parametrize("name, runs", [
    ("pooling.tg", [{"N": 2, "C": 3, "H": 4, "W": 5}, {"N": 3, "C": 2, "H": 7, "W": 2},
                    {"N": 1, "C": 3, "H": 9, "W": 6}, {"N": 2, "C": 2, "H": 66, "W": 71}]),
    ("slicing.tg", [{"N": 5, "R": 4, "C": 7}, {"N": 9, "R": 2, "C": 8}, {"N": 1, "R": 1, "C": 2},
                    {"N": 300, "R": 5, "C": 301}]),
])
def test_floor_divisions_of_a_dim_trace_once(name, runs, monkeypatch):
    """Pooling's `(H - 2) // 2 + 1` and a slice's length `(C + 1) // 2` (`m[:, ::2]`) are atoms (`H//2`,
    `(C+1)//2`): the programs trace once (the probe path had no symbolic form for them) and are right at sizes of
    1, odd, even and large against numpy, with the dims below `trusted_from` checked against the source."""
    prog = tgc.load(KERNELS / name)
    counts = _counted(monkeypatch)
    plan = prog.compile_symbolic("CPU")
    assert list(prog.symbolic_paths.values()) == ["one trace"] and counts == {"trace": 1, "schedule": 1}
    # an atom of k = 2 exceeds the graph's constants from twice the size a dim does
    assert sizes.signature_divisor(plan.signature, plan.slots) == 2
    assert plan.trusted_from >= 2 * (sizes.signature_max_constant(plan.signature) + 5)
    probed = tgc.load(KERNELS / name)
    probed.one_trace = False
    with pytest.raises(tgc.TgcError, match="no kernels valid for every size"):
        probed.compile_symbolic("CPU")
    ran = []
    for dims in runs:
        inputs = random_inputs(prog, dims, seed=7)
        got = prog.run(device="CPU", symbolic=True, **inputs)
        ran.append(prog.last_run)
        _check(prog, got, dims, inputs)
    assert ran.count("symbolic") >= 3, ran


def test_the_first_half_of_a_dim_traces_once():
    """`x[: N // 2]`: its clamp compares N//2 with N, which holds at every size (its bound N/2 - N < 0), so it
    traces once; right at every size from 1 to 301 (even and odd) against numpy."""
    prog = tgc.loads("x: f32[N]\nreturn x[: N // 2] * 2.0, x[: N // 3].sum() + x[: N // 2]")
    prog.compile_symbolic("CPU")
    assert list(prog.symbolic_paths.values()) == ["one trace"]
    for n in (1, 2, 3, 4, 5, 6, 7, 12, 33, 64, 300, 301):
        x = np.linspace(-1, 1, n, dtype=np.float32)
        got = prog.run(device="CPU", symbolic=True, x=x)
        np.testing.assert_allclose(np.asarray(got["out0"]), x[: n // 2] * 2, err_msg=f"N={n}")
        np.testing.assert_allclose(np.asarray(got["out1"]), x[: n // 3].sum() + x[: n // 2], rtol=1e-5,
                                   atol=1e-6, err_msg=f"N={n}")


@pytest.mark.parametrize("expr, numpy_expr, bound, sizes_run", [
    ("x[:N // 1000 + 3] * 2.0", lambda x: x[:len(x) // 1000 + 3] * 2, 999, (999, 1000, 2500)),
    ("x * (N // 1000)", lambda x: x * (len(x) // 1000), 999, (1000,)),
    ("x * 2.0 if N // 300 == 0 else x * 3.0", lambda x: x * (2 if len(x) // 300 == 0 else 3), 299, (300,)),
    ("x[::500] * 2.0", lambda x: x[::500] * 2, 500, (1000,)),
    ("x[::-300] + 1.0", lambda x: x[::-300] + 1, 300, (1000,)),
    ("x[::250].sum()", lambda x: x[::250].sum(), 250, (251, 255)),
])
def test_a_quotient_the_same_at_both_probes_bounds_the_plan(expr, numpy_expr, bound, sizes_run):
    """A floor division of a dim that is the same at both probes (`N // 1000` is 0 at 211 and 223; the length
    `(N + 499) // 500` of `x[::500]` is 1) was a plain int with no decision recorded: the plan gave 3 elements of
    `x[:N // 1000 + 3]` at N = 1000 (numpy 4), zeros for `x * (N // 1000)`, one element of `x[::500]` at N = 1000
    (numpy 2), and `x[::250].sum()` summed x[0] alone from N = 251 (a regression of the slice bounds at 251..254,
    on the one trace). Now the quotient's bounds (`q * k <= N < (q + 1) * k`) are front-end decisions: the plan
    stops where the quotient changes (both paths), and larger sizes run size-specialized, right."""
    for one_trace in (True, False):
        prog = tgc.loads(f"x: f32[N]\nreturn {expr}")
        prog.one_trace = one_trace
        assert prog.compile_symbolic("CPU").bound == bound, (expr, one_trace)
    for n in sizes_run:  # (the last program: one trace)
        x = np.linspace(-1, 1, n, dtype=np.float32) ** 3 + 0.25
        got = np.asarray(prog.run(device="CPU", symbolic=True, x=x)["out0"])
        want = np.asarray(numpy_expr(x), dtype=np.float32)
        assert got.shape == want.shape, (expr, n)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{expr} N={n}")
        assert (prog.last_run == "symbolic") == (n <= bound), (expr, n, prog.last_run)
    n = SymSize.dim("N", 211)
    with checked_at(({"N": 211}, {"N": 223})), recording() as front:
        assert n // 1000 == 0 and n // 64 == 3 and 1000 // n == 4
    assert decided_upto(front) == 250 and decided_from(front) == 1001  # (5N - 1000 > 0 read as N > 1000: kept)
    with checked_at(({"N": 211}, {"N": 223})) as heuristic:  # a scheduler's ratio of sizes: no bound
        assert n // 1000 == 0
    assert heuristic == []


@pytest.mark.parametrize("expr, numpy_expr, runs", [
    ("x * 2.0 if N % 3 == 0 else x * 3.0", lambda x: x * (2 if len(x) % 3 == 0 else 3), (12, 7)),
    ("x * 2.0 if N % 2 else x * 3.0", lambda x: x * (2 if len(x) % 2 else 3), (12,)),
    # a remainder of a floor division of a dim (32 at N = 129: 0): was read as "not 0", x * 3
    ("x * 2.0 if (N // 4) % 32 == 0 else x * 3.0", lambda x: x * (2 if len(x) // 4 % 32 == 0 else 3), (129, 133)),
    ("x[:N // 4 * 4] * 2.0", lambda x: x[:len(x) // 4 * 4] * 2, (8, 33)),
    ("x[:N - N % 4] * 2.0", lambda x: x[:len(x) - len(x) % 4] * 2, (8,)),
    ("x[N // 2 * 2:] * 2.0", lambda x: x[len(x) // 2 * 2:] * 2, (8,)),
])
def test_a_remainder_of_a_dim_has_no_symbolic_form(expr, numpy_expr, runs):
    """A decision on `N % k`, or a floor division of a dim the trace refuses (`N // 4 * 4`), depends on the
    residue of N, and the probes 211 and 223 (primes, 12 apart) share theirs modulo 2, 3 and 4: `N % 3 == 0` was
    false at N = 12, `if N % 2` true at every even N, and the probe path read `N // 4 * 4` as `N - 3` (5 elements
    at N = 8, numpy 8). The front end records it (`symsize.Unanswered`): the class has no symbolic form on either
    path, and size-specialized kernels run, right."""
    for one_trace in (True, False):
        prog = tgc.loads(f"x: f32[N]\nreturn {expr}")
        prog.one_trace = one_trace
        with pytest.raises(tgc.TgcError, match="remainder of a dim"):
            prog.compile_symbolic("CPU")
        for n in runs:
            x = np.linspace(-1, 1, n, dtype=np.float32)
            got = np.asarray(prog.run(device="CPU", symbolic=True, x=x)["out0"])
            want = np.asarray(numpy_expr(x), dtype=np.float32)
            assert got.shape == want.shape, (expr, one_trace, n)
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{expr} N={n}")
            assert prog.last_run.startswith("specialized") and "remainder of a dim" in prog.last_run
            assert "_Nonzero" not in prog.last_run


def test_a_source_check_refuses_where_the_scheduler_cuts_other_kernels():
    """Below `trusted_from` a plan is checked against the source; where the scheduler cuts other kernels there
    (`x[::250].sum()` at N = 251: a copy of x[0], no reduce) its graph signature may still match the plan's (the
    slice's bounds a no-op), so nothing vouches for the plan's kernels: refused, whatever the signature's
    divisor."""
    prog = tgc.loads("x: f32[N]\nreturn x[::250].sum()")
    plan = prog.compile_symbolic("CPU")
    assert plan.trusted_from > 251
    assert plan.source_check(prog, {"N": 251}) == "the scheduler cuts other kernels at these sizes (1 kernel, 1 " \
        f"reduction, where the size class has 1 kernel, 0 reductions); the class's kernels run unchecked where N is " \
        f"at least {plan.trusted_from} (here N = 251)"
    # the other way: the plan reduces 4 elements of `x[::64]` (its length at the probes), the source copies
    # one at N = 2 (it read past x: 6.9e34) and reduces one at N = 63
    prog = tgc.loads("x: f32[N]\nreturn x[::64].sum()")
    for n in (2, 63):
        x = np.linspace(-1, 1, n, dtype=np.float32) + 2
        got = np.asarray(prog.run(device="CPU", symbolic=True, x=x)["out0"])
        np.testing.assert_allclose(got, x[::64].sum(), rtol=1e-6, err_msg=f"N={n}")
        assert prog.last_run.startswith("specialized: the scheduler cuts other kernels at these sizes (1 kernel, "
                                        "0 reductions, where the size class has 1 kernel, 1 reduction); the class's "
                                        "kernels run unchecked where N is at least "), (n, prog.last_run)


def test_a_floor_division_exact_in_a_class_of_multiples_of_32_keeps_its_plan():
    """In a `32n` class `C // 4` and `N // 2` leave no remainder: a refusal or a decision on them is not one
    of a remainder (`symsize._exact_atom`: the atom written as `C / 4`), so the probe path's plan still runs
    there (transformer_block's heads), right against numpy."""
    cases = [("x: f32[T, C]\nreturn reshape(x, (T, 4, C // 4)).sum(axis=2)",
              lambda x: x.reshape(x.shape[0], 4, -1).sum(axis=2), (5, 64)),
             ("x: f32[N]\nreturn x[N // 2 - 1 : N // 2 + 1] * 2.0", lambda x: x[len(x) // 2 - 1: len(x) // 2 + 1] * 2,
              (96,))]
    for src, numpy_fn, shape in cases:
        prog = tgc.loads(src)
        x = np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape)
        got = np.asarray(prog.run(device="CPU", symbolic=True, x=x)["out0"])
        np.testing.assert_allclose(got, numpy_fn(x), rtol=1e-5, atol=1e-6, err_msg=src)
        assert prog.last_run == "symbolic", (src, prog.last_run)


def _readable(reason: str) -> bool:
    """A reason a user reads: no `_`-prefixed name, no exception class, no object repr, no polynomial variable."""
    import re
    return not re.search(r"(^|[^A-Za-z0-9])_[A-Za-z]|Error|Exception|<[A-Za-z]|\(1\*|\+0\)", reason)


@pytest.mark.parametrize("source, says", [
    ("x: f32[N]\nreturn x[N // 2:] * 2.0", "remainder of a dim"),
    ("x: f32[N]\nreturn x[:N // 4 * 4] * 2.0", "4(N//4)-N"),
    ("x: f32[N]\nreturn x[N // 2 * 2:] * 2.0", "(N//2)"),
    ("x: f32[N]\nreturn x * 2.0 if N % 2 else x * 3.0", "remainder of a dim"),
    ("x: f32[N]\nreturn x * (N % 3 + 1)", "remainder of a dim"),
    ("x: f32[N]\nreturn x * (2 ** N)", "N is read as a plain float"),
    ("x: f32[N]\nreturn reshape(x, (N // 2, 2))", "[N//2, 2] (2(N//2) elements)"),
    # (a tensor's count past 2^63 is no decision of the one trace since branch symplan; the next one is said,
    # and the index width's wording is checked in tests/test_symbolic_plans.py)
    ("x: f32[N, M]\nreturn x[N//2:, M//2:] * 2.0", "a size decision on (M//2)(N//2)-N(M//2)"),
])
def test_one_trace_reasons_read_as_a_user_reads_them(source, says):
    """The one trace's reasons (`symbolic_paths`, and through the probe path `last_run` and errors) name the
    sizes as the program writes them (`N//2`, not the polynomials' variable `(1*N+0)//2`), say an index width
    check is one, and name no internal class (`_Nonzero`, `SymFloat`) or exception."""
    prog = tgc.loads(source)
    try:
        prog.compile_symbolic("CPU")
        msg = ""
    except tgc.TgcError as e:  # (the probe path finds no symbolic form either: its error, readable too)
        msg = e.msg
    (path,) = prog.symbolic_paths.values()
    assert path.startswith("probes: ") and says in path, path
    assert _readable(path) and _readable(msg), (path, msg)


@pytest.mark.parametrize("expr, numpy_expr, says", [
    # `N//32 % 2` reads as N // (32 % 2); the quotient's decision read `-63(N//64)+N-62`, not what was written
    ("x * 2.0 if (N // 32) % 2 == 0 else x * 3.0", lambda x: x * (2 if (len(x) // 32) % 2 == 0 else 3),
     "a size decision on (N//32) % 2 depends on a remainder of a dim"),
    ("x * 2.0 if N // (N // 64 + 1) > 40 else x * 3.0", lambda x: x * (2 if len(x) // (len(x) // 64 + 1) > 40
                                                                       else 3),
     "a size decision on N // (N//64+1) (which is 63 at the traced sizes) depends on a remainder of a dim"),
])
def test_a_decision_on_a_floor_division_reads_as_written(expr, numpy_expr, says):
    """review10: a class 32n's reasons for these (`tgc run --symbolic` notes) are written as the program writes
    them."""
    prog = tgc.loads(f"x: f32[N]\nreturn {expr}")
    for n in (32, 64, 4096):
        x = np.linspace(-1, 1, n, dtype=np.float32)
        got = np.asarray(prog.run(device="CPU", symbolic=True, x=x)["out0"])
        np.testing.assert_allclose(got, np.asarray(numpy_expr(x), dtype=np.float32), rtol=1e-6)
        assert prog.last_run.startswith("specialized") and says in prog.last_run, prog.last_run
        assert _readable(prog.last_run), prog.last_run


def test_an_internal_error_of_the_one_trace_is_no_reason_text(monkeypatch, capsys):
    """Code that fails on a symbolic size (a Python TypeError) sends the class to the probes; its reason says so
    without quoting the exception, which DEBUG=2 prints."""
    def broken(*args, **kwargs):
        raise TypeError("unsupported operand type(s) for +: 'SymSize' and '_Nonzero'")

    prog = tgc.loads("x: f32[N]\nreturn x * 2.0")
    monkeypatch.setattr(api, "create_schedule", broken)
    monkeypatch.setenv("DEBUG", "2")
    assert isinstance(prog._symbolic(api._device("CPU"), (("N", "n"),)), str)
    (path,) = prog.symbolic_paths.values()
    assert path.startswith("probes: ") and "internal error" in path and _readable(path), path
    assert "TypeError: unsupported operand" in capsys.readouterr().err
    assert all(_readable(why) for why in prog._plans.values()), prog._plans


def test_an_error_at_a_probe_size_names_the_class_not_the_probe(tmp_path):
    """A program that fails at the sizes the compiler tries for a class (a reshape into [N // 2, 2] needs N even;
    211 is not) said `at sizes {'N': 211}: cannot reshape f32[211] ...`, as if the user had given N = 211. Now
    the error names the class and the condition in dims (the one trace's error), and where only the probe's
    error is known it says its sizes are ones the compiler tried. `tgc compile` exits 2 (a user error: give
    dims); `tgc run --symbolic` at an even N runs the size-specialized kernels (exit 0) and says why. (Since
    branch heads `reshape(x, (N // 2, 2))` compiles for N a multiple of 2, tests/test_symbolic_multiples.py: a
    reshape that fits at one N only, N = 8, is the program here.)"""
    import subprocess
    import sys
    src = "x: f32[N]\nreturn reshape(x, (N - 4, 2)) * 2.0\n"
    for one_trace in (True, False):
        prog = tgc.loads(src)
        prog.one_trace = one_trace
        with pytest.raises(tgc.TgcError) as err:
            prog.compile_symbolic("CPU")
        msg = err.value.msg
        assert err.value.kind == "user" and "(N >= 2)" in msg and "{'N'" not in msg, msg
        if one_trace:
            assert "into [N-4, 2]" in msg and "(at N=211, sizes the compiler tried for the class)" in msg, msg
        else:
            assert "at N=211, sizes the compiler tried for the class (not sizes given): cannot reshape" in msg, msg
        x = np.arange(8, dtype=np.float32)
        got = prog.run(device="CPU", symbolic=True, x=x)["out0"]
        np.testing.assert_array_equal(np.asarray(got), x.reshape(4, 2) * 2)
        assert prog.last_run.startswith("specialized: no kernels valid for every size (N >= 2): "), prog.last_run
    path = tmp_path / "half.tg"
    path.write_text(src)
    root = pathlib.Path(__file__).resolve().parent.parent
    env = {"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "TGC_CACHE_DIR": str(tmp_path / "c")}
    cli = [sys.executable, "-m", "tgc.cli.main"]
    r = subprocess.run([*cli, "compile", str(path), "-d", "CPU"], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 2 and "(N >= 2)" in r.stderr and "N-4" in r.stderr and "{'N'" not in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run([*cli, "run", str(path), "-d", "CPU", "--random", "-D", "N=8", "--symbolic"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "note: ran kernels compiled for these sizes (no kernels valid for every size " \
        "(N >= 2)" in r.stderr and "{'N'" not in r.stderr, r.stderr


@pytest.mark.parametrize("source, texts", [
    # a product of dims whose names are longer than one letter ran together: `HIDSEQ`, `4SEQ(HID//4)`, `AABB`
    ("x: f32[SEQ, HID]\nreturn reshape(x, (SEQ, 4, HID // 4)) * 2.0", ["(HID*SEQ elements)",
                                                                       "(4*SEQ*(HID//4) elements)"]),
    ("x: f32[A, B, AB]\nreturn reshape(x, (A, B, 3, AB // 3)) * 2.0", ["(A*AB*B elements)",
                                                                       "(3*A*B*(AB//3) elements)"]),
    ("x: f32[n_tok, d_model]\nreturn reshape(x, (n_tok, 4, d_model // 4)) * 2.0", ["(d_model*n_tok elements)"]),
    ("x: f32[B, T]\nreturn reshape(x, (B, 4, T // 4)) * 2.0", ["(BT elements)", "(4B(T//4) elements)"]),
])
def test_a_product_of_dims_with_long_names_is_written_with_stars(source, texts):
    # (the class n reason; since branch heads the class with HID a multiple of 4 compiles: the reason is kept
    # first in `symbolic_paths`)
    prog = tgc.loads(source)
    plan = prog.compile_symbolic("CPU")
    assert plan.multiples
    (path,) = prog.symbolic_paths.values()
    assert all(t in path.split("; with ")[0] for t in texts), path


def test_a_kernel_name_keeps_a_product_of_long_dim_names_as_an_identifier():
    prog = tgc.loads("x: f32[SEQ, HID]\nreturn reshape(x, (SEQ * HID,)) * 2.0")
    assert [k.name for k in prog.compile_symbolic("CPU").kernels] == ["E_HIDSEQ"]


def test_a_remainder_below_its_divisor_is_answered_and_another_refused_with_its_text(monkeypatch):
    """`x[N - 1] + x[-N]`: (N - 1) % N was a remainder known only as not 0 (`_Nonzero`), which the trace then
    added 1 to (a TypeError inside the one trace), and the reason read `N-1 % N`. It is N - 1 at every size of
    the class (N >= 2); a remainder the class does not answer is refused naming it."""
    from tgc.ir.symsize import NotTraceable, _Nonzero

    prog = tgc.loads("x: f32[N]\nreturn x[N - 1] + x[-N]")
    counts = _counted(monkeypatch)
    prog.compile_symbolic("CPU")
    assert list(prog.symbolic_paths.values()) == ["one trace"] and counts["trace"] == 1
    for n in (2, 3, 7):
        inputs = {"x": np.linspace(-1, 1, n, dtype=np.float32)}
        got = prog.run(device="CPU", symbolic=True, **inputs)
        assert prog.last_run == "symbolic"
        _check(prog, got, {"N": n}, inputs)
    # (N + 1) % N is 1 at every N >= 2 (`SymSize._cancelled`: N + 1 is 1 * N + 1, and 0 <= 1 < 2 <= N)
    prog = tgc.loads("x: f32[N]\nreturn x[(N + 1) % N] + x")
    prog.compile_symbolic("CPU")
    assert list(prog.symbolic_paths.values()) == ["one trace"]
    for n in (2, 3, 7, 300):
        inputs = {"x": np.linspace(-1, 1, n, dtype=np.float32)}
        _check(prog, prog.run(device="CPU", symbolic=True, **inputs), {"N": n}, inputs)
    # (N + 5) % N is 1 at N = 2, 0 at N = 5, 5 from N = 6: refused, named
    prog = tgc.loads("x: f32[N]\nreturn x[(N + 5) % N] + x")
    with pytest.raises(tgc.TgcError) as e:
        prog.compile_symbolic("CPU")
    assert "a size decision on (N+5) % N depends on a remainder" in str(e.value), str(e.value)
    (path,) = prog.symbolic_paths.values()
    assert "(N+5) % N" in path, path
    with pytest.raises(NotTraceable, match=r"the remainder \(N\+1\) % N is used as a number"):
        _Nonzero("(N+1) % N") + 1


@pytest.mark.parametrize("expr", ["x[:, : N // 32]", "x[:, N // 32 :]", "x[:, -(N // 32):]", "x[:, : N - 200]",
                                  "x[:, N // 32 :: 3]", "x[:32][: N // 8 + 1]"])
def test_a_fixed_axis_sliced_by_sizes_of_the_dims_keeps_them(expr):
    """`x[:, :N // 32]` of an f32[N, 64]: the slice's bounds are sizes of the dims on an axis of fixed size.
    `slice.indices` read them as the traced numbers, so one length was baked into the plan (class n and 32n:
    the full 64 columns at N = 320, 11 columns of `: N - 200` at every N)."""
    prog = tgc.loads(f"x: f32[N, 64]\nreturn {expr} * 2.0")
    for n in (64, 96, 203, 250, 320, 1024, 2048):
        inputs = {"x": np.random.default_rng(n).random((n, 64), dtype=np.float32)}
        _check(prog, prog.run(device="CPU", symbolic=True, **inputs), {"N": n}, inputs)


@pytest.mark.parametrize("expr", ["x[:: N // 32 + 1]", "x[N // 32 :: N // 32 + 1]"])
def test_a_step_that_depends_on_the_dims_gets_no_plan(expr):
    """A step of `N // 32 + 1` makes the length `(N - 1) // (N // 32 + 1) + 1`: 32 at both probes of the 32n
    class, 22 at N = 64. The one trace refuses it, and the probe path (which accepted the class on its two
    probes) is not tried: the class runs size-specialized kernels."""
    prog = tgc.loads(f"x: f32[N]\nreturn {expr} * 2.0")
    for n in (64, 96, 320, 1024, 7, 250):
        inputs = {"x": np.random.default_rng(n).random(n, dtype=np.float32)}
        _check(prog, prog.run(device="CPU", symbolic=True, **inputs), {"N": n}, inputs)
    # (in class n the probes' quotient is one number, 6, that bounds the plan: a constant step there)
    assert prog.symbolic_paths[("CPU", (("N", "32n"),))].startswith(
        "none: a slice with a step that depends on the dims"), prog.symbolic_paths


P32 = ({"M": 32 * 211, "N": 32 * 223, "C": 32 * 227}, {"M": 32 * 233, "N": 32 * 229, "C": 32 * 239})


def _at(v, dims: dict[str, int]) -> int:
    """A size (or a plain int) at these dims."""
    from tgc.ir.symsize import _eval
    return _eval(v.terms, dims) if isinstance(v, SymSize) else int(v)


def test_a_common_factor_cancels_exactly():
    """`(a * m + r) // (b * m)` with m a product of dims (at least 1 over the class) is `a // b` (r = 0), or `a/b`
    (-1) where 0 <= r < b m (-b m <= r < 0) at every size: each answer, evaluated at members of the class from its
    least up, is Python's floor division and remainder of the concrete sizes; a common factor that may be 0 and
    a remainder that is not below the divisor everywhere refuse."""
    from tgc.ir.symsize import _Nonzero, gcd

    m, n, c = (SymSize.dim(d, P32[0][d]) for d in "MNC")
    members = [{"M": 32 * i, "N": 32 * j, "C": 32 * k} for i in (1, 2, 3, 8, 16, 40) for j in (1, 3, 4, 7)
               for k in (1, 2, 9)]
    with checked_at(P32):
        cases = [(m * c * n * n, 4 * m * n * n), (c * n, n * (c // 4)), (m * n - 1, n), (m * n + 31, 32 * n),
                 (4 * (m // 32) * (n // 32), n // 8), (3 * m * n - 5, 3 * n), (5 * m * n, 2 * n)]
        for a, b in cases:
            q, r = a // b, a % b
            for dims in members:
                assert _at(q, dims) == _at(a, dims) // _at(b, dims), (a, b, dims)
                if not isinstance(r, _Nonzero):
                    assert _at(r, dims) == _at(a, dims) % _at(b, dims), (a, b, dims)
        assert str(m * c * n * n // (4 * m * n * n)) == "C//4" and c * n % (n * (c // 4)) == 0
        assert str((m * n - 1) // n) == "M-1" and str((m * n - 1) % n) == "N-1"
        # int's own divmod and gcd read the traced values (the dims lost): both keep them
        q, r = divmod(c, 3 * c)
        assert q == 0 and isinstance(r, SymSize) and r.terms == c.terms
        g = gcd(4 * (m // 32) * (n // 32), 4 * (n // 32))
        assert isinstance(g, SymSize) and g == 4 * (n // 32) and gcd(12, 18) == 6
        # a remainder the class knows only as not 0 (4M//32 % 32: 0 at M = 256) is below its divisor, no more
        rest = (4 * (m // 32) * (n // 32)) % n
        assert isinstance(rest, _Nonzero) and rest < n and rest >= 0
        with pytest.raises(NotTraceable):
            assert rest < m
    n1, d1 = SymSize.dim("N", 211), SymSize.dim("D", 223)
    with checked_at((P, Q)):
        assert (n1 * d1 + 1) // n1 == d1 and (n1 + 1) % n1 == 1 and (n1 - 1) // n1 == 0
        assert str((n1 * d1) // (2 * n1)) == "D//2"
        for dims in ({"N": 2, "D": 2}, {"N": 3, "D": 7}, {"N": 5, "D": 300}):
            assert _at((n1 * d1) // (2 * n1), dims) == dims["D"] // 2
        # N//4 is 0 at N = 2, 3 (class n from 2): not cancelled; N * D + 5 over N is D + 1 at N = 3, D from 6
        for refused in (lambda: (n1 * (n1 // 4)) // (2 * (n1 // 4)), lambda: (n1 * d1 + 5) // n1):
            with pytest.raises(NotTraceable):
                refused()
        # (N * D + 2) % N is 0 at N = 2: known only as not 0 at the probes, never as a number
        assert isinstance((n1 * d1 + 2) % n1, _Nonzero)


@pytest.mark.parametrize("name, runs", [
    # the heads' broadcast factor `BCTT // 4BTT` is C // 4 and the simplifier's `CT % T(C//4)` 0 (`_cancelled`);
    # a constant of C in an index no longer loses its dims through int's divmod
    ("transformer_block.tg", [{"B": 32, "T": 32, "C": 32}, {"B": 32, "T": 64, "C": 96},
                              {"B": 64, "T": 32, "C": 128}, {"B": 1, "T": 32, "C": 160}]),
    # the split reduction's index over 256 groups of 4(M//32)(N//32): its gcds (was a plain 892 at the probe)
    # and `(4(M//32)(N//32)) % N`, below N but 0 at M = 256 (the plan keeps the remainder: right there too)
    ("reductions.tg", [{"M": 32, "N": 32}, {"M": 288, "N": 288}, {"M": 512, "N": 288}, {"M": 288, "N": 1024},
                       {"M": 1, "N": 320}, {"M": 7, "N": 64}]),
])
def test_exact_cancels_trace_a_class_of_multiples_of_32_once(name, runs, monkeypatch):
    """transformer_block.tg and reductions.tg at 32n trace once with the probe path's plan (AST nodes, names,
    general, fast, unthreaded and tail sources, buffers, signature, trusted size, bound), and give numpy's
    results at the class's smallest member, above and below its trusted size, where a remainder the class does
    not answer is 0, and in the classes of a dim of 1 and of n next to it."""
    prog = tgc.load(KERNELS / name)
    probed = tgc.load(KERNELS / name)
    probed.one_trace = False
    cls = tuple((n, "32n") for n in prog.dim_names)
    plan, other = _traced_once_like_the_probes(prog, probed, cls, monkeypatch)
    assert plan.bound == other.bound and plan.derived.keys() == other.derived.keys()
    assert [[k.src for k in t] for t in plan.tails] == [[k.src for k in t] for t in other.tails]
    for dims in runs:
        inputs = random_inputs(prog, dims, seed=6)
        got = prog.run(device="CPU", symbolic=True, **inputs)
        _check(prog, got, dims, inputs)
        if min(dims.values()) >= max(plan.trusted_from, 32) and all(v % 32 == 0 for v in dims.values()):
            assert prog.last_run == "symbolic", (dims, prog.last_run)


def test_conv2d_at_32n_asks_the_outputs_count_before_the_split_reduce_threshold():
    """conv2d at 32n no longer stops at the split-reduce threshold `9C >= 65536`, which its two probes answer
    differently: the outputs' count is asked first (thousands of outputs are no split's at any size; the same
    answer at every concrete size). It stopped later, at a padded stride that is a sum of sizes; since branch
    symplan kernels index with such sums (each product in units of 32), and the class traces once."""
    conv = tgc.load(KERNELS / "conv2d.tg")
    cls = tuple((n, "32n") for n in conv.dim_names)
    conv.compile_symbolic("CPU", size_class=cls)
    assert conv.symbolic_paths[("CPU", cls)] == "one trace"
    for dims in ({"N": 32, "C": 32, "H": 32, "W": 32, "O": 32}, {"N": 32, "C": 64, "H": 96, "W": 32, "O": 32}):
        inputs = random_inputs(conv, dims, seed=3)
        got = conv.run("CPU", dims=dims, symbolic=True, **inputs)
        assert conv.last_run == "symbolic", conv.last_run
        _check(conv, got, dims, inputs)
