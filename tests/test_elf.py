"""Tests for the in-process ELF object loader (tgc.backends.elf).

Each test compiles a small LLVM IR module with llvmlite into object bytes, loads them with
`load_object`, calls the function through ctypes and compares with numpy.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tgc.backends.elf import ElfLoadError, LoadedObject, load_object, make_target_machine, resolve_symbol

llvm = pytest.importorskip("llvmlite.binding")

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or sys.platform != "linux",
                                reason="the ELF loader targets x86-64 Linux")

REPO = Path(__file__).resolve().parents[1]
F32P = ctypes.c_void_p


def compile_ir(src: str, tm=None) -> bytes:
    """LLVM IR text -> optimized object bytes (host target machine unless `tm` is given)."""
    tm = tm or make_target_machine()
    mod = llvm.parse_assembly(src)
    mod.triple, mod.data_layout = tm.triple, str(tm.target_data)
    mod.verify()
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_object(mod)


def generic_tm():
    """A target machine for a baseline x86-64 CPU (no F16C): half conversions become libcalls."""
    return llvm.Target.from_default_triple().create_target_machine(cpu="x86-64", features="", opt=3, reloc="pic",
                                                                   codemodel="small")


def elf_sections(obj: bytes) -> list[str]:
    """Section names, read independently of the loader under test."""
    shoff, shnum, shstrndx = struct.unpack_from("<Q", obj, 0x28)[0], *struct.unpack_from("<HH", obj, 0x3C)
    heads = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + 64 * i) for i in range(shnum)]
    strs = obj[heads[shstrndx][4]:heads[shstrndx][4] + heads[shstrndx][5]]
    return [strs[h[0]:strs.index(b"\0", h[0])].decode() for h in heads]


def reloc_types(obj: bytes) -> set[int]:
    """All x86-64 relocation type numbers in the object's RELA sections."""
    shoff, shnum = struct.unpack_from("<Q", obj, 0x28)[0], struct.unpack_from("<H", obj, 0x3C)[0]
    out = set()
    for i in range(shnum):
        h = struct.unpack_from("<IIQQQQIIQQ", obj, shoff + 64 * i)
        if h[1] == 4:  # SHT_RELA
            out |= {info & 0xFFFFFFFF for _, info, _ in struct.iter_unpack("<QQq", obj[h[4]:h[4] + h[5]])}
    return out


R_64, R_PC32, R_PLT32, R_REX_GOTPCRELX = 1, 2, 4, 42


def cfunc(lo: LoadedObject, name: str, restype, *argtypes):
    return ctypes.CFUNCTYPE(restype, *argtypes)(lo.address(name))


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


ADD_LOOP = """
define void @add(ptr noalias %out, ptr noalias %a, ptr noalias %b, i64 %n) {
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %pa = getelementptr float, ptr %a, i64 %i
  %pb = getelementptr float, ptr %b, i64 %i
  %va = load float, ptr %pa
  %vb = load float, ptr %pb
  %s = fadd float %va, %vb
  %po = getelementptr float, ptr %out, i64 %i
  store float %s, ptr %po
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""


def test_float_add_loop():
    lo = load_object(compile_ir(ADD_LOOP))
    assert set(lo.symbols) == {"add"} and lo.symbols["add"] == lo.address("add")
    f = cfunc(lo, "add", None, F32P, F32P, F32P, ctypes.c_int64)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(1003, dtype=np.float32), rng.standard_normal(1003, dtype=np.float32)
    out = np.zeros_like(a)
    f(ptr(out), ptr(a), ptr(b), len(a))
    np.testing.assert_array_equal(out, a + b)


def test_vector_constants_in_rodata_cst():
    # Non-splat vector constants are placed in a mergeable `.rodata.cst32` section, reached by PC32.
    src = """
