"""Python interop (issue 22, item 6): objects with `__dlpack__` or `__array__` (torch tensors, jax arrays) are
inputs like numpy arrays, converted once, zero-copy where the CPU can read them; an `.npz` holding arrays the
program does not declare is read for the declared ones, with a note."""

from __future__ import annotations

import numpy as np
import pytest
from clikit import invoke

import tgc

SRC = "x: f32[N, D]\nw: f32[D]\nreturn x @ w, x * 2"


class ArrayLike:
    """Only `__array__`, as objects of many array libraries have."""

    def __init__(self, a: np.ndarray):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        return self.a if dtype is None else self.a.astype(dtype)


class DLPackOnly:
    """Only the DLPack protocol (what `np.from_dlpack` reads), forwarded to a numpy array's."""

    def __init__(self, a: np.ndarray):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class OnAnotherDevice:
    """A DLPack producer whose memory the CPU cannot read (a CUDA tensor, say) and no `__array__`."""

    def __dlpack__(self, **kw):
        raise BufferError("the tensor lives on cuda:0")

    def __dlpack_device__(self):
        return (2, 0)


@pytest.mark.parametrize("wrap", [ArrayLike, DLPackOnly])
def test_array_objects_are_inputs(wrap):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    out = tgc.loads(SRC).run(device="CPU", x=wrap(x), w=wrap(w))
    np.testing.assert_allclose(out["out0"], x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out["out1"], x * 2)


@pytest.mark.parametrize("wrap", [ArrayLike, DLPackOnly])
def test_conversion_is_zero_copy_when_the_layout_allows(wrap):
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    prog = tgc.loads(SRC)
    assert np.shares_memory(prog.conform("x", wrap(x)), x)
    # a transposed view is not C-contiguous: converted once, by copying
    xt = np.arange(15, dtype=np.float32).reshape(5, 3).T
    got = prog.conform("x", wrap(xt))
    assert got.flags.c_contiguous and got.tolist() == xt.tolist()


def test_array_objects_of_another_dtype_need_cast():
    x = np.ones((2, 2), np.float64)
    prog = tgc.loads(SRC)
    with pytest.raises(tgc.TgcError, match="input 'x' is f64, but the program declares it f32"):
        prog.conform("x", ArrayLike(x))
    assert prog.conform("x", DLPackOnly(x), cast=True).dtype == np.float32


def test_unreadable_array_object_is_one_clear_error():
    with pytest.raises(tgc.TgcError) as e:
        tgc.loads(SRC).conform("x", OnAnotherDevice())
    assert e.value.msg == ("input 'x': cannot read the OnAnotherDevice through DLPack: the tensor lives on cuda:0")
    assert e.value.exit_code == 2 and "host memory" in e.value.hint


def test_run_with_npz_holding_extra_arrays_notes_them(tmp_path):
    src = tmp_path / "p.tg"
    src.write_text("x: f32[N]\nreturn x + 1\n")
    npz = tmp_path / "weights.npz"
    np.savez(npz, x=np.arange(3, dtype=np.float32), layer1_w=np.ones((2, 2)), layer2_w=np.ones(2))
    r = invoke("run", str(src), "--inputs", str(npz), "-o", str(tmp_path / "y.npy"))
    assert r.exit_code == 0, r.stderr
    assert f"note: ignored 2 arrays of '{npz}' that the program does not declare: layer1_w, layer2_w" in r.stderr
    assert np.load(tmp_path / "y.npy").tolist() == [1, 2, 3]
