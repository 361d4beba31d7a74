"""Heads written `C // D` (a floor division of a dim by a dim) or `C // 4` (by a constant) compile for every size
where the division is exact: the class is narrowed to C a multiple of D, traced with C as a hidden dim C_D times
D (`Program._with_multiples`, `SymbolicPlan.multiples`), so `C // D` is C_D, exact. Checked against numpy at
sizes in the class (smallest, odd multiples, larger); sizes outside it run size-specialized kernels with the
reason. Symbolic packages (format 5) and the program cache keep such a class with its constraint, checked at
each bind before any size is evaluated."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from test_package_symbolic import _rezip
from test_symbolic_onetrace import _check

import tgc
from tgc import cache, package
from tgc.api import _device
from tgc.codegen import sizes
from tgc.engine.compare import compare
from tgc.engine.inputs import random_inputs
from tgc.errors import TgcError
from tgc.package import PackageError, build_symbolic, loads_package

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
    _check(prog, got, dims, inputs)
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


def test_a_package_records_the_constraint_and_serves_only_its_class(tmp_path):
    prog = tgc.loads(HEADS_DIM)
    path = tmp_path / "heads.tgpkg"
    path.write_bytes(build_symbolic(prog, _device("CPU")))
    pkg = tgc.load_package(path)  # (no Program: the package's own plan, bound at each dims)
    assert pkg.format_version == package.SYMBOLIC_VERSION == 5
    c = pkg.size_class({"T": 9, "C": 81, "D": 9})
    assert c.multiples == [("C", "D", "C_D")] and c.cls == {"T": "n", "C": "n", "D": "n"}
    lo = max(c.min.values())
    for t, q, d in [(lo, lo, lo), (lo + 2, lo + 4, lo), (lo + 1, lo, 2 * lo + 1), (33, 3 * lo, 40)]:
        dims = {"T": t, "C": q * d, "D": d}
        inputs = random_inputs(prog, dims, seed=q + d)
        _check(prog, pkg.run(**inputs), dims, inputs)
        assert pkg.output_types(dims)[0][2] == (t, q * d)
    # outside the constraint: refused with the reason before any size is evaluated, never run
    for dims, why in [({"T": 9, "C": 50, "D": 8}, "C = 50 is not a multiple of D = 8"),
                      ({"T": 9, "C": 9, "D": 9}, r"C_D \(= C // D\) = 1 is outside its class"),
                      ({"T": 9, "C": 9 * 64, "D": 9}, r"C_D \(= C // D\) = 64 is outside its class"),
                      ({"T": 64, "C": 81, "D": 9}, "T = 64 is outside its class")]:
        with pytest.raises(PackageError, match=why) as e:
            pkg.lower("CPU", dims)
        assert e.value.exit_code == 2
        with pytest.raises(PackageError, match=why):
            pkg.run(dims=dims, **random_inputs(prog, dims, seed=1)) if dims["C"] % dims["D"] == 0 else \
                pkg.output_types(dims)
    # and a fresh process running the file from the CLI: right at a size of the class, refused outside
    dims = {"T": lo, "C": lo * (lo + 2), "D": lo + 2}
    inputs = random_inputs(prog, dims, seed=5)
    args = []
    for name, arr in inputs.items():
        np.save(tmp_path / f"{name}.npy", arr)
        args += ["-i", f"{name}={tmp_path / f'{name}.npy'}"]
    run = [sys.executable, "-m", "tgc.cli.main", "run", str(path), *args]
    r = subprocess.run([*run, "-o", str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    _check(prog, {"out0": np.load(tmp_path / "out.npz")["out0"]}, dims, inputs)
    for name, arr in random_inputs(prog, {"T": lo, "C": 50, "D": 8}, seed=1).items():
        np.save(tmp_path / f"{name}.npy", arr)  # (C = 50 heads of D = 8: no size of the class)
    r = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "C = 50 is not a multiple of D = 8" in r.stderr, r.stderr


def test_a_tampered_or_older_package_of_a_narrowed_class_is_refused():
    prog = tgc.loads(HEADS_DIM)
    data = build_symbolic(prog, _device("CPU"))

    def multiples(m: dict, value) -> None:
        for c in m["symbolic"]["classes"]:
            if "multiples" in c:
                if value is None:
                    del c["multiples"]
                else:
                    c["multiples"] = value

    # bytes changed: the checksum
    raw = bytearray(data)
    raw[len(data) // 3] ^= 1
    with pytest.raises(PackageError):
        loads_package(bytes(raw))
    # the manifest rewritten with its hashes made again: its sizes no longer agree with the constraint
    for value in (None, [["C", "T", "C_D"]], [["C", 3, "C_D"]], [["T", "D", "C_D"]], [], [["C", "D", "C"]]):
        with pytest.raises(PackageError, match="not a usable package"):
            loads_package(_rezip(data, lambda m, v=value: multiples(m, v)))
    # a version-4 package has no multiples: one that says so is refused, not read without them
    with pytest.raises(PackageError, match="format version 4 has not"):
        loads_package(_rezip(data, lambda m: m.update(format_version=4)))


def test_the_cache_keeps_a_narrowed_class_and_a_warm_run_compiles_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("TGC_VERIFY_BOUNDS", "DISABLE_COMPILER_CACHE", "BEAM", "NOOPT", "DEBUG"):
        monkeypatch.delenv(name, raising=False)  # (the program cache on: as tests/test_progcache.py's)
    cache._reset_for_tests()
    try:
        lo = tgc.loads(HEADS_DIM).compile_symbolic("CPU").trusted_from
        prog = tgc.loads(HEADS_DIM)  # (its first symbolic run misses the cache, builds the plan and stores it)
        assert _run(prog, {"T": lo, "C": lo * lo, "D": lo}) == "symbolic"
        assert [e["meta"] for e in cache.entries("program")] == ["<string> CPU symbolic C=n D=n T=n, C a multiple of D"]
        warm = tgc.loads(HEADS_DIM)
        called = []
        with monkeypatch.context() as m:
            m.setattr(tgc.api.Program, "_build_symbolic", lambda *a, **k: called.append(a) or "refused")
            for t, q, d in [(lo, lo + 2, lo + 1), (lo + 3, 2 * lo + 1, lo)]:
                assert _run(warm, {"T": t, "C": q * d, "D": d}) == "symbolic"
        assert called == [] and warm._plans == {}  # (the entry's saved plan was bound: nothing traced or built)
        # outside the constraint (one head) the entry serves nothing: the class's plan, built here, says why and
        # size-specialized kernels run; never the entry's kernels
        assert _run(warm, {"T": lo, "C": 9, "D": 9}).startswith("specialized: C // D = 1 is outside")
    finally:
        cache._reset_for_tests()


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


def test_kernel_names_of_a_narrowed_class_read_as_the_programs_dims():
    # (review 18: `r_T_223_D_50621`, the probe values of C_D and of C_D * D) C where the size is C_D * D, the
    # quotient spelled `CdD` (`C_D` would read as two sizes: names separate sizes by `_`), as `Nd32` is N // 32
    names = {src: [k.name for k in tgc.loads(src).compile_symbolic("CPU").kernels]
             for src in (HEADS_DIM, HEADS_CONST, PATCHES)}
    assert names[HEADS_DIM] == ["r_T_CdD_D_C", "attn_r_CdD_T_D_T_D_T_D_T_D", "E_T_C"]
    assert names[HEADS_CONST] == ["r_T_C_C", "attn_r_4_T_Cd4_T_Cd4_T_Cd4_T_Cd4", "E_T_C"]
    assert names[PATCHES] == ["r_B_IMGdPIMGdP_C_PP"]
    # the probe path's names (a narrowed class the one trace refuses): the same spelling from the probe values
    hidden = {"C_D": ("C", "D"), "C_D_KH": ("C_D", "KH")}
    probe = {"T": 211, "C_D_KH": 223, "KH": 227, "D": 229}
    name = f"r_211_223_{223 * 227}_{223 * 227 * 229}_{2 * 223 * 227}_229"
    assert sizes.symbolic_name(name, probe, list(probe), hidden) == "r_T_CdDdKH_CdD_C_2CdD_D"


def test_heads_of_a_reshape_to_minus_one_are_narrowed_as_c_over_d():
    # `reshape(x, (T, -1, D))`: the -1 is C // D (the shared T cancelled, `tensor._uncommon`), recorded as the
    # spelled division is, so the class narrows the same way (it had no plan: "cannot reshape ... (T, -1, D)")
    prog = tgc.loads(HEADS_DIM.replace("(T, C // D, D)", "(T, -1, D)"))
    plan = prog.compile_symbolic("CPU")
    assert plan.multiples == [("C", "D", "C_D")]
    assert plan.class_text() == "T >= 2, C >= 2, D >= 2, with C a multiple of D (C // D >= 2 and no multiple of 32)"
    assert [k.name for k in plan.kernels] == ["r_T_CdD_D_C", "attn_r_CdD_T_D_T_D_T_D_T_D", "E_T_C"]
    tf = plan.trusted_from
    for t, q, d in [(tf, tf, tf), (tf + 2, tf + 4, tf), (tf + 1, tf, 2 * tf + 1)]:
        assert _run(prog, {"T": t, "C": q * d, "D": d}) == "symbolic", (t, q, d)
    exe, why = plan.bind(prog, {"T": 9, "C": 50, "D": 8})
    assert exe is None and why.startswith("C = 50 is not a multiple of D = 8: the symbolic kernels were compiled "
                                          "for T >= 2, C >= 2, D >= 2, with C a multiple of D")
    assert _run(prog, {"T": 5, "C": 7, "D": 7}).startswith("specialized: C // D = 1 is outside")
    # a -1 that is a product divided (T * C // D: [T, C] to (-1, D)) narrows nothing, as spelled: no plan
    prog = tgc.loads("x: f32[T, C]\nw: f32[D]\nreturn reshape(x, (-1, D)) * w")
    with pytest.raises(TgcError, match="no kernels valid for every size"):
        prog.compile_symbolic("CPU")
    assert prog.symbolic_paths[("CPU", (("T", "n"), ("C", "n"), ("D", "n")))] == \
        "probes: the size decision CT // D depends on the dims' values"


def test_heads_at_a_width_that_is_a_multiple_of_32_run_on_the_narrowed_class():
    """A new-user trial: C = 64 of D = 8 heads (C of class 32n, which has no plan) fell back to size-specialized
    kernels, though C_D = 8 and D = 8 are the narrowed class-n plan's (a package of it served them)."""
    prog = tgc.loads(HEADS_DIM)
    assert _run(prog, {"T": 5, "C": 64, "D": 8}) == "symbolic"
    assert _run(prog, {"T": 7, "C": 96, "D": 12}) == "symbolic"
    assert _run(prog, {"T": 5, "C": 96, "D": 3}).startswith("specialized")  # (C // D = 32: outside the class)
