"""REDUCE(ONLINE_SOFTMAX) (issue 20 item 4, branch online3): the online softmax as a reduce op of the IR, lowered
by the pipeline's passes. Its value over (score, value) pairs is `sum_j exp(s_j - max s) v_j / sum_j exp(s_j - max
s)`; `unroll_reduce` makes its UNROLL one block (all scores, then all values), `linearize` writes its accumulators
(one running max and sum per group of REDUCEs of the same scores, one weighted sum each). The fused attention's
per-row form without vectors or staging (PYTHON, NOOPT, a GPU without staging) is such a kernel: checked here
against numpy, and its passes against exact expectations."""

from __future__ import annotations

import numpy as np
import pytest
from test_attention_fused import check, program

from tgc.backends import get_device
from tgc.codegen.attention import BLOCK, AttentionKernel, is_fused_attention, lower_attention
from tgc.codegen.expand import unroll_reduces
from tgc.codegen.linearize import linearize
from tgc.codegen.opt import Opt, OptOps
from tgc.dtype import dtypes
from tgc.ir.kernel import INDEX, identity
from tgc.ir.symbolic import simplify
from tgc.ir.uop import Ops, RangeKind, UOp, substitute

SMALL = {"B": 2, "T": 21, "D": 5, "E": 3}


def _item(p, device: str, dims: dict):
    items = [it for it in p.schedule(dims=dims, device=device) if is_fused_attention(it.ast)]
    assert len(items) == 1
    return items[0]


def test_online_softmax_has_no_identity_element():
    with pytest.raises(ValueError, match="no identity"):
        identity(Ops.ONLINE_SOFTMAX, dtypes.f32)


def test_unroll_reduce_makes_the_unrolled_keys_one_block():
    """UNROLL(4) of an ONLINE_SOFTMAX: one REDUCE over the outer range whose value holds the 4 keys' scores, then
    their 4 values, in key order (not a tree of copies, as an ADD's would be)."""
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.f32.as_ptr(), (), 1)
    outer = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, 3),), (0, RangeKind.REDUCE))
    inner = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, 4),), (1, RangeKind.UNROLL))
    j = outer * UOp.const(INDEX, 4) + inner
    score = UOp(Ops.LOAD, dtypes.f32, (buf, j))
    value = UOp(Ops.LOAD, dtypes.f32, (buf, j + UOp.const(INDEX, 12)))
    red = UOp(Ops.REDUCE, dtypes.f32, (UOp(Ops.VECTORIZE, dtypes.f32.vec(2), (score, value)), outer, inner),
              Ops.ONLINE_SOFTMAX)
    out = unroll_reduces(UOp(Ops.SINK, None, (red,))).src[0]
    assert out.op is Ops.REDUCE and out.arg is Ops.ONLINE_SOFTMAX and out.src[1:] == (outer,)
    block = out.src[0]
    assert block.op is Ops.VECTORIZE and block.dtype == dtypes.f32.vec(8)
    offsets = []
    for ld in block.src:
        assert ld.op is Ops.LOAD
        at_block_1 = simplify(substitute(ld.src[1], {outer: UOp.const(INDEX, 1)}))
        assert at_block_1.op is Ops.CONST
        offsets.append(at_block_1.arg)
    assert offsets == [4, 5, 6, 7, 16, 17, 18, 19]


def test_a_malformed_online_softmax_is_refused_by_the_linearizer():
    """Its value must be an f32 VECTORIZE of as many scores as values (a tgc bug otherwise, never a wrong kernel)."""
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.f32.as_ptr(), (), 0)
    r = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, 3),), (0, RangeKind.REDUCE))
    one = UOp(Ops.LOAD, dtypes.f32, (buf, r))
    odd = UOp(Ops.VECTORIZE, dtypes.f32.vec(3), (one, one, one))
    for value in (one, odd):
        red = UOp(Ops.REDUCE, dtypes.f32, (value, r), Ops.ONLINE_SOFTMAX)
        store = UOp(Ops.STORE, None, (buf, UOp.const(INDEX, 0), red))
        with pytest.raises(RuntimeError, match="ONLINE_SOFTMAX"):
            linearize(UOp(Ops.SINK, None, (store,)))


def test_the_fused_kernel_goes_through_the_named_passes_on_the_python_device():
    item = _item(program(True), "PYTHON", SMALL)
    trace: list[tuple[str, str]] = []
    low = lower_attention(item, get_device("PYTHON"), "attn", trace=trace)
    names = [n for n, _ in trace]
    for p in ("legalize_half", "apply_opts", "narrow_index", "unroll_reduce", "upcast_stores", "linearize"):
        assert p in names, names
    after_unroll = dict(trace)["unroll_reduce"]
    assert "ONLINE_SOFTMAX" in after_unroll
    # the E=3 output columns share one running max and sum: one ACCUMULATE MAX (the inner products are ADDs),
    # MUL once for l and once per column, ADD for l, each column and the inner products (16 keys per block)
    accs = [u.arg for u in low.uops if u.op is Ops.ACCUMULATE]
    assert accs.count(Ops.MAX) == 1 and accs.count(Ops.MUL) == 1 + 3
    assert accs.count(Ops.ADD) == 1 + 3 + 16
    assert not any(u.op is Ops.VECTORIZE for u in low.uops)


