"""A CPU server runs launches of kernels proven short inline, without a launch worker (issue 27 item 5), and sends
every other launch to a worker as before: the proof (`shortproof.prove_short`) against tgc's own kernels and
against hostile edits of them, and the server's choice, with results against numpy."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.test_remote_datapath import _drop_remote_instances, _use_server_without_token
from tests.test_remote_deadline import BUSY_SRC, SPIN_SRC, _load, _ok, _ready
from tests.test_remote_server import batch, needs_cpu, post
from tgc.backends.remote import protocol as P
from tgc.backends.remote.contract import parse_contract
from tgc.backends.remote.server import serve
from tgc.backends.remote.shortproof import MAX_WORK, prove_short

SOFTMAX = "x: f32[N, D]\nm = x.max(axis=1, keepdim=True)\ne = exp(x - m)\nreturn e / sum(e, axis=1, keepdim=True)\n"
MLP = "x: f32[N, D]\nw: f32[D, D]\nh = relu(x @ w)\nreturn h @ w\n"


def _sources(src: str, dims: dict[str, int]) -> list[str]:
    import tgc
    return [k.src for k in tgc.loads(src).compile(device="CPU", dims=dims)]


def _proof(src: str) -> int | None:
    return prove_short(src, parse_contract(src, "llvm").contract)


def _softmax(s: np.ndarray) -> np.ndarray:
    """numpy's row softmax (the reference for SOFTMAX)."""
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)

@needs_cpu
def test_small_tgc_kernels_are_proven_and_large_ones_are_not():
    small = _sources(SOFTMAX, {"N": 4, "D": 8}) + _sources(MLP, {"N": 16, "D": 32})
    for src in small:
        work = _proof(src)
        assert work is not None and 0 < work <= MAX_WORK, src
    (big,) = _sources(SOFTMAX, {"N": 1024, "D": 1024})
    assert _proof(big) is None  # bounded, but far more work than an inline launch may take


@needs_cpu
def test_kernels_that_may_not_end_or_take_vals_are_not_proven():
    assert _proof(SPIN_SRC) is None  # a loop without an exit
    assert _proof(BUSY_SRC) is None  # a trip count the launch chooses


def _edit(src: str, old: str, new: str, count: int = 1) -> str:
    out = src.replace(old, new, count) if count else src.replace(old, new)
    assert out != src, old  # (the edit applies: the test checks what it says)
    return out


@needs_cpu
def test_hostile_edits_of_a_proven_kernel_are_not_proven():
    (src,) = _sources(SOFTMAX, {"N": 4, "D": 8})
    assert _proof(src) is not None
    gep = re.search(r"  (%v\d+) = getelementptr inbounds float, ptr %data1, i32 (%v\d+)\n", src)

    def index(value: str, define: str) -> str:
        """`src` with its first read's index replaced by `value`, defined by `define` just before."""
        return _edit(src, gep.group(0), f"  {define}\n  {gep.group(1)} = getelementptr inbounds float, ptr %data1, "
                                         f"i32 {value}\n")
    hostile = {
        "a row past the buffer's end": _edit(src, "icmp slt i32 %r0, 4", "icmp slt i32 %r0, 5"),
        "a contract smaller than the kernel reads": _edit(src, '"bufs":[128,128]', '"bufs":[128,124]'),
        "a store through null": _edit(src, "store float %v8, ptr %acc0", "store float %v8, ptr null"),
        "an index read from memory": index("%w", "%w = load i32, ptr %data0, align 4"),
        "an over-aligned vector load": _edit(src, "load <8 x float>, ptr %v57, align 4",
                                             "load <8 x float>, ptr %v57, align 32"),
        "a loop that never counts up": _edit(src, "add nuw nsw i32 %r1, 1", "add nuw nsw i32 %r1, 0"),
        "a call of a libc function": _edit(src, "@llvm.trunc.f32", "@sleep", count=0),
        "a division by a variable": _edit(src, "%v2 = mul nsw i32 %r0, 8", "%v2 = sdiv i32 8, %r0"),
        "a back edge from outside the loop": _edit(src, "  br label %loop0_exit\nloop0_exit:",
                                                   "  br label %loop1_body\nloop0_exit:")
        if "  br label %loop0_exit\nloop0_exit:" in src else _edit(src, "  ret void", "  br label %loop1_body"),
        "a stack slot read wider than it is": _edit(src, "%v7 = load float, ptr %acc0",
                                                    "%w = load <8 x float>, ptr %acc0\n  %v7 = load float, ptr %acc0"),
        "a pointer stored as a value": _edit(src, "store float %v8, ptr %acc0", "store ptr %data0, ptr %acc0"),
        "a second function": src + "\ndefine void @other(ptr %data0, i32 %core_id) #0 {\nentry:\n  ret void\n}\n",
    }
    # a store whose real address (%bad, past the buffer) a trailing comment hides behind a good one
    hidden = _edit(src, "  store <8 x float> %v61, ptr %v62, align 4",
                   "  %bad = getelementptr inbounds float, ptr %data0, i32 1000\n"
                   "  store <8 x float> %v61, ptr %bad, align 4 ; , ptr %v62, align 4")
    hostile["a store's address behind a comment"] = hidden
    # an index of -1 (a sign-extended true), one element before the buffer
    hostile["an index made by sign-extending an i1"] = index("%w", "%w = sext i1 true to i32")
    assert _proof(index("%w", "%w = zext i1 true to i32")) is not None  # (index 1: inside the buffer)
    assert _proof(index("%w", "%w = and i32 %v2, 7")) is not None  # (and bounds an index)
    # a counter read after its loop, where it equals its bound (index 32 of 32 floats: one past the end)
    hostile["a loop counter used after its loop"] = _edit(
        src, "loop1_exit:\n", "loop1_exit:\n  %w = add i32 %v2, %r1\n"
        "  %g = getelementptr inbounds float, ptr %data1, i32 %w\n  %u = load float, ptr %g, align 4\n")
    hostile["a vector too wide for the stack"] = _edit(src, "<8 x float>", "<4096 x float>", count=0)
    for what, bad in hostile.items():
        assert _proof(bad) is None, what


