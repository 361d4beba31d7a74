"""The program cache (tgc/progcache.py): a program compiled for one device and dims, kept in package form in the
disk cache; a warm run loads it and runs without lowering or compiling. Results are compared with numpy."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tgc
from tgc import cache, progcache
from tgc.backends import get_device
from tgc.engine import chunk

SOFTMAX = "x: f32[N, D]\nm = x.max(axis=1, keepdim=True)\ne = exp(x - m)\nreturn e / sum(e, axis=1, keepdim=True)\n"
DIMS = {"N": 4, "D": 8}
ROOT = Path(__file__).resolve().parent.parent


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """A cache of this test's own, with the program cache on (the session turns TGC_VERIFY_BOUNDS on, which
    bypasses it)."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("TGC_VERIFY_BOUNDS", "DISABLE_COMPILER_CACHE", "BEAM", "NOOPT", "DEBUG"):
        monkeypatch.delenv(name, raising=False)
    cache._reset_for_tests()
    yield
    cache._reset_for_tests()


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)


def _stored_run(source: str = SOFTMAX) -> tgc.Program:
    prog = tgc.loads(source)
    got = prog.run(x=_x())["out0"]
    np.testing.assert_allclose(got, _softmax(_x()), rtol=1e-5)
    return prog


def test_a_run_stores_the_program_and_a_new_program_object_runs_it_without_lowering(monkeypatch):
    _stored_run()
    assert len(cache.entries("program")) == 1
    prog = tgc.loads(SOFTMAX)

    def no_lowering(*a, **k):
        raise AssertionError("a warm run lowered a kernel")

    monkeypatch.setattr(tgc.api, "build_kernel", no_lowering)
    monkeypatch.setattr(tgc.api, "create_schedule", no_lowering)
    for seed in range(3):  # again and again: the entry's launch plan
        np.testing.assert_allclose(prog.run(x=_x(seed))["out0"], _softmax(_x(seed)), rtol=1e-5)


def test_the_entry_a_run_stores_is_built_on_the_runs_memory_plan_and_equals_a_fresh_build(monkeypatch):
    """A cold run stores its entry from the executable it ran (its memory plan planned once, not again for the
    package); the entry's bytes are those of a package built from the program lowered afresh."""
    from tgc.engine import realize

    stored: list[bytes] = []
    orig_put = cache.put

    def put(table, key, value, **kw):
        if table == progcache.TABLE:
            stored.append(value)
        return orig_put(table, key, value, **kw)

    plans = [0]
    orig_plan = realize.plan_for

    def plan_for(*a, **kw):
        plans[0] += 1
        return orig_plan(*a, **kw)

    monkeypatch.setattr(cache, "put", put)
    monkeypatch.setattr(realize, "plan_for", plan_for)
    prog = _stored_run()
    assert len(stored) == 1 and plans[0] == 1  # planned for the run only
    # the same program's entry built afresh (lowered again, planned again): the same bytes
    progcache.store(prog, get_device("CPU"), prog.resolve_dims(DIMS), recompute=prog.recompute("CPU", DIMS))
    assert plans[0] == 2 and len(stored) == 2 and stored[1] == stored[0]


def test_the_key_misses_on_another_source_dim_device_compiler_or_version(monkeypatch):
    _stored_run()
    cpu = get_device("CPU")
    assert progcache.lookup(SOFTMAX, DIMS, cpu) is not None
    # line ends, trailing spaces and a byte-order mark are normalized away
    assert progcache.lookup("\ufeff" + SOFTMAX.replace("\n", "  \r\n"), DIMS, cpu) is not None
    assert progcache.lookup(SOFTMAX.replace("exp(", "exp2("), DIMS, cpu) is None
    assert progcache.lookup(SOFTMAX, {"N": 4, "D": 9}, cpu) is None
    assert progcache.lookup(SOFTMAX, DIMS, get_device("PYTHON")) is None
    # each change alone (monkeypatch.undo() would also undo the fixture's cache folder: every lookup would miss)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(progcache, "__version__", "0.0.0-other")
        assert progcache.lookup(SOFTMAX, DIMS, cpu) is None
    assert progcache.lookup(SOFTMAX, DIMS, cpu) is not None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(cpu.compiler), "cache_key", property(lambda self: "llvmlite-other-version"))
        assert progcache.lookup(SOFTMAX, DIMS, cpu) is None
    assert progcache.lookup(SOFTMAX, DIMS, cpu) is not None
    # the same version number, other code (an edited checkout, a reinstall): a miss, never the old program
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(progcache, "code_identity", lambda: "edited-code")
        assert progcache.lookup(SOFTMAX, DIMS, cpu) is None
    assert progcache.lookup(SOFTMAX, DIMS, cpu) is not None


