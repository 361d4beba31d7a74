"""`tgc`: compile, run and time `.tg` tensor programs.

A thin shell over the Python API. Start-up time matters (a warm `tgc run` is a whole process), so
numpy, rich, the API and the backends are imported inside the commands that need them.
"""

from __future__ import annotations

import errno
import gc
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from tgc.cli.cluster import cluster_option
from tgc.cli.cluster import worker as cluster_worker
from tgc.cli.outputs import nonempty_path
from tgc.cli.trace import profile_option
from tgc.env import check_all
from tgc.env import help_text as env_help_text
from tgc.errors import TgcError
from tgc.version import __version__

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _debug() -> bool:
    return os.environ.get("DEBUG", "") not in ("", "0")


def _color_stdout() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _fill_location(e: TgcError, ctx: click.Context) -> None:
    """Give a source error the file name and source line the command knows, where the raiser left them out."""
    path = ctx.meta.get("tgc.path")
    if e.line is None or path is None:
        return
    if e.file is None:
        e.file = path
    if e.text is None and e.file == path:
        source = ctx.meta.get("tgc.source")
        if source is None:
            try:
                with open(path, encoding="utf-8-sig", errors="replace") as f:
                    source = f.read()
            except OSError:
                return
        lines = source.splitlines()
        if 0 < e.line <= len(lines):
            e.text = lines[e.line - 1]


def _show_click_error(e: click.ClickException, file: Any = None) -> None:
    """click's own errors (bad option, bad value) in tgc's style: `error: ...` and a `help:` line."""
    msg = e.format_message()
    msg = (msg[:1].lower() + msg[1:]).removesuffix(".")
    ctx = getattr(e, "ctx", None)
    lines = [f"error: {msg}"]
    if isinstance(e, click.UsageError):
        lines.append(f"  help: see '{ctx.command_path if ctx is not None else 'tgc'} --help'")
    click.echo("\n".join(lines), err=True)


def _restyle(e: click.ClickException) -> click.ClickException:
    no_args = getattr(click.exceptions, "NoArgsIsHelpError", None)
    if no_args is not None and isinstance(e, no_args):  # `tgc` alone prints the help: not an error
        return e
    e.show = lambda file=None: _show_click_error(e, file)  # type: ignore[method-assign]
    return e


def _interrupted(ctx: click.Context) -> None:
    """Ctrl-C: one line and exit 130. Where a kernel still runs on CPU threads (native code cannot be
    stopped), leave at once with os._exit: a normal exit would wait for the kernel, and must never free its
    memory under it."""
    sub = ctx.invoked_subcommand
    _err(f"tgc{' ' + sub if sub else ''}: interrupted")
    cpu = sys.modules.get("tgc.backends.cpu")
    if cpu is not None and cpu.kernels_running():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(130)
    ctx.exit(130)


def exit_now(code: Any) -> None:
    """End the process with `sys.exit(code)`'s status, doing what the interpreter does at exit except its
    teardown: the threads are joined first (`threading._shutdown`, the interpreter's own first step: a thread
    pool's idle workers end, a kernel left running by Ctrl-C is waited for), the `atexit` hooks run (compile
    workers shut down, a REMOTE session ends, temporary directories go), stdout and stderr are flushed (a
    closed pipe is ignored, as click does), then `os._exit`. Skipped: freeing every module and object one by
    one and the C libraries' exit handlers, ~25 ms of CPU per process with numpy loaded (docs/DESIGN.md, "The
    warm run's overhead, measured"). Nothing of tgc's is left unwritten: output files are fsynced and renamed
    before a command returns, the cache commits every statement."""
    import atexit
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # (as the interpreter: a message, status 1)
        click.echo(str(code), err=True)
        status = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:  # noqa: BLE001 - a second Ctrl-C while waiting for a thread: exit all the same
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe (`tgc ... | head`) or a closed stream
            pass
    os._exit(status & 0xFF)


def _on_sigint(signum: int, frame: Any) -> None:
    """Ctrl-C: KeyboardInterrupt, as Python's own handler raises it, but never inside a function Python calls where
    an exception is lost: a weakref callback (the node table's `tgc.ir.uop.WEAKREF_CALLBACKS`, the standard
    library's) or a `__del__`, directly or below one. Raised there it was printed as "Exception ignored" and the
    command ran on (a review saw `tgc beam` run 85 s more, exit 0, and store the interrupted search as
    finished). There the signal is sent again a millisecond later, from a timer thread (`signal.raise_signal`
    would run this handler again at once, inside the same function): Python handles it in whatever runs then,
    normally that function's caller once it has returned (if not, it is sent again)."""
    import signal
    import threading

    uop = sys.modules.get("tgc.ir.uop")
    lost = {f.__code__ for f in uop.WEAKREF_CALLBACKS} if uop is not None else set()
    f = frame
    while f is not None:
        code = f.f_code
        if code in lost or code.co_name == "__del__" or (code.co_name == "remove"
                                                         and code.co_filename.endswith("weakref.py")):
            timer = threading.Timer(0.001, os.kill, (os.getpid(), signal.SIGINT))
            timer.daemon = True
            timer.start()
            return
        f = f.f_back
    signal.default_int_handler(signum, frame)


def install_sigint_handler() -> None:
    """`_on_sigint` for SIGINT, where Python's own handler is in place (a process started ignoring SIGINT, a job
    a shell put in the background, keeps ignoring it). Main thread only, as any handler."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def _reader_gone(ctx: click.Context) -> None:
    """stdout's reader closed the pipe (`tgc compile ... | head -3`): it took what it wanted, so the command stops
    writing quietly and exits 0, no traceback, as `git log | head` does. stdout then points at /dev/null, so
    that what is still buffered, flushed at exit, goes nowhere instead of failing again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # (not a file: click's test runner)
        fd = -1
    if fd >= 0:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    ctx.exit(0)


