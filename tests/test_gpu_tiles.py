"""GPU kernels shaped for the GPU (issue 26 item 3): work-group reductions combined by warp shuffles (CUDA) or a
shared-memory tree (OpenCL, Metal), row reductions one row per work-group (`gpu_rows`), matmul-like kernels as
tiles of threads with register blocking (`gpu_matmul`). Values against numpy on OPENCL (PoCL) and on CUDA through
the CPU stand-in driver (tests/cuda_standin.py, whose kernel.h emulates `__shfl_xor_sync`); Metal type-checked.
"""

from __future__ import annotations

import re

import cuda_standin
import numpy as np
import pytest

import tgc
import tgc.api as api
import tgc.codegen.search as search
from tgc.backends import get_device
from tgc.backends import metal as metal_mod
from tgc.codegen.opt import Opt
from tgc.codegen.pipeline import lower

ROWSUM = "x: f32[M, N]\nreturn x.sum(axis=1)"
MATMUL = "a: f32[N, K]\nb: f32[K, M]\nreturn a @ b"


def _opencl() -> None:
    ok, why = get_device("OPENCL").available
    if not ok:
        pytest.skip(why)


def _with_opts(opts: list[tuple], fn):
    """Run `fn()` with every kernel built with `opts` (as a BEAM winner stored for it would be)."""
    cur = [Opt(*o) for o in opts]
    orig = search.lookup
    search.lookup = api.lookup = lambda ast, device, width=0: cur
    try:
        return fn()
    finally:
        search.lookup = api.lookup = orig


def _lower(src: str, device: str, dims: dict, opts: list[tuple] | None = None) -> list:
    """The program's kernels lowered and rendered for `device` (not compiled): the heuristic's, or `opts`."""
    dev = get_device(device)
    items = [s for s in tgc.loads(src).schedule(dims, device=device) if hasattr(s, "ast")]
    return [lower(it.ast, dev, it.bufs, it.name or "k", opts=None if opts is None else [Opt(*o) for o in opts])
            for it in items]


def _opts(src: str, device: str, dims: dict) -> list[list[str]]:
    return [[str(o) for o in k.applied] for k in _lower(src, device, dims)]


# ---------------------------------------------------------------- the heuristic's choices (no device needed)

def test_matmul_tiles_threads_and_blocks_outputs_per_thread():
    assert _opts(MATMUL, "CUDA", {"N": 128, "K": 64, "M": 256}) == [
        ["LOCAL(0, 16)", "LOCAL(1, 16)", "UPCAST(0, 4)", "UPCAST(1, 4)", "STAGE(2, 16)"]]
    # the largest tile dividing both sizes; none where none does (one output per thread, the grid gated)
    assert _opts(MATMUL, "OPENCL", {"N": 96, "K": 33, "M": 80}) == [
        ["LOCAL(0, 8)", "LOCAL(1, 8)", "UPCAST(0, 2)", "UPCAST(1, 2)"]]
    assert _opts(MATMUL, "OPENCL", {"N": 65, "K": 40, "M": 33}) == [[]]
    # batched: rows and columns of each batch, the batch axis stays on the grid
    assert _opts("a: f32[B, N, K]\nb: f32[B, K, M]\nreturn a @ b", "CUDA", {"B": 3, "N": 64, "K": 32, "M": 128}) \
        == [["LOCAL(1, 16)", "LOCAL(2, 16)", "UPCAST(1, 4)", "UPCAST(2, 4)", "STAGE(3, 16)"]]


def test_matmul_tile_reads_adjacent_columns_in_adjacent_threads():
    """The columns' thread index is the innermost digit of lidx0, so a warp's loads of B are contiguous."""
    (k,) = _lower(MATMUL, "CUDA", {"N": 128, "K": 64, "M": 256})
    assert "(lidx0 % 16)" in k.src and len(re.findall(r"fmaf\(", k.src)) == 16, k.src