def test_the_code_identity_follows_every_source_file(tmp_path):
    import os

    from tgc.version import identity_of
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "schedule.py").write_text("x = 1\n")
    (tmp_path / "README.txt").write_text("not source")
    first = identity_of(str(tmp_path))
    assert identity_of(str(tmp_path)) == first
    (tmp_path / "README.txt").write_text("still not source, longer")
    assert identity_of(str(tmp_path)) == first
    (tmp_path / "engine" / "schedule.py").write_text("x = 2\n")  # same size: the modification time tells
    st = os.stat(tmp_path / "engine" / "schedule.py")
    os.utime(tmp_path / "engine" / "schedule.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = identity_of(str(tmp_path))
    assert second != first
    (tmp_path / "engine" / "new.py").write_text("")
    assert identity_of(str(tmp_path)) not in (first, second)


def test_the_key_misses_after_a_new_beam_winner_or_another_kernel_setting(monkeypatch):
    _stored_run()
    cpu = get_device("CPU")
    assert progcache.lookup(SOFTMAX, DIMS, cpu) is not None
    monkeypatch.setenv("NOOPT", "1")
    assert progcache.lookup(SOFTMAX, DIMS, cpu) is None
    monkeypatch.delenv("NOOPT")
    monkeypatch.setenv("TGC_THREADS", "1")
    assert progcache.lookup(SOFTMAX, DIMS, cpu) is None
    monkeypatch.delenv("TGC_THREADS")
    cache.put("beam", "some-kernel", b"{}")  # any change to the BEAM winners
    assert progcache.lookup(SOFTMAX, DIMS, cpu) is None


@pytest.mark.parametrize("how", ["bytes", "package"])
def test_a_damaged_entry_is_a_miss_with_one_warning_never_a_wrong_result(how, capfd):
    _stored_run()
    (row,) = sqlite3.connect(cache.db_path()).execute("SELECT key, value FROM cache WHERE tbl = 'program'")
    key, value = row[0], bytes(row[1])
    if how == "bytes":  # truncated on disk: the cache's own checksum
        with sqlite3.connect(cache.db_path()) as db:
            db.execute("UPDATE cache SET value = ? WHERE tbl = 'program'", (value[: len(value) // 2],))
    else:  # sealed correctly, but the package inside is truncated: the package's checksum
        inner = value[cache._HEADER_LEN:]
        cache.put("program", key, inner[: len(inner) - 100])
    cache._reset_for_tests()
    capfd.readouterr()
    for seed in range(2):
        got = tgc.loads(SOFTMAX).run(x=_x(seed))["out0"]
        np.testing.assert_allclose(got, _softmax(_x(seed)), rtol=1e-5)
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and "program/" in err, err
    assert progcache.lookup(SOFTMAX, DIMS, get_device("CPU")) is not None  # rebuilt


def test_disable_compiler_cache_and_verify_bounds_bypass_it(monkeypatch):
    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")
    _stored_run()
    monkeypatch.delenv("DISABLE_COMPILER_CACHE")
    monkeypatch.setenv("TGC_VERIFY_BOUNDS", "1")
    _stored_run()
    assert cache.entries("program") == []


def test_a_chunked_program_is_stored_as_its_chunk_and_runs_in_chunks(monkeypatch):
    monkeypatch.setattr(chunk, "MIN_CHUNK_BYTES", 0)
    src = "x: f32[B, C]\nw1: f32[C, H]\nw2: f32[H, C]\nreturn gelu(x @ w1) @ w2\n"
    dims = {"B": 256, "C": 8, "H": 512}
    rng = np.random.default_rng(1)
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((256, 8), (8, 512), (512, 8)))
    h = x.astype(np.float64) @ w1
    from math import erf
    want = (0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2)))) @ w2
    cold = tgc.loads(src)
    np.testing.assert_allclose(cold.run(x=x, w1=w1, w2=w2)["out0"], want, rtol=1e-4, atol=1e-4)
    assert cold.last_chunking is not None
    entry = progcache.lookup(src, dims, get_device("CPU"))
    assert entry is not None and entry.chunk["count"] == cold.last_chunking.count
    # (the run planned the whole program before chunking it: the entry keeps its recompute factor)
    assert entry.recompute == cold.recompute("CPU", dims) and entry.recompute["factor"] == 1.0
    pkg = entry.package  # the package holds one chunk
    assert pkg.buffers[pkg.inputs[0].buffer].plan_shape == (256 // cold.last_chunking.count, 8)
    warm = tgc.loads(src)
    for _ in range(2):
        np.testing.assert_allclose(warm.run(x=x, w1=w1, w2=w2)["out0"], want, rtol=1e-4, atol=1e-4)
        assert warm.last_chunking is not None and warm.last_chunking.count == cold.last_chunking.count


def test_inputs_of_other_sizes_miss_and_bad_inputs_get_the_binders_error():
    _stored_run()
    prog = tgc.loads(SOFTMAX)
    x = np.random.default_rng(3).standard_normal((4, 9)).astype(np.float32)
    np.testing.assert_allclose(prog.run(x=x)["out0"], _softmax(x), rtol=1e-5)
    assert len(cache.entries("program")) == 2
    with pytest.raises(tgc.TgcError, match=r"has 3 dims \[4, 8, 1\], but is declared f32\[N, D\]"):
        prog.run(x=np.ones((4, 8, 1), np.float32))


from clikit import WARM_CLI as WARM  # noqa: E402


def _tgc(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WARM, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


def test_a_warm_tgc_run_imports_neither_llvmlite_nor_the_optimizer_nor_the_front_end(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TGC_VERIFY_BOUNDS", "DEBUG", "BEAM", "NOOPT")}
    env["TGC_CACHE_DIR"] = str(tmp_path / "cache")
    args = ["run", "kernels/softmax.tg", "--random", "-D", "N=4", "-D", "D=8", "-o", str(tmp_path / "out.npz")]
    cold = _tgc(args, env)
    assert cold.returncode == 0, cold.stderr
    assert "tgc.codegen.opt" in cold.stderr and "llvmlite" in cold.stderr
    first = np.load(tmp_path / "out.npz")["out0"]
    warm = _tgc(args, env)
    assert warm.returncode == 0, warm.stderr
    assert "HEAVY \n" in warm.stderr, warm.stderr
    again = np.load(tmp_path / "out.npz")["out0"]
    np.testing.assert_array_equal(again, first)  # the same random inputs, the same program
    # --check still works warm: the reference loads the front end, the run itself does not compile
    checked = _tgc([*args[:-2], "--check"], env)
    assert checked.returncode == 0 and "check: ok" in checked.stderr, checked.stderr
    # a -D the program lacks, or an input file: the cold path (its warning), still without compiling
    extra = _tgc([*args, "-D", "Q=3"], env)
    assert extra.returncode == 0 and "the program has no dim Q" in extra.stderr


def test_tgc_cache_lists_and_clears_program_entries(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TGC_VERIFY_BOUNDS"}
    env["TGC_CACHE_DIR"] = str(tmp_path / "cache")
    run = [sys.executable, "-m", "tgc.cli.main"]
    r = subprocess.run([*run, "run", "kernels/softmax.tg", "--random", "-D", "N=4", "-D", "D=8"], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    listed = subprocess.run([*run, "cache", "list", "--table", "program", "--json"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    rows = json.loads(listed.stdout)
    assert [r["meta"] for r in rows] == ["softmax.tg CPU D=8 N=4"]
    cleared = subprocess.run([*run, "cache", "clear", "--table", "program"], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert cleared.returncode == 0 and "1 entry removed" in cleared.stdout


# ---- compile on every core (tgc.codegen.kernel.build_kernels) and where the time goes (tgc.timings)

MLP = ("x: f32[B, IN]\nw1: f32[IN, HID]\nb1: f32[HID]\nw2: f32[HID, OUT]\nb2: f32[OUT]\n"
       "return log_softmax(gelu(x @ w1 + b1) @ w2 + b2, axis=1), sum(x, axis=0)\n")
MLP_DIMS = {"B": 8, "IN": 32, "HID": 64, "OUT": 10}


def test_parallel_compile_gives_the_serial_compiles_binaries_byte_for_byte(monkeypatch):
    from tgc.codegen import kernel

    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")  # both compile every kernel
    kernel._shutdown_pools()  # (the workers are kept per process: start this test's own)
    monkeypatch.setattr(kernel, "PARALLEL_MIN_SOURCE", 0)  # these kernels are small: send them all
    cpu = get_device("CPU")
    pools = []
    real_pool = type(cpu).compile_pool

    def counting_pool(self, workers):
        pools.append(workers)
        return real_pool(self, workers)

    monkeypatch.setattr(type(cpu), "compile_pool", counting_pool)
    monkeypatch.setenv("TGC_JOBS", "1")
    serial = tgc.loads(MLP).compile("CPU", MLP_DIMS)
    assert pools == [] and len(serial) >= 3
    monkeypatch.setenv("TGC_JOBS", "2")
    parallel = tgc.loads(MLP).compile("CPU", MLP_DIMS)
    assert pools == [2]  # the worker processes compiled
    assert [k.src for k in parallel] == [k.src for k in serial]
    assert [k.binary for k in parallel] == [k.binary for k in serial]
    assert all(k.binary for k in parallel)
    rng = np.random.default_rng(0)
    arrays = {d.name: rng.standard_normal([MLP_DIMS[s] for s in d.shape]).astype(np.float32)
              for d in tgc.loads(MLP).inputs}
    prog = tgc.loads(MLP)
    got = prog.run(**arrays)
    want = prog.reference(**arrays)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


def _compile_json(tmp_path: Path, *extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TGC_VERIFY_BOUNDS", "DEBUG")}
    env["TGC_CACHE_DIR"] = str(tmp_path / "cache")
    src = tmp_path / "mlp.tg"
    src.write_text(MLP)
    args = [sys.executable, "-m", "tgc.cli.main", "compile", str(src), "--timings", "--json",
            *(f"-D{k}={v}" for k, v in MLP_DIMS.items()), *extra]
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_compile_timings_name_every_phase_and_the_cache_hits(tmp_path):
    cold = _compile_json(tmp_path, "--jobs", "1")
    t = cold["timings"]
    assert len(t["kernels"]) == len(cold["kernels"]) >= 3
    assert [k["name"] for k in t["kernels"]] == [k["name"] for k in cold["kernels"]]
    for k in t["kernels"]:
        assert k["cache"] == "miss"
        assert {"optimize", "to_linear", "linearize", "render", "compile"} <= set(k["phases_s"])
        assert all(s >= 0 for s in k["phases_s"].values())
        assert k["total_s"] >= sum(k["phases_s"].values()) - 1e-9
    assert {"parse", "schedule"} <= set(t["program_phases_s"])
    assert (t["cache_hits"], t["cache_misses"]) == (0, len(t["kernels"]))
    warm = _compile_json(tmp_path)["timings"]
    assert (warm["cache_hits"], warm["cache_misses"]) == (len(t["kernels"]), 0)
    assert all("compile" not in k["phases_s"] and k["cache"] == "hit" for k in warm["kernels"])


def test_debug_2_prints_each_kernel_built_and_bad_jobs_are_user_errors(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TGC_VERIFY_BOUNDS"}
    env.update(TGC_CACHE_DIR=str(tmp_path / "cache"), DEBUG="2")
    base = [sys.executable, "-m", "tgc.cli.main", "compile", "kernels/softmax.tg", "-D", "N=4", "-D", "D=8"]
    r = subprocess.run(base, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and "*** build r_4_8_8_8" in r.stderr and "compile " in r.stderr, r.stderr
    bad = subprocess.run([*base, "--jobs", "0"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert bad.returncode == 2 and "--jobs" in bad.stderr
    bad = subprocess.run(base, capture_output=True, text=True, env={**env, "TGC_JOBS": "x"}, cwd=ROOT, timeout=60)
    assert bad.returncode == 2 and "TGC_JOBS" in bad.stderr


def test_a_warm_tgc_bench_keeps_the_identity_a_baseline_compares(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TGC_VERIFY_BOUNDS", "DEBUG", "BEAM", "NOOPT")}
    env["TGC_CACHE_DIR"] = str(tmp_path / "cache")
    args = ["bench", "kernels/softmax.tg", "-D", "N=4", "-D", "D=8", "--repeat", "3", "--json"]
    cold = _tgc(args, env)
    assert cold.returncode == 0, cold.stderr
    (tmp_path / "base.json").write_text(cold.stdout)
    warm = _tgc([*args, "--baseline", str(tmp_path / "base.json")], env)
    assert "HEAVY \n" in warm.stderr, warm.stderr  # timed from the program cache
    doc = json.loads(warm.stdout)
    assert doc["identity"] == json.loads(cold.stdout)["identity"]
    assert [k["name"] for k in doc["kernels"]] == [k["name"] for k in json.loads(cold.stdout)["kernels"]]
    # the recompute factor as the cold run computed it (softmax at N=4, D=8: 6 ops per element, none twice)
    assert doc["recompute"] == json.loads(cold.stdout)["recompute"] == {"written": 6 * 32, "executed": 6 * 32,
                                                                        "factor": 1.0}
    text = _tgc(args[:-1], env)
    assert "HEAVY \n" in text.stderr and "recompute factor 1.000 (" in text.stdout, text.stdout


def test_a_warm_tgc_bench_from_an_entry_without_the_recompute_factor_says_it_is_unknown(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TGC_VERIFY_BOUNDS", "DEBUG", "BEAM", "NOOPT")}
    env["TGC_CACHE_DIR"] = str(tmp_path / "cache")  # (the fixture's cache: this process rewrites the entry)
    args = ["bench", "kernels/softmax.tg", "-D", "N=4", "-D", "D=8", "--repeat", "3"]
    assert _tgc(["run", "kernels/softmax.tg", "--random", "-D", "N=4", "-D", "D=8"], env).returncode == 0
    [row] = cache.entries("program")
    k = progcache.key((ROOT / "kernels" / "softmax.tg").read_text(), DIMS, get_device("CPU"))
    value = cache.get("program", k)
    head, _, data = value[len(progcache.MAGIC):].partition(b"\n")
    header = json.loads(head)
    assert header.pop("recompute")["factor"] == 1.0  # (a cold `tgc run` keeps it too)
    cache.put("program", k, progcache.MAGIC + json.dumps(header).encode() + b"\n" + data, row["meta"])
    doc = json.loads(_tgc([*args, "--json"], env).stdout)  # (the first bench measures the CPU's peak: llvmlite)
    assert "recompute" in doc and doc["recompute"] is None
    warm = _tgc(args, env)
    assert warm.returncode == 0 and "HEAVY \n" in warm.stderr, warm.stderr  # (timed from the entry)
    assert "recompute factor unknown (" in warm.stdout and "recompute factor 1" not in warm.stdout, warm.stdout


def test_the_compile_progress_bar_shows_only_after_its_delay(monkeypatch):
    from tgc.cli import report

    drawn: list[list] = []

    def draw():
        drawn.append([])
        return drawn[-1].append, lambda: drawn[-1].append("closed")

    monkeypatch.setattr(report, "_draw_bar", draw)
    update, close = report.compile_progress(True, after_s=3600)
    update({"kernel": "k", "index": 0, "total": 2, "stage": "lowered"})
    close()
    assert drawn == []  # a compile under its delay draws nothing
    update, close = report.compile_progress(True, after_s=0.0)
    event = {"kernel": "k", "index": 0, "total": 2, "stage": "lowered"}
    update(event)
    close()
    assert drawn == [[event, "closed"]]
