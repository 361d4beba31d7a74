"""Chunked runs (tgc/engine/chunk.py, realize.run_chunked): a program separable along a batch axis whose planned
peak is over 1.5x its inputs+outputs runs in equal chunks of that axis; anything that mixes the batch rows
never does. Small sizes here, so the minimum chunk size (`MIN_CHUNK_BYTES`) is lifted."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.dsl.tensor import Tensor
from tgc.engine import chunk
from tgc.ir.shapes import shape_of

B, N = 8, 256
DIMS = {"B": B, "N": N}
X = B * N * 4  # bytes of x


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch):
    monkeypatch.setattr(chunk, "MIN_CHUNK_BYTES", 0)
    monkeypatch.delenv("TGC_CHUNK", raising=False)


def _chain(last: str = "rows") -> tgc.Program:
    """x[B, N] -> three realized steps t = exp(flip(t) / 2) / 2 - 1/4 (each reads its input reversed along N,
    so none runs in place: two [B, N] intermediates alternate) -> `last`: "rows" sums each row (out[B]: the
    program is separable along B), "batch" sums over B (out[N]), "transpose" returns t.T[:4] (B moved to
    axis 1), "contract" sums t.T @ x over its last axis (a matmul contracting B)."""
    prog = tgc.loads("x: f32[B, N]\nreturn x * 2.0\n")
    _, bufs = prog._trace(DIMS)
    x = Tensor(bufs[0])
    t = x
    for _ in range(3):
        t = ((t.flip(1) * 0.5).exp() * 0.5 - 0.25).contiguous()
    out = {"rows": lambda: t.sum(1), "batch": lambda: t.sum(0),
           "transpose": lambda: t.T.shrink(((0, 4), (0, B))).contiguous(),
           "contract": lambda: (t.T @ x).sum(1)}[last]()
    prog._traces[tuple(sorted(DIMS.items()))] = ([out.uop], bufs)
    return prog


def _want(x: np.ndarray, last: str = "rows") -> np.ndarray:
    t = x.astype(np.float64)
    for _ in range(3):
        t = np.exp(t[:, ::-1] * 0.5) * 0.5 - 0.25
    return {"rows": lambda: t.sum(1), "batch": lambda: t.sum(0), "transpose": lambda: t.T[:4],
            "contract": lambda: (t.T @ x).sum(1)}[last]()


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((B, N)).astype(np.float32)


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_a_separable_chain_runs_in_the_fewest_chunks_within_the_bound(device):
    prog = _chain()
    ch = prog.chunking(device, DIMS)
    out_bytes = B * 4
    io = X + out_bytes
    # whole: x and two alternating [B, N] slots (the output takes a dead one): 3X > 1.5 io; 2 chunks leave X of
    # intermediates beside x and the output (2X + out > 1.5 io), 4 chunks X / 2 (1.5X + out <= 1.5 io)
    assert ch is not None and (ch.dim, ch.count, ch.sliced) == ("B", 4, {"x"})
    # each chunk's 2 output rows (8 bytes) are no whole aligned part of the output: a slot of their own, copied
    assert (ch.io, ch.before, ch.after) == (io, 3 * X, io + 2 * X // 4 + 8)
    for seed in range(3):  # the same chunked path every time (no launch plan kept between runs)
        x = _x(seed)
        before = x.copy()
        got = prog.run(device=device, dims=DIMS, x=x)[prog.output_names[0]]
        assert prog.last_chunking is ch
        np.testing.assert_allclose(got, _want(before), rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(x, before)  # the user's input is never written


def test_chunked_and_whole_give_the_same_outputs_and_tgc_chunk_0_turns_it_off(monkeypatch):
    prog = _chain()
    x = _x(1)
    chunked = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
    assert prog.last_chunking is not None
    monkeypatch.setenv("TGC_CHUNK", "0")
    assert prog.chunking("CPU", DIMS) is None
    whole = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
    assert prog.last_chunking is None
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-6)
    monkeypatch.setenv("TGC_CHUNK", "2")
    with pytest.raises(tgc.errors.TgcError, match="TGC_CHUNK"):
        prog.run(dims=DIMS, x=x)


def test_the_measured_peak_of_a_chunked_run_is_its_plan(monkeypatch):
    prog = _chain()
    ch = prog.chunking("CPU", DIMS)
    alloc = tgc.api._device("CPU").allocator
    x = _x(2)
    prog.run(dims=DIMS, x=x)  # (compiles; the executable then keeps one chunk's intermediates)
    prog.release()  # (gives them back)
    alloc.free_cache()
    borrowed = X if x.ctypes.data % alloc.zero_copy_align == 0 else 0  # else each chunk's slice is copied in
    copied = 0 if borrowed else X // ch.count
    alloc.reset_peak()
    base = alloc.live_bytes
    prog.run(dims=DIMS, x=x)
    assert alloc.peak_bytes - base == ch.after - X + copied == B * 4 + 2 * X // 4 + 8 + copied
    # kept for the next run (`realize.ChunkRuns`): one chunk's intermediates, the chunk's 8-byte output slot and
    # the slot its input is copied into; the whole output (B * 4) went to the user. A run again adds only that
    assert alloc.live_bytes - base == 2 * X // 4 + 8 + copied
    alloc.reset_peak()
    kept = alloc.live_bytes
    prog.run(dims=DIMS, x=x)
    assert alloc.peak_bytes - kept == B * 4 and alloc.live_bytes == kept
    prog.release()
    assert alloc.live_bytes == base
    # unchunked, the run allocates the two intermediates whole (the output in a dead one): X + X / 2 less chunked
    assert ch.before - ch.after == 2 * X - (2 * X // 4 + B * 4 + 8)
    monkeypatch.setenv("TGC_CHUNK", "0")
    prog.release()  # (then a first run at these dims: not a launch plan, which would copy the input in)
    alloc.free_cache()
    alloc.reset_peak()
    base = alloc.live_bytes
    prog.run(dims=DIMS, x=x)
    whole = alloc.peak_bytes - base
    assert whole == ch.before - borrowed == 2 * X + (X - borrowed)


@pytest.mark.parametrize("last", ["batch", "transpose", "contract"])
def test_a_program_mixing_batch_rows_is_never_chunked(last):
    prog = _chain(last)
    low = prog.lower("CPU", DIMS)
    outs, bufs = prog._trace(DIMS)
    io = X + sum(o.dtype.itemsize * int(np.prod(shape_of(o))) for o in outs)
    assert low.memory_plan().peak_bytes > chunk.LIMIT * io  # chunking would lower it: the analysis says no
    for count in (2, 4, 8):
        assert chunk.separable(outs, bufs, {0: 0}, B, count) is None
    assert prog.chunking("CPU", DIMS) is None
    x = _x(3)
    got = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
    assert prog.last_chunking is None
    np.testing.assert_allclose(got, _want(x, last), rtol=1e-4, atol=1e-3)


def test_a_program_within_the_bound_or_with_uneven_chunks_is_not_chunked():
    prog = tgc.loads("x: f32[B, N]\nreturn exp(x) * 2.0\n")  # one kernel: x and the output only
    assert prog.chunking("CPU", DIMS) is None
    prog = tgc.loads("x: f32[B, N]\nreturn sum(exp(flip(exp(flip(x, 1)), 1)), axis=1)\n")
    assert prog.chunking("CPU", {"B": 7, "N": N}) is None  # 7 rows: no equal chunks


def test_debug_2_says_it_chunked(monkeypatch, capfd):
    monkeypatch.setenv("DEBUG", "2")
    prog = _chain()
    prog.run(dims=DIMS, x=_x(4))
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "chunked along" in ln]
    assert len(lines) == 1
    assert "chunked along B into 4 chunks of 2: planned peak" in lines[0] and "-> " in lines[0]


def test_a_small_transformer_block_chunked_matches_numpy_and_the_whole_run(monkeypatch):
    prog = tgc.load("kernels/transformer_block.tg")
    dims = {"B": 4, "T": 16, "C": 32}
    rng = np.random.default_rng(5)
    inputs = {d.name: (rng.standard_normal(tgc.dsl.frontend.concrete_shape(d, dims)) * 0.2).astype(np.float32)
              for d in prog.inputs}
    ch = prog.chunking("CPU", dims)
    assert ch is not None and ch.dim == "B" and ch.sliced == {"x"} and ch.after < ch.before
    before = {k: v.copy() for k, v in inputs.items()}
    got = prog.run(dims=dims, inputs=inputs)[prog.output_names[0]]
    assert prog.last_chunking is ch
    for k in inputs:
        np.testing.assert_array_equal(inputs[k], before[k])
    want = prog.reference(dims=dims, **inputs)[prog.output_names[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    monkeypatch.setenv("TGC_CHUNK", "0")
    whole = prog.run(dims=dims, inputs=inputs)[prog.output_names[0]]
    np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-5)


def _launch_spy(monkeypatch, fail: bool = False) -> dict[str, int]:
    """Counts, from now on, of the CPU device graphs built (and the kernels in them) and of the kernels launched
    on their own (`realize.launch`); with `fail` every graph fails to be built (as one over a kernel of too many
    arguments does)."""
    from tgc.backends.cpu_graph import CPUGraph
    from tgc.engine import realize
    dev = tgc.api._device("CPU")
    seen = {"graphs": 0, "graph_kernels": 0, "launches": 0, "graph_runs": 0}
    make, one, call = dev.graph, realize.launch, CPUGraph.__call__

    def run(self, *a, **kw):
        seen["graph_runs"] += 1
        return call(self, *a, **kw)

    def graph(launches, **kw):
        if fail:
            raise ValueError("no graph here")
        seen["graphs"] += 1
        seen["graph_kernels"] += len(launches)
        return make(launches, **kw)

    def launch(k, bufs, *a, **kw):
        seen["launches"] += 1
        return one(k, bufs, *a, **kw)

    monkeypatch.setattr(dev, "graph", graph)
    monkeypatch.setattr(realize, "launch", launch)
    monkeypatch.setattr(CPUGraph, "__call__", run)
    return seen


def test_each_chunk_runs_as_one_cpu_graph_and_one_by_one_without_graphs(monkeypatch):
    """A chunked run on the CPU launches each chunk's kernels as one device graph (one native call: no thread
    hand-off per kernel); TGC_GRAPH=0, DEBUG=2 (a line per kernel) and a device that cannot make the graph
    launch them one by one; the outputs are numpy's every way. The chunks' graphs are built at the first run and
    kept (`realize.ChunkRuns`): a run again builds none."""
    prog = _chain()
    ch = prog.chunking("CPU", DIMS)
    n = len(ch.low.kernels)
    assert ch.count == 4 and n > 1
    seen = _launch_spy(monkeypatch)
    x = _x(7)
    prog.run(dims=DIMS, x=x)  # (compiles; builds each chunk's graph)
    assert seen == {"graphs": ch.count, "graph_kernels": ch.count * n, "launches": 0, "graph_runs": ch.count}
    seen.update(graphs=0, graph_kernels=0, graph_runs=0)
    for seed in range(2):
        x = _x(8 + seed)
        got = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
        np.testing.assert_allclose(got, _want(x), rtol=1e-4, atol=1e-4)
    assert prog.last_chunking is ch
    assert seen == {"graphs": 0, "graph_kernels": 0, "launches": 0, "graph_runs": 2 * ch.count}
    for env, value in (("TGC_GRAPH", "0"), ("DEBUG", "2")):
        with monkeypatch.context() as m:
            m.setenv(env, value)
            seen.update(graphs=0, graph_kernels=0, launches=0, graph_runs=0)
            got = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
            np.testing.assert_allclose(got, _want(x), rtol=1e-4, atol=1e-4)
            assert seen == {"graphs": 0, "graph_kernels": 0, "launches": ch.count * n, "graph_runs": 0}, env
    prog.release()  # (the kept graphs dropped: the next run builds them, and cannot)
    seen = _launch_spy(monkeypatch, fail=True)
    got = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
    np.testing.assert_allclose(got, _want(x), rtol=1e-4, atol=1e-4)
    assert seen == {"graphs": 0, "graph_kernels": 0, "launches": ch.count * n, "graph_runs": 0}


def test_bench_times_the_chunked_run(monkeypatch):
    prog = _chain()
    x = _x(6)
    r = prog.bench(dims=DIMS, inputs={"x": x}, repeat=2)
    assert r["program"]["chunks"] == 4 and not r["program"]["graph"] and r["program"]["median_s"] > 0
    assert r["program"]["flops"] == 4 * sum(k["flops"] for k in r["kernels"])
    monkeypatch.setenv("TGC_CHUNK", "0")
    assert "chunks" not in prog.bench(dims=DIMS, inputs={"x": x}, repeat=2)["program"]


def test_a_broadcast_weight_stays_whole_per_shard_and_sharded_runs_stay_right():
    """multi.plan narrows a batched matmul's broadcast weight (reshape, expand, reshape, expand) instead of
    slicing it per shard: every shard's graph is the same (what chunking needs), and a sharded run is right."""
    prog = tgc.loads("x: f32[B, T, C]\nw: f32[C, D]\nreturn (x @ w) * 2.0\n")
    dims = {"B": 4, "T": 3, "C": 5, "D": 6}
    outs, bufs = prog._trace(dims)
    assert chunk.separable(outs, bufs, {0: 0}, 4, 2) is not None
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    w = rng.standard_normal((5, 6)).astype(np.float32)
    got = prog.run(device="CPU:0,CPU:1", dims=dims, shard={"x": 0}, x=x, w=w)[prog.output_names[0]]
    np.testing.assert_allclose(got, (x.astype(np.float64) @ w) * 2.0, rtol=1e-5, atol=1e-5)


