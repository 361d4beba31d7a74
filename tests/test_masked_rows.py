"""Rows gated lane by lane as one masked vector load or store (tgc/codegen/expand.py `_Vectorizer`, `opt.pad_loop`,
the LLVM renderer's `llvm.masked.load`/`store`): a padded image's copy (a convolution's zero border, its row padded
to whole vectors by PADTO) reads each row's interior with one masked load per vector and writes it with one masked
store, not a branch per lane. Results against numpy; the bounds verifier checks every masked lane on its own and
is shown able to fail."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.codegen import verify
from tgc.codegen.verify import BoundsError, verify_kernel
from tgc.dtype import dtypes
from tgc.ir.uop import Ops, UOp

PAD = "x: f32[{c}, {h}, {w}]\nreturn pad(x, ((0, 0), ({p}, {p}), ({p}, {p})))"


@pytest.fixture(autouse=True)
def _verify_on(monkeypatch):
    monkeypatch.setenv("TGC_VERIFY_BOUNDS", "1")


def _masked_loads(k) -> list[UOp]:
    return [u for u in k.uops if u.op is Ops.LOAD and len(u.src) == 3 and u.src[2].dtype.count > 1]


@pytest.mark.parametrize("c,h,w,p", [(8, 56, 56, 1), (4, 28, 28, 1), (6, 14, 14, 1), (2, 7, 7, 1), (3, 30, 30, 3),
                                     (5, 13, 13, 1), (2, 9, 50, 2)])
def test_a_padded_copy_against_numpy(c, h, w, p):
    x = np.random.default_rng(c * h + w).standard_normal((c, h, w)).astype(np.float32)
    src = PAD.format(c=c, h=h, w=w, p=p)
    before = dict(verify.STATS)
    got = tgc.loads(src).run(device="CPU", x=x)["out0"]
    np.testing.assert_array_equal(got, np.pad(x, ((0, 0), (p, p), (p, p))))
    assert verify.STATS["unverified"] == before.get("unverified", 0)  # every masked lane was enumerated


@pytest.mark.parametrize("dtype,np_dtype", [("bool", np.bool_), ("f16", np.float16), ("i32", np.int32),
                                             ("u8", np.uint8)])
def test_masked_rows_of_other_dtypes_against_numpy(dtype, np_dtype):
    """Booleans are stored as bytes (the masked store widens the i1 lanes, as a plain store does)."""
    x = (np.random.default_rng(2).standard_normal((8, 56, 56)) * 5).astype(np_dtype)
    src = f"x: {dtype}[8, 56, 56]\nreturn pad(x, ((0, 0), (1, 1), (1, 1)))"
    k = tgc.loads(src).compile(device="CPU")[-1]
    assert _masked_loads(k)
    got = tgc.loads(src).run(device="CPU", x=x)["out0"]
    np.testing.assert_array_equal(got, np.pad(x, ((0, 0), (1, 1), (1, 1))))


def test_the_row_is_masked_vectors_not_a_branch_per_lane():
    """58 columns padded to 64 (PADTO, 2 vectors of 16): one masked load and one masked store per vector, the
    loads' gates per lane; LLVM IR without the per-lane load blocks."""
    k = tgc.loads(PAD.format(c=64, h=56, w=56, p=1)).compile(device="CPU")[-1]
    assert any(o.op.name == "PADTO" for o in k.opts)
    loads = _masked_loads(k)
    assert len(loads) == 2 and all(u.dtype.count == 16 for u in loads)
    stores = [u for u in k.uops if u.op is Ops.STORE]
    assert len(stores) == 2 and all(len(s.src) == 4 and s.src[3].dtype == dtypes.bool.vec(16) for s in stores)
    assert k.src.count("@llvm.masked.load.v16f32") == 3 and k.src.count("@llvm.masked.store.v16f32") == 3
    assert "br i1" not in k.src.split("loop2_body:")[1].split("loop2_exit:")[0]  # no branch in the row's body


def test_an_out_of_bounds_masked_lane_is_caught():
    """The verifier checks lane j at index + j under gate j: a gate that lets the border's lanes through (the
    first column reads index -1) is an error, the kernel as compiled is not."""
    k = tgc.loads(PAD.format(c=2, h=5, w=5, p=1)).compile(device="CPU")[-1]
    launch = {"global_size": k.global_size}
    verify_kernel(k.name, k.uops, k.bufs, launch)
    assert _masked_loads(k)
    out, memo = [], {}
    for u in k.uops:
        new = u.replace(src=tuple(memo.get(s, s) for s in u.src))
        if new.op is Ops.LOAD and len(new.src) == 3 and new.src[2].dtype.count > 1:
            on = UOp.const(dtypes.bool, True)
            every = UOp(Ops.VECTORIZE, new.src[2].dtype, (on,) * new.src[2].dtype.count)
            out += [on, every]
            new = new.replace(src=(*new.src[:2], every))
        memo[u] = new
        out.append(new)
    with pytest.raises(BoundsError, match=r"LOAD .* lane \d+ of buffer 1 .* at index -?\d+, outside \[0, 50\)"):
        verify_kernel(k.name, out, k.bufs, launch)
