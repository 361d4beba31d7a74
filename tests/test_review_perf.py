"""A second look at issue 14's performance work, as a demanding user would try it: in-place memory plans,
exp-once row softmax (tgc/codegen/rowreuse.py) and the matmul / transposing-copy tiles, each against numpy
computed here (never `Program.reference`), on CPU (first run, launch plan, graph) and PYTHON (bounds checked)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import tgc
from tgc.engine.memplan import check_plan, plan_memory

# a matmul result r realized (read by a column sum and the next kernel), then b = exp(r / 100) * s realized
# (read by its column sum and c's kernel): c's kernel writes c over b, which dies there
INPLACE = """x: f32[N, K]
w: f32[K, M]
a = x @ w
s = a.sum(axis=0)
b = exp(a * 0.01) * s
t = b.sum(axis=0)
"""
DIMS = {"N": 24, "K": 16, "M": 40}


def _inplace_want(x: np.ndarray, w: np.ndarray) -> dict[str, np.ndarray]:
    a = x.astype(np.float64) @ w
    b = np.exp(a * 0.01) * a.sum(axis=0)
    return {"a": a, "b": b, "t": b.sum(axis=0)}


def _inputs(seed: int, dims: dict[str, int] = DIMS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((dims["N"], dims["K"])).astype(np.float32) * 0.3,
            rng.standard_normal((dims["K"], dims["M"])).astype(np.float32) * 0.3)


def _close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-4) -> None:
    want = np.asarray(want, dtype=np.float64)
    scale = max(float(np.abs(want).max()), 1.0) if want.size else 1.0
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=rtol * scale)


TAILS = {
    # the program's output written over b (in place), then also read by a later kernel / returned twice
    "c = b * t + 1\nreturn c, c.sum()\n": lambda v: [v["b"] * v["t"] + 1, (v["b"] * v["t"] + 1).sum()],
    "c = b * t\nreturn c * 1, c * 1\n": lambda v: [v["b"] * v["t"]] * 2,
    "c = b * t\nreturn c, c * t\n": lambda v: [v["b"] * v["t"], v["b"] * v["t"] * v["t"]],
    # b read transposed, reversed or broadcast from one row: another element than the one written, never in place
    "return (b * t).T\n": lambda v: [(v["b"] * v["t"]).T],
    "return b[::-1] * t\n": lambda v: [v["b"][::-1] * v["t"]],
    "return b[0:1] * b + t\n": lambda v: [v["b"][0:1] * v["b"] + v["t"]],
    "return b.T.T * t + b[:, ::-1]\n": lambda v: [v["b"] * v["t"] + v["b"][:, ::-1]],
    # another dtype (another size: never paired; f64 and f16 outputs)
    "return cast(b * t * 1e-6, f16)\n": lambda v: [v["b"] * v["t"] * 1e-6],
    "return cast(b * t, f64)\n": lambda v: [v["b"] * v["t"]],
    # the same bytes in another shape: paired, and the same element
    "return reshape(b * t, (M, N)) + 1\n": lambda v: [(v["b"] * v["t"]).reshape(DIMS["M"], DIMS["N"]) + 1],
    # b returned as well: an output lives to the end, so nothing writes over it
    "return b, b * t\n": lambda v: [v["b"], v["b"] * v["t"]],
}


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
@pytest.mark.parametrize("tail", list(TAILS))
def test_inplace_plans_give_numpy_results(device, tail):
    prog = tgc.loads(INPLACE + tail)
    plan = prog.lower(device, DIMS).memory_plan()
    assert check_plan(plan) is None
    for seed in range(3 if device == "CPU" else 1):  # first run, the launch plan's first run, its graph
        x, w = _inputs(seed)
        before = x.copy(), w.copy()
        got = prog.run(device=device, dims=DIMS, x=x, w=w)
        want = TAILS[tail](_inplace_want(*before))
        assert len(got) == len(want)
        for g, v in zip(got.values(), want):
            _close(g, v, rtol=1e-2 if g.dtype == np.float16 else 1e-4)
        np.testing.assert_array_equal(x, before[0])
        np.testing.assert_array_equal(w, before[1])
    prog.release()


def test_which_reads_pair_in_place():
    """Only a read of the very element written pairs (same dtype and size); a view that moves elements never."""
    def pairs(tail: str) -> int:
        return len(tgc.loads(INPLACE + tail).lower("CPU", DIMS).memory_plan().inplace)

    assert pairs("return b * t + 1\n") == 1
    assert pairs("return reshape(b * t, (M, N))\n") == 1
    for tail in ("return (b * t).T\n", "return b[::-1] * t\n", "return cast(b * t, f64)\n",
                 "return bitcast(b * t, i32)\n"):
        assert pairs(tail) == 0, tail


def test_inplace_under_debug_2_symbolic_and_without_graphs(monkeypatch, capfd):
    src = INPLACE + "return b * t + 1\n"
    monkeypatch.setenv("DEBUG", "2")
    for graph in ("1", "0"):
        monkeypatch.setenv("TGC_GRAPH", graph)
        prog = tgc.loads(src)
        for seed in range(3):
            x, w = _inputs(seed)
            v = _inplace_want(x, w)
            _close(prog.run(device="CPU", dims=DIMS, x=x, w=w)["out0"], v["b"] * v["t"] + 1)
        prog.release()
    assert "in place: one cold launch" in capfd.readouterr().err
    odd = {"N": 27, "K": 13, "M": 41}  # symbolic kernels (odd sizes: split loops with tails)
    prog = tgc.loads(src)
    for seed in range(3):
        x, w = _inputs(seed, odd)
        v = _inplace_want(x, w)
        _close(prog.run(device="CPU", dims=odd, symbolic=True, x=x, w=w)["out0"], v["b"] * v["t"] + 1)
    assert prog.last_run == "symbolic"
    prog.release()


def test_a_package_with_an_inplace_pair_runs_again_and_again(tmp_path):
    from tgc import package
    prog = tgc.loads(INPLACE + "return b * t + 1\n")
    path = tmp_path / "ip.tgpkg"
    package.write(prog, path, "CPU", DIMS)
    pkg = package.load_package(path)
    assert len(pkg.memory.inplace) == 1
    for seed in range(3):
        x, w = _inputs(seed)
        v = _inplace_want(x, w)
        _close(pkg.run(x=x, w=w)["out0"], v["b"] * v["t"] + 1)
    pkg.release()


def test_a_large_matmul_adds_a_dying_residual_in_place_with_the_wide_tile():
    """(x @ w2) + r * s at 8 x 1024 x 1024: the 4 x 64 register tile, column panels outermost, two threads, and
    the epilogue writing the output over r."""
    src = "x: f32[N, K]\nw1: f32[K, M]\nw2: f32[K, M]\nr = x @ w1\ns = r.sum(axis=0)\nreturn (x @ w2) + r * s\n"
    dims = {"N": 8, "K": 1024, "M": 1024}
    prog = tgc.loads(src)
    low = prog.lower("CPU", dims)
    assert len(low.memory_plan().inplace) == 1
    assert "UPCAST(1, 4)" in [str(o) for o in low.kernels[-1].opts]
    rng = np.random.default_rng(5)
    for _ in range(2):
        x = rng.standard_normal((8, 1024)).astype(np.float32)
        w1, w2 = (rng.standard_normal((1024, 1024)).astype(np.float32) * 0.03 for _ in range(2))
        r = x.astype(np.float64) @ w1
        _close(prog.run(device="CPU", dims=dims, x=x, w1=w1, w2=w2)["out0"], x.astype(np.float64) @ w2 + r * r.sum(0))
    prog.release()


def test_random_realistic_memory_plans_are_safe():
    """Kernels that each write a new buffer from inputs and earlier buffers, with random in-place requests:
    no two buffers live at one kernel share a slot unless a kept pair meets exactly there, in that kernel."""
    rng = random.Random(7)
    for _ in range(1500):
        inputs = [f"i{j}" for j in range(rng.randint(1, 3))]
        sizes = {n: rng.choice([4, 8, 16]) for n in inputs}
        kernels: list[list[str]] = []
        for i in range(rng.randint(1, 8)):
            sizes[f"t{i}"] = rng.choice([4, 8, 16])
            avail = inputs + [k[0] for k in kernels]
            kernels.append([f"t{i}", *rng.sample(avail, rng.randint(1, min(3, len(avail))))])
        read = {b for k in kernels for b in k[1:]}
        outputs = [k[0] for k in kernels if k[0] not in read or rng.random() < 0.15]
        pairs = [(k[0], b) for k in kernels for b in k[1:] if rng.random() < 0.6]
        plan = plan_memory(kernels, sizes, inputs, outputs, inplace=pairs)
        assert check_plan(plan) is None
        for i in range(-1, len(kernels) + 1):
            live = sorted(b for b, (f, last) in plan.lifetimes.items() if f <= i <= last)
            for x in live:
                for y in live:
                    if x < y and plan.slot_of[x] == plan.slot_of[y]:
                        assert any({o, s} == {x, y} and plan.lifetimes[s][1] == plan.lifetimes[o][0] == i
                                   and o in kernels[i] and s in kernels[i] for o, s in plan.inplace)
        for b in inputs:
            assert list(plan.slot_of.values()).count(plan.slot_of[b]) == 1
        assert all(plan.sizes[b] <= plan.slots[s] for b, s in plan.slot_of.items())


# ------------------------------------------------------------------------------------------- softmax, exp once


def _softmax(x: np.ndarray, axis) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


SOFTMAX = [
    ("x: f32[N, D]\nreturn softmax(x, axis=1).T + 0\n", lambda x: _softmax(x, 1).T),
    ("x: f32[N, D]\nreturn softmax(x * 2 + 1, axis=0)\n", lambda x: _softmax(x * 2 + 1, 0)),
    ("x: f32[N, D]\nreturn layernorm(softmax(x, axis=1))\n",
     lambda x: (lambda s: (s - s.mean(1, keepdims=True)) / np.sqrt(s.var(1, keepdims=True) + 1e-5))(_softmax(x, 1))),
    ("x: f32[N, D]\ne = exp(x - x.max(axis=1, keepdim=True))\nreturn e / e.sum(axis=1, keepdim=True) + e[:, ::-1]\n",
     lambda x: _softmax(x, 1) + np.exp(x - x.max(1, keepdims=True))[:, ::-1]),
    ("x: f32[N, D]\ne = exp(x)\ns = e.sum(axis=1, keepdim=True)\nreturn e / s + e / s[::-1]\n",
     lambda x: np.exp(x) / np.exp(x).sum(1, keepdims=True) + np.exp(x) / np.exp(x).sum(1, keepdims=True)[::-1]),
    ("x: f32[N, D]\ne = exp(x)\nreturn pad(e / e.sum(axis=1, keepdim=True), ((0, 0), (1, 1)))\n",
     lambda x: np.pad(np.exp(x) / np.exp(x).sum(1, keepdims=True), ((0, 0), (1, 1)))),
    ("x: f32[N, D]\nreturn softmax(x, axis=1) * softmax(x * 2, axis=1) + log_softmax(x, axis=1)\n",
     lambda x: _softmax(x, 1) * _softmax(x * 2, 1) + np.log(_softmax(x, 1))),
    ("x: f32[N, D]\nreturn softmax(reshape(x, (N, D // 4, 4)), axis=(1, 2))\n",
     lambda x: _softmax(x.reshape(x.shape[0], -1, 4), (1, 2))),
    ("x: f32[N, D]\nm = arange(D)[None, :] <= arange(N)[:, None]\nreturn softmax(where(m, x, -1e9), axis=1)\n",
     lambda x: _softmax(np.where(np.arange(x.shape[1])[None] <= np.arange(x.shape[0])[:, None], x, -1e9), 1)),
]


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
@pytest.mark.parametrize("shape", [(4, 4), (9, 12), (33, 20)])
@pytest.mark.parametrize("case", range(len(SOFTMAX)))
def test_row_softmax_variants_match_numpy(device, shape, case):
    src, ref = SOFTMAX[case]
    prog = tgc.loads(src)
    x = np.random.default_rng(case).standard_normal(shape).astype(np.float32)
    for _ in range(2 if device == "CPU" else 1):
        _close(prog.run(device=device, x=x)["out0"], ref(x))
    prog.release()


@pytest.mark.parametrize("n", [1, 3, 17, 4097])
def test_one_row_softmax_matches_numpy(n):
    prog = tgc.loads("x: f32[N]\nreturn softmax(x, axis=0)\n")
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    for symbolic in (False, True):
        _close(prog.run(device="CPU", symbolic=symbolic, x=x)["out0"], _softmax(x, 0))
    if n < 100:
        _close(prog.run(device="PYTHON", x=x)["out0"], _softmax(x, 0))


@pytest.mark.parametrize("src,dims", [
    ("x: f32[N, D]\nreturn softmax(x * 2 + 1, axis=1)\n", {"N": 4, "D": 17}),
    ("x: f32[N, D]\nreturn softmax(x, axis=0)\n", {"N": 17, "D": 4}),
    ("x: f32[N, D]\ne = exp(x - x.max(axis=1, keepdim=True))\nreturn e / e.sum(axis=1, keepdim=True) + e[:, ::-1]\n",
     {"N": 8, "D": 12}),
])
def test_every_beam_candidate_of_a_row_softmax_is_right(src, dims):
    """Every candidate BEAM builds one step from the unoptimized and from the hand-coded kernel, run on PYTHON
    (which checks bounds) with an output buffer full of NaN bytes (no value left by an earlier candidate can
    hide a store the candidate misses), equals the unoptimized kernel."""
    from tgc.api import _device

    dev = _device("PYTHON")
    tried = 0
    for item in [i for i in tgc.loads(src).schedule(dims, dev.name) if i.ast.src]:
        tried += _every_candidate_matches(dev, item)
    assert tried >= 10


def _every_candidate_matches(dev, item) -> int:
    from tgc.codegen.heuristic import hand_coded
    from tgc.codegen.opt import OptError, OptKernel
    from tgc.codegen.pipeline import prepare
    from tgc.codegen.search import Candidate, _matches, _render, actions
    from tgc.engine.inputs import random_values
    from tgc.ir.shapes import prod, shape_of

    ast = prepare(item.ast, dev)
    sizes = [max(prod(shape_of(b)) * b.dtype.itemsize, 1) for b in item.bufs]
    handles = [dev.allocator.alloc(n) for n in sizes]
    try:
        for i, b in enumerate(item.bufs[1:], 1):
            dev.allocator.copyin(handles[i], memoryview(random_values(b.dtype, shape_of(b), 0, i)).cast("B"))

        def run(c: Candidate) -> np.ndarray:
            _render(c, dev, item.name, item.bufs)
            prog = dev.program(item.name, dev.compiler.compile(c.src))
            dev.allocator.copyin(handles[0], memoryview(np.full(sizes[0], 0xFF, np.uint8)).cast("B"))
            prog(*[handles[i] for i in c.buf_index], global_size=c.launch.get("global_size", (1, 1, 1)),
                 local_size=c.launch.get("local_size"), vals=c.launch.get("vals", ()), wait=True)
            out = np.empty(shape_of(item.bufs[0]), dtype=item.bufs[0].dtype.np)
            dev.allocator.copyout(memoryview(out).cast("B"), handles[0])
            return out

        base = Candidate([], OptKernel(ast, dev))
        ref = run(base)
        seed = OptKernel(ast, dev)
        hand_coded(seed)
        tried = 0
        for parent in (base, Candidate(list(seed.applied), seed)):
            for opt in actions(parent.kernel):
                k = parent.kernel.copy()
                try:
                    k.apply(opt)
                except OptError:
                    continue
                c = Candidate(parent.opts + [opt], k)
                assert _matches(run(c), ref, item.bufs[0].dtype), [str(o) for o in c.opts]
                tried += 1
        return tried
    finally:
        for h, n in zip(handles, sizes):
            dev.allocator.free(h, n)


# ------------------------------------------------------------------------------------------- matmul tiles


@pytest.mark.parametrize("src,shapes,ref", [
    ("x: f32[A, B]\nreturn x[::-1, :].T + 1\n", [(32, 48)], lambda x: x[::-1, :].T + 1),
    ("x: f32[A, B]\nreturn x[::2, :].T + 1\n", [(64, 48)], lambda x: x[::2, :].T + 1),
    ("x: f32[A, B]\nreturn flip(x.T, 1) * 2\n", [(32, 48)], lambda x: x.T[:, ::-1] * 2),
    ("x: f16[A, B]\nreturn x.T + 1\n", [(32, 48)], lambda x: x.T + np.float16(1)),
    ("x: i64[A, B]\nreturn x.T * 3\n", [(32, 48)], lambda x: x.T * 3),
    ("x: f32[A, B, C]\nreturn permute(x, (2, 1, 0)) + 1\n", [(16, 8, 32)], lambda x: x.transpose(2, 1, 0) + 1),
    ("x: f32[A, B]\ny: f32[A]\nreturn (x + y[:, None]).T\n", [(32, 48), (32,)], lambda x, y: (x + y[:, None]).T),
    ("x: f32[A, B]\nreturn cat(x.T, x.T, axis=1) + 1\n", [(32, 48)], lambda x: np.concatenate([x.T, x.T], 1) + 1),
    ("a: f32[B, N, K]\nb: f32[B, M, K]\nreturn a @ b.transpose(1, 2)\n", [(3, 5, 33), (3, 70, 33)],
     lambda a, b: a.astype(np.float64) @ b.transpose(0, 2, 1)),
    ("a: f32[N, K]\nb: f32[K, M]\nreturn a @ b\n", [(5, 1025), (1025, 1024)], lambda a, b: a.astype(np.float64) @ b),
    ("a: f32[N, K]\nb: f32[K, M]\nreturn a @ b\n", [(4, 1024), (1024, 1040)], lambda a, b: a.astype(np.float64) @ b),
])
def test_transposes_and_matmuls_around_the_tile_thresholds(src, shapes, ref):
    prog = tgc.loads(src)
    rng = np.random.default_rng(len(src))
    names = [d.name for d in prog.inputs]
    arrays = {}
    for d, shape in zip(prog.inputs, shapes):
        v = rng.standard_normal(shape) * 4
        arrays[d.name] = v.astype(np.int64) if d.dtype.name == "i64" else v.astype(d.dtype.np)
    want = ref(*[arrays[n] for n in names])
    small = prod_of(shapes) < 20000
    for device in ("CPU", "PYTHON") if small else ("CPU",):
        for _ in range(2 if device == "CPU" else 1):
            got = prog.run(device=device, **arrays)["out0"]
            if got.dtype.kind in "iu":
                np.testing.assert_array_equal(got, want)
            else:
                _close(got, want, rtol=1e-2 if got.dtype == np.float16 else 1e-4)
    prog.release()


def prod_of(shapes: list[tuple[int, ...]]) -> int:
    return max(int(np.prod(s)) for s in shapes)


def _writes_nothing(src: str) -> str:
    """LLVM IR of a CPU kernel with the same signature as `src`'s that returns at once (writes no output)."""
    head = src.index("define void @")
    body = src.index("{", head) + 1
    end = src.index("\n}\n", body) + 3
    return src[:body] + "\nentry:\n  ret void\n}\n" + src[end:]


