"""What `tgc compile --emit WHAT` prints or writes for each kernel. rich is imported where it prints (the CLI's
start-up imports neither numpy nor rich: see tgc/cli/main.py)."""

from __future__ import annotations

import errno
import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tgc.cli.outputs import check_dir_writable, name_too_long, oserror_text, write_error_kind, write_files
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


def file_names(emitted: Sequence[Emitted]) -> list[str]:
    """One file name per kernel, `NN_NAME.EXT`: NN is the launch order, so `ls` lists them as they run."""
    width = max(2, len(str(len(emitted) - 1)))
    return [f"{i:0{width}d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', e.name) or 'kernel'}{e.ext}"
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


@dataclass
class Written:
    """What `write_dir` did: the files it wrote, the files of an earlier compile it removed, and the files of
    an earlier compile it kept because they changed since (the user's now)."""

    paths: list[str]
    removed: list[str]
    kept: list[str]


def _manifest(directory: str) -> dict[str, str]:
    """The files an earlier `compile -o` wrote into `directory` ({name: sha256}), or {} where there is no
    manifest or it does not read as one (nothing is then known to be tgc's)."""
    import json

    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        return {}
    return {n: h for n, h in files.items() if isinstance(n, str) and isinstance(h, str) and n == os.path.basename(n)
            and n not in ("", ".", "..", MANIFEST)}


def _manifest_writer(files: dict[str, str]) -> Any:
    import json

    doc = {"written_by": "tgc compile -o", "format": 1, "files": dict(sorted(files.items()))}
    return _bytes_writer((json.dumps(doc, indent=1) + "\n").encode())


def _unchanged(path: str, digest: str) -> bool:
    """Whether `path` is a regular file (not a link) whose content still has the sha256 tgc wrote."""
    import stat

    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest() == digest
    except OSError:
        return False


def write_dir(directory: str, emitted: Sequence[Emitted]) -> Written:
    """Write one file per kernel into `directory` (created if needed), atomically (`check_outdir` checked it
    before the work), so that the directory holds exactly this compile's files besides the user's own: every
    file is staged and renamed over its name, with the manifest (`MANIFEST`: name and sha256 of each file
    written); then the files an earlier compile wrote there (its manifest) that this one did not are removed,
    each only where its content is still what tgc wrote (one the user changed is kept, and reported). A file
    tgc did not write is never removed (one of a kernel's name is replaced, as before)."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise _not_a_directory(directory) from None
        raise TgcError(f"-o {directory}: cannot create the directory: {oserror_text(e)}",
                       kind=write_error_kind(e)) from None
    check_dir(directory)
    earlier = _manifest(directory)
    files, digests = [], {}
    for e, name in zip(emitted, file_names(emitted)):
        if isinstance(e.body, bytes):
            data = e.body
        else:  # JSON has no comments: its file goes without the header line
            data = ("" if e.lexer == "json" else e.header + "\n").encode() + (e.body.rstrip("\n") + "\n").encode()
        files.append((os.path.join(directory, name), _bytes_writer(data)))
        digests[name] = hashlib.sha256(data).hexdigest()
    stale = {n: h for n, h in earlier.items() if n not in digests}
    manifest = os.path.join(directory, MANIFEST)
    # (the manifest lists the stale files until they are gone: a compile cut short here removes them next time)
    write_files([*files, (manifest, _manifest_writer({**stale, **digests}))])
    removed, kept = [], []
    for name, digest in sorted(stale.items()):
        path = os.path.join(directory, name)
        if not _unchanged(path, digest):
            if os.path.lexists(path):
                kept.append(path)
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            kept.append(path)
    if stale:
        write_files([(manifest, _manifest_writer(digests))])
    return Written([p for p, _ in files], removed, kept)


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