@pytest.mark.parametrize("block", [2, 3, 8, 32])
def test_key_blocks_chosen_by_an_opt_match_numpy_on_the_python_device(block, monkeypatch):
    """BEAM's UNROLL of the key axis sets the block (ragged last blocks at T=21: masked with -inf)."""
    monkeypatch.setenv("TGC_VERIFY_BOUNDS", "1")
    p = program(True)
    item = _item(p, "PYTHON", SMALL)
    k = AttentionKernel(item, get_device("PYTHON"))
    low = lower_attention(item, get_device("PYTHON"), "attn", opts=[Opt(OptOps.UNROLL, k.key_axis, block)])
    assert sum(u.op is Ops.ACCUMULATE and u.arg is Ops.MAX for u in low.uops) == 1
    _run_through(p, "PYTHON", block, monkeypatch)


def _run_through(p, device: str, block: int, monkeypatch) -> None:
    """`check` with the attention kernel's opts forced to UNROLL(key, block) (so the program runs that lowering)."""
    from tgc.codegen import attention as attn
    orig = attn.attention_kernel

    calls = []

    def forced(item, dev, opts=None):
        calls.append(dev.name)
        k = AttentionKernel(item, dev)
        k.apply(Opt(OptOps.UNROLL, k.key_axis, block))
        return k

    monkeypatch.setattr(attn, "attention_kernel", forced)
    try:
        check(p, True, device, SMALL["B"], SMALL["T"], SMALL["D"], SMALL["E"], tol=2e-5)
        assert calls, "the program's kernel was not lowered here (a cached kernel ran)"
    finally:
        monkeypatch.setattr(attn, "attention_kernel", orig)


@pytest.mark.parametrize("device", ["CPU", "OPENCL"])
def test_noopt_kernels_are_the_passes_online_softmax_and_match_numpy(device, monkeypatch):
    """Under NOOPT the CPU (LLVM: the update's exps as polynomials) and OpenCL (no staging) lower the fused kernel
    through the passes too."""
    monkeypatch.setenv("NOOPT", "1")
    p = program(False)
    item = _item(p, device, SMALL)
    trace: list[tuple[str, str]] = []
    low = lower_attention(item, get_device(device), "attn", trace=trace)
    assert "unroll_reduce" in dict(trace)
    assert sum(u.op is Ops.ACCUMULATE and u.arg is Ops.MAX for u in low.uops) == 1
    if device == "CPU":
        assert not any(u.op is Ops.EXP2 for u in low.uops)  # decomposed
    check(p, False, device, SMALL["B"], SMALL["T"], SMALL["D"], SMALL["E"], tol=2e-5)


def test_half_inputs_on_the_python_device_match_numpy():
    p = program(False, "f16")
    check(p, False, "PYTHON", 1, 19, 4, 3, dtype=np.float16, tol=2e-2)


def test_the_gpu_staged_form_goes_through_the_passes_with_a_barrier_ending_each_block():
    """OpenCL: k and v staged per block in shared memory (a BARRIER after the staging stores), and a second BARRIER
    as the block's last op, after the accumulators' update, so the next staging waits for every reader."""
    item = _item(program(False), "OPENCL", SMALL)
    trace: list[tuple[str, str]] = []
    low = lower_attention(item, get_device("OPENCL"), "attn", trace=trace)
    assert {"map_to_grid", "unroll_reduce", "linearize"} <= set(dict(trace))
    uops = low.uops
    assert any(u.op is Ops.DEFINE_LOCAL for u in uops)
    barriers = [i for i, u in enumerate(uops) if u.op is Ops.BARRIER]
    assert len(barriers) == 2
    key_loop = next(i for i, u in enumerate(uops) if u.op is Ops.RANGE and u.arg[1] is RangeKind.REDUCE
                    and any(w.op is Ops.ACCUMULATE and w.arg is Ops.MAX for w in uops[i:]))
    end = next(i for i, u in enumerate(uops) if u.op is Ops.ENDRANGE and u.src[0] is uops[key_loop])
    assert key_loop < barriers[0] < barriers[1] == end - 1
    assert uops[barriers[1] - 1].op is Ops.ACCUMULATE


@pytest.mark.parametrize("masked", [False, True])
def test_the_gpu_staged_form_with_rows_past_the_last_tile_matches_numpy_on_opencl(masked):
    """T=70: work-groups of 64 rows, the second with 58 rows past the end (they stage their share and reach every
    barrier, their own loads and stores gated off)."""
    check(program(masked), masked, "OPENCL", 1, 70, 6, 5, tol=2e-5)


def test_a_staging_of_more_than_255_stores_chains_its_barriers():
    """D=1024, E=16, 20 rows per work-group: a block of as many keys as the device's shared memory holds (32 KiB:
    7 keys of 1040 floats), k staged in ceil(7 * 1024 / 20) = 359 rounds of stores and v in 6: 365 stores, more
    than the 256 sources a BARRIER orders, so two chained BARRIERs follow the stores, then the block's last one."""
    from tgc.ir.uop import Ops as O
    item = _item(program(False), "OPENCL", {"B": 1, "T": 20, "D": 1024, "E": 16})
    block = min(BLOCK, get_device("OPENCL").caps.max_shared_bytes // (4 * (1024 + 16)))
    stores = -(-block * 1024 // 20) + -(-block * 16 // 20)
    assert stores > 256
    uops = lower_attention(item, get_device("OPENCL"), "attn").uops
    bars = [i for i, u in enumerate(uops) if u.op is O.BARRIER]
    sources, left, chained = [], stores, False
    while left > 0:
        sources.append(min(left, 255) + chained)
        left, chained = left - 255, True
    assert [len(uops[i].src) for i in bars] == sources + [1]
    assert all(uops[b].src[0] is uops[a] for a, b in zip(bars, bars[1:-1]))
    local_stores = [i for i, u in enumerate(uops) if u.op is O.STORE and u.src[0].op is O.DEFINE_LOCAL]
    assert len(local_stores) == stores and max(local_stores) < bars[-2]
