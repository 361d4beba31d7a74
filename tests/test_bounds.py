"""No out-of-bounds access: gates that fold, the padded examples of issue 9 on CPU and PYTHON against numpy,
and the bounds verifier (tgc/codegen/verify.py) that the whole suite runs under, shown able to fail."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lang_properties import random_program

import tgc
from tgc.codegen import verify
from tgc.codegen.verify import BoundsError, verify_bounds, verify_kernel
from tgc.dtype import dtypes
from tgc.ir.symbolic import simplify
from tgc.ir.uop import Ops, UOp

HOST_DEVICES = ["CPU", "PYTHON"]


@pytest.fixture(autouse=True)
def _verify_on(monkeypatch):
    monkeypatch.setenv("TGC_VERIFY_BOUNDS", "1")


# --- the examples of issue 9


@pytest.mark.parametrize("device", HOST_DEVICES)
def test_a_slice_of_only_padding_is_the_fill_value(device):
    v4 = np.array([1.5, -2.0, 3.25, 4.0], np.float32)
    out = tgc.loads("v4: f32[4]\nreturn pad(v4, ((0, 3),), value=3.456)[4:6]").run(device=device, v4=v4)["out0"]
    np.testing.assert_array_equal(out, np.pad(v4, ((0, 3),), constant_values=np.float32(3.456))[4:6])


@pytest.mark.parametrize("device", HOST_DEVICES)
def test_a_column_of_only_padding_is_the_fill_value(device):
    m = np.arange(16, dtype=np.float32).reshape(4, 4) - 7.5
    out = tgc.loads("m: f32[4, 4]\nreturn pad(m, ((1, 2), (3, 4)), value=3.456)[:, 1]").run(device=device, m=m)
    np.testing.assert_array_equal(out["out0"], np.pad(m, ((1, 2), (3, 4)), constant_values=np.float32(3.456))[:, 1])


@pytest.mark.parametrize("device", HOST_DEVICES)
def test_padded_matmul(device):
    rng = np.random.default_rng(9)
    c, d = (rng.uniform(-2, 2, (9, 9)).astype(np.float32) for _ in range(2))
    src = "c: f32[9, 9]\nd: f32[9, 9]\nreturn pad(c, ((0, 7), (0, 7))) @ pad(d, ((0, 7), (0, 7)))"
    out = tgc.loads(src).run(device=device, c=c, d=d)["out0"]
    want = np.pad(c.astype(np.float64), ((0, 7), (0, 7))) @ np.pad(d.astype(np.float64), ((0, 7), (0, 7)))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", HOST_DEVICES)
def test_padding_around_padding_and_slices_of_it(device):
    x = np.arange(12, dtype=np.int32).reshape(3, 4) - 5
    src = "x: i32[3, 4]\nreturn pad(pad(x, ((1, 1), (0, 2)), value=7), ((2, 0), (1, 1)), value=-3)[:3, 4:]"
    out = tgc.loads(src).run(device=device, x=x)["out0"]
    want = np.pad(np.pad(x, ((1, 1), (0, 2)), constant_values=7), ((2, 0), (1, 1)), constant_values=-3)[:3, 4:]
    np.testing.assert_array_equal(out, want)


def test_no_kernel_loads_what_only_padding_covers():
    """The fix is in the lowering, not in a backend: the kernel of a padding-only slice has no LOAD at all."""
    (k,) = tgc.loads("v4: f32[4]\nreturn pad(v4, ((0, 3),), value=3.456)[4:6]").compile(device="CPU")
    assert not [u for u in k.uops if u.op is Ops.LOAD]


def test_a_load_whose_gate_folds_becomes_its_else_value_or_loses_the_gate():
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.f32.as_ptr(), (), 1)
    idx = UOp.const(dtypes.i32, 4)
    dead = UOp(Ops.LOAD, dtypes.f32, (buf, idx, UOp.const(dtypes.bool, False)))
    live = UOp(Ops.LOAD, dtypes.f32, (buf, idx, UOp.const(dtypes.bool, True)))
    assert simplify(dead) is UOp.const(dtypes.f32, 0.0)
    assert simplify(live) is UOp(Ops.LOAD, dtypes.f32, (buf, idx))
    vec = UOp(Ops.LOAD, dtypes.f32.vec(4), (buf, idx, UOp.const(dtypes.bool, False)))
    assert simplify(vec) is UOp(Ops.VECTORIZE, dtypes.f32.vec(4), (UOp.const(dtypes.f32, 0.0),) * 4)
    # a shared-memory load's third source is its barrier, not a gate: untouched
    barrier = UOp(Ops.BARRIER, None, ())
    shared = UOp(Ops.LOAD, dtypes.f32, (buf, idx, barrier))
    assert simplify(shared) is shared


# --- the verifier


def _kernel(src: str, device: str = "CPU", dims: dict | None = None, index: int = 0):
    return tgc.loads(src).compile(device=device, dims=dims)[index]


def _rebuild(uops: list[UOp], fn) -> list[UOp]:
    """The linear list with `fn(uop)` applied in order (sources follow the replacements); `fn` returns None
    (keep it), a replacement, or a list of uops ending with the replacement (the new values it needs)."""
    out, memo = [], {}
    for u in uops:
        new = u.replace(src=tuple(memo.get(s, s) for s in u.src))
        got = fn(new) or new
        got = got if isinstance(got, list) else [got]
        memo[u] = got[-1]
        out.extend(got)
    return out


def test_a_removed_gate_is_caught():
    k = _kernel("v: f32[N]\nreturn pad(v, ((1, 2),), value=1.5) * 2", dims={"N": 10})
    assert any(len(u.src) == 3 for u in k.uops if u.op is Ops.LOAD)
    verify_kernel(k.name, k.uops, k.bufs, {"global_size": k.global_size})  # as compiled: fine
    bad = _rebuild(k.uops, lambda u: u.replace(src=u.src[:2]) if u.op is Ops.LOAD else None)
    with pytest.raises(BoundsError, match=r"LOAD .* of buffer 1 \(v: f32\[10\]\) at index (-1|10), outside \[0, 10\)"):
        verify_kernel(k.name, bad, k.bufs, {"global_size": k.global_size})


def _shift_index(kind: Ops, by: int):
    def fn(u: UOp):
        if u.op is kind and u.src[0].op is Ops.DEFINE_GLOBAL:
            c = UOp.const(dtypes.i32, by)
            idx = u.src[1] + c
            return [c, idx, u.replace(src=(u.src[0], idx, *u.src[2:]))]
        return None
    return fn


@pytest.mark.parametrize("device", ["CPU", "PYTHON", "CUDA", "METAL"])
def test_an_index_one_past_the_end_is_caught(device):
    """Every kernel shape: CPU vectors and upcasts, the PYTHON device's scalar code, GPU grids (rendered only)."""
    k = _kernel("a: f32[16, 24]\nb: f32[24, 8]\nreturn (a @ b).relu()", device=device)
    launch = {"global_size": k.global_size, "local_size": k.local_size}
    verify_kernel(k.name, k.uops, k.bufs, launch)
    with pytest.raises(BoundsError, match=rf"kernel {k.name}: LOAD .* of buffer \d \([ab]: f32\[.*\]\) at ind"):
        verify_kernel(k.name, _rebuild(k.uops, _shift_index(Ops.LOAD, 1)), k.bufs, launch)
    with pytest.raises(BoundsError, match=r"STORE .* of buffer 0 \(output: f32\[16, 8\]\) at ind.*outside \[0, 128\)"):
        verify_kernel(k.name, _rebuild(k.uops, _shift_index(Ops.STORE, -1)), k.bufs, launch)


def test_threaded_kernels_check_every_core(monkeypatch):
    """A kernel split across threads: each core's loop ends where its chunk does (a range whose end depends on
    core_id, so the last core runs a shorter loop); every chunk as long as the first runs past the end."""
    monkeypatch.setenv("TGC_THREADS", "3")
    k = _kernel("x: f32[N]\nreturn x * 2", device="PYTHON", dims={"N": 100_000})
    assert k.global_size[0] == 3 and any(u.op is Ops.DEFINE_VAR for u in k.uops)
    for cores in (1, 3, 5):  # extra cores find their loops empty
        verify_kernel(k.name, k.uops, k.bufs, {"global_size": (cores, 1, 1)})
    chunk = UOp.const(dtypes.i32, 33334)
    same_chunks = _rebuild(k.uops, lambda u: [chunk, u.replace(src=(chunk,))] if u.op is Ops.RANGE else None)
    with pytest.raises(BoundsError, match=r"LOAD .* at index 100000, outside \[0, 100000\) \(at core_id=2, r0=33332"):
        verify_kernel(k.name, same_chunks, k.bufs, {"global_size": k.global_size})


def test_big_kernels_fall_back_to_symbolic_bounds():
    k = _kernel("x: f32[64, 64]\nreturn x.T + 1")
    before = dict(verify.STATS)
    verify_bounds(k.name, k.uops, [4096, 4096], points=16)
    assert verify.STATS["by_bounds"] > before["by_bounds"] and verify.STATS["enumerated"] == before["enumerated"]
    # an ungated index the bounds put wholly outside is still an error (the first LOAD of the transposing
    # copy's 16 x 8 tile: its own lane's indices, from 4096 up)
    with pytest.raises(BoundsError, match=r"at indices in \[4096, \d+\], outside \[0, 4096\)"):
        verify_bounds(k.name, _rebuild(k.uops, _shift_index(Ops.LOAD, 4096)), [4096, 4096], points=16)
    # a gated one the bounds cannot decide is enumerated again in chunks (up to 16 * points iterations) ...
    k = _kernel("x: f32[30, 30]\nreturn pad(x, ((1, 1), (1, 1)))")
    before = dict(verify.STATS)
    verify_bounds(k.name, k.uops, [32 * 32, 900], points=100)
    assert verify.STATS["enumerated"] > before["enumerated"] and verify.STATS["unverified"] == before["unverified"]
    no_gates = _rebuild(k.uops, lambda u: u.replace(src=u.src[:2]) if u.op is Ops.LOAD else None)
    with pytest.raises(BoundsError, match=r"LOAD .* of buffer 1 at index -31, outside \[0, 900\) \(at r0=0, r1=0\)"):
        verify_bounds(k.name, no_gates, [32 * 32, 900], points=100)
    k = _kernel("x: f32[30, 30]\nreturn pad(x, ((0, 2), (0, 0)))")  # only the last rows are padding
    no_gates = _rebuild(k.uops, lambda u: u.replace(src=u.src[:2]) if u.op is Ops.LOAD else None)
    # (one value, or the first lanes of a vector where the rows' digits fold back into a flat index)
    with pytest.raises(BoundsError, match=r"at ind\w+ 900(\.\.\d+ \(\d+ lanes\))?, outside \[0, 900\) \(at r0=30"):
        verify_bounds(k.name, no_gates, [32 * 30, 900], points=100)
    # ... and in bigger kernels it is counted as unverified, never passed silently
    before = verify.STATS["unverified"]
    verify_bounds(k.name, k.uops, [32 * 30, 900], points=50)  # 960 iterations > 16 * 50
    assert verify.STATS["unverified"] > before


