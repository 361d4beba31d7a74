"""The command line under careless and hostile use (issues 9 and 10): environment settings, device indices,
click's own errors, huge sizes, odd files and options, the cache's clear/peak paths, Ctrl-C, deep programs
and the memory of `--check`. Each test failed before its fix."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from clikit import assert_clean, invoke

import tgc
import tgc.api
from tgc.errors import TgcError

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = str(ROOT / "kernels" / "softmax.tg")


# ---------------------------------------------------------------------------------------------------------------
# environment settings


def _names_read_by_the_code() -> set[str]:
    """Every environment variable name the package reads (os.environ / getenv / tgc.env helpers)."""
    readers = r"(?:environ\.get|environ\[|getenv|env_int|env_float|env_str|env_flag)"
    pattern = re.compile(readers + r"\(?\s*\(?[\"']([A-Z_]+)[\"']")
    names: set[str] = set()
    for path in (ROOT / "tgc").rglob("*.py"):
        names.update(pattern.findall(path.read_text()))
    # ENV_* constants of the REMOTE client
    client = (ROOT / "tgc" / "backends" / "remote" / "client.py").read_text()
    names.update(re.findall(r'"(TGC_REMOTE[A-Z_]*)"', client))
    return names


# standard variables of the platform, read for their usual meaning
STANDARD = {"TERM", "COLUMNS", "XDG_CACHE_HOME"}


def test_every_variable_read_is_documented_in_help_and_readme():
    from tgc.env import ENV_VARS

    names = _names_read_by_the_code() - STANDARD
    assert {"TGC_THREADS", "TGC_CUDA_ARCH", "DEBUG", "BEAM", "TGC_REMOTE_TIMEOUT"} <= names
    missing = names - set(ENV_VARS)
    assert not missing, f"read but not in tgc.env.ENV_VARS: {missing}"
    help_text = invoke("--help").stdout
    readme = (ROOT / "README.md").read_text()
    for name in names:
        assert re.search(rf"\b{name}\b", help_text), f"{name} is not in `tgc --help`"
        assert f"`{name}`" in readme, f"{name} is not in the README"


def test_help_and_readme_state_each_bounded_integer_variables_range():
    """Where the help or README says what integers a variable takes, it is the range `env_int` accepts."""
    from tgc.env import _INT_RANGE, ENV_VARS

    help_text = " ".join(invoke("--help").stdout.split())
    readme = (ROOT / "README.md").read_text()
    for name, (lo, hi) in _INT_RANGE.items():
        rows = [line for line in readme.splitlines() if line.startswith(f"| `{name}`")]
        for text in (ENV_VARS[name].help, *rows):
            if "an integer" in text:
                assert f"an integer from {lo} to {hi}" in text or (hi is not None and hi >= 1 << 30), (name, text)
        if name in ("TGC_THREADS", "TGC_JOBS", "BEAM"):
            assert re.search(rf"\b{name}\b.{{0,120}}an integer from {lo} to {hi}", help_text), name


@pytest.mark.parametrize("name, value", [
    ("TGC_THREADS", "abc"), ("TGC_THREADS", "0"), ("TGC_THREADS", "1.5"), ("DEBUG", "x"), ("BEAM", "-1"),
    ("BEAM", "wide"), ("TGC_REMOTE_TIMEOUT", "nan"), ("TGC_REMOTE_TIMEOUT", "inf"), ("TGC_REMOTE_TIMEOUT", "0"),
    ("TGC_REMOTE_TIMEOUT", "soon"), ("TGC_REMOTE_RETRY", "-1"), ("TGC_CUDA_ARCH", "volta"),
    ("TGC_REMOTE", "host:99999"),
])
def test_a_bad_setting_is_a_clear_error(name, value):
    r = invoke("run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2", env={name: value})
    assert_clean(r, 2, name, "help:")


def test_good_settings_pass():
    from tgc.env import env_float, env_int

    r = invoke("run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2",
               env={"TGC_THREADS": "2", "DEBUG": "0", "TGC_REMOTE_TIMEOUT": "2.5", "TGC_CUDA_ARCH": "sm_90"})
    assert r.exit_code == 0, r.stderr
    os.environ.pop("TGC_REMOTE_TIMEOUT", None)
    assert env_float("TGC_REMOTE_TIMEOUT", 120.0) == 120.0
    os.environ["TGC_THREADS"] = " 3 "
    try:
        assert env_int("TGC_THREADS", 0) == 3
    finally:
        del os.environ["TGC_THREADS"]


def test_bad_threads_through_the_api(monkeypatch):
    from tgc.backends import get_device

    monkeypatch.setenv("TGC_THREADS", "abc")
    with pytest.raises(TgcError, match="TGC_THREADS") as e:
        get_device("CPU").cores  # noqa: B018
    assert e.value.exit_code == 2


def test_bad_remote_timeout_through_the_client(monkeypatch):
    from tgc.backends.remote.client import _env_float

    for bad in ("nan", "inf", "0", "-3"):
        monkeypatch.setenv("TGC_REMOTE_TIMEOUT", bad)
        with pytest.raises(TgcError, match="TGC_REMOTE_TIMEOUT"):
            _env_float("TGC_REMOTE_TIMEOUT", 120.0)


# ---------------------------------------------------------------------------------------------------------------
# device indices


def test_cpu_index_beyond_the_machine():
    r = invoke("run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2", "-d", "CPU:999")
    assert_clean(r, 2, "CPU:999", "CPU devices")  # CPU:i for a device list: max(8, cores) of them
    assert_clean(invoke("run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2", "-d", "PYTHON:8"), 2, "PYTHON:8")
    assert invoke("run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2", "-d", "CPU:0").exit_code == 0


class _OneOfAKind:
    """A backend with one device whose constructor fails for any other index (as OpenCL's does)."""

    kind = "FAKEONE"

    def __init__(self, index: int = 0):
        if index >= 1:
            from tgc.errors import DeviceError

            raise DeviceError(f"no FAKEONE device {index}: this machine has 1")
        self.index = index


class _Broken:
    kind = "FAKEBROKEN"

    def __init__(self, index: int = 0):
        from tgc.errors import DeviceError

        raise DeviceError("the driver is missing")


def test_index_error_of_a_backend_without_a_count(monkeypatch):
    import tgc.backends as b

    monkeypatch.setitem(b.BUILTIN, "FAKEONE", "x:_OneOfAKind")
    monkeypatch.setitem(b.BUILTIN, "FAKEBROKEN", "x:_Broken")
    monkeypatch.setattr(b, "device_class", lambda kind: {"FAKEONE": _OneOfAKind, "FAKEBROKEN": _Broken}[kind])
    with pytest.raises(TgcError, match="no FAKEONE device 3") as e:
        b.get_device("FAKEONE:3")
    assert e.value.exit_code == 2  # the index is the user's mistake
    with pytest.raises(TgcError, match="driver is missing") as e:
        b.get_device("FAKEBROKEN:2")
    assert e.value.exit_code == 1  # the kind does not work here at all: a runtime failure
    for key in [k for k in b._instances if k[0].startswith("FAKE")]:
        del b._instances[key]


# ---------------------------------------------------------------------------------------------------------------
# click's own errors


@pytest.mark.parametrize("args, words", [
    (("run", SOFTMAX, "-D", "N=four"), ["'four' is not an integer", "help: see 'tgc run --help'"]),
    (("run", SOFTMAX, "--bogus"), ["no such option", "--bogus"]),
    (("bogus",), ["no such command", "help: see 'tgc --help'"]),
    (("run", "missing.tg"), ["missing.tg"]),
    (("bench", SOFTMAX, "--repeat", "0"), ["--repeat"]),
])
def test_click_errors_in_tgc_style(args, words):
    r = invoke(*args)
    assert_clean(r, 2, *words)
    assert "Usage:" not in r.stderr and "Try '" not in r.stderr


# ---------------------------------------------------------------------------------------------------------------
# sizes


@pytest.fixture
def add_tg(tmp_path):
    p = tmp_path / "add.tg"
    p.write_text("x: f32[N]\nreturn x + 1\n")
    return str(p)


def test_input_too_large_for_memory(add_tg):
    r = invoke("run", add_tg, "-D", "N=10000000000", "--random")
    assert_clean(r, 1, "input 'x'", "40000000000 bytes", "memory")


def test_numpy_refusing_an_allocation_names_the_input(add_tg, monkeypatch):
    from tgc.cli import inputs

    monkeypatch.setattr(inputs, "physical_memory", lambda: None)  # the platform does not say: numpy refuses
    r = invoke("run", add_tg, "-D", "N=100000000000000", "--random")
    assert_clean(r, 1, "input 'x'", "400000000000000 bytes")


@pytest.mark.parametrize("dim, words", [("N=1e11", "not an integer"), ("N=12345678901234567890123456", "below 2^48"),
                                        ("N=281474976710656", "below 2^48"), ("N=" + "9" * 5000, "below 2^48")])
def test_absurd_dims(add_tg, dim, words):
    assert_clean(invoke("run", add_tg, "-D", dim, "--random"), 2, words)


def test_out_of_memory_anywhere_is_one_clear_error(add_tg, monkeypatch):
    def boom(*a, **k):
        raise MemoryError("Unable to allocate 12 GiB")

    monkeypatch.setattr(tgc.api.Program, "run", boom)
    assert_clean(invoke("run", add_tg, "-D", "N=4", "--random"), 1, "out of memory", "12 GiB")


# ---------------------------------------------------------------------------------------------------------------
# options, input files and output files


@pytest.mark.parametrize("rtol", ["nan", "inf", "-1"])
def test_rtol_must_be_finite(add_tg, rtol):
    assert_clean(invoke("run", add_tg, "-D", "N=4", "--random", "--check", "--rtol", rtol), 2, "--rtol")


def test_input_from_a_pipe(add_tg, tmp_path):
    import io
    import threading

    for opt, name, write in (("-i", "x=", lambda f, a: np.save(f, a)), ("--inputs", "", lambda f, a: np.savez(f, x=a))):
        buf = io.BytesIO()
        write(buf, np.arange(4, dtype=np.float32))
        r_fd, w_fd = os.pipe()

        def feed(data: bytes, w_fd: int) -> None:
            with os.fdopen(w_fd, "wb") as w:
                w.write(data)

        t = threading.Thread(target=feed, args=(buf.getvalue(), w_fd))
        t.start()
        try:
            r = invoke("run", add_tg, opt, f"{name}/dev/fd/{r_fd}", "-o", f"out0={tmp_path / 'o.npy'}")
        finally:
            t.join()
            os.close(r_fd)
        assert r.exit_code == 0, r.stderr
        np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), np.arange(4, dtype=np.float32) + 1)


