"""The `.tg` front end: source text -> checked structure (`parse`) -> tensor graph for given dims (`trace`).

A file parses with Python's `ast` module; nothing is ever evaluated as Python. Every error is a
`TgcError` with the file, line, column and span of the offending node.

Functions (`def`) and loops (`for i in range(...)`) exist only while tracing: a call runs the function's body in
a scope of its own and a loop runs its body once per value, so the graph is the one the written-out program
builds (the same kernels). Loop bounds are Python ints when tracing (literals, dims, shapes); recursion is
refused by `parse`. docs/LANGUAGE.md is the user's reference of the language.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections import ChainMap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tgc.dsl import functions
from tgc.dsl.tensor import DslError, Tensor, fmt_type
from tgc.dtype import DType, dtypes
from tgc.errors import TgcError, close_match
from tgc.ir.symsize import NotTraceable, SymSize, is_symbolic, type_text
from tgc.ir.uop import Ops, UOp, postorder

# Depth of the operation graph a program may build (a chain of N statements like `y = y * 2 + 1` is 2N
# deep). No walk of the compiler recurses over the graph (they keep explicit stacks: `tgc.ir.walk`), so the
# limit is one of size, not of the Python stack: deeper programs are refused with a clear message.
MAX_DEPTH = 1_000_000
# the C parser recurses over the nesting of one expression: it runs under this (CPython's default) limit,
# so `x + x + ... + x` of thousands of terms is refused before it can exhaust the C stack
PARSE_RECURSION_LIMIT = 1000


def _parse_ast(source: str, filename: str) -> ast.Module:
    old = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(min(old, PARSE_RECURSION_LIMIT))
    except RecursionError:  # already deeper than that: parse under the current limit
        pass
    try:
        return ast.parse(source, filename=filename)
    except (RecursionError, MemoryError):
        raise TgcError("an expression is nested too deeply to parse", file=filename,
                       hint="split long expressions into several statements (y = a + b, then y = y + c ...)") \
            from None
    finally:
        sys.setrecursionlimit(old)


def check_depth(outs: list[UOp]) -> None:
    """Refuse a graph deeper than MAX_DEPTH (computed without recursion)."""
    depth: dict[UOp, int] = {}
    for out in outs:
        for u in postorder(out, depth):  # (outputs sharing a graph: each node walked once)
            if u not in depth:
                depth[u] = 1 + max((depth[s] for s in u.src), default=0)
    deepest = max((depth[o] for o in outs), default=0)
    if deepest > MAX_DEPTH:
        raise TgcError(f"the program is too deep: a chain of {deepest} operations (the limit is {MAX_DEPTH})",
                       hint="split it into several programs, or compute intermediate results in fewer steps")


class DimError(Exception):
    """A dim expression that has no size for the dims given (division by zero, a negative size, an unknown
    dim); `Program.bind` and `trace` place it at the dim's span."""


_DIM_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//"}
_DIM_PREC = {"+": 1, "-": 1, "*": 2, "//": 2}


@dataclass(frozen=True)
class DimExpr:
    """Integer arithmetic of dims in a declaration (`3 * C`, `(N + 1) // 2`): `op` is one of + - * //, the
    operands are ints, dim names or DimExprs. Floor division, as in Python."""
    op: str
    a: int | str | DimExpr
    b: int | str | DimExpr

    def __str__(self) -> str:
        def side(v: int | str | DimExpr, right: bool) -> str:
            if isinstance(v, DimExpr) and (_DIM_PREC[v.op] < _DIM_PREC[self.op] or
                                           (right and _DIM_PREC[v.op] == _DIM_PREC[self.op])):
                return f"({v})"
            return f"({v})" if isinstance(v, int) and v < 0 else str(v)
        return f"{side(self.a, False)} {self.op} {side(self.b, True)}"

    def names(self) -> list[str]:
        out: list[str] = []
        for v in (self.a, self.b):
            for n in ([v] if isinstance(v, str) else v.names() if isinstance(v, DimExpr) else []):
                if n not in out:
                    out.append(n)
        return out


Dim = int | str | DimExpr


def dim_value(d: Dim, dims: dict[str, int]) -> int:
    """The size a declared dim has for these dims (DimError if it has none)."""
    value = _dim_eval(d, dims)
    if value < 0:
        raise DimError(f"the dim {d} is {value}: a size cannot be negative" if isinstance(d, DimExpr) else
                       f"dim {d} = {value} is negative")
    return value


def _dim_eval(d: Dim, dims: dict[str, int]) -> int:
    if isinstance(d, int):
        return d
    if isinstance(d, str):
        if d not in dims:
            raise DimError(f"dim {d} is unknown")
        return dims[d] if isinstance(dims[d], SymSize) else int(dims[d])
    a, b = _dim_eval(d.a, dims), _dim_eval(d.b, dims)
    if d.op == "//":
        if b == 0:
            raise DimError(f"the dim {d} divides by zero ({d.b} = 0)")
        return a // b
    return a + b if d.op == "+" else a - b if d.op == "-" else a * b


def solve_dim(d: DimExpr, size: int, dims: dict[str, int]) -> tuple[str, int] | None:
    """(name, value) such that `d` has `size`, when `d` holds exactly one dim not in `dims`, once, reached
    through + - * only (so its value is unique); None when it cannot be solved that simply (`N // 2`, `N * N`,
    two unknown dims); DimError when no non-negative integer fits (a size 20 for `3 * C`)."""
    unknown = [n for n in d.names() if n not in dims]
    if len(unknown) != 1 or _count(d, unknown[0]) != 1:
        return None
    name, target, node = unknown[0], size, d
    while isinstance(node, DimExpr):
        if node.op == "//":
            return None
        left_has = isinstance(node.a, str) and node.a == name or isinstance(node.a, DimExpr) and \
            name in node.a.names()
        known = _dim_eval(node.b if left_has else node.a, dims)
        if node.op == "+":
            target -= known
        elif node.op == "-":
            target = target + known if left_has else known - target
        else:  # *
            if known == 0:
                return None
            if target % known:
                raise DimError(f"no size of {name} makes {d} equal {size}")
            target //= known
        node = node.a if left_has else node.b
    if node != name:
        return None
    if target < 0:
        raise DimError(f"no size of {name} makes {d} equal {size} ({name} would be {target})")
    return name, target


