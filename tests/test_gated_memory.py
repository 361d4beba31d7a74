"""Gates on loads and stores, in every renderer: a gated-off access reads and writes nothing.

Linear UOps are built by hand (the passes produce no gated STORE today, and rarely a gated vector LOAD), then
rendered: LLVM is compiled and run on the CPU, the C-style renderers (CUDA, OpenCL, Metal) are checked on
their source, and PYTHON runs them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tgc.dtype import dtypes
from tgc.ir.uop import Ops, RangeKind, UOp

I32, F32 = dtypes.i32, dtypes.f32


def _c(v: int) -> UOp:
    return UOp.const(I32, v)


def gated_store_uops(n: int = 8, keep: int = 3) -> list[UOp]:
    """for i < n: if i < keep: out[i] = inp[i] + 1  (a gated load and a gated store; the rest of out kept)."""
    out = UOp(Ops.DEFINE_GLOBAL, F32.as_ptr(), (), 0)
    inp = UOp(Ops.DEFINE_GLOBAL, F32.as_ptr(), (), 1)
    r = UOp(Ops.RANGE, I32, (_c(n),), (0, RangeKind.LOOP))
    gate = UOp(Ops.CMPLT, dtypes.bool, (r, _c(keep)))
    ld = UOp(Ops.LOAD, F32, (inp, r, gate))
    val = UOp(Ops.ADD, F32, (ld, UOp.const(F32, 1.0)))
    st = UOp(Ops.STORE, None, (out, r, val, gate))
    return [out, inp, _c(n), r, _c(keep), gate, ld, UOp.const(F32, 1.0), val, st, UOp(Ops.ENDRANGE, None, (r,))]


def gated_vector_load_uops(width: int = 4) -> list[UOp]:
    """out[0:width] = (flag[0] < 0 ? inp[0:width] : 0): a vector load gated by data (LLVM cannot fold it)."""
    out = UOp(Ops.DEFINE_GLOBAL, F32.as_ptr(), (), 0)
    inp = UOp(Ops.DEFINE_GLOBAL, F32.as_ptr(), (), 1)
    flag = UOp(Ops.DEFINE_GLOBAL, F32.as_ptr(), (), 2)
    r = UOp(Ops.RANGE, I32, (_c(1),), (0, RangeKind.LOOP))
    f = UOp(Ops.LOAD, F32, (flag, r))
    zero = UOp.const(F32, 0.0)
    gate = UOp(Ops.CMPLT, dtypes.bool, (f, zero))
    ld = UOp(Ops.LOAD, F32.vec(width), (inp, _c(0), gate))
    st = UOp(Ops.STORE, None, (out, _c(0), ld))
    return [out, inp, flag, _c(1), r, f, zero, gate, _c(0), ld, st, UOp(Ops.ENDRANGE, None, (r,))]


def _cpu_program(uops: list[UOp], name: str = "k"):
    from tgc.backends import get_device
    from tgc.backends.llvmir import LLVMRenderer
    dev = get_device("CPU")
    src = LLVMRenderer().render(name, uops)
    return src, dev.program(name, dev.compiler.compile(src))


def test_llvm_gated_store_writes_only_where_the_gate_is_on():
    src, prog = _cpu_program(gated_store_uops())
    out = np.full(8, -7.0, np.float32)
    inp = np.arange(8, dtype=np.float32)
    prog(out, inp)
    np.testing.assert_array_equal(out, [1, 2, 3, -7, -7, -7, -7, -7])
    assert "br i1" in src  # the store sits behind a branch on its gate


def test_llvm_gated_vector_load_is_a_masked_load():
    src, prog = _cpu_program(gated_vector_load_uops())
    assert "@llvm.masked.load.v4f32" in src
    for flag, want in ((1.0, [0, 0, 0, 0]), (-1.0, [0, 1, 2, 3])):
        out = np.full(4, -7.0, np.float32)
        prog(out, np.arange(4, dtype=np.float32), np.array([flag], np.float32))
        np.testing.assert_array_equal(out, want)


def test_llvm_gated_off_vector_load_reads_nothing_past_a_short_buffer():
    """A 4-lane load from a 2-float buffer that ends where an unreadable page begins. The old rendering (a
    full vector from index 0, then a select) faults on a CPU without AVX-512; with it (this machine), LLVM's
    x86 backend happened to fuse the select into a masked load. Run in a child process: a fault fails only
    this test (a gate that is on does fault here, so the guard page works)."""
    code = textwrap.dedent("""
        import ctypes, mmap, sys
        import numpy as np
        sys.path[:0] = [sys.argv[1], sys.argv[2]]
        from test_gated_memory import _cpu_program, gated_vector_load_uops
        _, prog = _cpu_program(gated_vector_load_uops())
        page = mmap.PAGESIZE
        m = mmap.mmap(-1, 2 * page)
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        libc = ctypes.CDLL(None)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        assert libc.mprotect(base + page, page, 0) == 0  # PROT_NONE
        inp = np.frombuffer(m, np.float32, count=2, offset=page - 8)  # the last 2 floats before the guard
        out = np.full(4, -7.0, np.float32)
        prog(out, inp, np.array([1.0], np.float32))  # the gate is off
        assert out.tolist() == [0, 0, 0, 0], out
        print("ok")
    """)
    import os
    here = os.path.dirname(__file__)
    root = os.path.dirname(here)
    res = subprocess.run([sys.executable, "-c", code, root, here], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, (res.returncode, res.stderr[-2000:])


@pytest.mark.parametrize("device", ["CUDA", "OPENCL", "METAL"])
def test_c_style_renderers_guard_a_gated_store(device):
    from tgc.backends import get_device
    src = get_device(device).renderer.render("k", gated_store_uops())
    body = src[src.index("{", src.index("k(")):]
    store = next(line for line in body.splitlines() if "data0[" in line and "=" in line)
    assert store.strip().startswith("if ("), store  # the gate guards the write


def test_python_gated_store_writes_only_where_the_gate_is_on():
    from tgc.backends import get_device
    dev = get_device("PYTHON")
    src = dev.renderer.render("k", gated_store_uops())
    prog = dev.program("k", dev.compiler.compile(src))
    out = np.full(8, -7.0, np.float32)
    prog(out.view(np.uint8), np.arange(8, dtype=np.float32).view(np.uint8))  # (it takes bytes)
    np.testing.assert_array_equal(out, [1, 2, 3, -7, -7, -7, -7, -7])


def test_vectorize_keeps_a_store_gate():
    """A gated store whose contiguous lanes become one vector store keeps its gate; one whose gate varies with
    the lane becomes one vector store gated lane by lane (a masked store)."""
    from tgc.codegen.expand import vectorize
    out = UOp(Ops.DEFINE_GLOBAL, F32.as_ptr(), (), 0)
    inp = UOp(Ops.DEFINE_GLOBAL, F32.as_ptr(), (), 1)
    row = UOp(Ops.RANGE, I32, (_c(3),), (0, RangeKind.LOOP))
    lane = UOp(Ops.RANGE, I32, (_c(4),), (1, RangeKind.UPCAST))
    idx = UOp(Ops.ADD, I32, (UOp(Ops.MUL, I32, (row, _c(4))), lane))
    val = UOp(Ops.LOAD, F32, (inp, idx))
    for gate, gate_dtype in ((UOp(Ops.CMPLT, dtypes.bool, (row, _c(2))), dtypes.bool),
                             (UOp(Ops.CMPLT, dtypes.bool, (lane, _c(2))), dtypes.bool.vec(4))):
        ast = UOp(Ops.SINK, None, (UOp(Ops.STORE, None, (out, idx, val, gate)),))
        got = vectorize(ast).src
        assert len(got) == 1 and len(got[0].src) == 4 and got[0].src[3].dtype == gate_dtype
        assert got[0].src[2].dtype == F32.vec(4)
