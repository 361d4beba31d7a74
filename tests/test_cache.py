"""Tests of the on-disk cache (tgc/cache.py): round trips, key encoding, where the file lives,
DISABLE_COMPILER_CACHE, listing and clearing, and the ways a broken cache degrades to "no cache"."""

from __future__ import annotations

import ast
import enum
import hashlib
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tgc import cache

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets an empty cache directory (not yet created), fresh module state and a short busy timeout."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("TGC_CACHE_DIR", str(directory))
    monkeypatch.delenv("DISABLE_COMPILER_CACHE", raising=False)
    monkeypatch.setattr(cache, "busy_timeout_s", 0.1)
    cache._reset_for_tests()
    yield directory
    cache._reset_for_tests()


def warning_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("tgc: warning:")]


# ------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("value", [
    b"",
    b"\x00",
    b"\x00ELF\x00\x00\x01binary\x00",
    bytes(range(256)) * 16384,  # 4 MiB, every byte value
], ids=["empty", "nul", "nul-inside", "4MiB"])
def test_round_trip_keeps_bytes_exactly(value: bytes) -> None:
    cache.put("compile", "k", value)
    got = cache.get("compile", "k")
    assert type(got) is bytes
    assert got == value


def test_bytearray_and_memoryview_come_back_as_bytes() -> None:
    cache.put("compile", "a", bytearray(b"\x01\x02"))
    cache.put("compile", "m", memoryview(b"\x03\x00\x04"))
    assert cache.get("compile", "a") == b"\x01\x02"
    assert cache.get("compile", "m") == b"\x03\x00\x04"


def test_put_replaces_and_tables_are_separate() -> None:
    cache.put("compile", "k", b"old")
    cache.put("compile", "k", b"new")
    cache.put("beam", "k", b'{"opts": []}')
    assert cache.get("compile", "k") == b"new"
    assert cache.get("beam", "k") == b'{"opts": []}'
    assert cache.stats()["entries"] == {"compile": 1, "beam": 1, "probe": 0, "program": 0}


def test_counters_count_hits_misses_and_puts() -> None:
    assert cache.get("compile", "absent") is None
    cache.put("compile", "k", b"v")
    cache.put("beam", "k", b"w")
    assert cache.get("compile", "k") == b"v"
    assert cache.get("beam", "k") == b"w"
    assert cache.get("beam", "absent") is None
    assert cache.counters == {"hits": 2, "misses": 2, "puts": 2}
    got = cache.stats()
    assert (got["hits"], got["misses"], got["puts"]) == (2, 2, 2)


def test_bad_arguments_are_programming_errors() -> None:
    with pytest.raises(ValueError, match="table name"):
        cache.put("Compile; DROP", "k", b"v")
    with pytest.raises(ValueError, match="table name"):
        cache.get("", "k")
    with pytest.raises(TypeError, match="bytes"):
        cache.put("beam", "k", '{"opts": []}')  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ keys


class Color(enum.Enum):
    RED = 1


def test_make_key_is_sha256_of_a_typed_json_encoding() -> None:
    expected = hashlib.sha256(b'["seq",[["str","CPU"],["int",3],["bytes","00ff"],["none"]]]').hexdigest()
    assert cache.make_key("CPU", 3, b"\x00\xff", None) == expected


def test_make_key_distinguishes_what_matters() -> None:
    keys = [
        cache.make_key("ab", "c"),
        cache.make_key("a", "bc"),
        cache.make_key("abc"),
        cache.make_key(1),
        cache.make_key("1"),
        cache.make_key(b"1"),
        cache.make_key(True),
        cache.make_key(1.0),
        cache.make_key(None),
        cache.make_key(("1",)),
        cache.make_key(Color.RED),
    ]
    assert len(set(keys)) == len(keys)
    assert all(len(k) == 64 and set(k) <= set("0123456789abcdef") for k in keys)


