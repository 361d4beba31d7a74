"""The spine's promises: cached binaries across processes, buffer reuse, opts' validity, BEAM persistence."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import tgc
from tgc.capabilities import Capabilities
from tgc.codegen import heuristic
from tgc.codegen.kernel import prepare_ast
from tgc.codegen.opt import Opt, OptError, OptKernel

RUN = """
import json, sys, numpy as np, tgc
from tgc.codegen.kernel import COMPILE_COUNTER
p = tgc.loads("a: f32[N, K]\\nb: f32[K, M]\\nreturn softmax(a @ b, 1), a.sum()")
out = p.run(a=np.ones((8, 16), np.float32), b=np.ones((16, 4), np.float32))
print(json.dumps({"compiles": COMPILE_COUNTER["compiles"], "llvmlite": "llvmlite" in sys.modules,
                  "sum": float(out["out1"])}))
"""


def _run(env: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


@pytest.fixture
def cache_env(tmp_path):
    env = dict(os.environ, TGC_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("DISABLE_COMPILER_CACHE", None)
    return env


def test_second_process_compiles_nothing(cache_env):
    first, _ = _run(cache_env)
    assert first["compiles"] >= 2 and first["sum"] == 128.0
    second, _ = _run(cache_env)
    assert second["compiles"] == 0
    assert second["llvmlite"] is False  # cached objects load without LLVM
    assert second["sum"] == 128.0


def test_disable_compiler_cache_compiles_again(cache_env):
    _run(cache_env)
    again, _ = _run(dict(cache_env, DISABLE_COMPILER_CACHE="1"))
    assert again["compiles"] >= 2


def test_corrupt_cache_warns_once_and_still_runs(cache_env, tmp_path):
    os.makedirs(tmp_path / "cache")
    db = tmp_path / "cache" / "cache.db"
    db.write_bytes(b"this is not a database" * 100)
    out, err = _run(cache_env)
    assert out["sum"] == 128.0
    assert err.count("warning") == 1
    assert db.read_bytes() == b"this is not a database" * 100  # the user's file is left alone


def test_a_one_off_run_allocates_only_its_outputs_and_a_plan_allocates_once():
    # a first run at some dims: intermediates come from the pool again, each output's memory is handed to the
    # caller (zero-copy), the input runs in place: it allocates exactly its outputs. Runs again at the same dims
    # go through a launch plan, which allocates its buffers once and then nothing
    from tgc.backends import get_device
    p = tgc.loads("x: f32[N, D]\nreturn softmax(x, 1), x.T @ x")
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    alloc = get_device("CPU").allocator
    alloc.free_cache()  # (the pool then holds this program's intermediates only, not other tests' buffers)
    p.run(x=x)
    p.release()  # (forget that it ran: the next run is a first run again)
    before = alloc.allocations
    out = p.run(x=x)
    assert alloc.allocations == before + 2
    np.testing.assert_allclose(out["out1"], x.T @ x, rtol=1e-4, atol=1e-3)
    p.run(x=x)  # the plan
    before = alloc.allocations
    for _ in range(3):
        out = p.run(x=x)
    assert alloc.allocations == before
    np.testing.assert_allclose(out["out1"], x.T @ x, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("opt, reason", [
    (Opt("UPCAST", 0, 3), "does not divide"),
    (Opt("UPCAST", 2, 4), "UNROLL"),
    (Opt("UNROLL", 0, 4), "reduction axes"),
    (Opt("UPCAST", 9, 2), "out of range"),
    (Opt("LOCAL", 0, 4), "GPU"),
    (Opt("GROUP", 2, 4), "GPU"),
    (Opt("SWAP", 0, 0), "distinct"),
    (Opt("PADTO", 2, 8), "already a multiple"),
    (Opt("BOGUS", 0, 2), "unknown"),
])
def test_illegal_opts_are_rejected_with_a_reason(opt, reason):
    from tgc.backends import get_device
    dev = get_device("CPU")
    p = tgc.loads("a: f32[N, K]\nb: f32[K, M]\nreturn a @ b")
    item = p.schedule({"N": 8, "K": 16, "M": 8})[0]
    k = OptKernel(prepare_ast(item.ast, dev), dev)
    with pytest.raises(OptError, match=reason):
        k.apply(opt)


@pytest.mark.parametrize("opts", [
    [Opt("UPCAST", 1, 8), Opt("UPCAST", 0, 2), Opt("PADTO", 2, 16), Opt("UNROLL", 2, 4)],
    [Opt("SWAP", 0, 1), Opt("UPCAST", 0, 4)],
    [Opt("PADTO", 2, 16), Opt("UNROLL", 2, 4)],
    [Opt("THREAD", 0, 2), Opt("UPCAST", 1, 16)],
])
def test_every_legal_opt_keeps_results(opts, monkeypatch):
    import tgc.codegen.search as S
    monkeypatch.setattr(S, "lookup", lambda ast, device, width=0: opts)  # as if BEAM had stored these
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((8, 13)).astype(np.float32), rng.standard_normal((13, 16)).astype(np.float32)
    p = tgc.loads("a: f32[N, K]\nb: f32[K, M]\nreturn a @ b")
    np.testing.assert_allclose(p.run(a=a, b=b)["out0"], a @ b, rtol=1e-4, atol=1e-4)
    assert p.compile(dims={"N": 8, "K": 13, "M": 16})[0].opts[:len(opts)] == opts


def test_noopt_gives_the_same_results(monkeypatch):
    x = np.random.default_rng(2).standard_normal((16, 32)).astype(np.float32)
    src = "x: f32[N, D]\nreturn softmax(x, 1), x @ x.T, x.sum(0)"
    want = tgc.loads(src).run(x=x)
    monkeypatch.setenv("NOOPT", "1")
    got = tgc.loads(src).run(x=x)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)


def test_beam_winners_persist_and_are_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "beamcache"))
    from tgc import cache
    cache._reset_for_tests()
    p = tgc.loads("a: f32[N, K]\nb: f32[K, M]\nreturn a @ b")
    dims = {"N": 32, "K": 32, "M": 32}
    first = p.beam(dims=dims, width=2)
    assert first["kernels"] and not first["kernels"][0]["cached"]
    assert first["kernels"][0]["after_s"] <= first["kernels"][0]["before_s"]
    second = tgc.loads("a: f32[N, K]\nb: f32[K, M]\nreturn a @ b").beam(dims=dims, width=2)
    assert all(k["cached"] for k in second["kernels"])  # nothing searched the second time
    k = p.compile(dims=dims)[0]
    assert [str(o) for o in k.opts if o.op != "THREAD"] == [o for o in first["kernels"][0]["opts"] if "THREAD" not in o]
    a = np.random.default_rng(3).standard_normal((32, 32)).astype(np.float32)
    np.testing.assert_allclose(p.run(a=a, b=a)["out0"], a @ a, rtol=1e-4, atol=1e-4)
    cache._reset_for_tests()


@pytest.mark.parametrize("a_shape, b_shape", [((16, 512), (512, 512)), ((2, 8, 512), (512, 512)),
                                              ((2, 16, 256), (2, 256, 1024))])  # (16 rows a weight: PACK_MIN_ROWS)
def test_large_matmuls_read_a_packed_copy_and_match_numpy(a_shape, b_shape, whole_copies):
    """Right-hand sides of >= 2^18 elements are packed into 32-column panels by a kernel of their own."""
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(a_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)
    p = tgc.loads(f"a: f32[{', '.join(map(str, a_shape))}]\nb: f32[{', '.join(map(str, b_shape))}]\nreturn a @ b")
    assert len(p.compile(dims={})) == 2  # the packing copy, then the matmul
    np.testing.assert_allclose(p.run(a=a, b=b)["out0"], a @ b, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(p.run(a=a, b=b, device="PYTHON")["out0"], a @ b, rtol=1e-4, atol=1e-3)


# ---------------------------------------------------------------------------------------------------------------
# work counts: what GFLOP/s is computed from


MATMUL = "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b"


@pytest.mark.parametrize("device", ["CPU", "PYTHON", "CUDA"])
@pytest.mark.parametrize("m, k, n", [(3, 5, 7), (64, 64, 64), (1001, 3, 7), (1024, 1024, 1024)])
def test_matmul_flops_are_2mnk(device, m, k, n):
    """Every launch's work: per-thread work times every grid and block dimension on GPUs (CUDA renders and
    compiles with NVRTC without a GPU), the per-thread slices of the CPU's threads (no double counting)."""
    kernels = tgc.loads(MATMUL).compile(device=device, dims={"M": m, "K": k, "N": n})
    assert sum(kern.flops for kern in kernels) == 2 * m * n * k


