"""Unit tests at the level of UOps: the pattern matcher, the symbolic rules, the named passes of the one lowering
pipeline, the linearizer, the spec verifier of linear UOps, and the opts' names."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tgc
from tgc.backends import get_device
from tgc.codegen.opt import Opt, OptError, OptKernel, OptOps, split_threads
from tgc.codegen.pipeline import PASSES, lower, passes_text
from tgc.codegen.spec import SpecError, verify_spec
from tgc.dtype import dtypes
from tgc.ir.symbolic import simplify
from tgc.ir.uop import Ops, PatternMatcher, RangeKind, UOp, UPat, graph_rewrite, rebuild, substitute

I = dtypes.i32
IDX = dtypes.index


def rng(i: int, n: int, kind: RangeKind = RangeKind.LOOP, dtype=I) -> UOp:
    return UOp(Ops.RANGE, dtype, (UOp.const(dtype, n),), (i, kind))


def c(v: int, dtype=I) -> UOp:
    return UOp.const(dtype, v)


# ------------------------------------------------------------------------------------------- the pattern matcher


def test_upat_binds_names_and_tries_both_orders_of_a_commutative_op():
    x = rng(0, 8)
    bound: dict = {}
    assert UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("k"))).match(c(3) + x, bound)
    assert bound["a"] is x and bound["k"].arg == 3
    assert not UPat(Ops.SUB, src=(UPat.var("a"), UPat.cvar("k"))).match(c(3) - x, {})  # SUB is not commutative


def test_upat_same_name_must_bind_the_same_node():
    x, y = rng(0, 8), rng(1, 8)
    pat = UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("a")))
    assert pat.match(x + x, {})
    assert not pat.match(x + y, {})


def test_a_failed_order_of_a_commutative_op_leaves_no_binding_for_the_other():
    x = rng(0, 8)
    # (x * 2) + x: the first order binds a = x * 2 and then fails (x is no MUL); the second must start afresh
    pat = UPat(Ops.ADD, src=(UPat.var("a"), UPat(Ops.MUL, src=(UPat.var("a"), UPat.cvar("k")))))
    bound: dict = {}
    assert pat.match(x * c(2) + x, bound)
    assert bound["a"] is x and bound["k"].arg == 2
    assert not pat.match(x * c(2) + rng(1, 8), {})
    rule = PatternMatcher([(pat, lambda a, k: a * (k + c(1)))])  # a + a*k -> a*(k+1)
    assert graph_rewrite(x * c(2) + x, rule) is x * (c(2) + c(1))


def test_equal_nodes_are_one_object_and_a_dead_node_leaves_the_interning_table():
    import gc

    from tgc.ir import uop
    x = rng(7, 1234567)
    assert x + c(5) is rng(7, 1234567) + c(5) and {x + c(5), x + c(5)} == {x + c(5)}
    assert (x + c(5)) is not (x + c(6)) and x + c(5) != x + c(6)
    key = (Ops.DEFINE_VAR, I, (), ("a_name_no_other_test_uses", 0, 9))
    y = UOp(*key)
    assert uop._INTERNED[key]() is y
    del y
    gc.collect()
    assert key not in uop._INTERNED
    with pytest.raises(TypeError, match="hashable"):
        UOp(Ops.CONST, I, (), [1])


def test_upat_dtype_predicates_and_arg():
    f = UOp.const(dtypes.f32, 1.0)
    assert UPat(Ops.CONST, dtype="float").match(f, {})
    assert not UPat(Ops.CONST, dtype="int").match(f, {})
    assert UPat(Ops.CONST, arg=1.0).match(f, {}) and not UPat(Ops.CONST, arg=2.0).match(f, {})


def test_graph_rewrite_reaches_a_fixed_point_bottom_up():
    # x * 2 -> x + x, applied everywhere, including inside the result of an earlier rewrite
    pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("k"))),
                          lambda x, k: x + x if k.arg == 2 else None)])
    x = rng(0, 8)
    out = graph_rewrite((x * c(2)) * c(2), pm)
    assert out is (x + x) + (x + x)


def test_graph_rewrite_passes_ctx_and_declining_rules_leave_the_graph():
    seen = []
    pm = PatternMatcher([(UPat(Ops.RANGE, name="r"), lambda ctx, r: ctx.append(r.arg[0]))])
    x = rng(0, 8) + rng(1, 4)
    assert graph_rewrite(x, pm, seen) is x
    assert sorted(seen) == [0, 1]


def test_graph_rewrite_that_never_settles_is_an_error():
    pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k"))),
                          lambda x, k: x + c(k.arg + 1))])
    with pytest.raises(RuntimeError, match="did not converge"):
        graph_rewrite(rng(0, 8) + c(1), pm)


def test_rebuild_replaces_once_and_substitute_is_a_seeded_rebuild():
    x, y = rng(0, 8), rng(1, 4)
    memo: dict = {}
    # fn runs once per rebuilt node, not again on its result (x + 1 would become x + 2 if it did)
    bump = lambda u: u + c(1) if u.op is Ops.RANGE else u  # noqa: E731
    assert rebuild(x * c(3), memo, bump) is (x + c(1)) * c(3)
    assert memo[x] is x + c(1)
    assert substitute(x * y, {x: y}) is y * y


def test_the_rebuild_loop_is_written_once():
    """graph_rewrite, substitute and the scheduler's graph edits share `tgc.ir.uop.rebuild`: no other module
    rebuilds nodes on memoized new sources (`node.replace(src=tuple(memo[...] ...))`, or the same node made with
    `UOp(node.op, node.dtype, tuple(memo[...] ...), node.arg)` as `rebuild` does)."""
    import pathlib
    import re
    root = pathlib.Path(tgc.__file__).parent
    memo_srcs = r"tuple\(\w+\[\w+\] for \w+ in \w+\.src\)"
    loop = re.compile(rf"replace\(src={memo_srcs}\)|UOp\(\w+\.op, \w+\.dtype, {memo_srcs}, \w+\.arg\)")
    found = sorted(str(f.relative_to(root)) for f in root.rglob("*.py") for _ in loop.finditer(f.read_text()))
    assert found == ["ir/uop.py"]


def test_nothing_can_be_attached_to_a_hash_consed_uop():
    u = rng(0, 8)
    with pytest.raises(AttributeError):
        u.note = 1
    assert not hasattr(u, "__dict__")


# ------------------------------------------------------------------------------------------- symbolic rules


def test_constant_folding_of_integers_is_c_semantics():
    assert simplify(c(-7) // c(2)).arg == -3  # truncating
    assert simplify(c(-7) % c(2)).arg == -1
    assert simplify(c(2**31 - 1) + c(1)).arg == -(2**31)  # i32 wraps
    f = UOp(Ops.ADD, dtypes.f32, (UOp.const(dtypes.f32, 0.1), UOp.const(dtypes.f32, 0.2)))
    assert simplify(f) is f  # floats are left to the backend


def test_div_and_mod_fold_back_to_loop_variables():
    i, j = rng(0, 4), rng(1, 8)
    flat = i * c(8) + j
    assert simplify(flat // c(8)) is i
    assert simplify(flat % c(8)) is j
    assert simplify((flat // c(8)) * c(8) + flat % c(8)) is flat
    assert simplify(j // c(8)).arg == 0 and simplify(j % c(16)) is j


def test_nested_division_and_remainder_combine():
    x = rng(0, 1000)
    assert simplify((x // c(4)) // c(5)) is x // c(20)
    assert simplify((x % c(12)) % c(4)) is x % c(4)


def test_comparisons_decided_by_bounds_and_known_where():
    j = rng(0, 8)
    assert simplify(j < c(8)).arg is True
    assert simplify(j < c(0)).arg is False
    a, b = rng(1, 3), rng(2, 5)
    assert simplify((j < c(8)).where(a, b)) is a
    assert simplify((j < c(4)).where(a, a)) is a


def test_a_load_with_a_known_gate_drops_it_or_becomes_zero():
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.f32.as_ptr(), (), 0)
    j = rng(0, 8)
    assert simplify(UOp(Ops.LOAD, dtypes.f32, (buf, j, j < c(8)))) is UOp(Ops.LOAD, dtypes.f32, (buf, j))
    zero = simplify(UOp(Ops.LOAD, dtypes.f32, (buf, j + c(8), j < c(0))))
    assert zero.op is Ops.CONST and zero.arg == 0.0


def test_min_of_two_values_has_the_smaller_bound():
    """`(a < b).where(a, b)` is min(a, b): its upper bound is the smaller one (a CPU thread's last, short slice)."""
    core = UOp(Ops.DEFINE_VAR, IDX, (), ("core_id", 0, 2))
    left = c(1000, IDX) - core * c(334, IDX)
    end = (left < c(334, IDX)).where(left, c(334, IDX))
    assert end.vmax == 334 and end.vmin == 332
    assert UOp(Ops.RANGE, IDX, (end,), (0, RangeKind.LOOP)).vmax == 333


def test_split_threads_sets_no_field_on_a_shared_range():
    """The CPU thread split's loop gets its bound from its end's min(), not a field written into a hash-consed
    RANGE: a node held elsewhere (the same node, by hash-consing) keeps the bound it had."""
    r = UOp(Ops.RANGE, IDX, (c(1000, IDX),), (0, RangeKind.LOOP))
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.f32.as_ptr(), (), 0)
    ast = UOp(Ops.SINK, None, (UOp(Ops.STORE, None, (buf, r, UOp.const(dtypes.f32, 1.0))),))
    core = UOp(Ops.DEFINE_VAR, IDX, (), ("core_id", 0, 2))
    left = c(1000, IDX) - core * c(334, IDX)
    held = UOp(Ops.RANGE, IDX, (simplify((left < c(334, IDX)).where(left, c(334, IDX))),), (0, RangeKind.LOOP))
    before = held.bounds
    out, threads = split_threads(ast, 3)
    assert threads == 3
    inner = next(u for u in out.toposort() if u.op is Ops.RANGE)
    assert inner is held and held.bounds == before == (0, 333)


