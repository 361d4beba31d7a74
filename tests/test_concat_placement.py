"""Concatenations written in place (tgc/engine/placement.py, branch memory; issue 20 item 5): each piece of a
realized `cat` or split matmul join is stored straight into its slice of one buffer, a piece's producer read nowhere
else computes into the slice itself. Values against numpy on every device of TGC_TEST_DEVICES (PYTHON checks every
access against the buffer's bounds: a wrong offset fails there), kernel structure and planned peaks exactly."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.engine import schedule
from tgc.engine.inputs import random_inputs
from tgc.engine.placement import concat_of
from tgc.ir.shapes import shape_of

F32 = 4


def _run(src: str, dims: dict, device: str) -> tuple[dict, dict, list]:
    prog = tgc.loads(src)
    inputs = random_inputs(prog, dims, seed=3)
    outs = prog.run(dims=dims, inputs=inputs, device=device)
    return inputs, outs, prog.schedule(dims, device)


def _squeeze(shape: tuple) -> tuple:
    return tuple(d for d in shape if d != 1)


def _writers(items: list) -> dict:
    """Output node -> the kernels writing it."""
    got: dict = {}
    for it in items:
        got.setdefault(it.output, []).append(it)
    return got


CAT_FIRST = """a: f32[N, K]
w1: f32[K, M]
w2: f32[K, M]
return cat(relu(a @ w1), a @ w2 * 2.0, axis=0)
"""


def test_cat_along_the_first_axis_is_written_by_its_producers(device):
    dims = {"N": 5, "K": 7, "M": 9}
    x, out, items = _run(CAT_FIRST, dims, device)
    want = np.concatenate([np.maximum(x["a"] @ x["w1"], 0), x["a"] @ x["w2"] * 2], axis=0)
    np.testing.assert_allclose(out["out0"], want, rtol=1e-5, atol=1e-5)
    # two matmul kernels, both storing into the one output: no buffer for either product, no copy
    assert len(items) == 2 and all(it.name.startswith("r_") for it in items)
    assert len(_writers(items)) == 1


CAT_INNER_READ_ELSEWHERE = """a: f32[B, N, K]
w1: f32[K, P]
w2: f32[K, Q]
p = a @ w1
q = a @ w2
c = cat(p, q, axis=2)
return c * 3.0 + 1.0, sum(q, axis=2)
"""


def test_cat_along_an_inner_axis_at_odd_sizes_keeps_a_producer_read_elsewhere(device):
    dims = {"B": 2, "N": 3, "K": 4, "P": 5, "Q": 7}
    x, out, items = _run(CAT_INNER_READ_ELSEWHERE, dims, device)
    p, q = x["a"] @ x["w1"], x["a"] @ x["w2"]
    np.testing.assert_allclose(out["out0"], np.concatenate([p, q], axis=2) * 3 + 1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["out1"], q.sum(axis=2), rtol=1e-5, atol=1e-5)
    writers = _writers(items)
    cat_kernels = [its for node, its in writers.items() if len(its) > 1]
    assert len(cat_kernels) == 1  # out0: p's matmul (placed, elementwise tail fused) and the copy of q
    placed, copy = cat_kernels[0]
    assert placed.name.startswith("r_") and copy.name.startswith("E_")
    # q is read by the sum at other indices: it keeps its own buffer, written by a matmul of its own
    q_nodes = [node for node, its in writers.items() if len(its) == 1 and _squeeze(shape_of(node)) == (2, 3, 7)]
    assert len(q_nodes) == 1 and q_nodes[0] in copy.bufs[1:] and writers[q_nodes[0]][0].name.startswith("r_")


def test_a_split_matmul_at_odd_columns_and_rows_writes_its_parts_into_one_output(device, monkeypatch):
    # small sizes split as the corpus's large ones do (the split's size floors lowered for the test); K <= 8: an odd
    # reduction's rest, summed in the join, would keep the join whole (one matmul's loops per kernel)
    monkeypatch.setattr(schedule, "SPLIT_MIN_PRODUCTS", 1)
    src = "x: f32[M, K]\nw: f32[K, N]\nb: f32[N]\nreturn relu(x @ w + b)\n"
    for dims in ({"M": 6, "K": 8, "N": 37}, {"M": 13, "K": 5, "N": 37}):  # (odd rows stay whole: never split)
        x, out, items = _run(src, dims, device)
        want = np.maximum(x["x"] @ x["w"] + x["b"], 0)
        np.testing.assert_allclose(out["out0"], want, rtol=1e-5, atol=1e-5)
        writers = _writers(items)
        out_node = next(node for node, its in writers.items() if len(its) > 1)
        # the main part computes into the output (bias and relu fused); the rest, computed wider than the odd
        # remainder (overlapping the main part), has a buffer of its own and its remainder is copied in
        assert len(writers[out_node]) == 2 and len(items) == 3  # main part, rest, its copy: no join over a buffer
        (rest,) = [node for node in writers if node is not out_node]  # the only intermediate: the rest's 16 columns
        assert _squeeze(shape_of(rest)) == (dims["M"], 16)


@pytest.mark.parametrize("tail", ["h + flip(h, axis=1)", "h * flip(h, axis=1)", "h + flip(h, axis=0)",
                                  "relu(h) + h[:, 0:1]"])
def test_a_split_matmul_read_at_other_positions_above_its_join_keeps_the_join(device, monkeypatch, tail):
    """Work above a join that reads it at other positions (`flip`, a column broadcast) is no elementwise tail: each
    piece's kernel would read the other piece's region, which no buffer holds (review 20: NaN and garbage at
    196 x 64 x 1000 on every device). The join stays a buffer; results match numpy."""
    monkeypatch.setattr(schedule, "SPLIT_MIN_PRODUCTS", 1)
    src = f"x: f32[M, K]\nw: f32[K, N]\nh = x @ w\nreturn {tail}\n"
    dims = {"M": 6, "K": 8, "N": 37}
    x, out, _ = _run(src, dims, device)
    h = x["x"].astype(np.float64) @ x["w"]
    want = {"h + flip(h, axis=1)": h + h[:, ::-1], "h * flip(h, axis=1)": h * h[:, ::-1],
            "h + flip(h, axis=0)": h + h[::-1], "relu(h) + h[:, 0:1]": np.maximum(h, 0) + h[:, :1]}[tail]
    np.testing.assert_allclose(out["out0"], want, rtol=1e-4, atol=1e-4)


def test_the_planned_peak_is_the_concatenation_alone():
    # a [8, 16], w1 w2 [16, 16], w3 [32, 16]: both products are stored into cat's [8, 32] buffer, which is read by
    # the last matmul into out [8, 16]: inputs + cat + out, nothing else (too few rows to pack an operand)
    src = ("a: f32[N, K]\nw1: f32[K, K]\nw2: f32[K, K]\nw3: f32[2 * K, K]\n"
           "return cat(a @ w1, a @ w2, axis=1) @ w3\n")
    dims = {"N": 8, "K": 16}
    prog = tgc.loads(src)
    exe = prog.lower("CPU", dims=dims)
    plan = exe.memory_plan()
    inputs = (8 * 16 + 16 * 16 * 2 + 32 * 16) * F32
    assert plan.peak_bytes == inputs + 8 * 32 * F32 + 8 * 16 * F32
    assert len(exe.kernels) == 3
    x = random_inputs(prog, dims, seed=1)
    out = prog.run(dims=dims, inputs=x)
    want = np.concatenate([x["a"] @ x["w1"], x["a"] @ x["w2"]], axis=1) @ x["w3"]
    np.testing.assert_allclose(out["out0"], want, rtol=1e-4, atol=1e-4)


def test_only_exact_concatenations_match():
    prog = tgc.loads("a: f32[N]\nb: f32[N]\nreturn cat(a, b), a + b, pad(a, ((1, 2),)) + pad(b, ((0, 3),))\n")
    outs, _ = prog._trace({"N": 4})
    c = concat_of(outs[0])
    assert c is not None and c.axis == 0 and [(o, n) for o, n, _ in c.pieces] == [(0, 4), (4, 4)]
    assert concat_of(outs[1]) is None
    assert concat_of(outs[2]) is None  # the pieces overlap: a sum, not a concatenation


@pytest.mark.parametrize("dims", [{"B": 2, "C": 3, "S": 6}])
def test_a_skip_connection_read_by_a_pool_and_a_cat(dims, device):
    # the U-Net's shape: skip is pooled and concatenated; the upsampled branch is concatenated only
    src = """x: f32[B, C, S, S]
skip = relu(x * 2.0 - 1.0)
low = max_pool2d(skip, 2)
up = repeat(repeat(low, 2, axis=2), 2, axis=3) * 0.5
return cat(up, skip, axis=1)
"""
    x, out, _items = _run(src, dims, device)
    skip = np.maximum(x["x"] * 2 - 1, 0)
    b, c, s, _ = skip.shape
    low = skip.reshape(b, c, s // 2, 2, s // 2, 2).max(axis=(3, 5))
    up = low.repeat(2, axis=2).repeat(2, axis=3) * 0.5
    np.testing.assert_allclose(out["out0"], np.concatenate([up, skip], axis=1), rtol=1e-6, atol=1e-6)