def test_an_endless_device_file_is_refused_not_read(add_tg):
    assert_clean(invoke("run", add_tg, "-i", "x=/dev/zero"), 2, "is not a .npy file")


def test_utf8_bom_is_accepted(tmp_path):
    p = tmp_path / "bom.tg"
    p.write_bytes(b"\xef\xbb\xbfx: f32[N]\nreturn x + 1\n")
    out = tgc.load(str(p)).run(x=np.ones(3, np.float32), device="PYTHON")
    np.testing.assert_array_equal(out["out0"], np.full(3, 2, np.float32))
    assert tgc.loads("\ufeffx: f32[N]\nreturn x * 2\n").output_names == ["out0"]
    r = invoke("run", str(p), "-D", "N=3", "--random")
    assert r.exit_code == 0, r.stderr
    # a later error still points at the right column of line 1
    p.write_bytes(b"\xef\xbb\xbfx: f32[N]\nreturn x + y\n")
    r = invoke("run", str(p), "-D", "N=3", "--random")
    assert r.exit_code == 2 and "bom.tg:2:12" in r.stderr, r.stderr


@pytest.fixture
def two_tg(tmp_path):
    p = tmp_path / "two.tg"
    p.write_text("x: f32[N]\ny = x * 2\nreturn y, x + 1\n")
    return str(p)


