"""What `tgc compile --emit WHAT` prints or writes for each kernel. rich is imported where it prints (the CLI's
start-up imports neither numpy nor rich: see tgc/cli/main.py)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tgc.cli.outputs import _fsync_dir, check_dir_writable, name_too_long, oserror_text, write_error_kind
from tgc.errors import TgcError
from tgc.files import staged_pattern
from tgc.ir.uop import format_uops

# device kind -> (source language for highlighting, file extension of its source)
SOURCE_KIND = {"CPU": ("llvm", ".ll"), "OPENCL": ("c", ".cl"), "CUDA": ("cuda", ".cu"), "METAL": ("cpp", ".metal"),
               "PYTHON": ("json", ".json")}


@dataclass
class Emitted:
    """One kernel's text (or bytes) for the chosen `--emit`."""

    name: str
    header: str
    body: str | bytes
    lexer: str
    ext: str


def source_kind(device_kind: str, src: str) -> tuple[str, str]:
    """(lexer, extension) of a kernel source; sniffed for devices not in the table (REMOTE, plugins)."""
    if device_kind in SOURCE_KIND:
        return SOURCE_KIND[device_kind]
    if re.search(r"^\s*define\s", src, re.M) and "@" in src:
        return "llvm", ".ll"
    if "__global__" in src:
        return "cuda", ".cu"
    if "__kernel" in src:
        return "c", ".cl"
    if "metal_stdlib" in src:
        return "cpp", ".metal"
    if src.lstrip().startswith("{"):
        return "json", ".json"
    return "text", ".txt"


def comment(lexer: str) -> str:
    return {"llvm": ";", "text": "#", "gas": "#"}.get(lexer, "//")


def header(k: Any, filename: str, lexer: str) -> str:
    """`// kernel r_4_8 (softmax.tg:3)`: the comment line above each kernel."""
    line = getattr(k, "line", None)
    where = f" ({filename}:{line})" if line else f" ({filename})"
    return f"{comment(lexer)} kernel {getattr(k, 'name', '') or '?'}{where}"


def emit_kernels(kernels: Sequence[Any], what: str, device: str, device_kind: str, filename: str) -> list[Emitted]:
    """The `--emit` text of every kernel; errors for `ir` on a non-LLVM device and `asm`/`bin` without a binary."""
    out = []
    for k in kernels:
        lexer, ext = source_kind(device_kind, k.src)
        if what == "src":
            body: str | bytes = k.src
        elif what == "ir":
            if lexer != "llvm":
                raise TgcError(f"--emit ir: {device} does not use LLVM IR", hint="use --emit src for its source, "
                               "or -d CPU for LLVM IR")
            try:
                body = k.device.compiler.optimized_ir(k.src)
            except NotImplementedError:
                raise TgcError(f"--emit ir: the compiler of {device} cannot show its optimized IR",
                               hint="use --emit src for the IR tgc wrote", kind="runtime") from None
        elif what == "uops":
            lexer, ext = "text", ".txt"
            body = format_uops(k.uops)
        elif what in ("asm", "bin"):
            if k.binary is None:
                raise TgcError(f"--emit {what}: could not compile for {device}: {k.compile_error or 'no compiler'}",
                               kind="runtime")
            if what == "bin":
                lexer, ext, body = "text", ".bin", k.binary
            else:
                try:
                    body = k.asm()
                except NotImplementedError:
                    raise TgcError(f"--emit asm: the compiler of {device} cannot disassemble", kind="runtime") from None
                lexer, ext = ("text", ".ptx") if device_kind == "CUDA" else ("gas", ".s")
        else:
            raise TgcError(f"unknown --emit '{what}'")
        out.append(Emitted(k.name, header(k, filename, lexer), body, lexer, ext))
    return out


def emit_schedule(items: Sequence[Any], filename: str) -> list[Emitted]:
    """`--emit schedule`: each schedule item's kernel AST, before optimization and lowering."""
    return [Emitted(getattr(it, "name", "") or f"kernel{i}", header(it, filename, "text"), str(it.ast), "text", ".txt")
            for i, it in enumerate(items)]


def bin_summary(e: Emitted) -> str:
    data = e.body if isinstance(e.body, bytes) else e.body.encode()
    return f"{e.name}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}"


