"""The hand-coded heuristic's rule table (tgc/codegen/heuristic.py): which rules run and which opts they choose
for given sizes on a given machine (registers, lanes, private cache, cores), as exact expectations. No kernel is
compiled: the rules act on the scheduled AST."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.backends import get_device
from tgc.codegen.heuristic import RULES, Machine, classify, decide
from tgc.codegen.opt import OptKernel
from tgc.codegen.pipeline import prepare

CPU = get_device("CPU")
ZEN4 = Machine(lanes=16, registers=32, private_cache=1 << 20, cores=2)
MATMUL = "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b"


def kernel(src: str, dims: dict, device=CPU, index: int = -1) -> OptKernel:
    items = [it for it in tgc.loads(src).schedule(dims, getattr(device, "name", "CPU")) if it.ast.src]
    return OptKernel(prepare(items[index].ast, device), device)


def run(src: str, dims: dict, machine: Machine = ZEN4, device=CPU, index: int = -1) -> tuple[list[str], list[str]]:
    k = kernel(src, dims, device, index)
    names = decide(k, machine)
    return names, [str(o) for o in k.applied]


def test_every_rule_says_what_it_models():
    assert len({r.name for r in RULES}) == len(RULES)
    assert all(len(r.models) > 30 for r in RULES)


def test_a_matmul_in_cache_gets_two_column_vectors_by_eight_rows():
    names, opts = run(MATMUL, {"M": 256, "K": 256, "N": 256})
    assert names == ["vector_axis", "more_columns", "rows"]
    assert opts == ["UPCAST(1, 16)", "UPCAST(1, 2)", "UPCAST(0, 8)"]


def test_an_operand_past_the_private_caches_gets_wide_columns_and_panels():
    names, opts = run(MATMUL, {"M": 2048, "K": 2048, "N": 2048})
    assert names == ["wide_columns", "vector_axis", "more_columns", "rows", "panels"]
    assert opts == ["UPCAST(1, 16)", "UPCAST(1, 4)", "UPCAST(0, 4)", "SWAP(0, 1)"]


def test_the_panel_rule_follows_the_cache_size_not_the_matrix_size():
    dims = {"M": 2048, "K": 2048, "N": 2048}  # 16 MiB right-hand side
    big = Machine(private_cache=32 << 20, cores=2)  # 32 MiB of private cache per core: it fits
    names, opts = run(MATMUL, dims, big)
    assert "panels" not in names and "wide_columns" not in names
    assert opts == ["UPCAST(1, 16)", "UPCAST(1, 2)", "UPCAST(0, 8)"]
    # 1024 x 1024 f32 is 4 MiB: panels from 4 MiB of one core's private cache down, not above
    dims = {"M": 1024, "K": 1024, "N": 1024}
    assert "panels" in run(MATMUL, dims, Machine(private_cache=2 << 20, cores=2))[0]
    assert "panels" in run(MATMUL, dims, Machine(private_cache=4 << 20, cores=2))[0]
    assert "panels" not in run(MATMUL, dims, Machine(private_cache=8 << 20, cores=2))[0]


@pytest.mark.parametrize("cores", [1, 2, 8])
def test_the_panel_threshold_is_one_cores_cache_whatever_the_cores(cores, whole_copies):
    # threads split the rows of an unpanelled matmul, so each core streams the whole operand per row block: a
    # 1365 x 512 f32 operand (2.7 MiB, a SwiGLU down projection) past one core's 2 MiB gets panels on any
    # number of cores (it fits 2 cores' caches together: the old threshold left it row-major, 1.45x slower)
    dims = {"M": 128, "K": 1365, "N": 512}
    names, opts = run(MATMUL, dims, Machine(private_cache=2 << 20, cores=cores))
    assert names[-1] == "panels" and opts[-1] == "SWAP(0, 1)"
    # the same kernel within one core's cache keeps its rows outermost
    names, opts = run(MATMUL, dims, Machine(private_cache=4 << 20, cores=cores))
    assert "panels" not in names and "SWAP(0, 1)" not in opts


@pytest.mark.parametrize("rows", [7, 9, 13])
def test_rows_with_no_divisor_widen_the_columns_instead(rows):
    # the rule for a kernel of such rows where padding them to a tile wastes too much (`padded_rows` pads
    # 65, 77, 97 rows: tests/test_corpusperf_rules.py; the scheduler never splits odd rows)
    names, opts = run(MATMUL, {"M": rows, "K": 1024, "N": 1024})
    assert names == ["vector_axis", "more_columns", "panels", "narrow_rows"]
    assert opts == ["UPCAST(1, 16)", "UPCAST(1, 2)", "SWAP(0, 1)", "UPCAST(0, 4)", "UNROLL(2, 4)"]


def test_narrower_vectors_change_the_tile_not_the_rules():
    avx2 = Machine(lanes=8, registers=16, private_cache=1 << 20, cores=2)
    names, opts = run(MATMUL, {"M": 256, "K": 256, "N": 256}, avx2)
    assert names == ["vector_axis", "more_columns", "rows"]
    # 8 lanes x 2 vectors; 8 accumulators left over 2 column vectors: 4 rows
    assert opts == ["UPCAST(1, 8)", "UPCAST(1, 2)", "UPCAST(0, 4)"]


def test_gathered_column_vectors_are_reused_by_as_many_rows_as_registers():
    src = "a: f32[M, K]\nb: f32[N, K]\nreturn a @ b.transpose(1, 0)"
    k = kernel(src, {"M": 128, "K": 64, "N": 256})
    assert classify(k, ZEN4).gathered
    names, opts = run(src, {"M": 128, "K": 64, "N": 256})
    assert names == ["vector_axis", "rows"] and opts == ["UPCAST(1, 16)", "UPCAST(0, 32)"]


def test_a_tile_of_less_than_a_vector_takes_two_reduction_steps(monkeypatch):
    from tgc.engine import schedule

    monkeypatch.setattr(schedule, "CONV_MIN_FLOPS", 1 << 24)  # the conv unpacked (the matmul class's rules)
    src = "x: f32[N, C, H, W]\nw: f32[O, C, 3, 3]\nreturn conv2d(x, w, padding=1)"
    names, opts = run(src, {"N": 2, "C": 32, "H": 14, "W": 24, "O": 32})  # (28 columns: image_columns pads them)
    assert names == ["vector_axis", "rows", "unroll2"]
    assert opts == ["UPCAST(3, 8)", "UPCAST(1, 32)", "UNROLL(4, 2)"]


def test_packed_convolution_weights_make_a_lane_tile():
    src = "x: f32[N, C, H, W]\nw: f32[O, C, 3, 3]\nreturn conv2d(x, w, padding=1)"
    k = kernel(src, {"N": 8, "C": 64, "H": 56, "W": 56, "O": 64})
    assert classify(k, ZEN4).kind == "lanes"
    assert decide(k, ZEN4) == ["lane_tile"]
    assert [str(o) for o in k.applied] == ["UPCAST(1, 16)", "UPCAST(1, 2)", "UPCAST(3, 8)"]


def test_a_reduction_across_its_strided_axis_computes_contiguous_outputs_side_by_side():
    names, opts = run("x: f32[N, D]\nreturn x.sum(axis=0)", {"N": 512, "D": 512})
    assert names == ["strided_outputs"] and opts == ["UPCAST(0, 16)"]
    names, opts = run("x: f32[N, D]\nreturn x.sum(axis=0)", {"N": 512, "D": 24})
    assert opts == ["UPCAST(0, 8)"]


def test_a_short_contiguous_row_is_written_as_vectors():
    names, opts = run("x: f32[N, D]\nreturn x * 2.0 + 1.0", {"N": 64, "D": 32})
    assert names == ["short_rows"] and opts == ["UPCAST(1, 16)"]
    names, _ = run("x: f32[N, D]\nreturn x * 2.0 + 1.0", {"N": 64, "D": 1024})  # long: LLVM vectorizes it
    assert names == []


def test_a_matmul_too_small_for_a_vector_is_left_alone():
    names, opts = run(MATMUL, {"M": 33, "K": 33, "N": 33})
    assert names == [] and opts == []


def test_gpu_long_reductions_into_few_outputs_are_shared_by_a_work_group():
    gpu = get_device("OPENCL")  # (the rules read its capabilities only: it is not opened)
    names, opts = run("x: f32[N, D]\nreturn x.sum(axis=1)", {"N": 64, "D": 4096}, device=gpu)
    assert names == ["gpu_group"] and opts == ["GROUP(1, 256)"]
    # many outputs: a row per work-group all the same (gpu_rows), but a column reduction keeps a column per thread
    names, opts = run("x: f32[N, D]\nreturn x.sum(axis=1)", {"N": 8192, "D": 4096}, device=gpu)
    assert names == ["gpu_rows"] and opts == ["GROUP(1, 256)"]
    names, _ = run("x: f32[N, D]\nreturn x.sum(axis=0)", {"N": 8192, "D": 8192}, device=gpu)
    assert names == []


def test_a_matmul_past_one_cores_cache_computes_the_product_with_panels(whole_copies):
    # on this host's own machine model: a 1365 x 512 operand (2.7 MiB) is past any private cache up to 2 MiB
    # and gets panels (SWAP); the values against numpy, an odd reduction length included
    from tgc.codegen.heuristic import machine_of
    host = machine_of(CPU)
    assert "panels" in run(MATMUL, {"M": 40, "K": 1365, "N": 512}, host)[0] or host.private_cache > 1365 * 512 * 4
    rng = np.random.default_rng(3)
    a = rng.standard_normal((40, 1365), dtype=np.float32)
    b = rng.standard_normal((1365, 512), dtype=np.float32)
    out = tgc.loads(MATMUL).run("CPU", a=a, b=b)
    got = out if isinstance(out, np.ndarray) else next(iter(out.values()))
    np.testing.assert_allclose(np.asarray(got), a @ b, rtol=1e-4, atol=1e-3)