def _count(d: Dim, name: str) -> int:
    if isinstance(d, DimExpr):
        return _count(d.a, name) + _count(d.b, name)
    return int(d == name)


@dataclass(frozen=True)
class InputDecl:
    name: str
    dtype: DType
    shape: tuple[Dim, ...]
    line: int
    col: int = 1
    end_col: int = 1
    dim_spans: tuple[tuple[int, int], ...] = ()  # per dim: (col, end_col), 1-based, for errors at that dim

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype.name}[{', '.join(map(str, self.shape))}]"

    def span_of(self, axis: int) -> tuple[int, int]:
        """The columns of one dim in the declaration (the whole declaration when unknown)."""
        return self.dim_spans[axis] if axis < len(self.dim_spans) else (self.col, self.end_col)


@dataclass
class Parsed:
    source: str
    filename: str
    inputs: list[InputDecl]
    body: list[ast.stmt]  # assignments
    returns: list[ast.expr]
    output_names: list[str]
    lines: list[str] = field(default_factory=list)
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)  # `def`s by name, checked


class _Errors:
    """Builds positioned TgcErrors for one file."""

    def __init__(self, source: str, filename: str):
        self.lines = source.splitlines()
        self.filename = filename

    def at(self, node: ast.AST | None, msg: str, hint: str | None = None) -> TgcError:
        if node is None or not hasattr(node, "lineno"):
            return TgcError(msg, file=self.filename, hint=hint)
        line = node.lineno
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        col = node.col_offset + 1
        end_line = getattr(node, "end_lineno", line) or line
        end_col = (node.end_col_offset or node.col_offset + 1) if end_line == line else len(text)
        return TgcError(msg, file=self.filename, line=line, col=col, end_col=end_col, text=text, hint=hint)


_CONSTRUCTS = {
    ast.If: "if statements", ast.For: "for loops", ast.While: "while loops", ast.FunctionDef: "function definitions",
    ast.AsyncFunctionDef: "function definitions", ast.ClassDef: "class definitions", ast.Import: "import",
    ast.ImportFrom: "import", ast.Lambda: "lambda", ast.ListComp: "list comprehensions",
    ast.SetComp: "set comprehensions", ast.DictComp: "dict comprehensions", ast.GeneratorExp: "generator expressions",
    ast.With: "with statements", ast.Try: "try statements", ast.Raise: "raise", ast.Assert: "assert",
    ast.Delete: "del", ast.Global: "global", ast.Nonlocal: "nonlocal", ast.Pass: "pass", ast.Break: "break",
    ast.Continue: "continue", ast.Dict: "dicts", ast.Set: "sets", ast.JoinedStr: "f-strings",
    ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield", ast.NamedExpr: "the walrus operator",
    ast.Starred: "starred expressions", ast.BoolOp: "'and'/'or'",
}


def parse(source: str, filename: str = "<string>") -> Parsed:
    """Check the file's structure: declarations, then assignments, then one return."""
    source = source.removeprefix("\ufeff")  # a UTF-8 byte-order mark (`tgc.loads` of a file's text)
    err = _Errors(source, filename)
    try:
        tree = _parse_ast(source, filename)
    except SyntaxError as e:
        line = e.lineno or 1
        text = err.lines[line - 1] if 0 < line <= len(err.lines) else ""
        col = e.offset or 1
        end = e.end_offset if e.end_offset and (e.end_lineno in (None, line)) else col + 1
        msg = (e.msg or "invalid syntax").replace("invalid syntax. ", "")
        raise TgcError(f"syntax error: {msg}", file=filename, line=line, col=col, end_col=end - 1 if end > col else col,
                       text=text) from None

    inputs: list[InputDecl] = []
    body: list[ast.stmt] = []
    returns: list[ast.expr] | None = None
    seen_inputs: set[str] = set()
    defs: dict[str, ast.FunctionDef] = {}
    for stmt in tree.body:
        if returns is not None:
            raise err.at(stmt, "statements after 'return'", hint="'return' must be the last statement")
        if isinstance(stmt, ast.AnnAssign):
            if body:
                raise err.at(stmt, "input declarations must come before assignments")
            decl = _parse_decl(stmt, err)
            if decl.name in seen_inputs:
                raise err.at(stmt.target, f"input '{decl.name}' is declared twice")
            seen_inputs.add(decl.name)
            inputs.append(decl)
        elif isinstance(stmt, ast.FunctionDef):
            if stmt.name in defs:
                raise err.at(stmt, f"function '{stmt.name}' is defined twice", hint="give the second one another name")
            _check_function(stmt, err)
            defs[stmt.name] = stmt
        elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.For)):
            _check_statement(stmt, err, in_function=False)
            body.append(stmt)
        elif isinstance(stmt, ast.Return):
            if stmt.value is None:
                raise err.at(stmt, "'return' needs at least one value")
            returns = list(stmt.value.elts) if isinstance(stmt.value, ast.Tuple) else [stmt.value]
        else:
            _check_statement(stmt, err, in_function=False)  # (raises: the construct is not part of the language)
    if returns is None:
        last = tree.body[-1] if tree.body else None
        raise err.at(last, "the program has no 'return'", hint="end the file with 'return value, ...'")
    dims = {n for decl in inputs for d in decl.shape
            for n in ([d] if isinstance(d, str) else d.names() if isinstance(d, DimExpr) else [])}
    for decl, stmt in zip(inputs, [s for s in tree.body if isinstance(s, ast.AnnAssign)]):
        if decl.name in dims:
            raise err.at(stmt.target, f"'{decl.name}' is both an input and a dim name",
                         hint="dim names are integer values in expressions: give the input another name")
    for target in _assigned_names(body):
        if target.id in dims:
            raise err.at(target, f"cannot assign to dim '{target.id}'",
                         hint="a dim is the size the inputs give it: use a new name")
        if target.id in seen_inputs:
            raise err.at(target, f"cannot assign to input '{target.id}'",
                         hint="inputs cannot be reassigned: use a new name")
        if target.id in defs:
            raise err.at(target, f"cannot assign to function '{target.id}'", hint="use a new name")
    for name, fdef in defs.items():
        if name in seen_inputs or name in dims:
            raise err.at(fdef, f"function '{name}' has the name of {'an input' if name in seen_inputs else 'a dim'}",
                         hint="give the function another name")
    _check_recursion(defs, err)
    names: list[str] = []
    for i, r in enumerate(returns):
        name = r.id if isinstance(r, ast.Name) else f"out{i}"
        if name in names:
            raise err.at(r, f"two outputs are named '{name}'", hint="return distinct values or assign new names")
        names.append(name)
    for r in returns:
        _check_constructs(r, err)
    return Parsed(source, filename, inputs, body, returns, names, err.lines, defs)