def _flops_with(src: str, dims: dict, device: str, opts: list) -> tuple[int, dict]:
    from tgc.backends import get_device
    from tgc.codegen.kernel import kernel_flops
    from tgc.codegen.pipeline import lower
    dev = get_device(device)
    item = tgc.loads(src).schedule(dims, device)[0]
    low = lower(item.ast, dev, item.bufs, item.name, opts=opts)
    assert [str(o) for o in low.applied] == [str(o) for o in opts]
    return kernel_flops(low.uops, dev, low.launch), low.launch


def test_cpu_threads_with_an_uneven_last_slice_count_exactly():
    """1000 rows over 3 threads: slices of 334, 334 and 332 rows, not 3 x 334."""
    flops, launch = _flops_with("x: f32[N, D]\nreturn x * 2.0 + 1.0", {"N": 1000, "D": 4}, "CPU",
                                [Opt("THREAD", 0, 3)])
    assert launch["global_size"][0] == 3 and flops == 2 * 1000 * 4


@pytest.mark.parametrize("device", ["CUDA", "OPENCL"])
@pytest.mark.parametrize("opts, combine", [
    ([], 0),
    ([Opt("GROUP", 1, 256)], 16 * 256),  # each row's 256 partials are added once, not by all 256 threads
    ([Opt("LOCAL", 0, 4), Opt("GROUP", 1, 64)], 16 * 64),
    ([Opt("GROUP", 1, 16), Opt("UNROLL", 1, 4)], 16 * 16),
])
def test_gpu_group_reduction_flops(device, opts, combine):
    flops, _ = _flops_with("x: f32[M, N]\nreturn x.sum(axis=1)", {"M": 16, "N": 4096}, device, opts)
    assert flops == 16 * 4096 + combine