# copies 16 elements of type T from data1 to data0 (a loop of the renderer's form); the contract's sizes are the
# elements' packed sizes, which is what the proof reads (review 11)
_STRIDED = """define void @strided(ptr noalias align 64 %data0, ptr noalias align 64 %data1, i32 %core_id) #0 {
entry:
  br label %loop0_head
loop0_head:
  %r0 = phi i32 [ 0, %entry ], [ %v3, %loop0_body ]
  %v0 = icmp slt i32 %r0, 16
  br i1 %v0, label %loop0_body, label %loop0_exit
loop0_body:
  %v1 = getelementptr inbounds T, ptr %data1, i32 %r0
  %v2 = load T, ptr %v1, align 4
  %g = getelementptr inbounds T, ptr %data0, i32 %r0
  store T %v2, ptr %g, align 4
  %v3 = add nuw nsw i32 %r0, 1
  br label %loop0_head
loop0_exit:
  ret void
}

attributes #0 = { nounwind }
; tgc-launch: {"bufs":[BYTES,BYTES],"global_size":[1,1,1],"local_size":null,"vals":0}
"""


@needs_cpu
def test_types_whose_stride_is_not_their_size_are_not_proven():
    """LLVM steps a getelementptr by a type's alloc size (`<3 x float>`: 16 bytes for 12 stored), so a proof that
    sized the stride by the stored bytes let a kernel run inline past its buffers (review 11: the next buffer in the
    arena overwritten, and through an array alloca the server's stack: a crash)."""
    def kernel(ty: str, size: int) -> str:
        return _STRIDED.replace("BYTES", str(16 * size)).replace("T", ty)
    for ty, size in (("<4 x float>", 16), ("float", 4), ("<2 x double>", 16), ("i32", 4)):
        assert _proof(kernel(ty, size)) is not None, ty  # (the same kernel of a power-of-two size is proven)
    for ty, size in (("<3 x float>", 12), ("<5 x float>", 20), ("<6 x half>", 12), ("<3 x double>", 24),
                     ("i24", 3), ("i48", 6), ("<3 x i8>", 3)):
        assert _proof(kernel(ty, size)) is None, ty


@needs_cpu
def test_array_allocas_are_not_proven():
    """A local array read where it was not written gives the server thread's old stack (review 11: pointers of the
    server's own memory in the answer), so a kernel with one runs in a worker."""
    src = _STRIDED.replace("BYTES", "64").replace("T", "float")
    assert _proof(src) is not None
    local = _edit(src, "entry:\n", "entry:\n  %local0 = alloca [64 x float], align 64\n")
    local = _edit(local, "ptr %data1, i32 %r0", "ptr %local0, i32 %r0")
    assert _proof(local) is None


def _kernel(body: str, nbytes: int) -> str:
    """A hand-written kernel of one buffer of `nbytes` (the client's side of the protocol writes any IR)."""
    return (f"define void @k(ptr noalias align 64 %data0, i32 %core_id) #0 {{\n{body.strip()}\n}}\n\n"
            f"attributes #0 = {{ nounwind }}\n"
            f'; tgc-launch: {{"bufs":[{nbytes}],"global_size":[1,1,1],"local_size":null,"vals":0}}\n')


