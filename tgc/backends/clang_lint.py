"""Type-checking kernel sources with libclang, in-process, for devices this machine cannot compile for or run.

One machinery serves every C-family dialect: a `ClangLinter` parses a source (`-fsyntax-only`) with clang's
arguments for the language and a set of in-memory headers (nothing is written to disk, no system header is
read), and turns clang's errors into `LintDiagnostic`s and a `CompileError` at the first error's line and
column. A dialect subclass says which warnings matter and how clang's words read in the dialect's terms:

- METAL (`tgc.backends.metal`): C++17 against a stub `<metal_stdlib>`;
- OPENCL (`tgc.backends.opencl`): OpenCL C 1.2 for `spir64`, with clang's own declarations of every OpenCL
  builtin (`-fdeclare-opencl-builtins`) over a stub `opencl-c-base.h` of the types and macros (pip's libclang
  ships no OpenCL headers). This checks every builtin call's overloads as a real OpenCL compiler would.

The check catches syntax and type errors, not a driver's own limits. Results are cached by source text.
libclang is imported on the first lint, never at module import.
"""

from __future__ import annotations

import atexit
import functools
import threading
from dataclasses import dataclass
from typing import Any

from tgc.errors import CompileError

INSTALL_HINT = "pip install libclang (or 'tgc[metal]')"


@dataclass(frozen=True)
class LintDiagnostic:
    """One clang error in a kernel source (or in a stub header, which would be a tgc bug)."""

    file: str
    line: int
    col: int
    message: str
    text: str | None = None  # the source line

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: error: {self.message}"


@functools.cache
def _libclang() -> tuple[Any, Any]:
    """(clang.cindex, an Index), loaded once; CompileError when libclang is missing or cannot load."""
    try:
        from clang import cindex
    except ImportError as e:
        raise CompileError(f"libclang is not installed ({e})", hint=INSTALL_HINT) from None
    try:
        index = cindex.Index.create()
    except Exception as e:  # cindex.LibclangError: the Python bindings are there but the shared library is not
        raise CompileError(f"libclang could not be loaded ({e})", hint=INSTALL_HINT) from None
    # drop the Index before interpreter teardown, while cindex can still free it
    atexit.register(_libclang.cache_clear)
    return cindex, index


@functools.cache
def libclang_error() -> str | None:
    """Why the clang type-check cannot run here, or None when it can."""
    try:
        _libclang()
    except CompileError as e:
        return f"{e.msg}; install it with {INSTALL_HINT}"
    return None


@functools.cache
def libclang_version() -> str | None:
    """The version of the `libclang` package, or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("libclang")
    except PackageNotFoundError:
        return None


class ClangLinter:
    """Parses a source with `args` against in-memory `headers` ({path: text}); see the module docstring.

    Subclasses set `args`, `headers`, `what` (the language's name in messages) and may override `keep`
    (which diagnostics count, and in whose words) and `default_filename`.
    """

    what = "C"
    root = "/tgc-lint"  # where the in-memory files live
    args: tuple[str, ...] = ()
    header_names: dict[str, str] = {}  # virtual path -> how messages name it

    def __init__(self, headers: dict[str, str]):
        self.headers = headers
        self._lock = threading.Lock()  # one parse at a time on the shared Index
        self._cache: dict[tuple[str, str], tuple[LintDiagnostic, ...]] = {}

    @property
    def version(self) -> str:
        return f"libclang-{libclang_version() or 'missing'}"

    def default_filename(self, src: str) -> str:
        return "kernel.c"

    def diagnostics(self, src: str, filename: str | None = None) -> list[LintDiagnostic]:
        filename = filename or self.default_filename(src)
        key = (filename, src)
        if key not in self._cache:
            if len(self._cache) > 512:
                self._cache.clear()
            self._cache[key] = tuple(self._parse(src, filename))
        return list(self._cache[key])

    def lint(self, src: str, filename: str | None = None) -> None:
        """Raise CompileError (clang's message, at the first error's line and column) unless `src` type-checks."""
        filename = filename or self.default_filename(src)
        errors = self.diagnostics(src, filename)
        if not errors:
            return
        first = errors[0]
        hint = self.note
        if len(errors) > 1:
            hint += f"; {len(errors) - 1} more error{'s' if len(errors) > 2 else ''}:\n    " + \
                "\n    ".join(str(d) for d in errors[1:10])
        err = CompileError(first.message, file=first.file, line=first.line, col=first.col, text=first.text, hint=hint)
        err.diagnostics = errors  # type: ignore[attr-defined]
        raise err

    @property
    def note(self) -> str:
        return f"clang type-checked the {self.what} source"

    def keep(self, severity: int, message: str, option: str, cindex: Any) -> str | None:
        """The message to report for a diagnostic, or None to drop it. Default: errors, as clang says them."""
        return message if severity >= cindex.Diagnostic.Error else None

    def _parse(self, src: str, filename: str) -> list[LintDiagnostic]:
        cindex, index = _libclang()
        path = f"{self.root}/{filename}"
        with self._lock:
            tu = index.parse(path, args=list(self.args), unsaved_files=[(path, src), *self.headers.items()])
            raw = [(d.severity, with_notes(d), d.option, user_location(d, path)) for d in tu.diagnostics]
        texts = {path: src.splitlines(), **{p: t.splitlines() for p, t in self.headers.items()}}
        out: list[LintDiagnostic] = []
        for severity, message, option, loc in raw:
            kept = self.keep(severity, message, option, cindex)
            if kept is None:
                continue
            fname = loc.file.name if loc.file is not None else path
            lines = texts.get(fname, [])
            text = lines[loc.line - 1] if 0 < loc.line <= len(lines) else None
            shown = filename if fname == path else self.header_names.get(fname, fname)
            out.append(LintDiagnostic(shown, loc.line, loc.column, kept, text))
        return out


def with_notes(diag: Any) -> str:
    """clang's message, with the notes that explain it (why a candidate function does not fit, say)."""
    notes = [n.spelling for n in diag.children
             if n.spelling != "candidate function"
             and not n.spelling.startswith(("in file included from", "in instantiation of"))]
    return diag.spelling + (f" ({'; '.join(notes[:3])})" if notes else "")


def user_location(diag: Any, path: str) -> Any:
    """Where in the kernel source an error is: an error inside a stub header (a failed `static_assert`, say) is
    reported at the kernel line its notes lead back to."""
    loc = diag.location
    if loc.file is not None and loc.file.name == path:
        return loc
    for note in diag.children:
        at = note.location
        if at.file is not None and at.file.name == path and not note.spelling.startswith("in file included from"):
            return at
    return loc