# the most statements a program may run once its loops are unrolled and its functions inlined
MAX_UNROLLED = 200_000


def _check_statement(stmt: ast.stmt, err: _Errors, in_function: bool) -> None:
    """One statement of the program's or a function's body: an assignment (`name = expr`, `a, b = f(x)`,
    `name op= expr`) or a `for NAME in range(...)` loop of such statements."""
    if isinstance(stmt, ast.Assign):
        if len(stmt.targets) != 1:
            raise err.at(stmt, "an assignment needs exactly one name on the left", hint="write 'name = expr'")
        target = stmt.targets[0]
        names = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        if not names or not all(isinstance(n, ast.Name) for n in names):
            raise err.at(target, "an assignment needs a name, or names separated by commas, on the left",
                         hint="write 'name = expr' or 'a, b = f(x)'")
        if len({n.id for n in names}) != len(names):  # type: ignore[attr-defined]
            raise err.at(target, "a name appears twice on the left", hint="give each value its own name")
        _check_constructs(stmt.value, err)
    elif isinstance(stmt, ast.AugAssign):
        if not isinstance(stmt.target, ast.Name):
            raise err.at(stmt, "an assignment needs exactly one name on the left", hint="write 'name = expr'")
        _check_constructs(stmt.value, err)
    elif isinstance(stmt, ast.For):
        it = stmt.iter
        if not isinstance(stmt.target, ast.Name):
            raise err.at(stmt.target, "a loop variable is one name", hint="write 'for i in range(N):'")
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"):
            raise err.at(it, "a for loop runs over range(...): loops are unrolled when compiling",
                         hint="write 'for i in range(N):' with N an integer literal, a dim or x.shape[...]")
        if it.keywords or not 1 <= len(it.args) <= 3:
            raise err.at(it, "range() takes 1 to 3 integers: range(stop), range(start, stop[, step])")
        for a in it.args:
            _check_constructs(a, err)
        if stmt.orelse:
            raise err.at(stmt.orelse[0], "'else' on a loop is not part of the .tg language")
        for sub in stmt.body:
            _check_statement(sub, err, in_function)
    elif isinstance(stmt, ast.Return):
        raise err.at(stmt, "'return' inside a loop", hint="return after the loop")
    elif isinstance(stmt, ast.FunctionDef):
        raise err.at(stmt, "functions are defined at the top level of the file, not inside " +
                     ("a function" if in_function else "a loop"))
    elif isinstance(stmt, ast.Expr):
        raise err.at(stmt, "an expression on its own does nothing", hint="assign it to a name or return it")
    elif isinstance(stmt, ast.AnnAssign):
        raise err.at(stmt, "input declarations come first, at the top level of the file")
    else:
        what = _CONSTRUCTS.get(type(stmt), type(stmt).__name__)
        raise err.at(stmt, f"{what} are not part of the .tg language" if what.endswith("s") else
                     f"'{what}' is not part of the .tg language")


def _assigned_names(stmts: list[ast.stmt]) -> list[ast.Name]:
    """Every name a block assigns, loop variables included (in order)."""
    out: list[ast.Name] = []
    for stmt in stmts:
        if isinstance(stmt, ast.Assign):
            t = stmt.targets[0]
            out.extend(t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])  # type: ignore[arg-type]
        elif isinstance(stmt, ast.AugAssign):
            out.append(stmt.target)  # type: ignore[arg-type]
        elif isinstance(stmt, ast.For):
            out.append(stmt.target)  # type: ignore[arg-type]
            out.extend(_assigned_names(stmt.body))
    return out


def _check_function(fdef: ast.FunctionDef, err: _Errors) -> None:
    """`def name(a, b, ...):` with plain parameters, a body of assignments and loops, and a final `return`."""
    if fdef.name in functions.FUNCTIONS or fdef.name in dtypes.by_name or fdef.name == "range":
        what = "a dtype" if fdef.name in dtypes.by_name else "a built-in function"
        raise err.at(fdef, f"function '{fdef.name}' has the name of {what}", hint="give it another name")
    if fdef.decorator_list:
        raise err.at(fdef.decorator_list[0], "decorators are not part of the .tg language")
    a = fdef.args
    if a.vararg or a.kwarg:
        raise err.at(a.vararg or a.kwarg, "*args and **kwargs are not part of the .tg language")
    if a.kwonlyargs:
        raise err.at(a.kwonlyargs[0], "keyword-only parameters are not part of the .tg language")
    if a.defaults:
        raise err.at(a.defaults[0], "parameters take no default values", hint="pass every argument")
    params = [*a.posonlyargs, *a.args]
    seen: set[str] = set()
    for p in params:
        if p.annotation is not None:
            raise err.at(p.annotation, "parameters take no type: a function takes tensors and numbers of any "
                                       "shape and dtype")
        if p.arg in seen:
            raise err.at(p, f"parameter '{p.arg}' appears twice")
        seen.add(p.arg)
    if fdef.returns is not None:
        raise err.at(fdef.returns, "a function takes no return annotation")
    body = list(fdef.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # a docstring
    if not body or not isinstance(body[-1], ast.Return):
        raise err.at(body[-1] if body else fdef, f"function '{fdef.name}' does not end with 'return'",
                     hint="end it with 'return value, ...'")
    for stmt in body[:-1]:
        if isinstance(stmt, ast.Return):
            raise err.at(stmt, "'return' must be the last statement of a function")
        _check_statement(stmt, err, in_function=True)
    ret = body[-1]
    assert isinstance(ret, ast.Return)
    if ret.value is None:
        raise err.at(ret, "'return' needs at least one value")
    _check_constructs(ret.value, err)


def function_body(fdef: ast.FunctionDef) -> tuple[list[ast.stmt], ast.expr]:
    """A checked function's statements (without its docstring) and its return value."""
    body = list(fdef.body)
    if isinstance(body[0], ast.Expr):
        body = body[1:]
    ret = body[-1]
    assert isinstance(ret, ast.Return) and ret.value is not None
    return body[:-1], ret.value


def _check_recursion(defs: dict[str, ast.FunctionDef], err: _Errors) -> None:
    """Refuse a function that calls itself, directly or through others (loops are unrolled and functions
    inlined when compiling, so a recursion would never end)."""
    calls: dict[str, list[ast.Call]] = {}
    for name, fdef in defs.items():
        calls[name] = [n for n in ast.walk(fdef) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                       and n.func.id in defs]
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for call in calls[name]:
            callee = call.func.id  # type: ignore[attr-defined]
            if state.get(callee) == 1:
                cycle = path[path.index(callee):] + [callee]
                how = f"'{name}' calls itself" if len(cycle) == 2 else \
                    "'" + "' calls '".join(cycle) + "'"
                raise err.at(call, f"recursion: {how}",
                             hint="functions are inlined when compiling and cannot recurse: use a for loop")
            if state.get(callee) is None:
                visit(callee, path + [callee])
        state[name] = 2

    for name in defs:
        if name not in state:
            visit(name, [name])


def _string_arguments(node: ast.AST) -> set[int]:
    """The ids of string literals that are arguments of the functions that take strings (einsum's subscripts,
    gelu's approximate=): the only place a string is part of the language."""
    out: set[int] = set()
    for sub in ast.walk(node):
        name = sub.func.id if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) else \
            sub.func.attr if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) else None
        if name in functions.TAKES_STRINGS:
            for a in [*sub.args, *(kw.value for kw in sub.keywords)]:
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    out.add(id(a))
    return out


