"""Output files and the output table of `tgc run`.

Files are written atomically: each goes to a temporary file in the target's directory, is flushed and
fsynced, and only then renamed over the target. All files of one command are staged before any is
renamed, so a failure leaves existing files untouched and no half-written file behind. A target that exists and
is a FIFO or a device (`-o out0=/dev/stdout`, a named pipe) is written in place, after the regular files are
staged: renaming over it would replace the pipe or device node with a regular file.

numpy, rich and `tgc.cli.inputs` (which imports numpy) are imported inside the functions that need them: the
CLI's start-up imports this module for option parsing and neither numpy nor rich (see tgc/cli/main.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from tgc.errors import TgcError
from tgc.files import Writer, stage  # (the staging rule every written file follows: a package's too)


@dataclass(frozen=True)
class OutSpec:
    """One `-o`: a whole-program `.npz` (name None) or one output to a `.npy`."""

    path: str
    name: str | None = None


def parse_out(text: str) -> OutSpec:
    """`out.npz`, `NAME=out.npy` or `out.npy` (the latter for a program with one output)."""
    name, sep, path = text.partition("=")
    if sep and (name.isidentifier() or (name and path.endswith(".npy"))):  # (an ONNX output: `out/prob=p.npy`)
        if not path or path.endswith(".npz"):
            raise ValueError(f"'{text}': NAME=PATH writes one output to a .npy file")
        return OutSpec(path, name)
    if text.endswith(".npz") or text.endswith(".npy"):
        return OutSpec(text)
    raise ValueError(f"'{text}' is neither PATH.npz nor NAME=PATH.npy")


def input_files(pairs: Sequence[tuple[str, str]], npz: str | None) -> list[tuple[str, str]]:
    """(flag, path) of every input file named on the command line: `-i NAME=PATH` and `--inputs PATH`."""
    return [(f"-i {name}={path}", path) for name, path in pairs] + ([(f"--inputs {npz}", npz)] if npz else [])


def _same_file(a: str, b: str) -> bool:
    """Whether paths `a` and `b` name one file (by inode where both exist, else by their resolved paths)."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return os.path.realpath(a) == os.path.realpath(b)
    except OSError:
        return False


def not_over_user_files(flag: str, path: str, protected: Sequence[tuple[str, str]]) -> None:
    """A user error (exit 2) when `path`, which `flag` is about to write, is one of the user's files the command
    reads or writes otherwise: `protected` is (what it is, its path), e.g. ("the program m.tg", "m.tg")."""
    for what, other in protected:
        if _same_file(path, other):
            raise TgcError(f"{flag} {path} would overwrite {what}", hint=f"give {flag} a file of its own")


def resolve_outs(specs: Sequence[OutSpec], output_names: Sequence[str],
                 inputs: Sequence[tuple[str, str]] = ()) -> list[OutSpec]:
    """Check `-o` targets against the program's outputs and the file system before anything runs. `inputs`
    ((flag, path) of the input files, `input_files`): an `-o` onto one of them is a user error, so an input is
    never replaced by the outputs computed from it."""
    from tgc.cli.inputs import did_you_mean

    out = []
    seen: dict[str, str] = {}
    for spec in specs:
        real = os.path.realpath(spec.path)
        if real in seen:
            raise TgcError(f"-o {spec.path}: the same file as -o {seen[real]}",
                           hint="give each -o its own file")
        seen[real] = spec.path
        for flag, path in inputs:
            if _same_file(spec.path, path):
                raise TgcError(f"-o {spec.path} would overwrite an input file ({flag})",
                               hint="write outputs to another file")
        if spec.name is None and spec.path.endswith(".npy"):
            if len(output_names) != 1:
                raise TgcError(f"-o {spec.path}: the program has {len(output_names)} outputs "
                               f"({', '.join(output_names)})", hint="write one with -o NAME=PATH.npy, "
                               "or all of them with -o PATH.npz")
            spec = OutSpec(spec.path, output_names[0])
        if spec.name is not None and spec.name not in output_names:
            raise TgcError(f"unknown output '{spec.name}' in -o {spec.name}={spec.path}",
                           hint=did_you_mean(spec.name, output_names, "output"))
        check_writable(spec.path)
        out.append(spec)
    return out


def nonempty_path(ctx: Any, param: Any, value: str | None) -> str | None:
    """A click callback: a path option given as "" (`--package "$OUT"` with OUT unset) is a usage error (exit 2),
    not the option left out (the command did its work and wrote nothing where the user looked)."""
    if value is not None and not value.strip():
        import click

        raise click.BadParameter("the path is empty (an unset variable?)", ctx, param)
    return value