class TgcGroup(click.Group):
    """Turns errors into one message on stderr: `TgcError.format()` with its exit code, or an internal error.
    click's usage errors keep their exit code (2) and get the same `error:`/`help:` style."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """click's `main`. Run as the process's own command line (no `args`, standalone: the `tgc` script,
        `python -m tgc.cli.main`), the process ends through `exit_now` once the command is done; called with
        `args` (click's test runner, `main([...])`), as click's."""
        if args is not None or not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        # The cyclic garbage collector is off until the command is known: a warm `tgc run` (the program cache's
        # path: imports, the entry, the run, the table) allocates mostly objects that live to the end, and its
        # ~85 young-generation collections cost ~10 ms of its ~0.16 s. Every other command, and `tgc run` once it
        # takes the cold path or --check (parsing, lowering, compiling: cyclic garbage), turns it back on
        # (`_collect`). The process ends through `exit_now`, so nothing outlives it.
        gc.disable()
        install_sigint_handler()
        try:
            super().main(None, prog_name, complete_var, True, **extra)
        except SystemExit as e:
            exit_now(e.code)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as e:
            raise _restyle(e) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as e:
            raise _restyle(e) from None
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            _interrupted(ctx)
        except TgcError as e:
            _fill_location(e, ctx)
            if e.cli_hint:  # the same advice, naming the command line's flags
                e.hint = e.cli_hint
            click.echo(e.format(), err=True)
            ctx.exit(e.exit_code)
        except MemoryError as e:
            detail = str(e).splitlines()[0] if str(e) else ""
            click.echo(f"error: out of memory{': ' + detail if detail else ''}", err=True)
            click.echo("  help: use smaller dims (-D) or inputs", err=True)
            ctx.exit(1)
        except Exception as e:
            if isinstance(e, OSError) and e.errno == errno.EPIPE:
                _reader_gone(ctx)
            if _debug():
                import traceback

                traceback.print_exc()
            detail = str(e).splitlines()[0] if str(e) else ""
            click.echo(f"error: internal error: {type(e).__name__}{': ' + detail if detail else ''}", err=True)
            if not _debug():
                click.echo("  help: set DEBUG=1 to see the traceback", err=True)
            ctx.exit(1)


# ---------------------------------------------------------------------------------------------------------------
# Shared options


MAX_DIM_BITS = 48  # 2^48 elements of one axis: beyond any machine's memory, well inside int64 arithmetic


def _parse_dims(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, int]:
    dims: dict[str, int] = {}
    for text in values:
        name, sep, size = text.partition("=")
        name, size = name.strip(), size.strip()
        if not sep or not name.isidentifier():
            raise click.BadParameter(f"'{text}' is not NAME=INT (e.g. -D N=1024)", ctx, param)
        digits = size.lstrip("+-")
        if digits.isdigit() and len(digits) > 20:  # int() of a huge string is slow; no dim is that large
            raise click.BadParameter(f"'{text}': a dim must be below 2^{MAX_DIM_BITS}", ctx, param)
        if not (digits.isascii() and digits.isdigit()) or len(digits) + 1 < len(size):  # (int() also reads
            raise click.BadParameter(f"'{text}': {size!r} is not an integer (write it in digits)", ctx,  # 1_000, ٤)
                                     param) from None
        value = int(size)
        if value < 0:
            raise click.BadParameter(f"'{text}': a dim cannot be negative", ctx, param)
        if value >= 1 << MAX_DIM_BITS:
            raise click.BadParameter(f"'{text}': a dim must be below 2^{MAX_DIM_BITS}", ctx, param)
        if dims.get(name, value) != value:
            raise click.BadParameter(f"{name} is given twice, as {dims[name]} and {value}", ctx, param)
        dims[name] = value
    return dims


def _parse_pairs(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[tuple[str, str]]:
    pairs = []
    for text in values:
        name, sep, path = text.partition("=")
        if not sep or not name.strip() or not path:  # (any name: ONNX inputs are called "input.1")
            raise click.BadParameter(f"'{text}' is not NAME=PATH.npy (e.g. -i x=x.npy)", ctx, param)
        pairs.append((name.strip(), path))
    return pairs


def _parse_outs(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[Any]:
    from tgc.cli.outputs import parse_out

    try:
        return [parse_out(v) for v in values]
    except ValueError as e:
        raise click.BadParameter(f"{e} (use -o PATH.npz or -o NAME=PATH.npy)", ctx, param) from None


def _finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    import math

    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number", ctx, param)
    return value


def _set_remote(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    from tgc.env import parse_address

    if value is not None:  # checked before it reaches the environment (and every REMOTE device after it)
        for part in value.split(","):
            try:
                parse_address(part)
            except TgcError as e:
                raise click.BadParameter(f"{e.msg} ({e.hint})" if e.hint else e.msg, ctx, param) from None
        os.environ["TGC_REMOTE"] = value


def _set_jobs(ctx: click.Context, param: click.Parameter, value: int | None) -> None:
    if value is not None:
        os.environ["TGC_JOBS"] = str(value)  # read where kernels are compiled (`search.compile_jobs`)


def device_options(f: Callable) -> Callable:
    f = click.option("-j", "--jobs", type=click.IntRange(min=1), metavar="N", callback=_set_jobs, expose_value=False,
                     help="Compile on N worker processes at once (else $TGC_JOBS, else every core; 1: in this "
                          "process).")(f)
    f = click.option("--remote", metavar="HOST:PORT", callback=_set_remote, expose_value=False,
                     help="Server of the REMOTE device, a comma list for REMOTE:i (else $TGC_REMOTE).")(f)
    return click.option("-d", "--device", metavar="DEV", envvar="TGC_DEVICE", show_envvar=True,
                        help="Device: CPU (default), OPENCL, CUDA, METAL, PYTHON, REMOTE; NAME:i for the i-th.")(f)


def _parse_shard(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, int]:
    shard: dict[str, int] = {}
    for text in values:
        name, sep, axis = text.partition("=")
        name, axis = name.strip(), axis.strip()
        # (any name, as -i takes: ONNX inputs are called "input.1"; the program says whether it declares it)
        if not sep or not name or not axis.lstrip("-").isdigit() or len(axis) > 6:
            raise click.BadParameter(f"'{text}' is not NAME=AXIS (e.g. --shard x=0)", ctx, param)
        if shard.get(name, int(axis)) != int(axis):
            raise click.BadParameter(f"{name} is given twice, as {shard[name]} and {axis}", ctx, param)
        shard[name] = int(axis)
    return shard


def shard_option(f: Callable) -> Callable:
    return click.option("--shard", multiple=True, metavar="NAME=AXIS", callback=_parse_shard,
                        help="With a device list (-d CPU:0,CPU:1): split input NAME along AXIS across the devices "
                             "(repeatable); inputs not named are replicated.")(f)


def _is_list(device: str | None, shard: dict[str, int] | None = None) -> bool:
    """Whether `-d` (or TGC_DEVICE) names a device list; `--shard` without one is a usage error."""
    from tgc.backends import default_device
    listed = "," in (device or default_device())
    if shard and not listed:
        raise click.UsageError("--shard needs a device list, e.g. -d CPU:0,CPU:1")
    return listed


def dims_option(f: Callable) -> Callable:
    return click.option("-D", "dims", multiple=True, metavar="NAME=INT", callback=_parse_dims,
                        help="Size of a dim name (repeatable).")(f)


def _one_npz(ctx: Any, param: Any, value: tuple[str, ...]) -> str | None:
    """`--inputs` once at most: given twice, click kept the last archive and dropped the first without a word
    (its arrays then 'missing')."""
    if len(value) > 1:
        raise click.BadParameter(f"given {len(value)} times ({', '.join(repr(v) for v in value)}); it takes one "
                                 "archive (give other inputs with -i NAME=PATH.npy)", ctx, param)
    return nonempty_path(ctx, param, value[0] if value else None)


def input_options(f: Callable) -> Callable:
    f = click.option("--cast", is_flag=True, help="Cast inputs of another dtype to the declared one (numpy).")(f)
    f = click.option("--inputs", "npz", metavar="PATH.npz", multiple=True, callback=_one_npz,
                     help="Inputs from an .npz archive, by name.")(f)
    return click.option("-i", "--input", "pairs", multiple=True, metavar="NAME=PATH.npy", callback=_parse_pairs,
                        help="One input from a .npy file (repeatable; overrides --inputs).")(f)


def json_option(f: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")(f)


def _load(path: str) -> Any:
    """Parse a `.tg` file; remember its name so that errors raised later can point into it."""
    ctx = click.get_current_context()
    from tgc.package import is_package

    if os.path.isfile(path) and is_package(path):  # not a .tg file: say so, not "cannot read: utf-8 codec"
        raise TgcError(f"{path} is a compiled package: tgc {ctx.info_name} needs the .tg program",
                       hint="tgc inspect shows a package's kernels; tgc run and tgc bench run it")
    ctx.meta["tgc.path"] = path
    from tgc.staged import load  # (tgc.api.load, or a StagedModel for an ONNX model run in stages)

    prog = load(path)
    ctx.meta["tgc.source"] = getattr(prog, "source", None)
    from tgc.cli.staged_cmds import after_load

    return after_load(ctx, prog)  # an ONNX model run in stages: its command is done there (and ends)


def _load_any(path: str) -> Any:
    """A compiled package (`.tgpkg`, or any zip archive) or a `.tg` program."""
    from tgc.package import is_package

    if is_package(path):
        from tgc.package import load_package

        return load_package(path)
    return _load(path)


def _is_pkg(prog: Any) -> bool:
    """A package, of fixed sizes or symbolic (not a `.tg` program: no source, no compiler)."""
    return type(prog).__name__ in ("Package", "SymbolicPackage", "MultiPackage")


def _no_symbolic_flag(prog: Any) -> click.UsageError:
    if getattr(prog, "symbolic", False):
        return click.UsageError("--symbolic needs the .tg program: this package already runs at every size of its "
                                "size classes")
    return click.UsageError("--symbolic needs the .tg program: a package holds kernels for its own sizes")


def _no_list_for_package(device: str | None, shard: dict[str, int] | None, prog: Any = None) -> None:
    """A package is compiled for one device: a device list (or --shard) with it is a usage error. A device-list
    package (`prog` a `MultiPackage`) runs on its own list: --shard is fixed in it, -d may name the list."""
    if type(prog).__name__ == "MultiPackage":
        if shard:
            raise click.UsageError("a device-list package holds its shard spec: --shard needs the .tg program")
        return
    if _is_list(device, shard):
        raise click.UsageError("a package runs on the one device it was compiled for; device lists and --shard "
                               "need the .tg program")


def _not_the_program(path: str, file: str, flag: str) -> None:
    """A user error (exit 2) when `path`, about to be written, is the program (or package) FILE itself."""
    try:
        same = os.path.exists(path) and os.path.samefile(path, file)
    except OSError:
        same = False
    if same:
        raise TgcError(f"{flag} {path} would overwrite the program {file}",
                       hint="write outputs to another file" if flag == "-o" else "name the package OUT.tgpkg")


def _check_package_target(package: str, file: str) -> None:
    """Before compiling: `--package OUT` may replace an older package, never the program itself or another
    file the user has (an input array, a note): those are user errors (exit 2) and the file stays as it was."""
    import zipfile

    from tgc.cli.outputs import check_writable

    check_writable(package)
    if not os.path.exists(package):
        return
    _not_the_program(package, file, "--package")
    if not os.path.isfile(package):  # a pipe or a device: written in place, as `run -o` writes one, and never
        return                       # read as a zip first (/dev/zero read forever; a FIFO waited for a writer)
    ours = package.endswith(".tgpkg")  # (a damaged package is replaced too)
    try:
        with zipfile.ZipFile(package) as z:
            ours = ours or "manifest.json" in z.namelist()
    except (OSError, zipfile.BadZipFile, ValueError):
        pass
    if not ours:
        raise TgcError(f"--package {package}: the file exists and is not a tgc package; not overwriting it",
                       hint="remove it first, or name another OUT.tgpkg")


def _not_over_other_files(out: str) -> None:
    """`tgc viz -o OUT`: an existing regular file is replaced only where it is an HTML page (an earlier viz, a
    .html or .htm name): `-o x.npy` named the user's data, which the page overwrote (exit 0)."""
    if not os.path.isfile(out) or out.lower().endswith((".html", ".htm")):
        return
    try:
        with open(out, "rb") as f:
            head = f.read(64).lstrip().lower()
    except OSError:
        return  # (check_writable has reported what the user can do about it)
    if not head.startswith((b"<!doctype html", b"<html")):
        raise TgcError(f"-o {out}: the file exists and is not an HTML page; not overwriting it",
                       hint="remove it first, or name another OUT.html")


def _device_kind(device: str | None) -> tuple[str, str]:
    """(the device name to show, its registry kind) for `-d` (first of a list) or the default device."""
    from tgc.backends import canonical, default_device

    name = device or default_device()
    return name, canonical(name.split(",")[0])[0]


def _output_dtypes(prog: Any, dims: dict[str, int], outs: dict[str, Any]) -> dict[str, str]:
    """DSL dtype names of the outputs (the program knows bf16 from u16 bits), else from the numpy arrays."""
    from tgc.dtype import dtypes

    declared = {name: dt for name, dt, _ in prog.output_types(dims)} if hasattr(prog, "output_types") else {}
    names = {}
    for name, arr in outs.items():
        dt = declared.get(name) or dtypes.from_numpy(arr.dtype)
        names[name] = dt.name if dt is not None else str(arr.dtype)
    return names


def _echo_json(doc: Any) -> None:
    def default(o: Any) -> Any:
        if hasattr(o, "tolist"):
            return o.tolist()
        if hasattr(o, "name"):
            return o.name
        return str(o)

    click.echo(json.dumps(doc, indent=2, default=default))


def _stderr_tty() -> bool:
    return sys.stderr.isatty()


def _search_with_progress(prog: Any, device: str | None, dims: dict[str, int], beam: int | None,
                          running: bool = True) -> None:
    """Where stderr is a terminal, compile first with a progress bar: `tgc beam`'s where BEAM (or `--beam`) will
    search kernels, else one that shows once compiling has taken a second; the run or bench that follows reuses
    these kernels. Not where the program cache holds the program (`running`: a run or bench will use it)."""
    if beam is None:
        try:
            beam = int(os.environ.get("BEAM", "0") or 0)
        except ValueError:
            return  # the compile that follows reports the bad value
    if not _stderr_tty() or _is_list(device):
        return
    if beam <= 0 and running and prog.cached(device, dims):
        return
    from tgc.cli import report

    progress, close = report.progress_bar(True) if beam > 0 else report.compile_progress(True)
    try:
        prog.compile(device=device, dims=dims, beam=beam, progress=progress)
    finally:
        close()


def _err(msg: str) -> None:
    click.echo(msg, err=True)


def _warn(lines: list[str]) -> None:
    for line in lines:
        _err(line)


# ---------------------------------------------------------------------------------------------------------------
# tgc


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    import platform
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"


    click.echo(f"tgc {__version__ or version('tgc')}")
    click.echo(f"Python {platform.python_version()} ({sys.executable})")
    click.echo(f"numpy {version('numpy')}")
    click.echo(f"llvmlite {version('llvmlite')}")
    click.echo("backends:")
    from tgc.api import devices

    for row in devices(info=False):
        state = "available" if row["available"] else f"unavailable: {row['why_not']}"
        click.echo(f"  {row['device']:<8} {state}")
    ctx.exit(0)


@click.group(cls=TgcGroup, context_settings=CONTEXT_SETTINGS, epilog="\b\n" + env_help_text())
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the versions of tgc, Python, numpy, llvmlite and each backend, and exit.")
def main() -> None:
    """Compile, run and time `.tg` tensor-expression programs."""

    check_all()  # a bad TGC_THREADS, DEBUG, ... is one clear error (exit 2) before anything runs
    try:
        os.getcwd()  # (relative paths, -o's staging and the cache's defaults need it: else an internal error later)
    except FileNotFoundError:
        raise TgcError("the current directory no longer exists (it was removed)",
                       hint="cd to a directory that exists and run the command again") from None
    if click.get_current_context().invoked_subcommand != "run":
        _collect()


def _collect() -> None:
    """The cyclic garbage collector back on (`TgcGroup.main` turns it off for a warm `tgc run`)."""
    gc.enable()


# ---------------------------------------------------------------------------------------------------------------
# tgc run


@main.command()
@cluster_option
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@device_options
@dims_option
@input_options
@click.option("--random", "use_random", is_flag=True, help="Fill missing inputs with random values.")
@click.option("--seed", type=click.IntRange(min=0), help="Seed for --random (default 0).")
@click.option("-o", "--output", "outs", multiple=True, metavar="OUT", callback=_parse_outs,
              help="PATH.npz for every output, NAME=PATH.npy for one (repeatable). Else print a table.")
@click.option("--check", is_flag=True, help="Compare with the float64 numpy reference; exit 1 beyond tolerance.")
@click.option("--rtol", type=click.FloatRange(min=0), callback=_finite,
              help="Relative tolerance for --check (default by dtype).")
@shard_option
@click.option("--symbolic", is_flag=True,
              help="Run the kernels compiled once for the sizes' class (sizes as kernel arguments).")
@profile_option
def run(file: str, device: str | None, dims: dict[str, int], pairs: list[tuple[str, str]], npz: str | None,
        cast: bool, use_random: bool, seed: int | None, outs: list[Any], check: bool, rtol: float | None,
        shard: dict[str, int], symbolic: bool) -> None:
    """Run FILE (a `.tg` program, or a package from `tgc compile --package`) and print or save its outputs."""
    from tgc.cli import inputs as inp
    from tgc.cli.outputs import input_files, resolve_outs

    if seed is not None and not use_random:
        raise click.UsageError("--seed needs --random")
    if rtol is not None and not check:  # (it was ignored: a run the user believed checked)
        raise click.UsageError("--rtol needs --check")
    warm = None if pairs or npz else _warm_entry(file, device, dims, shard, lists=True, symbolic=symbolic)
    if warm is not None and (use_random or not warm[0].inputs):
        # the program cache holds this program at these dims: run it without parsing or compiling anything
        entry, dev_name = warm
        specs = resolve_outs(outs, entry.output_names)
        for spec in specs:
            _not_the_program(spec.path, file, "-o")
        arrays = _random_inputs(entry, seed or 0)
        results = entry.run(dev_name, arrays)
        _finish_run(file, entry, dict(entry.dims), arrays, results, specs, check, rtol)
        return
    _collect()  # (the cold path: parsing and compiling make cyclic garbage)
    prog = _load_any(file)
    pkg = _is_pkg(prog)
    if pkg:
        _no_list_for_package(device, shard, prog)
    if pkg and check:
        raise TgcError("--check needs the program's source: a package holds no numpy reference",
                       hint="run --check on the .tg file")
    _warn(inp.check_dims(prog, dims, require_all=False))
    # a -D the program lacks: the warning above (not an error after it), then dropped, so that it is no part of the
    # program cache's key (a run with it compiled again and stored a second entry)
    dims = {k: v for k, v in dims.items() if k in prog.dim_names}
    specs = resolve_outs(outs, prog.output_names, input_files(pairs, npz))
    for spec in specs:
        _not_the_program(spec.path, file, "-o")
    notes: list[str] = []
    given = inp.gather(prog, npz, pairs, cast, notes)
    _warn(notes)
    known = prog.resolve_dims(dims) if pkg else dims
    arrays = inp.fill_random(prog, given, known, seed or 0) if use_random else given
    run_dims, arrays = inp.bind(prog, arrays, dims)
    if not pkg and not symbolic:
        _search_with_progress(prog, device, run_dims, None)
    if type(prog).__name__ == "MultiPackage":  # (its own device list, unless -d names one)
        results = prog.run(device=device, dims=run_dims, inputs=arrays)
    elif _is_list(device, shard):
        if symbolic:
            raise click.UsageError("--symbolic runs on one device, not a device list")
        results = prog.run(device=device, dims=run_dims, shard=shard, inputs=arrays)
    elif symbolic:  # (an input may be called `symbolic`: the flag goes in only when given)
        if pkg:
            raise _no_symbolic_flag(prog)
        results = prog.run(device=device, dims=run_dims, symbolic=True, inputs=arrays)
    else:
        results = prog.run(device=device, dims=run_dims, **arrays)
    if symbolic and prog.last_run != "symbolic":
        _err(f"note: ran kernels compiled for these sizes ({prog.last_run.split(': ', 1)[-1]})")
    _finish_run(file, prog, run_dims, arrays, results, specs, check, rtol)


def _warm_entry(file: str, device: str | None, dims: dict[str, int], shard: dict[str, int], lists: bool = False,
                symbolic: bool = False) -> tuple[Any, str] | None:
    """(the program cache's entry for FILE at exactly these dims on the device, or with `lists` on the device list
    sharded as `shard`, or with `symbolic` the entry of these dims' size class bound to them; the device's or
    list's name), or None: not stored, not usable here (`tgc.progcache.usable`), a device list without `lists`
    (or with `symbolic`), a package, or a file that does not read (the cold path then reports it). Imports
    neither the front end nor a compiler."""
    from tgc.package import is_package

    listed = _is_list(device, shard)
    if (listed and (not lists or symbolic)) or is_package(file) or file.lower().endswith(".onnx"):
        return None  # (a model's warm path goes through tgc.load: its weights are part of the key)
    if not os.path.isfile(file):  # (/dev/zero, a pipe: reading would never end; tgc.load says so)
        return None
    try:
        with open(file, encoding="utf-8-sig") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    from tgc import progcache
    from tgc.backends import default_device, one_device

    try:
        if listed:  # (the key has the shard spec as the cold path makes it: axes non-negative, checked there)
            from tgc.cli import shardaxes

            names = [x.strip() for x in (device or default_device()).split(",")]
            devs = progcache.list_devices(names)
            axes = shardaxes.normalize(source, shard)
            if devs is None or axes is None:
                return None
            entry = progcache.lookup_list(source, dims, devs, names, axes, file)
            if entry is not None and axes != shard and not shardaxes.ranks_match(entry.header, source, shard):
                return None
            where = ",".join(names)
        else:
            dev = one_device(device)
            entry = progcache.lookup_symbolic(source, dims, dev, file) if symbolic else \
                progcache.lookup(source, dims, dev, file)
            where = dev.name
    except TgcError:
        return None
    if entry is None:
        return None
    if _debug_level() >= 2:
        _err(f"*** program cache hit: nothing to lower or compile ({file}, {where})")
    return entry, where


def _debug_level() -> int:
    try:
        return int(os.environ.get("DEBUG", "0") or 0)
    except ValueError:
        return 0


def _random_inputs(entry: Any, seed: int) -> dict[str, Any]:
    """The random inputs `--random` draws for the program (the same values as the cold path: by seed and
    position), each checked against this machine's memory first."""
    from tgc.cli import inputs as inp

    return inp.draw_random([(d, list(d.shape), index) for index, d in enumerate(entry.inputs)], seed)


def _finish_run(file: str, prog: Any, run_dims: dict[str, int], arrays: dict[str, Any], results: dict[str, Any],
                specs: list[Any], check: bool, rtol: float | None) -> None:
    """`tgc run` after the run: --check, then the output files or the table."""
    from tgc.cli.outputs import print_output_table, save_outputs

    dtype_names = _output_dtypes(prog, run_dims, results)
    failure = None
    if check:
        _collect()  # (the reference parses the program)
        from tgc.cli.check import check_outputs

        if not hasattr(prog, "reference_with_scale"):  # a program-cache entry: the reference needs the front end
            prog = _load(file)
        reference, scales = prog.reference_with_scale(dims=run_dims, **arrays)
        bad, worst = check_outputs(results, reference, dtype_names, rtol, scales)
        if bad:
            failure = TgcError("check failed: " + "\n  ".join(m.describe() for m in bad), kind="runtime",
                               hint=None if not specs else "no output file was written")
        else:
            n = len(results)
            _err(f"check: ok: {n} output{'s match' if n != 1 else ' matches'} the numpy reference "
                 f"(worst error {worst:.2g} of the tolerance)")
    if specs and failure is None:
        for path in save_outputs(specs, results):
            _err(f"wrote {path}")
    elif not specs:
        print_output_table(results, dtype_names)
    if failure is not None:
        raise failure


# ---------------------------------------------------------------------------------------------------------------
# tgc compile


@main.command("compile")
@cluster_option
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@device_options
@dims_option
@click.option("--emit", type=click.Choice(["src", "uops", "schedule", "ir", "asm", "bin"]), default="src",
              show_default=True, help="What to print for each kernel.")
@click.option("-o", "--output", "outdir", metavar="DIR", callback=nonempty_path,
              help="Write one file per kernel into DIR; an earlier compile's files there that this one does not "
                   "write are removed (only tgc's own, unchanged), a file of yours at a kernel's name is kept as "
                   "NAME.orig.")
@click.option("--package", "package", metavar="OUT.tgpkg", callback=nonempty_path,
              help="Write one package file (signature, launch plan, binaries) for `tgc run`/`bench`/`inspect`.")
@shard_option
@click.option("--timings", "show_timings", is_flag=True,
              help="Print where the time went (per kernel: each phase, the compiler, cache hits) on stderr.")
@json_option
def compile_(file: str, device: str | None, dims: dict[str, int], emit: str, outdir: str | None,
             package: str | None, shard: dict[str, int], show_timings: bool, as_json: bool) -> None:
    """Compile every kernel of FILE and print their sources (or UOps, schedule, IR, assembly, binaries), or
    write a package (--package) that runs later without FILE and without compiling. Without -D, a program
    with dims compiles once for every size: its sizes are kernel arguments. --json prints the kernels (and,
    with --timings, the timings) as one JSON document instead of their sources."""
    import time

    from tgc import timings

    if as_json and (package or emit != "src"):
        raise click.UsageError("--json lists the kernels: it does not combine with --package or --emit")
    start = time.perf_counter()
    with timings.recording() as rec:
        kernels = _compile_command(file, device, dims, emit, outdir, package, shard, show=not as_json)
    wall = time.perf_counter() - start
    if as_json:
        doc: dict[str, Any] = {"file": file, "device": _device_kind(device)[0], "dims": dims,
                               "kernels": [{"name": k.name, "line": k.line, "binary_bytes": len(k.binary or b""),
                                            "opts": [str(o) for o in k.opts]} for k in kernels]}
        if show_timings:
            doc["timings"] = {**rec.doc(), "wall_s": wall}
        _echo_json(doc)
    elif show_timings:
        from tgc.cli.report import timings_text

        _err(timings_text(rec, wall))


def _symbolic_package_note(path: str, pkg: Any) -> None:
    """What `tgc compile --package` says of a symbolic package: one line per size class (its sizes, kernels and
    planned peak as a short expression, else in bytes at its least sizes), the classes left out; the peak's full
    expression at DEBUG (`tgc inspect` prints it too)."""
    from tgc.cli.report import fmt_bytes
    from tgc.sizeexpr import class_text, evaluate, text

    n, k = len(pkg.kernels), len(pkg.classes)
    _err(f"wrote {path}: {n} kernel{'s' if n != 1 else ''} for {pkg.device_name} for every size of {k} size "
         f"class{'es' if k != 1 else ''} (`tgc inspect {path}` shows each in full):")
    for c in pkg.classes:
        nk, peak = len(c.doc["kernels"]), c.peak_text()
        if peak is not None:
            peak += " bytes"
        else:  # (a long expression: its value where the class starts)
            least = c.least()
            at, _ = c.class_dims(least, ranges=False)
            try:
                peak = f"{fmt_bytes(evaluate(c.doc['memory']['peak_bytes'], at or least))} at its least sizes " + \
                    ", ".join(f"{d}={v}" for d, v in least.items())
            except TgcError:
                peak = "as `tgc inspect` shows"
        _err(f"  {c.text()}: {nk} kernel{'s' if nk != 1 else ''}, peak {peak}")
        if _debug():
            _err(f"    planned peak (bytes): {text(c.doc['memory']['peak_bytes'])}")
    if pkg.skipped:
        _err("  not packaged (`tgc inspect` says why): " + "; ".join(
            s["class"] if isinstance(s["class"], str) else class_text(s["class"].items()) for s in pkg.skipped))


def _compile_command(file: str, device: str | None, dims: dict[str, int], emit: str, outdir: str | None,
                     package: str | None, shard: dict[str, int], show: bool) -> list[Any]:
    """`tgc compile` without --timings/--json: the kernels compiled (none for --package or --emit schedule)."""
    from tgc import timings
    from tgc.cli import emit as em
    from tgc.cli.inputs import check_dims

    if package and (outdir or emit != "src"):
        raise click.UsageError("--package writes one file: it does not combine with --emit or -o")
    if outdir:  # a directory that cannot be made, or no file can be made in, is refused before the compile
        em.check_outdir(outdir)
    with timings.phase("parse"):
        prog = _load(file)
    from tgc.cli.staged_cmds import FIXED_DIMS

    if click.get_current_context().meta.get(FIXED_DIMS):  # (a per-size ONNX model translated at the -D sizes)
        dims = {}
    kernels: list[Any] = []
    symbolic = not dims and bool(prog.dim_names) and emit != "schedule"
    if not symbolic:
        try:
            _warn(check_dims(prog, dims, require_all=True))
        except TgcError as e:  # (some dims given to --package: all of them, or none for every size)
            from tgc.package import SYMBOLIC_KINDS

            if package and dims and prog.weights:  # (an ONNX model: no symbolic package, see _no_bound_weights)
                e.hint = f"{e.hint}: a package of a model with weights bound at load (ONNX) holds them at fixed " \
                    "sizes, so it needs every dim" if e.hint else "give every dim (-D NAME=INT)"
            elif package and dims and not _is_list(device, shard) and _device_kind(device)[1] in SYMBOLIC_KINDS:
                e.hint = f"{e.hint}, or give no -D to package it for every size (the sizes then come from the " \
                    "inputs at each run)" if e.hint else "give no -D to package it for every size"
            raise
    name, kind = _device_kind(device)
    if package:
        if _is_list(device, shard) and not dims and prog.dim_names:
            raise click.UsageError("a package for a device list needs every dim (-D NAME=INT)")
        _check_package_target(package, file)
        from tgc.cli.report import fmt_bytes
        from tgc.package import write

        if dims or not prog.dim_names:  # a package holds kernels for the sizes given (dims checked above)
            _search_with_progress(prog, device, dims, None, running=False)
        listed = _is_list(device, shard)
        # (no -D: kernels for every size of its size classes; a device list: its one multi-device executable)
        pkg = write(prog, package, device if listed else name, dims, shard=shard if listed else None)
        n = len(pkg.kernels)
        if pkg.symbolic:
            _symbolic_package_note(package, pkg)
            return kernels
        _err(f"wrote {package}: {n} kernel{'s' if n != 1 else ''} for {pkg.device_name}, "
             f"planned peak memory {fmt_bytes(pkg.peak_bytes)}")
        return kernels
    if symbolic and _is_list(device, shard):
        symbolic = False
        _warn(check_dims(prog, dims, require_all=True))
    if symbolic:
        plan = prog.compile_symbolic(device=device)
        kernels = plan.kernels
        _err(f"note: compiled for every size ({plan.class_text()}): sizes are kernel arguments; "
             "give -D NAME=INT for kernels specialized to one size")
        emitted = em.emit_kernels(kernels, emit, name, kind, file)
        failed = next((k for k in kernels if k.binary is None), None)
        if failed is not None:
            _err(f"note: could not compile for {name}: {failed.compile_error or 'no compiler on this machine'}")
    elif emit == "schedule":
        emitted = em.emit_schedule(prog.schedule(dims), file)
    else:
        _search_with_progress(prog, device, dims, None, running=False)
        listed = _is_list(device, shard)
        kernels = prog.compile(device=device, dims=dims, shard=shard) if listed else prog.compile(device=device,
                                                                                                 dims=dims)
        if listed:  # which device runs which kernel (each distinct kernel is shown once below)
            runs: dict[str, list[str]] = {}
            for dev_name, k in prog.device_kernels(device, dims, shard):
                runs.setdefault(dev_name, []).append(k.name)
            for dev_name, ks in runs.items():
                _err(f"{dev_name} runs {len(ks)} kernel{'s' if len(ks) != 1 else ''}: {', '.join(ks)}")
        emitted = em.emit_kernels(kernels, emit, name, kind, file)
        failed = next((k for k in kernels if k.binary is None), None)
        if failed is not None:
            _err(f"note: could not compile for {name}: {failed.compile_error or 'no compiler on this machine'}")
    if outdir:
        done = em.write_dir(outdir, emitted)
        n, gone = len(done.paths), len(done.removed)
        _err(f"wrote {n} file{'s' if n != 1 else ''} to {outdir}"
             + (f" (removed {gone} file{'s' if gone != 1 else ''} of an earlier compile there)" if gone else ""))
        for path in done.kept:
            _err(f"note: kept {path}: an earlier compile wrote it, and it has changed since")
        for path, reason in done.unremoved:
            _err(f"note: {path}, of an earlier compile, could not be removed: {reason} (a later compile "
                 "tries again)")
        for path, backup in done.set_aside:
            _err(f"note: {em.set_aside_note(path, backup)}")
        if done.unsigned:
            where = em.key_path() or "its cache directory"
            _err(f"note: tgc could not keep its key in {where} (not writable), so a later compile into {outdir} "
                 "will not know these files as tgc's: it sets them aside as .orig instead of replacing or removing "
                 "them")
    elif show:
        em.show(emitted, _color_stdout())
    return kernels


# ---------------------------------------------------------------------------------------------------------------
# tgc bench, tgc beam


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@device_options
@dims_option
@input_options
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--repeat", type=click.IntRange(1, 1_000_000), default=20, show_default=True,  # (executable.MAX_REPEAT)
              help="Timed runs per kernel.")