def test_gpu_flops_multiply_every_grid_and_block_dim():
    from tgc.backends import get_device
    from tgc.codegen.kernel import kernel_flops
    from tgc.codegen.pipeline import lower
    dev = get_device("CPU")
    item = tgc.loads("x: f32[N]\nreturn x * 3.0").schedule({"N": 5})[0]
    uops = lower(item.ast, dev, item.bufs, item.name, opts=[]).uops  # one loop of 5 multiplies per thread

    class Gpu:
        caps = Capabilities(launch="gpu")

    assert kernel_flops(uops, Gpu(), {"global_size": (2, 3, 1), "local_size": (4, 1, 5)}) == 5 * 2 * 3 * 4 * 5
    assert kernel_flops(uops, dev, {"global_size": (1, 1, 1)}) == 5


@pytest.mark.parametrize("src, dims, want", [
    ("x: f32[N]\nreturn x[::16]", {"N": 4096}, (256 + 256) * 4),  # a sixteenth of x, not all of it
    ("x: f32[N]\nreturn x[::-1] + x", {"N": 100}, 200 * 4),  # two reads of the same elements count once
    ("v4: f32[4]\nreturn pad(v4, ((0, 3),), value=3.456)[2:6]", {}, (2 + 4) * 4),  # the gate keeps 2 in
    (MATMUL, {"M": 64, "K": 32, "N": 16}, (64 * 32 + 32 * 16 + 64 * 16) * 4),  # operands once each
    ("x: f32[N, D]\nreturn x[:, 0]", {"N": 50, "D": 7}, (50 + 50) * 4),
])
@pytest.mark.parametrize("device", ["CPU", "CUDA"])
def test_bytes_count_each_reachable_element_once(src, dims, want, device):
    kernels = tgc.loads(src).compile(device=device, dims=dims)
    assert [k.bytes_moved for k in kernels] == [want]


def test_debug_2_times_a_warm_launch_and_labels_the_first(monkeypatch, capsys):
    from types import SimpleNamespace

    from tgc.engine import realize
    times = iter([0.5, 0.002])
    calls = []

    def prog(*handles, **kw):
        calls.append(kw["wait"])
        return next(times)

    k = SimpleNamespace(src="", name="E_4", flops=4_000_000, bytes_moved=8_000_000, global_size=(1, 1, 1),
                        local_size=None, vals=(), device=SimpleNamespace(name="CPU"), program=lambda: prog)
    monkeypatch.setenv("DEBUG", "2")
    assert realize.launch(k, []) == 0.002
    line = capsys.readouterr().err
    assert calls == [True, True]
    assert "2000.00 us" in line and "2.00 GFLOP/s" in line and "4.00 GB/s" in line  # the warm launch's figures
    assert "first launch 500000.00 us" in line and "warm" in line
    monkeypatch.setenv("DEBUG", "0")
    calls.clear()
    times = iter([None])
    assert realize.launch(k, []) is None and calls == [False]  # without DEBUG: one launch, no wait