_COUNTED = """
entry:
  br label %h
h:
  %r = phi i32 [ START, %entry ], [ %n, %h.body ]
  %c = icmp slt i32 %r, END
  br i1 %c, label %h.body, label %x
h.body:
  %i = add nsw i32 %r, SHIFT
  %g = getelementptr inbounds float, ptr %data0, i32 %i
  store float 1.0, ptr %g, align 4
  %n = add FLAGS i32 %r, 1
  br label %h
x:
  ret void"""


@needs_cpu
def test_a_loop_step_that_may_wrap_is_not_proven():
    """`add nuw` of a counter that starts below 0 wraps (as unsigned) at -1: a poison step, and LLVM made the loop
    endless, writing across the arena inline (review 13: the server died after ~20 s)."""
    def loop(start: int, flags: str) -> str:
        body = _COUNTED.replace("START", str(start)).replace("END", str(start + 8)).replace("SHIFT", str(-start))
        return _kernel(body.replace("FLAGS", flags), 32)
    for flags in ("nuw nsw", "nuw", "nsw"):
        assert _proof(loop(0, flags)) is not None, flags
    assert _proof(loop(-3, "nsw")) is not None
    assert _proof(loop(-3, "nuw")) is None
    assert _proof(loop(-3, "nuw nsw")) is None


@needs_cpu
def test_a_second_instruction_on_a_line_is_not_proven():
    """LLVM IR does not end an instruction at a line break, and the proof reads one a line: a second instruction
    of constant operands rode along unseen (review 13: a store to an address of the client's choosing, a call to
    one, an endless self call), as did a constant expression (the kernel's own address stored into a buffer)."""
    plain = "entry:\n  %c = icmp eq i32 1, 2\n  store float 2.0, ptr %data0, align 4\n  ret void"
    assert _proof(_kernel(plain, 4)) is not None
    hidden = {
        "a store after a store": "store float 2.0, ptr %data0, align 4",
        "a call after a compare": "%c = icmp eq i32 1, 2 call void @k(ptr null, i32 0)",
        "a jump after a compare": "%c = icmp eq i32 1, 2 call void inttoptr (i64 4096 to ptr)()",
        "a store to an address": "%c = icmp eq i32 1, 2 store i64 1, ptr inttoptr (i64 4096 to ptr)",
        "an address stored": "%c = icmp eq i32 1, 2",
        "a store after an add": "%a = add i32 1, 2 store float 1.0, ptr inttoptr (i64 4096 to ptr)",
    }
    edits = {
        "a store after a store": ("store float 2.0, ptr %data0, align 4",
                                  "store float 1.0, ptr inttoptr (i64 4096 to ptr) store float 2.0, ptr %data0, "
                                  "align 4"),
        "an address stored": ("store float 2.0, ptr %data0, align 4",
                              "store i64 ptrtoint (ptr @k to i64), ptr %data0, align 8"),
    }
    for what, line in hidden.items():
        old, new = edits.get(what, ("%c = icmp eq i32 1, 2", line))
        bad = _edit(plain, old, new)
        assert _proof(_kernel(bad, 8)) is None, what


@needs_cpu
def test_lines_and_tokens_are_read_as_llvm_reads_them():
    """Review 14: a line break Python's `splitlines` sees but LLVM does not (`\\x0c` in a comment line) defined a
    value only the proof saw, and an opcode glued to a literal (`0store`, `2.0unreachable`, `%0unreachable`) was one
    token to the proof, two to LLVM: an index anywhere near a buffer (another session's read and overwritten), an
    `unreachable` that killed the server, a hidden back edge that never returned."""
    numbered = "entry:\n  %0 = and i32 %core_id, 0\n  %p = getelementptr float, ptr %data0, i32 %0\n" \
               "  store float 2.0, ptr %p, align 4\n  ret void"
    assert _proof(_kernel(numbered, 4)) is not None
    hidden = "entry:\n; c\x0c%0 = and i32 %core_id, 0\n  %c = icmp eq i32 %core_id, 0add i32 %core_id, 64\n" \
             "  %p = getelementptr float, ptr %data0, i32 %0\n  store float 2.0, ptr %p, align 4\n  ret void"
    for sep in ("\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r"):
        assert _proof(_kernel(hidden.replace("\x0c", sep), 4)) is None, repr(sep)
    store = "entry:\n  %x = OP\n  store float 2.0, ptr %data0, align 4\n  ret void"
    assert _proof(_kernel(store.replace("OP", "add i32 %core_id, 1"), 4)) is not None
    for glued in ("add i32 %core_id, 1unreachable", "fadd float 1.0, 2.0unreachable",
                  "select i1 true, i32 1, i32 0unreachable", "icmp eq i32 %core_id, 0store i32 0, ptr null",
                  "insertelement <4 x float> zeroinitializer, float 1.0, i32 0unreachable",
                  "add i32 %core_id, 0ret void 1b:", "add i32 %core_id, 0x1unreachable"):
        assert _proof(_kernel(store.replace("OP", glued), 4)) is None, glued
    name = "entry:\n  %0unreachable = add i32 %core_id, 1\n  store float 2.0, ptr %data0, align 4\n  ret void"
    assert _proof(_kernel(name, 4)) is None
    over = "entry:\n  %a = alloca float, align A\n  store float 2.0, ptr %a, align 4\n" \
           "  store float 2.0, ptr %data0, align 4\n  ret void"
    assert _proof(_kernel(over.replace("A", "64"), 4)) is not None
    assert _proof(_kernel(over.replace("A", "4294967296"), 4)) is None