@click.option("--beam", type=click.IntRange(min=0), help="BEAM-search width before timing (else $BEAM).")
@click.option("--vs", type=click.Choice(["numpy"]), help="Also time numpy on the same inputs.")
@click.option("--baseline", metavar="OLD.json", callback=nonempty_path,
              help="Compare with a saved `tgc bench --json`; exit 1 on regression.")
@shard_option
@click.option("--symbolic", is_flag=True, help="Time the kernels compiled once for the sizes' class.")
@json_option
@profile_option
def bench(file: str, device: str | None, dims: dict[str, int], pairs: list[tuple[str, str]], npz: str | None,
          cast: bool, seed: int, repeat: int, beam: int | None, vs: str | None, baseline: str | None,
          shard: dict[str, int], symbolic: bool, as_json: bool) -> None:
    """Time each kernel of FILE (a `.tg` program or a package) and the whole program on device-resident inputs
    (random unless given)."""
    from tgc.cli import inputs as inp
    from tgc.cli import report

    warm = None if pairs or npz or beam is not None or vs else _warm_entry(file, device, dims, shard, lists=True,
                                                                            symbolic=symbolic)
    if warm is not None:  # the program cache holds this program at these dims: time it without compiling
        entry, dev_name = warm
        old = report.load_baseline(baseline) if baseline else None
        arrays = _random_inputs(entry, seed)
        if old is not None:
            report.check_baseline(old, entry.identity(dev_name), baseline)
        if not as_json and _stderr_tty():
            _err(f"timing {file} ({repeat} runs per kernel) ...")
        _bench_report(entry.bench_result(dev_name, arrays, repeat), old, baseline, as_json)
        return
    prog = _load_any(file)
    pkg = _is_pkg(prog)
    if pkg:
        _no_list_for_package(device, shard, prog)
    if pkg and (beam or vs):
        raise click.UsageError(f"{'--beam' if beam else '--vs numpy'} needs the program's source, not a package")
    _warn(inp.check_dims(prog, dims, require_all=False))
    # a -D the program lacks: the warning above (not an error after it), then dropped, so that it is no part of the
    # program cache's key (a run with it compiled again and stored a second entry)
    dims = {k: v for k, v in dims.items() if k in prog.dim_names}
    old = report.load_baseline(baseline) if baseline else None
    notes: list[str] = []
    given = inp.gather(prog, npz, pairs, cast, notes)
    _warn(notes)
    arrays = inp.fill_random(prog, given, prog.resolve_dims(dims) if pkg else dims, seed)
    run_dims, arrays = inp.bind(prog, arrays, dims)
    if old is not None:  # refuse a baseline of another program, dims, device or tgc version before timing
        report.check_baseline(old, prog.identity(device, run_dims), baseline)
    kwargs: dict[str, Any] = {"device": device, "dims": run_dims, "repeat": repeat, "beam": beam, "inputs": arrays}
    if _is_list(device, shard):
        if symbolic:
            raise click.UsageError("--symbolic runs on one device, not a device list")
        kwargs["shard"] = shard
    if symbolic:
        if pkg:
            raise _no_symbolic_flag(prog)
        kwargs["symbolic"] = True
    if not pkg:
        _search_with_progress(prog, device, run_dims, beam)
    if not as_json and _stderr_tty():
        _err(f"timing {file} ({repeat} runs per kernel) ...")
    result = prog.bench(**kwargs)
    if vs == "numpy":  # the baseline lives outside the compiler: the command line times it
        from tgc.baselines.numpy_eval import time_numpy

        result["numpy"] = time_numpy(prog, run_dims, arrays, repeat, result["program"]["median_s"])
    _bench_report(result, old, baseline, as_json)


