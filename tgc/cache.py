"""The on-disk cache of compiled binaries and BEAM results.

One SQLite file, `cache.db`, in `cache_dir()`. It holds one SQL table whose rows are grouped by a
namespace, also called "table" in this API: `compile` (compiled binaries) and `beam` (JSON text of
the chosen optimizations, stored as bytes). Values are always raw bytes, never pickles.

The cache is an optimization, so it must never break a run. Any problem with the database (a corrupt
file, a lock held too long by another process, an unwritable or missing directory) turns the cache
off for the rest of the process: `get` returns None, `put` does nothing, and one warning goes to
stderr. A corrupt file is left where it is; only an explicit `clear()` deletes it.

Each value is stored behind a header holding the sha256 of its table, key and bytes, checked on every
`get`: an entry whose bytes were changed, truncated or swapped with another entry's is deleted and
reported as a miss (with one warning), so the caller recompiles and stores a good one. `invalidate`
does the same for an entry whose bytes check out but cannot be used (a binary that fails to load).

The tables of compiled code (`compile`, `program`) have a cap, `TGC_CACHE_MAX_BYTES` (default 4 GiB, counted
as their values' bytes): a `put` that takes them over it removes their least recently used entries (a `get`
marks an entry used; at most once a `TOUCH_S`) until they are under it again, never the entry just stored nor
the last `_IN_USE_MAX` this process stored or read (in use here). Each removal is one transaction: an entry is
there whole or not at all. `beam` and `probe` (small, and the program cache keys on the `beam` table) are never removed.

Several processes may fill the cache at once: the database uses WAL journaling, a busy timeout, and
one short autocommit transaction per call. One connection per process, opened lazily, shared by
threads under a lock, and re-opened after a fork.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import os
import re
import sqlite3
import sys
import threading
import time
from pathlib import Path, PurePath
from typing import Any

__all__ = [
    "COMPILED_TABLES", "TABLES", "ClearError", "busy_timeout_s", "cache_dir", "clear", "counters", "db_path",
    "absent", "enabled", "entries", "get", "get_json", "invalidate", "last_problem", "make_key", "problem", "put",
    "quiet", "stats", "table_state",
]

DB_NAME = "cache.db"
TABLES = ("compile", "beam", "probe", "program")  # the namespaces tgc uses; stats() always lists these
# tables of compiled code, which DISABLE_COMPILER_CACHE turns off (`program`: whole programs, `tgc.progcache`)
COMPILED_TABLES = ("compile", "program")
KEY_PREFIX_LEN = 16  # how much of a key `entries()` shows

# Seconds a call waits for another process's lock before giving up on the cache. Tests lower it.
busy_timeout_s = 5.0

# Counted in this process since import (or since `_reset_for_tests()`). A get returning None is a miss.
counters = {"hits": 0, "misses": 0, "puts": 0}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cache (
    tbl     TEXT NOT NULL,
    key     TEXT NOT NULL,
    value   BLOB NOT NULL,
    meta    TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    used    REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (tbl, key)
)
"""
DEFAULT_MAX_BYTES = 4 << 30  # TGC_CACHE_MAX_BYTES's default
TOUCH_S = 1.0  # a hit marks its entry used at most once in this many seconds (not a write per hit). Tests lower it.
_IN_USE_MAX = 64  # the entries this process stored or read last: in use here, kept from eviction
# A stored value is _VALUE_MAGIC + sha256(table, key, value) + value.
_VALUE_MAGIC = b"TGV1"
_HEADER_LEN = len(_VALUE_MAGIC) + 32
_TABLE_NAME = re.compile(r"[a-z][a-z0-9_]*")
# Files SQLite may keep next to the database.
_SIDE_SUFFIXES = ("-wal", "-shm", "-journal")

# Module state, guarded by _lock.
_lock = threading.RLock()
_conn: sqlite3.Connection | None = None
_conn_path: Path | None = None
_conn_pid: int | None = None
_broken_path: Path | None = None  # the database that failed; no cache for it in this process
_warned = False
_quiet = False  # (`quiet()`: a failure is kept in `_last_problem` for the caller to report, not warned about)
_last_problem: str | None = None
_warned_bad_entry = False
_warned_cap = False  # a bad TGC_CACHE_MAX_BYTES was reported
# Connections inherited through fork. Closing them in the child could disturb the parent's locks, and
# letting them be garbage-collected closes them, so they are kept here and never used.
_abandoned: list[sqlite3.Connection] = []
_in_use: dict[tuple[str, str], None] = {}  # (table, key) stored or read here: never evicted by this process