def test_beam_rejects_a_candidate_that_leaves_the_output_unwritten(monkeypatch):
    """A candidate that writes nothing is the fastest and, checked against the output buffer as the last
    candidate left it (right values), looked right: it won. Its output is checked from a buffer filled first."""
    from tgc.api import _device
    from tgc.codegen import search
    from tgc.codegen.heuristic import hand_coded
    from tgc.codegen.opt import OptKernel
    from tgc.codegen.pipeline import prepare

    dev = _device("CPU")
    if dev.compiler is None:
        pytest.skip("no CPU compiler here")
    dims = {"N": 8, "D": 64}
    (item,) = [i for i in tgc.loads("x: f32[N, D]\nreturn softmax(x, axis=1)\n").schedule(dims, "CPU") if i.ast.src]
    ast = prepare(item.ast, dev)
    seed = OptKernel(ast, dev)
    hand_coded(seed)
    trusted = {tuple(seed.applied[:n]) for n in range(len(seed.applied) + 1)}  # the unoptimized and the seeds
    render = search._render

    def broken(cand, device, name, bufs):
        render(cand, device, name, bufs)
        if tuple(cand.opts) not in trusted:
            cand.src = _writes_nothing(cand.src)

    monkeypatch.setattr(search, "_render", broken)
    res = search.beam_search(ast, dev, item.bufs, width=2, name=item.name)
    assert tuple(res.opts) in trusted and res.rejected >= 1


def test_a_package_bench_without_a_measured_peak_says_so(monkeypatch):
    """`tgc bench PKG` measures no peak (it compiles nothing); before any `tgc bench FILE.tg` on the machine (or
    after the peak's cache key changed) it said the CPU's peak was unknown."""
    from tgc.cli import report
    from tgc.engine import bench

    class Dev:
        kind = "CPU"

        def info(self) -> dict:
            return {}

        def cache_bytes(self) -> int:
            return 1 << 20

    monkeypatch.setattr(bench, "peak_key", lambda dev: "no such key")
    monkeypatch.setattr(bench.cache, "get_json", lambda *a, **k: None)
    note = report.peak_note({"device": "CPU", "peak": bench.machine_peak(Dev(), measure=False)})
    assert "not measured" in note and "unknown" not in note
    assert report.peak_note({"device": "PYTHON", "peak": {"gflops": None, "gbps": None}}) == \
        "peak: unknown for PYTHON, so no share of it is shown"