def test_staged_tiles_are_copied_by_the_work_group_with_one_barrier_a_step(monkeypatch):
    """STAGE: two double-buffered tiles (64 rows x 16 steps of A, 16 steps x 64 columns of B: 2 x 2 x 1024
    floats), each thread copying 4 elements of each (256 threads); one barrier in the loop over tiles, none after
    the tile's loop; thread t copies element t of the tile, so adjacent threads copy adjacent elements. The
    copies through registers, as before sm_80 (tests/test_gpu_async_copy.py: `cp.async` on sm_80+)."""
    monkeypatch.setattr(get_device("CUDA"), "arch", "sm_75")
    (k,) = _lower(MATMUL, "CUDA", {"N": 128, "K": 64, "M": 256})
    assert "__shared__ float tile0[2048];" in k.src and "__shared__ float tile1[2048];" in k.src, k.src
    assert len(re.findall(r"tile0\[v\d+\] = ", k.src)) == 4 and k.src.count("__syncthreads()") == 1, k.src
    assert re.search(r"for \(int ridx\d+ = 0; ridx\d+ < 4;.*__syncthreads\(\);.*for \(int ridx\d+ = 0; "
                     r"ridx\d+ < 16;", k.src, re.S), k.src
    # each copy one 16-byte load of 4 adjacent elements (whole float4 copies, every index a multiple of 4)
    assert len(re.findall(r"float4 v\d+ = \*reinterpret_cast<const float4\*>\(data[12] \+ v\d+\);", k.src)) == 2


def test_vector_copies_only_where_every_index_is_a_multiple_of_4():
    """`a[:, 1:]` reads A from an odd offset: its tile is copied element by element, B's through float4."""
    _opencl()
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((64, 65)).astype(np.float32), rng.standard_normal((64, 128)).astype(np.float32)
    src = "a: f32[N, K]\nb: f32[J, M]\nreturn a[:, 1:] @ b"
    (k,) = _lower(src, "OPENCL", {"N": 64, "K": 65, "J": 64, "M": 128})
    assert "STAGE(2, 16)" in [str(o) for o in k.applied] and k.src.count("vload4(0, ") == 1, k.src
    assert re.search(r"vload4\(0, data2 \+", k.src), k.src
    got = tgc.loads(src).run("OPENCL", a=a, b=b)["out0"]
    np.testing.assert_allclose(got, a[:, 1:].astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_stage_is_refused_where_it_cannot_apply():
    from tgc.codegen.opt import OptError, OptKernel, OptOps
    from tgc.codegen.pipeline import prepare
    prog = tgc.loads(MATMUL)
    (item,) = [s for s in prog.schedule({"N": 64, "K": 48, "M": 64}) if hasattr(s, "ast")] or [None]
    if item is None:
        pytest.skip("no kernel AST in the schedule")
    for device, opts, why in (("CPU", [Opt(OptOps.STAGE, 2, 16)], "GPU"),
                              ("OPENCL", [Opt(OptOps.STAGE, 2, 32)], "does not divide"),
                              ("OPENCL", [Opt(OptOps.STAGE, 0, 16)], "reduction axis"),
                              ("OPENCL", [Opt(OptOps.STAGE, 2, 16), Opt(OptOps.GROUP, 2, 3)], "not with STAGE")):
        k = OptKernel(prepare(item.ast, get_device(device)), get_device(device))
        with pytest.raises(OptError, match=why):
            for o in opts:
                k.apply(o)

def test_row_reductions_take_a_work_group_per_row():
    assert _opts(ROWSUM, "CUDA", {"M": 4500, "N": 512}) == [["GROUP(1, 256)"]]
    # a row no power of two divides is padded (1000 -> 1024) where that adds at most 1/8
    assert _opts(ROWSUM, "OPENCL", {"M": 4099, "N": 1000}) == [["PADTO(1, 256)", "GROUP(1, 256)"]]
    assert _opts(ROWSUM, "OPENCL", {"M": 5000, "N": 77}) == [[]]  # 77 -> 96 would add a quarter
    assert _opts(ROWSUM, "OPENCL", {"M": 8193, "N": 33}) == [[]]  # short rows: one per thread
    # a column reduction: adjacent threads read adjacent columns already, one column per thread
    assert _opts("x: f32[M, N]\nreturn x.max(axis=0)", "OPENCL", {"M": 4099, "N": 5000}) == [[]]


def test_opencl_combines_partials_by_a_tree_and_cuda_by_shuffles():
    dims = {"M": 16, "N": 4096}
    (cl,) = _lower(ROWSUM, "OPENCL", dims, [("LOCAL", 0, 4), ("GROUP", 1, 64)])
    assert cl.src.count("barrier(CLK_LOCAL_MEM_FENCE)") == 7 and "for (int ridx2" not in cl.src, cl.src  # 1 + log2 64
    (cu,) = _lower(ROWSUM, "CUDA", dims, [("LOCAL", 0, 2), ("GROUP", 1, 256)])
    assert cu.src.count("__shfl_xor_sync") == 5 + 3 and cu.src.count("__syncthreads()") == 1, cu.src
    (cu,) = _lower(ROWSUM, "CUDA", dims, [("GROUP", 1, 32)])
    assert cu.src.count("__shfl_xor_sync") == 5 and "__shared__" not in cu.src, cu.src
    # the GROUP's threads not adjacent lanes (a LOCAL digit inside it): the tree, never a shuffle
    (cu,) = _lower(ROWSUM, "CUDA", dims, [("GROUP", 1, 64), ("LOCAL", 0, 2)])
    assert "__shfl_xor_sync" not in cu.src and cu.src.count("__syncthreads()") == 7, cu.src


# ---------------------------------------------------------------- values on OpenCL (PoCL)

# a tree with UPCAST lanes, a tree beside a LOCAL digit, a GROUP of no power of two (every thread adds the partials)
GROUP_CASES = [([("GROUP", 1, 256), ("UPCAST", 0, 4)], "sum"), ([("GROUP", 1, 8), ("LOCAL", 0, 4)], "max"),
               ([("GROUP", 1, 3)], "sum")]


@pytest.mark.parametrize("opts,op", GROUP_CASES)
def test_group_reductions_match_numpy_on_opencl(opts, op):
    _opencl()
    x = np.random.default_rng(len(opts)).standard_normal((8, 1536)).astype(np.float32)
    src = f"x: f32[M, N]\nreturn x.{op}(axis=1)"
    got = _with_opts(opts, lambda: tgc.loads(src).run("OPENCL", x=x)["out0"])
    np.testing.assert_allclose(got, getattr(x.astype(np.float64), op)(axis=1), rtol=1e-5, atol=1e-4)


def test_heuristic_rows_and_tiles_match_numpy_on_opencl_at_odd_sizes():
    _opencl()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4099, 200)).astype(np.float32)  # padded rows (200 -> 224), more rows than 4096
    e = np.exp(x - x.max(1, keepdims=True))
    got = tgc.loads("x: f32[M, N]\nreturn softmax(x, 1)").run("OPENCL", x=x)["out0"]
    np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    for n, k, m in ((96, 33, 80), (65, 40, 33), (128, 17, 64)):
        a, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
        got = tgc.loads(MATMUL).run("OPENCL", a=a, b=b)["out0"]
        np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


