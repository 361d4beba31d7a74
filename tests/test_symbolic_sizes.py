"""Symbolic sizes (tgc/codegen/sizes.py): every example program compiled once per size class, without dims, and
run at several sizes (odd ones, and sizes of 1) against numpy (`numpy_program`, independent of tgc); the
launch-time checks that fall back to size-specialized kernels; kernels that take their sizes as arguments."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import tgc
from tgc.baselines.numpy_eval import numpy_program
from tgc.codegen import sizes
from tgc.engine.compare import compare
from tgc.engine.inputs import random_inputs

KERNELS = sorted(pathlib.Path(__file__).resolve().parent.parent.joinpath("kernels").glob("*.tg"))
# programs without a symbolic form: sizes that need divisibility (4 heads of C // 4) and loops over a dim (their
# unrolled length depends on it) run size-specialized kernels, and say so (floor divisions of a dim, pooling
# windows and slicing halves, are traced once since branch onetrace3: `symsize.atom`)
NOT_SYMBOLIC = {"tiny_gpt.tg", "mlp_stack.tg"}
# `C // 4` heads: compiled for C a multiple of 4 (branch heads); its small sizes are checked with the source
NARROWED = {"transformer_block.tg": [("C", 4, "C_4")]}
# the scheduler realizes a broadcast mean or recomputes it depending on the sizes: at small sizes it cuts other
# kernels than the size class's, which the launch check sees (and runs specialized kernels); large sizes match
SCHEDULE_BY_SIZE = {"small_kernels.tg": {"R": 301, "N": 303}}
# a slice of one element at the smallest sizes (`x[1:-1]` at N = 3) is broadcast without an EXPAND: the source
# check sees its graph differ there and runs specialized kernels
ONE_ELEMENT_SLICES = {"slicing.tg"}
ODD = {"N": 3, "D": 5, "K": 7, "M": 5, "B": 3, "H": 9, "W": 7, "C": 3, "O": 5, "T": 7, "F": 5, "R": 3,
       "IN": 9, "HID": 11, "OUT": 5}
OTHER = {name: size + 2 for name, size in ODD.items()}
ONES = {name: 1 if i % 2 == 0 else size for i, (name, size) in enumerate(ODD.items())}
FIXED = {"pooling.tg": {"H": 8, "W": 6}, "transformer_block.tg": {"C": 8},
         "tiny_gpt.tg": {"C": 8, "L": 2}, "mlp_stack.tg": {"L": 2}}


def _dims(prog: tgc.Program, path: pathlib.Path, table: dict[str, int]) -> dict[str, int]:
    return {n: FIXED.get(path.name, {}).get(n, table.get(n, 3)) for n in prog.dim_names}


def _check(prog: tgc.Program, got: dict, dims: dict, inputs: dict, what: str) -> None:
    want = numpy_program(prog, dims)(inputs)
    for name in prog.output_names:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        assert g.shape == w.shape, (what, name)
        if g.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w.astype(g.dtype), err_msg=f"{what}: {name}")
        else:
            bad, _ = compare(name, g, w, "f16" if g.dtype == np.float16 else "f32")
            assert bad is None, f"{what}: {bad.describe()}"


@pytest.mark.parametrize("path", KERNELS, ids=[p.name for p in KERNELS])
def test_example_compiled_once_runs_at_every_size(path):
    prog = tgc.load(path)
    if path.name in NOT_SYMBOLIC:
        with pytest.raises(tgc.TgcError, match="no kernels valid for every size"):
            prog.compile_symbolic("CPU")
    else:
        plan = prog.compile_symbolic("CPU")
        assert all(k.binary is not None for k in plan.kernels)
        assert plan.multiples == NARROWED.get(path.name, [])
    ran = []
    for table in (ODD, OTHER, ONES):
        dims = _dims(prog, path, table)
        inputs = random_inputs(prog, dims, seed=3)
        got = prog.run(device="CPU", symbolic=True, **inputs)
        ran.append(prog.last_run)
        _check(prog, got, dims, inputs, f"{path.name} at {dims}")
    if path.name in NOT_SYMBOLIC:
        assert all(r.startswith("specialized") for r in ran)
    elif path.name in NARROWED:
        assert all(r == "symbolic" or r.startswith("specialized") for r in ran), ran
    elif path.name in ONE_ELEMENT_SLICES:
        assert ran[0].startswith("specialized: the program's operations differ") and ran[1:] == ["symbolic"] * 2
    elif path.name in SCHEDULE_BY_SIZE:
        # where its schedule differs from the class's (one row: 3x5 and 5x7 schedule as the class does since the
        # reuse rules), the source check specializes; results are checked against numpy either way
        assert all(r == "symbolic" or r.startswith("specialized: kernel") for r in ran), ran
        one_row = {"R": 1, "N": 5}
        inputs = random_inputs(prog, one_row, seed=3)
        got = prog.run(device="CPU", symbolic=True, **inputs)
        assert prog.last_run.startswith("specialized: kernel"), prog.last_run
        _check(prog, got, one_row, inputs, f"{path.name} at {one_row}")
        dims = SCHEDULE_BY_SIZE[path.name]
        inputs = random_inputs(prog, dims, seed=3)
        got = prog.run(device="CPU", symbolic=True, **inputs)
        assert prog.last_run == "symbolic"
        _check(prog, got, dims, inputs, f"{path.name} at {dims}")
    else:
        assert ran == ["symbolic"] * 3, ran
        # the two runs of dims >= 2 used one plan (compiled once); sizes of 1 are a size class of their own
        classes = {key[1] for key, plan in prog._plans.items() if not isinstance(plan, str)}
        assert len(classes) == 2


def test_kernels_take_their_sizes_as_arguments():
    prog = tgc.load(KERNELS[0].parent / "softmax.tg")
    plan = prog.compile_symbolic("CPU")
    (k,) = plan.kernels
    assert k.name == "r_N_D_D_D" and set(k.var_names) == {"N", "D"}
    assert "%D_N" in k.src and "%D_D" in k.src
    for p in sizes.probes(plan.size_class)[0].values():
        assert str(p) not in k.src.split("tgc-launch:")[0]  # no size is a constant of the code


def test_sizes_classes_and_probes():
    cls = sizes.size_class(["N", "D", "E"], {"N": 7, "D": 1, "E": 0})
    assert cls == (("N", "n"), ("D", "1"), ("E", "0"))
    p1, p2 = sizes.probes((("N", "n"), ("D", "n"), ("E", "1")))
    assert p1["E"] == p2["E"] == 1 and p1["N"] < p1["D"] and p2["N"] > p2["D"]
    assert sizes.factor(3 * 211 * 223 - 1, p1, ["N", "D"]) == (3, ("D", "N"), -1, 1)
    assert sizes.factor(17, p1, ["N", "D"]) == (17, (), 0, 1)
    q1, _ = sizes.probes((("N", "32n"), ("D", "n")))
    assert q1 == {"N": 32 * 211, "D": 223}
    assert sizes.factor(211 * 5, q1, ["N", "D"]) == (5, ("N",), 0, 32)  # 5 * N // 32: N's panels of 32
    assert sizes.mono_value((5, ("N",), 0, 32), {"N": 64}) == 10
    assert sizes.size_class(["A", "B"], {"A": 64, "B": 48}) == (("A", "32n"), ("B", "n"))


def test_a_slice_that_clamps_falls_back_to_specialized_kernels():
    """`x[:5]` is 5 elements at the probe sizes but N when N < 5: the launch-time check sees the difference."""
    prog = tgc.loads("x: f32[N]\nreturn sum(x[:5]) + x[0], x[:5] * 2")
    prog.compile_symbolic("CPU")
    for n in (9, 3):
        x = np.arange(n, dtype=np.float32) + 1
        out = prog.run(device="CPU", symbolic=True, x=x)
        np.testing.assert_allclose(out["out0"], x[:5].sum() + x[0])
        np.testing.assert_allclose(out["out1"], x[:5] * 2)
        assert prog.last_run == ("symbolic" if n >= 5 else
                                 "specialized: the program's operations differ at these sizes (a slice or "
                                 "index that clamps, or another decision on the sizes); the class's kernels run "
                                 "unchecked where N is at least 10 (here N = 3)")


def test_a_size_beyond_the_variables_bound_falls_back():
    src = "a: f32[A, B, C, D, E]\nreturn a.sum(axis=0) * 2"
    prog = tgc.loads(src)
    plan = prog.compile_symbolic("CPU")
    # (A and B raised one bit each, in name order, while the product of the five stays within 2^62)
    assert plan.bound == 2 ** 12 and plan.dim_bounds == {"A": 2 ** 13, "B": 2 ** 13}
    a = np.ones((8200, 2, 2, 2, 2), np.float32)
    out = prog.run(device="CPU", symbolic=True, a=a)["out0"]
    np.testing.assert_array_equal(out, np.full((2, 2, 2, 2), 16400, np.float32))
    assert prog.last_run.startswith("specialized: dim A = 8200 is outside the symbolic kernels' range 2..8192")
    out = prog.run(device="CPU", symbolic=True, a=np.ones((2, 2, 4100, 2, 2), np.float32))["out0"]
    np.testing.assert_array_equal(out, np.full((2, 4100, 2, 2), 4, np.float32))
    assert prog.last_run.startswith("specialized: dim C = 4100 is outside the symbolic kernels' range 2..4096")
    out = prog.run(device="CPU", symbolic=True, a=a[:7])["out0"]
    np.testing.assert_array_equal(out, np.full((2, 2, 2, 2), 14, np.float32))
    assert prog.last_run == "symbolic"


def test_dim_values_in_expressions_are_symbolic_too():
    prog = tgc.loads("x: f32[N, D]\nw: f32[2 * D]\nreturn x * D + w[:D] - N, x.mean(axis=1)")
    prog.compile_symbolic("CPU")
    for n, d in ((3, 5), (6, 2)):
        x, w = np.random.default_rng(n).standard_normal((n, d)).astype(np.float32), np.arange(2 * d, dtype=np.float32)
        out = prog.run(device="CPU", symbolic=True, x=x, w=w)
        assert prog.last_run == "symbolic"
        np.testing.assert_allclose(out["out0"], x * d + w[:d] - n, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["out1"], x.mean(axis=1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, dims", [
    ("matmul.tg", {"M": 64, "K": 96, "N": 128}), ("matmul.tg", {"M": 96, "K": 32, "N": 64}),
    ("softmax.tg", {"N": 256, "D": 320}), ("layernorm.tg", {"N": 128, "D": 544}),
    ("batched_matmul.tg", {"B": 2, "M": 64, "K": 32, "N": 96}), ("mlp.tg", {"B": 64, "IN": 96, "HID": 128, "OUT": 32}),
])
def test_multiples_of_32_run_the_optimized_symbolic_kernels(name, dims):
    """Sizes that are multiples of 32 are a class of their own, whose kernels carry the heuristic's opts (vector
    upcasts, threads, matmul's packed panels) behind launch checks; large enough ones pass them."""
    prog = tgc.load(KERNELS[0].parent / name)
    inputs = random_inputs(prog, dims, seed=5)
    got = prog.run(device="CPU", symbolic=True, **inputs)
    assert prog.last_run == "symbolic"
    plan = prog._plans[("CPU", sizes.size_class(prog.dim_names, dims))]
    assert all(c == ("32n" if dims[n] % 32 == 0 else "n") for n, c in plan.size_class)
    assert "fast" in plan.chosen or "split" in plan.chosen, plan.chosen  # split: B = 2 is of class n
    _check(prog, got, dims, inputs, f"{name} at {dims}")


