"""Heads written `C // D` (a floor division of a dim by a dim) or `C // 4` (by a constant) compile for every size
where the division is exact: the class is narrowed to C a multiple of D, traced with C as a hidden dim C_D times
D (`Program._with_multiples`, `SymbolicPlan.multiples`), so `C // D` is C_D, exact. Checked against numpy at
sizes in the class (smallest, odd multiples, larger); sizes outside it run size-specialized kernels with the
reason; packages refuse such a class (they do not record the constraint) and the program cache skips it."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc import progcache
from tgc.api import _device
from tgc.baselines.numpy_eval import numpy_program
from tgc.engine.compare import compare
from tgc.engine.inputs import random_inputs
from tgc.errors import TgcError
from tgc.package import build_symbolic

# heads of a dim D: C // D of them (llama's `reshape(h @ wq, (B, T, C // D, D))`)
HEADS_DIM = """
x: f32[T, C]
cos: f32[T, D]
wq: f32[C, C]
q = permute(reshape(x @ wq, (T, C // D, D)) * reshape(cos, (T, 1, D)), (1, 0, 2))
s = softmax(q @ q.transpose(-2, -1) * rsqrt(cast(D, f32)), axis=-1)
return reshape(permute(s @ q, (1, 0, 2)), (T, C))
"""

# a constant number of heads (gpt2's `C // 12`): C a multiple of 4
HEADS_CONST = """
x: f32[T, C]
w: f32[C, C]
q = permute(reshape(x @ w, (T, 4, C // 4)), (1, 0, 2))
s = softmax(q @ q.transpose(-2, -1), axis=-1)
return reshape(permute(s @ q, (1, 0, 2)), (T, C)) + x
"""

# grouped heads: H = C // D heads, each group of H // KH sharing one of KH (a quotient of a quotient)
HEADS_NESTED = """
x: f32[T, C]
kv: f32[T, KH, D]
H = C // D
q = reshape(x, (T, H, D))
k = repeat(kv, H // KH, axis=1)
return reshape(q * k, (T, C))
"""

# vit's patches as a reshape: IMG // P patches a side
PATCHES = """
x: f32[B, IMG, IMG]
w: f32[P, P, C]
n = IMG // P
t = permute(reshape(x, (B, n, P, n, P)), (0, 1, 3, 2, 4))
return reshape(t, (B, n * n, P * P)) @ reshape(w, (P * P, C))
"""


def _run(prog: tgc.Program, dims: dict[str, int]) -> str:
    """Run symbolically at `dims`, check against numpy, and say which kernels ran (`Program.last_run`)."""
    inputs = random_inputs(prog, dims, seed=sum(dims.values()))
    got = prog.run("CPU", dims=dims, symbolic=True, **inputs)
    want = numpy_program(prog, dims)(inputs)
    for name in prog.output_names:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        assert g.shape == w.shape, (dims, name)
        bad, _ = compare(name, g, w, "f32")
        assert bad is None, f"{dims}: {bad.describe()}"
    return prog.last_run


def test_heads_of_a_dim_compile_for_c_a_multiple_of_d():
    prog = tgc.loads(HEADS_DIM)
    plan = prog.compile_symbolic("CPU")
    assert plan.multiples == [("C", "D", "C_D")]
    assert plan.class_text() == "T >= 2, C >= 2, D >= 2, with C a multiple of D (C // D >= 2 and no multiple of 32)"
    first, then = prog.symbolic_paths[("CPU", (("T", "n"), ("C", "n"), ("D", "n")))].split("; with ")
    assert first == "probes: the size decision C // D depends on the dims' values"
    assert then == "C a multiple of D (C // D >= 2 and no multiple of 32): one trace"
    tf = plan.trusted_from
    # every dim and C // D at least `trusted_from`: the class's kernels, no trace; odd and even multiples
    for t, q, d in [(tf, tf, tf), (tf + 2, tf + 4, tf), (tf + 1, tf, 2 * tf + 1), (33, 3 * tf, 40)]:
        assert _run(prog, {"T": t, "C": q * d, "D": d}) == "symbolic", (t, q, d)
    # the smallest sizes of the class: checked with the source, right either way
    assert _run(prog, {"T": 2, "C": 4, "D": 2}).split(":")[0] in ("symbolic", "specialized")


def test_sizes_outside_the_multiple_are_refused_with_the_constraint():
    prog = tgc.loads(HEADS_DIM)
    plan = prog.compile_symbolic("CPU")
    exe, why = plan.bind(prog, {"T": 9, "C": 50, "D": 8})  # (the program itself cannot reshape there)
    assert exe is None and why.startswith("C = 50 is not a multiple of D = 8: the symbolic kernels were compiled "
                                          "for T >= 2, C >= 2, D >= 2, with C a multiple of D")
    exe, why = plan.bind(prog, {"T": 9, "C": 9, "D": 9})  # one head: C // D = 1, outside class n
    assert exe is None and why.startswith("C // D = 1 is outside the symbolic kernels' class")
    exe, why = plan.bind(prog, {"T": 9, "C": 9 * 64, "D": 9})  # C // D = 64: a multiple of 32
    assert exe is None and why.startswith("C // D = 64 is outside")
    # a run there is size-specialized, says why, and is right
    assert _run(prog, {"T": 5, "C": 7, "D": 7}).startswith("specialized: C // D = 1 is outside")
    # a caller's dim named like the hidden one changes nothing (C is the caller's, C_D computed from it)
    dims = {"T": 9, "C": 81, "D": 9}
    inputs = random_inputs(prog, dims, seed=3)
    want = prog.run("CPU", dims=dims, **inputs)["out0"]
    for symbolic in (False, True):
        got = prog.run("CPU", dims={**dims, "C_D": 3}, symbolic=symbolic, **inputs)["out0"]
        assert got.shape == want.shape and compare("out0", got, want, "f32")[0] is None
    # and a class whose C is a multiple of 32 is its own class, where no multiple is added: specialized
    assert _run(prog, {"T": 3, "C": 96, "D": 3}).startswith("specialized: no kernels valid for every size")


def test_constant_heads_and_heads_of_heads():
    prog = tgc.loads(HEADS_CONST)
    plan = prog.compile_symbolic("CPU")
    assert plan.multiples == [("C", 4, "C_4")]
    tf = plan.trusted_from
    for t, q in [(tf, tf), (tf + 3, tf + 2), (17, 45)]:
        assert _run(prog, {"T": t, "C": 4 * q}) == "symbolic"
    assert plan.bind(prog, {"T": 9, "C": 4 * tf + 2})[1].startswith("C = 38 is not a multiple of 4:") or tf != 9
    prog = tgc.loads(HEADS_NESTED)
    plan = prog.compile_symbolic("CPU")
    assert plan.multiples == [("C", "D", "C_D"), ("C_D", "KH", "C_D_KH")]
    assert "C // D a multiple of KH (C // D // KH >= 2" in plan.class_text()
    tf = plan.trusted_from
    for t, g, kh, d in [(tf, tf, tf, tf), (tf + 1, tf + 2, tf, tf + 3)]:
        assert _run(prog, {"T": t, "C": g * kh * d, "KH": kh, "D": d}) == "symbolic"
    why = plan.bind(prog, {"T": tf, "C": 3 * tf * tf, "KH": 2 * tf, "D": tf})[1]
    assert why.startswith(f"C // D = {3 * tf} is not a multiple of KH = {2 * tf}")


def test_packages_and_the_cache_do_not_keep_the_constraint(tmp_path, monkeypatch):
    prog = tgc.loads(HEADS_DIM)
    with pytest.raises(TgcError, match="need T >= 2, C >= 2, D >= 2, with C a multiple of D .* which symbolic "
                                       "packages do not record"):
        build_symbolic(prog, _device("CPU"))
    plan = prog.compile_symbolic("CPU")
    assert not progcache.store_symbolic(prog, _device("CPU"), {"T": 9, "C": 81, "D": 9}, plan)


def test_a_taken_name_keeps_todays_error():
    # a dim already named C_D: no hidden dim of that name, the class keeps its reason
    prog = tgc.loads(HEADS_DIM.replace("x: f32[T, C]", "x: f32[T, C]\ny: f32[C_D]"))
    with pytest.raises(TgcError, match="no kernels valid for every size"):
        prog.compile_symbolic("CPU")


def test_hidden_dims_are_resolved_whatever_order_they_were_made_in():
    # (`_hidden` is the program's, shared by its classes: a class of D = 1 may make D_2 before another makes C_D)
    prog = tgc.loads("x: f32[N]\nreturn x")
    prog._hidden = {"D_2": ("D", 2), "C_D": ("C", "D"), "C_D_KH": ("C_D", "KH")}
    assert prog._program_dims({"C_D": 3, "D_2": 5, "B": 1}) == {"B": 1, "D": 10, "C": 30}
    assert prog._program_dims({"C_D_KH": 3, "KH": 2, "D": 7}) == {"KH": 2, "D": 7, "C": 42}
    assert prog._program_dims({"C": 42, "C_D": 99, "D": 7}) == {"C": 42, "D": 7}  # (a caller's C is kept)


def test_patches_of_a_dim():
    prog = tgc.loads(PATCHES)
    plan = prog.compile_symbolic("CPU")
    assert plan.multiples == [("IMG", "P", "IMG_P")]
    tf = plan.trusted_from
    for b, q, p, c in [(tf, tf, tf, tf), (tf + 1, tf + 2, tf, tf + 4), (tf, 3 * tf, tf + 2, 5)]:
        assert _run(prog, {"B": b, "IMG": q * p, "P": p, "C": c}) == "symbolic"
    assert _run(prog, {"B": 2, "IMG": 4, "P": 2, "C": 3}).split(":")[0] in ("symbolic", "specialized")
    assert _run(prog, {"B": 3, "IMG": 5, "P": 5, "C": 3}).startswith("specialized: IMG // P = 1 is outside")


def test_an_input_no_kernel_reads_and_an_empty_class_bind_and_texts_name_the_programs_dims():
    """Review 18: a declared input no kernel reads (shaped in C, not C_D * D), or a class with an empty dim, made
    every bind fail ("dim C is unknown"); a divisor that is itself a quotient was named by its hidden dim `D_2`."""
    prog = tgc.loads("x: f32[T, C]\nw: f32[C]\nd: f32[D]\nreturn sum(reshape(x, (T, C // D, D)), axis=2)\n")
    assert _run(prog, {"T": 3, "C": 15, "D": 5}) == "symbolic"
    assert _run(prog, {"T": 0, "C": 6, "D": 3}) == "symbolic"
    prog = tgc.loads("x: f32[T, D]\ny: f32[T, C]\na = reshape(x, (T, 2, D // 2))\n"
                     "b = reshape(y, (T, C // (D // 2), D // 2))\nreturn sum(a, axis=1), sum(b, axis=1)\n")
    plan = prog.compile_symbolic("CPU")
    assert "C a multiple of (D // 2)" in plan.class_text() and "D_2" not in plan.class_text()
    why = plan.bind(prog, {"T": 3, "C": 8, "D": 6})[1]
    assert why.startswith("C = 8 is not a multiple of (D // 2) = 3") and "D_2" not in why
    assert _run(prog, {"T": 3, "C": 9, "D": 6}) == "symbolic"