def test_builds_are_verified_only_when_asked(monkeypatch):
    calls = []
    monkeypatch.setattr(verify, "verify_kernel", lambda *a, **kw: calls.append(a[0]))
    src = "x: f32[5]\nreturn x + 1.25"
    monkeypatch.setenv("TGC_VERIFY_BOUNDS", "0")
    tgc.loads(src).compile(device="PYTHON")
    assert calls == []
    monkeypatch.setenv("TGC_VERIFY_BOUNDS", "1")
    tgc.loads(src).compile(device="PYTHON")
    assert len(calls) == 1


def test_a_bad_verify_setting_is_a_user_error(monkeypatch):
    monkeypatch.setenv("TGC_VERIFY_BOUNDS", "yes")
    with pytest.raises(tgc.TgcError, match="TGC_VERIFY_BOUNDS must be 0 or 1, got 'yes'") as e:
        tgc.loads("x: f32[5]\nreturn x + 1").compile(device="PYTHON")
    assert e.value.kind == "user"


def test_a_bad_points_setting_is_a_user_error(monkeypatch):
    monkeypatch.setenv("TGC_VERIFY_BOUNDS_POINTS", "lots")
    with pytest.raises(tgc.TgcError, match="TGC_VERIFY_BOUNDS_POINTS") as e:
        tgc.loads("x: f32[5]\nreturn x + 1").compile(device="PYTHON")
    assert e.value.kind == "user"


