"""The server reads a request text of flat calls with integer, plain-string, boolean and integer-tuple arguments
without `ast` (`protocol._quick_requests`): it must read every text exactly as `ast` does, and leave every other
text (and every text `ast` refuses) to the `ast` path and its messages."""

from __future__ import annotations

import random

import pytest

from tgc.backends.remote import protocol as P

HASH = "ab" * 32


def _requests(rng: random.Random) -> list[P.Request]:
    n = lambda: rng.choice([0, 1, 7, 4096, (1 << 40) + 3])  # noqa: E731
    ints = lambda: tuple(n() for _ in range(rng.randint(0, 4)))  # noqa: E731
    grid = lambda: tuple(rng.choice([1, 7, 4096]) for _ in range(rng.randint(1, 3)))  # noqa: E731
    make = [
        lambda: P.BufferAlloc(buf=n(), size=n()), lambda: P.BufferFree(buf=n()), lambda: P.CopyOut(buf=n()),
        lambda: P.BufferOffset(buf=n(), size=n(), offset=n(), sub=n()), lambda: P.CopyIn(buf=n(), datahash=HASH),
        lambda: P.ReadRange(buf=n(), offset=n(), size=n()), lambda: P.Synchronize(), lambda: P.GetProperties(),
        lambda: P.ProgramAlloc(prog=n(), name=rng.choice(["E_4_8", "r_16_32n1", "k.0:x-y"]), datahash=HASH),
        lambda: P.ProgramExec(prog=n(), bufs=ints(), global_size=grid(), local_size=rng.choice([None, grid()]),
                              vals=ints(), wait=rng.random() < 0.5),
        lambda: P.GraphExec(graph=n(), wait=rng.random() < 0.5), lambda: P.GraphFree(graph=n()),
        lambda: P.EndSession(),
    ]
    return [rng.choice(make)() for _ in range(rng.randint(0, 6))]


def test_texts_of_the_quick_form_read_exactly_as_ast_reads_them():
    rng = random.Random(5)
    for _ in range(300):
        text = P.to_text(_requests(rng))
        quick = P._quick_requests(text, P.REQUESTS)
        assert quick is not None, text  # (every such text takes the quick path)
        assert quick == P.parse_text(text) == P.parse_requests(text), text
        assert [type(r) for r in quick] == [type(r) for r in P.parse_text(text)]


@pytest.mark.parametrize("text", [
    "[CopyOut(buf=01)]",  # a leading zero: ast refuses it
    "[CopyOut(buf=99999999999999999999)]",  # past 64 bits
    "[Nope(buf=1)]",  # not a request
    "[GraphKernel(prog=1, bufs=(1, ))]",  # a request class's part, not a request
    "[CopyOut(buf='1')]",  # a string where an integer goes
    "[CopyIn(buf=1, datahash='xyz')]",  # not a blob id
    "[BufferAlloc(buf=1)]",  # a missing field
    "[CopyOut(buf=1, size=3)]",  # a field it does not have
    "[ProgramExec(prog=1, bufs=(1, 2, ), global_size=())]",  # an empty grid
])
def test_texts_ast_refuses_are_refused_with_the_ast_paths_message(text):
    with pytest.raises(P.ProtocolError) as slow:
        _slow_requests(text)
    with pytest.raises(P.ProtocolError) as quick:
        P.parse_requests(text)
    assert str(quick.value) == str(slow.value)


def _slow_requests(text: str) -> list:
    """`parse_requests` without the quick path."""
    value = P.parse_text(text)
    if not all(isinstance(r, P.Request) for r in value):
        raise P.ProtocolError("request text must be a list of requests")
    return value


@pytest.mark.parametrize("text", [
    "[CopyOut(buf=-0)]", "[ProgramExec(prog=1, bufs=())]", "[]", "[Synchronize()]",
    "[ProgramExec(prog=1, bufs=(1, 2), vals=(3, ))]",  # no trailing ', ': ast's path reads it alike
    "[ProgramAlloc(prog=1, name='a\\\\x41', datahash='" + HASH + "')]",  # an escape: ast's path
])
def test_other_well_formed_texts_read_alike_on_either_path(text):
    assert P.parse_requests(text) == P.parse_text(text)