def _bench_report(result: dict[str, Any], old: dict | None, baseline: str | None, as_json: bool) -> None:
    """`tgc bench`'s output (the table or --json) and its comparison with --baseline (exit 1 on a regression)."""
    from tgc.cli import report

    rows = report.compare_baseline(result, old) if old is not None else None
    regressions = [r for r in rows or [] if r["regressed"]]
    if as_json:
        doc = dict(result)
        ratio = report.numpy_ratio(result)
        if ratio is not None:
            doc.setdefault("numpy_ratio", ratio)
        if rows is not None:
            doc["baseline"] = {"path": baseline, "rows": rows, "regressions": len(regressions)}
        _echo_json(doc)
    else:
        from tgc.cli.outputs import make_console

        console = make_console()
        console.print(report.bench_table(result, rows))
        if "collectives" in result:
            console.print(report.collectives_note(result), highlight=False)
        else:
            console.print(report.peak_note(result), highlight=False, style="dim")
        if result.get("recompute"):
            console.print(report.recompute_note(result["recompute"]), highlight=False)
        elif "recompute" in result:  # (a warm run whose program-cache entry does not hold it)
            console.print(report.RECOMPUTE_UNKNOWN, highlight=False)
        ratio = report.numpy_ratio(result)
        if ratio is not None:
            word = "faster" if ratio >= 1 else "slower"
            console.print(f"numpy: {report.fmt_time(result['numpy'].get('median_s'))}; tgc is "
                          f"{ratio if ratio >= 1 else 1 / ratio:.2f}x {word}", highlight=False)
    if regressions:
        names = ", ".join(f"{r['name']} ({100 * r['change']:+.0f}%)" for r in regressions)
        raise TgcError(f"{len(regressions)} regression{'s' if len(regressions) > 1 else ''} against {baseline}: "
                       f"{names}", kind="runtime")


