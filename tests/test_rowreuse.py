"""A row softmax computes exp once per element (tgc/codegen/rowreuse.py): the pass that sums exp(x - max) stores
it into the output row, the output pass scales that row in place. Counted on the lowered kernels (each op
weighted by the trip counts of the loops around it), and checked against numpy; the stored form falls back
to recomputing where the loop order would make it wrong (swapped loops, padded rows, threads over columns)."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.backends import get_device
from tgc.codegen.opt import Opt
from tgc.codegen.pipeline import lower
from tgc.codegen.rowreuse import resolve_row_values, stored_form_is_safe, tee_row_values
from tgc.ir.uop import Ops

SOFTMAX = "x: f32[N, D]\nreturn softmax(x, axis=1)"
LAYERNORM = "x: f32[N, D]\nreturn layernorm(x)"


def _evaluations(uops, pick) -> int:
    """How many values the kernel computes with ops that `pick` selects, over one launch: each such uop times
    its vector lanes times the trip counts of the loops around it, times the launch's threads (each thread's
    loop over its chunk counts its largest trip count: exact where the threads divide the rows)."""
    total, trips = 0, [1]
    for u in uops:
        if u.op is Ops.RANGE:
            end = u.src[0]
            trips.append(trips[-1] * (end.arg if end.op is Ops.CONST else int(end.vmax)))
        elif u.op is Ops.ENDRANGE:
            trips.pop()
        elif pick(u):
            lanes = (u.dtype if u.dtype is not None else u.src[2].dtype).count
            total += trips[-1] * lanes
    return total


def _lowered(src: str, dims: dict, device: str, opts=None):
    item = tgc.loads(src).schedule(dims, device)
    assert len(item) == 1
    low = lower(item[0].ast, get_device(device), item[0].bufs, "k", opts=opts)
    threads = low.launch.get("global_size", (1, 1, 1))[0] if not get_device(device).caps.gpu else 1
    return low.uops, threads


def _exps(uops) -> int:
    # PYTHON keeps EXP2 as one op; the CPU writes exp2 as a polynomial with one TRUNC (its floor) per value
    return _evaluations(uops, lambda u: u.op in (Ops.EXP2, Ops.TRUNC))


def _stores(uops, buf: int = 0) -> int:
    return _evaluations(uops, lambda u: u.op is Ops.STORE and u.src[0].arg == buf)


@pytest.mark.parametrize("n,d", [(64, 4096), (6, 48), (3, 13)])
def test_softmax_kernel_computes_exp_once_per_element(n, d):
    uops, threads = _lowered(SOFTMAX, {"N": n, "D": d}, "CPU")
    assert _exps(uops) * threads == n * d  # was 2 * n * d: once in the sum pass, again in the output pass
    # the sum pass stores exp(x - max) into the output row, the output pass scales it in place
    assert _stores(uops) * threads == 2 * n * d
    loads_of_out = _evaluations(uops, lambda u: u.op is Ops.LOAD and u.src[0].arg == 0)
    assert loads_of_out * threads == n * d


def test_masked_softmax_computes_exp_once_per_element():
    src = "x: f32[N, D]\nm: bool[N, D]\nreturn softmax(where(m, x, -1e30), axis=1)"
    uops, threads = _lowered(src, {"N": 8, "D": 40}, "CPU")
    assert _exps(uops) * threads == 8 * 40


def test_the_python_emulator_recomputes():
    """PYTHON does not declare `caps.reread_rows`: it runs a kernel that reads a buffer it writes one iteration
    at a time (a 100 x 100 softmax took 0.7 s instead of 1 ms), so its kernels recompute the row value."""
    from tgc.backends import get_device as dev
    assert not dev("PYTHON").caps.reread_rows and dev("CPU").caps.reread_rows
    uops, threads = _lowered(SOFTMAX, {"N": 6, "D": 48}, "PYTHON")
    assert _exps(uops) * threads == 2 * 6 * 48 and _stores(uops) * threads == 6 * 48


def test_log_softmax_already_computes_exp_once():
    """log_softmax's output pass needs x - max, not exp: nothing to store, nothing recomputed."""
    uops, threads = _lowered("x: f32[N, D]\nreturn log_softmax(x, axis=1)", {"N": 8, "D": 40}, "PYTHON")
    assert _exps(uops) * threads == 8 * 40
    assert _stores(uops) * threads == 8 * 40


def test_layernorm_reduces_each_row_once_per_reduction():
    """mean and variance: one accumulation per element each, one output pass; a cheap value, never stored twice."""
    uops, threads = _lowered(LAYERNORM, {"N": 64, "D": 4096}, "CPU")
    assert _evaluations(uops, lambda u: u.op is Ops.ACCUMULATE) * threads == 2 * 64 * 4096
    assert _stores(uops) * threads == 64 * 4096
    assert _evaluations(uops, lambda u: u.op is Ops.LOAD and u.src[0].arg == 0) == 0


@pytest.mark.parametrize("opts,exps", [([Opt("SWAP", 0, 1)], 6 * 13 * 13 + 6 * 13),
                                       ([Opt("PADTO", 3, 16)], 6 * 16 + 6 * 13),
                                       ([Opt("UPCAST", 0, 2)], 2 * 6 * 13)],
                         ids=["swap", "padto-sum", "upcast-rows"])