# ------------------------------------------------------------------------------------------- the pipeline


MATMUL = "a: f32[N, K]\nb: f32[K, M]\nreturn a @ b"


def _item(src: str, dims: dict, device: str = "CPU"):
    return tgc.loads(src).schedule(dims, device)[0]


def test_the_pipeline_is_a_list_of_named_passes_in_order():
    names = [p.name for p in PASSES]
    assert names == ["legalize_half", "tee_row_values", "decompose_transcendentals", "apply_opts",
                     "resolve_row_values", "lower_groups", "stage_tiles", "map_to_grid", "narrow_index",
                     "unroll_reduce", "vectorize", "upcast_stores", "widen_memory", "drop_unused_buffers"]
    assert {p.kind for p in PASSES} == {"rewrite", "function"}


def test_passes_text_shows_each_pass_that_ran_for_the_device():
    item = _item(MATMUL, {"N": 8, "K": 16, "M": 8})
    cpu = passes_text(item.ast, get_device("CPU"), item.bufs, opts=[Opt("UPCAST", 1, 4), Opt("UNROLL", 2, 4)])
    ran = [line.split("after ")[1] for line in cpu.splitlines() if line.startswith("--- ")]
    assert ran == ["legalize_half", "tee_row_values", "decompose_transcendentals", "apply_opts",
                   "resolve_row_values", "narrow_index", "unroll_reduce",
                   "vectorize", "upcast_stores", "widen_memory", "drop_unused_buffers", "linearize"]
    assert "UNROLL" in cpu.split("after narrow_index")[1].split("after unroll_reduce")[0]  # still there
    assert "UNROLL" not in cpu.split("after unroll_reduce")[1]  # gone after its pass
    gpu = passes_text(item.ast, get_device("CUDA"), item.bufs, opts=[])
    ran = [line.split("after ")[1] for line in gpu.splitlines() if line.startswith("--- ")]
    assert "map_to_grid" in ran and "lower_groups" in ran and "vectorize" not in ran
    assert "SPECIAL" in gpu.split("after map_to_grid")[1]


