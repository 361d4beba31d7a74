"""BEAM's GPU actions for reductions (issue 26 item 3): GROUP and GROUPTOP (a reduction shared by the threads of a
work-group, combined by warp shuffles on CUDA and a shared-memory tree on OpenCL) by the power-of-two amounts
`lower_groups` combines, within the device's threads per work-group. Values against numpy on OPENCL (PoCL);
tests/test_gpu_async_copy.py runs GROUPTOP through the CUDA stand-in."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
import tgc.api as api
import tgc.codegen.search as search
from tgc.backends import get_device
from tgc.codegen.kernel import prepare_ast
from tgc.codegen.opt import Opt, OptError, OptKernel, OptOps
from tgc.codegen.pipeline import lower

ROWSUM = "x: f32[M, N]\nreturn x.sum(axis=1)"


def _item(src: str, dims: dict, device: str):
    return next(s for s in tgc.loads(src).schedule(dims, device=device) if hasattr(s, "ast"))


def _kernel(device: str, dims: dict, src: str = ROWSUM) -> OptKernel:
    dev = get_device(device)
    return OptKernel(prepare_ast(_item(src, dims, device).ast, dev), dev)


def _groups(k: OptKernel) -> set[tuple[str, int, int]]:
    return {(o.name, o.axis, o.amount) for o in search.actions(k) if o.op in (OptOps.GROUP, OptOps.GROUPTOP)}


def _opencl() -> None:
    ok, why = get_device("OPENCL").available
    if not ok:
        pytest.skip(why)


def test_beam_offers_group_and_grouptop_by_powers_of_two_on_gpus_only():
    want = {(op, 1, a) for op in ("GROUP", "GROUPTOP") for a in (16, 32, 64, 128, 256)}
    assert _groups(_kernel("CUDA", {"M": 64, "N": 4096})) == want
    assert _groups(_kernel("OPENCL", {"M": 64, "N": 4096})) == want
    # only amounts that divide the reduction: 96 = 32 * 3
    assert _groups(_kernel("CUDA", {"M": 64, "N": 96})) == {("GROUP", 1, 16), ("GROUP", 1, 32),
                                                             ("GROUPTOP", 1, 16), ("GROUPTOP", 1, 32)}
    assert _groups(_kernel("CPU", {"M": 64, "N": 4096})) == set()


def test_group_amounts_respect_the_work_group_limit_and_one_group_a_kernel():
    k = _kernel("OPENCL", {"M": 64, "N": 4096})  # PoCL: 256 threads a work-group
    k.apply(Opt("LOCAL", 0, 8))
    assert {a for _, _, a in _groups(k)} == {16, 32}  # 8 x 32 = 256
    for opt in search.actions(k):  # every GROUP offered applies (the limits are checked by apply as well)
        if opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
            k.copy().apply(opt)
    k.apply(Opt("GROUPTOP", 1, 32))
    assert _groups(k) == set()
    with pytest.raises(OptError, match="only one GROUP"):
        k.apply(Opt("GROUP", 1, 16))
    staged = _kernel("CUDA", {"M": 64, "N": 4096})
    staged.apply(Opt("STAGE", 1, 16))
    assert _groups(staged) == set()
    with pytest.raises(OptError, match="GPU-shaped"):
        _kernel("CPU", {"M": 64, "N": 4096}).apply(Opt("GROUPTOP", 1, 16))


def test_grouptop_gives_each_thread_a_contiguous_share_and_group_strides_by_threads():
    dev = get_device("OPENCL")
    it = _item(ROWSUM, {"M": 8, "N": 1536}, "OPENCL")
    top = lower(it.ast, dev, it.bufs, "k", opts=[Opt("GROUPTOP", 1, 16)]).src
    inner = lower(it.ast, dev, it.bufs, "k", opts=[Opt("GROUP", 1, 16)]).src
    assert "(lidx0 * 96)" in top and "(ridx1 * 16)" not in top  # thread g: elements 96 g .. 96 g + 95
    assert "(ridx1 * 16)" in inner and "(lidx0 * 96)" not in inner  # thread g: elements g, g + 16, ...


# a tree with UPCAST lanes, a tree beside a LOCAL digit, a group of no power of two (the serial combine)
GROUPTOP_CASES = [([("GROUPTOP", 1, 256), ("UPCAST", 0, 4)], "sum"), ([("LOCAL", 0, 4), ("GROUPTOP", 1, 16)], "max"),
                  ([("GROUPTOP", 1, 3)], "sum")]


@pytest.mark.parametrize("opts,op", GROUPTOP_CASES)
def test_grouptop_reductions_match_numpy_on_opencl(opts, op):
    _opencl()
    x = np.random.default_rng(len(opts)).standard_normal((8, 1536)).astype(np.float32)
    cur = [Opt(*o) for o in opts]
    orig = search.lookup
    search.lookup = api.lookup = lambda ast, device, width=0: cur
    try:
        got = tgc.loads(f"x: f32[M, N]\nreturn x.{op}(axis=1)").run("OPENCL", x=x)["out0"]
    finally:
        search.lookup = api.lookup = orig
    np.testing.assert_allclose(got, getattr(x.astype(np.float64), op)(axis=1), rtol=1e-5, atol=1e-4)


def test_beam_on_opencl_times_group_and_grouptop_candidates(monkeypatch):
    """A real search round on PoCL: the GROUP candidates compile, run and are timed like any others (a winner is
    checked against the reference as usual), and the kernel BEAM picks computes the numpy sum."""
    _opencl()
    dev = get_device("OPENCL")
    it = _item(ROWSUM, {"M": 256, "N": 32}, "OPENCL")  # 32 steps: the heuristic groups nothing
    timed: list[tuple[str, bool]] = []
    orig = search._time_candidate

    def spy(timer, c, best_s, result) -> bool:
        ok = orig(timer, c, best_s, result)
        timed.append((" ".join(str(o) for o in c.opts), ok))
        return ok

    monkeypatch.setattr(search, "_time_candidate", spy)
    every = search.actions  # the round cut to its GROUP candidates (PoCL compiles each for a second of a core)
    monkeypatch.setattr(search, "actions", lambda k: [o for o in every(k) if o.op in (OptOps.GROUP, OptOps.GROUPTOP)])
    r = search.beam_search(prepare_ast(it.ast, dev), dev, it.bufs, width=1, rounds=1, name="rowsum")
    grouped = {name: ok for name, ok in timed if "GROUP" in name}
    assert grouped == {"GROUP(1, 16)": True, "GROUP(1, 32)": True, "GROUPTOP(1, 16)": True,
                       "GROUPTOP(1, 32)": True}, timed
    assert r.failed == 0 and r.rejected == 0
    x = np.random.default_rng(5).standard_normal((256, 32)).astype(np.float32)
    for opts in (r.opts, [Opt("GROUPTOP", 1, 32)]):
        monkeypatch.setattr(search, "lookup", lambda ast, device, width=0, o=opts: o)
        monkeypatch.setattr(api, "lookup", lambda ast, device, width=0, o=opts: o)
        got = tgc.loads(ROWSUM).run("OPENCL", x=x)["out0"]
        np.testing.assert_allclose(got, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