def test_divisors_of_a_dim_match_every_count_tried_and_a_huge_dims_are_found_by_its_square_root():
    for n in (1, 2, 7, 12, 36, 97, 360, 1024, 9973, 65536):
        for most in (1, 5, 64, n):
            assert chunk.divisors(n, most) == [c for c in range(1, n + 1) if n % c == 0 and c <= most]
    # a dim of 2^31 + 5 rows: O(sqrt(n)) steps (trying every count up to n took minutes of a first run)
    n = 2**31 + 5  # = 7^2 * 43826197 (a prime)
    assert chunk.divisors(n, n) == [1, 7, 49, 43826197, 7 * 43826197, n]
    assert chunk.divisors(n, 10**6) == [1, 7, 49]


def _three_live() -> tgc.Program:
    """x[B, N] -> t1 = exp(flip(x) / 2), t2 = exp(flip(t1) / 2 - 1/4), t3 = flip(t1) + flip(t2), out = 2 flip(t3)
    (flips: nothing runs in place): t1, t2 and t3 are live together at t3's kernel, and t1 and t2 die before the
    output's kernel."""
    prog = tgc.loads("x: f32[B, N]\nreturn x * 2.0\n")
    _, bufs = prog._trace(DIMS)
    x = Tensor(bufs[0])
    t1 = (x.flip(1) * 0.5).exp().contiguous()
    t2 = (t1.flip(1) * 0.5 - 0.25).exp().contiguous()
    t3 = (t1.flip(1) + t2.flip(1)).contiguous()
    prog._traces[tuple(sorted(DIMS.items()))] = ([(t3.flip(1) * 2.0).uop], bufs)
    return prog


