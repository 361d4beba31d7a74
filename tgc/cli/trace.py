"""`--profile OUT.json` of `tgc run` and `tgc bench`: record the command's work as a profile trace
(`tgc.profile`) and write it when the command ends.

Contract: a path that cannot be written at all (missing directory, a directory, no permission) is refused
before anything runs (exit 2). The trace is written after the command's own output (the output table, `-o`
files, the bench report), so a trace that fails to write late (a full disk) loses none of it: one error
line, exit 2 for an unwritable path, else 1. A command that fails still writes the trace of what ran; one that
ends by `ctx.exit(0)` (a staged ONNX model's, `tgc.cli.staged_cmds`) has succeeded: its "wrote" line is printed.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from tgc.cli.outputs import nonempty_path
from tgc.errors import TgcError


def _write_quietly(prof: Any, path: str) -> None:
    """The trace of what ran before a failure; the command's own error is the one to report."""
    try:
        prof.write(path)
    except OSError:
        pass


def _user_files(kwargs: dict[str, Any]) -> list[tuple[str, str]]:
    """The files a command reads or writes besides the trace (its FILE, `-i`/`--inputs`, `-o`, bench's
    `--baseline`): never the trace's."""
    from tgc.cli.outputs import input_files

    files = [(f"the program {kwargs['file']}", kwargs["file"])] if kwargs.get("file") else []
    files += [(f"an input file ({flag})", path) for flag, path in input_files(kwargs.get("pairs") or (),
                                                                               kwargs.get("npz"))]
    files += [(f"the output file of -o {spec.path}", spec.path) for spec in kwargs.get("outs") or ()]
    if kwargs.get("baseline"):
        files.append((f"the baseline {kwargs['baseline']}", kwargs["baseline"]))
    return files


def profile_option(f: Callable) -> Callable:
    """Add `--profile OUT.json` to a command: run it under `tgc.profile.profiling` and write the trace."""

    @functools.wraps(f)
    def wrapper(*args: Any, profile_path: str | None = None, **kwargs: Any) -> Any:
        if profile_path is None:
            return f(*args, **kwargs)
        from tgc import profile
        from tgc.cli.outputs import check_writable, not_over_user_files

        try:
            check_writable(profile_path)
        except TgcError as e:
            raise TgcError(f"--profile {e.msg}", kind=e.kind,
                           hint=e.hint or "name a file in a directory that exists and can be written") from None
        not_over_user_files("--profile", profile_path, _user_files(kwargs))
        ended: click.exceptions.Exit | None = None
        with profile.profiling() as prof:
            try:
                result = f(*args, **kwargs)
            except click.exceptions.Exit as e:  # a command that ends by ctx.exit(0) (a staged model's) is done
                if e.exit_code != 0:
                    _write_quietly(prof, profile_path)
                    raise
                ended, result = e, None
            except BaseException:
                _write_quietly(prof, profile_path)
                raise
        profile.write_trace(prof, profile_path)
        kernels = sum(1 for e in prof.events if e.get("cat") == "kernel")
        print(f"wrote {profile_path} (profile trace: {kernels} kernel spans; open it in ui.perfetto.dev or "
              "chrome://tracing)", file=sys.stderr)
        if ended is not None:
            raise ended
        return result

    return click.option("--profile", "profile_path", metavar="OUT.json", callback=nonempty_path,
                        help="Write a profile trace (Chrome trace-event JSON, for ui.perfetto.dev or chrome://tracing)"
                             " of kernel launches, copies, compiles and collectives.")(wrapper)
