"""BEAM's search space and its rounds (`tgc.codegen.search.actions`, `round_actions`; branch corpusbeam, issue 20
item 5): on the CPU a search may pad an output axis (odd rows rounded up to a tile, as the heuristic's
`padded_rows` does), and a winner doing so runs right (checked against numpy); fewer threads than the automatic
count are tried only for kernels whose default is short (`FEWER_THREADS_MAX_S`)."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.backends import get_device
from tgc.codegen import search
from tgc.codegen.opt import Opt, OptKernel, OptOps
from tgc.codegen.pipeline import prepare

CPU = get_device("CPU")
MATMUL = "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b"
DIMS = {"M": 77, "K": 64, "N": 64}


def _item(dims: dict, device: str = "CPU"):
    (item,) = [it for it in tgc.loads(MATMUL).schedule(dims, device) if it.ast.src]
    return item


def _kernel(dims: dict, device=CPU) -> OptKernel:
    return OptKernel(prepare(_item(dims, device.name).ast, device), device)


def test_cpu_search_pads_odd_output_axes_only():
    k = _kernel(DIMS)  # output axes: 77 rows (odd), 64 columns (a multiple of every amount)
    pads = [o for o in search.actions(k) if o.op is OptOps.PADTO and o.axis < len(k.loops())]
    assert sorted(pads, key=lambda o: o.amount) == [Opt(OptOps.PADTO, 0, a) for a in (8, 16, 32)]
    even = _kernel({"M": 64, "K": 64, "N": 64})
    assert not [o for o in search.actions(even) if o.op is OptOps.PADTO and o.axis < len(even.loops())]


def test_a_gpu_search_pads_no_output_axis():
    pytest.importorskip("pyopencl")
    dev = get_device("OPENCL")
    if dev.compiler is None:
        pytest.skip(dev.compile_error or "no OpenCL here")
    k = _kernel(DIMS, dev)
    assert not [o for o in search.actions(k) if o.op is OptOps.PADTO and o.axis < len(k.loops())]


def test_a_winner_with_a_padded_output_axis_runs_right(tmp_path, monkeypatch):
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    k = _kernel(DIMS)
    k.apply(Opt(OptOps.UPCAST, 1, 16))
    pad = Opt(OptOps.PADTO, 0, 32)
    assert pad in search.actions(k)  # offered after the column vector too
    k.apply(pad)
    k.apply(Opt(OptOps.UPCAST, 0, 4))  # 77 rows padded to 96, in tiles of 4
    item = _item(DIMS)
    search.store(search.search_ast(item, CPU), CPU, k.applied, 1e-3, item.name, width=4)
    p = tgc.loads(MATMUL)
    (kern,) = p.compile("CPU", dims=DIMS)
    # the stored winner is what runs (the automatic THREAD appended where it has none)
    assert [str(o) for o in kern.opts][:len(k.applied)] == [str(o) for o in k.applied]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((77, 64)).astype(np.float32)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    out = p.run(a=a, b=b)
    got = out if isinstance(out, np.ndarray) else next(iter(out.values()))
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_fewer_threads_are_tried_only_for_short_kernels():
    if not search.thread_amounts(CPU.cores):
        pytest.skip("one core: no fewer threads to try")
    k = _kernel(DIMS)
    threads = [Opt(OptOps.THREAD, 0, t) for t in search.thread_amounts(CPU.cores)]
    short = search.round_actions(k, search.FEWER_THREADS_MAX_S / 2)
    long = search.round_actions(k, search.FEWER_THREADS_MAX_S * 2)
    assert [o for o in short if o.op is OptOps.THREAD] == threads
    assert not [o for o in long if o.op is OptOps.THREAD]
    assert [o for o in short if o.op is not OptOps.THREAD] == long  # the rest of the round is the same


def test_a_round_compiles_one_candidate_per_worker_before_timing():
    assert search.candidate_group(None) == 1  # compiled in this process: one at a time
    pool = CPU.compile_pool(3)
    try:
        assert search.candidate_group(pool) == 3
    finally:
        pool.shutdown(cancel_futures=True)


def test_beam_searches_the_kernels_a_chunked_run_launches(monkeypatch, tmp_path):
    from tgc.engine import chunk
    monkeypatch.setattr(chunk, "MIN_CHUNK_BYTES", 0)  # (small sizes: chunks of a few KiB)
    monkeypatch.delenv("TGC_CHUNK", raising=False)
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    src = "x: f32[B, N]\nw1: f32[N, H]\nw2: f32[H, N]\nreturn relu(x @ w1) @ w2"
    dims = {"B": 64, "N": 8, "H": 64}  # the [B, H] hidden layer is twice the inputs + outputs: run in chunks
    prog = tgc.loads(src)
    ch = prog.chunking("CPU", dims)
    assert ch is not None and ch.dim == "B"
    ran = [it for it in prog.run_schedule(dims, "CPU") if it.ast.src]
    whole = [it for it in prog.schedule(dims, "CPU") if it.ast.src]
    assert {search.search_ast(it, CPU) for it in ran}.isdisjoint(search.search_ast(it, CPU) for it in whole)
    prog.beam("CPU", dims=dims, width=1, budget_s=None)
    assert all(search.lookup_entry(search.search_ast(it, CPU), CPU) is not None for it in ran)
    rng = np.random.default_rng(0)
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((64, 8), (8, 64), (64, 8)))
    got = prog.run(dims=dims, x=x, w1=w1, w2=w2)[prog.output_names[0]]
    assert prog.last_chunking is not None
    want = np.maximum(x.astype(np.float64) @ w1, 0) @ w2
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
