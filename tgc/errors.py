"""The one exception type users see, with source positions for `.tg` errors."""

from __future__ import annotations

from collections.abc import Iterable


class TgcError(Exception):
    """An error a user can act on.

    `kind` is "user" (bad input: exit 2) or "runtime" (compile or device failure: exit 1).
    Source errors carry `file`, `line`, `col` (1-based), `end_col` and the source `text` of that line,
    so `format()` can print a clang-style diagnostic with carets under the span.
    `hint` is worded for any caller (the Python API); `cli_hint`, where given, is the same advice as the command
    line words it (naming its flags), and the CLI shows it instead.
    """

    def __init__(self, msg: str, *, line: int | None = None, col: int | None = None, end_col: int | None = None,
                 file: str | None = None, text: str | None = None, hint: str | None = None, kind: str = "user",
                 cli_hint: str | None = None):
        super().__init__(msg)
        self.msg, self.line, self.col, self.end_col = msg, line, col, end_col
        self.file, self.text, self.hint, self.kind = file, text, hint, kind
        self.cli_hint = cli_hint

    @property
    def exit_code(self) -> int:
        return 2 if self.kind == "user" else 1

    def format(self) -> str:
        """`file:line:col: error: msg`, the source line, carets under the span, and a `help:` line."""
        where = self.file or "<input>"
        if self.line is None:
            head = f"error: {self.msg}" if self.file is None else f"{where}: error: {self.msg}"
            return head + (f"\n  help: {self.hint}" if self.hint else "")
        out = [f"{where}:{self.line}:{self.col}: error: {self.msg}"]
        if self.text is not None:
            out.append("    " + self.text.rstrip("\n"))
            start = max((self.col or 1) - 1, 0)
            end = self.end_col if self.end_col and self.end_col > start + 1 else start + 1
            end = min(end, max(len(self.text.rstrip()), start + 1))
            out.append("    " + " " * start + "^" + "~" * (end - start - 1))
        if self.hint:
            out.append(f"  help: {self.hint}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.format() if self.line is not None else self.msg


class BindError(TgcError):
    """An input or dim that `Program.bind` cannot use. `need` says what would fix it ("input": an array for
    input `name`; "dim": the size of dim `name`; "cast": input `name` converted to `dtype`), so that a front
    end can word the hint in its own terms (the command line names its flags); the API's hint is neutral."""

    def __init__(self, msg: str, *, need: str, name: str, dtype: str | None = None, names: list[str] | None = None,
                 **kw):
        super().__init__(msg, **kw)
        self.need, self.name, self.dtype = need, name, dtype
        self.names = names or [name]  # every dim missing ("dim"), all said in one error


def unknown_dims(names: list[str]) -> str:
    """`dim B is unknown`, or for several `dims B, H and T are unknown`: one error names every missing dim."""
    if len(names) == 1:
        return f"dim {names[0]} is unknown"
    return f"dims {', '.join(names[:-1])} and {names[-1]} are unknown"


def dim_flags(names: list[str], value: str = "INT") -> str:
    """`-D B=INT -D H=INT` (the CLI's NAME=INT): the flags that give `names`."""
    return " ".join(f"-D {n}={value}" for n in names)


class CompileError(TgcError):
    """A backend compiler rejected a kernel (exit 1)."""

    def __init__(self, msg: str, **kw):
        kw.setdefault("kind", "runtime")
        super().__init__(msg, **kw)


class DeviceError(TgcError):
    """A device is missing, unreachable or failed while running (exit 1)."""

    def __init__(self, msg: str, **kw):
        kw.setdefault("kind", "runtime")
        super().__init__(msg, **kw)


def edit_distance(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of two neighbours that turn `a` into `b` (the optimal
    string alignment distance), comparing letters case-insensitively."""
    a, b = a.lower(), b.lower()
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[len(b)]


def close_match(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate a did-you-mean may suggest for `name`: a likely typo of it, at most one edit away for a name
    of up to 4 letters and two edits for a longer one (`maen` -> `mean`, `sofmax` -> `softmax`), never a
    different word that merely shares letters (`cumsum` is no `sum`, `foo` no `floor`). Ties go to the first."""
    limit = 1 if len(name) <= 4 else 2
    best, best_d = None, limit + 1
    for c in candidates:
        if c == name:
            continue
        d = edit_distance(name, c)
        if d < best_d and d < max(len(c), len(name)):
            best, best_d = c, d
    return best
