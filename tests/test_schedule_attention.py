"""The scheduler's fused attention kernel is an ordinary kernel AST (issue 20 item 4 (c), stage 1): a
REDUCE(ONLINE_SOFTMAX) over the keys that codegen reads back by rules over the AST (`spec_of`,
`is_fused_attention`), with no `meta["attention"]`; symbolic-size plans still lower the plain chain."""

from __future__ import annotations

import numpy as np
from test_attention_fused import program, reference

import tgc
from tgc.codegen.attention import is_fused_attention
from tgc.engine.attention import spec_of
from tgc.ir.uop import Ops, RangeKind

DECODE = """q: f32[B, H, 1, D]
k: f32[B, H, S, D]
v: f32[B, H, S, E]
return softmax(q @ k.transpose(-2, -1) * 0.5, axis=-1) @ v
"""


def _fused(p: tgc.Program, dims: dict):
    items = [it for it in p.schedule(dims) if it.ast.src]
    fused = [it for it in items if is_fused_attention(it.ast)]
    assert len(fused) == 1, [it.name for it in items]
    return fused[0]


def test_the_fused_item_ast_is_one_online_softmax_reduce_over_the_keys():
    item = _fused(program(masked=True), {"B": 2, "T": 5, "D": 4, "E": 3})
    assert "attention" not in item.meta and item.name.startswith("attn_")
    reds = [u for u in item.ast.toposort() if u.op is Ops.REDUCE and u.arg is Ops.ONLINE_SOFTMAX]
    assert len(reds) == 1
    (key,) = reds[0].src[1:]
    assert key.arg[1] is RangeKind.REDUCE and key.src[0].arg == 5
    sp = spec_of(item.ast)
    assert [r.src[0].arg for r in sp.loops] == [2, 5] and sp.row_loop
    assert (sp.tk, sp.dv) == (5, 3) and sp.rj is key
    assert sp.rdv not in {u for u in sp.x.toposort()}  # the scores do not vary by the output column


def test_one_query_row_is_no_row_loop():
    item = _fused(tgc.loads(DECODE), {"B": 2, "H": 3, "S": 6, "D": 4, "E": 5})
    sp = spec_of(item.ast)
    assert [r.src[0].arg for r in sp.loops] == [2, 3] and not sp.row_loop and (sp.tk, sp.dv) == (6, 5)


def test_an_ordinary_reduce_is_not_a_fused_attention():
    p = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nreturn (a @ b).exp().sum(axis=1)")
    items = [it for it in p.schedule({"M": 4, "K": 3, "N": 5}) if it.ast.src]
    assert items and not any(is_fused_attention(it.ast) or spec_of(it.ast) is not None for it in items)


def test_decode_runs_against_numpy():
    p = tgc.loads(DECODE)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 1, 4), (2, 3, 6, 4), (2, 3, 6, 5)))
    out = p.run("CPU", dims={"B": 2, "H": 3, "S": 6, "D": 4, "E": 5}, q=q, k=k, v=v)[p.output_names[0]]
    s = q.astype(np.float64) @ k.swapaxes(-1, -2) * 0.5
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (e / e.sum(-1, keepdims=True)) @ v, rtol=1e-5, atol=1e-6)


def test_a_symbolic_plan_lowers_the_plain_chain():
    p = program(masked=False)
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 9, 4), (1, 9, 4), (1, 9, 3)))
    out = p.run("CPU", symbolic=True, q=q, k=k, v=v)[p.output_names[0]]
    assert p.last_run == "symbolic"
    np.testing.assert_allclose(out, reference(q, k, v, False), rtol=1e-5, atol=1e-6)