# the characters a kernel's name keeps in its file name (any other becomes '_'), and every extension a kernel's
# file gets (SOURCE_KIND's, source_kind's sniffed ones, --emit uops/bin/asm's): `KERNEL_FILE` is what `file_names`
# makes, the only names a later compile removes from its directory
_NAME_CHARS = "A-Za-z0-9_.-"
EXTENSIONS = (*sorted({ext for _, ext in SOURCE_KIND.values()}), ".txt", ".bin", ".s", ".ptx")
KERNEL_FILE = re.compile(rf"[0-9]{{2,}}_[{_NAME_CHARS}]+(?:{'|'.join(re.escape(x) for x in EXTENSIONS)})")


def file_names(emitted: Sequence[Emitted]) -> list[str]:
    """One file name per kernel, `NN_NAME.EXT`: NN is the launch order, so `ls` lists them as they run. Every
    name matches `KERNEL_FILE`."""
    width = max(2, len(str(len(emitted) - 1)))
    return [f"{i:0{width}d}_{re.sub(f'[^{_NAME_CHARS}]', '_', e.name) or 'kernel'}{e.ext}"
            for i, e in enumerate(emitted)]


def _bytes_writer(data: bytes) -> Any:
    return lambda f: f.write(data)


def check_dir(directory: str) -> None:
    """A TgcError unless a file can be made in the existing `directory` (`compile -o DIR`)."""
    check_dir_writable(directory, f"-o {directory}: cannot write into the directory: permission denied",
                       lambda e: f"-o {directory}: cannot write into the directory: {oserror_text(e)}")


def _not_a_directory(directory: str) -> TgcError:
    return TgcError(f"-o {directory}: it is a file, not a directory",
                    hint="compile -o names a directory for one file per kernel")


