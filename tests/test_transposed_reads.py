"""An elementwise value computed over a transpose and read by several kernels gets a buffer in its readers' order
(`tgc.engine.schedule._transposed_read`; the MLP-Mixer's `y = x + token_mlp(...).transpose(1, 2)`, read by the
second layernorm and the final residual), and the kernel that stores it reads the transpose a tile at a time
(`tgc.codegen.heuristic._transposed_tile`). Kernel structure is compared with exact expectations, values with
numpy; no timings."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.codegen.opt import OptOps
from tgc.engine import schedule
from tgc.engine.inputs import random_inputs

# y = x + (h @ w + b)^T (the bias keeps the transpose above the matmul, as an MLP's does) is read by the
# layernorm's kernel and by the matmul's epilogue (two kernels)
TWO_READERS = """x: f32[B, S, C]
h: f32[B, C, K]
w: f32[K, S]
b: f32[S]
w2: f32[C, C]
y = x + (h @ w + b).transpose(1, 2)
return layernorm(y) @ w2 + y
"""
# y read by one kernel only (the layernorm's): nothing to share
ONE_READER = """x: f32[B, S, C]
h: f32[B, C, K]
w: f32[K, S]
b: f32[S]
y = x + (h @ w + b).transpose(1, 2)
return layernorm(y)
"""


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))


def _numpy(inputs: dict[str, np.ndarray]) -> np.ndarray:
    x, h, w, b = (inputs[k].astype(np.float64) for k in ("x", "h", "w", "b"))
    y = x + np.swapaxes(h @ w + b, 1, 2)
    mu = y.mean(-1, keepdims=True)
    ln = (y - mu) / np.sqrt(((y - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    return ln @ inputs["w2"].astype(np.float64) + y


def _names(src: str, dims: dict[str, int]) -> list[str]:
    return [i.name for i in tgc.loads(src).schedule(dims, device="CPU") if i.ast.src]


def _check(prog: tgc.Program, inputs: dict[str, np.ndarray], device: str = "CPU") -> None:
    want = _numpy(inputs)
    got = prog.run(device=device, **inputs)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_transposed_value_read_by_two_kernels_is_stored_in_its_readers_order(fresh_cache, monkeypatch):
    """72 rows: y is stored by the matmul's own kernel, computed in y's order (rows, then channels) instead of the
    matmul's (channels, then rows) with y recomputed over it in both readers."""
    dims = {"B": 2, "S": 72, "C": 512, "K": 32}  # y: 2 x 72 x 512 >= TRANSPOSED_MIN_ELEMENTS
    names = _names(TWO_READERS, dims)
    assert "r_2_72_512_32" in names and "r_2_512_72_32" not in names, names
    prog = tgc.loads(TWO_READERS)
    inputs = random_inputs(prog, dims, seed=1)
    _check(prog, inputs)
    monkeypatch.setattr(schedule, "TRANSPOSED_MIN_ELEMENTS", 1 << 62)  # the rule off: the matmul in its own order
    names = _names(TWO_READERS, dims)
    assert "r_2_512_72_32" in names and "r_2_72_512_32" not in names, names
    _check(tgc.loads(TWO_READERS), inputs)


def test_a_transposed_join_is_stored_by_a_tiled_kernel(fresh_cache, monkeypatch):
    """196 rows (the MLP-Mixer's): the matmul's odd columns are split (192 + the last 16) and joined before the
    walk; the join becomes one buffer its parts write in place (the last 4 columns copied in), and one kernel
    stores y from it, reading the transpose 16 channels by 4 rows at a time."""
    dims = {"B": 2, "S": 196, "C": 512, "K": 32}
    names = _names(TWO_READERS, dims)
    assert "E_2_196_512" in names and "E_2_512_4" in names, names
    prog = tgc.loads(TWO_READERS)
    inputs = random_inputs(prog, dims, seed=2)
    _check(prog, inputs)
    k = next(k for k in prog.lower("CPU", dims=dims).kernels if k.name == "E_2_196_512")
    assert [(o.axis, o.amount) for o in k.opts if o.op is OptOps.UPCAST] == [(2, 16), (1, 4)], k.opts
    monkeypatch.setattr(schedule, "TRANSPOSED_MIN_ELEMENTS", 1 << 62)
    assert "E_2_196_512" not in _names(TWO_READERS, dims)
    _check(tgc.loads(TWO_READERS), inputs)


def test_one_reader_or_a_small_value_is_not_stored(fresh_cache):
    names = _names(ONE_READER, {"B": 2, "S": 72, "C": 512, "K": 32})
    assert "r_2_512_72_32" in names, names  # (y fused into the layernorm's kernel; the matmul in its own order)
    names = _names(TWO_READERS, {"B": 2, "S": 9, "C": 64, "K": 8})  # 1152 elements: recomputing is cheaper
    assert "r_2_64_9_8" in names, names


def test_a_value_not_transposed_is_not_stored(fresh_cache):
    # the same program without the transpose: y's reads follow its own rows; y is recomputed in both readers
    src = TWO_READERS.replace("h: f32[B, C, K]", "h: f32[B, S, K]").replace("w: f32[K, S]", "w: f32[K, C]") \
        .replace("b: f32[S]", "b: f32[C]").replace("(h @ w + b).transpose(1, 2)", "h @ w + b")
    assert not any(n.startswith("E_2_72_512") for n in _names(src, {"B": 2, "S": 72, "C": 512, "K": 32}))


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_small_sizes_with_the_rule_forced_match_numpy(fresh_cache, monkeypatch, device):
    """The rule at a threshold of 1 (every size), on the bounds-checked PYTHON device too."""
    monkeypatch.setattr(schedule, "TRANSPOSED_MIN_ELEMENTS", 1)
    dims = {"B": 2, "S": 36, "C": 16, "K": 8}
    assert "r_2_36_16_8" in _names(TWO_READERS, dims)
    prog = tgc.loads(TWO_READERS)
    _check(prog, random_inputs(prog, dims, seed=3), device)


TRANSPOSED_LHS = "a: f32[B, S, C]\nw: f32[S, K]\nreturn a.transpose(1, 2) @ w\n"


@pytest.mark.parametrize("k_cols, lanes", [(64, False), (40, True)])
def test_a_transposed_lhs_matmul_takes_the_columns_as_lanes(fresh_cache, k_cols, lanes):
    """`a^T @ w` with `a` [S, C]: the channels are contiguous in `a` (a `lane_axis`), but the output's columns (K)
    are two whole vectors read contiguously from `w`: a plain matmul tile, columns as lanes, stored as vectors
    (`heuristic._whole_vector_columns`); 40 columns are not, and the lanes' tile stays."""
    dims = {"B": 2, "S": 196, "C": 128, "K": k_cols}
    prog = tgc.loads(TRANSPOSED_LHS)
    exe = prog.lower("CPU", dims=dims)
    (k,) = [k for k in exe.kernels if k.name.startswith("r_")]
    first = next(o for o in k.opts if o.op is OptOps.UPCAST)
    assert (first.axis, first.amount) == ((1, 16) if lanes else (2, 16)), k.opts
    inputs = random_inputs(prog, dims, seed=5)
    want = np.swapaxes(inputs["a"].astype(np.float64), 1, 2) @ inputs["w"].astype(np.float64)
    got = prog.run(**inputs)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