def test_debug_6_prints_the_passes(monkeypatch, capsys):
    monkeypatch.setenv("DEBUG", "6")
    item = _item("x: f32[N]\nreturn x * 2.0", {"N": 8})
    lower(item.ast, get_device("PYTHON"), item.bufs, "k", opts=[])
    err = capsys.readouterr().err
    assert "--- k: after legalize_half" in err and "--- k: after linearize" in err


def test_heuristic_beam_and_replay_lower_the_same_way():
    """A kernel lowered from its heuristic's opts replayed is the kernel the heuristic gives: one lowering."""
    dev = get_device("CPU")
    item = _item(MATMUL, {"N": 32, "K": 32, "M": 32})
    heuristic = lower(item.ast, dev, item.bufs, "k")
    replay = lower(item.ast, dev, item.bufs, "k", opts=heuristic.applied)
    assert heuristic.applied and replay.src == heuristic.src and replay.uops == heuristic.uops


def test_a_kernel_compiles_to_what_its_lowering_rendered():
    prog = tgc.loads(MATMUL)
    dims = {"N": 8, "K": 8, "M": 8}
    k = prog.compile(device="CPU", dims=dims)[0]
    item = prog.schedule(dims, "CPU")[0]
    assert lower(item.ast, get_device("CPU"), item.bufs, k.name).src == k.src


