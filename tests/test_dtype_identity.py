"""`DType`'s cached hash and its derived types (`vec`, `scalar`, `as_ptr` made once each): equal to, and hashing
as, a DType built fresh from the same fields (the dataclass's own hash: of the fields' tuple), so dict and set
lookups, UOp hash-consing and ordering behave as before; never one of `dtypes`' own members."""

from __future__ import annotations

import dataclasses

from tgc.dtype import DType, dtypes
from tgc.ir.uop import Ops, UOp

NAMED = [v for v in vars(dtypes).values() if isinstance(v, DType)]


def _fresh(d: DType) -> DType:
    return DType(d.priority, d.itemsize, d.name, d.fmt, d.count, d.ptr)


def test_hash_is_the_fields_tuple_hash_and_agrees_with_equality():
    assert len(NAMED) > 10
    for d in NAMED:
        for t in (d, d.vec(4), d.as_ptr(), d.vec(3).as_ptr(), d.vec(8).scalar()):
            fields = (t.priority, t.itemsize, t.name, t.fmt, t.count, t.ptr)
            assert hash(t) == hash(fields)
            assert _fresh(t) == t and hash(_fresh(t)) == hash(t)
    # different fields: unequal (the hash of each its own tuple's)
    assert dtypes.f32.vec(4) != dtypes.f32.vec(8) and dtypes.f32.as_ptr() != dtypes.f32
    assert {dtypes.f32.vec(4): 1}[_fresh(dtypes.f32.vec(4))] == 1
    # dataclasses.replace builds through __init__: its hash is its own fields'
    r = dataclasses.replace(dtypes.i32, count=2)
    assert r == dtypes.i32.vec(2) and hash(r) == hash(dtypes.i32.vec(2))


def test_derived_types_are_made_once_and_never_a_named_member():
    a, b = dtypes.f32.vec(4), dtypes.f32.vec(4)
    assert a is b  # made once
    assert dtypes.f32.vec(4).scalar() == dtypes.f32
    for d in NAMED:
        # (identity tests against a named member, `u.dtype is INDEX`, see a derived type as a fresh one)
        assert all(d.scalar() is not n and d.vec(1) is not n and d.as_ptr() is not n for n in NAMED)
    # a UOp made with a fresh DType and one with the derived type are the same node
    x = UOp(Ops.CONST, _fresh(dtypes.f32.vec(2)), (), 1.5)
    assert UOp(Ops.CONST, dtypes.f32.vec(2), (), 1.5) is x
    assert sorted([dtypes.f32.vec(2), dtypes.f32, dtypes.i8]) == [dtypes.i8, dtypes.f32, dtypes.f32.vec(2)]
