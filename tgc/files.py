"""Writing a file atomically (the CLI's output files, a package): the data goes to a temporary file in the
target's directory, is flushed and fsynced, and is renamed over the target by the caller (`os.replace`).

The staged name starts with the target's, cut to STAGE_NAME_BYTES bytes: a target name the file system allows
(up to its NAME_MAX, 255 bytes on common ones, which `tgc.cli.outputs.check_writable` checks before the work)
has a staged name that fits too; a staged name made by appending to the target's (`f"{path}.tmp{pid}"`) was up
to 11 bytes longer, and a legal name near the limit failed after the whole compile."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from typing import IO

Writer = Callable[[IO[bytes]], None]

STAGE_NAME_BYTES = 100


def staged_pattern(names: str, cut: str) -> re.Pattern[str]:
    """The names `stage` gives the staged files of targets whose names match the regex `names` (ASCII names):
    `.NAME.XXXXXXXX.tmp`, where a NAME over STAGE_NAME_BYTES is cut to that many bytes, and must then match `cut`
    (the regex of such a name's beginnings). A cleanup that looked for the whole name missed those."""
    tail = r"\.[a-z0-9_]{8}\.tmp"
    return re.compile(rf"\.(?:(?:{names})|(?=.{{{STAGE_NAME_BYTES}}}{tail}$)(?:{cut})){tail}")


def default_mode() -> int:
    """What the umask leaves of 0o666: the mode of a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def file_mode(path: str, follow: bool = True) -> int:
    """The mode a file written at `path` gets: the existing file's, else what the umask leaves of 0o666. With
    `follow` False, a link (or anything not a regular file) there counts as none: its target's mode (a
    device's 0o666) is not taken."""
    import stat

    try:
        st = os.stat(path) if follow else os.lstat(path)
        if not follow and not stat.S_ISREG(st.st_mode):
            raise FileNotFoundError(path)
        return st.st_mode & 0o777
    except OSError:
        return default_mode()


def stage(path: str, write: Writer, follow: bool = True, mode: int | None = None) -> str:
    """Write a temporary file next to `path` with `write(f)`, flushed, fsynced and given `path`'s mode
    (`file_mode`, following a link there unless `follow` is False); return its path, for the caller to rename
    over `path` (`mode`: this mode instead). On any failure nothing is left behind and the error (an OSError
    for the file system's) propagates."""
    directory = os.path.dirname(os.path.abspath(path))
    import tempfile  # (only when a file is written: not on a warm `tgc run`'s path)

    # the staged name starts with the target's (at most STAGE_NAME_BYTES of it): a target name near the file
    # system's limit is allowed, and its staged name (14 bytes more) must fit too
    stem = os.fsencode(os.path.basename(path))[:STAGE_NAME_BYTES].decode(errors="ignore")
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode(path, follow) if mode is None else mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp
