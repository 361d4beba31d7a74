"""The first call's compile path (branch firstcall): a run decides whether to chunk without lowering the
whole program when nothing could be chunked (`chunk.chunk_counts` empty), so its compiles overlap its lowering
(`build_kernels` without `defer`); a program that could be chunked still decides from the memory plans."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.engine import chunk

SRC = "x: f32[B, N]\nw: f32[N, N]\nreturn ((x @ w).exp() * 0.5).sum(1)\n"


def _want(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return (np.exp(x.astype(np.float64) @ w) * 0.5).sum(1)


def _defers(prog: tgc.Program, monkeypatch) -> list[bool]:
    """Records `defer` of every `_build_kernels` call of `prog`."""
    calls: list[bool] = []
    orig = prog._build_kernels

    def spy(*a, **kw):
        calls.append(bool(kw.get("defer", False)))
        return orig(*a, **kw)

    monkeypatch.setattr(prog, "_build_kernels", spy)
    return calls


def _inputs(b: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": (rng.standard_normal((b, n)) * 0.1).astype(np.float32),
            "w": (rng.standard_normal((n, n)) * 0.1).astype(np.float32)}



def _sources_compiled_here(monkeypatch) -> list[str]:
    """The sources the lowering process compiles itself (`kernel._compile_cached`), in order, as they come."""
    from tgc.codegen import kernel

    here: list[str] = []
    orig = kernel._compile_cached

    def spy(device, src):
        here.append(src)
        return orig(device, src)

    monkeypatch.setattr(kernel, "_compile_cached", spy)
    return here

def test_chunk_counts_need_a_batch_dim_with_chunks_large_enough(monkeypatch):
    prog = tgc.loads(SRC)
    decls = prog._all_decls()
    dims = {"B": 8, "N": 64}
    outs, bufs = prog._trace(dims)
    # x's rows are 256 bytes, the output's 4: with 1 MiB chunks at least, 8 rows give no count
    assert chunk.chunk_counts(decls, dims, outs, bufs) == {}
    monkeypatch.setattr(chunk, "MIN_CHUNK_BYTES", 2 * (64 * 4 + 4))  # two rows of x and out at least
    assert chunk.chunk_counts(decls, dims, outs, bufs) == {"B": [2, 4]}
    one = {"B": 1, "N": 64}
    assert chunk.chunk_counts(decls, one, *prog._trace(one)) == {}  # a batch of one has nothing to split
    # N is axis 1 of x (and axis 0 of w): never a batch dim
    static = tgc.loads("x: f32[8, 64]\nreturn x.exp().sum(1)\n")
    assert chunk.chunk_counts(static._all_decls(), {}, *static._trace({})) == {}


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_nothing_to_chunk_compiles_once_without_deferring(device, monkeypatch):
    monkeypatch.delenv("TGC_CHUNK", raising=False)
    prog = tgc.loads(SRC)
    calls = _defers(prog, monkeypatch)
    ins = _inputs(8, 64)
    got = prog.run(device=device, dims={"B": 8, "N": 64}, **ins)
    np.testing.assert_allclose(got[prog.output_names[0]], _want(ins["x"], ins["w"]), rtol=1e-4, atol=1e-5)
    assert calls == [False]  # one lowering, its compiles beside it: no deferred lowering to decide first
    assert prog.chunking(device, {"B": 8, "N": 64}) is None
    assert prog.last_chunking is None


def test_a_program_that_could_be_chunked_still_decides_from_its_memory_plan(monkeypatch):
    monkeypatch.delenv("TGC_CHUNK", raising=False)
    monkeypatch.setattr(chunk, "MIN_CHUNK_BYTES", 0)
    prog = tgc.loads(SRC)
    calls = _defers(prog, monkeypatch)
    ins = _inputs(8, 64)
    got = prog.run(device="CPU", dims={"B": 8, "N": 64}, **ins)
    np.testing.assert_allclose(got[prog.output_names[0]], _want(ins["x"], ins["w"]), rtol=1e-4, atol=1e-5)
    assert calls and calls[0] is True  # the whole program lowered deferred for the decision, as before


TWO = "x: f32[N, N]\nw: f32[N, N]\ny = relu(x @ w)\nreturn (y.exp() * 2.0).sum(1), (y @ w).max(1)\n"


def test_small_sources_follow_a_large_one_to_the_workers(monkeypatch):
    """A program's small sources compile in the process that lowers until it has sent a large one to the
    workers; after that they go to the workers too. The binaries are the serial compile's, byte for byte."""
    from tgc.backends import get_device
    from tgc.codegen import kernel

    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")  # every source is compiled, none found on disk
    monkeypatch.setenv("TGC_JOBS", "1")
    dims = {"N": 64}
    serial = tgc.loads(TWO).compile("CPU", dims)
    sizes = [len(k.src) for k in serial]
    # the program's kernels: a matmul tile, a row reduction, another matmul tile, another row reduction; with
    # the first tile's size as the threshold, the tiles are large and the reductions small
    threshold = sizes[0]
    large = [s >= threshold for s in sizes]
    assert large == [True, False, True, False], sizes
    monkeypatch.setattr(kernel, "PARALLEL_MIN_SOURCE", threshold)

    here = _sources_compiled_here(monkeypatch)
    monkeypatch.setenv("TGC_JOBS", "2")
    kernel._shutdown_pools()
    kernel._shared_pool(get_device("CPU"), 2)  # workers running: the first large source goes to them at once
    parallel = tgc.loads(TWO).compile("CPU", dims)
    assert here == []  # every source went to the workers, the small ones after the first tile
    assert [k.binary for k in parallel] == [k.binary for k in serial]

    here.clear()
    monkeypatch.setattr(kernel, "PARALLEL_MIN_SOURCE", max(sizes) + 1)  # nothing large: all compiled here
    tgc.loads(TWO).compile("CPU", dims)
    assert sorted(here) == sorted(k.src for k in serial)

    prog = tgc.loads(TWO)
    ins = _inputs(64, 64)
    got = prog.run(device="CPU", dims=dims, **ins)
    y = np.maximum(ins["x"].astype(np.float64) @ ins["w"], 0)
    np.testing.assert_allclose(got[prog.output_names[0]], (np.exp(y) * 2).sum(1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[prog.output_names[1]], (y @ ins["w"]).max(1), rtol=1e-4, atol=1e-4)


def test_a_program_of_many_kernels_sends_its_first_large_source_to_the_workers(monkeypatch):
    """A program of at least `MANY_KERNELS` distinct kernels starts the workers at its first large source the
    disk cache lacks and sends it to them (the small ones after it follow); below that count, the first large
    source compiles here, and the small one after it too. A program with no large source starts no worker, however
    many kernels it has. With one job, everything compiles here. The binaries are the serial compile's."""
    from tgc.codegen import kernel

    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")  # every source is compiled, none found on disk
    monkeypatch.setenv("TGC_JOBS", "1")
    dims = {"N": 64}
    serial = tgc.loads(TWO).compile("CPU", dims)
    sizes = [len(k.src) for k in serial]
    assert len(set(k.src for k in serial)) == 4  # four distinct kernels: tile, reduction, tile, reduction
    monkeypatch.setattr(kernel, "PARALLEL_MIN_SOURCE", sizes[0])  # the tiles large, the reductions small

    here = _sources_compiled_here(monkeypatch)
    monkeypatch.setenv("TGC_JOBS", "2")
    kernel._shutdown_pools()  # no workers running: the rules decide when they start
    monkeypatch.setattr(kernel, "MANY_KERNELS", 5)  # four kernels are few: the first tile and the reduction
    few = tgc.loads(TWO).compile("CPU", dims)  # after it compile here, the workers start at the second tile
    assert here == [serial[0].src, serial[1].src]
    assert [k.binary for k in few] == [k.binary for k in serial]

    here.clear()
    kernel._shutdown_pools()
    monkeypatch.setattr(kernel, "MANY_KERNELS", 4)  # four are many: every source to the workers
    many = tgc.loads(TWO).compile("CPU", dims)
    assert here == []
    assert ("CPU", 2) in kernel._POOLS
    assert [k.binary for k in many] == [k.binary for k in serial]

    here.clear()
    kernel._shutdown_pools()
    monkeypatch.setattr(kernel, "PARALLEL_MIN_SOURCE", max(sizes) + 1)  # nothing large: many, but all here
    tgc.loads(TWO).compile("CPU", dims)
    assert sorted(here) == sorted(k.src for k in serial)
    assert ("CPU", 2) not in kernel._POOLS  # no worker started

    here.clear()
    monkeypatch.setenv("TGC_JOBS", "1")  # one job: no workers, however many kernels
    tgc.loads(TWO).compile("CPU", dims)
    assert sorted(here) == sorted(k.src for k in serial)
    kernel._shutdown_pools()


FILLS = "x: f32[N]\nreturn x * 2.0, full((64, 256), 0.5), arange(0, 4096) * 3\n"


def test_llvm_unrolls_all_but_fills(monkeypatch):
    """LLVM's loop unrollers skip a kernel that reads no buffer and computes no float (a constant or an index
    stored over a range); a kernel that reads, or computes in floats, keeps them. The fills still run right."""
    from tgc.backends.cpu import needs_unroll

    monkeypatch.setenv("TGC_JOBS", "1")
    prog = tgc.loads(FILLS)
    kernels = prog.compile("CPU", {"N": 1000})
    assert [needs_unroll(k.src) for k in kernels] == [True, False, False]  # x * 2 reads x; the others are fills
    math = kernels[1].src.replace("store <", "%m = fmul float 1.0, 2.0\n  store <", 1)  # float math added
    assert needs_unroll(math)
    x = np.arange(1000, dtype=np.float32)
    got = prog.run(device="CPU", dims={"N": 1000}, x=x)
    np.testing.assert_array_equal(got["out0"], x * 2)
    np.testing.assert_array_equal(got["out1"], np.full((64, 256), 0.5, np.float32))
    np.testing.assert_array_equal(got["out2"], np.arange(4096, dtype=np.int32) * 3)
