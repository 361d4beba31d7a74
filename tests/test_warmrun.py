"""What a warm `tgc run` spends beside its kernels (issue 21 item 1, branch warmrun; docs/DESIGN.md, "The warm
run's overhead, measured"): the random inputs' values (uniform floats of variance 1, the same bits for a seed and a
position), OpenBLAS's idle threads (`OPENBLAS_THREAD_TIMEOUT`, set by the command line unless given) and the end of
the process (`tgc.cli.main.exit_now`: the exit status, the output, the `atexit` hooks, no interpreter teardown).
"""

from __future__ import annotations

import math
import os
import pathlib
import shlex
import subprocess
import sys

import numpy as np
import pytest

from tgc.dtype import bf16_to_f32, dtypes
from tgc.engine.inputs import random_values

ROOT = pathlib.Path(__file__).resolve().parent.parent
SQRT3 = math.sqrt(3)


@pytest.mark.parametrize("name", ["f32", "f64", "f16", "bf16"])
def test_random_floats_are_uniform_with_mean_zero_and_variance_one(name):
    dt = dtypes.by_name[name]
    a = random_values(dt, [1000, 1000], seed=3, index=2)
    assert a.shape == (1000, 1000) and a.dtype == dt.np  # (bf16: its bits, as uint16)
    x = (bf16_to_f32(a) if name == "bf16" else a).astype(np.float64)
    assert -SQRT3 - 1e-2 <= x.min() < -1.72 and 1.72 < x.max() <= SQRT3 + 1e-2  # (f16/bf16 round the ends)
    # a million values: the mean within 5 standard errors of 0, the variance within 1% of 1 (its standard error
    # is 0.09% for a uniform distribution); ten bins of equal width hold a tenth each, within 2%
    assert abs(x.mean()) < 5 / 1000 and abs(x.var() - 1) < 1e-2
    counts = np.histogram(x, bins=10, range=(-SQRT3, SQRT3))[0]
    assert np.all(np.abs(counts / x.size - 0.1) < 2e-3), counts


def test_random_floats_are_drawn_in_their_own_precision_and_the_same_bits_for_a_seed_and_a_position():
    u32 = np.random.default_rng([5, 1]).random(4096, dtype=np.float32)
    f32 = random_values(dtypes.f32, [64, 64], seed=5, index=1)
    np.testing.assert_array_equal(f32.ravel(), (u32 - np.float32(0.5)) * np.float32(2 * SQRT3))
    u64 = np.random.default_rng([5, 1]).random(100)
    np.testing.assert_array_equal(random_values(dtypes.f64, [100], seed=5, index=1), (u64 - 0.5) * (2 * SQRT3))
    # f16 is the f32 draw rounded to nearest; the same (seed, position) gives the same values, another does not
    np.testing.assert_array_equal(random_values(dtypes.f16, [64, 64], seed=5, index=1), f32.astype(np.float16))
    np.testing.assert_array_equal(random_values(dtypes.f32, [64, 64], seed=5, index=1), f32)
    for seed, index in ((5, 2), (6, 1)):
        assert not np.array_equal(random_values(dtypes.f32, [64, 64], seed=seed, index=index), f32)
    # ints and bools are drawn as before: -8..8 (0..8 unsigned), half true
    ints = random_values(dtypes.i32, [10000], seed=5, index=1)
    assert ints.dtype == np.int32 and ints.min() == -8 and ints.max() == 8
    np.testing.assert_array_equal(ints, np.random.default_rng([5, 1]).integers(-8, 9, size=10000))
    assert random_values(dtypes.u8, [1000], 0, 0).min() == 0
    assert abs(random_values(dtypes.bool, [10000], 0, 0).mean() - 0.5) < 0.03


def _python(code: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=env if env is not None else dict(os.environ), **kw)


def test_the_command_line_sets_openblas_idle_spin_short_unless_the_environment_gives_it():
    code = "import os, sys, tgc.cli.main; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'), 'numpy' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    r = _python(code, env)
    assert r.returncode == 0 and r.stdout.split() == ["20", "False"], r.stderr  # (set before numpy loads)
    r = _python(code, {**env, "OPENBLAS_THREAD_TIMEOUT": "28"})
    assert r.stdout.split() == ["28", "False"]