def _check_constructs(node: ast.AST, err: _Errors) -> None:
    allowed = _string_arguments(node)
    for sub in ast.walk(node):
        if type(sub) in _CONSTRUCTS:
            what = _CONSTRUCTS[type(sub)]
            hint = "use & and | on bool tensors" if isinstance(sub, ast.BoolOp) else None
            raise err.at(sub, f"{what} are not part of the .tg language" if what.endswith("s") else
                         f"{what} is not part of the .tg language", hint=hint)
        if isinstance(sub, ast.Constant) and isinstance(sub.value, (str, bytes)) and id(sub) not in allowed:
            raise err.at(sub, "strings are not part of the .tg language")
        if isinstance(sub, ast.Constant) and isinstance(sub.value, complex):
            raise err.at(sub, "complex numbers are not supported")
        if isinstance(sub, ast.Compare) and len(sub.ops) > 1:
            raise err.at(sub, "chained comparisons are not supported", hint="write (a < b) & (b < c)")
        if isinstance(sub, ast.UnaryOp) and isinstance(sub.op, ast.Not):
            raise err.at(sub, "'not' is not part of the .tg language", hint="use ~x on bool tensors")


def _parse_decl(stmt: ast.AnnAssign, err: _Errors) -> InputDecl:
    if not isinstance(stmt.target, ast.Name):
        raise err.at(stmt.target, "an input declaration needs a plain name")
    if stmt.value is not None:
        raise err.at(stmt, "input declarations take no value", hint=f"write '{stmt.target.id}: f32[N]'")
    ann = stmt.annotation
    dtype_node, dims = (ann.value, ann.slice) if isinstance(ann, ast.Subscript) else (ann, None)
    if not isinstance(dtype_node, ast.Name):
        raise err.at(dtype_node, "expected a dtype such as f32 or i32")
    dtype = dtypes.by_name.get(dtype_node.id)
    if dtype is None:
        close = close_match(dtype_node.id, list(dtypes.by_name))
        raise err.at(dtype_node, f"unknown dtype '{dtype_node.id}'",
                     hint=f"did you mean '{close}'?" if close else "dtypes: " + " ".join(dtypes.by_name))
    shape: list[Dim] = []
    spans: list[tuple[int, int]] = []
    if dims is not None:
        for d in (dims.elts if isinstance(dims, ast.Tuple) else [dims]):
            dim = _parse_dim(d, err)
            if isinstance(dim, int) and dim < 0:
                raise err.at(d, "a dim cannot be negative" if not isinstance(d, ast.BinOp) else
                             f"this dim is {dim}: a size cannot be negative")
            shape.append(dim)
            spans.append((d.col_offset + 1, d.end_col_offset or d.col_offset + 1))
    end = stmt.end_col_offset or stmt.col_offset + 1
    return InputDecl(stmt.target.id, dtype, tuple(shape), stmt.lineno, stmt.col_offset + 1, end, tuple(spans))


_DIM_HELP = "a dim is a non-negative integer, a dim name, or integer arithmetic of them (+ - * //, parentheses)"


def _parse_dim(d: ast.expr, err: _Errors) -> Dim:
    """One declared dim: an int, a name, or + - * // of them (folded to an int when it names no dim)."""
    if isinstance(d, ast.Constant) and isinstance(d.value, int) and not isinstance(d.value, bool):
        return d.value
    if isinstance(d, ast.Name):
        if d.id in dtypes.by_name or d.id in functions.FUNCTIONS:
            what = "dtype" if d.id in dtypes.by_name else "function"
            raise err.at(d, f"'{d.id}' cannot be a dim name: it names a {what}", hint=_DIM_HELP)
        return d.id
    if isinstance(d, ast.UnaryOp) and isinstance(d.op, ast.USub):
        inner = _parse_dim(d.operand, err)
        return -inner if isinstance(inner, int) else DimExpr("-", 0, inner)
    if isinstance(d, ast.UnaryOp) and isinstance(d.op, ast.UAdd):
        return _parse_dim(d.operand, err)
    if isinstance(d, ast.BinOp):
        op = _DIM_OPS.get(type(d.op))
        if op is None:
            sym = _SYMBOLS.get(type(d.op), "this operator")
            raise err.at(d, f"'{sym}' is not allowed in a dim", hint="dims are integers: use // for division"
                         if sym == "/" else _DIM_HELP)
        a, b = _parse_dim(d.left, err), _parse_dim(d.right, err)
        if isinstance(a, int) and isinstance(b, int):
            if op == "//" and b == 0:
                raise err.at(d, "division by zero in a dim")
            return _dim_eval(DimExpr(op, a, b), {})
        if op == "//" and b == 0:
            raise err.at(d, "division by zero in a dim")
        return DimExpr(op, a, b)
    if isinstance(d, ast.Constant) and isinstance(d.value, float):
        raise err.at(d, f"a dim is an integer, not {d.value!r}", hint=_DIM_HELP)
    raise err.at(d, "a dim is a non-negative integer or a dim name", hint=_DIM_HELP)