def check_writable(path: str) -> None:
    """A user error (exit 2) when `path` cannot be written: missing directory, a directory, no permission."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise TgcError(f"cannot write '{path}': it is a directory")
    if path.endswith(("/", os.sep)):  # (abspath drops the slash: the probe below would try the wrong directory)
        raise TgcError(f"cannot write '{path}': a file name cannot end with '/'")
    if is_stream(path):  # written in place (write_files): the file itself must be writable, not its directory
        if not os.access(path, os.W_OK):
            raise TgcError(f"cannot write '{path}': permission denied")
        return
    if not os.path.isdir(parent):
        where = os.path.dirname(path) or parent
        try:
            os.stat(parent)
        except FileNotFoundError:
            raise TgcError(f"cannot write '{path}': directory '{where}' does not exist") from None
        except OSError as e:  # (a path over PATH_MAX, a symlink loop: isdir says False, as for a missing one)
            raise TgcError(f"cannot write '{path}': directory '{where}' cannot be reached ({oserror_text(e)})",
                           hint="use a shorter path" if e.errno == errno.ENAMETOOLONG else None) from None
        raise TgcError(f"cannot write '{path}': '{where}' is not a directory")  # (a file: -o x.npy/out.npz)
    long = name_too_long(os.path.basename(path), parent)
    if long is not None:  # (the probe below makes a name of its own: it would not see this)
        raise TgcError(f"cannot write '{path}': file name too long ({long[0]} bytes; at most {long[1]} here)",
                       hint="use a shorter file name")
    check_dir_writable(parent, f"cannot write '{path}': permission denied",
                       lambda e: f"cannot write '{path}': no file can be made in '{parent}' ({oserror_text(e)})")


def name_too_long(name: str, directory: str) -> tuple[int, int] | None:
    """(its length in bytes, the limit) where the file name `name` is longer than `directory`'s file system
    allows (`_name_max`), else None."""
    n, limit = len(os.fsencode(name)), _name_max(directory)
    return (n, limit) if n > limit else None


def check_dir_writable(directory: str, denied: str, cannot: Callable[[OSError], str]) -> None:
    """A TgcError unless a file can be made in the existing `directory`: `denied` (a user error) where os.access
    says no, else `cannot(e)` where making one fails (`file_creation_error`: os.access answers yes to root where
    none can be made, /sys, /proc), of that error's kind (a full disk is the run's failure, exit 1, as when the
    write itself meets it)."""
    if not os.access(directory, os.W_OK):
        raise TgcError(denied)
    e = file_creation_error(directory)
    if e is not None:
        raise TgcError(cannot(e), kind=write_error_kind(e))


def _name_max(directory: str) -> int:
    """The longest file name (in bytes) `directory`'s file system allows (255 where it does not say)."""
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # (AttributeError: no pathconf on this OS)
        return 255