PROCESS_START_MAX_S = 10.0  # a process older than this when `tgc beam` starts was not started to run it


def _process_start() -> float:
    """This process' start as a `time.perf_counter()` value (Linux: from /proc; elsewhere: now), so that `tgc beam
    --budget` bounds the whole command, interpreter start and imports included."""
    import time

    now = time.perf_counter()
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time, clock ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    # a process that ran other things before this command (a test calling the CLI in-process): from now
    return now - age if 0.0 <= age < PROCESS_START_MAX_S else now


@main.command("beam")
@cluster_option
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@device_options
@dims_option
@click.option("--width", type=click.IntRange(min=1), default=4, show_default=True, help="Beam width.")
@click.option("--force", is_flag=True, help="Search again even where a stored winner is wide enough.")
@click.option("--budget", "budget", type=click.FloatRange(min=0), default=None, metavar="SECONDS", callback=_finite,
              help="Bound the whole command's wall time (spread by each kernel's estimated share of the program; "
                   "default 20; 0: unbounded; kernels left when it is spent are searched by a later run).")
@shard_option
@json_option
def beam_(file: str, device: str | None, dims: dict[str, int], width: int, force: bool, budget: float | None,
          shard: dict[str, int], as_json: bool) -> None:
    """BEAM-search the optimizations of every kernel of FILE and store the winners in the cache.

    A kernel whose stored winner came from a search at least as wide is not searched again (unless --force).
    """
    from tgc.cli import report
    from tgc.cli.inputs import check_dims
    from tgc.codegen.search import DEFAULT_BUDGET_S

    started = _process_start()
    prog = _load(file)
    _warn(check_dims(prog, dims, require_all=True))
    progress, close = report.progress_bar(_stderr_tty())
    try:
        extra = {"shard": shard} if _is_list(device, shard) else {}
        budget_s = DEFAULT_BUDGET_S if budget is None else (budget or None)
        result = prog.beam(device=device, dims=dims, width=width, progress=progress, force=force,
                           budget_s=budget_s, started=started, **extra)
    finally:
        close()
    if as_json:
        _echo_json(result)
    else:
        from tgc.cli.outputs import make_console

        make_console().print(report.beam_table(result))
        make_console().print(report.beam_time(result))
        for line in (report.structure_check_line(result), report.program_check_line(result)):
            if line:
                make_console().print(line)
    if result.get("interrupted"):
        _err("beam: interrupted (the table says what each kernel stored; the next `tgc beam` searches the kernels "
             "whose search did not finish)")
        click.get_current_context().exit(130)