# --- random programs under random optimizations (what BEAM may pick), verified for CPU, PYTHON and GPU kernels


@settings(max_examples=40, deadline=None, database=None)
@given(prog=random_program(), device=st.sampled_from(["CPU", "PYTHON", "CUDA"]), data=st.data())
def test_random_programs_under_random_opts_stay_in_bounds(prog, device, data):
    from tgc.backends import get_device
    from tgc.codegen.kernel import prepare_ast
    from tgc.codegen.opt import Opt, OptError, OptKernel
    from tgc.codegen.pipeline import lower
    from tgc.codegen.search import actions
    from tgc.engine.schedule import create_schedule

    shape, lines, _ = prog
    last = f"t{len(lines) - 1}" if lines else "x + 0"
    src = "\n".join([f"x: f32[{', '.join(map(str, shape))}]", *lines, f"return {last}"])
    dev = get_device(device)
    gpu = dev.launch_style == "gpu"
    program = tgc.loads(src)
    outs, _ = program._trace(program.resolve_dims({}))
    # as Program.compile schedules for this device
    for item in create_schedule(outs, dev.caps):
        if not item.ast.src:
            continue
        k = OptKernel(prepare_ast(item.ast, dev), dev)
        for _ in range(data.draw(st.integers(0, 4))):
            choices = actions(k) + ([Opt("GROUP", len(k.loops()) + j, a) for j, r in enumerate(k.reduces())
                                     for a in (2, 4, 8) if r.src[0].arg % a == 0] if gpu else [])
            if not choices:
                break
            try:
                k.apply(data.draw(st.sampled_from(choices)))
            except OptError:
                pass
        low = lower(item.ast, dev, item.bufs, item.name, opts=k.applied)  # as BEAM lowers its candidates
        verify_kernel(item.name, low.uops, low.bufs, low.launch)


def test_a_kernel_without_loops_is_checked_too():
    k = _kernel("x: f32[3]\nreturn x[2] + 1")
    assert not [u for u in k.uops if u.op is Ops.RANGE]
    verify_kernel(k.name, k.uops, k.bufs, {})
    with pytest.raises(BoundsError, match=r"LOAD .* of buffer 1 \(x: f32\[3\]\) at index 3, outside \[0, 3\)$"):
        verify_kernel(k.name, _rebuild(k.uops, _shift_index(Ops.LOAD, 1)), k.bufs, {})


@pytest.mark.parametrize("shift", [2**31 - 1, -2**31])
def test_an_i32_index_that_wraps_is_caught_in_any_buffer(shift):
    """The address `index + shift` in i32 wraps negative (or stays negative): out of bounds even where the buffer
    is longer than i32 reaches (sizes as given, no allocation), though the unwrapped sum would fit it."""
    k = _kernel("x: f32[3]\nreturn x[2] + 1")
    bad = _rebuild(k.uops, _shift_index(Ops.LOAD, shift))
    assert any(u.op is Ops.ADD and u.dtype == dtypes.i32 for u in bad)
    with pytest.raises(BoundsError, match=r"LOAD .* at index -\d+, outside \[0, 8589934592\)$"):
        verify_bounds(k.name, bad, [3, 2**33], (1, 1, 1), None, ())
    verify_bounds(k.name, _rebuild(k.uops, _shift_index(Ops.LOAD, -2)), [3, 2**33], (1, 1, 1), None, ())
