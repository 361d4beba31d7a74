"""Narrowed classes whose hidden dims are multiples of 32 (issue 21): heads of 64 (C = 768, D = 64: C // D = 12 of
class n, D of 32n; C = 2048: both 32n), rotary halves `D // 2` at D = 64 (D_2 = 32) and constant heads `C // 12`
at C = 384 (C_12 = 32) run on kernels compiled for the hidden dims' own classes (`Program._narrowed_for`), checked
against numpy, in memory, from a package and from the program cache; dims whose hidden dims are outside those
classes are refused with the reason (size-specialized kernels run, or a package exits 2)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from test_package_symbolic import _rezip
from test_symbolic_multiples import HEADS_DIM, _run
from test_symbolic_onetrace import _check

import tgc
from tgc import cache
from tgc.api import _device
from tgc.engine.inputs import random_inputs
from tgc.package import PackageError, build_symbolic, loads_package

# llama's rotary halves of each head: `D // 2` within heads of D (C // D of them)
ROTARY = """
x: f32[T, C]
cos: f32[T, D]
q = reshape(x, (T, C // D, D))
r = q * reshape(cos, (T, 1, D)) + cat(-q[..., D // 2:], q[..., :D // 2], axis=-1)
return reshape(r, (T, C))
"""

# gpt2's 12 heads of a width C
HEADS_12 = """
x: f32[T, C]
w: f32[C, C]
q = permute(reshape(x @ w, (T, 12, C // 12)), (1, 0, 2))
s = softmax(q @ q.transpose(-2, -1), axis=-1)
return reshape(permute(s @ q, (1, 0, 2)), (T, C)) + x
"""


def _hidden(prog: tgc.Program) -> list[tuple]:
    """The hidden classes of the narrowed plans built for dims of 32n classes (their plans, not why none)."""
    return [cls for (_, cls), p in prog._narrowed.items() if not isinstance(p, str)]


def test_heads_of_a_divisor_of_class_32n_run_symbolically():
    prog = tgc.loads(HEADS_DIM)
    # C = 768, D = 64 (gpt2's heads of 64), smaller widths of the same classes, and C // D of class 32n too
    for dims in [{"T": 9, "C": 768, "D": 64}, {"T": 9, "C": 9 * 32, "D": 32}, {"T": 11, "C": 13 * 64, "D": 64},
                 {"T": 33, "C": 2048, "D": 64}]:
        assert _run(prog, dims) == "symbolic", dims
    assert _hidden(prog) == [(("T", "n"), ("C_D", "n"), ("D", "32n")), (("T", "n"), ("C_D", "32n"), ("D", "32n"))]
    plan = prog._narrowed[("CPU", (("T", "n"), ("C_D", "n"), ("D", "32n")))]
    assert plan.class_text() == ("T >= 2, C a multiple of 32, D a multiple of 32, with C a multiple of D "
                                 "(C // D >= 2 and no multiple of 32)")
    # the plan's own checks: X no multiple of Y, or hidden dims of another class, refused before any size is used
    for dims, why in [({"T": 9, "C": 96, "D": 64}, "C = 96 is not a multiple of D = 64"),
                      ({"T": 9, "C": 64, "D": 64}, "C // D = 1 is outside"),
                      ({"T": 9, "C": 2048, "D": 64}, "C // D = 32 is outside"),
                      ({"T": 9, "C": 81, "D": 9}, "these sizes are outside"),
                      ({"T": 64, "C": 768, "D": 64}, "these sizes are outside")]:
        exe, got = plan.bind(prog, dims)
        assert exe is None and got.startswith(why), (dims, got)
    # runs outside every narrowed class: size-specialized, with the reasons, and right
    assert _run(prog, {"T": 9, "C": 64, "D": 64}).startswith("specialized: no kernels valid for every size")
    why = _run(prog, {"T": 9, "C": 96, "D": 3})  # (C // D = 32 of D = 3: that class has no plan)
    assert why.startswith("specialized:") and "narrowed: with C a multiple of D, C // D a multiple of 32" in why


def test_rotary_halves_and_constant_heads_at_multiples_of_32():
    prog = tgc.loads(ROTARY)
    for dims in [{"T": 9, "C": 9 * 64, "D": 64}, {"T": 10, "C": 7 * 128, "D": 128}]:
        assert _run(prog, dims) == "symbolic", dims
    assert _hidden(prog) == [(("T", "n"), ("C_D", "n"), ("D_2", "32n"))]
    plan = prog._narrowed[("CPU", _hidden(prog)[0])]
    assert "D a multiple of 2 (D // 2 a multiple of 32)" in plan.class_text()
    assert plan.bind(prog, {"T": 9, "C": 9 * 96, "D": 96})[1].startswith("D // 2 = 48 is outside")
    prog = tgc.loads(HEADS_12)
    for dims in [{"T": 33, "C": 384}, {"T": 40, "C": 768}]:
        assert _run(prog, dims) == "symbolic", dims
    assert _hidden(prog) == [(("T", "n"), ("C_12", "32n"))]
    plan = prog._narrowed[("CPU", _hidden(prog)[0])]
    assert plan.bind(prog, {"T": 33, "C": 12 * 33})[1].startswith("C // 12 = 33 is outside")
    assert plan.bind(prog, {"T": 33, "C": 32 * 13})[1].startswith("C = 416 is not a multiple of 12")


def test_a_package_holds_the_32n_narrowed_classes_and_checks_them(tmp_path):
    prog = tgc.loads(HEADS_DIM)
    data = build_symbolic(prog, _device("CPU"))
    pkg = loads_package(data)
    hidden = [c.hidden for c in pkg.classes if c.multiples]
    assert {"T": "n", "C_D": "n", "D": "32n"} in hidden
    for dims in [{"T": 9, "C": 768, "D": 64}, {"T": 40, "C": 9 * 32, "D": 32}]:
        inputs = random_inputs(prog, dims, seed=dims["C"])
        _check(prog, pkg.run(**inputs), dims, inputs)
        assert pkg.size_class(dims).hidden["D"] == "32n"
    # outside: refused with the reason, before any size is evaluated
    for dims, why in [({"T": 9, "C": 96, "D": 3}, r"C_D \(= C // D\) = 32 is outside its class"),
                      ({"T": 9, "C": 64, "D": 64}, r"C_D \(= C // D\) = 1 is outside its class"),
                      ({"T": 64, "C": 768, "D": 64}, "T = 64 is outside its class"),
                      ({"T": 1, "C": 768, "D": 64}, "D = 64 is outside its class"),  # (T = 1: no 32n variant)
                      # (the 32n variant's reason, not that of the class n whose rules C = 224, D = 32 also fit)
                      ({"T": 6, "C": 224, "D": 32}, "T = 6 is outside the class's sizes 7..[0-9]+, so"),
                      ({"T": 7, "C": 192, "D": 32}, r"C_D \(= C // D\) = 6 is outside the class's sizes 7\."),
                      ({"T": 9, "C": 800, "D": 64}, "C = 800 is not a multiple of D = 64")]:
        with pytest.raises(PackageError, match=why) as e:
            pkg.lower("CPU", dims)
        assert e.value.exit_code == 2

    def hidden_of(m: dict, value) -> None:
        for c in m["symbolic"]["classes"]:
            if "hidden" in c:
                if value is None:
                    del c["hidden"]
                else:
                    c["hidden"] = {**c["hidden"], **value}

    # a manifest whose hidden classes were removed or changed (hashes made again): not a usable package
    for value in (None, {"D": "n"}, {"C_D": "32n"}, {"C_D": "1"}, {"X": "n"}, {"D": 32}):
        with pytest.raises(PackageError, match="not a usable package"):
            loads_package(_rezip(data, lambda m, v=value: hidden_of(m, v)))
    # and a fresh process running the file from the CLI: right at C = 768, D = 64
    path = tmp_path / "heads.tgpkg"
    path.write_bytes(data)
    dims = {"T": 9, "C": 768, "D": 64}
    inputs = random_inputs(prog, dims, seed=7)
    args = []
    for name, arr in inputs.items():
        np.save(tmp_path / f"{name}.npy", arr)
        args += ["-i", f"{name}={tmp_path / f'{name}.npy'}"]
    r = subprocess.run([sys.executable, "-m", "tgc.cli.main", "run", str(path), *args, "-o",
                        str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    _check(prog, {"out0": np.load(tmp_path / "out.npz")["out0"]}, dims, inputs)


def test_the_cache_keeps_the_32n_narrowed_plans_of_a_class(monkeypatch, tmp_path):
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("TGC_VERIFY_BOUNDS", "DISABLE_COMPILER_CACHE", "BEAM", "NOOPT", "DEBUG"):
        monkeypatch.delenv(name, raising=False)
    cache._reset_for_tests()
    try:
        prog = tgc.loads(HEADS_DIM)
        assert _run(prog, {"T": 9, "C": 768, "D": 64}) == "symbolic"
        assert [e["meta"] for e in cache.entries("program")] == \
            ["<string> CPU symbolic C=32n D=32n T=n, C a multiple of D"]
        warm = tgc.loads(HEADS_DIM)
        called = []
        with monkeypatch.context() as m:
            m.setattr(tgc.api.Program, "_build_symbolic", lambda *a, **k: called.append(a) or "refused")
            m.setattr(tgc.api.Program, "_build_symbolic_bounded", lambda *a, **k: called.append(a) or "refused")
            for dims in [{"T": 9, "C": 768, "D": 64}, {"T": 12, "C": 11 * 32, "D": 32}]:
                assert _run(warm, dims) == "symbolic", dims
            assert called == [] and warm._plans == {} and warm._narrowed == {}
            # dims of the class the entry does not hold (C // D = 1): the cold path, which says why
            assert _run(warm, {"T": 9, "C": 64, "D": 64}).startswith("specialized")
            # the class's failure text kept from that run does not hide the entry from its later runs (no rebuild)
            called.clear()
            assert _run(warm, {"T": 9, "C": 768, "D": 64}) == "symbolic" and called == []
    finally:
        cache._reset_for_tests()


# heads of heads: a quotient of a quotient (C // D // KH), its middle quotient C_D replaced by C_D_KH
QUOTIENT_OF_QUOTIENT = """
x: f32[T, C]
k: f32[KH, D]
q = reshape(x, (T, C // D // KH, KH, D)) * reshape(k, (1, KH, D))
return sum(q, axis=2)
"""


def test_a_package_of_a_quotient_of_a_quotient_holds_its_32n_classes():
    # the loader derives the middle quotient's class (C_D, which `hidden` does not name) from the later multiple
    prog = tgc.loads(QUOTIENT_OF_QUOTIENT)
    data = build_symbolic(prog, _device("CPU"))
    pkg = loads_package(data)
    for dims, hidden in [({"T": 4, "C": 3 * 32 * 5, "KH": 32, "D": 5}, {"C_D_KH": "n", "KH": "32n", "D": "n"}),
                         ({"T": 3, "C": 32 * 3 * 32, "KH": 3, "D": 32}, {"C_D_KH": "32n", "KH": "n", "D": "32n"}),
                         ({"T": 5, "C": 3 * 5 * 7, "KH": 5, "D": 7}, {"C_D_KH": "n", "KH": "n", "D": "n"})]:
        inputs = random_inputs(prog, dims, seed=dims["C"])
        _check(prog, pkg.run(**inputs), dims, inputs)
        assert {n: pkg.size_class(dims).hidden[n] for n in hidden} == hidden, dims
        # the middle quotient's class in the text: C // D = 96 of 32n, where KH or C // D // KH is
        middle = "no multiple" if dims["C"] == 105 else "a multiple"
        assert f"C_D (= C // D) {middle} of 32, and C // D a multiple of KH" in pkg.size_class(dims).text()
    for dims, why in [({"T": 4, "C": 160, "KH": 32, "D": 5}, r"C_D_KH \(= C // D // KH\) = 1 is outside"),
                      ({"T": 4, "C": 161, "KH": 32, "D": 5}, "C = 161 is not a multiple of D = 5")]:
        with pytest.raises(PackageError, match=why) as e:
            pkg.lower("CPU", dims)
        assert e.value.exit_code == 2

    # and in memory: the plan of that hidden class, its text naming the middle quotient's class
    assert _run(prog, {"T": 4, "C": 3 * 32 * 5, "KH": 32, "D": 5}) == "symbolic"
    plan = prog._narrowed[("CPU", (("T", "n"), ("C_D_KH", "n"), ("KH", "32n"), ("D", "n")))]
    assert "C a multiple of D (C // D a multiple of 32)" in plan.class_text()

    def middle(m: dict) -> None:  # (a class's hidden dims made of the middle quotient's class: not what they make)
        c = next(c for c in m["symbolic"]["classes"] if c.get("hidden", {}).get("KH") == "32n")
        c["hidden"]["KH"] = "n"

    with pytest.raises(PackageError, match="not a usable package"):
        loads_package(_rezip(data, middle))


def test_the_cache_entry_of_a_class_keeps_the_plans_other_processes_stored(monkeypatch, tmp_path):
    # two processes (Programs with their own in-memory caches) at different hidden classes of one class: the
    # second's entry keeps the first's plan (copied, not built again), and a third builds nothing
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("TGC_VERIFY_BOUNDS", "DISABLE_COMPILER_CACHE", "BEAM", "NOOPT", "DEBUG"):
        monkeypatch.delenv(name, raising=False)
    cache._reset_for_tests()
    first, second = {"T": 33, "C": 384}, {"T": 9, "C": 96}  # (C // 12 = 32 of class 32n, then 8 of class n)
    try:
        for dims in (first, second):
            assert _run(tgc.loads(HEADS_12), dims) == "symbolic", dims
        assert len(cache.entries("program")) == 1
        warm = tgc.loads(HEADS_12)
        called = []
        with monkeypatch.context() as m:
            m.setattr(tgc.api.Program, "_build_symbolic", lambda *a, **k: called.append(a) or "refused")
            m.setattr(tgc.api.Program, "_build_symbolic_bounded", lambda *a, **k: called.append(a) or "refused")
            for dims in (first, {"T": 20, "C": 288}, {"T": 18, "C": 480}):  # (C // 12 = 8: below the trusted sizes)
                assert _run(warm, dims) == "symbolic", dims
            assert called == [] and warm._narrowed == {}
        found = warm._symbolic_entries[("CPU", "symbolic", (("C", "32n"), ("T", "n")), 0)]
        assert sorted(c.hidden["C_12"] for c in found[1].classes) == ["32n", "n"]
    finally:
        cache._reset_for_tests()
