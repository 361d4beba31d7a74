"""The fused attention kernel's lowering cost (issue 14, item 3): `build_rows` writes out every head-dimension
term, and used to simplify each written-out element on its own (its index math walked and rewritten again for
every element). Now one simplify memo serves the whole kernel (`tgc.ir.uop.graph_rewrite` with a shared
`memo`, `rebuild` not walking what the memo holds) and threads get their chunk of the batch loop in the small
spec, before the kernel is written out. Checked exactly: the number of rule attempts of a D=128 lowering, the
memo's results against fresh ones, and the wide heads (D=128, D=96) against numpy, threaded and not."""

from __future__ import annotations

import numpy as np
import pytest
from test_attention_beam import attention_item, opts, run_with
from test_attention_fused import program, reference

from tgc.backends import get_device
from tgc.codegen import attention as A
from tgc.ir import uop
from tgc.ir.kernel import INDEX
from tgc.ir.symbolic import simplify, symbolic
from tgc.ir.uop import Ops, RangeKind, UOp, graph_rewrite, substitute

CPU = get_device("CPU")


def _count_rewrites(monkeypatch) -> list[int]:
    n = [0]
    real = uop.PatternMatcher.rewrite

    def spy(self, u, ctx=None):
        n[0] += 1
        return real(self, u, ctx)

    monkeypatch.setattr(uop.PatternMatcher, "rewrite", spy)
    return n


@pytest.mark.parametrize("masked", [False, True])
def test_a_wide_head_lowers_with_each_value_simplified_once(masked, monkeypatch):
    """D=128, 16 rows x 16 keys, 2 threads: before, each of the ~8,000 written-out elements (terms, v loads,
    per-lane stores) was simplified from scratch and then the whole kernel again for the thread split: 323,581
    (331,143 masked) rule attempts. With one memo it is ~105,000 (~108,000): the bound, 160,000, is about half
    the old count, so per-element re-simplification (or a whole-kernel pass) coming back fails it."""
    item = attention_item(program(masked), {"B": 2, "T": 20, "D": 128, "E": 128})
    n = _count_rewrites(monkeypatch)
    low = A.lower_attention(item, CPU, "attn", opts(16, 16, 2))
    assert n[0] < 160_000, n[0]
    assert low.launch["global_size"] == (2, 1, 1)
    assert "core_id" in low.src


def test_a_shared_memo_gives_the_same_results_and_skips_what_it_holds(monkeypatch):
    r = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, 16),), (0, RangeKind.LOOP))
    a = (r * UOp.const(INDEX, 4) + UOp.const(INDEX, 0)) // UOp.const(INDEX, 4)  # folds to r
    exprs = [(a + UOp.const(INDEX, i) * UOp.const(INDEX, 1)) % UOp.const(INDEX, 64) for i in range(6)]
    fresh = [simplify(e) for e in exprs]
    memo: dict = {}
    shared = [graph_rewrite(e, symbolic, memo=memo) for e in exprs]
    assert shared == fresh
    assert fresh[0] is r  # (r*4)//4 + 0 with r < 16: r
    n = _count_rewrites(monkeypatch)
    graph_rewrite(exprs[0] + UOp.const(INDEX, 0), symbolic, memo=memo)
    assert n[0] <= 3  # only the new ADD (and what it folds to): the rest is in the memo, not walked again
    # substitute (a rebuild seeded with the mapping) still replaces below the seeded nodes' users
    assert simplify(substitute(exprs[1], {r: UOp.const(INDEX, 3)})) is UOp.const(INDEX, 4)


def test_the_thread_split_is_made_on_the_spec(monkeypatch):
    """Rows path, 2 threads, a batch loop: the split happens before `build_rows` (no whole-kernel pass)."""
    called = []
    monkeypatch.setattr(A, "split_threads", lambda *a: called.append(1) or (a[0], 1))
    item = attention_item(program(True), {"B": 3, "T": 40, "D": 8, "E": 8})
    low = A.lower_attention(item, CPU, "attn", opts(16, 16, 2))
    assert not called and low.launch["global_size"] == (2, 1, 1)
    A.lower_attention(item, CPU, "attn", opts(16, 16, 2), reference=True)  # the per-row form: split after
    assert called


@pytest.mark.parametrize(("d", "masked"), [(128, True), (96, False)])
def test_wide_heads_match_numpy(d, masked):
    """One kernel each (a written-out D=128 kernel takes LLVM ~10-20 s): 16 rows x 16 keys, 2 threads split on
    the spec, a ragged last block and a partial row tile."""
    p = program(masked)
    dims = {"B": 3, "T": 21, "D": d, "E": d}
    (kern,), out, (q, k, v) = run_with(p, dims, opts(16, 16, 2))
    assert kern.opts == opts(16, 16, 2)
    np.testing.assert_allclose(out, reference(q, k, v, masked), rtol=3e-5, atol=3e-5, err_msg=f"D={d}")