def test_a_chunks_output_part_holds_intermediates_that_die_before_it_is_written(monkeypatch):
    prog = _three_live()
    ch = prog.chunking("CPU", DIMS)
    io = 2 * X
    # whole: x, and t1, t2, t3 at once (the output takes t1's dead slot): 4X = 2x io. A chunk of c images needs
    # three slots of X / c, or two with t1 (or t2) in the chunk's part of the output, which is only written by
    # the last kernel: 2 chunks are then within 1.5x (io + X), where 4 were needed (io + 3X / 4)
    assert ch is not None and (ch.count, ch.before, ch.after) == (2, 4 * X, io + X)
    plan = ch.low.memory_plan()
    out_key = ch.low.outputs[0][1]
    host = plan.slot_of[out_key]
    shared = [k for k, s in plan.slot_of.items() if s == host and k is not out_key]
    assert len(shared) == 1 and plan.lifetimes[shared[0]][1] < plan.lifetimes[out_key][0]
    assert plan.slots[host] == plan.sizes[out_key] == X // 2
    alloc = tgc.api._device("CPU").allocator
    x = _x(4)
    want = np.exp(x[:, ::-1].astype(np.float64) * 0.5)
    t2 = np.exp(want[:, ::-1] * 0.5 - 0.25)
    want = 2 * (want[:, ::-1] + t2[:, ::-1])[:, ::-1]
    for _ in range(2):  # (the second run runs the chunks' kept graphs on the kept intermediates)
        got = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
        assert prog.last_chunking is ch
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    prog.release()  # (the kept intermediates given back: the next run allocates them)
    alloc.free_cache()
    borrowed = x.ctypes.data % alloc.zero_copy_align == 0  # else each chunk's slice is copied in
    alloc.reset_peak()
    base = alloc.live_bytes
    got = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
    assert alloc.peak_bytes - base == ch.after - X + (0 if borrowed else X // 2)  # the whole output, 2 slots of X/2
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert alloc.live_bytes - base == X + (0 if borrowed else X // 2)  # kept: the 2 slots (and the copied input's)
    alloc.reset_peak()
    kept = alloc.live_bytes
    got = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
    assert alloc.peak_bytes - kept == X and alloc.live_bytes == kept  # a run again: only the whole output
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("TGC_CHUNK", "0")
    np.testing.assert_allclose(prog.run(dims=DIMS, x=x)[prog.output_names[0]], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["node_twice", "input_second"])
def test_a_chunked_run_fills_every_output_when_one_node_is_two_outputs_or_an_input_is_returned(case):
    """Review 17: a node returned twice left the first output's part unwritten (intermediates' bytes), and an
    input returned after a computed output left its part unwritten (the input was borrowed instead)."""
    prog = tgc.loads("x: f32[B, N]\nreturn x * 2.0, x * 3.0\n")
    _, bufs = prog._trace(DIMS)
    x = Tensor(bufs[0])
    t1 = (x.flip(1) * 0.5).exp().contiguous()
    t2 = (t1.flip(1) * 0.5 - 0.25).exp().contiguous()
    t4 = (t2.flip(1) * 0.3).exp().contiguous()
    t5 = (t4.flip(1) * 0.2 + t1).exp().contiguous()
    t3 = (t1.flip(1) + t2.flip(1) + t4.flip(1) + t5.flip(1)).contiguous()
    out = t3.flip(1) * 2.0
    outs = [out, out] if case == "node_twice" else [out, x]
    prog._traces[tuple(sorted(DIMS.items()))] = ([o.uop for o in outs], bufs)
    ch = prog.chunking("CPU", DIMS)
    assert ch is not None and ch.count > 1
    for seed in range(5, 8):  # (a run again reuses the kept intermediates: old bytes where unwritten)
        xin = _x(seed)
        t1 = np.exp(xin[:, ::-1].astype(np.float64) * 0.5)
        t2 = np.exp(t1[:, ::-1] * 0.5 - 0.25)
        t4 = np.exp(t2[:, ::-1] * 0.3)
        t5 = np.exp(t4[:, ::-1] * 0.2 + t1)
        want = [2 * (t1[:, ::-1] + t2[:, ::-1] + t4[:, ::-1] + t5[:, ::-1])[:, ::-1]]
        want.append(want[0] if case == "node_twice" else xin)
        got = prog.run(dims=DIMS, x=xin)
        for name, w in zip(prog.output_names, want):
            np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5)  # (exp of exp: up to 1e19 in f32)


def _alloc_spy(monkeypatch) -> list[int]:
    """The sizes of the CPU allocator's allocations from now on (pooled or not)."""
    alloc = tgc.api._device("CPU").allocator
    sizes: list[int] = []
    make = alloc.alloc

    def counted(nbytes):
        sizes.append(nbytes)
        return make(nbytes)

    monkeypatch.setattr(alloc, "alloc", counted)
    return sizes


def _misaligned(x: np.ndarray) -> np.ndarray:
    """`x`'s values in an array whose data starts 4 bytes past an aligned address (copied in, not borrowed)."""
    align = tgc.api._device("CPU").allocator.zero_copy_align
    raw = np.empty(x.size + 2 * align, dtype=x.dtype)
    skip = (-raw.ctypes.data % align) // x.itemsize + 1
    out = raw[skip:skip + x.size].reshape(x.shape)
    out[...] = x
    assert out.ctypes.data % align
    return out


def test_a_chunked_run_again_builds_no_graph_and_allocates_only_its_outputs(monkeypatch):
    """`realize.ChunkRuns`: the chunks' graphs and planned buffers are kept between runs; a run again points each
    chunk's graph at its input slices and output parts and allocates only the whole output. An input that comes
    misaligned (so copied into a slot) rebuilds the chunks' graphs once, and an aligned one again; results are
    numpy's on every run, inputs different each time."""
    prog = _chain()
    ch = prog.chunking("CPU", DIMS)
    assert ch.count == 4
    seen = _launch_spy(monkeypatch)
    sizes = _alloc_spy(monkeypatch)
    prog.run(dims=DIMS, x=_x(20))  # (compiles, builds the graphs, allocates the kept slots)
    assert seen["graphs"] == ch.count
    kept = prog._ready[prog._ready_key(tgc.api._device("CPU"), DIMS)].exe.kept
    assert kept is not None and kept.graphs_built == ch.count and len(kept.chunks) == ch.count
    for seed, placed in ((21, "aligned"), (22, "aligned"), (23, "misaligned"), (24, "misaligned"),
                         (25, "aligned"), (26, "aligned")):
        x = _x(seed)
        if placed == "misaligned":
            x = _misaligned(x)
        elif x.ctypes.data % tgc.api._device("CPU").allocator.zero_copy_align:
            continue  # (numpy gave an unaligned array: nothing to check here)
        before = x.copy()
        seen.update(graphs=0, graph_kernels=0, launches=0, graph_runs=0)
        sizes.clear()
        builds = kept.graphs_built
        got = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
        np.testing.assert_allclose(got, _want(before), rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(x, before)
        assert seen["launches"] == 0 and seen["graph_runs"] == ch.count
        changed = seed in (23, 25)  # (the first run of each placement after the other)
        assert kept.graphs_built - builds == seen["graphs"] == (ch.count if changed else 0), seed
        # the whole output, and the first time an input is copied in, its slot (the next copied chunks reuse it)
        assert sizes == ([B * 4, X // ch.count] if seed == 23 else [B * 4]), (seed, sizes)


def test_a_chunked_program_run_from_two_threads_at_once():
    """Two threads running one chunked Program: one runs the kept graphs, the other meanwhile the chunks on
    buffers of its own (`ChunkRuns.lock`); every result is numpy's."""
    import threading

    prog = _chain()
    prog.run(dims=DIMS, x=_x(30))
    errors: list[BaseException] = []

    def work(base: int) -> None:
        try:
            for seed in range(base, base + 15):
                x = _x(seed)
                got = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
                np.testing.assert_allclose(got, _want(x), rtol=1e-4, atol=1e-4)
        except BaseException as e:  # (reported on the main thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(100 * (t + 1),)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_a_dropped_chunked_program_gives_its_kept_buffers_back():
    import gc

    alloc = tgc.api._device("CPU").allocator
    prog = _chain()
    prog.run(dims=DIMS, x=_x(40))  # (compiles)
    prog.release()
    gc.collect()  # (other tests' programs dropped: what they kept given back)
    base = alloc.live_bytes
    for seed in range(3):
        prog.run(dims=DIMS, x=_x(41 + seed))
    assert alloc.live_bytes > base  # (one chunk's intermediates kept)
    del prog
    gc.collect()
    assert alloc.live_bytes == base


def test_a_chunked_run_holds_no_output_array_after_it_returns():
    """The kept graphs point at each run's output parts only while it runs: an output the user drops is freed."""
    import gc
    import weakref

    prog = _three_live()  # (its chunks' output parts are aligned: the graphs write them in place)
    assert prog.chunking("CPU", DIMS).count == 2
    for seed in range(50, 53):  # (the first run builds the graphs on its output parts)
        got = prog.run(dims=DIMS, x=_x(seed))[prog.output_names[0]]
        root = got
        while root.base is not None:
            root = root.base
        ref = weakref.ref(root)
        del got, root
        gc.collect()
        assert ref() is None


def test_a_chunked_run_holds_no_input_array_after_it_returns():
    """Nor the user's inputs (review 21: the last run's inputs were held until the next run, so `x.resize`
    refused and their memory stayed): after a run the input is freed, resizable, and the next run reads a new
    array at its own address."""
    import gc
    import weakref

    prog = _three_live()
    assert prog.chunking("CPU", DIMS).count == 2
    for seed in range(60, 63):
        x = _x(seed)
        got = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
        np.testing.assert_allclose(got, prog.run(device="PYTHON", dims=DIMS, x=x)[prog.output_names[0]],
                                   rtol=1e-5, atol=1e-5)
        x.resize((2 * x.shape[0],) + x.shape[1:])  # (raises where an array references it)
        ref = weakref.ref(x)
        del x
        gc.collect()
        assert ref() is None


def test_a_chunked_run_while_another_holds_the_kept_graphs_runs_on_its_own_buffers(monkeypatch):
    """While one run holds the executable's kept graphs (`ChunkRuns.lock`), another runs its chunks as before
    (buffers from the pool, a graph built per chunk) and leaves the kept ones alone."""
    prog = _chain()
    ch = prog.chunking("CPU", DIMS)
    prog.run(dims=DIMS, x=_x(60))
    kept = prog._ready[prog._ready_key(tgc.api._device("CPU"), DIMS)].exe.kept
    graphs = {i: c.graph for i, c in kept.chunks.items()}
    seen = _launch_spy(monkeypatch)
    assert kept.lock.acquire(blocking=False)
    try:
        x = _x(61)
        got = prog.run(dims=DIMS, x=x)[prog.output_names[0]]
    finally:
        kept.lock.release()
    np.testing.assert_allclose(got, _want(x), rtol=1e-4, atol=1e-4)
    assert seen["graphs"] == ch.count and kept.graphs_built == ch.count  # (built for that run, not kept)
    assert {i: c.graph for i, c in kept.chunks.items()} == graphs
    x = _x(62)
    np.testing.assert_allclose(prog.run(dims=DIMS, x=x)[prog.output_names[0]], _want(x), rtol=1e-4, atol=1e-4)
    assert seen["graphs"] == ch.count  # (the kept graphs again)