@pytest.mark.parametrize("second", ["same", "dotted", "npz"])
def test_two_outputs_to_one_file_are_refused(two_tg, tmp_path, second):
    first = tmp_path / "o.npy"
    other = {"same": f"out1={first}", "dotted": f"out1={tmp_path / '.' / 'o.npy'}", "npz": str(tmp_path / "a.npz")}
    args = ["-o", f"y={first}", "-o", other[second]]
    if second == "npz":
        args = ["-o", other[second], "-o", other[second]]
    r = invoke("run", two_tg, "-D", "N=4", "--random", *args)
    assert_clean(r, 2, "the same file")
    assert not first.exists() and not (tmp_path / "a.npz").exists()


def test_unwritable_output_directory_is_exit_2_for_run_and_compile(add_tg, tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if (mode & os.W_OK and str(p) == str(ro))
                        else real_access(p, mode, **k))
    assert_clean(invoke("run", add_tg, "-D", "N=4", "--random", "-o", str(ro / "o.npz")), 2, "cannot write")
    assert_clean(invoke("compile", add_tg, "-D", "N=4", "-o", str(ro)), 2, "cannot write")
    assert list(ro.iterdir()) == []


@pytest.mark.parametrize("err, code", [(13, 2), (30, 2), (28, 1)])  # EACCES, EROFS: the user's; ENOSPC: not
def test_write_failures_agree_between_run_and_compile(add_tg, tmp_path, monkeypatch, err, code):
    import tempfile

    def refuse(*a, **k):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    r1 = invoke("run", add_tg, "-D", "N=4", "--random", "-o", str(tmp_path / "o.npz"))
    r2 = invoke("compile", add_tg, "-D", "N=4", "-o", str(tmp_path / "k"))
    assert_clean(r1, code, "cannot write", os.strerror(err))
    assert_clean(r2, code, "cannot write", os.strerror(err))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory_for_real(add_tg, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert_clean(invoke("compile", add_tg, "-D", "N=4", "-o", str(ro)), 2)
        assert_clean(invoke("run", add_tg, "-D", "N=4", "--random", "-o", str(ro / "o.npz")), 2)
    finally:
        ro.chmod(0o755)


# ---------------------------------------------------------------------------------------------------------------
# the cache: clear and peak


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    from tgc import cache

    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))
    cache._reset_for_tests()
    yield cache
    cache._reset_for_tests()


def test_cache_clear_on_a_read_only_database_fails(fresh_cache, monkeypatch):
    import sqlite3

    fresh_cache.put("beam", "k", b"v")
    fresh_cache._reset_for_tests()

    def read_only(path):
        return sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)

    real_open = fresh_cache._open
    monkeypatch.setattr(fresh_cache, "_open", read_only)
    r = invoke("cache", "clear")
    assert_clean(r, 1, "could not clear", "readonly")
    assert "cleared" not in r.stdout
    monkeypatch.setattr(fresh_cache, "_open", real_open)
    fresh_cache._reset_for_tests()
    assert fresh_cache.get("beam", "k") == b"v"  # nothing was removed
    assert fresh_cache.clear(strict=True) == 1


@pytest.mark.parametrize("under", ["", "sub"])
def test_cache_commands_on_a_path_through_a_file_are_one_error(tmp_path, monkeypatch, under):
    from tgc import cache

    (tmp_path / "f").write_text("x")
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "f" / under))
    cache._reset_for_tests()
    try:
        for args in (("stats",), ("stats", "--json"), ("list",), ("clear",), ("clear", "--table", "beam")):
            r = invoke("cache", *args)
            assert_clean(r, 2, f"the cache at {tmp_path / 'f' / under} cannot be used", str(tmp_path / "f"),
                         "set TGC_CACHE_DIR")
            assert "warning" not in r.stderr and len(r.stderr.splitlines()) == 2 and r.stdout == "", r.stderr
    finally:
        cache._reset_for_tests()