def test_a_launch_check_that_fails_runs_the_general_kernel():
    """matmul's fast kernel is threaded: a product too small to split across threads runs the general one."""
    prog = tgc.load(KERNELS[0].parent / "matmul.tg")
    dims = {"M": 32, "K": 32, "N": 32}
    inputs = random_inputs(prog, dims, seed=1)
    got = prog.run(device="CPU", symbolic=True, **inputs)
    plan = prog._plans[("CPU", sizes.size_class(prog.dim_names, dims))]
    assert all(f is not None for f in plan.fast) and plan.chosen == ["general"] * len(plan.kernels)
    _check(prog, got, dims, inputs, "matmul 32^3")


def test_a_beam_winner_serves_its_whole_size_class(tmp_path, monkeypatch):
    """BEAM at one size stores each winner for the size class too; a nearby size of the class, in a program
    loaded afresh, builds its fast kernels from that winner (here one stored directly, as a search would)."""
    from tgc.backends import get_device
    from tgc.codegen import search
    from tgc.codegen.kernel import prepare_ast
    from tgc.codegen.opt import Opt, OptOps
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TGC_THREADS", "2")
    dev = get_device("CPU")
    path = KERNELS[0].parent / "softmax.tg"
    prog = tgc.load(path)
    dims = {"N": 64, "D": 96}
    (item,) = [i for i in prog.schedule(dims, "CPU") if i.ast.src]
    winner = [Opt(OptOps.UPCAST, 1, 8)]  # not what the heuristic picks (UPCAST 16, UPCAST 2, THREAD)
    search.store(prepare_ast(item.ast, dev), dev, winner, 1e-3, item.name, 2)
    assert prog._store_class_winners(dev, dims) == 1
    other = tgc.load(path)
    x = np.random.default_rng(2).standard_normal((160, 224)).astype(np.float32)
    got = other.run(device="CPU", symbolic=True, x=x)["out0"]
    plan = other._plans[("CPU", (("N", "32n"), ("D", "32n")))]
    # the winner's opts, and the threads the size-specialized kernel gets from the automatic split (a stored
    # winner has no THREAD; without it the symbolic kernel ran on one core, 1.5-1.7x the specialized one)
    assert [str(o) for o in plan.fast[0].opts] == ["UPCAST(1, 8)", "THREAD(0, 2)"] and plan.chosen == ["fast"]
    assert plan.fast[0].global_size[0] == 2
    want = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, want / want.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_a_class_winner_gets_threads_and_runs_without_them_at_small_sizes(tmp_path, monkeypatch):
    """A stored winner's symbolic kernel gets the threads the heuristic picks at the representative size; sizes
    with too little work for them run the winner without threads (not the general kernel)."""
    from tgc.backends import get_device
    from tgc.codegen import search
    from tgc.codegen.kernel import prepare_ast
    from tgc.codegen.opt import Opt, OptOps
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TGC_THREADS", "2")
    dev = get_device("CPU")
    path = tmp_path / "scale.tg"
    path.write_text("x: f32[N, D]\nreturn x * 2 + 1\n")
    prog = tgc.load(path)
    (item,) = [i for i in prog.schedule({"N": 64, "D": 64}, "CPU") if i.ast.src]
    search.store(prepare_ast(item.ast, dev), dev, [Opt(OptOps.UPCAST, 1, 8)], 1e-3, item.name, 2)
    assert prog._store_class_winners(dev, {"N": 64, "D": 64}) == 1
    other = tgc.load(path)
    rng = np.random.default_rng(3)
    for shape, threads in (((32, 64), 1), ((512, 256), 2)):
        x = rng.standard_normal(shape).astype(np.float32)
        (got,) = other.run(device="CPU", symbolic=True, x=x).values()
        plan = other._plans[("CPU", (("N", "32n"), ("D", "32n")))]
        assert plan.chosen == ["fast"]
        assert [str(o) for o in plan.fast[0].opts] == ["UPCAST(1, 8)", "THREAD(0, 2)"]
        assert [str(o) for o in plan.unthreaded[0].opts] == ["UPCAST(1, 8)"]
        low, why = other.lower_symbolic("CPU", {"N": shape[0], "D": shape[1]})
        assert why == "" and [k.global_size[0] for k in low.kernels] == [threads]
        np.testing.assert_allclose(got, x * 2 + 1, rtol=1e-6)