@needs_cpu
def test_names_wide_integers_and_stack_vectors_that_run_long_or_leak_are_not_proven():
    """Review 15: a kernel named after a C library function (`sin`) answered LLVM's own call of it (recursion until
    the server died); an `udiv i16384` of weight 1 ran for seconds; a lane of a huge vector read at a variable index
    came from the server thread's stack."""
    body = "entry:\n  %x = load double, ptr %data0, align 8\n  %y = call double @llvm.sin.f64(double %x)\n" \
           "  store double %y, ptr %data0, align 8\n  ret void"
    named = _kernel(body, 8) + "declare double @llvm.sin.f64(double)\n"
    assert _proof(named.replace("@k(", "@E_4_8(")) is not None
    for name in ("sin", "fmod", "exp", "memset", "_k", "k.1"):
        assert _proof(named.replace("@k(", f"@{name}(")) is None, name
    wide = "entry:\n  %a = zext i32 %core_id to iW\n  %q = udiv iW %a, 3\n  %t = trunc iW %q to i32\n" \
           "  store i32 %t, ptr %data0, align 4\n  ret void"
    assert _proof(_kernel(wide.replace("iW", "i64"), 4)) is not None
    for width in ("i128", "i16384", "i24"):
        assert _proof(_kernel(wide.replace("iW", width), 4)) is None, width
    lanes = "entry:\n  %v = insertelement <N x i64> poison, i64 1, i32 0\n  %e = extractelement <N x i64> %v, IDX\n" \
            "  store i64 %e, ptr %data0, align 8\n  ret void"
    assert _proof(_kernel(lanes.replace("N", "8").replace("IDX", "i32 0"), 8)) is not None
    for n, idx in (("8", "i32 %core_id"), ("8", "i32 8"), ("4096", "i32 0")):
        assert _proof(_kernel(lanes.replace("N", n).replace("IDX", idx), 8)) is None, (n, idx)


@pytest.fixture
def cpu_server():
    srv = serve("127.0.0.1", 0, "CPU", None).start()
    yield srv
    srv.shutdown()


@needs_cpu
def test_small_programs_run_inline_with_numpy_results(cpu_server, monkeypatch):
    import tgc
    _use_server_without_token(monkeypatch, cpu_server.port)
    try:
        rng = np.random.default_rng(0)
        x, w = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 32)).astype(np.float32)
        prog = tgc.loads(MLP)
        for _ in range(3):  # (new inputs each time: the inline launches read the buffers of this run)
            x = rng.standard_normal((16, 32)).astype(np.float32)
            out = prog.run(device="REMOTE", x=x, w=w)["out0"]
            np.testing.assert_allclose(out, np.maximum(x @ w, 0) @ w, rtol=1e-4, atol=1e-4)
        assert cpu_server.inline_launches == 6  # two kernels a run, none in a worker
        s = rng.standard_normal((4, 8)).astype(np.float32)
        np.testing.assert_allclose(tgc.loads(SOFTMAX).run(device="REMOTE", x=s)["out0"], _softmax(s),
                                   rtol=1e-5, atol=1e-6)
        assert cpu_server.inline_launches == 7
    finally:
        _drop_remote_instances()


@needs_cpu
def test_a_server_told_not_to_runs_every_launch_in_a_worker(monkeypatch):
    """`tgc serve --no-inline` (`Limits.inline`): the same small program as above, right, and no launch inline."""
    import tgc
    from tgc.backends.remote.limits import Limits
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(inline=False)).start()
    _use_server_without_token(monkeypatch, srv.port)
    try:
        rng = np.random.default_rng(1)
        x, w = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 32)).astype(np.float32)
        out = tgc.loads(MLP).run(device="REMOTE", x=x, w=w)["out0"]
        np.testing.assert_allclose(out, np.maximum(x @ w, 0) @ w, rtol=1e-4, atol=1e-4)
        assert srv.inline_launches == 0
    finally:
        _drop_remote_instances()
        srv.shutdown()