def test_cache_commands_on_a_directory_without_permission_are_one_error(fresh_cache, monkeypatch, tmp_path):
    (tmp_path / "cache").mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path / "cache" else real(p, mode))
    for args in (("stats",), ("list",), ("clear",)):  # (not "0 entries, exit 0" as from an empty cache)
        assert_clean(invoke("cache", *args), 2, "cannot read and write the directory", "permission denied")


def test_cache_clear_on_a_missing_directory_has_nothing_to_clear(fresh_cache, tmp_path):
    r = invoke("cache", "clear")
    assert r.exit_code == 0 and r.stdout == f"nothing to clear: no cache at {tmp_path / 'cache'}\n", r.output
    assert not (tmp_path / "cache").exists()  # (nothing created)
    r = invoke("cache", "stats")
    assert r.exit_code == 0 and "0 entries in all" in r.stdout and r.stderr == ""


def test_cache_stats_and_list_on_a_corrupt_database_are_one_error(fresh_cache, tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "cache.db").write_bytes(b"not a database" * 400)
    for args in (("stats",), ("list",)):
        r = invoke("cache", *args)
        assert_clean(r, 1, "is corrupt", "tgc cache clear")
        assert "warning" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    r = invoke("cache", "clear")
    assert r.exit_code == 0 and invoke("cache", "stats").exit_code == 0


def test_cache_list_names_each_compiled_kernel_and_help_names_every_table(fresh_cache):
    kernels = tgc.loads("x: f32[N, D]\nreturn exp(x - x.max(axis=1, keepdim=True)) * 3\n").compile(
        "CPU", {"N": 5, "D": 7})
    rows = [r["meta"] for r in fresh_cache.entries("compile")]
    assert {f"CPU {k.name}" for k in kernels} <= set(rows), rows
    assert not any(m.startswith(("CPU declare", "CPU ;", "CPU target")) for m in rows), rows
    text = invoke("cache", "--help").stdout
    assert all(t in text for t in ("compile", "program", "beam", "peak", "probe")), text


def test_devices_shows_the_cpu_peak_tgc_bench_measured(fresh_cache):
    import json

    from tgc.backends import get_device
    from tgc.engine import bench

    def cpu_row():
        r = invoke("devices", "--json")
        assert r.exit_code == 0, r.stderr
        return next(row for row in json.loads(r.stdout) if row["device"] == "CPU")

    row = cpu_row()
    assert row["peak_gflops"] is None and row["peak_source"] is None  # nothing measured yet: "-"
    fresh_cache.put("peak", bench.peak_key(get_device("CPU")), b'{"gflops": 123.4, "gbps": 45.6}')
    row = cpu_row()
    assert (row["peak_gflops"], row["peak_gbps"], row["peak_source"]) == (123.4, 45.6, "measured")
    assert isinstance(row["peak_measured"], float)
    text = invoke("devices", env={"COLUMNS": "300"}).stdout
    assert "123.4 GFLOP/s, 45.6 GB/s (measured 20" in text, text


def test_cache_clear_table_peak(fresh_cache):
    fresh_cache.put("peak", "k", b"{}")
    fresh_cache.put("beam", "k", b"{}")
    r = invoke("cache", "clear", "--table", "peak")
    assert r.exit_code == 0 and "1 entry removed" in r.stdout, (r.stdout, r.stderr)
    assert fresh_cache.get("peak", "k") is None and fresh_cache.get("beam", "k") == b"{}"
    assert invoke("cache", "list", "--table", "peak").exit_code == 0


@pytest.mark.parametrize("stored", [b"\xff\xfe", b"not json", b"[]", b'{"gflops": "x", "gbps": 1}',
                                    b'{"gflops": 1}', b'{"gflops": NaN, "gbps": 1}', b'{"gflops": 0, "gbps": 1}'])
def test_corrupt_peak_entry_is_measured_again(fresh_cache, monkeypatch, stored):
    from tgc.backends import get_device
    from tgc.engine import bench

    dev = get_device("CPU")
    measured = {"gflops": 100.0, "gbps": 10.0, "source": "measured"}
    monkeypatch.setattr(type(dev), "measure_peak", lambda d: dict(measured))
    key = bench.peak_key(dev)
    fresh_cache.put("peak", key, stored)
    got = bench.machine_peak(dev)
    assert {k: v for k, v in got.items() if k != "cache_bytes"} == measured
    assert json_of(fresh_cache.get("peak", key)) == measured  # the damaged entry was replaced
    r = invoke("bench", SOFTMAX, "-D", "N=4", "-D", "D=8", "--repeat", "1", "--json")
    assert r.exit_code == 0, r.stderr


def json_of(raw: bytes):
    import json

    return json.loads(raw)


# ---------------------------------------------------------------------------------------------------------------
# DSL: every function whose first argument is a tensor is also a method

