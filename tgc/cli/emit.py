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
_STAGED = re.compile(rf"\.(?:{KERNEL_FILE.pattern}|{re.escape(MANIFEST)})\.[a-z0-9_]{{8}}\.tmp")


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


def _manifest(directory: str) -> dict[str, frozenset[str]]:
    """The files an earlier `compile -o` wrote into `directory` ({name: the sha256s it may have}), or {} where
    there is no manifest or it does not read as one (nothing is then known to be tgc's). Only names tgc writes
    (`KERNEL_FILE`) with sha256s count: another entry is dropped, whatever the file says. The manifest is read
    only where it is a regular file (not followed if a link, never a FIFO), up to `MANIFEST_MAX_BYTES`."""
    import json
    import stat

    try:
        fd = os.open(os.path.join(directory, MANIFEST), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return {}
            raw = f.read(MANIFEST_MAX_BYTES + 1)
        if len(raw) > MANIFEST_MAX_BYTES:
            return {}
        doc = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # (ValueError: not UTF-8, not JSON; RecursionError: nested)
        return {}
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        return {}
    out = {}
    for name, h in files.items():
        hashes = [h] if isinstance(h, str) else h if isinstance(h, list) else []
        good = frozenset(x for x in hashes if isinstance(x, str) and _SHA256.fullmatch(x))
        if isinstance(name, str) and KERNEL_FILE.fullmatch(name) and good:
            out[name] = good
    return out


def _manifest_writer(files: dict[str, frozenset[str]]) -> Any:
    import json

    doc = {"written_by": "tgc compile -o", "format": 2,
           "files": {n: sorted(h)[0] if len(h) == 1 else sorted(h) for n, h in sorted(files.items())}}
    return _bytes_writer((json.dumps(doc, indent=1) + "\n").encode())


def _digest(path: str) -> str | None:
    """The sha256 of `path` where it is a regular file (not a link) that can be read, else None."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            h = hashlib.sha256()
            while chunk := f.read(1 << 20):
                h.update(chunk)
        except OSError:
            return None
    return h.hexdigest()


def _set_aside(path: str, ours: frozenset[str]) -> str | None:
    """Before a new file is renamed over `path`: where something is there that is not a file tgc wrote (its
    sha256 is none of `ours`: the user's own, one they edited, a link, a directory), rename it to the first free
    `path.orig`, `path.orig.1`, ... (kept whole, never overwritten) and return that name; else None."""
    if not os.path.lexists(path) or _digest(path) in ours:
        return None
    backup, i = f"{path}.orig", 0
    while os.path.lexists(backup):
        i += 1
        backup = f"{path}.orig.{i}"
    os.rename(path, backup)
    return backup


class _Locked:
    """`flock` on `DIR/LOCK` (made if missing, never removed): one `compile -o` at a time reads the manifest,
    writes and cleans up in a directory. Where the file system has no locks, the compile goes on unlocked."""

    def __init__(self, directory: str):
        self.path, self.fd = os.path.join(directory, LOCK), -1

    def __enter__(self) -> None:
        import stat

        try:  # (O_NOFOLLOW, O_NONBLOCK: a link or a FIFO raced in after check_own_files is not opened or waited on)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
        except OSError as e:
            self.__exit__()
            raise TgcError(f"cannot write '{self.path}': {oserror_text(e)}", kind=write_error_kind(e)) from None
        try:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except (OSError, ImportError):  # (ENOLCK: no locks on this file system; no fcntl on this OS)
            pass

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
    its name, where what is there is set aside as NAME.orig unless tgc wrote it (`_set_aside`); then the files
    the earlier compile wrote (its manifest) that this one did not are removed, each only where its content is
    still what tgc wrote (one the user changed is kept, and reported; one that cannot be removed stays listed);
    last the manifest is written again, listing this compile's files and those left to remove. Only names tgc
    writes (`KERNEL_FILE`) are ever removed, whatever the manifest says."""
    from tgc.files import stage

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
                pending.append((stage(manifest, _manifest_writer(during), follow=False), MANIFEST))
                for name, data in datas.items():
                    target = os.path.join(directory, name)
                    pending.append((stage(target, _bytes_writer(data), follow=False), name))
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
        except OSError as e:
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
            os.replace(stage(manifest, _manifest_writer({n: frozenset(h) for n, h in left.items()})), manifest)
        except OSError as e:
            raise TgcError(f"cannot write '{manifest}': {e.strerror or e}", kind=write_error_kind(e)) from None
    return Written([os.path.join(directory, n) for n in datas], removed, kept, unremoved, set_aside)


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