# a process running the command line as the `tgc` script does (its own argv), with an atexit hook and an object
# whose __del__ runs only in the interpreter's teardown
SCRIPT = """
import atexit, sys
class Teardown:
    def __del__(self):
        print("teardown ran", file=sys.stderr, flush=True)
keep = Teardown()
atexit.register(lambda: print("atexit ran", file=sys.stderr, flush=True))
from tgc.cli.main import main
sys.argv = ["tgc"] + sys.argv[1:]
main()
print("not reached", file=sys.stderr)
"""


def _tgc(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, **kw)


def test_the_process_ends_with_the_commands_status_and_output_after_the_atexit_hooks_without_the_teardown():
    ok = _tgc("--help")
    assert ok.returncode == 0 and "Usage:" in ok.stdout  # stdout (a pipe here: block-buffered) was flushed
    bad = _tgc("run", "no_such_file.tg")
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    for r in (ok, bad):
        assert "atexit ran" in r.stderr and "not reached" not in r.stderr
        assert "teardown ran" not in r.stderr  # os._exit: the interpreter's teardown was skipped
    # called with its arguments (click's test runner, scripts), main is click's: SystemExit, then the teardown
    code = SCRIPT.replace("main()\n", "main(sys.argv[1:])\n")
    r = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "atexit ran" in r.stderr and "teardown ran" in r.stderr


def test_a_reader_that_closed_the_pipe_gets_status_0_and_no_traceback(tmp_path):
    # `tgc run ... | true`: the reader is gone before the table is written (EPIPE): it took what it wanted, status 0
    # (as `git log | head`; it was click's status 1)
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(SCRIPT)} run kernels/softmax.tg --random -D N=4 -D D=8"
    r = subprocess.run(["bash", "-c", cmd + ' | true; echo "status ${PIPESTATUS[0]}"'], capture_output=True,
                       text=True, cwd=ROOT, timeout=300, env={**os.environ, "TGC_CACHE_DIR": str(tmp_path / "cache")})
    assert r.stdout.split() == ["status", "0"], r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr and "atexit ran" in r.stderr


def test_the_compile_table_reads_a_programs_own_run_from_a_warm_runs_profile_trace(tmp_path):
    import importlib.util

    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_compile_table", ROOT / "bench" / "compile_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    env = {**os.environ, "TGC_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [table._tgc_exe(), "run", str(ROOT / "kernels" / "softmax.tg"), "--random", "-D", "N=64", "-D", "D=32"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    got = table._run_s(cmd, env, str(tmp_path / "trace.json"))
    assert isinstance(got, float) and 0 < got < 1  # (64 rows of 32: microseconds, on any machine)
    assert table._run_s([*cmd, "-D", "N=x"], env, str(tmp_path / "bad.json")) is None  # (the run failed)


def test_the_garbage_collector_is_off_only_for_a_warm_run_and_on_for_the_cold_path_and_other_commands(tmp_path):
    """`TgcGroup.main` turns the cyclic collector off until the command is known; a warm `tgc run` keeps it off
    (its objects live to the end), the cold path, --check and every other command turn it back on."""
    code = SCRIPT.replace("atexit.register(lambda: print(\"atexit ran\"",
                          "import gc\natexit.register(lambda: print(\"gc on\" if gc.isenabled() else \"gc off\"")
    env = {k: v for k, v in os.environ.items() if k not in ("TGC_VERIFY_BOUNDS", "DEBUG", "BEAM", "NOOPT")}
    env["TGC_CACHE_DIR"] = str(tmp_path / "cache")  # (without the variables that keep a run off the cache)
    run = ["run", "kernels/softmax.tg", "--random", "-D", "N=4", "-D", "D=8"]
    seen = []
    for args in (run, run, [*run, "--check"], ["cache", "stats"]):  # cold (stores the entry), warm, warm --check
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                           timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        seen.append(r.stderr.split()[-2:])
    assert seen == [["gc", "on"], ["gc", "off"], ["gc", "on"], ["gc", "on"]]
    # the warm run's table is the cold run's (the same random inputs, the same kernels)
    outs = [subprocess.run([sys.executable, "-c", code, *run], capture_output=True, text=True, cwd=ROOT,
                           timeout=300, env=env).stdout for _ in range(2)]
    assert outs[0] == outs[1] and "out0" in outs[0]
