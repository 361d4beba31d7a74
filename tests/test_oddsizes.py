"""Odd sizes are tiled (issue 20, item 2): a large matmul whose rows, columns or reduction length have no
divisor the register tile wants is computed as a main part and the rest (`tgc.engine.schedule.split_odd_sizes`),
on every device. Split decisions are compared with exact kernel lists; values with numpy (float64).

The small cases lower `SPLIT_MIN_PRODUCTS` so that matmuls of a few thousand multiply-adds split (the PYTHON
emulator runs them quickly); each uses dims no other test uses, so the session's program cache never serves a
program built under another threshold."""

from __future__ import annotations

import numpy as np
import pytest
from convkit import conv_np

import tgc
from tgc.engine import schedule
from tgc.engine.inputs import random_inputs
from tgc.ir.uop import Ops

MM = "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b\n"


def _matmul_shapes(prog: tgc.Program, dims: dict[str, int], device: str) -> list[tuple[int, ...]]:
    """(rows, columns, reduction steps) of every kernel that reduces, in launch order."""
    shapes = []
    for item in prog.schedule(dims, device=device):
        ranges = [u for u in item.ast.toposort() if u.op is Ops.RANGE]
        loops = sorted((r for r in ranges if r.arg[1].name == "LOOP"), key=lambda r: r.arg[0])
        steps = [r.src[0].arg for r in ranges if r.arg[1].name == "REDUCE"]
        if steps:
            shapes.append(tuple(r.src[0].arg for r in loops) + tuple(steps))
    return shapes