# ------------------------------------------------------------------------------------------------------------------
# tracing: evaluate the program for concrete dims into tensor-level UOps


def dim_names(parsed: Parsed) -> list[str]:
    out: list[str] = []
    for decl in parsed.inputs:
        for d in decl.shape:
            for n in ([d] if isinstance(d, str) else d.names() if isinstance(d, DimExpr) else []):
                if n not in out:
                    out.append(n)
    return out


def concrete_shape(decl: InputDecl, dims: dict[str, int]) -> tuple[int, ...]:
    """The declared shape for these dims (DimError where an expression has no size)."""
    return tuple(dim_value(d, dims) for d in decl.shape)


def decl_shape(decl: InputDecl, dims: dict[str, int], err: _Errors | None = None, filename: str = "<string>",
               lines: list[str] | None = None) -> tuple[int, ...]:
    """`concrete_shape`, with a DimError turned into a TgcError at the dim's span (marked shape dependent)."""
    out = []
    for axis, d in enumerate(decl.shape):
        try:
            out.append(dim_value(d, dims))
        except DimError as e:
            col, end = decl.span_of(axis)
            lines = err.lines if err is not None else (lines or [])
            text = lines[decl.line - 1] if 0 < decl.line <= len(lines) else None
            exc = TgcError(f"input '{decl.name}': {e}", file=err.filename if err is not None else filename,
                           line=decl.line, col=col, end_col=end, text=text)
            exc.shape_dependent = True
            raise exc from None
    return tuple(out)


def trace(parsed: Parsed, dims: dict[str, int], lines: dict[UOp, int] | None = None
          ) -> tuple[list[UOp], list[UOp]]:
    """(output UOps in return order, input BUFFER UOps in declaration order). `lines`, when given, gets
    the source line of every node a statement created (for kernel names and headers)."""
    lines = {} if lines is None else lines

    def note(value: Any, line: int) -> None:
        """Give the nodes a statement created its line; stops at nodes already noted (their sources were
        noted with them), so a long chain of statements costs linear time, not quadratic."""
        if not isinstance(value, Tensor):
            return
        stack = [value.uop]
        while stack:
            n = stack.pop()
            if n in lines:
                continue
            lines[n] = line
            stack.extend(s for s in n.src if s not in lines)

    err = _Errors(parsed.source, parsed.filename)
    env: dict[str, Any] = {}
    buffers = []
    for name in dim_names(parsed):  # dims are integer values in expressions
        if name in dims:
            env[name] = dims[name] if isinstance(dims[name], SymSize) else int(dims[name])
    for i, decl in enumerate(parsed.inputs):
        buf = UOp(Ops.BUFFER, decl.dtype, (), (i, decl.name, decl_shape(decl, dims, err)))
        buffers.append(buf)
        env[decl.name] = Tensor(buf)
    ev = _Evaluator(env, err, parsed.functions, note)
    ev.run_block(parsed.body)
    outs = []
    for r in parsed.returns:
        v = ev.eval(r)
        note(v, r.lineno)
        if isinstance(v, (bool, int, float)):
            v = Tensor.const(v, Tensor.literal_dtype(v))
        if not isinstance(v, Tensor):
            raise err.at(r, f"cannot return {_describe(v)}: outputs are tensors")
        outs.append(v.uop)
    check_depth(outs)
    return outs, buffers


def trace_onto(parsed: Parsed, env: dict[str, Any], buffers: list[UOp]) -> list[Tensor]:
    """`trace` of a program that continues one traced before: `env` holds the names the earlier parts assigned
    (their tensors) and `buffers` their inputs; `parsed`'s declarations (no dims) become further BUFFERs, its
    statements extend `env`, and its return values come back as tensors. A tool that writes a program statement
    by statement (the ONNX translator) learns each new value's type without tracing the program so far again."""
    err = _Errors(parsed.source, parsed.filename)
    for decl in parsed.inputs:
        buf = UOp(Ops.BUFFER, decl.dtype, (), (len(buffers), decl.name, decl_shape(decl, {}, err)))
        buffers.append(buf)
        env[decl.name] = Tensor(buf)
    ev = _Evaluator(env, err, parsed.functions)
    ev.run_block(parsed.body)
    outs = []
    for r in parsed.returns:
        v = ev.eval(r)
        if isinstance(v, (bool, int, float)):
            v = Tensor.const(v, Tensor.literal_dtype(v))
        if not isinstance(v, Tensor):
            raise err.at(r, f"cannot return {_describe(v)}: outputs are tensors")
        outs.append(v)
    return outs


def _describe(v: Any) -> str:
    if isinstance(v, Tensor):
        return f"a tensor {v}"
    if isinstance(v, DType):
        return f"the dtype {v.name}"
    if isinstance(v, tuple):
        return "a tuple"
    return type_text(v)