# ---------------------------------------------------------------------------------------------- paths


def cache_dir() -> Path:
    """`TGC_CACHE_DIR`, else `$XDG_CACHE_HOME/tgc`, else `~/.cache/tgc`. Read on every call; never created here."""
    explicit = os.environ.get("TGC_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec says to ignore relative paths
        return Path(xdg) / "tgc"
    return Path.home() / ".cache" / "tgc"


def db_path() -> Path:
    return cache_dir() / DB_NAME


def enabled() -> bool:
    """False when `DISABLE_COMPILER_CACHE` is set to anything but "" or "0". Only the tables of compiled code
    (`compile`, `program`) obey it."""
    return os.environ.get("DISABLE_COMPILER_CACHE", "") in ("", "0")


# ------------------------------------------------------------------------------------------------ keys


def _encodable(value: Any) -> Any:
    """A JSON-able form of `value` in which every item carries its type, so that 1, "1", b"1" and
    ("ab", "c") vs ("a", "bc") all encode differently."""
    if value is None:
        return ["none"]
    if isinstance(value, bool):  # before int: bool is a subclass of int
        return ["bool", value]
    if isinstance(value, enum.Enum):
        return ["enum", type(value).__qualname__, value.name]
    if isinstance(value, int):
        return ["int", value]
    if isinstance(value, float):
        return ["float", repr(value)]
    if isinstance(value, str):
        return ["str", value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ["bytes", bytes(value).hex()]
    if isinstance(value, PurePath):
        return ["path", str(value)]
    if isinstance(value, (list, tuple)):
        return ["seq", [_encodable(v) for v in value]]
    if isinstance(value, (set, frozenset)):
        return ["set", sorted((_encodable(v) for v in value), key=_stable_text)]
    if isinstance(value, dict):
        items = [[_encodable(k), _encodable(v)] for k, v in value.items()]
        return ["dict", sorted(items, key=lambda kv: _stable_text(kv[0]))]
    raise TypeError(f"make_key: cannot encode {type(value).__name__!r} stably; pass a str instead")


def _stable_text(encoded: Any) -> str:
    return json.dumps(encoded, separators=(",", ":"), ensure_ascii=True)


def make_key(*parts: object) -> str:
    """sha256 hex digest of a stable text encoding of `parts` (the same in every process and version of Python).

    Pass everything that changes the cached result: device, compiler name and version, flags, tgc
    version, source. Supported: None, bool, int, float, str, bytes, enums, paths, and lists, tuples
    (treated alike), sets and dicts of these.
    """
    return hashlib.sha256(_stable_text(_encodable(list(parts))).encode("ascii")).hexdigest()


# ---------------------------------------------------------------------------------------- connection


def _warn_once(message: str) -> None:
    global _warned, _last_problem
    _last_problem = message
    if _quiet:
        return
    if not _warned:
        _warned = True
        sys.stderr.write(f"tgc: warning: {message}; continuing without the on-disk cache\n")
        sys.stderr.flush()


def _describe(path: Path, error: BaseException) -> str:
    """The warning text for `error`, with the fix the user can apply."""
    if isinstance(error, sqlite3.OperationalError) and "locked" in str(error):
        return f"the cache database {path} is locked by another process ({error})"
    if _is_corrupt(error):
        return (f"the cache database {path} is corrupt ({error}); it was left in place, "
                f"run `tgc cache clear` or delete the file to fix it")
    return f"cannot use the cache database {path} ({error}); set TGC_CACHE_DIR to a writable directory"


class quiet:  # noqa: N801 - used as `with cache.quiet():`
    """Within it, a database that cannot be used is not warned about: `last_problem()` says why (the `tgc cache`
    commands report it as their one error)."""

    def __enter__(self) -> None:
        global _quiet, _last_problem, _broken_path
        with _lock:  # (a database found unusable earlier in this process is tried again: the caller reports it)
            _quiet, _last_problem, _broken_path = True, None, None

    def __exit__(self, *exc: object) -> None:
        global _quiet
        _quiet = False


def last_problem() -> str | None:
    """Why the cache was last found unusable in this process (the text of its warning), or None."""
    return _last_problem


def problem() -> str | None:
    """Why the cache's location cannot hold a cache, found without creating anything, or None: a path to it
    that runs through a file, or a directory this user may not read and write (or, where it does not exist yet,
    create). A database that fails when opened (locked, corrupt) is found by using it (`stats()["available"]`)."""
    try:
        path = db_path()
    except RuntimeError as error:
        return f"cannot find a cache directory ({error})"
    directory, probe = path.parent, path.parent
    while True:
        try:
            st = probe.stat()
            break
        except (FileNotFoundError, NotADirectoryError):  # (a file above: found when its own stat succeeds)
            if probe == probe.parent:
                return None
            probe = probe.parent
        except PermissionError:
            return f"cannot reach {probe}: permission denied"
        except (OSError, ValueError) as error:
            return f"cannot use {probe} ({error})"
    import stat as stat_

    if not stat_.S_ISDIR(st.st_mode):
        return f"{probe} is not a directory" if probe == directory else f"{directory} is under a file, {probe}"
    if probe != directory:
        return None if os.access(probe, os.W_OK | os.X_OK) else \
            f"cannot create {directory}: permission denied in {probe}"
    if not os.access(directory, os.R_OK | os.W_OK | os.X_OK):
        return f"cannot read and write the directory {directory}: permission denied"
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return f"cannot read and write {path}: permission denied"
    return None


def absent() -> bool:
    """No cache database (nor one open) where the cache lives: nothing to list or clear."""
    return _absent()


def _is_corrupt(error: BaseException) -> bool:
    return isinstance(error, sqlite3.DatabaseError) and not isinstance(error, sqlite3.OperationalError)


def _open(path: Path) -> sqlite3.Connection:
    """Create the directory and the schema if needed. Raises on any problem."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # isolation_level=None: autocommit, so each statement is its own short transaction.
    conn = sqlite3.connect(str(path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
    try:
        _set_up(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _set_up(conn: sqlite3.Connection) -> None:
    """Switch to WAL and create the schema, retrying while other processes do the same.

    When several processes open a new database at once, switching the journal mode can fail with
    "database is locked" at once, without waiting for the busy timeout (SQLite refuses to wait where
    two connections could deadlock). So retry until the busy timeout has passed.
    """
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")  # persistent: stored in the file
            conn.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; losing the last entries on power loss is fine
            conn.execute(_SCHEMA)
            if "used" not in {row[1] for row in conn.execute("PRAGMA table_info(cache)")}:  # (an older file)
                try:
                    conn.execute("ALTER TABLE cache ADD COLUMN used REAL NOT NULL DEFAULT 0")
                except sqlite3.OperationalError as error:
                    if "duplicate column" not in str(error):  # (another process added it first)
                        raise
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _drop_connection() -> None:
    """Forget the current connection: close it if this process opened it, else abandon it (after a fork)."""
    global _conn, _conn_path, _conn_pid
    if _conn is not None:
        if _conn_pid == os.getpid():
            try:
                _conn.close()
            except sqlite3.Error:
                pass
        else:
            _abandoned.append(_conn)
    _conn, _conn_path, _conn_pid = None, None, None


def _fail(path: Path, error: BaseException) -> None:
    """Turn the cache at `path` off for this process and warn (once)."""
    global _broken_path
    _drop_connection()
    _broken_path = path
    _warn_once(_describe(path, error))


def _connection() -> tuple[sqlite3.Connection, Path] | None:
    """The open connection for the current `db_path()`, or None when the cache is unusable. Call with _lock held."""
    try:
        path = db_path()
    except RuntimeError as error:  # Path.home() fails when HOME is unset and the user has no passwd entry
        _warn_once(f"cannot find a cache directory ({error}); set TGC_CACHE_DIR")
        return None
    if _conn is not None and _conn_pid == os.getpid() and _conn_path == path:
        return _conn, path
    _drop_connection()
    if path == _broken_path:
        return None
    try:
        conn = _open(path)
    except (sqlite3.Error, OSError, ValueError) as error:  # ValueError: a NUL byte in the path
        _fail(path, error)
        return None
    _adopt(conn, path)
    return conn, path


def _adopt(conn: sqlite3.Connection, path: Path) -> None:
    """Make `conn` (just opened on `path`) this process's connection."""
    global _conn, _conn_path, _conn_pid
    _conn, _conn_path, _conn_pid = conn, path, os.getpid()


def _run(query: str, params: tuple = ()) -> list[tuple] | None:
    """Run one statement and fetch its rows; None when the cache is unusable (after warning once)."""
    with _lock:
        opened = _connection()
        if opened is None:
            return None
        conn, path = opened
        try:
            return conn.execute(query, params).fetchall()
        except (sqlite3.Error, OSError) as error:
            _fail(path, error)
            return None


def _check_table(table: str) -> None:
    if not isinstance(table, str) or not _TABLE_NAME.fullmatch(table):
        raise ValueError(f"bad cache table name {table!r}: use lowercase letters, digits and _")


def _seal(table: str, key: str, value: bytes) -> bytes:
    """The digest that binds `value` to its table and key (a value moved to another key does not match)."""
    h = hashlib.sha256()
    for part in (table.encode(), key.encode("utf-8", "surrogatepass")):
        h.update(len(part).to_bytes(8, "big") + part)
    h.update(value)
    return h.digest()


def _unwrap(table: str, key: str, stored: bytes) -> bytes | None:
    """The value inside a stored row, or None when its header or digest does not match."""
    if len(stored) < _HEADER_LEN or not stored.startswith(_VALUE_MAGIC):
        return None
    value = stored[_HEADER_LEN:]
    if not hmac.compare_digest(stored[len(_VALUE_MAGIC):_HEADER_LEN], _seal(table, key, value)):
        return None
    return value


def _warn_bad_entry(table: str, key: str, why: str) -> None:
    global _warned_bad_entry
    if not _warned_bad_entry:
        _warned_bad_entry = True
        sys.stderr.write(f"tgc: warning: the cache entry {table}/{key[:KEY_PREFIX_LEN]} {why}; "
                         f"it was dropped and will be rebuilt\n")
        sys.stderr.flush()


def invalidate(table: str, key: str, why: str = "could not be used") -> None:
    """Delete one entry that turned out to be unusable (e.g. a binary that does not load) and warn once."""
    _check_table(table)
    _warn_bad_entry(table, key, why)
    _run("DELETE FROM cache WHERE tbl = ? AND key = ?", (table, key))


def _skipped(table: str) -> bool:
    return table in COMPILED_TABLES and not enabled()


# ------------------------------------------------------------------------------------------------- API


def get(table: str, key: str) -> bytes | None:
    """The bytes stored under `key` in `table`, or None (not stored, cache disabled, cache unusable, or an
    entry whose digest does not match its bytes: that one is deleted, with one warning)."""
    _check_table(table)
    rows = None if _skipped(table) else _run("SELECT value, used FROM cache WHERE tbl = ? AND key = ?",
                                             (table, key))
    value = None
    if rows:
        value = _unwrap(table, key, bytes(rows[0][0]))
        if value is None:
            invalidate(table, key, "does not match its checksum (changed or damaged on disk)")
        elif table in COMPILED_TABLES:
            _mark_in_use(table, key)
            now = time.time()
            if now - float(rows[0][1] or 0) >= TOUCH_S:
                _run("UPDATE cache SET used = ? WHERE tbl = ? AND key = ?", (now, table, key))
    with _lock:
        if value is not None:
            counters["hits"] += 1
            return value
        counters["misses"] += 1
        return None


def table_state(table: str) -> tuple[int, float]:
    """(how many entries `table` holds, the newest one's creation time): changes whenever an entry is stored
    or removed, so a key that includes it misses after any change to the table (the program cache keys on the
    `beam` table's state: a new BEAM winner may change a kernel). (0, 0.0) when the cache is unusable."""
    _check_table(table)
    rows = _run("SELECT COUNT(*), COALESCE(MAX(created), 0) FROM cache WHERE tbl = ?", (table,))
    if not rows:
        return 0, 0.0
    return int(rows[0][0]), float(rows[0][1])


def put(table: str, key: str, value: bytes, meta: str = "") -> None:
    """Store `value` under `key` in `table`, replacing what was there. `meta` is a short description for
    `tgc cache list`, e.g. kernel name and device. Does nothing when the cache is disabled or unusable."""
    _check_table(table)
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"cache values are bytes, got {type(value).__name__}")
    if _skipped(table):
        return
    now = time.time()
    rows = _run("INSERT OR REPLACE INTO cache (tbl, key, value, meta, created, used) VALUES (?, ?, ?, ?, ?, ?)",
                (table, key, _VALUE_MAGIC + _seal(table, key, bytes(value)) + bytes(value), meta, now, now))
    if rows is not None:
        with _lock:
            counters["puts"] += 1
        if table in COMPILED_TABLES:
            _mark_in_use(table, key)
            _evict(max_bytes())


def max_bytes() -> int:
    """`TGC_CACHE_MAX_BYTES`, else 4 GiB: the cap on the compiled tables' bytes. A bad value (the CLI refuses it
    first, `tgc.env.check_all`) gives one warning and the default: the cache never breaks a run."""
    text = os.environ.get("TGC_CACHE_MAX_BYTES", "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        value = int(text, 10)
    except ValueError:
        value = -1
    if value < 0:
        global _warned_cap
        if not _warned_cap:
            _warned_cap = True
            sys.stderr.write(f"tgc: warning: TGC_CACHE_MAX_BYTES={text!r} is not a number of bytes; the cache "
                             f"keeps the default cap ({DEFAULT_MAX_BYTES} bytes)\n")
        return DEFAULT_MAX_BYTES
    return value


def _mark_in_use(table: str, key: str) -> None:
    with _lock:
        _in_use.pop((table, key), None)
        _in_use[(table, key)] = None
        while len(_in_use) > _IN_USE_MAX:
            _in_use.pop(next(iter(_in_use)))


def _compiled_bytes() -> int | None:
    marks = ", ".join("?" * len(COMPILED_TABLES))
    rows = _run(f"SELECT COALESCE(SUM(length(value)), 0) FROM cache WHERE tbl IN ({marks})", COMPILED_TABLES)
    return None if not rows else int(rows[0][0])


def _used_bytes() -> int | None:
    """The bytes of the database's pages in use (its size less its free pages, the WAL's pages included): at
    least the compiled tables' bytes, since every value is stored whole in them. One look at the file's header,
    where `_compiled_bytes` reads every entry's length."""
    rows = _run("SELECT (p.page_count - f.freelist_count) * s.page_size "
                "FROM pragma_page_count() p, pragma_freelist_count() f, pragma_page_size() s")
    return None if not rows else int(rows[0][0])


def _evict(cap: int) -> int:
    """Remove the least recently used entries of the compiled tables, oldest use first, until their bytes are
    at most `cap`; entries in use in this process stay. Returns how many were removed. Where the whole
    database's pages in use are within the cap (`_used_bytes`), so are the compiled tables, and nothing is
    summed (a put into a database of n entries reads one header, not n lengths)."""
    used = _used_bytes()
    if used is not None and used <= cap:
        return 0
    total = _compiled_bytes()
    if total is None or total <= cap:
        return 0
    marks = ", ".join("?" * len(COMPILED_TABLES))
    rows = _run(f"SELECT tbl, key, length(value) FROM cache WHERE tbl IN ({marks}) ORDER BY used, created",
                COMPILED_TABLES) or []
    with _lock:
        keep = set(_in_use)
    removed = 0
    for tbl, key, size in rows:
        if total <= cap:
            break
        if (tbl, key) in keep:
            continue
        if _run("DELETE FROM cache WHERE tbl = ? AND key = ?", (tbl, key)) is None:
            break
        total -= int(size)
        removed += 1
    return removed


def _disk_size(path: Path) -> int:
    """Bytes used by the database and its WAL files."""
    total = 0
    for candidate in (path, *(Path(str(path) + suffix) for suffix in _SIDE_SUFFIXES)):
        try:
            total += candidate.stat().st_size
        except OSError:
            pass
    return total


def _absent() -> bool:
    """No database yet (and none open): the read-only views (`stats`, `entries`) answer empty without creating
    the directory and an empty database (`tgc cache list` on a new TGC_CACHE_DIR)."""
    try:
        path = db_path()
    except RuntimeError:
        return False
    with _lock:
        if path == _broken_path or _conn is not None and _conn_path == path and _conn_pid == os.getpid():
            return False
    if path.exists():
        return False
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    return ancestor.is_dir()  # (under a file: unusable, which opening it reports)


def stats() -> dict[str, Any]:
    """`path`, `size` (bytes on disk), `entries` ({table: count}, always with `compile` and `beam`), `count`
    (all entries), `compiled_bytes` (the compiled tables' values: what the cap counts), `max_bytes` (the cap),
    `available` (False when the database is unusable), `enabled` (see `enabled()`), and this process's
    `hits`, `misses` and `puts`."""
    absent = _absent()
    rows = [] if absent else _run("SELECT tbl, COUNT(*) FROM cache GROUP BY tbl ORDER BY tbl")
    counts = dict.fromkeys(TABLES, 0)
    counts.update({table: count for table, count in rows or []})
    try:
        path = db_path()
    except RuntimeError:
        path = Path(DB_NAME)
    with _lock:
        hits, misses, puts = counters["hits"], counters["misses"], counters["puts"]
    return {"path": str(path), "size": _disk_size(path), "entries": counts, "available": rows is not None,
            "enabled": enabled(), "hits": hits, "misses": misses, "puts": puts,
            "compiled_bytes": 0 if absent else _compiled_bytes() or 0, "max_bytes": max_bytes(),
            "count": sum(counts.values())}


def entries(table: str | None = None) -> list[dict[str, Any]]:
    """One dict per stored value, newest first: `table`, `key` (the first 16 hex digits), `meta`,
    `size` (bytes of the value) and `created` (Unix time). Empty when the cache is unusable."""
    query = f"SELECT tbl, key, meta, max(length(value) - {_HEADER_LEN}, 0), created FROM cache"
    params: tuple = ()
    if table is not None:
        _check_table(table)
        query, params = query + " WHERE tbl = ?", (table,)
    rows = [] if _absent() else _run(query + " ORDER BY created DESC, tbl, key", params) or []
    return [{"table": tbl, "key": key[:KEY_PREFIX_LEN], "meta": meta, "size": size, "created": created}
            for tbl, key, meta, size, created in rows]


def get_json(table: str, key: str, valid: Any = None) -> Any:
    """The JSON value stored under `key`, or None when it is missing, not JSON, or `valid(value)` is false:
    a damaged entry is a miss (the caller recomputes and overwrites it), never a crash."""
    raw = get(table, key)
    if raw is None:
        return None
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    try:
        return value if valid is None or valid(value) else None
    except Exception:
        return None


def _delete_database(path: Path) -> None:
    for candidate in (path, *(Path(str(path) + suffix) for suffix in _SIDE_SUFFIXES)):
        try:
            candidate.unlink()
        except FileNotFoundError:
            pass


class ClearError(Exception):
    """`clear(strict=True)` could not delete the entries (read-only or locked database)."""


def clear(table: str | None = None, strict: bool = False) -> int:
    """Remove the entries of `table` (every table when None) and return how many went.

    The user asked for this explicitly, so a corrupt database file is deleted and recreated (returning
    0: its entries cannot be counted). Other problems warn once and return 0; with `strict` (`tgc cache
    clear`) they raise `ClearError` instead: a read-only or locked database was not cleared.
    """
    global _broken_path

    def failed(path: Path, error: BaseException) -> int:
        if strict:
            _drop_connection()
            raise ClearError(f"could not clear the cache database {path}: {error}") from None
        _fail(path, error)
        return 0

    if table is not None:
        _check_table(table)
    with _lock:
        try:
            path = db_path()
        except RuntimeError as error:
            _warn_once(f"cannot find a cache directory ({error}); set TGC_CACHE_DIR")
            return 0
        _drop_connection()
        _broken_path = None  # try again: clearing may be what fixes it
        try:
            conn = _open(path)
        except (sqlite3.Error, OSError, ValueError) as error:
            if not _is_corrupt(error):
                return failed(path, error)
            try:
                _delete_database(path)
                _adopt(_open(path), path)
            except (sqlite3.Error, OSError) as second_error:
                return failed(path, second_error)
            return 0
        _adopt(conn, path)
        try:
            if table is None:
                cursor = conn.execute("DELETE FROM cache")
            else:
                cursor = conn.execute("DELETE FROM cache WHERE tbl = ?", (table,))
            return cursor.rowcount
        except (sqlite3.Error, OSError) as error:
            return failed(path, error)


# ---------------------------------------------------------------------------------------- process state


def _after_fork_in_child() -> None:
    """A fork may happen while another thread holds the lock or uses the connection: start afresh."""
    global _lock
    _lock = threading.RLock()
    _drop_connection()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _reset_for_tests() -> None:
    """Close the connection and forget the warning, the broken database and the counters."""
    global _broken_path, _warned, _warned_bad_entry, _warned_cap
    with _lock:
        _drop_connection()
        _in_use.clear()
        _broken_path = None
        _warned = _warned_bad_entry = _warned_cap = False
        for name in counters:
            counters[name] = 0