def test_debug_2_results_are_still_right(monkeypatch, capsys):
    """Each kernel runs twice under DEBUG=2: the second run must leave the same outputs."""
    x = np.random.default_rng(5).standard_normal((16, 64)).astype(np.float32)
    src = "x: f32[N, D]\nreturn softmax(x, 1), x @ x.T, x.sum(0), var(x, axis=0)"
    want = tgc.loads(src).run(x=x)
    monkeypatch.setenv("DEBUG", "2")
    got = tgc.loads(src).run(x=x)
    assert capsys.readouterr().err.count("first launch") >= 3
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)


@pytest.fixture
def fake_search(tmp_path, monkeypatch):
    """BEAM's store with a stand-in search (instant; records the widths searched)."""
    from tgc import cache
    from tgc.codegen import search
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "beamcache"))
    cache._reset_for_tests()
    widths: list[int] = []

    def beam_search(ast, device, bufs, width, name="kernel", progress=None, pool=None, **kw):
        widths.append(width)
        if progress:
            progress({"kernel": name, "round": 0, "candidate": 1, "candidates": 1, "best_s": 1e-6, "base_s": 2e-6})
        return search.SearchResult([Opt("UPCAST", 0, 2)], 2e-6, 1e-6)

    monkeypatch.setattr(search, "beam_search", beam_search)
    yield widths
    cache._reset_for_tests()


def test_beam_cache_reuses_only_a_search_at_least_as_wide(fake_search):
    src, dims = "x: f32[N, D]\nreturn x.sum(axis=1) * 2.0", {"N": 64, "D": 32}

    def beam(width, force=False):
        return tgc.loads(src).beam(dims=dims, width=width, force=force)["kernels"][0]

    assert not beam(2)["cached"] and fake_search == [2]
    assert beam(2)["cached"] and beam(1)["cached"] and fake_search == [2]
    assert not beam(8)["cached"] and fake_search == [2, 8]  # wider: searched again
    row = beam(4)
    assert row["cached"] and row["width"] == 8 and fake_search == [2, 8]
    assert not beam(4, force=True)["cached"] and fake_search == [2, 8, 4]  # --force: searched again
    # BEAM=W on compile/run/bench follows the same rule, and reports progress like `tgc beam`
    events: list[dict] = []
    k = tgc.loads(src).compile(dims=dims, beam=8, progress=events.append)[0]
    assert fake_search == [2, 8, 4, 8] and events and events[0]["index"] == 0 and events[0]["total"] == 1
    assert [str(o) for o in k.opts if o.op != "THREAD"] == ["UPCAST(0, 2)"]
    events.clear()
    tgc.loads(src).compile(dims=dims, beam=2, progress=events.append)
    searched = [e for e in events if "stage" not in e]  # (not the compile's own steps: "lowered", "compiled")
    assert fake_search == [2, 8, 4, 8] and searched == [{"kernel": k.name, "cached": True, "index": 0, "total": 1}]
    tgc.loads(src).compile(dims=dims)  # no BEAM: any stored winner is used, nothing is searched
    assert fake_search == [2, 8, 4, 8]