def test_row_fusion_is_decided_by_the_device_once():
    assert get_device("CPU").caps.fuse_rows and get_device("PYTHON").caps.fuse_rows
    assert not get_device("CUDA").caps.fuse_rows
    prog = tgc.loads("x: f32[N, D]\nreturn softmax(x, 1)")
    assert len(prog.schedule({"N": 4, "D": 8}, "CPU")) == 1  # the row's max and sum stay in the kernel
    assert len(prog.schedule({"N": 4, "D": 8}, "CUDA")) == 3  # realized: a GPU thread has no row order


def test_a_shared_reduction_is_realized_once():
    items = tgc.loads("x: f32[N, D]\ns = x.sum(1)\nreturn s, s * 2.0").schedule({"N": 4, "D": 8}, "CPU")
    assert [sum(u.op is Ops.REDUCE for u in it.ast.toposort()) for it in items] == [1, 0]


# ------------------------------------------------------------------------------------------- the linearizer


def _linear(src: str, dims: dict, opts=None, device: str = "PYTHON"):
    item = _item(src, dims, device)
    return lower(item.ast, get_device(device), item.bufs, "k", opts=opts).uops


def test_linearizer_opens_and_closes_loops_and_accumulates():
    uops = _linear("x: f32[N, D]\nreturn x.sum(1)", {"N": 4, "D": 8}, opts=[])
    ops = [u.op for u in uops]
    assert ops.count(Ops.RANGE) == 2 and ops.count(Ops.ENDRANGE) == 2
    acc = ops.index(Ops.DEFINE_ACC)
    inner = max(i for i, u in enumerate(uops) if u.op is Ops.RANGE)
    assert ops.index(Ops.RANGE) < acc < inner < ops.index(Ops.ACCUMULATE) < ops.index(Ops.READ_ACC) \
        < ops.index(Ops.STORE)
    ranges = [u for u in uops if u.op is Ops.RANGE]
    assert [u.src[0].arg for u in ranges] == [4, 8]


def test_linearizer_hoists_loop_invariant_values():
    """`x.sum(1) + y[i]`: the load of y[i] does not depend on the reduction loop, so it is not inside it."""
    uops = _linear("x: f32[N, D]\ny: f32[N]\nreturn x.sum(1) + y", {"N": 4, "D": 8}, opts=[])
    loads = [i for i, u in enumerate(uops) if u.op is Ops.LOAD]
    inner = max(i for i, u in enumerate(uops) if u.op is Ops.RANGE)
    end = next(i for i, u in enumerate(uops) if u.op is Ops.ENDRANGE and u.src[0] is uops[inner])
    y_load = next(i for i in loads if uops[i].src[0].arg == 2)
    x_load = next(i for i in loads if uops[i].src[0].arg == 1)
    assert inner < x_load < end and not inner < y_load < end


def test_reductions_of_an_upcast_tile_share_one_loop_nest():
    uops = _linear(MATMUL, {"N": 4, "K": 8, "M": 8}, opts=[Opt("UPCAST", 1, 4)])
    assert sum(u.op is Ops.DEFINE_ACC for u in uops) == 4
    reduce_loops = [u for u in uops if u.op is Ops.RANGE and u.src[0].op is Ops.CONST and u.src[0].arg == 8]
    assert len(reduce_loops) == 1  # four accumulators, one K loop


def test_only_the_pipeline_linearizes_and_renders():
    """One way from a kernel AST to source: nothing but `pipeline.lower` calls `linearize` or `render_kernel`."""
    import ast as pyast
    import pathlib
    root = pathlib.Path(tgc.__file__).parent
    callers = set()
    for f in root.rglob("*.py"):
        for node in pyast.walk(pyast.parse(f.read_text())):
            if isinstance(node, pyast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, pyast.Name) else fn.attr if isinstance(fn, pyast.Attribute) else ""
                if name in ("linearize", "render_kernel", "apply_opts", "upcast_stores"):
                    callers.add(str(f.relative_to(root)))
    assert callers == {"codegen/pipeline.py"}


