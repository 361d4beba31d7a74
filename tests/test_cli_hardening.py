"""The command line under careless and hostile use (issues 9 and 10): environment settings, device indices,
click's own errors, huge sizes, odd files and options, the cache's clear/peak paths, Ctrl-C, deep programs
and the memory of `--check`. Each test failed before its fix."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import tgc
import tgc.api
from tgc.cli.main import main
from tgc.errors import TgcError

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = str(ROOT / "kernels" / "softmax.tg")


def invoke(*args: str, env: dict | None = None):
    return CliRunner(env={"NO_COLOR": "1", "DEBUG": None, "TGC_DEVICE": None, **(env or {})}).invoke(
        main, list(args), prog_name="tgc")


def assert_clean(r, code: int, *words: str) -> None:
    """Exit `code` with one `error:` message holding `words`, never a traceback or an internal error."""
    assert r.exit_code == code, (r.exit_code, r.stderr, r.exception)
    assert r.stderr.startswith("error: "), r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


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
    r = invoke("run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2", "-d", "CPU:5")
    assert_clean(r, 2, "CPU:5", "1 CPU device")
    assert_clean(invoke("run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2", "-d", "PYTHON:1"), 2, "PYTHON:1")
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