# ---------------------------------------------------------------------------------------------------------------
# tgc inspect


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@dims_option
@json_option
def inspect(file: str, dims: dict[str, int], as_json: bool) -> None:
    """Show a package: its device, dims, signature, kernels and planned peak memory (after validating it); or an
    ONNX model: its opset, inputs, outputs, the ops it uses and any op tgc lacks.
    A package for every size (compiled without -D) shows its size classes, symbolic shapes and peak memory as
    an expression of the dims; with -D, also the package at those sizes."""
    from tgc.cli.onnx_cmds import inspect_onnx, is_onnx
    from tgc.package import is_package, load_package

    if is_onnx(file):  # a model: opset, inputs, outputs, ops (and the ones tgc lacks), before anything runs
        return inspect_onnx(file, as_json)
    if not is_package(file):
        raise TgcError(f"{file} is not a package", hint="write one with: tgc compile FILE -D ... --package OUT.tgpkg")
    pkg = load_package(file)
    from tgc.cli.inputs import check_dims

    _warn(check_dims(pkg, dims, require_all=False))  # a -D the program lacks: a warning, as for tgc run
    dims = {k: v for k, v in dims.items() if k in pkg.dim_names}
    if pkg.symbolic:
        doc = pkg.describe(dims or None)
        if as_json:
            _echo_json(doc)
            return
        _inspect_symbolic(file, doc)
        if "at" not in doc:
            return
        doc = doc["at"]
        click.echo(f"at {', '.join(f'{k}={v}' for k, v in doc['dims'].items())}:")
    else:
        pkg.resolve_dims(dims)
        doc = pkg.describe()
        if as_json:
            _echo_json(doc)
            return
    from tgc.cli.report import fmt_bytes

    if "devices" in doc:  # a device list's package (tgc.package.MultiPackage)
        click.echo(f"package: {file} (format {doc['format_version']}, tgc {doc['tgc_version']}, "
                   f"sha256 {doc['content_hash'][:16]})")
        click.echo(f"program: {doc['program']['file']}")
        for d in doc["devices"]:
            click.echo(f"device:  {d['name']} (binaries for {d['target']})")
        click.echo("dims:    " + (", ".join(f"{k}={v}" for k, v in doc["dims"].items()) or "(none)"))
        click.echo("shard:   " + (", ".join(f"{k} along axis {v}" for k, v in doc["shard"].items()) or "(none)"))
        for what in ("inputs", "outputs"):
            for d in doc[what]:
                click.echo(f"{what[:-1]:<7}  {d['name']}: {d['dtype']}{d['shape']}")
        for k in doc["kernels"]:
            click.echo(f"kernel   {k['name']} on {k['device']}: global {k['global_size']}, buffers {k['buffers']}")
        click.echo(f"steps:   {', '.join(doc['steps'])}")
        for m in doc["memory"]:
            click.echo(f"memory:  {m['device']}: planned peak {fmt_bytes(m['peak_bytes'])} in {len(m['slots'])} "
                       "allocations")
        return

    dev = doc["device"]
    click.echo(f"package: {file} (format {doc['format_version']}, tgc {doc['tgc_version']}, "
               f"sha256 {doc['content_hash'][:16]})")
    click.echo(f"program: {doc['program']['file']}")
    click.echo(f"device:  {dev['name']} (binaries for {dev['target']}; compiler {dev['compiler']})")
    click.echo("dims:    " + (", ".join(f"{k}={v}" for k, v in doc["dims"].items()) or "(none)"))

    def io_line(d: dict) -> str:
        declared = f"[{', '.join(d['declared'])}]"
        concrete = f"[{', '.join(map(str, d['shape']))}]"
        return f"  {d['name']:<12} {d['dtype']}{declared}" + (f" = {concrete}" if declared != concrete else "")

    click.echo(f"inputs ({len(doc['inputs'])}):")
    for d in doc["inputs"]:
        click.echo(io_line(d))
    click.echo(f"outputs ({len(doc['outputs'])}):")
    for d in doc["outputs"]:
        click.echo(io_line(d))
    click.echo(f"kernels ({len(doc['kernels'])}):")
    for i, k in enumerate(doc["kernels"]):
        local = f" local {k['local_size']}" if k["local_size"] else ""
        click.echo(f"  {i:>3} {k['name']:<28} global {k['global_size']}{local} buffers {k['buffers']} "
                   f"binary {fmt_bytes(k['binary_bytes'])}")
    click.echo(f"buffers ({len(doc['buffers'])}):")
    for b in doc["buffers"]:
        where = f"allocation {b['slot']}" if b["slot"] is not None else "not allocated (no kernel writes it)"
        click.echo(f"  {b['index']:>3} {b['role']:<6} {b['name'] or '':<12} {b['dtype']}{b['shape']} "
                   f"{fmt_bytes(b['nbytes'])}, {where}")
    mem = doc["memory"]
    click.echo(f"memory:  planned peak {fmt_bytes(mem['peak_bytes'])} in {len(mem['slots'])} allocations "
               f"(inputs {fmt_bytes(mem['input_bytes'])}, outputs {fmt_bytes(mem['output_bytes'])}, "
               f"{mem['intermediates']} intermediates in {mem['intermediate_slots']}; "
               f"one allocation per buffer would take {fmt_bytes(mem['unshared_bytes'])})")