def test_upcast_copies_the_store_and_unroll_the_value():
    src, dims = MATMUL, {"N": 4, "K": 8, "M": 4}
    plain = _linear(src, dims, opts=[])
    up = _linear(src, dims, opts=[Opt("UPCAST", 1, 4)])
    un = _linear(src, dims, opts=[Opt("UNROLL", 2, 4)])
    count = lambda uops, op: sum(u.op is op for u in uops)  # noqa: E731
    assert count(plain, Ops.STORE) == 1 and count(up, Ops.STORE) == 4
    assert count(un, Ops.STORE) == 1 and count(un, Ops.LOAD) == 4 * count(plain, Ops.LOAD)
    assert {u.arg[1] for u in up + un if u.op is Ops.RANGE} <= {RangeKind.LOOP, RangeKind.REDUCE}


# ------------------------------------------------------------------------------------------- the spec verifier


def _good():
    return _linear("x: f32[N, D]\nreturn x.sum(1)", {"N": 4, "D": 8}, opts=[])


def test_every_lowered_kernel_meets_the_spec():
    for dev in ("CPU", "PYTHON", "CUDA"):
        for src, dims in [(MATMUL, {"N": 8, "K": 16, "M": 8}), ("x: f16[N, D]\nreturn softmax(x, 1)",
                                                                {"N": 4, "D": 32})]:
            for item in tgc.loads(src).schedule(dims, dev):
                verify_spec("k", lower(item.ast, get_device(dev), item.bufs, "k").uops)


def test_spec_rejects_an_unclosed_loop():
    uops = _good()
    last_end = max(i for i, u in enumerate(uops) if u.op is Ops.ENDRANGE)
    with pytest.raises(SpecError, match="never closed"):
        verify_spec("k", uops[:last_end] + uops[last_end + 1:])


def test_spec_rejects_a_use_before_definition():
    uops = _good()
    store = next(i for i, u in enumerate(uops) if u.op is Ops.STORE)
    with pytest.raises(SpecError, match="not defined before"):
        verify_spec("k", [uops[store]] + uops[:store] + uops[store + 1:])


def test_spec_rejects_a_value_used_after_its_loop():
    uops = _good()
    acc_at = next(i for i, u in enumerate(uops) if u.op is Ops.ACCUMULATE)
    inside = uops[acc_at].src[1]  # the loaded value, computed inside the reduction loop
    read = next(i for i, u in enumerate(uops) if u.op is Ops.READ_ACC)
    bad = UOp(Ops.ADD, dtypes.f32, (uops[read], inside))
    with pytest.raises(SpecError, match="after the loop it was computed in closed"):
        verify_spec("k", uops[:read + 1] + [bad] + uops[read + 1:])


def test_spec_rejects_mismatched_types_and_bad_gates():
    uops = _good()
    read = next(i for i, u in enumerate(uops) if u.op is Ops.READ_ACC)
    bad = UOp(Ops.ADD, dtypes.f32, (uops[read], UOp.const(dtypes.i32, 1)))
    with pytest.raises(SpecError, match="sources of types"):
        verify_spec("k", uops[:read + 1] + [UOp.const(dtypes.i32, 1), bad] + uops[read + 1:])
    load_at = next(i for i, u in enumerate(uops) if u.op is Ops.LOAD)
    ld = uops[load_at]
    gated = UOp(Ops.LOAD, ld.dtype, (*ld.src[:2], ld.src[1]))  # an int index as a gate
    with pytest.raises(SpecError, match="a gate of type"):
        verify_spec("k", uops[:load_at] + [gated] + uops[load_at + 1:])


def test_spec_rejects_an_op_that_has_no_place_in_linear_uops():
    uops = _good()
    with pytest.raises(SpecError, match="does not belong"):
        verify_spec("k", [UOp(Ops.REDUCE, dtypes.f32, (UOp.const(dtypes.f32, 1.0),), Ops.ADD)] + uops)


def test_spec_runs_under_the_tests_switch(monkeypatch):
    from tgc.codegen import spec
    before = spec.STATS["kernels"]
    tgc.loads("x: f32[N]\nreturn x + 1.0").compile(device="PYTHON", dims={"N": 4})
    assert spec.STATS["kernels"] > before  # tests/conftest.py sets TGC_VERIFY_BOUNDS=1


# ------------------------------------------------------------------------------------------- opts are an enum