# (function form, method form) over x: f32[2, 3, 4, 4], c: bool[2, 3, 4, 4], w: f32[3, 3, 2, 2], v: f32[4, 4]
METHOD_FORMS = [
    ("cat(x, x + 1, x * 2, axis=1)", "x.cat(x + 1, x * 2, axis=1)"),
    ("cat(x, x)", "x.cat(x)"),
    ("stack(x, x + 1, axis=2)", "x.stack(x + 1, axis=2)"),
    ("where(c, x, -x)", "c.where(x, -x)"),
    ("maximum(x, 0.5)", "x.maximum(0.5)"), ("minimum(x, 0.5)", "x.minimum(0.5)"),
    ("pow(abs(x), 1.5)", "x.abs().pow(1.5)"), ("clip(x, -0.5, 0.5)", "x.clip(-0.5, 0.5)"),
    ("cast(x, f16)", "x.cast(f16)"), ("bitcast(x, i32)", "x.bitcast(i32)"),
    ("argmax(x, axis=1)", "x.argmax(axis=1)"), ("argmin(x, axis=1)", "x.argmin(axis=1)"),
    ("logsumexp(x, axis=1)", "x.logsumexp(axis=1)"), ("softmax(x)", "x.softmax()"),
    ("log_softmax(x, axis=2)", "x.log_softmax(axis=2)"), ("var(x, axis=3)", "x.var(axis=3)"),
    ("std(x, axis=3)", "x.std(axis=3)"), ("reshape(x, 6, 16)", "x.reshape(6, 16)"),
    ("permute(x, 3, 2, 1, 0)", "x.permute(3, 2, 1, 0)"), ("transpose(x, 0, 1)", "x.transpose(0, 1)"),
    ("expand(sum(x, axis=0, keepdim=True), 2, 3, 4, 4)", "x.sum(axis=0, keepdim=True).expand(2, 3, 4, 4)"),
    ("squeeze(unsqueeze(x, 0), 0)", "x.unsqueeze(0).squeeze(0)"), ("unsqueeze(x, 1)", "x.unsqueeze(1)"),
    ("flatten(x, 1)", "x.flatten(1)"),
    ("pad(x, ((0, 0), (0, 0), (1, 1), (0, 2)))", "x.pad(((0, 0), (0, 0), (1, 1), (0, 2)))"),
    ("flip(x, 2)", "x.flip(2)"), ("matmul(x, v)", "x.matmul(v)"),
    ("conv2d(x, w)", "x.conv2d(w)"), ("max_pool2d(x, 2)", "x.max_pool2d(2)"), ("avg_pool2d(x, 2)", "x.avg_pool2d(2)"),
    ("layernorm(x)", "x.layernorm()"), ("exp(x)", "x.exp()"), ("sum(x, axis=1)", "x.sum(axis=1)"),
    ("mean(x)", "x.mean()"), ("prod(x, axis=0)", "x.prod(axis=0)"),
    *[(f"{n}(abs(x) + 0.5)", f"(abs(x) + 0.5).{n}()") for n in (
        "log", "exp2", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "sigmoid", "relu", "gelu", "abs", "sign",
        "recip", "floor", "ceil", "trunc", "round", "square", "erf")],
    *[(f"{n}(x, axis=1)", f"x.{n}(axis=1)") for n in ("max", "min")],
    *[(f"{n}(x)", f"x.{n}()") for n in (
        "atan", "expm1", "log1p", "silu", "softplus", "elu", "isfinite", "isinf", "isnan", "zeros_like", "ones_like")],
    *[(f"{n}(c, axis=1)", f"c.{n}(axis=1)") for n in ("any", "all")],
    *[(f"{n}(x, axis=3)", f"x.{n}(axis=3)") for n in ("cumsum", "cumprod", "sort", "argsort")],
    ("atan2(x, x + 1)", "x.atan2(x + 1)"), ("astype(x, f16)", "x.astype(f16)"),
    ("clamp(x, -0.5, 0.5)", "x.clamp(-0.5, 0.5)"), ("leaky_relu(x, 0.2)", "x.leaky_relu(0.2)"),
    ("full_like(x, 2.5)", "x.full_like(2.5)"), ("tril(v, 1)", "v.tril(1)"), ("triu(v, -1)", "v.triu(-1)"),
    ("repeat(x, 2, axis=1)", "x.repeat(2, axis=1)"), ("tile(v, (2, 3))", "v.tile((2, 3))"),
    ("split(x, 2, axis=3)[1]", "x.split(2, axis=3)[1]"), ("chunk(x, 2, axis=2)[0]", "x.chunk(2, axis=2)[0]"),
    ("topk(x, 2)[0]", "x.topk(2)[0]"),
    ("take(x, argmax(x, axis=3), axis=3)", "x.take(argmax(x, axis=3), axis=3)"),
    ("take_along_axis(x, argsort(x, axis=3), axis=3)", "x.take_along_axis(argsort(x, axis=3), axis=3)"),
    ("gather(x, 3, argsort(x, axis=3))", "x.gather(3, argsort(x, axis=3))"),
    ("scatter_add(x, 3, argsort(x, axis=3), x * 2)", "x.scatter_add(3, argsort(x, axis=3), x * 2)"),
    # the ONNX-semantics operators (tgc/dsl/nnlib.py)
    ("conv(x, w, pads=(1, 0, 0, 1))", "x.conv(w, pads=(1, 0, 0, 1))"),
    ("conv_transpose(x, w, strides=2)", "x.conv_transpose(w, strides=2)"),
    *[(f"{n}(x, kernel_shape=(2, 2))", f"x.{n}(kernel_shape=(2, 2))") for n in ("max_pool", "avg_pool", "lp_pool")],
    *[(f"{n}(x)", f"x.{n}()") for n in (
        "global_avg_pool", "global_max_pool", "global_lp_pool", "mean_variance_normalization", "hardmax")],
    ("batch_norm(x, v[0, 0:3], v[1, 0:3], v[2, 0:3], abs(v[3, 0:3]))",
     "x.batch_norm(v[0, 0:3], v[1, 0:3], v[2, 0:3], abs(v[3, 0:3]))"),
    ("instance_norm(x, v[0, 0:3], v[1, 0:3])", "x.instance_norm(v[0, 0:3], v[1, 0:3])"),
    ("group_norm(x, v[0, 0:3], v[1, 0:3], 3)", "x.group_norm(v[0, 0:3], v[1, 0:3], 3)"),
    ("layer_norm(x, v, axis=2)", "x.layer_norm(v, axis=2)"), ("lrn(x, 3)", "x.lrn(3)"),
    ('resize(x, scales=(2, 2), axes=(2, 3), mode="linear")', 'x.resize(scales=(2, 2), axes=(2, 3), mode="linear")'),
    ("gather_elements(x, argsort(x, axis=3), axis=3)", "x.gather_elements(argsort(x, axis=3), axis=3)"),
    ("gather_nd(x, argmax(x, axis=3, keepdim=True))", "x.gather_nd(argmax(x, axis=3, keepdim=True))"),
    ('scatter_elements(x, argsort(x, axis=3), x * 2, axis=3, reduction="add")',
     'x.scatter_elements(argsort(x, axis=3), x * 2, axis=3, reduction="add")'),
    ("scatter_nd(x, argmax(v, axis=1, keepdim=True) % 2, x[0:1].expand(4, 3, 4, 4))",
     "x.scatter_nd(argmax(v, axis=1, keepdim=True) % 2, x[0:1].expand(4, 3, 4, 4))"),
    ("one_hot(argmax(x, axis=3), 4)", "argmax(x, axis=3).one_hot(4)"),
    ("depth_to_space(x[:, 0:1].expand(2, 4, 4, 4), 2)", "x[:, 0:1].expand(2, 4, 4, 4).depth_to_space(2)"),
    ("space_to_depth(x, 2)", "x.space_to_depth(2)"),
]
HEADER = "x: f32[2, 3, 4, 4]\nc: bool[2, 3, 4, 4]\nw: f32[3, 3, 2, 2]\nv: f32[4, 4]\n"