def test_make_key_is_stable_for_equal_inputs() -> None:
    assert cache.make_key({"b": 2, "a": [1, 2]}) == cache.make_key({"a": (1, 2), "b": 2})
    assert cache.make_key({3, 1, 2}) == cache.make_key(frozenset([2, 3, 1]))
    assert cache.make_key(Path("/x/y")) == cache.make_key(Path("/x") / "y")
    with pytest.raises(TypeError, match="stably"):
        cache.make_key(object())


def test_make_key_is_the_same_in_another_process() -> None:
    code = "from tgc import cache; print(cache.make_key('CPU', {'x', 'y'}, {'b': 1, 'a': 2}))"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == cache.make_key("CPU", {"y", "x"}, {"a": 2, "b": 1})


# ----------------------------------------------------------------------------------------------- paths


def test_cache_dir_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache.cache_dir() == tmp_path / "explicit"
    assert cache.db_path() == tmp_path / "explicit" / "cache.db"

    monkeypatch.setenv("TGC_CACHE_DIR", "")  # empty counts as unset
    assert cache.cache_dir() == tmp_path / "xdg" / "tgc"

    monkeypatch.delenv("TGC_CACHE_DIR")
    assert cache.cache_dir() == tmp_path / "xdg" / "tgc"

    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # the XDG spec says to ignore relative paths
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "tgc"

    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "tgc"


def test_directory_is_created_lazily_and_followed_when_env_changes(
        cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache.cache_dir() == cache_dir
    assert not cache_dir.exists()
    cache.put("beam", "k", b"first")
    assert (cache_dir / "cache.db").is_file()

    other = tmp_path / "nested" / "other"
    monkeypatch.setenv("TGC_CACHE_DIR", str(other))
    assert cache.get("beam", "k") is None  # a different, empty cache
    cache.put("beam", "k", b"second")
    assert (other / "cache.db").is_file()

    monkeypatch.setenv("TGC_CACHE_DIR", str(cache_dir))
    assert cache.get("beam", "k") == b"first"


# ------------------------------------------------------------------------------- DISABLE_COMPILER_CACHE


def test_disable_compiler_cache_turns_off_only_the_compile_table(
        cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.put("compile", "stored-before", b"bin")
    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")
    assert cache.enabled() is False
    assert cache.get("compile", "stored-before") is None
    cache.put("compile", "while-disabled", b"bin")
    cache.put("beam", "opts", b"[]")
    assert cache.get("beam", "opts") == b"[]"
    assert cache.stats()["enabled"] is False

    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "0")
    assert cache.enabled() is True
    assert cache.get("compile", "stored-before") == b"bin"
    assert cache.get("compile", "while-disabled") is None  # the put did nothing
    assert cache.counters == {"hits": 2, "misses": 2, "puts": 2}

    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "")
    assert cache.enabled() is True


def test_disabled_cache_does_not_create_the_directory(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "yes")
    cache.put("compile", "k", b"bin")
    assert cache.get("compile", "k") is None
    assert not cache_dir.exists()


# ------------------------------------------------------------------------------ stats, entries, clear


def test_stats_entries_and_clear(cache_dir: Path) -> None:
    empty = cache.stats()
    assert empty["path"] == str(cache_dir / "cache.db")
    assert empty["entries"] == {"compile": 0, "beam": 0, "probe": 0, "program": 0}
    assert empty["available"] is True

    key1, key2, key3 = cache.make_key("k1"), cache.make_key("k2"), cache.make_key("k3")
    cache.put("compile", key1, b"\x00" * 10, meta="r_4_4 on CPU")
    cache.put("compile", key2, b"abc", meta="E_16 on CPU")
    cache.put("beam", key3, b'{"opts":[]}', meta="r_4_4 on CPU")

    got = cache.stats()
    assert got["entries"] == {"compile": 2, "beam": 1, "probe": 0, "program": 0}
    on_disk = sum(p.stat().st_size for p in cache_dir.iterdir() if p.name.startswith("cache.db"))
    assert got["size"] == on_disk > 0

    listed = sorted(cache.entries(), key=lambda e: e["key"])
    expected = sorted([
        {"table": "compile", "key": key1[:16], "meta": "r_4_4 on CPU", "size": 10},
        {"table": "compile", "key": key2[:16], "meta": "E_16 on CPU", "size": 3},
        {"table": "beam", "key": key3[:16], "meta": "r_4_4 on CPU", "size": 11},
    ], key=lambda e: e["key"])
    assert [{k: v for k, v in e.items() if k != "created"} for e in listed] == expected
    assert all(isinstance(e["created"], float) and e["created"] > 1.6e9 for e in listed)
    assert [e["key"] for e in cache.entries("beam")] == [key3[:16]]

    assert cache.clear("beam") == 1
    assert cache.stats()["entries"] == {"compile": 2, "beam": 0, "probe": 0, "program": 0}
    assert cache.get("compile", key1) == b"\x00" * 10
    assert cache.clear() == 2
    assert cache.entries() == []
    assert cache.clear() == 0