def test_beam_progress_on_run_and_bench_at_a_terminal(fake_search, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tgc.cli import main as cli
    from tgc.cli import report
    events: list[dict] = []
    closed: list[bool] = []
    monkeypatch.setattr(cli, "_stderr_tty", lambda: True)
    monkeypatch.setattr(report, "progress_bar", lambda enabled: (events.append, lambda: closed.append(enabled)))
    (tmp_path / "p.tg").write_text("x: f32[N, D]\nreturn x.sum(axis=1) * 2.0\n")
    runner = CliRunner(env={"NO_COLOR": "1", "DEBUG": None, "TGC_DEVICE": None, "BEAM": "3"})
    r = runner.invoke(cli.main, ["run", str(tmp_path / "p.tg"), "--random", "-D", "N=64", "-D", "D=32"])
    assert r.exit_code == 0, r.output
    assert fake_search == [3] and closed == [True] and any(e.get("round") == 0 for e in events)
    r = runner.invoke(cli.main, ["bench", str(tmp_path / "p.tg"), "-D", "N=64", "-D", "D=32", "--beam", "5",
                                 "--repeat", "1"])
    assert r.exit_code == 0, r.output
    assert fake_search == [3, 5] and closed == [True, True]
    r = runner.invoke(cli.main, ["compile", str(tmp_path / "p.tg"), "-D", "N=64", "-D", "D=32"])
    assert r.exit_code == 0, r.output
    assert fake_search == [3, 5] and closed == [True, True, True]  # the stored width-5 winner serves BEAM=3
    runner = CliRunner(env={"NO_COLOR": "1", "DEBUG": None, "TGC_DEVICE": None, "BEAM": None})
    r = runner.invoke(cli.main, ["run", str(tmp_path / "p.tg"), "--random", "-D", "N=64", "-D", "D=32"])
    assert r.exit_code == 0 and closed == [True, True, True]  # no BEAM: no bar


def _compile_rows(tmp_path) -> list[tuple[str, bytes]]:
    import sqlite3
    conn = sqlite3.connect(str(tmp_path / "cache" / "cache.db"))
    rows = conn.execute("SELECT key, value FROM cache WHERE tbl = 'compile'").fetchall()
    conn.close()
    return [(k, bytes(v)) for k, v in rows]


def test_damaged_cached_binaries_are_recompiled_with_one_warning(cache_env, tmp_path):
    import sqlite3
    first, _ = _run(cache_env)
    rows = _compile_rows(tmp_path)
    assert len(rows) >= 2
    conn = sqlite3.connect(str(tmp_path / "cache" / "cache.db"))
    with conn:  # truncate one binary and swap two others' bytes: both are misses, never run
        conn.execute("UPDATE cache SET value = ? WHERE key = ?", (rows[0][1][:len(rows[0][1]) // 2], rows[0][0]))
        conn.execute("UPDATE cache SET value = ? WHERE key = ?", (rows[0][1], rows[1][0]))
    conn.close()
    out, err = _run(cache_env)
    assert out["sum"] == first["sum"] and out["compiles"] == 2
    assert err.count("warning") == 1 and "checksum" in err
    again, err = _run(cache_env)
    assert again["compiles"] == 0 and err == ""


def test_cached_binary_that_does_not_load_is_a_miss(cache_env, tmp_path, monkeypatch):
    from tgc import cache
    _run(cache_env)
    monkeypatch.setenv("TGC_CACHE_DIR", cache_env["TGC_CACHE_DIR"])
    cache._reset_for_tests()
    try:
        for key, _ in _compile_rows(tmp_path):  # well-sealed entries whose bytes are no object file
            cache.put("compile", key, b"\x7fELF truncated")
    finally:
        cache._reset_for_tests()
    out, err = _run(cache_env)
    assert out["sum"] == 128.0 and out["compiles"] >= 2
    assert err.count("warning") == 1 and "does not load" in err
    again, _ = _run(cache_env)
    assert again["compiles"] == 0


def _search_with_fake_times(monkeypatch, times):
    """A real BEAM search of one small kernel (compiled and run, outputs checked) whose timer reports
    `times(opts, nth)` (nth: how often those opts were timed before) instead of the clock. Returns the
    result, the default kernel's opts and the timing counts."""
    from tgc.backends import get_device
    from tgc.codegen import search
    from tgc.codegen.heuristic import hand_coded
    dev = get_device("CPU")
    item = tgc.loads("a: f32[N, N]\nb: f32[N, N]\nreturn a @ b").schedule(dims={"N": 32})[0]
    ast = prepare_ast(item.ast, dev)
    seed = OptKernel(ast, dev)
    hand_coded(seed)
    default = tuple(seed.applied)
    assert default, "the heuristic optimizes this kernel"
    counts: dict[tuple, int] = {}
    real = search._Timer.run

    def fake(self, cand, best, runs=3):
        real(self, cand, float("inf"), runs=1)  # the kernel really runs: its output is still checked
        key = tuple(cand.opts)
        counts[key] = counts.get(key, 0) + 1
        return times(key == default, counts[key] - 1)
    monkeypatch.setattr(search._Timer, "run", fake)
    return search.beam_search(ast, dev, item.bufs, width=1), list(default), counts


def test_beam_keeps_the_default_when_a_winner_was_only_lucky(monkeypatch):
    # every other kernel is timed fast once (a lucky measurement), slower than the default after that
    res, default, counts = _search_with_fake_times(monkeypatch, lambda is_default, nth: 1.0 if is_default else
                                                   (0.5 if nth == 0 else 2.0))
    assert res.opts == default and res.before_s == res.after_s == 1.0
    assert sum(n > 1 for k, n in counts.items() if list(k) != default) == 1  # the lucky winner was timed again


def test_beam_keeps_the_default_when_it_is_fastest(monkeypatch):
    res, default, counts = _search_with_fake_times(monkeypatch, lambda is_default, nth: 1.0 if is_default else 2.0)
    assert res.opts == default and res.after_s == 1.0 and len(counts) > 2


def test_beam_winner_replaces_the_default_when_faster_again(monkeypatch):
    res, default, _ = _search_with_fake_times(monkeypatch, lambda is_default, nth: 1.0 if is_default else 0.5)
    assert res.opts != default and res.before_s == 1.0 and res.after_s == 0.5


@pytest.mark.parametrize("src, dims, tile", [
    ("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b", {"M": 64, "K": 32, "N": 256},
     ["UPCAST(1, 16)", "UPCAST(1, 2)", "UPCAST(0, 8)"]),  # 8 rows x 32 columns
    ("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b", {"M": 64, "K": 32, "N": 64},
     ["UPCAST(1, 16)", "UPCAST(0, 8)"]),  # 8 rows x 16 columns (64 columns are 4 vectors: too few to take 2)
    # 24-wide image rows take 8 vector lanes: 32 output channels make up the tile (it took 8 before)
    ("x: f32[N, C, H, W]\nw: f32[O, C, 3, 3]\nreturn conv2d(x, w, padding=1)",
     {"N": 2, "C": 8, "H": 6, "W": 24, "O": 64}, ["UPCAST(3, 8)", "UPCAST(1, 32)", "UNROLL(4, 2)"]),
    # q @ k^T gathers each vector of k's rows (a stride of D): one vector's columns, shared by 32 rows
    ("a: f32[H, S, D]\nb: f32[H, T, D]\nreturn a @ b.transpose(1, 2)", {"H": 2, "S": 64, "T": 64, "D": 16},
     ["UPCAST(2, 16)", "UPCAST(1, 32)"]),
])
def test_heuristic_register_tile_of_matmul_and_conv(src, dims, tile):
    prog = tgc.loads(src)
    k = prog.compile(device="CPU", dims=dims, tuned=False)[-1]
    assert [str(o) for o in k.opts if o.op != "THREAD"] == tile
    rng = np.random.default_rng(3)
    inputs = {d.name: rng.standard_normal([dims[s] if isinstance(s, str) else s for s in d.shape]).astype(np.float32)
              for d in prog.inputs}
    got = prog.run(**inputs)["out0"]
    if "conv2d" in src:
        x, w = inputs["x"], inputs["w"]
        win = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), (2, 3))
        want = np.einsum("nchwij,ocij->nohw", win, w)
    else:
        want = inputs["a"] @ (inputs["b"].transpose(0, 2, 1) if "transpose" in src else inputs["b"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.fixture
def two_mib_l2(monkeypatch):
    """The exact opts below are written for a private (L2) cache of 2 MiB per core (the Intel Xeon they were
    measured on): the panel rule (`heuristic._panels_wanted`) compares a matmul's operand with this host's L2,
    which is 1 MiB on an AMD Zen 4, so the tests pin it rather than depend on the CPU they run on."""
    monkeypatch.setattr(heuristic, "private_cache_bytes", lambda: 2 << 20)


def test_heuristic_packing_copy_is_vectorized_and_large_matmuls_put_column_panels_outermost(two_mib_l2,
                                                                                         whole_copies):
    # the packing copy's rows of 32 are written as 16-wide vectors (LLVM left them mostly scalar); a right-hand
    # side past one core's private cache (4 MiB here) is walked panel by panel (SWAP), a small one (1 MiB) row
    # block by row block
    rng = np.random.default_rng(4)
    prog = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b")
    for k_dim, swapped in ((256, False), (1024, True)):
        dims = {"M": 16, "K": k_dim, "N": 1024}
        pack, mm = prog.compile(device="CPU", dims=dims, tuned=False)
        assert [str(o) for o in pack.opts if o.op != "THREAD"] == ["UPCAST(2, 16)", "UPCAST(2, 2)", "SWAP(0, 1)"]
        assert ("SWAP(0, 1)" in [str(o) for o in mm.opts]) == swapped
        a, b = (rng.standard_normal(s).astype(np.float32) for s in ((16, k_dim), (k_dim, 1024)))
        np.testing.assert_allclose(prog.run(a=a, b=b)["out0"], a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("m, k, n, tile", [
    # what `make bench`'s matmul 2048^3 runs with default kernels: a 4 x 64 register tile, column panels outermost
    (2048, 2048, 2048, ["UPCAST(1, 16)", "UPCAST(1, 4)", "UPCAST(0, 4)", "SWAP(0, 1)"]),
    (4096, 1024, 1024, ["UPCAST(1, 16)", "UPCAST(1, 4)", "UPCAST(0, 4)", "SWAP(0, 1)"]),  # 2^20 elements of b
    (2048, 512, 512, ["UPCAST(1, 16)", "UPCAST(1, 2)", "UPCAST(0, 8)"]),  # b (1 MiB) in one core's cache
    (2048, 1024, 512, ["UPCAST(1, 16)", "UPCAST(1, 2)", "UPCAST(0, 8)", "SWAP(0, 1)"]),  # b (2 MiB) is not
    # 15 panels of 64 would be too few to swap; 30 of 32 are not
    (2048, 16384, 960, ["UPCAST(1, 16)", "UPCAST(1, 2)", "UPCAST(0, 8)", "SWAP(0, 1)"]),
    # 4 does not divide m: padded to 2056 rows for the full 8-row tile (not 2 rows, a quarter of the accumulators)
    (2050, 1024, 2048, ["UPCAST(1, 16)", "UPCAST(1, 2)", "PADTO(0, 8)", "UPCAST(0, 8)", "SWAP(0, 1)"]),
])
def test_heuristic_opts_of_large_matmuls(m, k, n, tile, two_mib_l2):
    # the packing copy is a plain copy of b, front to back (each row's panels in turn); the matmul keeps 16
    # accumulators, as 4 rows x 64 columns where its column panels go outermost (the left-hand side then
    # streams once per 64 columns), else 8 x 32
    pack, mm = tgc.loads(MATMUL).compile(device="CPU", dims={"M": m, "K": k, "N": n}, tuned=False)
    assert [str(o) for o in pack.opts if o.op != "THREAD"][:1] == ["UPCAST(2, 16)"]
    assert [str(o) for o in mm.opts if o.op != "THREAD"] == tile


@pytest.mark.parametrize("m, k, n, tile", [
    # 65 and 77 rows: padded to whole tiles of 8 (rule padded_rows: 72 and 80 rows, the extra rows' stores off)
    (65, 1024, 1024, ["UPCAST(1, 16)", "UPCAST(1, 2)", "PADTO(0, 8)", "UPCAST(0, 8)", "SWAP(0, 1)"]),
    (77, 256, 4096, ["UPCAST(1, 16)", "UPCAST(1, 2)", "PADTO(0, 8)", "UPCAST(0, 8)", "SWAP(0, 1)"]),
    (5, 258, 4096, ["UPCAST(1, 16)", "UPCAST(1, 2)", "SWAP(0, 1)", "UPCAST(0, 4)"]),  # 4 does not divide k
    (64, 1024, 1024, ["UPCAST(1, 16)", "UPCAST(1, 4)", "UPCAST(0, 4)", "SWAP(0, 1)"]),  # rows take the tile
])
def test_rows_without_a_tile_take_more_columns_and_match_numpy(m, k, n, tile, two_mib_l2, whole_copies):
    """Rows with no divisor the row tile takes: padded to whole tiles where that wastes at most 1/8 of them (65,
    77); else (5) one row per step, so 4 times the columns and 4 steps of the reduction instead (BEAM's pick;
    65 x 1024 x 1024 ran 3x slower that way than 64 rows with 2 accumulators)."""
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    prog = tgc.loads(MATMUL)
    mm = prog.compile(device="CPU", dims={"M": m, "K": k, "N": n}, tuned=False)[-1]
    assert [str(o) for o in mm.opts if o.op != "THREAD"] == tile
    for device in ("CPU", "PYTHON") if m * k * n <= 1 << 24 else ("CPU",):
        np.testing.assert_allclose(prog.run(device=device, a=a, b=b)["out0"], a @ b, rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("m, k, n", [(4, 1024, 1024), (12, 2048, 1024), (2052, 512, 2048)])
def test_wide_register_tile_matches_numpy(m, k, n):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    prog = tgc.loads(MATMUL)
    mm = prog.compile(device="CPU", dims={"M": m, "K": k, "N": n}, tuned=False)[-1]
    assert "UPCAST(1, 4)" in [str(o) for o in mm.opts]
    for device in ("CPU", "PYTHON"):
        np.testing.assert_allclose(prog.run(device=device, a=a, b=b)["out0"], a @ b, rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("a_shape, b_shape, order", [
    ((16, 2048), (2048, 160), ["UPCAST(2, 16)", "UPCAST(2, 2)", "SWAP(0, 1)"]),  # 5 panels (16 rows: PACK_MIN_ROWS)
    ((16, 2048), (2048, 192), ["UPCAST(2, 16)", "UPCAST(2, 2)", "SWAP(0, 1)"]),
    ((16, 1024), (1024, 384), ["UPCAST(2, 16)", "UPCAST(2, 2)", "SWAP(0, 1)"]),
    ((2, 16, 256), (2, 256, 1024), ["UPCAST(3, 16)", "UPCAST(3, 2)", "SWAP(1, 2)"]),  # the batch stays outermost
    ((2, 16, 33), (2, 33, 8192), ["UPCAST(3, 16)", "UPCAST(3, 2)", "SWAP(1, 2)"])])  # k = 33
def test_packing_copies_stream_their_source_and_match_numpy(a_shape, b_shape, order):
    """The packing copy is written as a plain copy of b, front to back: b's rows outside the panels, each row of
    a panel (32 columns) as two whole vectors (docs/DESIGN.md "Packing copy at memory speed")."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(a_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)
    p = tgc.loads(f"a: f32[{', '.join(map(str, a_shape))}]\nb: f32[{', '.join(map(str, b_shape))}]\nreturn a @ b")
    pack = p.compile(device="CPU", dims={}, tuned=False)[0]
    assert [str(o) for o in pack.opts if o.op != "THREAD"] == order
    for device in ("CPU", "PYTHON"):
        np.testing.assert_allclose(p.run(a=a, b=b, device=device)["out0"], a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("src, shapes, tile", [
    ("a: f32[33, 512]\nb: f32[1024, 512]\nreturn a @ b.transpose(1, 0)", [(33, 512), (1024, 512)],
     ["UPCAST(2, 16)", "UPCAST(1, 8)"]),
    ("a: f32[2, 7, 512]\nb: f32[2, 1024, 512]\nreturn a @ b.transpose(1, 2)", [(2, 7, 512), (2, 1024, 512)],
     ["UPCAST(3, 16)", "UPCAST(2, 8)"]),
    ("x: f32[33, 512]\nw: f32[1024, 512]\nb: f32[1024]\nreturn gelu(x @ w.transpose(1, 0) + b)",
     [(33, 512), (1024, 512), (1024,)], ["UPCAST(2, 16)", "UPCAST(1, 8)"]),
    ("x: f32[64, 128]\nreturn x.transpose(0, 1) + 1.0", [(64, 128)], ["UPCAST(1, 16)", "UPCAST(0, 8)"]),
    ("x: f32[60, 128]\nreturn x.transpose(0, 1) + 1.0", [(60, 128)], []),  # 60 rows: 8 does not divide, no tile
])
def test_transposing_copies_take_a_16x8_tile_and_match_numpy(src, shapes, tile):
    # the packing copy of a transposed right-hand side (and any copy whose store is contiguous along a short
    # last axis and whose loads along another): 16 x 8 values a step, vector loads and shuffles
    rng = np.random.default_rng(6)
    p = tgc.loads(src)
    args = dict(zip([d.name for d in p.inputs], (rng.standard_normal(s).astype(np.float32) for s in shapes)))
    first = p.compile(device="CPU", dims={}, tuned=False)[0]
    assert [str(o) for o in first.opts if o.op != "THREAD"] == tile
    if "gelu" in src:  # the exact (erf) GELU
        h = (args["x"].astype(np.float64) @ args["w"].T + args["b"])
        want = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
    else:
        want = (args["a"] @ np.swapaxes(args["b"], -1, -2)) if "a" in args else args["x"].T + 1.0
    for device in ("CPU", "PYTHON"):
        np.testing.assert_allclose(p.run(device=device, **args)["out0"], want, rtol=1e-4, atol=1e-3)