def test_every_tensor_function_has_a_method_form():
    from tgc.dsl.functions import FUNCTIONS, NOT_METHODS

    covered = {re.match(r"\w+", f).group(0) for f, _ in METHOD_FORMS}
    assert set(FUNCTIONS) - NOT_METHODS - covered == set()
    assert "cat" not in NOT_METHODS and "stack" not in NOT_METHODS


@pytest.mark.parametrize("func, method", METHOD_FORMS)
def test_method_form_equals_function_form(func, method):
    rng = np.random.default_rng(0)
    arrays = {"x": rng.standard_normal((2, 3, 4, 4)).astype(np.float32), "c": rng.random((2, 3, 4, 4)) < 0.5,
              "w": rng.standard_normal((3, 3, 2, 2)).astype(np.float32),
              "v": rng.standard_normal((4, 4)).astype(np.float32)}
    want = tgc.loads(HEADER + f"return {func}\n").reference(**arrays)["out0"]
    got = tgc.loads(HEADER + f"return {method}\n").reference(**arrays)["out0"]
    np.testing.assert_array_equal(got, want)


def test_cat_method_runs_on_a_device():
    prog = tgc.loads("x: f32[2, 3]\ny: f32[2, 1]\nz: f32[2, 2]\nreturn x.cat(y, z, axis=1)\n")
    x, y, z = (np.arange(n, dtype=np.float32).reshape(2, -1) for n in (6, 2, 4))
    out = prog.run(x=x, y=y, z=z, device="CPU")["out0"]
    np.testing.assert_array_equal(out, np.concatenate([x, y, z], axis=1))


# ---------------------------------------------------------------------------------------------------------------
# --check: contractions without the product