def _inspect_symbolic(file: str, doc: dict) -> None:
    dev = doc["device"]
    click.echo(f"package: {file} (format {doc['format_version']}, tgc {doc['tgc_version']}, "
               f"sha256 {doc['content_hash'][:16]})")
    click.echo(f"program: {doc['program']['file']}")
    click.echo(f"device:  {dev['name']} (binaries for {dev['target']}; compiler {dev['compiler']})")
    click.echo(f"dims:    {', '.join(doc['dim_names'])} (symbolic: sizes come from the inputs at each run)")
    click.echo(f"inputs ({len(doc['inputs'])}):")
    for d in doc["inputs"]:
        click.echo(f"  {d['name']:<12} {d['dtype']}[{', '.join(d['declared'])}]")
    click.echo(f"outputs ({len(doc['outputs'])}): " + ", ".join(d["name"] for d in doc["outputs"]))
    for c in doc["classes"]:
        click.echo(f"size class {c['sizes']}:")
        for i, k in enumerate(c["kernels"]):
            fast = k["fast"]
            extra = "" if not k.get("checks") else "; serves sizes where " + " and ".join(k["checks"])
            extra += "" if fast is None else (f"; fast variant (global {fast['global_size']}) where "
                                              + (" and ".join(fast["checks"]) or "always"))
            click.echo(f"  {i:>3} {k['name']:<28} sizes ({', '.join(k['vals'])}){extra}")
        for b in c["buffers"]:
            click.echo(f"      buffer {b['index']:>3} {b['role']:<6} {b['name'] or '':<12} {b['dtype']}"
                       f"[{', '.join(b['shape'])}] allocation {b['slot']}")
        mem = c["memory"]
        short = mem.get("peak_short")
        click.echo(f"  memory: planned peak {short or mem['peak_bytes']} bytes in {len(mem['slots'])} allocations")
        if short and short != mem["peak_bytes"]:
            click.echo(f"    (as the plan writes it: {mem['peak_bytes']})")
    for s in doc["skipped"]:
        click.echo(f"not packaged: {s['sizes']}: {s['why']}")


# ---------------------------------------------------------------------------------------------------------------
# tgc devices


@main.command()
@json_option
def devices(as_json: bool) -> None:
    """List every backend: available or not (and why), renderer, compiler, version, peak figures (a GPU's from
    its clocks; the CPU's as `tgc bench` measured it, once it has)."""
    import time

    from tgc.api import devices as list_devices

    rows = list_devices(info=True)
    if as_json:
        _echo_json(rows)
        return
    from rich.markup import escape
    from rich.table import Table

    from tgc.cli.outputs import make_console

    table = Table(show_edge=False, header_style="bold")
    for col in ("device", "available", "why not", "renderer", "compiler", "version", "peak"):
        table.add_column(col, overflow="fold")
    for r in rows:
        peak = ", ".join(p for p in (f"{r['peak_gflops']:.4g} GFLOP/s" if r["peak_gflops"] else "",
                                     f"{r['peak_gbps']:.4g} GB/s" if r["peak_gbps"] else "") if p)
        if peak and r.get("peak_source") == "measured":  # (the CPU's, from an earlier `tgc bench`)
            when = r.get("peak_measured")
            peak += f" (measured{time.strftime(' %Y-%m-%d', time.localtime(when)) if when else ''})"
        cells = [str(c) for c in (r["why_not"], r["renderer"] or "-", r["compiler"] or "-", r["version"] or "-")]
        device = f"{r['device']} ({r['server']})" if r.get("server") else r["device"]  # one of several servers
        table.add_row(escape(device), "[green]yes[/green]" if r["available"] else "[red]no[/red]",
                      *(escape(c) for c in cells), peak or "-")  # a REMOTE server's words are not markup
    console = make_console()
    console.print(table)
    for r in rows:
        if (r.get("info") or {}).get("device_list"):
            console.print(f"{r['device']}: {r['info']['device_list']}", highlight=False, markup=False)


# ---------------------------------------------------------------------------------------------------------------
# tgc cache

CACHE_TABLES = ("compile", "beam", "peak", "probe", "program")


@main.group()
def cache() -> None:
    """The on-disk cache ($TGC_CACHE_DIR): compiled kernels, whole programs, BEAM results, measured peaks.

    Tables: compile (compiled kernels), program (whole programs compiled for a device and dims: a warm run
    compiles nothing), beam (BEAM winners), peak (measured device peaks), probe (device probes)."""


def _usable_cache() -> None:
    """A cache location that cannot hold a cache (a path through a file, a directory without permission) is the
    command's one error (exit 2: the setting is at fault)."""
    from tgc import cache as c

    why = c.problem()
    if why is not None:
        raise TgcError(f"the cache at {c.cache_dir()} cannot be used: {why}",
                       hint="set TGC_CACHE_DIR to a directory you can write (it is created where missing)")


def _unusable(c: Any) -> TgcError:
    """A database that failed when used (locked, corrupt): the command's one error (exit 1)."""
    return TgcError(c.last_problem() or f"cannot use the cache database {c.db_path()}", kind="runtime")


def _table_option(f: Callable) -> Callable:
    return click.option("--table", type=click.Choice([*CACHE_TABLES, "all"]), default="all", show_default=True,
                        help="Which part of the cache.")(f)


def _fmt_bytes(n: int) -> str:
    from tgc.cli.report import fmt_bytes
    return fmt_bytes(n, ".1f")


@cache.command("stats")
@json_option
def cache_stats(as_json: bool) -> None:
    """Where the cache is, its size, and how many entries each table holds."""
    from tgc import cache as c

    _usable_cache()
    with c.quiet():
        stats = c.stats()
    if not stats.get("available", True):
        raise _unusable(c)
    if as_json:
        _echo_json({"cache_dir": str(c.cache_dir()), **stats})
        return
    click.echo(f"directory: {c.cache_dir()}")
    click.echo(f"database:  {stats.get('path', c.db_path())} ({_fmt_bytes(int(stats.get('size') or 0))})")
    for table, count in (stats.get("entries") or {}).items():
        click.echo(f"{table + ':':<10} {count} entr{'y' if count == 1 else 'ies'}")
    count = int(stats.get("count") or 0)
    click.echo(f"compiled:  {_fmt_bytes(int(stats.get('compiled_bytes') or 0))} of a "
               f"{_fmt_bytes(int(stats.get('max_bytes') or 0))} cap (TGC_CACHE_MAX_BYTES); "
               f"{count} entr{'y' if count == 1 else 'ies'} in all")
    if not stats.get("enabled", True):
        click.echo("state:     compile cache off (DISABLE_COMPILER_CACHE)")