def _literal_expr(node: ast.AST) -> bool:
    """Whether `node` is written with number literals only (`0.1 + 0.2`, `-(1 / 3)`, `2 * pi`), no names of sizes."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.Name):
        return node.id in ("inf", "nan", "pi", "e")
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd)) and _literal_expr(node.operand)
    if isinstance(node, ast.BinOp):
        return _literal_expr(node.left) and _literal_expr(node.right)
    return False


_BINOPS = {ast.Add: "__add__", ast.Sub: "__sub__", ast.Mult: "__mul__", ast.Div: "__truediv__",
           ast.FloorDiv: "__floordiv__", ast.Mod: "__mod__", ast.Pow: "__pow__", ast.MatMult: "__matmul__",
           ast.BitAnd: "__and__", ast.BitOr: "__or__", ast.BitXor: "__xor__", ast.LShift: "__lshift__",
           ast.RShift: "__rshift__"}
_CMPOPS = {ast.Lt: "__lt__", ast.LtE: "__le__", ast.Gt: "__gt__", ast.GtE: "__ge__", ast.Eq: "__eq__",
           ast.NotEq: "__ne__"}
_REFLECTED = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE, ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
            ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<",
            ast.RShift: ">>", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


class _Unrolled:
    """How many statements the program has run so far, its loops unrolled and its functions inlined (for the
    error that a program is too long to unroll)."""

    def __init__(self) -> None:
        self.statements = 0


class _Evaluator:
    """Evaluates expressions and runs statements in one scope: the program's top level (`env` holds its inputs,
    dims and assigned names) or one call of a function (`env` holds the function's locals, in front of the
    program's top level: Python's rule for a function's global names)."""

    def __init__(self, env: Any, err: _Errors, functions: dict[str, ast.FunctionDef] | None = None,
                 note: Callable[[Any, int], None] | None = None, top: dict[str, Any] | None = None,
                 count: _Unrolled | None = None):
        self.env, self.err = env, err
        self.functions = functions or {}
        self.note = note or (lambda value, line: None)
        self.top = env if top is None else top
        self.count = count or _Unrolled()

    # --- statements
    def run_block(self, stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            self.count.statements += 1
            if self.count.statements > MAX_UNROLLED:
                raise self.err.at(stmt, f"the program runs more than {MAX_UNROLLED} statements once its loops "
                                        "are unrolled and its functions inlined",
                                  hint="use fewer loop iterations, or split the program")
            if isinstance(stmt, ast.For):
                self._loop(stmt)
            elif isinstance(stmt, ast.Assign):
                value = self.eval(stmt.value)
                self._assign(stmt.targets[0], value, stmt.value)
                self.note(value, stmt.lineno)
            else:  # augmented assignment: name op= expr
                assert isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name)
                fake = ast.BinOp(left=ast.Name(id=stmt.target.id, ctx=ast.Load()), op=stmt.op, right=stmt.value)
                ast.copy_location(fake, stmt)
                ast.copy_location(fake.left, stmt.target)
                fake.left.end_lineno, fake.left.end_col_offset = stmt.target.end_lineno, stmt.target.end_col_offset
                fake.end_lineno, fake.end_col_offset = stmt.end_lineno, stmt.end_col_offset
                self.env[stmt.target.id] = value = self.eval(fake)
                self.note(value, stmt.lineno)

    def _assign(self, target: ast.expr, value: Any, value_node: ast.expr) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
            return
        assert isinstance(target, (ast.Tuple, ast.List))
        names = [t.id for t in target.elts]  # type: ignore[attr-defined]
        if not isinstance(value, tuple):
            raise self.err.at(value_node, f"cannot unpack {_describe(value)} into {len(names)} names",
                              hint="a function returning several values gives a tuple: 'a, b = f(x)'")
        if len(value) != len(names):
            raise self.err.at(target, f"cannot unpack {len(value)} values into {len(names)} names",
                              hint=f"write {len(value)} names on the left")
        for n, v in zip(names, value):
            self.env[n] = v

    def _loop(self, stmt: ast.For) -> None:
        """`for i in range(...)`: the body once per value of i, unrolled into the graph."""
        call = stmt.iter
        assert isinstance(call, ast.Call)
        bounds = []
        for a in call.args:
            v = self.eval(a)
            if isinstance(v, Tensor):
                raise self.err.at(a, f"a loop bound must be an integer known when compiling, not a tensor {v}",
                                  hint="loops are unrolled when compiling: data-dependent loops are not supported; "
                                       "use an integer literal, a dim or x.shape[...]")
            if not isinstance(v, int) or isinstance(v, bool):
                raise self.err.at(a, f"range() takes integers, not {_describe(v)}")
            bounds.append(v)
        if any(is_symbolic(b) for b in bounds):  # a loop over a dim: its length is the dim's value
            raise NotTraceable("a loop runs over a dim")
        if len(bounds) == 3 and bounds[2] == 0:
            raise self.err.at(call.args[2], "range() step cannot be zero")
        var = stmt.target.id  # type: ignore[attr-defined]
        if self.count.statements + len(range(*bounds)) * len(stmt.body) > MAX_UNROLLED:
            # (said before unrolling: the body's statements alone are past the limit; a loop of 10^8 took 12 s)
            raise self.err.at(stmt.body[0], f"the program runs more than {MAX_UNROLLED} statements once its loops "
                                            "are unrolled and its functions inlined",
                              hint="use fewer loop iterations, or split the program")
        for i in range(*bounds):
            self.env[var] = i
            self.run_block(stmt.body)

    def _call_function(self, node: ast.Call, name: str) -> Any:
        """A call of a function the program defines: its body run in a new scope, inlined into the graph."""
        fdef = self.functions[name]
        params = [p.arg for p in (*fdef.args.posonlyargs, *fdef.args.args)]
        n = len(params)
        takes = f"{name}() takes {n} argument{'' if n == 1 else 's'}" + (f" ({', '.join(params)})" if n else "")
        if len(node.args) > n:
            raise self.err.at(node, f"{takes}, but {len(node.args)} {'was' if len(node.args) == 1 else 'were'} given")
        local: dict[str, Any] = {}
        for p, a in zip(params, node.args):
            local[p] = self.eval(a)
        for kw in node.keywords:
            if kw.arg is None:
                raise self.err.at(kw, "**kwargs are not part of the .tg language")
            if kw.arg not in params:
                raise self.err.at(kw, f"{name}() has no parameter '{kw.arg}'", hint=f"{takes}")
            if kw.arg in local:
                raise self.err.at(kw, f"{name}() got two values for '{kw.arg}'")
            local[kw.arg] = self.eval(kw.value)
        missing = [p for p in params if p not in local]
        if missing:
            raise self.err.at(node, f"{takes}, but {len(local)} {'was' if len(local) == 1 else 'were'} given "
                                    f"(missing {', '.join(repr(m) for m in missing)})")
        body, ret = function_body(fdef)
        callee = _Evaluator(ChainMap(local, self.top), self.err, self.functions, self.note, self.top, self.count)
        callee.run_block(body)
        if isinstance(ret, ast.Tuple):
            values = tuple(callee.eval(e) for e in ret.elts)
            for v, e in zip(values, ret.elts):
                self.note(v, e.lineno)
            return values
        value = callee.eval(ret)
        self.note(value, ret.lineno)
        return value

    def eval(self, node: ast.expr) -> Any:
        try:
            return self._eval(node)
        except TgcError:
            raise
        except DslError as e:
            raise self._positioned(node, e) from None
        except RecursionError:
            raise self.err.at(node, "expression is nested too deeply") from None

    def _eval(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            if node.value is None or node.value is Ellipsis or isinstance(node.value, (bool, int, float, str)):
                return node.value
            raise self.err.at(node, f"unsupported literal {node.value!r}")
        if isinstance(node, ast.Name):
            return self._name(node)
        if isinstance(node, ast.Tuple) or isinstance(node, ast.List):
            return tuple(self.eval(e) for e in node.elts)
        if isinstance(node, ast.BinOp):
            # a left-nested chain (`x + x + ... + x`, as Python parses it) in a loop, not one frame per term
            spine = [node]
            while isinstance(spine[-1].left, ast.BinOp):
                spine.append(spine[-1].left)
            value = self.eval(spine[-1].left)
            for op_node in reversed(spine):
                right = self.eval(op_node.right)
                try:
                    value = self._binop(op_node, value, right)
                except DslError as e:
                    raise self._positioned(op_node, e) from None
            return value
        if isinstance(node, ast.UnaryOp):
            v = self.eval(node.operand)
            if isinstance(node.op, ast.USub):
                if isinstance(v, (Tensor, int, float)) and not isinstance(v, bool):
                    return -v
                return self._neg_bool(node, v)
            if isinstance(node.op, ast.UAdd):
                return v
            if isinstance(node.op, ast.Invert):
                return ~v if isinstance(v, Tensor) else (~v if isinstance(v, int) and not isinstance(v, bool)
                                                         else Tensor.const(v, Tensor.literal_dtype(v)).__invert__())
        if isinstance(node, ast.Compare):
            left, right = self.eval(node.left), self.eval(node.comparators[0])
            op = node.ops[0]
            if isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)):
                raise self.err.at(node, f"'{type(op).__name__.lower()}' comparisons are not supported")
            if isinstance(left, (int, float)) and isinstance(right, (int, float)):  # known when compiling (i == 0)
                return bool(getattr(left, _CMPOPS[type(op)])(right))
            if not isinstance(left, Tensor) and isinstance(right, Tensor):  # 2 < x is x > 2
                left, right, op = right, left, _REFLECTED[type(op)]()
            left, right = self._tensorize_pair(left, right)
            return getattr(left, _CMPOPS[type(op)])(right)
        if isinstance(node, ast.IfExp):
            cond = self.eval(node.test)
            if isinstance(cond, bool):  # known when compiling (`x if i == 0 else h` in a loop): one branch
                return self.eval(node.body) if cond else self.eval(node.orelse)
            a, b = self.eval(node.body), self.eval(node.orelse)
            return functions.where(cond, a, b)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.Subscript):
            value = self.eval(node.value)
            index = self._index(node.slice)
            if isinstance(value, tuple):
                if isinstance(index, int) or isinstance(index, slice):
                    try:
                        return value[index]
                    except IndexError:
                        raise self.err.at(node, f"index {index} is out of range for a tuple of {len(value)}") from None
                raise self.err.at(node.slice, "a tuple takes one int or slice index")
            if not isinstance(value, Tensor):
                raise self.err.at(node.value, f"cannot index {_describe(value)}")
            return functions.getitem(value, index)
        if isinstance(node, ast.Slice):
            return self._index(node)
        what = _CONSTRUCTS.get(type(node), type(node).__name__)
        raise self.err.at(node, f"{what} is not part of the .tg language")

    def _positioned(self, node: ast.AST, e: DslError) -> TgcError:
        """The error at this node, remembering whether it depends on dim sizes (load time skips those)."""
        out = self.err.at(node, e.msg, e.hint)
        out.shape_dependent = e.shape_dependent
        return out

    def _neg_bool(self, node: ast.AST, v: Any) -> Any:
        if isinstance(v, bool):
            raise self.err.at(node, "unary - is not defined for bool", hint="use ~x for logical not")
        raise self.err.at(node, f"cannot negate {_describe(v)}")

    def _tensorize_pair(self, a: Any, b: Any) -> tuple[Any, Any]:
        if not isinstance(a, Tensor) and not isinstance(b, Tensor):
            if isinstance(a, (bool, int, float)):
                a = Tensor.const(a, Tensor.literal_dtype(a))
        return a, b

    def _binop(self, node: ast.BinOp, left: Any, right: Any) -> Any:
        sym = _SYMBOLS[type(node.op)]
        for side, v in ((node.left, left), (node.right, right)):
            if not isinstance(v, (Tensor, bool, int, float)):
                raise self.err.at(side, f"cannot use {_describe(v)} with '{sym}'")
        if not isinstance(left, Tensor) and not isinstance(right, Tensor):
            # two compile-time numbers (e.g. sizes from x.shape): Python arithmetic, floor semantics
            if isinstance(left, int) and isinstance(right, int) and not isinstance(left, bool) \
                    and not isinstance(right, bool) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult,
                                                                             ast.FloorDiv, ast.Mod)):
                if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
                    return 0
                # (only the operation asked: a size's `%` is a decision of its own, `symsize.Unanswered`)
                return {ast.Add: lambda: left + right, ast.Sub: lambda: left - right, ast.Mult: lambda: left * right,
                        ast.FloorDiv: lambda: left // right, ast.Mod: lambda: left % right}[type(node.op)]()
            if _literal_expr(node) and not any(isinstance(v, bool) for v in (left, right)) and isinstance(node.op, (
                    ast.Add, ast.Sub, ast.Mult, ast.Div)) and (right != 0 or not isinstance(node.op, ast.Div)):
                # numbers with a float or `/`: Python's float arithmetic, a weak literal as numpy's Python scalars
                # (x_f16 * (0.1 + 0.2) stays f16, and so does x_f16 * (1e300 * 1e300), an inf as the literal `inf`);
                # sizes are left to the tensor ops (N / 4 is f32 at every N, symbolic or not)
                value = {ast.Add: lambda: left + right, ast.Sub: lambda: left - right,
                         ast.Mult: lambda: left * right, ast.Div: lambda: left / right}[type(node.op)]()
                if isinstance(value, float):
                    return value
            left = Tensor.const(left, Tensor.literal_dtype(left))
        if isinstance(node.op, ast.MatMult) and not (isinstance(left, Tensor) and isinstance(right, Tensor)):
            raise self.err.at(node, "@ needs two tensors")
        return getattr(left, _BINOPS[type(node.op)])(right) if isinstance(left, Tensor) else \
            getattr(right, "__r" + _BINOPS[type(node.op)][2:])(left)

    def _name(self, node: ast.Name) -> Any:
        if node.id in self.env:
            return self.env[node.id]
        if node.id in dtypes.by_name:
            return dtypes.by_name[node.id]
        if node.id in ("True", "False"):
            return node.id == "True"
        if node.id in ("inf", "nan", "pi", "e"):
            return {"inf": float("inf"), "nan": float("nan"), "pi": 3.141592653589793, "e": 2.718281828459045}[node.id]
        if node.id in functions.FUNCTIONS or node.id in self.functions:
            raise self.err.at(node, f"'{node.id}' is a function", hint=f"call it: {node.id}(...)")
        candidates = list(self.env) + list(functions.FUNCTIONS) + list(self.functions) + list(dtypes.by_name)
        close = close_match(node.id, candidates)
        raise self.err.at(node, f"unknown name '{node.id}'", hint=f"did you mean '{close}'?" if close else None)

    def _attribute(self, node: ast.Attribute) -> Any:
        value = self.eval(node.value)
        if isinstance(value, Tensor):
            if node.attr == "T":
                return value.T
            if node.attr == "shape":
                return value.shape
            if node.attr == "ndim":
                return value.ndim
            if node.attr == "dtype":
                return value.dtype
            if node.attr == "size":
                return value.numel
            if node.attr in functions.FUNCTIONS:
                raise self.err.at(node, f"'{node.attr}' is a method", hint=f"call it: .{node.attr}(...)")
        close = functions.ALIASES.get(node.attr) or close_match(node.attr, ["T", "shape", "ndim", "dtype",
                                                                            *functions.FUNCTIONS])
        raise self.err.at(node, f"{_describe(value)} has no attribute '{node.attr}'",
                          hint=f"did you mean '{close}'?" if close else None)

    def _call(self, node: ast.Call) -> Any:
        if isinstance(node.func, ast.Attribute):
            self_value = self.eval(node.func.value)
            if not isinstance(self_value, Tensor):
                raise self.err.at(node.func, f"{_describe(self_value)} has no method '{node.func.attr}'")
            name, args = node.func.attr, [self_value]
            fn_node = node.func
        elif isinstance(node.func, ast.Name):
            if node.func.id in self.functions:
                return self._call_function(node, node.func.id)
            if node.func.id == "range":
                raise self.err.at(node.func, "range() is only for loops", hint="write 'for i in range(N):'; "
                                  "arange(N) makes a tensor of 0 .. N-1")
            name, args, fn_node = node.func.id, [], node.func
        else:
            raise self.err.at(node.func, "only named functions can be called")
        fn = functions.FUNCTIONS.get(name)
        if fn is None:
            close = functions.ALIASES.get(name) or close_match(name, list(functions.FUNCTIONS) +
                                                                ([] if args else list(self.functions)))
            kind = "method" if args else "function"
            raise self.err.at(fn_node, f"unknown {kind} '{name}'",
                              hint=f"did you mean '{close}'?" if close else None)
        if args and name in functions.NOT_METHODS:
            raise self.err.at(fn_node, f"'{name}' is a function, not a method", hint=f"call it as {name}(...)")
        args += [self.eval(a) for a in node.args]
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise self.err.at(kw, "**kwargs are not part of the .tg language")
            kwargs[kw.arg] = self.eval(kw.value)
        try:
            inspect.signature(fn).bind(*args, **kwargs)
        except TypeError as e:
            raise self.err.at(node, f"{name}(): {e}", hint=_keyword_hint(name, fn, kwargs)) from None
        try:
            return fn(*args, **kwargs)
        except DslError as e:
            raise self._positioned(node, e) from None

    def _index(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Slice):
            parts = [None if p is None else self.eval(p) for p in (node.lower, node.upper, node.step)]
            for p, sub in zip(parts, (node.lower, node.upper, node.step)):
                if p is not None and (not isinstance(p, int) or isinstance(p, bool)):
                    raise self.err.at(sub, "slice bounds must be integers")
            if parts[2] == 0:
                raise self.err.at(node.step, "slice step cannot be zero")
            return slice(*parts)
        if isinstance(node, ast.Tuple):
            return tuple(self._index(e) for e in node.elts)
        v = self.eval(node)
        if isinstance(node, ast.List):
            return functions.index_list(v)  # x[[0, 2]]: an index array of compile-time ints
        if isinstance(v, Tensor):
            return v  # advanced indexing (`tgc.dsl.indexing`)
        if isinstance(v, bool) or not (v is None or v is Ellipsis or isinstance(v, int)):
            raise self.err.at(node, f"cannot index with {_describe(v)}")
        return v


def _keyword_hint(name: str, fn: Any, kwargs: dict[str, Any]) -> str | None:
    """`did you mean 'axis='?` for a keyword argument that the function `name` (`fn`) does not take and that is
    close to one it does; else the names it takes."""
    params = [p.name for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and not p.name.startswith("_")]
    for key in kwargs:
        if key not in params:
            close = close_match(key, params)
            return f"did you mean '{close}='?" if close else f"{name}() takes: {', '.join(params)}"
    return None


__all__ = ["parse", "trace", "function_body", "MAX_UNROLLED", "InputDecl", "Parsed", "dim_names", "concrete_shape",
           "decl_shape", "fmt_type", "DimExpr", "DimError", "dim_value", "solve_dim", "trace_onto"]