@needs_cpu
def test_a_kernel_not_proven_short_still_runs_in_a_worker(cpu_server, monkeypatch):
    import tgc
    _use_server_without_token(monkeypatch, cpu_server.port)
    try:
        s = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)
        np.testing.assert_allclose(tgc.loads(SOFTMAX).run(device="REMOTE", x=s)["out0"], _softmax(s),
                                   rtol=1e-5, atol=1e-6)
        assert cpu_server.inline_launches == 0
    finally:
        _drop_remote_instances()
    # a launch that chooses its own trip count (vals) goes to a worker, which the deadline can stop
    srv, sid = cpu_server, "busy-inline-0123456789"
    _load(srv.port, sid, BUSY_SRC, "busy")
    results, blobs = _ok(srv.port, sid, P.ProgramExec(prog=1, bufs=(1,), global_size=(1, 1, 1), vals=(1000,)),
                         P.CopyOut(buf=1))
    assert np.frombuffer(blobs[results[1]], np.int32)[0] == 1000
    assert srv.inline_launches == 0


@needs_cpu
def test_a_hostile_kernel_in_the_form_of_a_proven_one_is_refused_inline_and_loses_only_a_worker(cpu_server):
    (src,) = _sources(SOFTMAX, {"N": 4, "D": 8})
    bad = _edit(src, "store float %v8, ptr %acc0", "store float %v8, ptr null")
    name = re.search(r"define void @([\w.]+)\(", bad).group(1)
    srv, sid = cpu_server, "null-store-0123456789"
    (h,), blobs = _ok(srv.port, sid, P.Compile(src=bad))
    _ok(srv.port, sid, P.ProgramAlloc(prog=1, name=name, datahash=h), P.BufferAlloc(buf=1, size=128),
        P.BufferAlloc(buf=2, size=128), blobs={h: bytes(blobs[h])})
    _ready(srv)
    status, kind, body = post(srv.port, batch(P.ProgramExec(prog=1, bufs=(1, 2), global_size=(1, 1, 1), wait=True)),
                              session=sid)
    assert (status, kind) == (500, "device") and b"worker process died" in body, body
    assert srv.inline_launches == 0
    # a proven kernel launched with one buffer twice (its parameters are noalias) also goes to a worker
    (h,), blobs = _ok(srv.port, sid, P.Compile(src=src))
    _ok(srv.port, sid, P.ProgramAlloc(prog=2, name=name, datahash=h), blobs={h: bytes(blobs[h])})
    _ok(srv.port, sid, P.ProgramExec(prog=2, bufs=(1, 1), global_size=(1, 1, 1)))
    assert srv.inline_launches == 0
    _ok(srv.port, sid, P.ProgramExec(prog=2, bufs=(1, 2), global_size=(1, 1, 1)))
    assert srv.inline_launches == 1


ELEMENTWISE = "x: f32[N]\na: f32[N]\nb: f32\nreturn square(relu(a * x + b)) + x.sin()\n"


@needs_cpu
def test_a_kernel_with_fneg_is_proven_and_runs_inline_with_numpy_results(cpu_server, monkeypatch):
    # sin and abs lower to `fneg` (a sign flip: no trap, never an index); an fneg of anything but floats is refused
    (src,) = _sources(ELEMENTWISE, {"N": 64})
    assert "fneg float" in src and _proof(src) is not None
    assert _proof(_edit(src, "fneg float", "fneg i32")) is None
    assert _proof(_edit(src, "fneg float %v5", "fneg float %data1")) is None  # (a pointer where a value goes)
    import tgc
    _use_server_without_token(monkeypatch, cpu_server.port)
    try:
        rng = np.random.default_rng(1)
        prog = tgc.loads(ELEMENTWISE)
        before = cpu_server.inline_launches
        for _ in range(4):  # (new inputs each run: the same request text but for its blob ids)
            x, a = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
            b = np.float32(rng.standard_normal())
            out = prog.run(device="REMOTE", x=x, a=a, b=b)["out0"]
            np.testing.assert_allclose(out, np.maximum(a * x + b, 0) ** 2 + np.sin(x), rtol=1e-5, atol=1e-5)
        assert cpu_server.inline_launches == before + 4
    finally:
        _drop_remote_instances()


ARGMAX = "x: f32[N, K]\nreturn argmax(x, axis=1)\n"