def check_outdir(directory: str) -> None:
    """Before the work (`compile -o DIR`): a TgcError (exit 2, nothing made) unless `directory` is a directory a
    file can be made in (`check_dir`), or one `write_dir` can create: below its nearest existing ancestor (a
    directory, writable), each missing name within that file system's NAME_MAX and the path within its PATH_MAX,
    as `check_writable` checks a file's name (os.makedirs met them only after the compile, and left the parents
    it had made)."""
    missing: list[str] = []
    cur = directory
    while True:
        try:
            os.stat(cur)
            break
        except OSError as e:  # (a name too long, or a file on the way, is reported below, where it is known)
            if e.errno not in (errno.ENOENT, errno.ENAMETOOLONG, errno.ENOTDIR):
                raise TgcError(f"-o {directory}: cannot create the directory: '{cur}' cannot be reached "
                               f"({oserror_text(e)})") from None
            if e.errno == errno.ENOENT and os.path.islink(cur):  # (makedirs fails on it after the compile)
                raise TgcError(f"-o {directory}: cannot create the directory: '{cur}' is a symbolic link to "
                               f"'{os.readlink(cur)}', which does not exist") from None
        head, tail = os.path.split(cur)
        if not tail:  # ('a//', or a root that cannot be reached)
            if head == cur:
                raise TgcError(f"-o {directory}: cannot create the directory: '{cur}' cannot be reached")
            cur = head
            continue
        missing.append(tail)
        cur = head or os.curdir
    if not missing:
        if not os.path.isdir(directory):
            raise _not_a_directory(directory)
        check_dir(directory)
        check_own_files(directory)
        return
    if not os.path.isdir(cur):
        raise TgcError(f"-o {directory}: cannot create the directory: '{cur}' is not a directory")
    for name in reversed(missing):
        long = name_too_long(name, cur)
        if long is not None:
            what = "" if name == missing[0] else f"'{name[:40]}{'...' if len(name) > 40 else ''}': "
            raise TgcError(f"-o {directory}: cannot create the directory: file name too long ({what}{long[0]} "
                           f"bytes; at most {long[1]} here)", hint="use a shorter directory name")
    try:
        path_max = os.pathconf(cur, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        path_max = 4096
    try:
        full = len(os.fsencode(os.path.abspath(directory)))
    except OSError:  # (os.getcwd: the working directory was removed; the CLI refuses that at its start)
        raise TgcError(f"-o {directory}: cannot create the directory: the working directory cannot be "
                       "reached") from None
    if full >= path_max:
        raise TgcError(f"-o {directory}: cannot create the directory: the path is too long "
                       f"({full} bytes; at most {path_max - 1} here)", hint="use a shorter path")
    check_dir_writable(cur, f"-o {directory}: cannot create the directory: '{cur}': permission denied",
                       lambda e: f"-o {directory}: cannot create the directory in '{cur}': {oserror_text(e)}")


MANIFEST = ".tgc-compile.json"  # in a `compile -o DIR`: the files that compile wrote there, with their sha256
LOCK = ".tgc-compile.lock"  # in a `compile -o DIR`: held (flock) by the compile writing there; never removed
MANIFEST_MAX_BYTES = 16 << 20  # a manifest larger than this is no manifest (read no further)
_SHA256 = re.compile(r"[0-9a-f]{64}")
# a file `tgc.files.stage` made for one of them (`.NAME.XXXXXXXX.tmp`): found while the lock is held, it was left
# by a compile killed (SIGKILL, SIGTERM) between staging and renaming, and is removed
# (a name over STAGE_NAME_BYTES is cut: `staged_pattern`)
_STAGED = staged_pattern(rf"{KERNEL_FILE.pattern}|{re.escape(MANIFEST)}", f"[0-9]{{2,}}_[{_NAME_CHARS}]*")


def check_own_files(directory: str) -> None:
    """A TgcError (exit 2: an output that cannot be written) where a name tgc keeps in a `compile -o` directory
    (`MANIFEST`, `LOCK`) is taken by something it cannot use: a directory, a FIFO, a device, a socket, or (for
    the lock, which is opened) a symbolic link. A manifest that is a symbolic link is replaced by the new one
    (its target untouched); none of them is ever opened in place."""
    import stat

    for name, what in ((MANIFEST, "its list of the files it wrote there"), (LOCK, "its lock")):
        path = os.path.join(directory, name)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as e:
            raise TgcError(f"-o {directory}: cannot write '{path}': {oserror_text(e)}",
                           kind=write_error_kind(e)) from None
        if stat.S_ISREG(mode) and name == LOCK:  # (opened for writing, else for reading: `_open_lock`)
            try:
                os.close(_open_lock(path))
            except OSError as e:
                raise TgcError(f"-o {directory}: cannot use '{path}', {what}: {oserror_text(e)}",
                               kind=write_error_kind(e), hint="make it readable, or remove it") from None
            continue
        if stat.S_ISREG(mode) or (stat.S_ISLNK(mode) and name == MANIFEST):
            continue
        kind = ("a directory" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode)
                else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file")
        raise TgcError(f"-o {directory}: cannot write '{path}': it is {kind}, where tgc keeps {what}",
                       hint="remove it, or compile into another directory")


@dataclass
class Written:
    """What `write_dir` did: the files it wrote; the files of an earlier compile it removed; the files of an
    earlier compile it kept because they changed since (the user's now); (file, reason) of the earlier
    compile's files it could not remove (listed again, for a later compile to retry); (file, where it went) of
    the files it set aside, instead of overwriting, because tgc had not written them or they changed since."""

    paths: list[str]
    removed: list[str]
    kept: list[str]
    unremoved: list[tuple[str, str]]
    set_aside: list[tuple[str, str]]
    unsigned: bool = False  # no key could be kept (`_key`): the manifest is not trusted by a later compile


KEY_FILE = "compile-o.key"  # in tgc's cache directory: the per-user key that signs every manifest (HMAC-SHA256)


def key_path() -> str | None:
    """Where the user's key for signing manifests lives (`_key`), or None where no path can be made."""
    from tgc.cache import cache_dir

    try:
        return os.path.join(cache_dir(), KEY_FILE)
    except (RuntimeError, KeyError, OSError):  # (Path.home(): no home directory)
        return None


def _key(create: bool) -> bytes | None:
    """The user's key for signing manifests (`KEY_FILE` in `tgc.cache.cache_dir()`: 32 random bytes as hex, a
    regular file of this user's, mode 0600), made where missing and `create`; None where there is none or it
    cannot be read or made (a manifest is then no manifest: tgc removes nothing and sets aside every file at a
    kernel's name)."""
    import secrets
    import stat

    path = key_path()
    if path is None:
        return None
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                return None
            try:
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except FileExistsError:  # (another compile made it just now: read that one)
                continue
            except OSError:
                return None
            key = secrets.token_hex(32).encode()
            try:
                os.write(fd, key)
                os.fsync(fd)
            except OSError:
                return None
            finally:
                os.close(fd)
            return key
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            try:
                st = os.fstat(f.fileno())
                key = f.read(65)
            except OSError:
                return None
        good = stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077
        return key if good and len(key) == 64 and all(c in b"0123456789abcdef" for c in key) else None
    return None


def _mac(key: bytes, directory: str, files: Any) -> str:
    """HMAC-SHA256 of a manifest's `files` (as JSON, canonical) and the resolved path of its directory."""
    import hmac
    import json

    text = json.dumps({"directory": os.path.realpath(directory), "files": files}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def _manifest(directory: str) -> dict[str, frozenset[str]]:
    """The files an earlier `compile -o` wrote into `directory` ({name: the sha256s it may have}), or {} where
    there is no manifest or it does not read as one (nothing is then known to be tgc's). A manifest counts only
    where its `hmac` is the one this user's key (`_key`) gives its files and the directory's resolved path: one
    tgc did not write (shipped in a tarball, crafted, another user's, copied from another directory) is no
    manifest, whatever it lists. Only names tgc writes (`KERNEL_FILE`) with sha256s count: another entry is
    dropped. The manifest is read only where it is a regular file (not followed if a link, never a FIFO), up to
    `MANIFEST_MAX_BYTES`."""
    import hmac
    import json

    f = _open_regular(os.path.join(directory, MANIFEST))
    if f is None:
        return {}
    try:
        with f:
            raw = f.read(MANIFEST_MAX_BYTES + 1)
        if len(raw) > MANIFEST_MAX_BYTES:
            return {}
        doc = json.loads(raw.decode("utf-8"))
        files = doc.get("files") if isinstance(doc, dict) else None
        mac = doc.get("hmac") if isinstance(doc, dict) else None
        if not isinstance(files, dict) or not isinstance(mac, str):
            return {}
        key = _key(create=False)
        if key is None or not hmac.compare_digest(_mac(key, directory, files), mac):
            return {}
    except (OSError, ValueError, RecursionError):  # (ValueError: not UTF-8, not JSON; RecursionError: nested)
        return {}
    out = {}
    for name, h in files.items():
        hashes = [h] if isinstance(h, str) else h if isinstance(h, list) else []
        good = frozenset(x for x in hashes if isinstance(x, str) and _SHA256.fullmatch(x))
        if isinstance(name, str) and KERNEL_FILE.fullmatch(name) and good:
            out[name] = good
    return out


def _manifest_writer(directory: str, files: dict[str, frozenset[str]], key: bytes | None) -> Any:
    """The manifest, signed with `key` (`_mac`); without a key it is written unsigned (and so not trusted)."""
    import json

    listed = {n: sorted(h)[0] if len(h) == 1 else sorted(h) for n, h in sorted(files.items())}
    doc: dict[str, Any] = {"written_by": "tgc compile -o", "format": 3, "files": listed}
    if key is not None:
        doc["hmac"] = _mac(key, directory, listed)
    return _bytes_writer((json.dumps(doc, indent=1) + "\n").encode())


def _open_regular(path: str) -> Any:
    """`path` opened for reading (binary) where it is a regular file: not followed if a link, a FIFO not waited
    on (O_NOFOLLOW, O_NONBLOCK); else None."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    f = os.fdopen(fd, "rb")
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return f
    except OSError:
        pass
    f.close()
    return None


def _digest(path: str) -> str | None:
    """The sha256 of `path` where it is a regular file (not a link) that can be read, else None."""
    f = _open_regular(path)
    if f is None:
        return None
    with f:
        try:
            h = hashlib.sha256()
            while chunk := f.read(1 << 20):
                h.update(chunk)
        except OSError:
            return None
    return h.hexdigest()


def backup_name(path: str, i: int) -> str:
    """The `i`th name `_set_aside` tries for what is at `path`: `path.orig`, `path.orig.1`, ...; where that is
    longer than the file system's NAME_MAX, the file name is cut (by bytes) to fit, and a `~` marks the cut."""
    from tgc.cli.outputs import _name_max

    directory, base = os.path.split(path)
    suffix = ".orig" if i == 0 else f".orig.{i}"
    raw, limit = os.fsencode(base), _name_max(directory or os.curdir)
    if len(raw) + len(suffix) <= limit:
        return path + suffix
    stem = raw[:max(1, limit - len(suffix) - 1)].decode(errors="ignore")
    return os.path.join(directory, f"{stem}~{suffix}")


def _set_aside(path: str, ours: frozenset[str]) -> str | None:
    """Before a new file is renamed over `path`: where something is there that is not a file tgc wrote (its
    sha256 is none of `ours`: the user's own, one they edited, a link, a FIFO), rename it to the first free
    `backup_name` (`path.orig`, `path.orig.1`, ..., cut to fit NAME_MAX; kept whole, never overwritten) and
    return that name; else None. (A directory there is refused before: `check_targets`.)"""
    if not os.path.lexists(path) or _digest(path) in ours:
        return None
    i = 0
    while os.path.lexists(backup := backup_name(path, i)):
        i += 1
    os.rename(path, backup)
    return backup


def check_targets(directory: str, names: Sequence[str]) -> None:
    """A TgcError (exit 2), before anything in `directory` is touched, where a kernel's file name is taken by a
    directory: it is neither overwritten nor moved aside (a directory of the user's is left as it is)."""
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            raise TgcError(f"-o {directory}: cannot write '{path}': it is a directory",
                           hint="move it away, or compile into another directory")


def _open_lock(path: str) -> int:
    """An fd of the lock file `path` (made if missing, 0o666 less the umask, so that another user who may write
    into the directory may lock it too): opened for reading and writing, else, where that is denied (another
    user's lock, one at 0444), for reading: flock works on either. An OSError where neither can be, or it is
    not a regular file (O_NOFOLLOW, O_NONBLOCK: a link or a FIFO is not opened or waited on)."""
    import stat

    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o666)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        fd = os.open(path, os.O_RDONLY | flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
    except OSError:
        os.close(fd)
        raise
    return fd


WAIT_NOTE_S = 1.0  # a compile that has waited this long for another's lock says so (once)


class _Locked:
    """`flock` on `DIR/LOCK` (made if missing, never removed): one `compile -o` at a time reads the manifest,
    writes and cleans up in a directory; one that waits over `WAIT_NOTE_S` says so on stderr. Where the file
    system has no locks, the compile goes on unlocked."""

    def __init__(self, directory: str):
        self.directory, self.path, self.fd = directory, os.path.join(directory, LOCK), -1

    def __enter__(self) -> None:
        import time

        try:
            self.fd = _open_lock(self.path)
        except OSError as e:
            raise TgcError(f"cannot use '{self.path}': {oserror_text(e)}", kind=write_error_kind(e)) from None
        try:
            import fcntl

            deadline = time.monotonic() + WAIT_NOTE_S
            while True:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.05)
            import sys

            sys.stderr.write(f"waiting for another compile into {self.directory} (it holds {self.path})\n")
            sys.stderr.flush()
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except (OSError, ImportError):  # (ENOLCK: no locks on this file system; no fcntl on this OS)
            pass
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # (releases the lock)
            self.fd = -1


def write_dir(directory: str, emitted: Sequence[Emitted]) -> Written:
    """Write one file per kernel into `directory` (created if needed; `check_outdir` checked it before the work),
    so that it holds exactly this compile's files besides the user's own, holding `LOCK` while it reads the
    manifest, writes and cleans up. Every file is staged first (nothing touched on a failure there); then the
    manifest (`MANIFEST`) is renamed in, listing each name with the sha256 it had and the one it gets (a compile
    cut short among the renames leaves files the next one still knows as tgc's); then each file is renamed over
    its name, with the default mode (the umask's, never the mode of what was there), where what is there is set
    aside as NAME.orig unless tgc wrote it (`_set_aside`; each said on stderr at once where the compile is cut
    short after it, Ctrl-C included; a directory at a kernel's name is refused before anything is touched,
    `check_targets`); then the files
    the earlier compile wrote (its manifest) that this one did not are removed, each only where its content is
    still what tgc wrote (one the user changed is kept, and reported; one that cannot be removed stays listed);
    last the manifest is written again, listing this compile's files and those left to remove. Only names tgc
    writes (`KERNEL_FILE`) are ever removed, whatever the manifest says."""
    from tgc.files import default_mode, stage

    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise _not_a_directory(directory) from None
        raise TgcError(f"-o {directory}: cannot create the directory: {oserror_text(e)}",
                       kind=write_error_kind(e)) from None
    check_dir(directory)
    check_own_files(directory)
    manifest = os.path.join(directory, MANIFEST)
    datas, digests = {}, {}
    for e, name in zip(emitted, file_names(emitted)):
        if isinstance(e.body, bytes):
            data = e.body
        else:  # JSON has no comments: its file goes without the header line
            data = ("" if e.lexer == "json" else e.header + "\n").encode() + (e.body.rstrip("\n") + "\n").encode()
        datas[name], digests[name] = data, hashlib.sha256(data).hexdigest()
    check_targets(directory, list(datas))
    key, new_mode = _key(create=True), default_mode()
    with _Locked(directory):
        earlier = _manifest(directory)
        with contextlib.suppress(OSError):
            for left in os.listdir(directory):
                if _STAGED.fullmatch(left):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(directory, left))
        during = {**earlier, **{n: earlier.get(n, frozenset()) | {d} for n, d in digests.items()}}
        pending: list[tuple[str, str]] = []  # (staged file, its name), the manifest first: not yet renamed in
        set_aside: list[tuple[str, str]] = []
        target = manifest
        try:
            try:
                pending.append((stage(manifest, _manifest_writer(directory, during, key), follow=False,
                                      mode=new_mode), MANIFEST))
                for name, data in datas.items():
                    target = os.path.join(directory, name)
                    pending.append((stage(target, _bytes_writer(data), follow=False, mode=new_mode), name))
                while pending:
                    tmp, name = pending[0]
                    target = os.path.join(directory, name)
                    if name != MANIFEST:
                        backup = _set_aside(target, during[name])
                        if backup is not None:
                            set_aside.append((target, backup))
                    os.replace(tmp, target)  # (a link there is replaced, never followed)
                    pending.pop(0)
            finally:  # (any failure, Ctrl-C included: no staged file is left behind)
                for tmp, _ in pending:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
        except BaseException as e:  # (cut short: the files already set aside are said here, the caller never is)
            import sys

            for path, backup in set_aside:
                sys.stderr.write(f"note: {set_aside_note(path, backup)}\n")
            if not isinstance(e, OSError):
                raise
            raise TgcError(f"cannot write '{target}': {e.strerror or e}", kind=write_error_kind(e)) from None
        _fsync_dir(directory)
        removed, kept, unremoved = [], [], []
        left = {n: {d} for n, d in digests.items()}
        for name, hashes in sorted(earlier.items()):
            if name in digests:
                continue
            path = os.path.join(directory, name)
            if not os.path.lexists(path):
                continue
            if _digest(path) not in hashes:
                kept.append(path)
                continue
            try:
                os.unlink(path)
                removed.append(path)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    unremoved.append((path, oserror_text(e)))
                    left[name] = set(hashes)
        try:
            final = _manifest_writer(directory, {n: frozenset(h) for n, h in left.items()}, key)
            os.replace(stage(manifest, final, follow=False, mode=new_mode), manifest)
        except OSError as e:
            raise TgcError(f"cannot write '{manifest}': {e.strerror or e}", kind=write_error_kind(e)) from None
    return Written([os.path.join(directory, n) for n in datas], removed, kept, unremoved, set_aside, key is None)


def set_aside_note(path: str, backup: str) -> str:
    """What the CLI says of a file `write_dir` set aside (after "note: ")."""
    return (f"moved {path} to {backup}: tgc had not written it, or it has changed since; this compile's file "
            "took its name")


def show(emitted: Sequence[Emitted], color: bool) -> None:
    """Print every kernel to stdout, highlighted with rich when `color`."""
    import sys

    if not color:
        for i, e in enumerate(emitted):
            text = bin_summary(e) if isinstance(e.body, bytes) else f"{e.header}\n{e.body.rstrip()}"
            sys.stdout.write(("\n" if i else "") + text + "\n")
        return
    from rich.console import Console
    from rich.syntax import Syntax

    console = Console()
    for i, e in enumerate(emitted):
        if i:
            console.print()
        if isinstance(e.body, bytes):
            console.print(bin_summary(e), highlight=False)
        else:
            console.print(Syntax(f"{e.header}\n{e.body.rstrip()}", e.lexer, theme="ansi_dark",
                                 background_color="default", word_wrap=False))
