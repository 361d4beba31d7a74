"""One plan, one bind (tgc/engine/classbind.py): a size class's plan built in memory (`SymbolicPlan`) and the
same plan loaded from a symbolic package or a program-cache entry (`SizeClassPlan`) are one form in size
expressions, bound by the same code; split kernels (a main part and remainder kernels with derived sizes) and
GPU grids are saved, so a package of class n with split kernels, and one on OPENCL, runs them. Results against
numpy at sizes of 1, odd and larger sizes."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from test_progcache import fresh_cache  # noqa: F401 (autouse: each test's own program cache)

import tgc
from tgc import package, progcache
from tgc.engine import classbind
from tgc.engine.inputs import random_inputs
from tgc.package import PackageError

ROOT = pathlib.Path(__file__).resolve().parent.parent
MATMUL = ROOT / "kernels" / "matmul.tg"
SOFTMAX = ROOT / "kernels" / "softmax.tg"


def _matmul(i: dict) -> np.ndarray:
    return np.maximum(i["a"].astype(np.float64) @ i["b"] + i["bias"], 0)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _need_opencl() -> None:
    from langkit import device_skip_reason
    why = device_skip_reason("OPENCL")
    if why is not None:
        pytest.skip(why)


@pytest.fixture
def counted(monkeypatch):
    """Every call of the one bind, with the kind of plan that made it."""
    calls = []
    real = classbind.bind

    def bind(doc, templates, *a, **kw):
        calls.append(type(templates[0]["general"]).__name__)
        return real(doc, templates, *a, **kw)

    monkeypatch.setattr(classbind, "bind", bind)
    return calls


def test_a_split_class_packaged_runs_its_remainder_kernels(tmp_path, counted):
    """matmul's class n is split (a main kernel over the rows and columns its upcasts divide, remainder kernels
    for the rest, derived sizes computed at launch): the package saves all of it (format 4) and its bind launches
    the same kernels as the plan in memory, both through `classbind.bind`, matching numpy."""
    prog = tgc.load(MATMUL)
    path = tmp_path / "mm.tgpkg"
    pkg = package.write(prog, path, "CPU", {})
    assert pkg.format_version == package.SYMBOLIC_VERSION == 5
    cls = next(c for c in pkg.classes if set(c.cls.values()) == {"n"})
    assert cls.doc["derived"] and any(k.get("tails") for k in cls.doc["kernels"])
    for dims in ({"M": 7, "K": 5, "N": 9}, {"M": 40, "K": 3, "N": 37}, {"M": 64, "K": 9, "N": 96},
                 {"M": 1, "K": 1, "N": 1}, {"M": 1, "K": 13, "N": 3}):
        inputs = random_inputs(prog, dims, seed=1)
        counted.clear()
        got = pkg.run(**inputs)["y"]
        np.testing.assert_allclose(got, _matmul(inputs), rtol=2e-5, atol=1e-5, err_msg=str(dims))
        assert counted == ["PackagedKernel"], counted
        mine = pkg.size_class(dims)
        if 1 not in dims.values():
            assert mine.chosen == ["split"], (dims, mine.chosen)
            low = pkg.lower("CPU", dims)
            rest = [dims["M"] % 8, dims["N"] % 32]
            assert len(low.kernels) == 1 + sum(r > 0 for r in rest), dims  # (empty remainders not launched)
            if any(v % 32 == 0 for v in dims.values()):
                continue  # (the plan in memory is of class 32n there, the package's of n)
            mem, _ = prog.lower_symbolic("CPU", dims)
            assert [k.name for k in mem.kernels] == [k.name for k in low.kernels]
            assert [k.vals for k in mem.kernels] == [k.vals for k in low.kernels]
            assert counted[-1] == "Kernel"


def test_a_version_2_package_without_splits_still_loads_and_one_with_them_is_refused(tmp_path):
    """Version 2 (written before splits were saved) loads as before; split fields in a version-2 manifest, or
    another version, are refused with one message that says to compile again."""
    prog = tgc.load(SOFTMAX)
    data = package.build_symbolic(prog, tgc.api._device("CPU"))
    from test_package_symbolic import _rezip

    def old(m: dict) -> None:
        m["format_version"] = 2

    pkg = package.loads_package(_rezip(data, old))
    x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_allclose(pkg.run(x=x)["out0"], _softmax(x), rtol=2e-5, atol=1e-6)

    def split_in_old(m: dict) -> None:
        m["format_version"] = 2
        m["symbolic"]["classes"][0]["derived"] = {"k0m0": ["*", ["//", "D", 8], 8]}

    with pytest.raises(PackageError, match="split kernels, which format version 2 has not"):
        package.loads_package(_rezip(data, split_in_old))

    def newer(m: dict) -> None:
        m["format_version"] = 6

    with pytest.raises(PackageError, match="compile the package again|reads versions 1, 2, 3, 4 and 5") as e:
        package.loads_package(_rezip(data, newer))
    assert "reads versions 1, 2, 3, 4 and 5" in e.value.msg

    def split(m: dict) -> None:  # (version 4, written before narrowed classes: read as before)
        m["format_version"] = 4

    pkg = package.loads_package(_rezip(data, split))
    np.testing.assert_allclose(pkg.run(x=x)["out0"], _softmax(x), rtol=2e-5, atol=1e-6)


def test_a_damaged_derived_size_is_refused(tmp_path):
    prog = tgc.load(MATMUL)
    data = package.build_symbolic(prog, tgc.api._device("CPU"))
    from test_package_symbolic import _rezip

    def bad_name(m: dict) -> None:
        c = next(c for c in m["symbolic"]["classes"] if c.get("derived"))
        c["derived"]["M"] = 3

    def bad_expr(m: dict) -> None:
        c = next(c for c in m["symbolic"]["classes"] if c.get("derived"))
        name = next(iter(c["derived"]))
        c["derived"][name] = ["+", "Q", 1]

    for edit, message in ((bad_name, "no name of its own"), (bad_expr, "not an expression of the dims")):
        with pytest.raises(PackageError, match=message):
            package.loads_package(_rezip(data, edit))


def test_an_opencl_symbolic_package_saves_its_grids_and_runs_at_many_sizes(tmp_path, counted):
    """On OPENCL a symbolic kernel's work-groups are expressions of the dims: the package saves them, its bind
    evaluates them at each dims (a partial last work-group gated off in the kernel), against numpy."""
    _need_opencl()
    prog = tgc.load(SOFTMAX)
    pkg = package.write(prog, tmp_path / "sm.tgpkg", "OPENCL", {})
    cls = next(c for c in pkg.classes if set(c.cls.values()) == {"n"})
    assert any(isinstance(e, list) or isinstance(e, str) for k in cls.doc["kernels"] for e in k["global_size"])
    for n, d in ((1, 1), (3, 5), (257, 33), (1, 300), (64, 1000)):
        x = np.random.default_rng(n).standard_normal((n, d)).astype(np.float32)
        counted.clear()
        np.testing.assert_allclose(pkg.run("OPENCL", x=x)["out0"], _softmax(x), rtol=2e-5, atol=1e-6,
                                   err_msg=f"{n}x{d}")
        assert counted == ["PackagedKernel"]


def test_an_opencl_symbolic_cache_entry_is_stored_and_bound_without_tracing(tmp_path, monkeypatch):
    """`run(symbolic=True)` on OPENCL stores the class's entry; a new Program at other dims binds it without
    tracing, as on the CPU."""
    _need_opencl()
    src = SOFTMAX.read_text()
    first = tgc.loads(src, "sm.tg")
    x = np.random.default_rng(0).standard_normal((9, 13)).astype(np.float32)
    np.testing.assert_allclose(first.run("OPENCL", symbolic=True, x=x)["out0"], _softmax(x), rtol=2e-5, atol=1e-6)
    assert progcache.load_symbolic(src, {"N": 9, "D": 13}, tgc.api._device("OPENCL")) is not None
    again = tgc.loads(src, "sm.tg")
    monkeypatch.setattr(tgc.api.Program, "_trace", lambda *a, **k: pytest.fail("traced"))
    for n, d in ((33, 7), (300, 301)):
        x = np.random.default_rng(n).standard_normal((n, d)).astype(np.float32)
        np.testing.assert_allclose(again.run("OPENCL", symbolic=True, x=x)["out0"], _softmax(x), rtol=2e-5,
                                   atol=1e-6)
        assert again.last_run == "symbolic"


def test_the_in_memory_form_is_the_package_form(counted):
    """The plan in memory converts itself once to the class doc a package stores (buffers, kernels, launch
    checks as size expressions), and binds through `classbind.bind`."""
    prog = tgc.load(MATMUL)
    dims = {"M": 9, "K": 4, "N": 11}
    low, why = prog.lower_symbolic("CPU", dims)
    assert low is not None, why
    plan = prog._plans[("CPU", (("M", "n"), ("K", "n"), ("N", "n")))]
    doc, templates = plan.form(prog)
    assert counted == ["Kernel"]
    json.dumps({k: v for k, v in doc.items() if k != "kernels"})  # (the buffers and sizes are plain JSON)
    assert [b["shape"] for b in doc["buffers"] if b["role"] == "input"] == [["M", "K"], ["K", "N"], ["N"]]
    assert all(sorted(t) == ["fast", "general", "plain", "tails"] for t in templates)
    assert plan.form(prog) is plan.form(prog)