@needs_cpu
def test_a_kernel_with_integer_max_is_proven_and_runs_inline_with_numpy_results(cpu_server, monkeypatch):
    # argmax lowers to `llvm.smax` (no trap, no poison of its own): proven, its result an unknown value, so an
    # index computed by it is refused
    (src,) = _sources(ARGMAX, {"N": 8, "K": 8})
    assert "@llvm.smax" in src and _proof(src) is not None
    (ew,) = _sources(ELEMENTWISE, {"N": 64})
    gep = "%v2 = getelementptr inbounds float, ptr %data1, i32 %r0"
    hostile = _edit(_edit(ew, gep, "%vx = call i32 @llvm.smax.i32(i32 %r0, i32 0)\n  "
                                   "%v2 = getelementptr inbounds float, ptr %data1, i32 %vx"),
                    "define void", "declare i32 @llvm.smax.i32(i32, i32)\n\ndefine void")
    assert _proof(hostile) is None
    import tgc
    _use_server_without_token(monkeypatch, cpu_server.port)
    try:
        rng = np.random.default_rng(2)
        prog = tgc.loads(ARGMAX)
        before = cpu_server.inline_launches
        for _ in range(3):
            x = rng.standard_normal((8, 8)).astype(np.float32)
            np.testing.assert_array_equal(prog.run(device="REMOTE", x=x)["out0"], np.argmax(x, axis=1))
        assert cpu_server.inline_launches == before + 3
    finally:
        _drop_remote_instances()


def _affine_graph(srv, sid: str, n: int = 16) -> None:
    """Session `sid`: `x * 2 + 1` over n floats as program 1 (proven short), buffers 1 (out) and 2 (x), and graph 1
    launching it on them."""
    import tgc
    (k,) = tgc.loads("x: f32[N]\nreturn x * 2.0 + 1.0\n").compile(device="CPU", dims={"N": n})
    assert _proof(k.src) is not None
    (h,), blobs = _ok(srv.port, sid, P.Compile(src=k.src))
    _ok(srv.port, sid, P.ProgramAlloc(prog=1, name=k.name, datahash=h), P.BufferAlloc(buf=1, size=4 * n),
        P.BufferAlloc(buf=2, size=4 * n), blobs={h: bytes(blobs[h])})
    _ok(srv.port, sid, P.GraphAlloc(graph=1, kernels=(P.GraphKernel(prog=1, bufs=(1, 2), global_size=(1, 1, 1)),)))


def _affine_run(srv, sid: str, x: np.ndarray) -> np.ndarray:
    data = x.tobytes()
    h = P.blob_id(data)
    results, blobs = _ok(srv.port, sid, P.CopyIn(buf=2, datahash=h), P.GraphExec(graph=1, wait=True),
                         P.CopyOut(buf=1), blobs={h: data})
    return np.frombuffer(blobs[results[-1]], np.float32)


@needs_cpu
def test_a_kept_graphs_launch_check_is_reused_only_for_the_very_buffers_and_program_it_checked(cpu_server):
    srv, sid, rng = cpu_server, "checked-once-0123456789", np.random.default_rng(3)
    _affine_graph(srv, sid)
    for _ in range(3):  # (checked once, then reused: new inputs each run, numpy's results)
        x = rng.standard_normal(16).astype(np.float32)
        np.testing.assert_allclose(_affine_run(srv, sid, x), x * 2 + 1, rtol=1e-6)
    assert srv.inline_launches == 3
    session = srv.sessions[sid]
    assert len(session.checked) == 1
    # buffer 2 freed and made again smaller under the same number: the graph's launch is checked again and refused
    _ok(srv.port, sid, P.BufferFree(buf=2), P.BufferAlloc(buf=2, size=32))
    status, kind, body = post(srv.port, batch(P.GraphExec(graph=1, wait=True)), session=sid)
    assert (status, kind) == (400, "protocol") and b"buffer 2 has 32 bytes" in body, body
    # ... and again at its size: a fresh check, and the launch reads the new buffer
    _ok(srv.port, sid, P.BufferFree(buf=2), P.BufferAlloc(buf=2, size=64))
    x = rng.standard_normal(16).astype(np.float32)
    np.testing.assert_allclose(_affine_run(srv, sid, x), x * 2 + 1, rtol=1e-6)
    # the program freed: the launch is refused, not served from what was checked before
    _ok(srv.port, sid, P.ProgramFree(prog=1))
    status, kind, body = post(srv.port, batch(P.GraphExec(graph=1, wait=True)), session=sid)
    assert (status, kind) == (404, "session") and b"no program 1" in body, body
    # a freed graph forgets its checks
    _ok(srv.port, sid, P.GraphFree(graph=1))
    assert session.checked == {}
    assert srv.inline_launches == 4


