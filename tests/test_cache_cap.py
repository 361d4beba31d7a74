"""The cache's cap (`TGC_CACHE_MAX_BYTES`, tgc/cache.py): a put that takes the compiled tables over it removes
their least recently used entries (a get marks one used) until under it; never the entry just stored, one in use
in this process, nor a `beam` entry; what stays reads back whole. `tgc cache stats` shows size, cap and count."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tgc import cache


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("TGC_CACHE_DIR", str(directory))
    monkeypatch.delenv("DISABLE_COMPILER_CACHE", raising=False)
    monkeypatch.setattr(cache, "TOUCH_S", 0.0)  # every hit marks its entry used
    monkeypatch.setattr(cache, "_IN_USE_MAX", 1)  # in use here: only the last entry stored or read
    cache._reset_for_tests()
    yield directory
    cache._reset_for_tests()


def _value(i: int, n: int = 1000) -> bytes:
    return bytes([i % 256]) * n


def _keys(table: str = "compile") -> set[str]:
    return {r["key"] for r in cache.entries(table)}


def test_over_the_cap_the_least_recently_used_go(monkeypatch):
    monkeypatch.setenv("TGC_CACHE_MAX_BYTES", str(3 * 1100))  # about three 1000-byte values with headers
    for i in range(3):
        cache.put("compile", f"k{i}", _value(i))
    assert _keys() == {"k0", "k1", "k2"}
    assert cache.get("compile", "k0") == _value(0)  # k0 used: k1 is now the least recently used
    cache.put("compile", "k3", _value(3))
    assert _keys() == {"k0", "k2", "k3"}
    cache.put("program", "p0", _value(4, 2000))  # the program table counts too: two go for it
    assert _keys() | _keys("program") == {"k3", "p0"}
    for key, i in (("k3", 3),):
        assert cache.get("compile", key) == _value(i)  # what stays reads back whole
    assert cache.get("program", "p0") == _value(4, 2000)
    assert cache.stats()["compiled_bytes"] <= 3 * 1100


def test_the_entry_just_stored_stays_even_past_the_cap(monkeypatch):
    monkeypatch.setenv("TGC_CACHE_MAX_BYTES", "100")
    cache.put("compile", "small", _value(1, 50))
    cache.put("compile", "big", _value(2, 5000))
    assert _keys() == {"big"}
    assert cache.get("compile", "big") == _value(2, 5000)


def test_entries_in_use_here_and_beam_entries_stay(monkeypatch):
    monkeypatch.setattr(cache, "_IN_USE_MAX", 2)
    monkeypatch.setenv("TGC_CACHE_MAX_BYTES", "1500")
    cache.put("beam", "b0", _value(9, 3000))  # (not counted, never removed: the program cache keys on it)
    cache.put("compile", "old", _value(1))
    cache.put("compile", "new", _value(2))  # over the cap: "old" is in use here (read or stored last), stays
    assert _keys() == {"old", "new"}
    cache._in_use.clear()
    cache.put("compile", "third", _value(3))
    assert _keys() == {"third"} and _keys("beam") == {"b0"}


def test_bad_cap_is_one_clear_error(monkeypatch, capsys):
    from click.testing import CliRunner

    from tgc.cli.main import main as cli

    monkeypatch.setenv("TGC_CACHE_MAX_BYTES", "lots")
    r = CliRunner().invoke(cli, ["cache", "stats"])
    assert r.exit_code == 2 and "TGC_CACHE_MAX_BYTES" in r.output and "Traceback" not in r.output, r.output
    cache.put("compile", "k", b"x")  # through the API: one warning, the default cap, the entry stored
    assert cache.get("compile", "k") == b"x"
    assert "TGC_CACHE_MAX_BYTES" in capsys.readouterr().err


def test_an_older_database_gets_the_used_column(cache_dir):
    cache_dir.mkdir(parents=True)
    conn = sqlite3.connect(str(cache_dir / cache.DB_NAME))
    conn.execute("CREATE TABLE cache (tbl TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, "
                 "meta TEXT NOT NULL DEFAULT '', created REAL NOT NULL, PRIMARY KEY (tbl, key))")
    conn.commit()
    conn.close()
    cache.put("compile", "k", b"abc")
    assert cache.get("compile", "k") == b"abc"


def test_cache_stats_shows_size_cap_and_count(monkeypatch, cache_dir):
    from click.testing import CliRunner

    from tgc.cli.main import main as cli

    monkeypatch.setenv("TGC_CACHE_MAX_BYTES", "5000")
    cache.put("compile", "k0", _value(0))
    cache.put("beam", "b", b"{}")
    r = CliRunner().invoke(cli, ["cache", "stats", "--json"])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.output)
    assert stats["max_bytes"] == 5000 and stats["count"] == 2 and 1000 <= stats["compiled_bytes"] < 1100
    r = CliRunner().invoke(cli, ["cache", "stats"])
    assert r.exit_code == 0 and "of a 4.9 KiB cap" in r.output and "2 entries in all" in r.output, r.output


def test_a_put_under_the_cap_sums_no_lengths(monkeypatch):
    """Under the cap a put looks at the database's pages in use (`_used_bytes`: one header), which bound the
    compiled tables' bytes from above; only a file over the cap has every length summed."""
    monkeypatch.setattr(cache, "_IN_USE_MAX", 64)
    for i in range(20):
        cache.put("compile", f"k{i}", _value(i, 3000))
    assert cache._used_bytes() >= cache._compiled_bytes() >= 20 * 3000  # a bound from above, WAL pages included
    summed = []
    plain = cache._compiled_bytes
    monkeypatch.setattr(cache, "_compiled_bytes", lambda: summed.append(1) or plain())
    cache.put("compile", "under", _value(1))  # the default cap, 4 GiB: nothing summed
    assert summed == [] and "under" in _keys()
    monkeypatch.setenv("TGC_CACHE_MAX_BYTES", str(cache._used_bytes() - 1))  # the file over the cap: summed
    cache.put("compile", "over", _value(2))
    assert summed and len(_keys()) == 22  # (the file's pages over the cap, the values under it: none removed)
    monkeypatch.setattr(cache, "_IN_USE_MAX", 1)
    cache._in_use.clear()
    monkeypatch.setenv("TGC_CACHE_MAX_BYTES", str(5 * 1100))
    cache.put("compile", "last", _value(3))
    assert "last" in _keys() and cache._compiled_bytes() <= 5 * 1100