def test_program_beam_stores_the_class_winner(tmp_path, monkeypatch):
    from tgc.backends import get_device
    from tgc.codegen import search
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    prog = tgc.load(KERNELS[0].parent / "softmax.tg")
    prog.beam("CPU", dims={"N": 32, "D": 64}, width=1)
    plan = prog.compile_symbolic("CPU", (("N", "32n"), ("D", "32n")))
    # (stored, as a winner or as one the program check dropped: `search.drop`; both carry over to the class)
    assert search.lookup_entry(plan.kernels[0].template, get_device("CPU")) is not None


def test_cli_compile_without_dims_compiles_for_every_size():
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parent.parent
    env = {"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-m", "tgc.cli.main", "compile", str(root / "kernels" / "softmax.tg"),
                        "-d", "CPU"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "; kernel r_N_D_D_D" in r.stdout and "i32 %D_N" in r.stdout
    assert "compiled for every size (N >= 2, D >= 2)" in r.stderr
    # (pooling.tg, `H // 2`, is compiled for every size since branch onetrace3; a program of `C // 4` heads,
    # whose reshape needs C to divide, for C a multiple of 4 since branch heads; a loop over a dim has no symbolic
    # form)
    r = subprocess.run([sys.executable, "-m", "tgc.cli.main", "compile",
                        str(root / "kernels" / "transformer_block.tg"), "-d", "CPU"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "note: compiled for every size (B >= 2, T >= 2, C >= 2, with C a multiple of 4 " \
        "(C // 4 >= 2 and no multiple of 32))" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "tgc.cli.main", "compile",
                        str(root / "kernels" / "mlp_stack.tg"), "-d", "CPU"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "no kernels valid for every size" in r.stderr
    assert "help: give its dims to compile it for one size: -D B=INT -D C=INT -D L=INT" in r.stderr
    assert "Traceback" not in r.stderr


def test_symbolic_launches_count_the_work_of_their_sizes():
    prog = tgc.load(KERNELS[0].parent / "matmul.tg")
    dims = {"M": 65, "K": 64, "N": 63}
    sym = prog.bench("CPU", dims=dims, repeat=1, symbolic=True, tuned=False)
    spec = prog.bench("CPU", dims=dims, repeat=1, tuned=False)
    assert sym["kernels_for"] == "size class" and spec["kernels_for"] == "these sizes"
    # the odd sizes run a split kernel (a main kernel and tails): together they do the specialized kernel's work
    assert sum(k["flops"] for k in sym["kernels"]) == sum(k["flops"] for k in spec["kernels"])
    assert sum(k["flops"] for k in sym["kernels"]) >= 2 * 65 * 64 * 63 and sym["kernels"][0]["bytes"] > 0


def test_the_compile_cache_holds_one_entry_per_size_class(tmp_path, monkeypatch):
    """Sizes of one class compile nothing new: the kernels' sources (and so their cache keys) are the same."""
    from tgc import cache
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    path = KERNELS[0].parent / "softmax.tg"

    def entries() -> int:
        return len(cache.entries("compile"))
    tgc.load(path).run(device="CPU", symbolic=True, x=np.ones((3, 5), np.float32))
    first = entries()
    assert first >= 1
    for n, d in ((7, 9), (11, 3), (2, 2)):  # the same class, each in a program loaded afresh
        prog = tgc.load(path)
        prog.run(device="CPU", symbolic=True, x=np.ones((n, d), np.float32))
        assert prog.last_run == "symbolic"
    assert entries() == first
    tgc.load(path).run(device="CPU", x=np.ones((7, 9), np.float32))  # size-specialized: an entry per size
    assert entries() > first


@pytest.mark.parametrize("shape", [(3, 0), (0, 5), (0, 0), (1, 0), (4, 5)])
def test_sizes_of_zero_are_a_class_and_unused_buffers_are_no_parameters(shape):
    """With D = 0 the sum's kernel stores zeros and reads nothing: its unused input is no kernel parameter, so
    the launch must pass the buffers the kernel kept, not every buffer the scheduler gave it."""
    prog = tgc.loads("x: f32[N, D]\nreturn x.sum(axis=1), x * 2, x")
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    out = prog.run(device="CPU", symbolic=True, x=x)
    assert prog.last_run == "symbolic"
    np.testing.assert_array_equal(out["out0"], x.sum(axis=1))
    np.testing.assert_array_equal(out["out1"], x * 2)
    np.testing.assert_array_equal(out["x"], x)


def test_cli_run_and_bench_symbolic():
    import json
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parent.parent
    env = {"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}
    cli = [sys.executable, "-m", "tgc.cli.main"]
    r = subprocess.run([*cli, "run", str(root / "kernels" / "matmul.tg"), "--random", "-D", "M=5", "-D", "K=7",
                        "-D", "N=3", "--symbolic", "--check", "-d", "CPU"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0 and "check: ok" in r.stderr and "note:" not in r.stderr, r.stderr
    # (C // 4 = 1: outside the class compiled for C a multiple of 4, branch heads)
    r = subprocess.run([*cli, "run", str(root / "kernels" / "transformer_block.tg"), "--random", "-D", "B=2",
                        "-D", "T=3", "-D", "C=4", "--symbolic", "--check", "-d", "CPU"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0 and "note: ran kernels compiled for these sizes" in r.stderr and \
        "C // 4 = 1 is outside" in r.stderr, r.stderr
    r = subprocess.run([*cli, "bench", str(root / "kernels" / "softmax.tg"), "-D", "N=64", "-D", "D=64",
                        "--symbolic", "--repeat", "2", "--json", "-d", "CPU"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kernels_for"] == "size class"


GPU_TARGETS = ["CUDA", "OPENCL", "METAL"]


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_gpu_kernels_take_their_sizes_and_grid_from_the_launch(target):
    """On the C-style GPU backends a symbolic kernel takes its sizes as `int` arguments and its grid is an
    expression of them, evaluated at each launch (the work-groups the dims need, the last one partial); its
    source names no probe size. OpenCL and Metal are type-checked with clang here, CUDA compiled by NVRTC."""
    from tgc.codegen.kernel import symbolic_grid
    prog = tgc.load(KERNELS[0].parent / "softmax.tg")
    plan = prog.compile_symbolic(target)
    assert [k.name for k in plan.kernels] == ["r_N_D", "r_N_Dn1", "E_N_D"]
    for k in plan.kernels:
        assert k.grid is not None and k.local_size == (256, 1, 1)
        assert set(k.var_names) == {"N", "D"}
        code = k.src.split("tgc-launch:")[0]
        assert re.search(r"\bint&? D_N\b", code) and re.search(r"\bint&? D_D\b", code)  # Metal: constant int&
        for p in sizes.probes(plan.size_class)[0].values():
            assert str(p) not in code
        if k.binary is None:  # no driver for it here: the source must still have passed the compiler's check
            assert target != "CUDA" or "nvrtc" in (k.compile_error or ""), k.compile_error
            assert "type-checked" in (k.compile_error or "") or target == "CUDA", k.compile_error
    rows, elems = plan.kernels[0], plan.kernels[2]
    assert symbolic_grid(rows, {"N": 300, "D": 7}) == (2, 1, 1)  # 300 rows in work-groups of 256
    assert symbolic_grid(elems, {"N": 300, "D": 7}) == (9, 1, 1)  # 2100 elements
    assert symbolic_grid(elems, {"N": 2, "D": 128}) == (1, 1, 1)


def test_gpu_grid_index_bounds_with_size_divisors():
    """Index math of a symbolic GPU kernel (`gidx // D % N`) keeps bounds that fit 64 bits: the division and
    remainder by a dim variable are bounded by its range."""
    from tgc.dtype import dtypes
    from tgc.ir.uop import Ops, UOp
    n = UOp(Ops.DEFINE_VAR, dtypes.index, (), ("D_N", 2, 1000))
    x = UOp(Ops.DEFINE_VAR, dtypes.index, (), ("x", 0, 10 ** 9))
    assert (x % n).bounds == (0, 999)
    assert (x // n).bounds == (0, 5 * 10 ** 8)
    y = UOp(Ops.DEFINE_VAR, dtypes.index, (), ("y", -5, 10))
    assert (y % n).bounds[0] < 0  # a negative dividend: no claim beyond the generic bounds


def test_cli_compile_for_cuda_without_dims():
    import subprocess
    import sys

    from tgc.backends.cuda import nvrtc_error
    root = pathlib.Path(__file__).resolve().parent.parent
    env = {"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-m", "tgc.cli.main", "compile", str(root / "kernels" / "softmax.tg"),
                        "-d", "CUDA"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "r_N_D(float* __restrict__ data0, const float* __restrict__ data1, int D_D, int D_N)" in r.stdout
    assert "compiled for every size (N >= 2, D >= 2)" in r.stderr
    assert ("could not compile" not in r.stderr) == (nvrtc_error() is None), r.stderr


@pytest.mark.parametrize("dims", [{"M": 7, "K": 5, "N": 9}, {"M": 33, "K": 3, "N": 65}, {"M": 101, "K": 99, "N": 103},
                                  {"M": 40, "K": 7, "N": 37}])
def test_odd_sizes_run_a_split_kernel_main_part_and_remainders(dims):
    """Class `n` (odd sizes): the heuristic's upcasts (vector columns, 8 rows) on a main kernel over the part of
    each loop they divide, and tail kernels for the remainder rows and columns (empty ones are not launched)."""
    prog = tgc.load(KERNELS[0].parent / "matmul.tg")
    inputs = random_inputs(prog, dims, seed=4)
    got = prog.run(device="CPU", symbolic=True, **inputs)
    assert prog.last_run == "symbolic"
    _check(prog, got, dims, inputs, f"matmul at {dims}")
    plan = prog._plans[("CPU", sizes.size_class(prog.dim_names, dims))]
    assert plan.chosen == ["split"]
    assert any(o.op.name == "UPCAST" for o in plan.fast[0].opts) and len(plan.tails[0]) == 2
    low, _ = plan.bind(prog, dims)
    rest = [dims["M"] % 8, dims["N"] % 32]
    assert len(low.kernels) == 1 + sum(r > 0 for r in rest)


def test_a_reduction_shared_along_the_columns_is_not_split():
    """softmax's fused kernel reduces each row once for all its columns: a tail over the last columns would
    reduce the rows again, so odd sizes keep the unsplit fast kernel."""
    prog = tgc.load(KERNELS[0].parent / "softmax.tg")
    x = np.random.default_rng(0).standard_normal((33, 65)).astype(np.float32)
    prog.run(device="CPU", symbolic=True, x=x)
    plan = prog._plans[("CPU", (("N", "n"), ("D", "n")))]
    assert all(not t for t in plan.tails) and "split" not in plan.chosen


def test_kernel_names_read_multiples_of_dims_not_probe_sizes():
    # `w: f32[C, 3 * C]` gave kernels named r_B_669_C (669 = 3 * the probe of C)
    from tgc.codegen.sizes import probes, symbolic_name
    p, _ = probes((("B", "n"), ("C", "n")))
    b, c = p["B"], p["C"]
    assert symbolic_name(f"r_{b}_{3 * c}_{c}", p, ["B", "C"]) == "r_B_3C_C"
    assert symbolic_name(f"E_{b * c}", p, ["B", "C"]) == "E_BC"
    assert symbolic_name("r_4_5", p, ["B", "C"]) == "r_4_5"  # plain sizes stay


def test_no_symbolic_form_names_the_dims_to_give(tmp_path):
    from tgc.package import write

    # (transformer_block compiles for C a multiple of 4 since branch heads, and packages so since heads2)
    kernels = pathlib.Path(__file__).resolve().parent.parent / "kernels"
    prog = tgc.load(kernels / "mlp_stack.tg")
    for what, call in (("compile", lambda: prog.compile_symbolic("CPU")),
                       ("package", lambda: write(prog, tmp_path / "s.tgpkg", "CPU"))):
        with pytest.raises(tgc.TgcError, match="no kernels valid for every size") as e:
            call()
        dims = "B, C, L"
        assert e.value.exit_code == 2
        assert e.value.hint == f"give its dims ({dims}) to {what} it for one size"
        assert e.value.cli_hint == f"give its dims to {what} it for one size: " + \
            " ".join(f"-D {n}=INT" for n in dims.split(", "))


def test_a_partial_winner_is_stored_for_its_class_as_partial(tmp_path, monkeypatch):
    """A winner of a search cut short (`search.store_result`: `"partial"`) becomes its size class's winner as
    partial too, so a search of the class's kernel is not taken as finished; a finished one stays finished."""
    from tgc.backends import get_device
    from tgc.codegen import search
    from tgc.codegen.kernel import prepare_ast
    from tgc.codegen.opt import Opt, OptOps
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    dev = get_device("CPU")
    path = tmp_path / "scale.tg"
    path.write_text("x: f32[N, D]\nreturn x * 2 + 1\n")
    prog = tgc.load(path)
    dims = {"N": 64, "D": 64}
    (item,) = [i for i in prog.schedule(dims, "CPU") if i.ast.src]
    (k,) = prog._build_symbolic(dev, sizes.size_class(prog.dim_names, dims), templates_only=True).kernels
    for partial in (True, False):
        search.store(prepare_ast(item.ast, dev), dev, [Opt(OptOps.UPCAST, 1, 8)], 1e-3, item.name, 2, partial=partial)
        assert prog._store_class_winners(dev, dims) == 1
        entry = search.lookup_entry(k.template, dev)
        assert entry["partial"] is partial and entry["width"] == 2
        assert [str(o) for o in entry["opts"]] == ["UPCAST(1, 8)"]
        assert (search.lookup(k.template, dev, 2) is None) is partial


def test_class_winners_are_stored_without_compiling_the_symbolic_plan(tmp_path, monkeypatch):
    from tgc.backends import get_device
    from tgc.codegen import kernel, search

    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    store_class_winners = tgc.Program._store_class_winners
    monkeypatch.setattr(tgc.Program, "_store_class_winners", lambda self, dev, dims: 0)  # (called below)
    prog = tgc.load(KERNELS[0].parent / "gelu.tg")  # (three kernels, each a symbolic form of the class N=32n)
    dims = {"N": 64}
    prog.beam("CPU", dims=dims, width=1)
    dev = get_device("CPU")
    items = [i for i in prog.schedule(dims, "CPU") if i.ast.src]
    winners = [search.lookup_entry(kernel.prepare_ast(i.ast, dev), dev)["opts"] for i in items]
    compiled: list[str] = []
    real = kernel._compile_cached
    monkeypatch.setattr(kernel, "_compile_cached", lambda d, src: compiled.append(src) or real(d, src))
    assert store_class_winners(prog, dev, dims) == len(items)
    assert compiled == []  # the symbolic plan's templates come from lowering alone
    monkeypatch.setattr(kernel, "_compile_cached", real)
    plan = prog.compile_symbolic("CPU", sizes.size_class(prog.dim_names, dims))  # the whole plan, compiled
    assert len(plan.kernels) == len(items)
    for k, want in zip(plan.kernels, winners):  # each symbolic kernel's winner is its size's winner
        entry = search.lookup_entry(k.template, dev)
        assert entry is not None and entry["opts"] == want, k.name
    light = prog._build_symbolic(dev, plan.size_class, templates_only=True)  # (what the store read: the same kernels)
    assert [(k.name, k.template) for k in light.kernels] == [(k.name, k.template) for k in plan.kernels]
    assert all(k.binary is None for k in light.kernels) and (dev.name, plan.size_class) in prog._plans