@needs_cpu
def test_another_sessions_kept_graph_is_checked_on_its_own(cpu_server):
    srv, rng = cpu_server, np.random.default_rng(4)
    _affine_graph(srv, "first-session-0123456789")
    x = rng.standard_normal(16).astype(np.float32)
    np.testing.assert_allclose(_affine_run(srv, "first-session-0123456789", x), x * 2 + 1, rtol=1e-6)
    # the same requests in another session whose buffer 1 is too small: refused there, though the first session's
    # launch of the same text was checked and kept
    other = "second-session-0123456789"
    _affine_graph(srv, other, n=16)
    _ok(srv.port, other, P.BufferFree(buf=1), P.BufferAlloc(buf=1, size=16))
    status, kind, body = post(srv.port, batch(P.GraphExec(graph=1, wait=True)), session=other)
    assert (status, kind) == (400, "protocol") and b"buffer 1 has 16 bytes" in body, body
    assert srv.sessions[other].checked == {}
    x = rng.standard_normal(16).astype(np.float32)  # (the first session's kept check still serves it)
    np.testing.assert_allclose(_affine_run(srv, "first-session-0123456789", x), x * 2 + 1, rtol=1e-6)
    assert srv.inline_launches == 2


# hostile spellings LLVM reads otherwise than a line-by-line reading would; IDX: an element index into the kernel's
# one buffer of 4 bytes (0: inside it, 1000: far past it)
_SPELLINGS = {
    "an instruction split across lines":
        "entry:\n  %g = getelementptr inbounds float,\n      ptr %data0,\n   i32 IDX\n"
        "  store float 1.0, ptr %g, align 4\n  ret void",
    "a constant expression LLVM folds":
        "entry:\n  %g = getelementptr inbounds float, ptr %data0, i32 add (i32 IDX, i32 0)\n"
        "  store float 1.0, ptr %g, align 4\n  ret void",
    "odd whitespace":
        "entry:\n\t%i\t=\tadd   i32\t%core_id ,IDX\n  %g = getelementptr inbounds float, ptr %data0, i32 %i\n"
        "  store float 1.0, ptr %g , align 4\n  ret void",
    "a comment hiding text":
        "entry:\n  %i = add i32 %core_id, IDX ; %i = add i32 %core_id, 0\n"
        "  %g = getelementptr inbounds float, ptr %data0, i32 %i\n  store float 1.0, ptr %g, align 4\n  ret void",
    "a hexadecimal literal":
        "entry:\n  %g = getelementptr inbounds float, ptr %data0, i32 u0xHEX\n"
        "  store float 1.0, ptr %g, align 4\n  ret void",
}


@needs_cpu
def test_the_proof_reads_llvms_print_of_a_hostile_spelling():
    """The proof reads LLVM's print of the module it parsed (one instruction a line, LLVM's spelling, the source's
    comments and blanks gone), not the client's text: each spelling above is proven where its index is inside the
    buffer and refused where it is not, as LLVM read it (the print shows the index LLVM will compile)."""
    from tgc.backends.llvm_compile import COMPILER
    for what, body in _SPELLINGS.items():
        for idx, inside in ((0, True), (1000, False)):
            src = _kernel(body.replace("IDX", str(idx)).replace("HEX", f"{idx:X}"), 4)
            printed = COMPILER.printed(src)
            assert re.search(rf"getelementptr inbounds float, ptr %data0, i32 (%i|{idx})\n", printed), (what, printed)
            assert f"add i32 %core_id, {idx}\n" in printed or "%i" not in printed, (what, printed)
            assert (_proof(src) is not None) == inside, (what, idx)


