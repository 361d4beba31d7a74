"""Symbolic program-cache entries (tgc/progcache.py `lookup_symbolic`/`store_symbolic`): a `run(symbolic=True)`
stores the symbolic package of the dims' size class (the saved `SymbolicPlan`), keyed by the class, not the
dims; a warm run at new dims of that class binds it (`SizeClassPlan.bind`) without tracing, scheduling or
lowering. Results are compared with numpy."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
from clikit import WARM_CLI
from test_progcache import SOFTMAX, _softmax, fresh_cache  # noqa: F401 (fresh_cache: autouse, so each test's own cache)

import tgc
from tgc import cache, progcache
from tgc.backends import get_device
from tgc.dtype import dtypes
from tgc.engine import bench
from tgc.engine.inputs import random_values

ROOT = Path(__file__).resolve().parent.parent
MATMUL = "x: f32[M, K]\nw: f32[K, N]\nreturn x @ w + 1.0, sum(x, axis=0)\n"


def _x(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _no_tracing(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("a warm symbolic run traced, scheduled or lowered")

    for name in ("create_schedule", "build_symbolic_kernel", "build_kernel"):
        monkeypatch.setattr(tgc.api, name, refuse)
    monkeypatch.setattr(tgc.api.Program, "_trace", refuse)


def test_a_symbolic_run_stores_its_class_and_a_new_program_runs_other_dims_of_it_without_tracing(monkeypatch):
    prog = tgc.loads(MATMUL)
    x, w = _x((37, 45)), _x((45, 23), 1)
    out = prog.run(x=x, w=w, symbolic=True)
    assert prog.last_run == "symbolic"
    np.testing.assert_allclose(out["out0"], x @ w + 1, rtol=1e-4, atol=1e-4)
    assert [e["meta"] for e in cache.entries("program")] == ["<string> CPU symbolic K=n M=n N=n"]
    warm = tgc.loads(MATMUL)  # (loading checks the program once at trial sizes: before the patch)
    _no_tracing(monkeypatch)
    for seed, (m, k, n) in enumerate([(37, 45, 23), (50, 61, 9), (201, 7, 130), (9, 300, 41)]):
        x, w = _x((m, k), seed), _x((k, n), seed + 10)
        out = warm.run(x=x, w=w, symbolic=True)
        assert warm.last_run == "symbolic"
        np.testing.assert_allclose(out["out0"], x @ w + 1, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out["out1"], x.sum(axis=0), rtol=1e-4, atol=1e-4)
    assert warm._plans == {}  # (no plan built: the entry's saved one was bound)
    assert len(cache.entries("program")) == 1


def test_the_key_is_the_size_class_another_class_device_or_source_misses():
    prog = tgc.loads(SOFTMAX)
    prog.run(x=_x((37, 45)), symbolic=True)
    cpu = get_device("CPU")
    assert progcache.lookup_symbolic(SOFTMAX, {"N": 50, "D": 61}, cpu) is not None  # other dims, same class
    assert progcache.lookup_symbolic(SOFTMAX, {"N": 50, "D": 64}, cpu) is None  # D a multiple of 32: "32n"
    assert progcache.lookup_symbolic(SOFTMAX, {"N": 1, "D": 61}, cpu) is None  # N = 1
    assert progcache.lookup_symbolic(SOFTMAX, {"N": 0, "D": 61}, cpu) is None  # a 0 dim is never cached
    assert progcache.lookup_symbolic(SOFTMAX.replace("exp(", "exp2("), {"N": 50, "D": 61}, cpu) is None
    assert progcache.lookup_symbolic(SOFTMAX, {"N": 50, "D": 61}, get_device("PYTHON")) is None
    assert progcache.lookup(SOFTMAX, {"N": 50, "D": 61}, cpu) is None  # (not a fixed-size entry)
    try:  # another device misses (OPENCL entries are stored since branch symvars: tests/test_symbolic_classbind.py)
        gpu = get_device("OPENCL")
    except tgc.TgcError:
        gpu = None
    if gpu is not None:
        assert progcache.lookup_symbolic(SOFTMAX, {"N": 50, "D": 61}, gpu) is None
    # a class of multiples of 32 is an entry of its own, and runs right
    x = _x((64, 96), 3)
    np.testing.assert_allclose(tgc.loads(SOFTMAX).run(x=x, symbolic=True)["out0"], _softmax(x), rtol=1e-5,
                               atol=1e-6)
    assert sorted(e["meta"] for e in cache.entries("program")) == ["<string> CPU symbolic D=32n N=32n",
                                                                   "<string> CPU symbolic D=n N=n"]
    entry = progcache.lookup_symbolic(SOFTMAX, {"N": 32, "D": 160}, cpu)
    assert entry is not None and entry.package.size_class(entry.dims).cls == {"N": "32n", "D": "32n"}


def test_dims_below_the_trusted_size_are_not_served_by_the_entry_and_run_checked_with_the_source():
    src = "x: f32[N]\nreturn x[:5] * 2.0\n"  # a slice that clamps below N = 5
    prog = tgc.loads(src)
    x = _x((1, 40))[0]
    np.testing.assert_allclose(prog.run(x=x, symbolic=True)["out0"], x[:5] * 2)
    cpu = get_device("CPU")
    found = progcache.load_symbolic(src, {"N": 40}, cpu)
    assert found is not None
    trusted = found[1].classes[0].min["N"]
    assert trusted > 5 and progcache.bind_symbolic(found, src, {"N": 3}, None) is None
    warm = tgc.loads(src)
    for n in (3, trusted, trusted + 30):
        x = _x((1, n), n)[0]
        np.testing.assert_allclose(warm.run(x=x, symbolic=True)["out0"], x[:5] * 2)


def test_a_damaged_symbolic_entry_is_a_miss_with_one_warning_never_a_wrong_result(capfd):
    tgc.loads(SOFTMAX).run(x=_x((37, 45)), symbolic=True)
    (key, value), = sqlite3.connect(cache.db_path()).execute("SELECT key, value FROM cache WHERE tbl = 'program'")
    inner = bytes(value)[cache._HEADER_LEN:]
    cache.put("program", key, inner[: len(inner) - 100])  # sealed correctly, the package inside truncated
    cache._reset_for_tests()
    capfd.readouterr()
    for seed in range(2):
        x = _x((50, 61), seed)
        np.testing.assert_allclose(tgc.loads(SOFTMAX).run(x=x, symbolic=True)["out0"], _softmax(x), rtol=1e-5,
                                   atol=1e-6)
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and "program" in err, err
    assert progcache.lookup_symbolic(SOFTMAX, {"N": 50, "D": 61}, get_device("CPU")) is not None  # stored again


def test_warm_tgc_run_and_bench_symbolic_at_new_dims_import_no_compiler_nor_front_end(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TGC_VERIFY_BOUNDS", "DEBUG", "BEAM", "NOOPT")}
    env["TGC_CACHE_DIR"] = str(tmp_path / "cache")

    def tgc_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", WARM_CLI, *args], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=300)

    # the machine's peak a bench reports, as if measured before (measuring it compiles: ~15 s on a loaded VM)
    cache.put("peak", bench.peak_key(get_device("CPU")), json.dumps({"gflops": 100.0, "gbps": 10.0}).encode())
    cold = tgc_cli("run", "kernels/softmax.tg", "--symbolic", "--random", "-D", "N=37", "-D", "D=45")
    assert cold.returncode == 0 and "llvmlite" in cold.stderr, cold.stderr
    for n, d in ((50, 61), (7, 203)):
        out = tmp_path / f"o{n}.npz"
        warm = tgc_cli("run", "kernels/softmax.tg", "--symbolic", "--random", "-D", f"N={n}", "-D", f"D={d}", "-o",
                       str(out))
        assert warm.returncode == 0, warm.stderr
        assert "HEAVY \n" in warm.stderr, warm.stderr  # neither llvmlite, the optimizer, the front end nor tgc.api
        x = random_values(dtypes.f32, (n, d), 0, 0)  # what `--random` drew (seed 0, input 0)
        np.testing.assert_allclose(np.load(out)["out0"], _softmax(x), rtol=1e-5, atol=1e-6)
    timed = tgc_cli("bench", "kernels/softmax.tg", "--symbolic", "-D", "N=91", "-D", "D=29", "--repeat", "2",
                    "--json")
    assert timed.returncode == 0 and "HEAVY \n" in timed.stderr, timed.stderr
    result = json.loads(timed.stdout)
    assert result["kernels_for"] == "size class" and result["dims"] == {"N": 91, "D": 29}
    listed = subprocess.run([sys.executable, "-m", "tgc.cli.main", "cache", "list", "--table", "program", "--json"],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "softmax.tg CPU symbolic D=n N=n" in listed.stdout


def test_cache_list_shows_a_narrowed_class_with_its_constraint():
    # a new-user trial: the entry of a class narrowed to C a multiple of D was listed as `C=n D=n T=n`, as if it
    # served every C; `tgc cache list` now says the constraint (the entry serves only those dims)
    from clikit import invoke

    prog = tgc.loads("x: f32[T, C]\nc: f32[D]\nreturn reshape(reshape(x, (T, C // D, D)) * c, (T, C))\n",
                     filename="h.tg")
    x, c = _x((9, 99)), np.arange(9, dtype=np.float32)
    out = prog.run(x=x, c=c, symbolic=True)
    assert prog.last_run == "symbolic"
    np.testing.assert_array_equal(out["out0"], (x.reshape(9, 11, 9) * c).reshape(9, 99))
    metas = [e["meta"] for e in cache.entries("program")]
    assert metas == ["h.tg CPU symbolic C=n D=n T=n, C a multiple of D"], metas
    r = invoke("cache", "list", "--table", "program", env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "symbolic C=n D=n T=n, C a multiple of D" in r.stdout, r.stdout
