"""Rules of the corpusbeam branch (issue 20 items 2 and 5), as exact expectations and against numpy:

- column panels from `panel_tiles_min` column tiles (4 per core, at most `accumulators`), not only from 16
  (`tgc.codegen.heuristic._panel_case`): a 1536 x 384 operand past one core's cache has 12 tiles;
- a matmul's right-hand side is read in place, not packed, where few rows read it and its column panels fit
  the cache sets their row stride maps them to (`tgc.engine.packrule`, `schedule._pack_pays`).

The cache geometry is fixed by each test (never this host's), and each program uses dims no other test uses
(the session's program cache)."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.backends import get_device
from tgc.codegen import heuristic
from tgc.codegen.heuristic import Machine, decide, panel_tiles_min
from tgc.codegen.opt import OptKernel
from tgc.codegen.pipeline import prepare
from tgc.engine import packrule
from tgc.engine.packrule import CacheGeometry, pack_pays, panel_fits_in_place
from tgc.ir.uop import Ops

MM = "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b\n"
L2 = CacheGeometry(size=2 << 20, ways=16, line=64)  # a 2 MiB 16-way L2 of 64-byte lines
MID_L2 = CacheGeometry(size=1 << 20, ways=16, line=64)  # 64 KiB between two addresses of one set


# --- the packing rule over the cache's sets ---------------------------------------------------------------------

@pytest.mark.parametrize("k,n,fits", [
    (1365, 512, False),  # 2048-byte stride: 64 set positions x 2 lines x 16 ways = 2048 lines < 4 x 2730
    (1024, 1024, False),  # a page of stride: 32 positions
    (768, 3072, False),  # 12288 bytes = 3 pages: 32 positions
    (1000, 576, True),  # 2304 bytes = 9 x 256: 512 positions x 2 lines x 16 ways = 16384 lines >= 4 x 2000
    (576, 1000, False),  # 4000 bytes: rows not on cache lines (vector loads across two lines)
    (512, 1365, False),
    (384, 1536, False),  # 6144 bytes: 64 positions x 2 lines x 16 ways = 2048 lines < 4 x 768
    (1536, 384, False),  # 1536 bytes: 256 positions: 8192 lines < 4 x 3072
    (512, 1344, True),  # 5376 bytes: 512 positions
])
def test_a_panel_fits_in_place_unless_its_stride_aliases_the_sets(k, n, fits):
    assert panel_fits_in_place(k, n, 4, L2) is fits


def test_packing_pays_for_many_rows_small_operands_and_aliased_strides():
    assert not pack_pays(1000, 576, 4, 77, L2)  # few rows, fits in place: the copy only costs
    assert not pack_pays(1000, 576, 4, 255, L2)
    assert pack_pays(1000, 576, 4, 256, L2)  # many rows: the packed kernel's edge pays for the copy
    assert pack_pays(1365, 512, 4, 77, L2)  # aliased: every row block would read the panel from L3
    assert pack_pays(384, 1152, 4, 77, L2)  # 1.7 MiB < 2 MiB: no panels, each row block reads it whole
    assert pack_pays(384, 1536, 4, 77, L2)  # past the cache, but its panel takes over 1/4 of its sets' lines
    assert not pack_pays(512, 1344, 4, 77, L2)


def _kernels(src: str, dims: dict, device: str = "CPU") -> list:
    return [it for it in tgc.loads(src).schedule(dims, device) if it.ast.src]


def _has_reduce(item) -> bool:
    return any(u.op is Ops.REDUCE_AXIS or (u.op is Ops.RANGE and u.arg[1].name == "REDUCE")
               for u in item.ast.toposort())


def _check(out: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def _inputs(dims: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((dims["M"], dims["K"])).astype(np.float32),
            "b": (rng.standard_normal((dims["K"], dims["N"])) / np.sqrt(dims["K"])).astype(np.float32)}


def _run(src: str, device: str, dims: dict, arrays: dict) -> np.ndarray:
    return next(iter(tgc.loads(src).run(device=device, dims=dims, **arrays).values()))


@pytest.mark.parametrize("dims,packed", [
    ({"M": 77, "K": 1000, "N": 288}, False),  # 1152-byte stride: fits a 1 MiB L2's sets in place
    ({"M": 77, "K": 1000, "N": 512}, True),  # 2048-byte stride: 32 positions, too few sets
    ({"M": 256, "K": 1000, "N": 288}, True),  # many rows: packed whatever the stride
], ids=lambda v: "x".join(map(str, v.values())) if isinstance(v, dict) else str(v))
def test_packing_is_skipped_where_a_panel_fits_in_place(dims, packed, monkeypatch, whole_copies):
    monkeypatch.setattr(packrule, "private_cache", lambda: MID_L2)
    items = _kernels(MM, dims)
    copies = [it for it in items if not _has_reduce(it)]
    assert len(copies) == (1 if packed else 0)
    assert len(items) == len(copies) + 1


def test_a_slice_of_an_input_keeps_the_inputs_row_stride(monkeypatch, whole_copies):
    # the odd-column split reads w[:, :1088] and w[:, 1088:] (slices of the input): the row stride is the input's
    # 1104 columns (4416 bytes: line-aligned, fits in place), so neither part is packed at 77 rows; with 1024
    # columns (a page of stride) the matmul's operand is
    monkeypatch.setattr(packrule, "private_cache", lambda: L2)
    src = "x: f32[T, C]\nw: f32[C, F]\nreturn relu(x @ w)\n"
    items = _kernels(src, {"T": 77, "C": 576, "F": 1104})
    assert sum(_has_reduce(it) for it in items) == 2  # the main part and the rest (16 columns)
    assert len(items) == 2  # the two parts, each writing its columns of the output in place: no packing copy
    items = _kernels(src, {"T": 77, "C": 576, "F": 1024})
    assert len(items) == 2  # the packing copy and the matmul


# odd rows (77, 197) and odd reduction lengths (77, 1000, 1365) on an operand read in place (a 1 MiB L2 makes
# these operands past it: column panels and no packing on the CPU; other devices run them through their own
# rules), against numpy (float64)
ODD = [
    {"M": 77, "K": 1000, "N": 288},
    {"M": 197, "K": 1365, "N": 288},
    {"M": 77, "K": 77, "N": 3424},
]


@pytest.mark.parametrize("dims", ODD, ids=lambda d: "x".join(map(str, d.values())))
def test_odd_matmuls_read_in_place_match_numpy(device, dims, monkeypatch):
    monkeypatch.setattr(packrule, "private_cache", lambda: MID_L2)
    monkeypatch.setattr(heuristic, "private_cache_bytes", lambda: MID_L2.size)
    arrays = _inputs(dims, seed=3)
    if device == "CPU":
        items = _kernels(MM, dims)
        assert len(items) == 1 and _has_reduce(items[0])  # read in place
    _check(_run(MM, device, dims, arrays), arrays["a"].astype(np.float64) @ arrays["b"].astype(np.float64))


def test_odd_matmul_with_panels_in_place_matches_numpy_on_the_cpu(monkeypatch):
    # the kernel that runs: column panels outermost (9 tiles on two cores) over an operand read in place
    monkeypatch.setattr(packrule, "private_cache", lambda: MID_L2)
    monkeypatch.setattr(heuristic, "private_cache_bytes", lambda: MID_L2.size)
    dims = {"M": 197, "K": 1001, "N": 288}
    items = _kernels(MM, dims)
    assert len(items) == 1  # no packing copy
    item = items[0]
    dev = get_device("CPU")
    k = OptKernel(prepare(item.ast, dev), dev)
    names = decide(k, Machine(private_cache=MID_L2.size, cores=2))
    assert "panels" in names and "padded_rows" in names
    arrays = _inputs(dims, seed=4)
    _check(_run(MM, "CPU", dims, arrays), arrays["a"].astype(np.float64) @ arrays["b"].astype(np.float64))


# --- column panels with fewer column tiles ----------------------------------------------------------------------

def _opts(dims: dict, machine: Machine) -> tuple[list[str], list[str]]:
    item = _kernels(MM, dims)[-1]
    dev = get_device("CPU")
    k = OptKernel(prepare(item.ast, dev), dev)
    names = decide(k, machine)
    return names, [str(o) for o in k.applied]


def test_the_panel_minimum_is_four_tiles_per_core_at_most_the_accumulators():
    assert panel_tiles_min(Machine(cores=1)) == 4
    assert panel_tiles_min(Machine(cores=2)) == 8
    assert panel_tiles_min(Machine(cores=16)) == 16  # (the old threshold where the cores are many)


@pytest.mark.parametrize("cores", [1, 2])
def test_twelve_column_tiles_past_the_cache_get_panels(cores):
    # 1536 x 384 f32 (2.25 MiB, past a 2 MiB L2): 384 columns are 12 tiles of 32; rows outermost streamed the
    # whole operand from the shared cache once per 8-row block (vit's down projection: 106 -> 165 GFLOP/s)
    names, opts = _opts({"M": 512, "K": 1536, "N": 384}, Machine(private_cache=2 << 20, cores=cores))
    assert names[-1] == "panels" and opts[-1] == "SWAP(0, 1)"
    # the same operand with many cores: 12 panels would leave threads idle, rows stay outermost
    names, opts = _opts({"M": 512, "K": 1536, "N": 384}, Machine(private_cache=2 << 20, cores=8))
    assert "panels" not in names and "SWAP(0, 1)" not in opts


def test_too_few_column_tiles_keep_rows_outermost():
    # 224 columns: 7 tiles < 8 on two cores
    names, opts = _opts({"M": 512, "K": 2400, "N": 224}, Machine(private_cache=2 << 20, cores=2))
    assert "panels" not in names