def test_other_namespaces_show_up_in_stats() -> None:
    cache.put("autotune", "k", b"1")
    assert cache.stats()["entries"] == {"compile": 0, "beam": 0, "probe": 0, "program": 0, "autotune": 1}


# ------------------------------------------------------------------------------------ broken caches


def assert_degraded(capsys: pytest.CaptureFixture[str], *must_mention: str) -> str:
    """Use the cache in every way; nothing may raise, nothing is found, and exactly one warning appears."""
    for _ in range(2):
        assert cache.get("compile", "k") is None
        cache.put("compile", "k", b"v")
        cache.put("beam", "k", b"v")
        assert cache.get("beam", "k") is None
        assert cache.entries() == []
        assert cache.stats()["available"] is False
    assert cache.counters["puts"] == 0
    err = capsys.readouterr().err
    assert len(warning_lines(err)) == 1, err
    for text in must_mention:
        assert text in err
    return err


def test_corrupt_file_warns_once_and_is_left_untouched(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache_dir.mkdir()
    garbage = b"this is not an SQLite database\x00\xff" * 200
    db = cache_dir / "cache.db"
    db.write_bytes(garbage)

    assert_degraded(capsys, str(db), "corrupt", "tgc cache clear")
    assert db.read_bytes() == garbage

    # Clearing is the user's explicit fix: the file is replaced by a working database.
    assert cache.clear() == 0
    assert db.read_bytes() != garbage
    cache.put("compile", "k", b"v")
    assert cache.get("compile", "k") == b"v"
    assert capsys.readouterr().err == ""


def test_short_garbage_file_counts_as_corrupt(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache_dir.mkdir()
    (cache_dir / "cache.db").write_bytes(b"hello")
    assert_degraded(capsys, "corrupt")
    assert (cache_dir / "cache.db").read_bytes() == b"hello"


def test_a_broken_cache_does_not_stop_another_one_working(
        cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cache_dir.mkdir()
    (cache_dir / "cache.db").write_bytes(b"garbage" * 100)
    assert cache.get("beam", "k") is None
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "good"))
    cache.put("beam", "k", b"v")
    assert cache.get("beam", "k") == b"v"
    # A second, different failure prints nothing more: one warning per process.
    not_a_dir = tmp_path / "plain-file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("TGC_CACHE_DIR", str(not_a_dir))
    assert cache.get("beam", "k") is None
    assert len(warning_lines(capsys.readouterr().err)) == 1


def test_database_locked_before_opening(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache_dir.mkdir()
    db = cache_dir / "cache.db"
    other = sqlite3.connect(db, isolation_level=None)  # rollback journal: an exclusive lock blocks readers too
    other.execute("CREATE TABLE unrelated (x)")
    other.execute("BEGIN EXCLUSIVE")
    try:
        assert_degraded(capsys, str(db), "locked")
    finally:
        other.execute("ROLLBACK")
        other.close()
    # The cache stays off for this process; a new process (here: reset state) uses it again.
    cache._reset_for_tests()
    cache.put("compile", "k", b"v")
    assert cache.get("compile", "k") == b"v"


def test_database_locked_while_in_use(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache.put("compile", "first", b"1")
    other = sqlite3.connect(cache_dir / "cache.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # in WAL mode this blocks writers only
    try:
        cache.put("compile", "second", b"2")  # must not raise
        err = capsys.readouterr().err
        assert len(warning_lines(err)) == 1 and "locked" in err
        assert cache.get("compile", "first") is None  # the cache is off from now on
        cache.put("compile", "third", b"3")
        assert capsys.readouterr().err == ""
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert cache.counters["puts"] == 1


def test_cache_dir_that_is_a_file(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache_dir.write_bytes(b"user data")
    assert_degraded(capsys, str(cache_dir), "TGC_CACHE_DIR")
    assert cache_dir.read_bytes() == b"user data"


def test_cache_dir_below_a_file(cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    cache_dir.write_bytes(b"user data")
    monkeypatch.setenv("TGC_CACHE_DIR", str(cache_dir / "sub"))
    assert_degraded(capsys)
    assert cache_dir.read_bytes() == b"user data"


def test_database_path_that_is_a_directory(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (cache_dir / "cache.db").mkdir(parents=True)
    assert_degraded(capsys, str(cache_dir / "cache.db"))


def test_unwritable_directory(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache_dir.mkdir()
    cache_dir.chmod(stat.S_IRUSR | stat.S_IXUSR)  # 0o500
    try:
        if os.access(cache_dir, os.W_OK):
            pytest.skip("permissions are not enforced for this user (root?)")
        assert_degraded(capsys, str(cache_dir))
    finally:
        cache_dir.chmod(0o700)
    assert list(cache_dir.iterdir()) == []


def test_clear_on_a_locked_database_warns_and_returns_zero(cache_dir: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    cache.put("beam", "k", b"v")
    other = sqlite3.connect(cache_dir / "cache.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        assert cache.clear() == 0
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert len(warning_lines(capsys.readouterr().err)) == 1
    cache._reset_for_tests()
    assert cache.get("beam", "k") == b"v"


# --------------------------------------------------------------------------------------- concurrency


WRITER = textwrap.dedent("""
    import os, sys, time
    from tgc import cache
    go, tag = sys.argv[1], sys.argv[2]
    deadline = time.monotonic() + 60
    while not os.path.exists(go):  # start together with the other writer
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.002)
    for i in range(200):
        cache.put("compile", cache.make_key(tag, i), f"{tag}-{i}".encode() + b"\\x00", meta=f"{tag} {i}")
    print(cache.counters["puts"])
""")


def test_two_processes_fill_the_cache_at_once(cache_dir: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    env = {**os.environ, "TGC_CACHE_DIR": str(cache_dir),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(go), tag], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE) for tag in ("a", "b")]
    go.touch()
    results = [w.communicate(timeout=120) for w in writers]
    for writer, (out, err) in zip(writers, results):
        assert (writer.returncode, out.strip(), err) == (0, "200", "")

    assert cache.stats()["entries"]["compile"] == 400
    for tag in ("a", "b"):
        for i in range(200):
            assert cache.get("compile", cache.make_key(tag, i)) == f"{tag}-{i}".encode() + b"\x00"


def test_database_uses_wal_so_readers_never_block_writers(cache_dir: Path) -> None:
    cache.put("compile", "k", b"v")
    with sqlite3.connect(cache_dir / "cache.db") as other:
        assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    other.close()


def test_threads_share_the_connection() -> None:
    errors: list[BaseException] = []

    def work(thread: int) -> None:
        try:
            for i in range(50):
                cache.put("beam", f"{thread}-{i}", bytes([thread, i]))
                assert cache.get("beam", f"{thread}-{i}") == bytes([thread, i])
        except BaseException as error:  # collected so the main thread can fail the test
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cache.stats()["entries"]["beam"] == 400
    assert cache.counters == {"hits": 400, "misses": 0, "puts": 400}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_opens_its_own_connection() -> None:
    cache.put("beam", "parent", b"p")
    pid = os.fork()
    if pid == 0:  # child: report through the exit code, never return into pytest
        code = 1
        try:
            fresh = cache._conn is None
            seen = cache.get("beam", "parent") == b"p"
            cache.put("beam", "child", b"c")
            code = 0 if fresh and seen else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cache.get("beam", "child") == b"c"
    cache.put("beam", "parent-again", b"q")
    assert cache.get("beam", "parent-again") == b"q"


# ------------------------------------------------------------------------------------------------ import


def test_module_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(cache.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)


# ------------------------------------------------------------------------------ integrity of stored values


def _raw_set(cache_dir: Path, table: str, key: str, value: bytes) -> None:
    """Write a row's stored bytes behind the cache's back (what damage or tampering on disk does)."""
    conn = sqlite3.connect(str(cache_dir / "cache.db"))
    with conn:
        conn.execute("UPDATE cache SET value = ? WHERE tbl = ? AND key = ?", (value, table, key))
    conn.close()


def _raw_get(cache_dir: Path, table: str, key: str) -> bytes | None:
    conn = sqlite3.connect(str(cache_dir / "cache.db"))
    rows = conn.execute("SELECT value FROM cache WHERE tbl = ? AND key = ?", (table, key)).fetchall()
    conn.close()
    return bytes(rows[0][0]) if rows else None


def test_a_changed_value_is_a_miss_that_drops_the_entry(cache_dir: Path, capsys: pytest.CaptureFixture) -> None:
    cache.put("compile", "k", b"the binary of x + 1")
    stored = _raw_get(cache_dir, "compile", "k")
    assert stored is not None and stored.endswith(b"the binary of x + 1")
    cache._drop_connection()
    _raw_set(cache_dir, "compile", "k", stored.replace(b"x + 1", b"x * 2"))
    assert cache.get("compile", "k") is None
    assert cache.get("compile", "k") is None  # dropped: the second read is a plain miss
    assert _raw_get(cache_dir, "compile", "k") is None
    err = capsys.readouterr().err
    assert len(warning_lines(err)) == 1 and "checksum" in err
    cache.put("compile", "k", b"good")  # replaced by the next put
    assert cache.get("compile", "k") == b"good"


def test_a_truncated_or_headerless_value_is_a_miss(cache_dir: Path, capsys: pytest.CaptureFixture) -> None:
    cache.put("compile", "a", b"0123456789" * 10)
    cache.put("compile", "b", b"0123456789" * 10)
    cache._drop_connection()
    _raw_set(cache_dir, "compile", "a", _raw_get(cache_dir, "compile", "a")[:-7])
    _raw_set(cache_dir, "compile", "b", b"0123456789" * 10)  # a value without the header (an older cache)
    assert cache.get("compile", "a") is None
    assert cache.get("compile", "b") is None
    assert len(warning_lines(capsys.readouterr().err)) == 1


def test_values_swapped_between_keys_do_not_match(cache_dir: Path) -> None:
    cache.put("compile", "plus_one", b"binary of x + 1")
    cache.put("compile", "times_two", b"binary of x * 2")
    cache._drop_connection()
    swapped = _raw_get(cache_dir, "compile", "times_two")
    _raw_set(cache_dir, "compile", "plus_one", swapped)
    assert cache.get("compile", "plus_one") is None
    assert cache.get("compile", "times_two") == b"binary of x * 2"


def test_entries_show_the_size_of_the_value_not_the_header(cache_dir: Path) -> None:
    cache.put("beam", "k", b"12345")
    assert [e["size"] for e in cache.entries()] == [5]


def test_invalidate_drops_one_entry_and_warns_once(cache_dir: Path, capsys: pytest.CaptureFixture) -> None:
    cache.put("compile", "a", b"1")
    cache.put("compile", "b", b"2")
    cache.invalidate("compile", "a", "does not load")
    cache.invalidate("compile", "zz", "does not load")
    assert cache.get("compile", "a") is None and cache.get("compile", "b") == b"2"
    err = capsys.readouterr().err
    assert len(warning_lines(err)) == 1 and "does not load" in err
