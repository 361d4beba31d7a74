"""Input arrays for `tgc run` and `tgc bench`: read `.npy`/`.npz` files and hand them to the API's one binder
(`Program.conform`, `Program.bind`), whose errors this module words with the command line's flags; random
inputs come from the engine's one generator (`tgc.engine.inputs`).

Every problem is a `TgcError(kind="user")` (exit 2) that names the input.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from tgc.engine.inputs import DrawError, random_arrays
from tgc.errors import BindError, TgcError, close_match, dim_flags, unknown_dims

NPY_MAGIC = b"\x93NUMPY"
# a zip archive starts with a local file header; an empty one (`numpy.savez` of no arrays, as `tgc import` writes for
# a model without weights) is only its end-of-central-directory record
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")


def did_you_mean(name: str, choices: Iterable[str], what: str) -> str:
    """A `help:` line: the closest known name, else the list of known names."""
    choices = list(choices)
    close = close_match(name, choices)
    if close:
        return f"did you mean '{close}'?"
    if not choices:
        return f"the program has no {what}s"
    return f"the program's {what}s are: " + ", ".join(choices)


def decl_type(decl: Any) -> str:
    """`f32[N, D]` for a declaration (`f32` for a scalar)."""
    if not decl.shape:
        return decl.dtype.name
    return f"{decl.dtype.name}[{', '.join(str(s) for s in decl.shape)}]"


def _sniff(path: str) -> bytes | io.BytesIO:
    """The first bytes of a regular file; the whole content (as a BytesIO) of a pipe or other stream, which
    cannot be read twice (`-i x=<(cat x.npy)`), once its first bytes are those of a .npy or .npz file (so that
    `/dev/zero` is refused, not read forever)."""
    with open(path, "rb") as f:
        magic = f.read(len(NPY_MAGIC))
        if stat.S_ISREG(os.fstat(f.fileno()).st_mode) or not (magic == NPY_MAGIC or magic.startswith(ZIP_MAGICS)):
            return magic
        return io.BytesIO(magic + f.read())


def _magic(data: bytes | io.BytesIO) -> bytes:
    return data.getvalue()[:len(NPY_MAGIC)] if isinstance(data, io.BytesIO) else data


def _read_problem(path: str, label: str) -> str | None:
    """Why `path` cannot be opened at all, or None."""
    if not os.path.exists(path):
        return f"{label}: no such file '{path}'"
    if os.path.isdir(path):
        return f"{label}: '{path}' is a directory"
    if not os.access(path, os.R_OK):
        return f"{label}: cannot read '{path}': permission denied"
    return None


def _load_reason(exc: Exception) -> str:
    text = str(exc)
    if "allow_pickle" in text or "pickled" in text:
        return "it holds pickled Python objects, which tgc does not load"
    return text or type(exc).__name__


def _readable_magic(label: str, path: str) -> bytes | io.BytesIO:
    """The first bytes of a file that exists and can be read (all of it for a pipe: see `_sniff`); else one
    clear TgcError."""
    problem = _read_problem(path, label)
    if problem:
        raise TgcError(problem)
    try:
        return _sniff(path)
    except OSError as e:
        raise TgcError(f"{label}: cannot read '{path}': {e.strerror or e}") from None


def read_npy(name: str, path: str) -> np.ndarray:
    """One array from a `.npy` file (never unpickles)."""
    label = f"input '{name}'"
    data = _readable_magic(label, path)
    magic = _magic(data)
    if magic.startswith(ZIP_MAGICS):
        raise TgcError(f"{label}: '{path}' is an .npz archive, not a .npy file",
                       hint="pass archives with --inputs PATH.npz")
    if magic != NPY_MAGIC:
        raise TgcError(f"{label}: '{path}' is not a .npy file", hint="write it with numpy.save")
    try:
        arr = np.load(data if isinstance(data, io.BytesIO) else path, allow_pickle=False)
    except Exception as e:  # numpy raises ValueError, OSError, EOFError, ... for damaged files
        raise TgcError(f"{label}: cannot load '{path}': {_load_reason(e)}") from None
    return _check_array(label, path, arr)


def read_npz(path: str, only: Iterable[str] | None = None, skipped: list[str] | None = None
             ) -> dict[str, np.ndarray]:
    """Every array of a `.npz` archive, by name (never unpickles); with `only`, just those names, the others'
    names appended to `skipped` unread (a full weights file may hold arrays the program does not use)."""
    wanted = None if only is None else set(only)
    label = "--inputs"
    data = _readable_magic(label, path)
    magic = _magic(data)
    if magic == NPY_MAGIC:
        raise TgcError(f"{label}: '{path}' is a .npy file, not an .npz archive",
                       hint="pass single arrays with -i NAME=PATH.npy")
    if not magic.startswith(ZIP_MAGICS):
        raise TgcError(f"{label}: '{path}' is not an .npz archive", hint="write it with numpy.savez")
    out: dict[str, np.ndarray] = {}
    try:
        with np.load(data if isinstance(data, io.BytesIO) else path, allow_pickle=False) as z:
            for key in z.files:
                if wanted is not None and key not in wanted:
                    if skipped is not None:
                        skipped.append(key)
                    continue
                try:
                    out[key] = z[key]
                except Exception as e:
                    raise TgcError(f"input '{key}': cannot load it from '{path}': {_load_reason(e)}") from None
    except TgcError:
        raise
    except Exception as e:
        raise TgcError(f"{label}: cannot load '{path}': {_load_reason(e)}") from None
    return {k: _check_array(f"input '{k}'", path, v) for k, v in out.items()}


def _check_array(label: str, path: str, arr: Any) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise TgcError(f"{label}: '{path}' does not hold an array")
    if arr.dtype.kind not in "biuf":
        raise TgcError(f"{label}: '{path}' holds {arr.dtype} data, which tgc does not support",
                       hint="inputs are bool, int or float arrays")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def flag_hint(e: BindError) -> BindError:
    """The API's error with the command line's words for the fix: the flags that give an input, a dim or a cast."""
    hints = {"input": f"give it with -i {e.name}=PATH.npy or --inputs PATH.npz, "
                      "or pass --random to fill it with random values",
             "dim": f"give {'it' if len(e.names) == 1 else 'them'} with {dim_flags(e.names)}",
             "cast": f"convert the array to {e.dtype}, or pass --cast to cast it with numpy"}
    e.hint = hints.get(e.need, e.hint)
    return e


def bind(prog: Any, arrays: dict[str, np.ndarray], dims: Mapping[str, int]) -> tuple[dict[str, int], dict]:
    """`Program.bind` (the one input binder), its errors worded for the command line."""
    try:
        return prog.bind(arrays, dict(dims))
    except BindError as e:
        raise flag_hint(e) from None


def gather(prog: Any, npz: str | None, pairs: Iterable[tuple[str, str]], cast: bool,
           notes: list[str] | None = None) -> dict[str, np.ndarray]:
    """The inputs named on the command line (`--inputs` first, `-i` overrides), checked and conformed. Arrays of
    the `.npz` that the program does not declare are not read: a note for them is appended to `notes`."""
    decls = {d.name: d for d in prog.inputs}
    given: dict[str, np.ndarray] = {}
    sources: dict[str, str] = {}
    if npz:
        skipped: list[str] = []
        for name, arr in read_npz(npz, only=decls, skipped=skipped).items():
            given[name], sources[name] = arr, npz
        if skipped and notes is not None:
            shown = ", ".join(skipped[:8]) + (f", ... ({len(skipped) - 8} more)" if len(skipped) > 8 else "")
            notes.append(f"note: ignored {len(skipped)} array{'s' if len(skipped) > 1 else ''} of '{npz}' that "
                         f"the program does not declare: {shown}")
    pairs = list(pairs)
    paths: dict[str, str] = {}
    for name, path in pairs:  # unknown names first: cheaper than reading the files
        if name not in decls:
            raise TgcError(f"unknown input '{name}'", hint=did_you_mean(name, decls, "input"))
        if paths.setdefault(name, path) != path:  # (as `-D N=4 -D N=5`: which one was meant?)
            raise TgcError(f"input '{name}' is given twice, as -i {name}={paths[name]} and -i {name}={path}",
                           hint="give each input once")
    for name, path in pairs:
        given[name], sources[name] = read_npy(name, path), path
    for name in given:
        if name not in decls:
            raise TgcError(f"unknown input '{name}' in '{sources[name]}'", hint=did_you_mean(name, decls, "input"))
    out = {}
    for name, arr in given.items():
        try:
            out[name] = prog.conform(name, arr, cast)
        except BindError as e:
            raise flag_hint(e) from None
    return out


def known_dims(prog: Any, given: Mapping[str, np.ndarray], dims: Mapping[str, int]) -> dict[str, int]:
    """Dim sizes from `-D` and from the arrays given (best effort: `Program.bind` does the real checking)."""
    out = dict(dims)
    for decl in prog.inputs:
        arr = given.get(decl.name)
        if arr is None or arr.ndim != len(decl.shape):
            continue
        for axis, size in enumerate(decl.shape):
            if isinstance(size, str):
                out.setdefault(size, int(arr.shape[axis]))
    from tgc.dsl.frontend import DimError, DimExpr, solve_dim
    for decl in prog.inputs:  # then dims that an expression with one unbound dim determines (`C + 1`)
        arr = given.get(decl.name)
        if arr is None or arr.ndim != len(decl.shape):
            continue
        for axis, size in enumerate(decl.shape):
            if isinstance(size, DimExpr):
                try:
                    solved = solve_dim(size, int(arr.shape[axis]), out)
                except DimError:
                    solved = None  # Program.bind reports it
                if solved is not None:
                    out[solved[0]] = solved[1]
    return out


def _check_ranks(prog: Any, given: Mapping[str, np.ndarray]) -> None:
    """An array given with another number of dims than its declaration binds none of its dims: that is the error
    (`Program.bind`'s wording, at the declaration), not a random input's dim it left unknown."""
    if not hasattr(prog, "_at"):  # (a package: its own binder says it, naming the package)
        return
    for decl in prog.inputs:
        arr = given.get(decl.name)
        if arr is None or arr.ndim == len(decl.shape):
            continue
        try:
            where = prog._at(decl)  # the declaration's line
        except (IndexError, TypeError):
            where = {}
        raise TgcError(f"input '{decl.name}' has {arr.ndim} dims {list(arr.shape)}, but is declared "
                       f"{decl_type(decl)} with {len(decl.shape)}", **where)


def check_dims(prog: Any, dims: Mapping[str, int], require_all: bool) -> list[str]:
    """Warnings for `-D` names the program does not use (a script may pass one set to many programs);
    with `require_all`, every dim of the program must be given."""
    names = prog.dim_names
    warnings = [f"warning: -D {name}={dims[name]}: the program has no dim {name}; "
                f"{did_you_mean(name, names, 'dim')}" for name in dims if name not in names]
    if require_all:
        try:
            prog.resolve_dims(dict(dims))
        except BindError as e:
            raise flag_hint(e) from None
    return warnings


def random_array(decl: Any, dims: Mapping[str, int], seed: int, index: int) -> np.ndarray:
    """The random array for one input (`tgc.engine.inputs.random_values`, the generator bench and BEAM use),
    after checking its dims are known and that it fits in memory."""
    return draw_random([(decl, random_shape(decl, dims), index)], seed)[decl.name]


def draw_random(todo: list[tuple[Any, list[int], int]], seed: int) -> dict[str, np.ndarray]:
    """The random arrays of `todo` ((input declaration, shape, position among the program's inputs)), by name:
    each checked against this machine's memory first, then drawn together (`tgc.engine.inputs.random_arrays`:
    the large ones on several threads, the same values as one by one). The cold and the warm path both draw
    here."""
    nbytes = [_check_memory(decl, shape) for decl, shape, _ in todo]
    try:
        arrays = random_arrays([(decl.dtype, shape, index) for decl, shape, index in todo], seed)
    except DrawError as e:  # MemoryError, or numpy's "array is too big" / "maximum dimension" ValueError
        decl, shape, _ = todo[e.index]
        raise _too_large(decl, shape, nbytes[e.index], str(e.error)) from None
    return {decl.name: a for (decl, _, _), a in zip(todo, arrays)}


def _missing_dims(decl: Any, dims: Mapping[str, int]) -> list[str]:
    """The dims of `decl`'s shape that `dims` does not give, in the order the shape names them."""
    from tgc import sizeexpr
    from tgc.dsl.frontend import DimExpr
    from tgc.package import PackageInput
    out: list[str] = []
    for i, size in enumerate(decl.shape):
        if isinstance(decl, PackageInput) and size == "?":
            names = sorted(sizeexpr.names(decl.expr[i]))
        else:
            names = [size] if isinstance(size, str) else size.names() if isinstance(size, DimExpr) else []
        out += [n for n in names if n not in dims and n not in out]
    return out


def random_shape(decl: Any, dims: Mapping[str, int]) -> list[int]:
    """The shape of a random input at `dims`; an unknown dim or a size that does not evaluate is an error."""
    from tgc import sizeexpr
    from tgc.dsl.frontend import DimError, dim_value
    from tgc.package import PackageInput
    missing = _missing_dims(decl, dims)
    if missing:
        raise TgcError(f"{unknown_dims(missing)}: give {dim_flags(missing)}",
                       hint=f"the random input '{decl.name}' is {decl_type(decl)}")
    shape = []
    for i, size in enumerate(decl.shape):
        if isinstance(decl, PackageInput) and size == "?":  # a package's size expression (`(N + 1) // 2`)
            shape.append(sizeexpr.evaluate(decl.expr[i], dims, f"the random input '{decl.name}'"))
            continue
        try:
            shape.append(dim_value(size, dict(dims)))
        except DimError as e:
            raise TgcError(f"the random input '{decl.name}' ({decl_type(decl)}) has no size: {e}") from None
    return shape


def _fmt_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n} bytes ({n / size:.1f} {unit})"
    return f"{n} bytes"


def physical_memory() -> int | None:
    """This machine's RAM in bytes, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _too_large(decl: Any, shape: list[int], nbytes: int, why: str) -> TgcError:
    return TgcError(f"input '{decl.name}' ({decl.dtype.name}{list(shape)}) needs {_fmt_bytes(nbytes)}: {why}",
                    hint="use smaller dims (-D)", kind="runtime")


def _check_memory(decl: Any, shape: list[int]) -> int:
    """The bytes of a random input of `shape`; more than this machine's memory is a runtime error (exit 1)
    raised before numpy tries (and the kernel's overcommit lets it start and be killed half-way)."""
    nbytes = decl.dtype.itemsize
    for s in shape:
        nbytes *= s
    ram = physical_memory()
    if ram is not None and nbytes > ram:
        raise _too_large(decl, shape, nbytes, f"more than this machine's memory, {_fmt_bytes(ram)}")
    return nbytes


def fill_random(prog: Any, given: dict[str, np.ndarray], dims: Mapping[str, int], seed: int) -> dict[str, np.ndarray]:
    """`given` plus a random array for every missing input."""
    _check_ranks(prog, given)
    resolved = known_dims(prog, given, dims)
    randoms = [decl for decl in prog.inputs if decl.name not in given]
    missing: dict[str, list[str]] = {}  # every dim a random input needs and -D did not give, in one error
    for decl in randoms:
        for name in _missing_dims(decl, resolved):
            missing.setdefault(name, []).append(decl.name)
    if missing:
        names = list(missing)
        decls = [d for d in randoms if any(d.name in v for v in missing.values())]
        said = ", ".join(f"'{d.name}' {decl_type(d)}" for d in decls[:3]) + (", ..." if len(decls) > 3 else "")
        raise TgcError(f"{unknown_dims(names)}: give {dim_flags(names)}",
                       hint=f"the random input '{decls[0].name}' is {decl_type(decls[0])}" if len(decls) == 1 else
                       f"the random inputs: {said}")
    todo = [(decl, random_shape(decl, resolved), index) for index, decl in enumerate(prog.inputs)
            if decl.name not in given]
    return {**given, **draw_random(todo, seed)}