@needs_cpu
def test_constant_expressions_attributes_and_layouts_are_read_as_llvm_printed_them():
    from tgc.backends.llvm_compile import COMPILER
    store = "entry:\n  %g = getelementptr inbounds T, ptr %data0, i32 IDX\n  %v = load T, ptr %gALIGN\n" \
            "  store T %v, ptr %data0, align 4\n  ret void"
    plain = store.replace("T", "i32").replace("ALIGN", ", align 4")
    assert _proof(_kernel(plain.replace("IDX", "1"), 8)) is not None
    # a constant expression LLVM keeps (the kernel's own address as an index): the proof knows no interval of it
    assert _proof(_kernel(plain.replace("IDX", "ptrtoint (ptr @k to i32)"), 8)) is None
    # an alignment the source's own data layout implies (i32 at 64 bytes): LLVM writes it on the load when it
    # parses, keeps it when the compile sets the server's layout, and the print shows it: the second element of a
    # 64-byte aligned buffer is not 64-byte aligned
    layout = 'target datalayout = "e-i32:512"\n'
    for ptr, proven in (("%data0", True), ("%g", False)):
        src = layout + _kernel(store.replace("T", "i32").replace("IDX", "1").replace("ptr %gALIGN", f"ptr {ptr}"), 8)
        printed = COMPILER.printed(src)
        assert f"load i32, ptr {ptr}, align 64" in printed and 'e-i32:512"' not in printed, printed
        assert (_proof(src) is not None) == proven, ptr
    # attributes as LLVM prints them in its groups: an intrinsic's declaration marked `noreturn` gets LLVM's own
    # attributes instead (proven, as LLVM compiles it); a call marked `noreturn` (LLVM would drop what follows it),
    # a kernel with an attribute other than the renderer's: refused
    body = "entry:\n  %x = load double, ptr %data0, align 8\n  %y = call double @llvm.sin.f64(double %x)\n" \
           "  store double %y, ptr %data0, align 8\n  ret void"
    sin = _kernel(body, 8) + "declare double @llvm.sin.f64(double)\n"
    assert _proof(sin) is not None
    marked = _edit(sin, "declare double @llvm.sin.f64(double)", "declare double @llvm.sin.f64(double) #1") \
        + "attributes #1 = { noreturn }\n"
    assert "noreturn" not in COMPILER.printed(marked) and _proof(marked) is not None
    assert _proof(_edit(marked, "(double %x)\n", "(double %x) #1\n")) is None
    # an argument attribute: `noundef` makes a poison argument undefined behaviour (LLVM deleted the whole body of
    # such a kernel), `nofpclass(nan)` a NaN one; plain constants and poison are fine (the result is poison)
    for arg, proven in (("noundef %x", False), ("noundef poison", False), ("nofpclass(nan) %x", False),
                        ("poison", True), ("1.5", True)):
        assert (_proof(_edit(sin, "(double %x)", f"(double {arg})")) is not None) == proven, arg
    assert _proof(_edit(sin, "{ nounwind }", '{ nounwind "frame-pointer"="all" }')) is None
    assert _proof(_edit(sin, "{ nounwind }", "{ nounwind noreturn }")) is None
    for width, proven in (("512", True), ("256", True), ("99999999999999999999", False), ("0", False)):
        assert (_proof(_edit(sin, "{ nounwind }", f'{{ nounwind "prefer-vector-width"="{width}" }}')) is not None) \
            == proven, width
    # numbered values are LLVM's own spelling; an entry block without a name (LLVM prints no label) is refused
    numbered = "entry:\n  %0 = add i32 %core_id, 0\n  %1 = getelementptr inbounds float, ptr %data0, i32 %0\n" \
               "  store float 1.0, ptr %1, align 4\n  ret void"
    assert _proof(_kernel(numbered, 4)) is not None
    assert _proof(_kernel(numbered.replace("entry:\n", ""), 4)) is None


@needs_cpu
def test_text_llvm_refuses_is_not_proven_and_raises_nothing():
    from tgc.backends.remote.shortproof import prove_printed
    plain = "entry:\n  store float 2.0, ptr %data0, align 4\n  ret void"
    assert _proof(_kernel(plain, 4)) is not None
    contract = parse_contract(_kernel(plain, 4), "llvm").contract
    for bad in ("entry:\n  store float 2.0, ptr %nowhere, align 4\n  ret void",  # an undefined value
                "entry:\n  store i32 2.0, ptr %data0, align 4\n  ret void",  # a type error
                "entry:\n  store float 2.0, ptr %data0, align 4\n",  # a block without a terminator (the verifier)
                "entry:\n  %x = add i32 %x, 1\n  ret void",  # a value that uses itself (the verifier)
                "entry:\n  store float 2.0, ptr %data0, align 4\n  ret void\n}\n}"):
        assert _proof(_kernel(bad, 4)) is None, bad
    for text in ("", "}", "define", "\x00", "attributes #0 = {", _kernel(plain, 4) * 2):
        assert prove_short(text, contract) is None and prove_printed(text, contract) is None, text


@needs_cpu
def test_a_server_proves_the_module_it_compiled(cpu_server):
    """The server's compile worker returns the object and LLVM's print of the very module it compiled; the proof
    reads that print: a kernel whose index is split across lines is proven and runs inline (its result read back),
    the same with an index past the buffer is not."""
    from tgc.backends.llvm_compile import COMPILER
    body = _SPELLINGS["an instruction split across lines"].replace("1.0", "2.5")
    src = _kernel(body.replace("IDX", "0"), 4)
    lib, printed = COMPILER.compile_printed(src)
    assert lib == COMPILER.compile(src) and printed == COMPILER.printed(src)
    srv, sid = cpu_server, "split-index-0123456789"
    _load(srv.port, sid, src, "k")
    _ready(srv)
    results, blobs = _ok(srv.port, sid, P.ProgramExec(prog=1, bufs=(1,), global_size=(1, 1, 1), wait=True),
                         P.CopyOut(buf=1))
    assert np.frombuffer(blobs[results[-1]], np.float32)[0] == 2.5
    assert srv.inline_launches == 1
    far = _kernel(body.replace("IDX", "1000"), 4)
    _ok(srv.port, sid, P.Compile(src=far))
    assert srv._compiled[P.digest(src.encode())][2] is True
    assert srv._compiled[P.digest(far.encode())][2] is False