def test_loop_orders_that_would_break_the_stored_form_recompute(opts, exps):
    """Columns outside rows (SWAP: the sum then reruns per column), padded row iterations (PADTO of the sum's
    loop) and rows as unrolled copies keep the recomputed form: no store in the sum pass."""
    uops, threads = _lowered(SOFTMAX, {"N": 6, "D": 13}, "CPU", opts=opts)
    assert _exps(uops) * threads == exps
    assert _stores(uops) * threads == 6 * 13


def test_padding_the_max_pass_keeps_the_stored_form():
    uops, threads = _lowered(SOFTMAX, {"N": 6, "D": 13}, "CPU", opts=[Opt("PADTO", 2, 16)])
    assert _exps(uops) * threads == 6 * 13 and _stores(uops) * threads == 2 * 6 * 13


def test_threads_over_columns_recompute():
    """One row of 4096 floats: the CPU splits its columns across threads, and every thread storing the whole
    row would race with the others' output pass, so the kernel recomputes; the answer is right either way."""
    d = 4096
    uops, threads = _lowered(SOFTMAX, {"N": 1, "D": d}, "CPU")
    assert threads > 1 and _exps(uops) * threads == d + threads * d
    x = np.random.default_rng(1).standard_normal((1, d)).astype(np.float32)
    got = _run(SOFTMAX, "CPU", x=x)
    np.testing.assert_allclose(got, _softmax(x, 1), rtol=1e-5, atol=1e-7)


def test_gpu_kernels_never_keep_the_stored_form():
    item = tgc.loads(SOFTMAX).schedule({"N": 4, "D": 32}, "PYTHON")[0]
    dev = get_device("PYTHON")
    prepared = tee_row_values(item.ast)
    assert any(u.op is Ops.TEE for u in prepared.toposort()) and stored_form_is_safe(prepared)
    undone = resolve_row_values(prepared, gpu=True)
    assert undone is item.ast  # exactly the recomputed kernel
    kept = resolve_row_values(prepared, gpu=False)
    assert not any(u.op is Ops.REREAD for u in kept.toposort()) and any(u.op is Ops.TEE for u in kept.toposort())
    assert dev.caps.fuse_rows


def test_cheap_row_values_are_not_stored():
    """x - max (one op) is cheaper to recompute than to store and reload."""
    item = tgc.loads("x: f32[N, D]\nreturn x - x.max(1, keepdim=True) + (x * 2.0).sum(1, keepdim=True)").schedule(
        {"N": 4, "D": 32}, "PYTHON")[0]
    assert tee_row_values(item.ast) is item.ast


def _run(src: str, device: str, **inputs) -> np.ndarray:
    (out,) = tgc.loads(src).run(device=device, **inputs).values()
    return np.asarray(out)


def _softmax(x, axis):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


CASES = [
    (SOFTMAX, (7, 13), lambda x: _softmax(x, 1)),
    (SOFTMAX, (5, 1), lambda x: _softmax(x, 1)),
    (SOFTMAX, (1, 300), lambda x: _softmax(x, 1)),
    ("x: f32[N, D]\nreturn softmax(x, axis=0)", (37, 19), lambda x: _softmax(x, 0)),
    ("x: f32[A, B, C]\nreturn softmax(x, axis=-1)", (3, 5, 33), lambda x: _softmax(x, -1)),
    ("x: f32[A, B, C]\nreturn softmax(x, axis=1)", (3, 5, 33), lambda x: _softmax(x, 1)),
    ("x: f32[N, D]\nreturn softmax(x, axis=1).transpose(1, 0)", (33, 48), lambda x: _softmax(x, 1).T),
    ("x: f32[N, D]\nreturn softmax(x * 2.0, axis=1) + x", (9, 67), lambda x: _softmax(2 * x, 1) + x),
    ("x: f32[N, D]\nreturn log_softmax(x, axis=1)", (9, 100), lambda x: np.log(_softmax(x, 1))),
    (LAYERNORM, (9, 100), lambda x: (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)),
]


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
@pytest.mark.parametrize("src,shape,ref", CASES, ids=[f"{c[0].splitlines()[-1]}-{c[1]}" for c in CASES])
def test_row_kernels_match_numpy(device, src, shape, ref):
    x = (np.random.default_rng(0).standard_normal(shape) * 3).astype(np.float32)
    got = _run(src, device, x=x)
    np.testing.assert_allclose(got, ref(x.astype(np.float64)), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_masked_softmax_matches_numpy(device):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 45)).astype(np.float32)
    m = rng.random((6, 45)) < 0.7
    m[:, 0] = True
    got = _run("x: f32[N, D]\nm: bool[N, D]\nreturn softmax(where(m, x, -1e30), axis=1)", device, x=x, m=m)
    np.testing.assert_allclose(got, _softmax(np.where(m, x, -1e30), 1), rtol=2e-5, atol=1e-7)


def test_softmax_and_layernorm_4096_squared_match_numpy():
    x = np.random.default_rng(3).standard_normal((4096, 4096)).astype(np.float32)
    got = _run(SOFTMAX, "CPU", x=x)
    np.testing.assert_allclose(got, _softmax(x, 1), rtol=2e-5, atol=1e-9)
    got = _run(LAYERNORM, "CPU", x=x)
    xd = x.astype(np.float64)
    want = (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
