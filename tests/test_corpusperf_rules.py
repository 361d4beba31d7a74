"""Rules for odd and batched sizes (issue 20 items 2 and 5): an odd row axis padded to whole register tiles
(PADTO of an output axis: the extra rows gated off), the panel rules for a batch of rows over one weight
matrix, and a pad's source indices bounded to the source while the walk below it is written (a reshape's
`//` and `%` under a padded convolution fold away). Exact rule choices on a fixed machine, values against
numpy; no timings."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.backends import get_device
from tgc.codegen.heuristic import Machine, decide
from tgc.codegen.opt import Opt, OptError, OptKernel, OptOps
from tgc.codegen.pipeline import prepare
from tgc.ir.uop import Ops

CPU = get_device("CPU")
ZEN4 = Machine(lanes=16, registers=32, private_cache=1 << 20, cores=2)
MATMUL = "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b"


def kernels(src: str, dims: dict, device=CPU) -> list[OptKernel]:
    items = [it for it in tgc.loads(src).schedule(dims, getattr(device, "name", "CPU")) if it.ast.src]
    return [OptKernel(prepare(it.ast, device), device) for it in items]


def rules(src: str, dims: dict, index: int = -1) -> tuple[list[str], list[str]]:
    k = kernels(src, dims)[index]
    names = decide(k, ZEN4)
    return names, [str(o) for o in k.applied]


def test_odd_rows_are_padded_to_whole_tiles():
    names, opts = rules(MATMUL, {"M": 197, "K": 384, "N": 384})
    assert names == ["vector_axis", "more_columns", "padded_rows"]
    assert opts == ["UPCAST(1, 16)", "UPCAST(1, 2)", "PADTO(0, 8)", "UPCAST(0, 8)"]


@pytest.mark.parametrize("rows", [65, 77, 97])
def test_odd_rows_under_panels_are_padded_too(rows):
    # 77 rows x 1024 x 1024 (a 4 MiB operand: panels); padded to 80, one kernel, measured 2.3x faster than one
    # row at a time and 10% faster than a 72-row part plus an 8-row part that reads the operand again
    names, opts = rules(MATMUL, {"M": rows, "K": 1024, "N": 1024})
    assert names == ["vector_axis", "more_columns", "padded_rows", "panels"]
    assert opts == ["UPCAST(1, 16)", "UPCAST(1, 2)", "PADTO(0, 8)", "UPCAST(0, 8)", "SWAP(0, 1)"]


@pytest.mark.parametrize("rows", [7, 9, 12])
def test_rows_are_not_padded_where_the_padding_wastes_too_much_or_a_divisor_fits(rows):
    names, _ = rules(MATMUL, {"M": rows, "K": 64, "N": 64})
    assert "padded_rows" not in names  # 7 -> 8 and 9 -> 16 waste more than 1/8; 12 takes rows of 4


def test_padded_rows_compute_the_matmul():
    rng = np.random.default_rng(0)
    src = "a: f32[M, K]\nb: f32[K, N]\nc: f32[N]\nreturn relu(a @ b + c)"
    k = kernels(src, {"M": 37, "K": 24, "N": 64})[-1]
    assert decide(k, ZEN4) == ["vector_axis", "padded_rows"]  # 37 rows -> 40: 5 tiles of 8
    a, b = rng.standard_normal((37, 24), np.float32), rng.standard_normal((24, 64), np.float32)
    prog = tgc.loads(src)
    c = rng.standard_normal(64, np.float32)
    want = np.maximum(a @ b + c, 0)
    for dev in ("CPU", "PYTHON"):  # the emulator checks every load and store against its buffer
        out = prog.run(dev, a=a, b=b, c=c)
        got = out if isinstance(out, np.ndarray) else next(iter(out.values()))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_an_output_axis_pads_only_where_it_helps():
    k = kernels(MATMUL, {"M": 37, "K": 24, "N": 64})[-1]
    with pytest.raises(OptError, match="already a multiple"):
        k.copy().apply(Opt(OptOps.PADTO, 1, 16))
    with pytest.raises(OptError, match="more than double"):
        k.copy().apply(Opt(OptOps.PADTO, 0, 128))
    gpu = get_device("OPENCL")  # (its capabilities only: not opened)
    g = kernels(MATMUL, {"M": 37, "K": 24, "N": 64}, gpu)[-1]
    with pytest.raises(OptError, match="CPU devices"):
        g.apply(Opt(OptOps.PADTO, 0, 8))


def test_a_padded_output_axis_gates_its_store_and_clamps_what_it_reads():
    k = kernels(MATMUL, {"M": 37, "K": 24, "N": 64})[-1]
    k.apply(Opt(OptOps.PADTO, 0, 8))
    assert k.loops()[0].src[0].arg == 40
    store = next(u for u in k.ast.toposort() if u.op is Ops.STORE)
    assert len(store.src) == 4  # gated
    # the loads are not gated: the row they read is clamped to the last one, so every read stays in bounds
    loads = [u for u in k.ast.toposort() if u.op is Ops.LOAD]
    assert loads and all(len(ld.src) == 2 for ld in loads)
    a_load = next(ld for ld in loads if k.loops()[0] in ld.src[1].toposort())
    assert a_load.src[1].vmax == 37 * 24 - 1


BATCHED = "x: f32[B, S, C]\nw: f32[C, N]\nreturn x @ w"


def test_a_batch_of_rows_over_one_large_weight_gets_wide_columns_and_panels():
    names, opts = rules(BATCHED, {"B": 4, "S": 192, "C": 512, "N": 2048})
    assert names == ["wide_columns", "vector_axis", "more_columns", "rows", "panels"]
    assert opts == ["UPCAST(2, 16)", "UPCAST(2, 4)", "UPCAST(1, 4)", "SWAP(0, 2)"]


def test_a_batch_with_its_own_right_hand_side_gets_no_panels():
    names, _ = rules("x: f32[B, S, C]\nw: f32[B, C, N]\nreturn x @ w", {"B": 4, "S": 192, "C": 512, "N": 2048})
    assert "panels" not in names and "wide_columns" not in names


UPSAMPLED_CONV = ("x: f32[N, C, H, W]\nw: f32[O, C, 3, 3]\nup = repeat(repeat(x, 2, axis=2), 2, axis=3)\n"
                  "return conv2d(up, w, padding=1)")


def test_a_padded_read_through_a_reshape_keeps_plain_index_math():
    # the upsample is a reshape of an expand: below the convolution's padding its `//` and `%` fold into
    # the row and column halved (one division each), not a chain of them per load
    dims = {"N": 1, "C": 3, "H": 4, "W": 5, "O": 2}
    (item,) = [it for it in tgc.loads(UPSAMPLED_CONV).schedule(dims, "CPU") if it.ast.src]
    ops = [u.op for u in item.ast.toposort()]
    assert ops.count(Ops.MOD) == 0 and ops.count(Ops.IDIV) == 2


def test_a_padded_read_through_a_reshape_computes_the_convolution():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, 3, 4, 5), np.float32), rng.standard_normal((2, 3, 3, 3), np.float32)
    up = np.pad(x.repeat(2, axis=2).repeat(2, axis=3), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((1, 2, 8, 10), np.float32)
    for i in range(3):
        for j in range(3):
            want += np.einsum("nchw,oc->nohw", up[:, :, i:i + 8, j:j + 10], w[:, :, i, j])
    prog = tgc.loads(UPSAMPLED_CONV)
    for dev in ("CPU", "PYTHON"):
        out = prog.run(dev, x=x, w=w)
        got = out if isinstance(out, np.ndarray) else next(iter(out.values()))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows,packed", [(8, False), (15, False), (16, True), (64, True)])
def test_a_weight_read_by_few_rows_is_not_packed(rows, packed, whole_copies):
    # a GRU step or a decode (8 rows: one register tile) reads its weight once in any layout: a packing copy
    # would only add its traffic and its memory
    prog = tgc.loads("x: f32[B, I]\nw: f32[I, N]\nreturn x @ w")
    names = [it.name for it in prog.schedule({"B": rows, "I": 512, "N": 1024}, "CPU") if it.ast.src]
    assert (len(names) == 2 and names[0].startswith("E_")) == packed, names


def test_a_transposed_weight_is_copied_whatever_its_rows(whole_copies):
    # read in place, each column vector of `w.T` would be a gather: the copy is what makes them contiguous
    prog = tgc.loads("x: f32[B, I]\nw: f32[N, I]\nreturn x @ w.transpose(1, 0)")
    names = [it.name for it in prog.schedule({"B": 8, "I": 512, "N": 1024}, "CPU") if it.ast.src]
    assert len(names) == 2 and names[0].startswith("E_"), names


def test_odd_rows_under_a_narrow_vector_are_padded_to_more_rows(monkeypatch):
    # 900 columns take 4-lane vectors only; 77 rows (kept whole, as a fused attention's projection is: the split
    # is off here) padded to 80 in tiles of 16 rows, with no two-step unroll (1.9x faster than one row, unrolled);
    # the 300 x 900 operand (1.03 MiB) is past one core's 1 MiB: column panels outermost (measured 1.5x faster)
    from tgc.engine import schedule
    monkeypatch.setattr(schedule, "SPLIT_MIN_PRODUCTS", 1 << 62)
    names, opts = rules("x: f32[B, T, C]\nw: f32[C, N]\nreturn x @ w", {"B": 3, "T": 77, "C": 300, "N": 900})
    assert names == ["vector_axis", "padded_rows", "panels"]
    assert opts == ["UPCAST(2, 4)", "PADTO(1, 16)", "UPCAST(1, 16)", "SWAP(0, 2)"]


def test_a_residual_added_after_the_matmul_keeps_the_panels():
    # the residual is read along the columns and depends on the rows, but it is no operand of the reduction
    names, _ = rules("a: f32[M, K]\nb: f32[K, N]\nc: f32[M, N]\nreturn a @ b + c", {"M": 128, "K": 1360, "N": 512})
    assert "panels" in names


@pytest.mark.parametrize("rows", [196, 100])
def test_rows_with_a_small_divisor_are_padded_to_a_full_tile(rows):
    # 196 rows divide by 4 but not 8: four rows x 2 vectors fill half the accumulators; padded to 200 (2% more
    # rows) the tile is 8 x 2 (measured 8-9% faster: 4 x 196 x 2048 x 512, 196 x 512 x 512, 100 x 768 x 768)
    names, opts = rules(MATMUL, {"M": rows, "K": 256, "N": 256})
    assert names == ["vector_axis", "more_columns", "padded_rows"]
    assert opts == ["UPCAST(1, 16)", "UPCAST(1, 2)", "PADTO(0, 8)", "UPCAST(0, 8)"]


def test_a_small_divisor_is_kept_where_padding_wastes_too_much():
    # 12 rows: padding to 16 adds a third of them; the tile takes the divisor 4
    names, opts = rules(MATMUL, {"M": 12, "K": 256, "N": 256})
    assert names == ["vector_axis", "more_columns", "rows"]
    assert opts == ["UPCAST(1, 16)", "UPCAST(1, 2)", "UPCAST(0, 4)"]


def test_rows_padded_to_a_full_tile_compute_the_matmul():
    rng = np.random.default_rng(1)
    src = "a: f32[M, K]\nb: f32[K, N]\nc: f32[M, N]\nreturn a @ b + c"
    k = kernels(src, {"M": 36, "K": 40, "N": 64})[-1]
    assert decide(k, ZEN4) == ["vector_axis", "padded_rows"]  # 36 rows (divisor 4) -> 40: 5 tiles of 8
    a, b = rng.standard_normal((36, 40), np.float32), rng.standard_normal((40, 64), np.float32)
    c = rng.standard_normal((36, 64), np.float32)
    prog = tgc.loads(src)
    for dev in ("CPU", "PYTHON"):  # the emulator checks every load and store against its buffer
        out = prog.run(dev, a=a, b=b, c=c)
        got = out if isinstance(out, np.ndarray) else next(iter(out.values()))
        np.testing.assert_allclose(np.asarray(got), a @ b + c, rtol=1e-4, atol=1e-4)