def test_opts_are_an_enum_with_the_stored_form_of_before():
    o = Opt("UPCAST", 0, 4)
    assert o.op is OptOps.UPCAST and o == Opt(OptOps.UPCAST, 0, 4)
    assert str(o) == "UPCAST(0, 4)" and json.dumps(o.to_json()) == '["UPCAST", 0, 4]'
    assert Opt.from_json(["UNROLL", 2, 8]) == Opt(OptOps.UNROLL, 2, 8)
    with pytest.raises(ValueError, match="unknown opt"):
        Opt.from_json(["BOGUS", 0, 2])
    k = OptKernel(_item(MATMUL, {"N": 8, "K": 8, "M": 8}).ast, get_device("CPU"))
    with pytest.raises(OptError, match="unknown opt BOGUS"):
        k.apply(Opt("BOGUS", 0, 2))


def test_a_stored_winner_naming_an_unknown_opt_is_a_miss(tmp_path, monkeypatch):
    from tgc import cache
    from tgc.codegen import search
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    dev = get_device("CPU")
    ast = _item(MATMUL, {"N": 8, "K": 8, "M": 8}).ast
    cache.put("beam", search.beam_key(ast, dev), json.dumps({"opts": [["WARP", 0, 2]], "width": 4}).encode())
    assert search.lookup(ast, dev) is None
    search.store(ast, dev, [Opt("UPCAST", 1, 4)], 1e-3, "k", 4)
    assert search.lookup(ast, dev) == [Opt(OptOps.UPCAST, 1, 4)]


def test_results_stay_right_through_the_pipeline():
    rng_ = np.random.default_rng(0)
    a, b = rng_.standard_normal((8, 12)).astype(np.float32), rng_.standard_normal((12, 16)).astype(np.float32)
    for dev in ("CPU", "PYTHON"):
        np.testing.assert_allclose(tgc.loads(MATMUL).run(device=dev, a=a, b=b)["out0"], a @ b, rtol=1e-4,
                                   atol=1e-4)


def test_unused_buffers_are_dropped_and_the_rest_renumbered_once():
    from tgc.codegen.kernel import drop_unused_buffers
    g = [UOp(Ops.DEFINE_GLOBAL, dtypes.f32.as_ptr(), (), i) for i in range(4)]
    r = rng(0, 4)
    val = UOp(Ops.LOAD, dtypes.f32, (g[2], r)) + UOp(Ops.LOAD, dtypes.f32, (g[3], r))
    ast = UOp(Ops.SINK, None, (UOp(Ops.STORE, None, (g[0], r, val)),))
    bufs = [UOp.const(dtypes.f32, float(i)) for i in range(4)]  # stand-ins for the tensor nodes
    out, kept = drop_unused_buffers(ast, bufs)
    assert kept == [bufs[0], bufs[2], bufs[3]]
    loads = sorted(u.src[0].arg for u in out.toposort() if u.op is Ops.LOAD)
    assert loads == [1, 2]  # 2 -> 1 and 3 -> 2, not 3 -> 2 -> 1


@pytest.mark.parametrize("device", ["CPU", "CUDA"])
def test_prepare_is_idempotent(device):
    """`prepare` remembers a prepared AST as its own result (BEAM hands it back to `lower`): that is only right
    if preparing it again would change nothing."""
    from tgc.codegen import pipeline
    dev = get_device(device)
    src = "x: f16[N, D]\ny: bf16[N, D]\nreturn softmax(x, 1), sin(y) * exp(x) + log(abs(y) + 1.0)"
    for item in tgc.loads(src).schedule({"N": 4, "D": 8}, device):
        once = pipeline.prepare(item.ast, dev)
        pipeline._PREPARED.clear()
        assert pipeline.prepare(once, dev) is once


def test_spec_rejects_untyped_values_and_a_lane_past_the_vector():
    uops = _good()
    store = next(i for i, u in enumerate(uops) if u.op is Ops.STORE)
    val = uops[store].src[2]
    with pytest.raises(SpecError, match="a value without a type"):
        verify_spec("k", uops[:store] + [UOp(Ops.NEG, None, (val,))] + uops[store:])
    vec = UOp(Ops.VECTORIZE, dtypes.f32.vec(2), (val, val))
    with pytest.raises(SpecError, match="lane 2 of a"):
        verify_spec("k", uops[:store] + [vec, UOp(Ops.GEP, dtypes.f32, (vec,), 2)] + uops[store:])
    verify_spec("k", uops[:store] + [vec, UOp(Ops.GEP, dtypes.f32, (vec,), 1)] + uops[store:])