STAGE_CASES = [((64, 64, 128), [("LOCAL", 0, 16), ("LOCAL", 1, 16), ("UPCAST", 0, 4), ("UPCAST", 1, 4),
                                ("STAGE", 2, 16)]),
               # (a tile no multiple of the work-group and STAGE before LOCAL: through the stand-in, below)
               ((2, 32, 40, 24), [("LOCAL", 1, 16), ("LOCAL", 2, 8), ("STAGE", 3, 8)])]  # batched (B, N, K, M)


@pytest.mark.parametrize("shape,opts", STAGE_CASES)
def test_staged_matmuls_match_numpy_on_opencl(shape, opts):
    _opencl()
    rng = np.random.default_rng(len(opts))
    *batch, n, k, m = shape
    a = rng.standard_normal((*batch, n, k)).astype(np.float32)
    b = rng.standard_normal((*batch, k, m)).astype(np.float32)
    src = MATMUL if not batch else "a: f32[B, N, K]\nb: f32[B, K, M]\nreturn a @ b"
    kernels = _lower(src, "OPENCL", dict(zip(("B", "N", "K", "M")[-len(shape):], shape)), opts)
    assert [str(o) for o in kernels[0].applied] == [str(Opt(*o)) for o in opts] and "tile1" in kernels[0].src
    # 16-byte copies where each thread copies whole groups of 4 (1024 elements, 256 threads; not 128 on 128)
    assert ("vload4" in kernels[0].src) == (len(shape) == 3), kernels[0].src
    got = _with_opts(opts, lambda: tgc.loads(src).run("OPENCL", a=a, b=b)["out0"])
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- values on CUDA through the stand-in