def file_creation_error(directory: str) -> OSError | None:
    """Why no file can be made in the existing `directory`, or None when one can. os.access answers yes to root
    for any directory, /sys and /proc included, where no file can be made: this makes (and removes) one, so the
    error comes before the work instead of after it."""
    probe = os.path.join(directory, f".tgc-check-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # (someone's file of that name: a file could be made there)
        return None
    except OSError as e:
        return e
    try:
        os.close(fd)
    finally:  # (Ctrl-C here too: the probe is never left behind)
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None


def oserror_text(e: OSError) -> str:
    """An OSError's reason in lower case, to follow a colon in a message."""
    return (e.strerror or str(e)).lower()


def is_stream(path: str) -> bool:
    """An existing file that is neither a regular file nor a directory: a FIFO, a character device (/dev/stdout,
    /dev/null), a socket. It is written in place: renaming a staged file over it would replace the device node
    or pipe with a regular file (and the reader would never see the data)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


# a path the user named cannot be written (exit 2); other failures (disk full, I/O error) are runtime ones
_USER_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.EISDIR,
                errno.ENAMETOOLONG}


def write_error_kind(e: OSError) -> str:
    """"user" for an unwritable path (permission, read-only file system, missing directory), else "runtime"."""
    return "user" if e.errno in _USER_ERRNOS else "runtime"


def write_files(files: Sequence[tuple[str, Writer]]) -> None:
    """Write every `(path, writer)` atomically; on any failure no target is touched."""
    staged: list[tuple[str, str]] = []
    try:
        for path, write in files:
            if not is_stream(path):
                staged.append((stage(path, write), path))
        for path, write in files:  # pipes and devices last, once every regular file is staged
            if is_stream(path):
                import io

                buf = io.BytesIO()  # (numpy's np.save asks a real file for its position: a pipe has none)
                write(buf)
                with open(path, "wb") as f:
                    f.write(buf.getbuffer())
    except OSError as e:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise TgcError(f"cannot write '{path}': {e.strerror or e}", kind=write_error_kind(e)) from None
    except BaseException:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    for i, (tmp, path) in enumerate(staged):
        try:
            os.replace(tmp, path)
        except BaseException as e:  # (a directory of that name appeared since the checks; Ctrl-C): no temporary
            for left, _ in staged[i:]:  # file left
                with contextlib.suppress(OSError):
                    os.unlink(left)
            if isinstance(e, OSError):
                raise TgcError(f"cannot write '{path}': {e.strerror or e}", kind=write_error_kind(e)) from None
            raise
        try:
            _fsync_dir(os.path.dirname(os.path.abspath(path)))
        except BaseException:
            for left, _ in staged[i + 1:]:
                with contextlib.suppress(OSError):
                    os.unlink(left)
            raise


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_outputs(specs: Sequence[OutSpec], outs: Mapping[str, Any]) -> list[str]:
    """Write the `-o` files (all or nothing); returns the paths written."""
    import numpy as np

    def npz_writer(f: IO[bytes]) -> None:
        np.savez(f, **outs)

    def npy_writer(arr: Any) -> Writer:
        return lambda f: np.save(f, arr, allow_pickle=False)

    files: list[tuple[str, Writer]] = []
    for spec in specs:
        files.append((spec.path, npz_writer if spec.name is None else npy_writer(outs[spec.name])))
    write_files(files)
    return [p for p, _ in files]


# ---------------------------------------------------------------------------------------------------------------
# The output table


def display_values(arr: Any, dtype_name: str) -> Any:
    """The values to show for an output (bf16 held as uint16 bits decoded to floats)."""
    if dtype_name == "bf16" and arr.dtype == "uint16":
        from tgc.dtype import bf16_to_f32

        return bf16_to_f32(arr)
    return arr


def fmt_value(v: Any) -> str:
    import numpy as np

    if isinstance(v, (bool, np.bool_)):
        return "True" if v else "False"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return f"{float(v):.6g}"


def summarize(arr: Any, first: int = 6) -> dict[str, str]:
    """min, max, mean and the first few values of an array, as text."""
    import numpy as np

    flat = np.asarray(arr).reshape(-1)
    if flat.size == 0:
        return {"min": "-", "max": "-", "mean": "-", "values": "[]"}
    with np.errstate(all="ignore"):
        as_num = flat.astype(np.float64) if flat.dtype.kind == "b" else flat
        stats = {"min": fmt_value(flat.min()), "max": fmt_value(flat.max()),
                 "mean": f"{float(np.mean(as_num, dtype=np.float64)):.6g}"}
    values = ", ".join(fmt_value(v) for v in flat[:first])
    stats["values"] = f"[{values}{', ...' if flat.size > first else ''}]"
    return stats


def output_rows(outs: Mapping[str, Any], dtype_names: Mapping[str, str]) -> list[dict[str, str]]:
    rows = []
    for name, arr in outs.items():
        dt = dtype_names.get(name, str(arr.dtype))
        rows.append({"output": name, "dtype": dt, "shape": str(tuple(int(s) for s in arr.shape)),
                     **summarize(display_values(arr, dt))})
    return rows


def print_output_table(outs: Mapping[str, Any], dtype_names: Mapping[str, str]) -> None:
    """A table of the outputs on stdout (rich honours NO_COLOR and drops colours when piped)."""
    from rich.markup import escape
    from rich.table import Table

    rows = output_rows(outs, dtype_names)
    table = Table(show_edge=False, header_style="bold")
    for col, justify in (("output", "left"), ("dtype", "left"), ("shape", "left"), ("min", "right"),
                         ("max", "right"), ("mean", "right"), ("values", "left")):
        table.add_column(col, justify=justify, overflow="fold")
    for row in rows:  # (escaped: rich took `[inf, 1, 2]` and `[nan, ...]` for markup tags and showed nothing)
        table.add_row(*(escape(v) for v in row.values()))
    make_console().print(table)


def make_console(stderr: bool = False) -> Any:
    """A rich console; when piped (and COLUMNS is unset) 160 columns wide rather than rich's 80, so that
    tables stay readable in logs."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            """The reader closed the pipe: rich's own exits 1; the CLI's error handler (`_reader_gone`) ends the
            command quietly with exit 0, as for any print."""
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "the reader closed stdout")

    piped = not os.isatty(2 if stderr else 1) and "COLUMNS" not in os.environ
    return _Console(stderr=stderr, width=160 if piped else None)