def _nodes(text: str) -> int:
    """The node count `check_size` takes for `text`: the least `max_nodes` it lets through."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            P.check_size(text, max_nodes=mid)
            hi = mid
        except P.ProtocolError:
            lo = mid + 1
    return lo


def test_the_quick_path_counts_nodes_as_check_size_does():
    # (the quick path skips `check_size`'s pass over the text: its own count must refuse exactly what that refuses)
    rng = random.Random(11)
    for _ in range(100):
        text = P.to_text(_requests(rng))
        n = _nodes(text)
        assert P.parse_requests(text, max_nodes=n) == P.parse_text(text), text
        if n:
            with pytest.raises(P.ProtocolError, match=f"more than {n - 1} nodes"):
                P.parse_requests(text, max_nodes=n - 1)


def test_requests_kept_from_earlier_texts_read_as_ast_reads_them():
    # calls read before are taken from `_QUICK_BUILT`: the same requests as `ast` builds, also once it was emptied
    rng = random.Random(7)
    texts = [P.to_text(_requests(rng)) for _ in range(60)]
    P._QUICK_BUILT.clear()
    for _ in range(2):
        for text in texts:
            assert P.parse_requests(text) == P.parse_text(text), text
    assert P._QUICK_BUILT and all("'" not in call for call in P._QUICK_BUILT)  # (no call with a blob id is kept)
    keep = P._QUICK_KEEP
    try:
        P._QUICK_KEEP = 3
        P._QUICK_BUILT.clear()
        for text in texts:
            assert P.parse_requests(text) == P.parse_text(text), text
        assert len(P._QUICK_BUILT) <= 3
    finally:
        P._QUICK_KEEP = keep


def test_the_quick_path_refuses_the_depth_that_ast_refuses():
    # a negative int in a tuple is 5 levels deep for `parse_text` (the minus is a node): at a depth limit of 4
    # the quick path must not take it
    text = "[ProgramExec(prog=1, bufs=(1, ), vals=(-1, ))]"
    with pytest.raises(P.ProtocolError, match="deeper"):
        P.parse_text(text, P.REQUESTS, max_depth=4)
    with pytest.raises(P.ProtocolError, match="deeper"):
        P.parse_requests(text, max_depth=4)
    assert P.parse_requests(text, max_depth=5) == P.parse_text(text)


def test_an_argument_given_twice_is_refused_on_both_paths():
    for text in ("[GraphExec(graph=1, graph=2)]", "[Compile(src='a', src='b')]", "[CopyOut(buf=1, buf=2)]"):
        with pytest.raises(P.ProtocolError, match="given twice"):
            P.parse_requests(text)
        with pytest.raises(P.ProtocolError, match="given twice"):
            P.parse_text(text)


def _hash(i: int) -> str:
    return f"{i:064x}"


def test_a_kept_plan_with_other_blob_ids_reads_as_ast_reads_it(monkeypatch):
    # `_PLANS` keeps a text's requests under the text with its blob ids blanked: a later text that differs only in
    # those ids gets its own ids back, in their places; any other change is parsed afresh
    P._PLANS.clear()
    plan = ("[CopyIn(buf=6, datahash='{}'), WriteRange(buf=7, offset=4, datahash='{}'), "
            "ProgramAlloc(prog=2, name='E_4', datahash='{}'), GraphExec(graph=10, wait=False), CopyOut(buf=9)]")
    first = plan.format(_hash(1), _hash(2), _hash(3))
    assert P.parse_requests(first) == P.parse_text(first)
    assert len(P._PLANS) == 1
    quick = P._quick_requests
    with monkeypatch.context() as m:
        m.setattr(P, "_quick_requests", lambda *a: pytest.fail("not served from the kept plan"))
        for ids in ((4, 5, 6), (1, 1, 1), (9, 2, 3)):
            text = plan.format(*map(_hash, ids))
            got = P.parse_requests(text)
            assert got == P.parse_text(text), text
            assert [r.blob() for r in got if r.blob()] == [_hash(i) for i in ids]
    assert P._quick_requests is quick
    for changed in (first.replace("buf=6", "buf=8"), first.replace("offset=4", "offset=5"),
                    first.replace("'E_4'", "'E_5'"), first.replace("wait=False", "wait=True"),
                    first.replace("CopyOut(buf=9)", "CopyOut(buf=9), Synchronize()")):
        assert P.parse_requests(changed) == P.parse_text(changed), changed  # (a changed request: parsed, not kept)
    assert len(P._PLANS) == 6


@pytest.mark.parametrize("text", [
    "[CopyIn(buf=6, datahash=''), CopyOut(buf=9)]",  # the blanked key itself: not a blob id
    "[CopyIn(buf=6, datahash='" + "A" * 64 + "'), CopyOut(buf=9)]",  # upper case: not an id
    "[CopyIn(buf='6', datahash='" + HASH + "'), CopyOut(buf=9)]",  # a string where an integer goes
    "[CopyIn(buf=6, datahash='" + HASH + "'), CopyOut(buf=9), CopyOut(buf=9, x=1)]",
])
def test_a_bad_text_like_a_kept_plan_is_still_refused(text):
    P._PLANS.clear()
    good = "[CopyIn(buf=6, datahash='" + _hash(1) + "'), CopyOut(buf=9)]"
    assert P.parse_requests(good) == P.parse_text(good)
    assert P._PLANS
    with pytest.raises(P.ProtocolError) as slow:
        _slow_requests(text)
    with pytest.raises(P.ProtocolError) as quick:
        P.parse_requests(text)
    assert str(quick.value) == str(slow.value)


def test_a_kept_plan_counts_its_nodes_against_each_limit():
    P._PLANS.clear()
    text = "[CopyIn(buf=6, datahash='" + _hash(1) + "'), GraphExec(graph=3, wait=False), CopyOut(buf=9)]"
    n = _nodes(text)
    assert P.parse_requests(text, max_nodes=n) == P.parse_text(text)  # (kept now)
    again = text.replace(_hash(1), _hash(2))
    with pytest.raises(P.ProtocolError, match=f"more than {n - 1} nodes"):
        P.parse_requests(again, max_nodes=n - 1)
    assert P.parse_requests(again, max_nodes=n) == P.parse_text(again)


def test_kept_plans_are_bounded():
    keep = P._PLAN_KEEP
    try:
        P._PLAN_KEEP = 3
        P._PLANS.clear()
        for i in range(10):
            text = f"[CopyIn(buf={i}, datahash='{_hash(i)}')]"
            assert P.parse_requests(text) == P.parse_text(text)
            assert len(P._PLANS) <= 3
        long = "[" + ", ".join(f"CopyOut(buf={i})" for i in range(400)) + "]"  # (past `_PLAN_TEXT`: not kept)
        P._PLANS.clear()
        assert P.parse_requests(long) == P.parse_text(long) and not P._PLANS
    finally:
        P._PLAN_KEEP = keep