@cache.command("list")
@_table_option
@json_option
def cache_list(table: str, as_json: bool) -> None:
    """List the cache entries, newest first."""
    import time

    from tgc import cache as c

    _usable_cache()
    with c.quiet():
        rows = list(c.entries(None if table == "all" else table))
    if c.last_problem() is not None:
        raise _unusable(c)
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        click.echo("the cache is empty" if table == "all" else f"no {table} entries")
        return
    from rich.markup import escape
    from rich.table import Table

    from tgc.cli.outputs import make_console

    t = Table(show_edge=False, header_style="bold")
    for col, justify in (("table", "left"), ("key", "left"), ("size", "right"), ("created", "left"),
                         ("what", "left")):
        t.add_column(col, justify=justify, overflow="fold")
    for r in rows:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created"])) if r.get("created") else "-"
        t.add_row(str(r.get("table")), str(r.get("key")), _fmt_bytes(int(r.get("size") or 0)), created,
                  escape(str(r.get("meta") or "")))  # (a program named `[draft]sm.tg` is not markup)
    make_console().print(t)


@cache.command("clear")
@_table_option
def cache_clear(table: str) -> None:
    """Delete cache entries (all of them, or one table's)."""
    from tgc import cache as c

    _usable_cache()
    if c.absent():
        click.echo(f"nothing to clear: no cache at {c.cache_dir()}")
        return
    try:
        removed = c.clear(None if table == "all" else table, strict=True)
    except c.ClearError as e:
        why = str(e)
        hint = ("wait for the process that holds it" if "locked" in why else
                "check the file's permissions" if "readonly" in why or "ermission" in why else None)
        raise TgcError(why, kind="runtime", hint=hint) from None
    what = "the cache" if table == "all" else f"the {table} table"
    click.echo(f"cleared {what}: {removed} entr{'y' if removed == 1 else 'ies'} removed")


# ---------------------------------------------------------------------------------------------------------------
# tgc serve


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@device_options
@dims_option
@shard_option
@click.option("-o", "--output", "out", metavar="PAGE.html", default="viz.html", show_default=True,
              callback=nonempty_path,
              help="Where to write the page.")
@click.option("--open", "open_browser", is_flag=True, help="Open the page in the system's browser.")
@click.option("--serve", "port", type=click.IntRange(0, 65535), metavar="PORT",
              help="Also serve the page on http://127.0.0.1:PORT/ until interrupted.")
@click.option("--repeat", type=click.IntRange(1, 1_000_000), default=5, show_default=True,  # (executable.MAX_REPEAT)
              help="Timed runs per kernel.")
@click.option("--no-measure", is_flag=True, help="Do not run the kernels (no times, no peak measurement).")
def viz(file: str, device: str | None, dims: dict[str, int], shard: dict[str, int], out: str,
        open_browser: bool, port: int | None, repeat: int, no_measure: bool) -> None:
    """Write one self-contained HTML page that shows FILE (a `.tg` program or a package) inside: its tensor
    graph, kernels with their measured times, each kernel's AST after every pass and its source, a roofline."""
    from tgc.cli.inputs import check_dims
    from tgc.cli.outputs import check_writable, not_over_user_files, write_files
    from tgc.viz import build_page, check_port, serve

    prog = _load_any(file)
    if type(prog).__name__ == "MultiPackage":
        raise TgcError(f"{file} is a device-list package: tgc viz shows a program or a one-device package",
                       hint="run tgc viz on the .tg program with the same -d list and --shard")
    if _is_pkg(prog):
        _no_list_for_package(device, shard)
        dims = {k: v for k, v in dims.items() if k in prog.dim_names}
    else:
        _warn(check_dims(prog, dims, require_all=True))
    _is_list(device, shard)  # (--shard without a device list: a usage error)
    check_writable(out)  # before the work, not after it (a missing directory, a directory, no permission)
    not_over_user_files("-o", out, [(f"the program {file}", file)])
    _not_over_other_files(out)
    if port is not None:
        check_port(port)
    page = build_page(prog, device, dims, shard=shard or None, measure=not no_measure, repeat=repeat,
                           filename=file)
    data = page.encode("utf-8")
    write_files([(out, lambda f: f.write(data))])
    _err(f"wrote {out} ({len(data) / 1e6:.2f} MB)")
    if open_browser:
        import pathlib
        import webbrowser

        webbrowser.open(pathlib.Path(out).resolve().as_uri())
    if port is not None:
        serve(page, port, ready=lambda url: _err(f"serving {out} at {url} (Ctrl-C stops)"))


def _finite_seconds(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A time option's value, refused (exit 2) when it is nan or inf: such a time never ends anything."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds")
    return value


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=6667, show_default=True, help="Port to listen on.")
@click.option("-d", "--device", metavar="DEV", envvar="TGC_DEVICE", show_envvar=True, help="The device to serve.")
@click.option("--token-file", metavar="F",
              help="File holding the token clients must send, or one 'NAME TOKEN' line per client (else "
                   "$TGC_REMOTE_TOKEN).")
@click.option("--idle-timeout", type=click.FloatRange(min=0), metavar="SECONDS", callback=_finite_seconds,
              help="Drop a client session idle this long.")
@click.option("--max-sessions", type=click.IntRange(min=1), metavar="N", help="Most client sessions at once.")
@click.option("--max-body", type=click.IntRange(min=1), metavar="BYTES", help="Largest request body.")
@click.option("--max-buffer", type=click.IntRange(min=1), metavar="BYTES", help="Largest single buffer.")
@click.option("--max-session-memory", type=click.IntRange(min=1), metavar="BYTES",
              help="Most live device memory per client session.")
@click.option("--request-time", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              callback=_finite_seconds,
              help="Deadline of one request: reading it, running its batch (kernels included) and answering "
                   "(more than 0).")
@click.option("--max-memory", type=click.IntRange(min=1), metavar="BYTES",
              help="Most live device memory of all sessions together.")
@click.option("--max-sessions-per-client", type=click.IntRange(min=1), metavar="N",
              help="Most sessions of one client address.")
@click.option("--max-sessions-per-token", type=click.IntRange(min=1), metavar="N",
              help="Most sessions of one token (of one address when serving without a token).")
@click.option("--max-connections", type=click.IntRange(min=1), metavar="N", help="Most open connections.")
@click.option("--max-connections-per-client", type=click.IntRange(min=1), metavar="N",
              help="Most open connections of one client address that have not yet shown a token.")
@click.option("--no-inline", is_flag=True,
              help="Run every CPU launch in a launch worker, none proven short in the server's own process.")
@click.option("-v", "--verbose", is_flag=True, help="Log each request to stderr.")
def serve(host: str, port: int, device: str | None, token_file: str | None, idle_timeout: float | None,
          max_sessions: int | None, max_body: int | None, max_buffer: int | None, max_session_memory: int | None,
          request_time: float | None, max_memory: int | None, max_sessions_per_client: int | None,
          max_sessions_per_token: int | None, max_connections: int | None, max_connections_per_client: int | None,
          no_inline: bool, verbose: bool) -> None:
    """Serve a device over HTTP for the REMOTE device of other machines (until Ctrl-C)."""
    from tgc.backends.remote.server import main_serve

    try:
        rc = main_serve(host=host, port=port, device=device, token_file=token_file, idle_timeout=idle_timeout,
                        max_sessions=max_sessions, max_body=max_body, max_buffer=max_buffer,
                        max_session_memory=max_session_memory, request_time=request_time, verbose=verbose,
                        max_memory=max_memory, max_sessions_per_client=max_sessions_per_client,
                        max_sessions_per_token=max_sessions_per_token,
                        max_connections=max_connections, max_connections_per_client=max_connections_per_client,
                        inline=not no_inline)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM before the serve loop took over: still a clean stop
        _err("tgc serve: interrupted")
        rc = 0
    if rc:
        click.get_current_context().exit(rc)


main.add_command(cluster_worker)
def _add_onnx_commands() -> None:
    from tgc.cli.onnx_cmds import IMPORT_DIMS_HELP, import_

    import_.params.append(click.Option(["-D", "dims"], multiple=True, metavar="NAME=INT", callback=_parse_dims,
                                       help=IMPORT_DIMS_HELP))
    main.add_command(import_)  # `tgc import model.onnx -o model.tg`
    from tgc.cli.staged_cmds import add_compile_inputs

    add_compile_inputs(compile_)  # -i/--inputs/--random: every stage of a model run in stages


_add_onnx_commands()

if __name__ == "__main__":
    main()