def _check(out: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# (M, N, K) -> the matmul kernels (rows, columns, steps): the reduction's rest is a kernel of its own only
# where the consumer is that kernel (here the program's output); columns rest = the last 16 or 32 columns; odd
# rows are never split (the kernel pads them to whole register tiles)
DECISIONS = [
    ({"M": 1365, "N": 64, "K": 64}, [(1365, 64, 64)]),  # odd rows: whole
    ({"M": 64, "N": 1000, "K": 128}, [(64, 992, 128), (64, 16, 128)]),  # odd columns
    ({"M": 64, "N": 64, "K": 1365}, [(64, 64, 1360), (64, 64, 5)]),  # odd reduction, few outputs: 1360 + 5
    ({"M": 128, "N": 256, "K": 197}, [(128, 256, 197)]),  # odd reduction, many outputs: whole
    ({"M": 1365, "N": 1000, "K": 197}, [(1365, 992, 197), (1365, 16, 197)]),  # columns only
    # 4081 outputs: the reduction, then its main part's columns (32 and the last 32: too small to split again)
    ({"M": 77, "N": 53, "K": 1365}, [(77, 32, 1360), (77, 32, 1360), (77, 53, 5)]),
    ({"M": 64, "N": 64, "K": 1024}, [(64, 64, 1024)]),  # multiples: one kernel
    ({"M": 77, "N": 197, "K": 5}, [(77, 197, 5)]),  # too small to split (under SPLIT_MIN_PRODUCTS)
]


@pytest.mark.parametrize("dims,want", DECISIONS, ids=lambda v: "x".join(map(str, v.values()))
                         if isinstance(v, dict) else None)
def test_split_decisions_are_a_rule_over_sizes(dims, want):
    prog = tgc.loads(MM)
    for device in ("CPU", "PYTHON", "OPENCL"):  # the same parts on every device (scheduling opens no device)
        assert _matmul_shapes(prog, dims, device) == want, device


def test_an_epilogue_takes_the_reductions_rest():
    """relu(a @ b + bias) with K = 2053: the main part (2048 steps) is a kernel; the 5 remaining steps are summed
    by the kernel that adds the bias, reading the main part (no third kernel, no copy of the operands)."""
    prog = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nbias: f32[N]\nreturn relu(a @ b + bias)\n")
    items = prog.schedule({"M": 32, "N": 64, "K": 2053}, device="CPU")
    assert [i.name for i in items] == ["r_32_64_2048", "r_32_64_5"]
    assert all(i.line == 4 for i in items)


SMALL = [("odd rows", {"M": 29, "N": 32, "K": 16}), ("odd columns", {"M": 16, "N": 45, "K": 24}),
         ("odd reduction", {"M": 24, "N": 32, "K": 19}), ("all three", {"M": 27, "N": 37, "K": 11})]


@pytest.mark.parametrize("dims", [d for _, d in SMALL], ids=[n for n, _ in SMALL])
def test_odd_matmuls_match_numpy(device, dims, monkeypatch):
    monkeypatch.setattr(schedule, "SPLIT_MIN_PRODUCTS", 1)
    prog = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nbias: f32[N]\nreturn relu(a @ b + bias) * 2\n")
    # split by columns (+1 kernel) and by steps (+1), never by rows
    assert len(_matmul_shapes(prog, dims, device)) == 1 + (dims["N"] % 32 > 0) + (dims["K"] % 8 > 0)
    inputs = random_inputs(prog, dims, seed=3)
    a, b, bias = (inputs[n].astype(np.float64) for n in ("a", "b", "bias"))
    _check(prog.run(device=device, **inputs)["out0"], np.maximum(a @ b + bias, 0) * 2)


def test_odd_batched_matmul_matches_numpy(device, monkeypatch):
    """A batch of matmuls with a broadcast left-hand side, odd in all three sizes."""
    monkeypatch.setattr(schedule, "SPLIT_MIN_PRODUCTS", 1)
    prog = tgc.loads("a: f32[M, K]\nb: f32[B, K, N]\nreturn a @ b\n")
    dims = {"B": 2, "M": 21, "N": 35, "K": 13}
    # 8 steps as 32 + the last 16 columns, then the 5 remaining steps summed by the output's own kernel
    assert _matmul_shapes(prog, dims, device) == [(2, 21, 32, 8), (2, 21, 16, 8), (2, 21, 35, 5)]
    inputs = random_inputs(prog, dims, seed=4)
    _check(prog.run(device=device, **inputs)["out0"], inputs["a"].astype(np.float64) @ inputs["b"])


def test_large_odd_matmul_matches_numpy_on_the_cpu():
    """At the real threshold: 77 rows, 197 columns, 1365 steps (each odd) on the CPU's packed, tiled kernels:
    the columns split; 77 rows stay whole, padded to whole tiles in the kernel."""
    prog = tgc.loads(MM)
    dims = {"M": 77, "N": 197, "K": 1365}
    assert _matmul_shapes(prog, dims, "CPU") == [(77, 192, 1365), (77, 16, 1365)]
    inputs = random_inputs(prog, dims, seed=6)
    _check(prog.run(device="CPU", **inputs)["out0"], inputs["a"].astype(np.float64) @ inputs["b"])


def test_odd_conv_and_reductions_match_numpy(device):
    """Odd channels, image sizes and reduction lengths under every threshold (values only)."""
    conv = tgc.loads("x: f32[N, C, H, W]\nw: f32[O, C, 3, 3]\nreturn relu(conv2d(x, w, padding=1))\n")
    dims = {"N": 1, "C": 5, "H": 13, "W": 11, "O": 7}
    inputs = random_inputs(conv, dims, seed=7)
    x, w = (inputs[n].astype(np.float64) for n in ("x", "w"))
    _check(conv.run(device=device, **inputs)["out0"], np.maximum(conv_np(x, w, 1, 1), 0))
    red = tgc.loads("x: f32[M, N]\nreturn x.sum(axis=1), x.max(axis=0), x.mean()\n")
    dims = {"M": 33, "N": 197}
    inputs = random_inputs(red, dims, seed=8)
    x = inputs["x"].astype(np.float64)
    out = red.run(device=device, **inputs)
    for got, want in zip((out["out0"], out["out1"], out["out2"]), (x.sum(1), x.max(0), x.mean())):
        _check(got, want)


CONV = ("x: f32[N, C, H, W]\nw: f32[O, C, 3, 3]\nb: f32[O]\n"
        "return relu(conv2d(x, w, padding=1) + b.reshape(1, -1, 1, 1))\n")


def test_odd_conv_channels_are_split_on_the_cpu():
    """100 output channels: 96 (their weight packed into 16-channel lanes) and the last 16 (large enough to be
    packed too); 96 stay whole. Elsewhere (no packing) the conv is one kernel. The 96 channels' conv stores into
    the output itself and only the last part's 4 channels are copied in (tgc/engine/placement.py)."""
    prog = tgc.loads(CONV)
    dims = {"N": 1, "C": 64, "H": 28, "W": 28, "O": 100}
    # (first the padded input's copy, read by both parts: schedule._reading_padded_copy)
    assert [i.name for i in prog.schedule(dims, device="CPU")] == \
        ["E_64_30_30", "E_6_64_3_3_16", "r_96_28_28_64_3_3", "E_64_3_3_16", "r_16_28_28_64_3_3", "E_4_28_28"]
    assert [i.name for i in prog.schedule(dims | {"O": 96}, device="CPU")] == \
        ["E_64_30_30", "E_6_64_3_3_16", "r_96_28_28_64_3_3"]
    assert len(prog.schedule(dims, device="OPENCL")) == 1


def test_split_conv_matches_numpy(device, monkeypatch):
    monkeypatch.setattr(schedule, "CONV_MIN_FLOPS", 1)
    prog = tgc.loads(CONV)
    dims = {"N": 2, "C": 3, "H": 9, "W": 7, "O": 21}
    if device == "CPU":  # 16 channels and the last 16
        assert len(_matmul_shapes(prog, dims, device)) == 2
    inputs = random_inputs(prog, dims, seed=9)
    x, w, b = (inputs[n].astype(np.float64) for n in ("x", "w", "b"))
    _check(prog.run(device=device, **inputs)["out0"], np.maximum(conv_np(x, w, 1, 1) + b.reshape(1, -1, 1, 1), 0))


def _stored_elements(item) -> int:
    """Elements a kernel that runs no reduction stores (the product of its loops), 0 for one that reduces."""
    ranges = [u for u in item.ast.toposort() if u.op is Ops.RANGE]
    if any(r.arg[1].name == "REDUCE" for r in ranges):
        return 0
    return int(np.prod([r.src[0].arg for r in ranges if r.arg[1].name == "LOOP"], dtype=np.int64))


PROGRAMS = [("output", MM), ("consumer", "a: f32[M, K]\nb: f32[K, N]\nbias: f32[N]\nreturn relu(a @ b + bias)\n")]


@pytest.mark.parametrize("kind,src", PROGRAMS, ids=[k for k, _ in PROGRAMS])
@pytest.mark.parametrize("dims", [{"M": 27, "N": 45, "K": 24}, {"M": 29, "N": 45, "K": 19},
                                  {"M": 21, "N": 77, "K": 197}], ids=lambda d: "x".join(map(str, d.values())))
def test_odd_parts_store_into_the_output(device, kind, src, dims, monkeypatch):
    """Odd rows, columns and steps, as the program's output or under an epilogue: the parts write the one output
    buffer themselves. No kernel passes over the whole output to join them: the only kernel that reduces nothing
    copies the columns' rest (its last n % 32 columns) into place. (An odd k of few outputs: the last kernel sums
    the remaining steps while it reads the parts, by design.)"""
    monkeypatch.setattr(schedule, "SPLIT_MIN_PRODUCTS", 1)
    prog = tgc.loads(src)
    m, n = dims["M"], dims["N"]
    items = prog.schedule(dims, device=device)
    assert len(_matmul_shapes(prog, dims, device)) >= 2  # split
    out = next(i.bufs[0] for i in items if not _stored_elements(i))  # the main part's: stored into the output
    copies = [_stored_elements(i) for i in items if i.bufs[0] is out and _stored_elements(i)]
    assert all(c <= m * (n % 32) for c in copies), [i.name for i in items]
    inputs = random_inputs(prog, dims, seed=11)
    a, b = inputs["a"].astype(np.float64), inputs["b"].astype(np.float64)
    want = a @ b if kind == "output" else np.maximum(a @ b + inputs["bias"], 0)
    _check(prog.run(device=device, **inputs)["out0"], want)


def test_large_odd_matmul_has_no_join_pass():
    """1365 x 1000 x 197 on the CPU, as the output and under an epilogue: the main part (992 columns, all 1365 rows:
    the kernel pads the rows) stores into the output, the rest's last 8 columns are copied in; no kernel reads the
    parts back to join them (the row split did: a pass over the whole output, a quarter of the time). The main
    part's 197 x 992 operand (under PACK_MIN_ELEMENTS) is packed: its rows (1000 floats apart) start off cache
    lines."""
    for _, src in PROGRAMS:
        prog = tgc.loads(src)
        items = prog.schedule({"M": 1365, "N": 1000, "K": 197}, device="CPU")
        assert [i.name for i in items] == ["E_31_197_32", "r_1365_992_197", "r_1365_16_197", "E_1365_8"]
        # the same operand on line-aligned rows (992 columns) is read in place
        assert [i.name for i in prog.schedule({"M": 1365, "N": 992, "K": 197}, device="CPU")] == ["r_1365_992_197"]
        # few rows: the copy would not pay (`packrule.PACK_IN_PLACE_MAX_ROWS`)
        assert [i.name for i in prog.schedule({"M": 200, "N": 1000, "K": 197}, device="CPU")][0] == "r_200_992_197"
    prog = tgc.loads(PROGRAMS[1][1])  # the values, with the packed copy and the padded rows
    dims = {"M": 1365, "N": 1000, "K": 197}
    inputs = random_inputs(prog, dims, seed=12)
    a, b = inputs["a"].astype(np.float64), inputs["b"].astype(np.float64)
    _check(prog.run(device="CPU", **inputs)["out0"], np.maximum(a @ b + inputs["bias"], 0))


def test_rows_on_lines():
    from tgc.engine.packrule import CacheGeometry, rows_on_lines
    cache = CacheGeometry(size=1 << 20, ways=16, line=64)
    assert rows_on_lines(992, 4, cache) and rows_on_lines(32, 2, cache)
    assert not rows_on_lines(1000, 4, cache) and not rows_on_lines(196, 4, cache)