define void @affine(ptr noalias %out, ptr noalias %a, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %p = getelementptr float, ptr %a, i64 %i
  %v = load <8 x float>, ptr %p, align 4
  %m = fmul <8 x float> %v, <float 1.0, float 2.0, float 3.0, float 4.0, float 5.0, float 6.0, float 7.0, float 8.0>
  %s = fadd <8 x float> %m, <float 0.5, float -1.5, float 2.5, float -3.5, float 4.5, float -5.5, float 6.5, float 9.0>
  %q = getelementptr float, ptr %out, i64 %i
  store <8 x float> %s, ptr %q, align 4
  %i1 = add i64 %i, 8
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""
    obj = compile_ir(src)
    assert any(s.startswith(".rodata.cst") for s in elf_sections(obj)), elf_sections(obj)
    assert R_PC32 in reloc_types(obj)
    lo = load_object(obj)
    a = np.arange(64, dtype=np.float32) - 20
    out = np.zeros_like(a)
    cfunc(lo, "affine", None, F32P, F32P, ctypes.c_int64)(ptr(out), ptr(a), len(a))
    mul = np.tile(np.arange(1, 9, dtype=np.float32), 8)
    add = np.tile(np.float32([0.5, -1.5, 2.5, -3.5, 4.5, -5.5, 6.5, 9.0]), 8)
    np.testing.assert_array_equal(out, a * mul + add)


def test_libm_calls_through_stubs():
    src = """
declare float @expf(float)
declare float @sinf(float)
define void @expsin(ptr noalias %e, ptr noalias %s, ptr noalias %a, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %p = getelementptr float, ptr %a, i64 %i
  %v = load float, ptr %p
  %ev = call float @expf(float %v)
  %sv = call float @sinf(float %v)
  %pe = getelementptr float, ptr %e, i64 %i
  store float %ev, ptr %pe
  %ps = getelementptr float, ptr %s, i64 %i
  store float %sv, ptr %ps
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""
    obj = compile_ir(src)
    assert R_PLT32 in reloc_types(obj)
    lo = load_object(obj)
    a = np.linspace(-5, 5, 777, dtype=np.float32)
    e, s = np.zeros_like(a), np.zeros_like(a)
    cfunc(lo, "expsin", None, F32P, F32P, F32P, ctypes.c_int64)(ptr(e), ptr(s), ptr(a), len(a))
    np.testing.assert_allclose(e, np.exp(a.astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(s, np.sin(a.astype(np.float64)), rtol=1e-6, atol=1e-7)


def test_one_function_calls_another():
    src = """
define float @sq(float %x) noinline {
  %y = fmul float %x, %x
  ret float %y
}
define float @sumsq(ptr %a, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %acc = phi float [0.0, %entry], [%acc1, %loop]
  %p = getelementptr float, ptr %a, i64 %i
  %v = load float, ptr %p
  %sq = call float @sq(float %v)
  %acc1 = fadd float %acc, %sq
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %exit
exit:
  ret float %acc1
}
"""
    obj = compile_ir(src)
    assert R_PLT32 in reloc_types(obj)  # the call to @sq is a PLT32 to a symbol defined in the object itself
    lo = load_object(obj)
    assert set(lo.symbols) == {"sq", "sumsq"}
    assert cfunc(lo, "sq", ctypes.c_float, ctypes.c_float)(3.0) == 9.0
    a = np.float32([1, 2, 3, 4.5])
    assert cfunc(lo, "sumsq", ctypes.c_float, F32P, ctypes.c_int64)(ptr(a), 4) == pytest.approx(34.25)


def test_global_constant_array_and_writable_global():
    # @table is a preemptible global (reached through the GOT: REX_GOTPCRELX), @local is internal (PC32),
    # @calls is writable data that must stay writable after loading.
    src = """
@table = constant [8 x float] [float 1.0, float 10.0, float 100.0, float 1000.0,
                               float -1.0, float -10.0, float -100.0, float -1000.0]
@local = internal constant [4 x i32] [i32 3, i32 1, i32 4, i32 1]
@calls = global i64 0
define void @gather(ptr noalias %out, ptr noalias %idx, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %pi = getelementptr i32, ptr %idx, i64 %i
  %k = load i32, ptr %pi
  %t = getelementptr [8 x float], ptr @table, i64 0, i32 %k
  %tv = load float, ptr %t
  %m = and i64 %i, 3
  %l = getelementptr [4 x i32], ptr @local, i64 0, i64 %m
  %lv = load i32, ptr %l
  %lf = sitofp i32 %lv to float
  %r = fadd float %tv, %lf
  %po = getelementptr float, ptr %out, i64 %i
  store float %r, ptr %po
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %exit
exit:
  %old = load i64, ptr @calls
  %new = add i64 %old, 1
  store i64 %new, ptr @calls
  ret void
}
"""
    obj = compile_ir(src)
    assert R_REX_GOTPCRELX in reloc_types(obj)
    lo = load_object(obj)
    table = np.float32([1, 10, 100, 1000, -1, -10, -100, -1000])
    idx = np.int32([7, 0, 3, 5, 1, 6, 2, 4, 0, 0])
    out = np.zeros(len(idx), np.float32)
    f = cfunc(lo, "gather", None, F32P, F32P, ctypes.c_int64)
    f(ptr(out), ptr(idx), len(idx))
    f(ptr(out), ptr(idx), len(idx))
    np.testing.assert_array_equal(out, table[idx] + np.tile(np.float32([3, 1, 4, 1]), 3)[: len(idx)])
    np.testing.assert_array_equal(np.ctypeslib.as_array((ctypes.c_float * 8).from_address(lo.address("table"))),
                                  table)
    assert ctypes.c_int64.from_address(lo.address("calls")).value == 2
    assert "table" not in lo.symbols and "calls" not in lo.symbols  # `symbols` lists functions only


def test_function_pointer_table_uses_abs64():
    # A table of function pointers lives in writable data with R_X86_64_64 relocations.
    src = """
define i32 @one() noinline { ret i32 1 }
define i32 @two() noinline { ret i32 2 }
@fns = global [2 x ptr] [ptr @one, ptr @two]
define i32 @call_nth(i64 %k) {
  %p = getelementptr [2 x ptr], ptr @fns, i64 0, i64 %k
  %f = load ptr, ptr %p
  %r = call i32 %f()
  ret i32 %r
}
"""
    obj = compile_ir(src)
    assert R_64 in reloc_types(obj)
    lo = load_object(obj)
    f = cfunc(lo, "call_nth", ctypes.c_int32, ctypes.c_int64)
    assert (f(0), f(1)) == (1, 2)
    assert ctypes.c_uint64.from_address(lo.address("fns")).value == lo.address("one")


def test_switch_jump_table():
    cases = " ".join(f"i32 {k}, label %c{k}" for k in range(8))
    blocks = "\n".join(f"c{k}:\n  ret i32 {k * k * 7 + 3}" for k in range(8))
    src = f"define i32 @pick(i32 %x) {{\n  switch i32 %x, label %dflt [{cases}]\n{blocks}\ndflt:\n  ret i32 -1\n}}\n"
    lo = load_object(compile_ir(src))
    f = cfunc(lo, "pick", ctypes.c_int32, ctypes.c_int32)
    assert [f(k) for k in range(-1, 9)] == [-1] + [k * k * 7 + 3 for k in range(8)] + [-1]


def test_vectorized_512_bit_loop():
    src = """
define void @fma16(ptr noalias %out, ptr noalias %a, ptr noalias %b, i64 %n) #0 {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %pa = getelementptr float, ptr %a, i64 %i
  %pb = getelementptr float, ptr %b, i64 %i
  %va = load <16 x float>, ptr %pa, align 4
  %vb = load <16 x float>, ptr %pb, align 4
  %m = fmul fast <16 x float> %va, %vb
  %s = fadd fast <16 x float> %m, <float 1.0, float 2.0, float 3.0, float 4.0, float 5.0, float 6.0, float 7.0,
      float 8.0, float 9.0, float 10.0, float 11.0, float 12.0, float 13.0, float 14.0, float 15.0, float 16.0>
  %po = getelementptr float, ptr %out, i64 %i
  store <16 x float> %s, ptr %po, align 4
  %i1 = add i64 %i, 16
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
attributes #0 = { "prefer-vector-width"="512" }
"""
    tm = make_target_machine()
    if "+avx512f" in llvm.get_host_cpu_features().flatten():
        mod = llvm.parse_assembly(src)
        assert "zmm" in tm.emit_assembly(mod)
    lo = load_object(compile_ir(src, tm))
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(16 * 37, dtype=np.float32), rng.standard_normal(16 * 37, dtype=np.float32)
    out = np.zeros_like(a)
    cfunc(lo, "fma16", None, F32P, F32P, F32P, ctypes.c_int64)(ptr(out), ptr(a), ptr(b), len(a))
    expect = a.astype(np.float64) * b + np.tile(np.arange(1, 17), 37)
    np.testing.assert_allclose(out, expect, rtol=1e-6, atol=1e-6)


HALF_ROUNDTRIP = """
define void @to_half(ptr noalias %h, ptr noalias %back, ptr noalias %a, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %p = getelementptr float, ptr %a, i64 %i
  %v = load float, ptr %p
  %hv = fptrunc float %v to half
  %ph = getelementptr half, ptr %h, i64 %i
  store half %hv, ptr %ph
  %f = fpext half %hv to float
  %pb = getelementptr float, ptr %back, i64 %i
  store float %f, ptr %pb
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""


@pytest.mark.parametrize("target", ["host", "generic"])
def test_half_float_conversions(target):
    if target == "generic" and not resolve_symbol("__truncsfhf2"):
        pytest.skip("no __truncsfhf2 in libgcc_s on this machine")
    obj = compile_ir(HALF_ROUNDTRIP, generic_tm() if target == "generic" else None)
    if target == "generic":  # a baseline CPU has no F16C, so LLVM calls libgcc's helpers
        assert b"__truncsfhf2" in obj and b"__extendhfsf2" in obj
    lo = load_object(obj)
    a = np.concatenate([np.linspace(-70000, 70000, 301, dtype=np.float32),
                        np.float32([0.1, 1 / 3, 1e-6, 6e-8, 65504, 65520, -0.0, np.inf, 2049, 2051])])
    h, back = np.zeros(len(a), np.float16), np.zeros_like(a)
    cfunc(lo, "to_half", None, F32P, F32P, F32P, ctypes.c_int64)(ptr(h), ptr(back), ptr(a), len(a))
    with np.errstate(over="ignore"):
        expect = a.astype(np.float16)
    np.testing.assert_array_equal(h.view(np.uint16), expect.view(np.uint16))
    np.testing.assert_array_equal(back, expect.astype(np.float32))


def test_missing_bfloat_helper_is_named():
    if resolve_symbol("__truncsfbf2"):
        pytest.skip("this machine's libgcc_s has __truncsfbf2")
    src = "define i16 @bf(float %x) {\n  %b = fptrunc float %x to bfloat\n  %i = bitcast bfloat %b to i16\n" \
          "  ret i16 %i\n}\n"
    with pytest.raises(ElfLoadError, match="__truncsfbf2"):
        load_object(compile_ir(src, generic_tm()))


def test_custom_resolver():
    src = """
declare i64 @host_hook(i64)
define i64 @twice_hook(i64 %x) {
  %a = call i64 @host_hook(i64 %x)
  %b = call i64 @host_hook(i64 %a)
  ret i64 %b
}
"""
    obj = compile_ir(src)
    hook = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(lambda x: 3 * x + 1)
    seen = []

    def resolve(name: str) -> int:
        seen.append(name)
        return ctypes.cast(hook, ctypes.c_void_p).value if name == "host_hook" else 0

    lo = load_object(obj, resolve)
    assert seen == ["host_hook"]
    assert cfunc(lo, "twice_hook", ctypes.c_int64, ctypes.c_int64)(2) == 22
    with pytest.raises(ElfLoadError, match="host_hook"):
        load_object(obj)  # the default resolver does not know it


def _maps_for(lo: LoadedObject) -> list[str]:
    """Permission strings of /proc/self/maps lines overlapping the loaded image."""
    perms = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo_hi, perm = line.split()[:2]
        start, end = (int(x, 16) for x in lo_hi.split("-"))
        if start < lo.base + lo.size and end > lo.base:
            perms.append(perm)
    return perms


def test_code_is_never_writable_and_executable():
    lo = load_object(compile_ir(ADD_LOOP + "@g = global i32 7\n"))
    perms = _maps_for(lo)
    assert any("x" in p for p in perms)
    assert not any("w" in p and "x" in p for p in perms), perms


def test_close_frees_the_mapping():
    lo = load_object(compile_ir(ADD_LOOP))
    lo.close()
    assert lo.symbols == {} and lo.base == 0
    with pytest.raises(ValueError, match="closed"):
        lo.address("add")
    lo.close()  # a second close is harmless


def test_unknown_symbol_name():
    lo = load_object(compile_ir(ADD_LOOP))
    with pytest.raises(KeyError, match="nope.*add"):
        lo.address("nope")


def test_fresh_process_without_llvmlite(tmp_path):
    obj_path = tmp_path / "add.o"
    obj_path.write_bytes(compile_ir(ADD_LOOP))
    script = textwrap.dedent(f"""
        import ctypes, sys
        import numpy as np
        from tgc.backends.elf import load_object
        lo = load_object(open({str(obj_path)!r}, "rb").read())
        f = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, ctypes.c_int64)(lo.address("add"))
        a = np.arange(100, dtype=np.float32); b = np.full(100, 0.5, np.float32); out = np.zeros(100, np.float32)
        f(out.ctypes.data, a.ctypes.data, b.ctypes.data, 100)
        assert "llvmlite" not in sys.modules, "the loader imported llvmlite"
        print(float(out.sum()))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert float(res.stdout) == pytest.approx(np.arange(100).sum() + 50)


# --- errors ---


def test_garbage_bytes():
    for junk in (b"", b"hello world", os.urandom(200), b"\x7fELF" + bytes(60)):
        with pytest.raises(ValueError):
            load_object(junk)
    with pytest.raises(ValueError, match="not an ELF"):
        load_object(b"MZ\x90\x00" + bytes(100))


def test_truncated_object():
    obj = compile_ir(ADD_LOOP)
    for cut in (4, 20, 63, 64, 200, len(obj) // 2, len(obj) - 64, len(obj) - 1):
        with pytest.raises(ElfLoadError, match="truncated|malformed"):
            load_object(obj[:cut])


def test_wrong_machine_and_type():
    obj = bytearray(compile_ir(ADD_LOOP))
    arm = obj[:18] + struct.pack("<H", 183) + obj[20:]  # EM_AARCH64
    with pytest.raises(ValueError, match="machine"):
        load_object(bytes(arm))
    exe = obj[:16] + struct.pack("<H", 2) + obj[18:]  # ET_EXEC
    with pytest.raises(ValueError, match="relocatable"):
        load_object(bytes(exe))


def test_unsupported_relocation_is_named():
    # The large code model uses GOT64/GOTPC64 relocations, which the loader does not implement.
    large = llvm.Target.from_default_triple().create_target_machine(opt=2, reloc="pic", codemodel="large")
    src = "@g = global float 1.0\ndefine float @get() {\n  %v = load float, ptr @g\n  ret float %v\n}\n"
    with pytest.raises(ValueError, match=r"unsupported relocation type R_X86_64_GOT"):
        load_object(compile_ir(src, large))
