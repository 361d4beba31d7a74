"""Zero-copy CPU buffers: aligned contiguous inputs run in place, outputs are handed over without a copy, and
neither the user's arrays nor earlier results are ever written (docs/DESIGN.md, "Zero-copy CPU buffers")."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import tgc
import tgc.codegen.kernel as kernel_mod
from tgc.engine import realize

KERNELS = sorted(pathlib.Path(__file__).resolve().parent.parent.joinpath("kernels").glob("*.tg"))
SRC = "a: f32[N]\nb: f32[N]\nreturn exp(a * b) + a, a - b"


def aligned(values: np.ndarray, align: int = 64, offset: int = 0) -> np.ndarray:
    """A copy of `values` whose data starts `offset` bytes past a multiple of `align`."""
    raw = np.empty(values.nbytes + align + offset, np.uint8)
    start = (-raw.ctypes.data) % align + offset
    arr = raw[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    arr[...] = values
    assert arr.ctypes.data % align == offset
    return arr


@pytest.fixture
def launched(monkeypatch) -> list[list[int]]:
    """The data addresses of every launch's buffers, in launch order."""
    seen: list[list[int]] = []
    real = realize.launch

    def spy(k, bufs, **kw):
        seen.append([b.handle.ctypes.data for b in bufs])
        return real(k, bufs, **kw)
    monkeypatch.setattr(realize, "launch", spy)
    return seen


def _inputs(n: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (aligned(rng.standard_normal(n).astype(np.float32)), aligned(rng.standard_normal(n).astype(np.float32)))


def test_aligned_inputs_run_in_place(launched):
    a, b = _inputs()
    out = tgc.loads(SRC).run(a=a, b=b)
    used = {p for bufs in launched for p in bufs}
    assert a.ctypes.data in used and b.ctypes.data in used
    np.testing.assert_allclose(out["out0"], np.exp(a * b) + a, rtol=1e-4, atol=1e-5)


def test_outputs_are_the_kernels_buffers_not_copies(launched):
    a, b = _inputs()
    out = tgc.loads(SRC).run(a=a, b=b)
    used = {p for bufs in launched for p in bufs}
    for v in out.values():
        assert v.ctypes.data in used  # the very memory the kernel wrote
        assert v.flags.writeable and v.flags.c_contiguous
        assert v.ctypes.data % 16 == 0


def test_inputs_are_never_written_and_outputs_never_alias():
    a, b = _inputs()
    a0, b0 = a.copy(), b.copy()
    p = tgc.loads(SRC + ", a")
    r1 = p.run(a=a, b=b)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    outs = list(r1.values())
    for i, o in enumerate(outs):
        assert not np.shares_memory(o, a) and not np.shares_memory(o, b)
        for other in outs[i + 1:]:
            assert not np.shares_memory(o, other)
    first = {k: v.copy() for k, v in r1.items()}
    r1["out0"][:] = -1  # the caller owns its results: writing one changes no later run
    r2 = p.run(a=a, b=b)
    for k in r2:
        assert not np.shares_memory(r1[k], r2[k])
        np.testing.assert_array_equal(r2[k], first[k])
    np.testing.assert_array_equal(r1["out1"], first["out1"])  # the second run left the first's results alone
    np.testing.assert_array_equal(a, a0)


@pytest.mark.parametrize("kind", ["misaligned", "strided", "transposed", "readonly", "big-endian"])
def test_inputs_that_cannot_run_in_place_still_give_the_right_answer(kind, launched):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(1001).astype(np.float32), rng.standard_normal(1001).astype(np.float32)
    want = np.exp(a * b) + a
    if kind == "misaligned":  # a view one byte into a byte buffer
        a = aligned(a, offset=1)
    elif kind == "strided":
        a = np.repeat(a, 2)[::2]
    elif kind == "transposed":
        p = tgc.loads("x: f32[N, M]\nreturn x * 2.0")
        x = rng.standard_normal((40, 30)).astype(np.float32)
        np.testing.assert_array_equal(p.run(x=x.T)["out0"], x.T * 2)
        return
    elif kind == "readonly":
        a = aligned(a)
        a.flags.writeable = False
    else:
        out = tgc.loads(SRC).run(a=a.astype(">f4"), b=b, cast=True)
        np.testing.assert_allclose(out["out0"], want, rtol=1e-4, atol=1e-5)
        return
    before = a.copy()
    out = tgc.loads(SRC).run(a=a, b=b)
    np.testing.assert_allclose(out["out0"], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(a, before)
    if kind == "misaligned":
        assert a.ctypes.data not in {p for bufs in launched for p in bufs}  # it was copied


def test_an_input_a_kernel_would_write_is_copied(monkeypatch, launched):
    # no kernel stores to an input today (see the next test); if one did, the input would get its own copy
    a, b = _inputs()
    monkeypatch.setattr(realize, "stored_indices", lambda ast: frozenset(range(8)))
    monkeypatch.setattr(kernel_mod.Kernel, "written", lambda self: frozenset(range(8)))  # (what the engine asks)
    out = tgc.loads(SRC).run(a=a, b=b)
    used = {p for bufs in launched for p in bufs}
    assert a.ctypes.data not in used and b.ctypes.data not in used
    np.testing.assert_allclose(out["out1"], a - b)


@pytest.mark.parametrize("path", KERNELS, ids=[p.name for p in KERNELS])
def test_no_example_kernel_stores_to_an_input(path):
    from test_examples import SIZES, SIZES_OF
    p = tgc.load(path)
    dims = {name: SIZES_OF.get(path.name, SIZES).get(name, SIZES.get(name, 4)) for name in p.dim_names}
    low = p.lower("CPU", dims)
    ins = {b for b, _ in low.inputs}
    for k in low.kernels:
        assert not ins & {k.bufs[i] for i in realize.stored_indices(k.ast)}, k.name


def test_a_packed_matmul_reads_its_input_in_place(launched):
    # the CPU packs a large right-hand side into a copy (an intermediate): the input itself is only read
    rng = np.random.default_rng(2)
    a, b = aligned(rng.standard_normal((64, 512)).astype(np.float32)), aligned(
        rng.standard_normal((512, 512)).astype(np.float32))
    b0 = b.copy()
    out = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b").run(a=a, b=b)["out0"]
    assert len(launched) >= 2 and b.ctypes.data in launched[0]  # the packing kernel reads b in place
    np.testing.assert_array_equal(b, b0)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-3)


def test_a_chain_of_kernels_reuses_its_intermediate_buffers(launched):
    # each intermediate goes back to the pool after its last kernel, so a later one of its size reuses it
    p = tgc.loads("x: f32[N, N]\na = x @ x\nb = a @ a\nc = b @ b\nd = c @ c\nreturn d @ d")
    x = (np.random.default_rng(5).standard_normal((16, 16)) * 0.2).astype(np.float32)
    got = p.run(x=x)["out0"]
    written = [bufs[0] for bufs in launched]
    # a and b, then c in a's buffer (a is dead once b is computed), d in b's, the output in c's: two buffers
    assert len(written) == 5 and len(set(written)) == 2
    want = x.astype(np.float64)
    for _ in range(5):
        want = want @ want
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6)