def test_check_reference_of_a_matmul_stays_near_the_inputs_size():
    import tracemalloc

    n = 512
    prog = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b\n")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    tracemalloc.start()
    try:
        out = prog.reference(a=a, b=b)["out0"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    inputs_f64 = 2 * n * n * 8
    assert peak < 4 * inputs_f64, f"peak {peak} bytes for {inputs_f64} bytes of float64 inputs"  # was 512^3 * 8
    exact = a.astype(np.float64) @ b.astype(np.float64)  # rounded once to the output's f32 (`_round_to`)
    assert np.array_equal(out, out.astype(np.float32))
    np.testing.assert_allclose(out, exact, rtol=2.0 ** -24, atol=1e-12)


CONTRACTIONS = [
    ("a: f32[3, 4]\nb: f32[4, 5]\nreturn a @ b", {"a": (3, 4), "b": (4, 5)}),
    ("a: f32[2, 3, 4]\nb: f32[4, 5]\nreturn a @ b", {"a": (2, 3, 4), "b": (4, 5)}),
    ("a: f32[1, 3, 4]\nb: f32[2, 4, 5]\nreturn a @ b", {"a": (1, 3, 4), "b": (2, 4, 5)}),
    ("a: f32[4]\nb: f32[4, 5]\nreturn a @ b, b.T @ a, a @ a", {"a": (4,), "b": (4, 5)}),
    ("a: f32[3, 4]\nreturn (a * 2).sum(), (a * a).sum(axis=0), (a * 3.0).sum(axis=1)", {"a": (3, 4)}),
    ("a: f32[3, 4]\nb: f32[4]\nreturn (a * b).sum(axis=1), (a * b).sum(axis=0), (a * b).mean()",
     {"a": (3, 4), "b": (4,)}),
    ("a: f16[3, 4]\nb: f16[4, 2]\nreturn a @ b, (a.cast(f32) @ b.cast(f32)).sum()", {"a": (3, 4), "b": (4, 2)}),
    ("a: i32[3, 4]\nb: i32[4, 2]\nreturn a @ b", {"a": (3, 4), "b": (4, 2)}),
    ("x: f32[2, 3, 6, 5]\nw: f32[4, 3, 3, 2]\nreturn conv2d(x, w), conv2d(x, w, padding=1, stride=2)",
     {"x": (2, 3, 6, 5), "w": (4, 3, 3, 2)}),
    ("q: f32[2, 5, 8]\nk: f32[2, 5, 8]\nv: f32[2, 5, 8]\nreturn softmax(q @ k.transpose(1, 2) / 2.8) @ v",
     {"q": (2, 5, 8), "k": (2, 5, 8), "v": (2, 5, 8)}),
    ("a: f32[3, 4]\nb: f32[4, 5]\nc = a @ b\nreturn c * 2, (a * 1).sum(axis=1)", {"a": (3, 4), "b": (4, 5)}),
    ("a: f32[3, 0]\nb: f32[0, 5]\nreturn a @ b", {"a": (3, 0), "b": (0, 5)}),
]


@pytest.mark.parametrize("src, shapes", CONTRACTIONS)
def test_contractions_equal_the_product_then_sum(src, shapes, monkeypatch):
    from tgc.engine import reference

    rng = np.random.default_rng(1)
    prog = tgc.loads(src + "\n")
    arrays = {}
    for d in prog.inputs:
        shape = shapes[d.name]
        arrays[d.name] = (rng.integers(-5, 6, shape) if d.dtype.is_int else rng.standard_normal(shape)).astype(
            d.dtype.np)
    fused = prog.reference(**arrays)
    monkeypatch.setattr(reference, "_contractions", lambda order: {})
    plain = tgc.loads(src + "\n").reference(**arrays)
    assert fused.keys() == plain.keys()
    types = {n: d.name for n, d, _ in prog.output_types(prog.bind(arrays, None, cast=True)[0])}
    for name in fused:
        assert fused[name].shape == plain[name].shape and fused[name].dtype == plain[name].dtype, name
        # node by node, each product rounds to its dtype (`_round_to`), as a kernel's does; the contraction sums
        # exact products: they agree to the products' rounding, a few units of the dtype's roundoff
        u = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8, "f32": 2.0 ** -24}.get(types[name], 0.0)
        top = float(np.abs(plain[name]).max(initial=1.0))
        np.testing.assert_allclose(fused[name], plain[name], rtol=4 * u, atol=1e-12 + 16 * u * top)


def test_contractions_are_used_for_matmul():
    from tgc.engine import reference

    prog = tgc.loads("a: f32[3, 4]\nb: f32[4, 5]\nreturn a @ b\n")
    outs, _ = prog._trace({"M": 3})
    assert len(reference._contractions(outs[0].toposort())) == 1


# ---------------------------------------------------------------------------------------------------------------
# deep programs


def _chain(n: int) -> str:
    return "\n".join(["x: f32[N]", "y0 = x", *(f"y{i} = y{i - 1} * 1.0001 + 1" for i in range(1, n + 1)),
                      f"return y{n}"]) + "\n"


def test_200_chained_statements_compile_and_run():
    x = np.linspace(-1, 1, 5).astype(np.float32)
    out = list(tgc.loads(_chain(200)).run(x=x, device="CPU").values())[0]
    want = x.astype(np.float64)
    for _ in range(200):
        want = want * 1.0001 + 1
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_200_chained_statements_through_the_cli(tmp_path):
    p = tmp_path / "chain.tg"
    p.write_text(_chain(200))
    r = invoke("run", str(p), "-D", "N=4", "--random", "--check")
    assert r.exit_code == 0 and "check: ok" in r.stderr, r.stderr


def test_a_chain_beyond_the_depth_limit_is_refused(tmp_path, monkeypatch):
    from tgc.dsl import frontend

    monkeypatch.setattr(frontend, "MAX_DEPTH", 400)  # the real limit (10^6) takes a minute to reach
    p = tmp_path / "deep.tg"
    p.write_text(_chain(210))
    assert_clean(invoke("run", str(p), "-D", "N=4", "--random"), 2, "too deep", "limit is 400")


