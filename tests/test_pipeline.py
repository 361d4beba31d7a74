"""The spine's promises: cached binaries across processes, buffer reuse, opts' validity, BEAM persistence."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tgc
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


def test_second_run_allocates_nothing():
    from tgc.backends import get_device
    p = tgc.loads("x: f32[N, D]\nreturn softmax(x, 1), x.T @ x")
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    p.run(x=x)
    alloc = get_device("CPU").allocator
    before = alloc.allocations
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
    import tgc.codegen.opt as O
    orig = O.optimize
    monkeypatch.setattr(O, "optimize", lambda ast, device, beam=0, bufs=None, opts=None: orig(ast, device, opts=_opts))
    _opts = opts
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((8, 13)).astype(np.float32), rng.standard_normal((13, 16)).astype(np.float32)
    p = tgc.loads("a: f32[N, K]\nb: f32[K, M]\nreturn a @ b")
    np.testing.assert_allclose(p.run(a=a, b=b)["out0"], a @ b, rtol=1e-4, atol=1e-4)


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
                                              ((2, 8, 256), (2, 256, 1024)), ((512,), (512, 512))])
def test_large_matmuls_read_a_packed_copy_and_match_numpy(a_shape, b_shape):
    """Right-hand sides of >= 2^18 elements are packed into 32-column panels by a kernel of their own."""
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(a_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)
    p = tgc.loads(f"a: f32[{', '.join(map(str, a_shape))}]\nb: f32[{', '.join(map(str, b_shape))}]\nreturn a @ b")
    assert len(p.compile(dims={})) == 2  # the packing copy, then the matmul
    np.testing.assert_allclose(p.run(a=a, b=b)["out0"], a @ b, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(p.run(a=a, b=b, device="PYTHON")["out0"], a @ b, rtol=1e-4, atol=1e-3)


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