STANDIN = '''
import json
import numpy as np
import tgc

rng = np.random.default_rng(0)
out = []

def check(src, opts, want, **inputs):
    got, srcs = cuda_standin.run_with_opts(src, opts, inputs)
    err = float(np.max(np.abs(got - want) / (1 + np.abs(want))))
    out.append([src.splitlines()[-1], opts, err, srcs.count("__shfl_xor_sync"), srcs.count("__syncthreads"),
                srcs.count("tile1[")])

x = rng.standard_normal((8, 2048)).astype(np.float32)
check("x: f32[M, N]\\nreturn x.sum(axis=1)", [("LOCAL", 0, 2), ("GROUP", 1, 256)], x.sum(1, dtype=np.float64), x=x)
check("x: f32[M, N]\\nreturn x.max(axis=1)", [("GROUP", 1, 32), ("UPCAST", 0, 2)], x.max(1), x=x)
check("x: f32[M, N]\\nreturn x.sum(axis=1)", [("LOCAL", 0, 4), ("GROUP", 1, 16)], x.sum(1, dtype=np.float64), x=x)
check("x: f32[M, N]\\nreturn x.sum(axis=1)", [("GROUP", 1, 64), ("LOCAL", 0, 2)], x.sum(1, dtype=np.float64), x=x)
d = rng.standard_normal((4, 1024))
check("x: f64[M, N]\\nreturn x.sum(axis=1)", [("GROUP", 1, 128)], d.sum(1), x=d)
i = rng.integers(-1000, 1000, (4, 512)).astype(np.int32)
check("x: i32[M, N]\\nreturn x.sum(axis=1)", [("GROUP", 1, 512)], i.sum(1), x=i)
a, b = rng.standard_normal((30, 40)).astype(np.float32), rng.standard_normal((40, 20)).astype(np.float32)
check("a: f32[N, K]\\nb: f32[K, M]\\nreturn a @ b", [("STAGE", 2, 8), ("LOCAL", 1, 4), ("LOCAL", 0, 2)],
      a.astype(np.float64) @ b, a=a, b=b)
# a tile (4 x 3 of A, 3 x 64 of B) no multiple of the 64 threads: the last copy's extra threads idle
a, b = rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal((48, 64)).astype(np.float32)
check("a: f32[N, K]\\nb: f32[K, M]\\nreturn a @ b", [("LOCAL", 0, 4), ("LOCAL", 1, 16), ("UPCAST", 1, 4),
      ("STAGE", 2, 3)], a.astype(np.float64) @ b, a=a, b=b)
s = rng.standard_normal((64, 300)).astype(np.float32)  # the heuristic: a work-group per row, 300 -> 320
e = np.exp(s - s.max(1, keepdims=True))
check("x: f32[M, N]\\nreturn softmax(x, 1)", [], e / e.sum(1, keepdims=True), x=s)
for n, k, m in ((64, 32, 128), (48, 7, 80), (33, 9, 65)):  # tiled and staged; tiled; one output per thread
    a, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
    check("a: f32[N, K]\\nb: f32[K, M]\\nreturn a @ b", [], a.astype(np.float64) @ b, a=a, b=b)
print(json.dumps(out))
'''


@pytest.mark.skipif(cuda_standin.why_unavailable() is not None, reason=str(cuda_standin.why_unavailable()))
def test_shuffles_trees_rows_and_tiles_match_numpy_through_the_cuda_stand_in():
    rows = cuda_standin.run_json(STANDIN)
    wrong = [row for row in rows if not row[2] < 1e-5]
    assert not wrong, wrong
    shuffles = [row[3] for row in rows]
    # 256: 5 + 3; 32 (two rows a thread): 2 x 5; 16: 4; not adjacent lanes: 0 (the tree); 128: 5 + 2; 512: 5 + 4
    assert shuffles[:6] == [8, 10, 4, 0, 7, 9], rows
    assert [row[5] > 0 for row in rows[6:]] == [True, True, False, True, False, False], rows  # staged tiles
    assert shuffles[8] > 0, rows  # the softmax's row reductions


# ---------------------------------------------------------------- Metal: the same kernels type-check

@pytest.mark.skipif(metal_mod.libclang_error() is not None, reason=f"no libclang: {metal_mod.libclang_error()}")
def test_tree_reductions_and_tiles_type_check_on_metal():
    kernels = _lower(ROWSUM, "METAL", {"M": 8, "N": 1024})  # gpu_group: GROUP(1, 256), a tree
    kernels += _lower(MATMUL, "METAL", {"N": 64, "K": 32, "M": 128})
    kernels += _lower(ROWSUM, "METAL", {"M": 4097, "N": 1000})
    assert [len(k.applied) for k in kernels] == [1, 5, 2] and "device const float4*" in kernels[1].src
    assert kernels[0].src.count("threadgroup_barrier") == 9, kernels[0].src  # 1 + log2(256)
    errors = [f"{k.name}: {d}" for k in kernels for d in metal_mod.metal_linter().diagnostics(k.src)]
    assert not errors, errors