def test_a_long_sum_compiles_and_an_absurd_one_is_refused(tmp_path):
    p = tmp_path / "wide.tg"
    p.write_text("x: f32[N]\nreturn " + " + ".join(["x"] * 1000) + "\n")
    out = list(tgc.load(str(p)).run(x=np.ones(3, np.float32), device="CPU").values())[0]
    np.testing.assert_array_equal(out, np.full(3, 1000, np.float32))
    p.write_text("x: f32[N]\nreturn " + " + ".join(["x"] * 20000) + "\n")
    r = invoke("run", str(p), "-D", "N=4", "--random")
    assert_clean(r, 2, "nested too deeply", "wide.tg")
    assert sys.getrecursionlimit() >= 1000  # restored after parsing


def test_the_parse_limit_is_restored_after_an_error():
    before = sys.getrecursionlimit()
    with pytest.raises(TgcError):
        tgc.loads("x: f32[N]\nreturn " + " + ".join(["x"] * 20000) + "\n")
    assert sys.getrecursionlimit() == before


# ---------------------------------------------------------------------------------------------------------------
# Ctrl-C during a kernel

# `tgc run` with a marker on stderr just before the CPU launches the reduction kernel of a matmul
_MARKED_TGC = """
import sys
from tgc.backends import cpu
original = cpu.CPUProgram.__call__
def marked(self, *a, **k):
    if self.name.startswith("r_"):
        sys.stderr.write("LAUNCH\\n"); sys.stderr.flush()
    return original(self, *a, **k)
cpu.CPUProgram.__call__ = marked
from tgc.cli.main import main
main(prog_name="tgc")
"""


def test_ctrl_c_during_a_threaded_kernel_exits_130(tmp_path):
    import signal
    import subprocess

    p = tmp_path / "mm.tg"
    p.write_text("a: f32[N, N]\nb: f32[N, N]\nreturn a @ b\n")
    env = {**os.environ, "TGC_THREADS": "2", "NO_COLOR": "1", "PYTHONFAULTHANDLER": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-c", _MARKED_TGC, "run", str(p), "-D", "N=3072", "--random"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stderr.readline() == "LAUNCH\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err)  # was -11 (SIGSEGV)
    assert "tgc run: interrupted" in err and "Fatal Python error" not in err and "Traceback" not in err, err


def test_an_interrupted_launch_keeps_its_code_and_buffers_alive(python_sigint, monkeypatch):
    """In-process (the API): KeyboardInterrupt while the threads run; what they use stays alive and is not
    handed out again until they finish."""
    import signal
    import threading
    import time

    from tgc.backends import cpu, cpu_graph, get_device

    monkeypatch.setattr(cpu_graph, "oversubscribed", lambda threads, cores: False)  # (threads, whatever the load)
    dev = get_device("CPU")
    finished, release = threading.Event(), threading.Event()
    started = threading.Barrier(3)

    def slow_kernel(*args):  # runs until the test releases it, however slow the machine is
        started.wait()
        release.wait(60)
        if args[-1] == 1:
            finished.set()

    program = cpu.CPUProgram.__new__(cpu.CPUProgram)
    program.device, program.name = dev, "r_fake"
    monkeypatch.setattr(program, "_fn", lambda nbufs, nvals: slow_kernel, raising=False)
    buf = dev.allocator.alloc(4096)

    main_thread = threading.get_ident()

    def interrupt():  # a real SIGINT, which wakes the main thread from its wait as Ctrl-C does
        started.wait()
        time.sleep(0.2)  # the main thread is waiting for the kernel by now
        signal.pthread_kill(main_thread, signal.SIGINT)

    threading.Thread(target=interrupt).start()
    with pytest.raises(KeyboardInterrupt):
        program(buf, global_size=(2, 1, 1))
    assert cpu.kernels_running()
    dev.allocator.free(buf, 4096)
    assert buf.ctypes.data not in [h.ctypes.data for h in dev.allocator.cached[4096]]  # not recycled yet
    release.set()
    assert finished.wait(10)
    deadline = time.time() + 10
    while cpu.kernels_running() and time.time() < deadline:
        time.sleep(0.01)
    assert not cpu.kernels_running() and buf.ctypes.data not in dev.allocator.busy


def test_a_group_alone_still_prints_its_help():
    for args in ((), ("cache",)):
        r = invoke(*args)
        assert "Usage:" in r.output and "error:" not in r.output, r.output


def test_native_libraries_leave_ctrl_c_able_to_interrupt_a_wait(python_sigint):
    """NVRTC re-installs SIGINT with SA_RESTART and PoCL replaces it: Ctrl-C then no longer interrupts a CPU
    launch's wait (the interrupt came only when the kernel ended). After compiling for CUDA and listing OpenCL
    devices, SIGINT must still be Python's handler, installed without SA_RESTART."""
    import ctypes
    import signal

    import tgc

    class SigAction(ctypes.Structure):
        _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                    ("restorer", ctypes.c_void_p)]

    libc = ctypes.CDLL(None)

    def disposition() -> tuple[int, int]:
        sa = SigAction()
        assert libc.sigaction(signal.SIGINT, None, ctypes.byref(sa)) == 0
        return sa.handler or 0, sa.flags & 0x10000000  # SA_RESTART

    signal.signal(signal.SIGINT, signal.default_int_handler)
    before = disposition()
    assert before[1] == 0
    prog = tgc.loads("x: f32[4]\nreturn x + 1\n")
    for device in ("CUDA", "OPENCL"):
        try:
            prog.compile(device=device)
        except tgc.TgcError:
            pass  # no NVRTC or no OpenCL here: nothing changed the handler either
        assert disposition() == before, device
