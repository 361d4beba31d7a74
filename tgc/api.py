"""The Python API: `load`/`loads` give a `Program`; `Program.run` executes, `Program.compile` shows kernels."""

from __future__ import annotations

import hashlib
import math
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import replace as _dc_replace
from typing import Any

import numpy as np

from tgc import progcache, sizeexpr, timings
from tgc.backends import canonical, default_device, device_class, get_device, known_kinds, one_device
from tgc.codegen import search, sizes
from tgc.codegen.attention import attention_kernel, is_fused_attention
from tgc.codegen.kernel import (
    Kernel,
    build_kernel,
    build_kernels,
    build_symbolic_kernel,
    compile_deferred,
    prepare_ast,
    symbolic_work,
)
from tgc.codegen.opt import Opt, OptError, OptOps
from tgc.codegen.pipeline import heuristic_opts
from tgc.codegen.search import DEFAULT_BUDGET_S, beam_items, lookup
from tgc.dsl.frontend import (
    DimError,
    DimExpr,
    InputDecl,
    Parsed,
    concrete_shape,
    decl_shape,
    dim_names,
    dim_value,
    parse,
    solve_dim,
    trace,
)
from tgc.dtype import DType
from tgc.engine import bench, chunk, classbind, executable
from tgc.engine.attention import find as attention_find
from tgc.engine.bound import split as bound_split
from tgc.engine.chunk import Chunking
from tgc.engine.conform import as_array as _as_array
from tgc.engine.conform import check_input_names, names_hint
from tgc.engine.executable import Executable, first_chunk_inputs
from tgc.engine.flops import recompute_factor, written_flops
from tgc.engine.inputs import random_inputs
from tgc.engine.multi import build_executable
from tgc.engine.multi import plan as plan_multi
from tgc.engine.realize import (
    LaunchPlans,
    inplace_pairs,
    plan_for,
    release_kept,
    stored_indices,
    to_user_array,
)
from tgc.engine.reference import evaluate, evaluate_with_scale
from tgc.engine.schedule import ScheduleItem, create_schedule, kernel_name, split_large_reduces
from tgc.env import debug_level, env_flag, env_int
from tgc.errors import BindError, CompileError, TgcError, unknown_dims
from tgc.ir.kernel import kernel_names
from tgc.ir.shapes import prod, shape_of
from tgc.ir.symsize import (
    NotProbeable,
    NotTraceable,
    SymSize,
    answering_at,
    atom_parts,
    base_dim,
    checked_at,
    decided_across,
    decided_by_remainder,
    decided_from,
    decided_upto,
    recording,
    representative,
    wanted_multiples,
)
from tgc.ir.uop import Ops, UOp
from tgc.onnx import at_node as onnx_at_node
from tgc.onnx import read_model
from tgc.onnx import translate as translate_onnx
from tgc.package import PackageError, class_doc

__all__ = ["Program", "Kernel", "load", "loads", "InputDecl", "devices"]



def _checked_dims(dims: Mapping[str, Any] | None) -> dict[str, int]:
    """A copy of `dims`, each size a non-negative int (a numpy integer becomes one; a bool, a float or a string
    is a TgcError)."""
    try:
        dims = dict(dims or {})
    except (TypeError, ValueError):  # (a list of sizes, "N=4": dict() cannot pair them)
        raise TgcError(f"dims must be a dict of dim name to size, such as {{'N': 4}}, got {dims!r}") from None
    for k, v in dims.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
            raise TgcError(f"dim {k} must be a non-negative integer, got {v!r}")
        dims[k] = int(v)
    return dims


MAX_SOURCE = 64 << 20  # characters of a .tg file (a model's translation is a line per node: far less)


def load(path: str | os.PathLike) -> Program:
    """A `.tg` program, or an ONNX model (`.onnx`: translated by `tgc.onnx`, its weights bound once here)."""
    path = os.fspath(path)
    if path.lower().endswith(".onnx"):
        return load_onnx(path)
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a leading byte-order mark is not source
            source = f.read(MAX_SOURCE + 1)  # (bounded: /dev/zero never ends)
        if len(source) > MAX_SOURCE:
            raise TgcError(f"{path} is not a .tg program: it is over {MAX_SOURCE >> 20} Mi characters long")
    except FileNotFoundError:
        raise TgcError(f"no such file: {path}") from None
    except UnicodeDecodeError as e:
        raise TgcError(f"{path} is not a .tg program: byte {e.start} is not UTF-8 text",
                       hint="tgc reads .tg programs, .onnx models and .tgpkg packages") from None
    except OSError as e:
        raise TgcError(f"cannot read {path}: {e}") from None
    prog = loads(source, filename=path)
    prog.path = path
    return prog


def loads(source: str, filename: str = "<string>") -> Program:
    if not isinstance(source, str):  # (None was "AttributeError: 'NoneType' object has no attribute 'removeprefix'")
        raise TgcError(f"tgc.loads takes the program's text (a str), got {type(source).__name__}",
                       hint="decode bytes first, or pass a path to tgc.load")
    return Program(source, filename)


def load_onnx(path: str | os.PathLike) -> Program:
    """An ONNX model as a Program: the `.tg` text `tgc import` writes, its weights bound at load (inputs the
    user never passes, not part of any cache key), inputs and outputs called by their ONNX names."""
    path = os.fspath(path)
    return onnx_program(read_model(path), path)


def onnx_program(model: Any, path: str) -> Program:
    """A checked ONNX model (`tgc.onnx.read_model`) from file `path` as a Program (see `load_onnx`). A model with a
    data-dependent output shape raises `tgc.onnx.NeedHost`: `tgc.staged.load` runs it in stages instead."""
    tr = translate_onnx(model, os.path.basename(path))
    names = {tg: name for name, tg in [*tr.inputs.items(), *tr.outputs.items()]}
    try:
        prog = Program(tr.source, filename=path, weights=tr.weights, names=names)
    except TgcError as e:
        raise onnx_at_node(e, tr) from None
    prog.path = path
    prog.onnx = tr
    return prog


class Program:
    """A parsed `.tg` program. Traced, scheduled and compiled lazily for each set of dims and device."""

    def __init__(self, source: str, filename: str = "<string>", weights: Mapping[str, np.ndarray] | None = None,
                 names: Mapping[str, str] | None = None):
        """`weights`: inputs bound once, by `.tg` name (a model's initializers), which callers never pass;
        `names`: the name callers use for a `.tg` input or output (an ONNX name), where it differs."""
        self.source, self.path = source, None
        self.filename = filename
        self.weights: dict[str, np.ndarray] = dict(weights or {})
        self.public: dict[str, str] = dict(names or {})
        self.onnx: Any = None  # the ONNX translation (`tgc.onnx.Translation`) of a model, else None
        self.parsed: Parsed = parse(source, filename)
        # the name each declared input has in the arrays the engine gets: the caller's name, or a weight's
        self._in_names = [self.public.get(d.name, d.name) for d in self.parsed.inputs]
        self._traces: dict[tuple, tuple[list[UOp], list[UOp]]] = {}
        # per traced dims, the front end's size decisions (`symsize.recording`; dims that are `SymSize`s only)
        self._trace_decisions: dict[tuple, list] = {}
        self._kernels: dict[tuple, list[Kernel]] = {}
        self._launch_plans = LaunchPlans(self.MAX_PLANS)  # by (device, dims, BEAM): see `run`
        self._lines: dict[UOp, int] = {}  # tensor node -> the .tg line that first computed it
        self._multi: dict[tuple, tuple[Executable, list]] = {}  # (executable, per device its items)
        self._plans: dict[tuple, SymbolicPlan | str] = {}  # (device, size class) -> symbolic kernels or why none
        # the dim bounds of the symbolic build in progress (`_build_symbolic_bounded`, `sizes.fitted_bound`)
        self._fitted_bound, self._raised, self._raise_dims = 0, {}, True
        # (device, size class) -> how its plan was found: "one trace", or "probes: <why one trace did not serve>"
        self.symbolic_paths: dict[tuple, str] = {}
        self.one_trace = True  # False: every class through the probes (tests compare the two paths)
        # a class's hidden dims (`_with_multiples`): name -> (X, Y), the dim X traced as name * Y (Y a dim or an int)
        self._hidden: dict[str, tuple[str, str | int]] = {}
        self._divided_dims: set[tuple] = set()  # (device, class) with no plan whose trace divided a dim
        # (device, hidden class) -> a narrowed plan whose hidden dims may be of class 32n, or why none
        # (`_narrowed_for`: made from the class-n narrowing's multiples at the dims of a run)
        self._narrowed: dict[tuple, SymbolicPlan | str] = {}
        # (device, size class of the dims) -> the narrowed plans that served dims of that class in this process
        # (stored together as the class's program-cache entry)
        self._served: dict[tuple, list[SymbolicPlan]] = {}
        self.last_run = ""  # "symbolic" or "specialized[: why]": which kernels the last `run` used
        self._chunks: dict[tuple, Chunking | None] = {}  # (device, dims, BEAM, tuned) -> how `run` chunks
        self.last_chunking: Chunking | None = None  # the chunking the last single-device `run` used, if any
        self._entries: dict[tuple, progcache.Entry | None] = {}  # program-cache entries looked up, by (device,
        # dims, BEAM): see `run`
        self._stored: set[tuple] = set()  # the keys of `_entries` stored after a cold run
        # the program cache's symbolic entries looked up (header, package), by (device, "symbolic", size class, BEAM)
        self._symbolic_entries: dict[tuple, tuple[dict, Any] | None] = {}
        # what a run reuses at (device, dims, KERNEL_ENV values): the executable its first run built or loaded
        self._ready: dict[tuple, _Ready] = {}
        self._check_without_dims()

    @property
    def inputs(self) -> list[InputDecl]:
        """The inputs a caller passes (weights bound at load are not among them), by the caller's names. Built
        once (a model declares hundreds; `bind` reads them on every run): a new list of the same declarations
        each call."""
        if not self.weights and not self.public:
            return self.parsed.inputs
        if getattr(self, "_caller_inputs", None) is None:
            self._caller_inputs = [_dc_replace(d, name=n) for d, n in zip(self.parsed.inputs, self._in_names)
                                   if d.name not in self.weights]
        return list(self._caller_inputs)

    @property
    def output_names(self) -> list[str]:
        return [self.public.get(n, n) for n in self.parsed.output_names]

    @property
    def weights_digest(self) -> str:
        """SHA-256 of the weights bound at load (names, dtypes, shapes, bytes): the program cache's key holds
        it, not the weights; "" for a program without weights."""
        if not self.weights:
            return ""
        if getattr(self, "_weights_digest", None) is None:
            h = hashlib.sha256()
            for name, arr in sorted(self.weights.items()):
                a = np.require(arr, requirements="C")  # (0-d stays 0-d: () and (1,) differ)
                h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
                h.update(a.reshape(-1).view(np.uint8))
            self._weights_digest = h.hexdigest()
        return self._weights_digest

    @property
    def dim_names(self) -> list[str]:
        if getattr(self, "_dim_names", None) is None:  # (read on every run: found once)
            self._dim_names = dim_names(self.parsed)
        return list(self._dim_names)

    def _all_decls(self) -> list[InputDecl]:
        """Every declared input, weights included, in declaration order, by the engine's names."""
        return [_dc_replace(d, name=n) if n != d.name else d for d, n in zip(self.parsed.inputs, self._in_names)]

    def _check_without_dims(self) -> None:
        """Report errors that do not depend on dim sizes at load time (unknown names, dtype errors, ...)."""
        trial = {name: 2 + i for i, name in enumerate(self.dim_names)}  # distinct small sizes
        try:
            self._trace(trial)
        except TgcError as e:
            if not getattr(e, "shape_dependent", False):
                # dims are values (`zeros(N - 4)`): an error that larger sizes do not repeat is not the program's
                try:
                    self._trace({name: 64 + i for i, name in enumerate(self.dim_names)})
                except TgcError as again:
                    if (again.msg, again.line, again.col) == (e.msg, e.line, e.col):
                        raise e from None
        finally:
            if self.dim_names:  # (trial sizes; a program without dims keeps its trace: the one every run needs)
                self._traces.clear()

    # --- binding inputs
    def bind(self, inputs: dict[str, Any], dims: dict[str, int] | None = None, cast: bool = False
             ) -> tuple[dict[str, int], dict[str, np.ndarray]]:
        """Check inputs against the declarations; return (dims, arrays in the declared dtypes)."""
        dims = _checked_dims(dims)
        if self.weights:  # arrays bound here before (the weights themselves) come back: not the caller's
            inputs = {k: v for k, v in inputs.items() if self.weights.get(k) is not v}
        check_input_names(inputs, sorted(d.name for d in self.inputs), self.filename)
        bound_by: dict[str, str] = {k: "" for k in dims}  # "": from the dims given
        arrays: dict[str, np.ndarray] = {}
        deferred: list[tuple[InputDecl, int, DimExpr, int]] = []  # expression dims, checked once names are bound
        for decl in self.inputs:
            if decl.name not in inputs:
                raise BindError(f"missing input '{decl.name}' ({_decl_text(decl)})", need="input", name=decl.name,
                                hint="pass an array for it", **self._at(decl))
            arr = self.conform(decl.name, inputs[decl.name], cast)
            if arr.ndim != len(decl.shape):
                raise TgcError(f"input '{decl.name}' has {arr.ndim} dims {list(arr.shape)}, but is declared "
                               f"{_decl_text(decl)} with {len(decl.shape)}", file=self.filename,
                               line=decl.line, col=decl.col, end_col=decl.end_col,
                               text=self.parsed.lines[decl.line - 1])
            for axis, (want, have) in enumerate(zip(decl.shape, arr.shape)):
                if isinstance(want, int):
                    if want != have:
                        raise TgcError(f"input '{decl.name}' axis {axis} has size {have}, but is declared {want}",
                                       **self._at_dim(decl, axis))
                elif isinstance(want, DimExpr):
                    deferred.append((decl, axis, want, have))
                elif want in dims:
                    if dims[want] != have:
                        source = f"input '{bound_by[want]}'" if bound_by[want] else "the dims given"
                        raise TgcError(f"dim {want} mismatch: input '{decl.name}' axis {axis} has size {have}, "
                                       f"but {want} = {dims[want]} from {source}", **self._at_dim(decl, axis))
                else:
                    dims[want] = have
                    bound_by[want] = decl.name
            arrays[decl.name] = arr
        self._bind_expressions(deferred, dims, bound_by)
        arrays.update(self.weights)  # (bound at load: never the caller's)
        return dims, arrays

    def _bind_expressions(self, deferred: list[tuple[InputDecl, int, DimExpr, int]], dims: dict[str, int],
                          bound_by: dict[str, str]) -> None:
        """Check the expression dims (`3 * C`) once the plain dim names are bound; an expression with one
        unbound dim reached through + - * only binds it (`C + 1` of size 9 gives C = 8)."""
        while deferred:
            progress = False
            for item in list(deferred):
                decl, axis, expr, have = item
                unknown = [n for n in expr.names() if n not in dims]
                try:
                    if unknown:
                        solved = solve_dim(expr, have, dims)
                        if solved is None:
                            continue
                        dims[solved[0]] = solved[1]
                        bound_by[solved[0]] = f"{decl.name}' axis {axis} ('{expr}"
                    value = dim_value(expr, dims)
                except DimError as e:
                    raise TgcError(f"input '{decl.name}' axis {axis} has size {have}: {e}",
                                   **self._at_dim(decl, axis)) from None
                if value != have:
                    sources = ", ".join(f"{n} = {dims[n]} from " + (f"input '{bound_by[n]}'" if bound_by[n] else
                                                                     "the dims given") for n in expr.names())
                    raise TgcError(f"input '{decl.name}' axis {axis} has size {have}, but is declared {expr} = "
                                   f"{value} ({sources})", **self._at_dim(decl, axis))
                deferred.remove(item)
                progress = True
            if not progress:
                decl, axis, expr, _ = deferred[0]
                name = next(n for n in expr.names() if n not in dims)
                raise BindError(f"dim {name} is unknown: input '{decl.name}' axis {axis} is declared {expr}, which "
                                f"does not determine {name} by itself", need="dim", name=name,
                                hint=f"give {name}'s size, or an input with a plain {name} axis",
                                **self._at_dim(decl, axis))

    def _at_dim(self, decl: InputDecl, axis: int) -> dict[str, Any]:
        """Where one dim of a declaration is, for an error that points at it."""
        col, end = decl.span_of(axis)
        return {**self._at(decl), "col": col, "end_col": end}

    def conform(self, name: str, value: Any, cast: bool = False) -> np.ndarray:
        """One input as a C-contiguous array of its declared dtype (bf16 as its bits); a different dtype is an
        error unless `cast` (Python scalars and lists are cast to the declared kind)."""
        decl = next((d for d in self.inputs if d.name == name), None)
        if decl is None:
            raise TgcError(f"unknown input '{name}'", file=self.filename)
        return _as_array(value, decl, cast, self._at(decl))

    def _at(self, decl: InputDecl) -> dict[str, Any]:
        """Where an input is declared, for an error that points at it."""
        return {"file": self.filename, "line": decl.line, "col": decl.col, "end_col": decl.end_col,
                "text": self.parsed.lines[decl.line - 1]}

    def resolve_dims(self, dims: dict[str, int] | None) -> dict[str, int]:
        dims = _checked_dims(dims)  # (compile(dims={"N": 2.5}) built kernels for N=2)
        missing = [d for d in self.dim_names if d not in dims]
        if missing:
            raise BindError(unknown_dims(missing), need="dim", name=missing[0], names=missing,
                            hint=f"give {'its size' if len(missing) == 1 else 'their sizes'} in dims")
        for decl in self.inputs:  # every expression dim has a size (no division by zero, nothing negative)
            decl_shape(decl, dims, filename=self.filename, lines=self.parsed.lines)
        return dims

    # --- tracing, scheduling, compiling
    def _program_dims(self, dims: Mapping[str, Any]) -> dict[str, Any]:
        """`dims` with each hidden dim of a class (`_hidden`: X traced as Q * Y, Y a dim or an int) replaced by the
        dim X it makes where X is not given (innermost first: `C // D // KH` makes C_D from C_D_KH, then C from
        C_D; a Y made of a hidden dim first). A plan's bind passes X with its Q (`SymbolicPlan.class_dims`, Q = X
        // Y); a trace, Q alone."""
        d, done = dict(dims), set()
        while True:  # (each step one hidden dim whose Y is known: `D_2` before `C_D` where D = D_2 * 2)
            name = next((n for n, (_, y) in self._hidden.items() if n in d and n not in done and
                         (not isinstance(y, str) or y in d)), None)
            if name is None:
                return {n: v for n, v in d.items() if n not in done}
            done.add(name)
            x, y = self._hidden[name]
            d.setdefault(x, d[name] * (d[y] if isinstance(y, str) else y))  # (X given: the dims' own, never
            # replaced by a name a caller passed)

    def _trace(self, dims: dict[str, int]) -> tuple[list[UOp], list[UOp]]:
        key = tuple(sorted(dims.items()))
        if key not in self._traces:
            with timings.phase("trace"), recording() as front:
                try:
                    outs, bufs = trace(self.parsed, self._program_dims(dims) if self._hidden else dims,
                                       self._lines)
                except TgcError as e:  # (a model's error at these dims: said of its ONNX node too)
                    raise (onnx_at_node(e, self.onnx) if self.onnx is not None else e) from None
                finally:  # (kept where it refuses too: the decisions made before the refusal)
                    if any(isinstance(v, SymSize) for v in dims.values()):
                        self._trace_decisions[key] = front
            outs = split_large_reduces(outs)
            # an output that is an input, or that repeats another output, still gets its own kernel
            seen: set[UOp] = set()
            fixed = []
            for o in outs:
                if o.op is Ops.BUFFER or o in seen:
                    o = UOp(Ops.CAST, o.dtype, (o,))
                    while o in seen:
                        o = UOp(Ops.CAST, o.dtype, (o,))
                seen.add(o)
                fixed.append(o)
            self._traces[key] = (fixed, bufs)
        return self._traces[key]

    def line_of(self, node: UOp) -> int | None:
        """The .tg line a kernel's output comes from (the nearest computed node with a known line)."""
        if node in self._lines:
            return self._lines[node]
        for n in reversed(node.toposort()):
            if n in self._lines:
                return self._lines[n]
        return None

    def schedule(self, dims: dict[str, int] | None = None, device: str | None = None) -> list[ScheduleItem]:
        """The kernels' ASTs before optimization (what `--emit schedule` shows); for a device list, the whole
        program's schedule on its first device (before sharding)."""
        dev = _device(device_names(device)[0])
        outs, _ = self._trace(self.resolve_dims(dims))
        items = create_schedule(outs, dev.caps)
        for item in items:
            item.line = self.line_of(item.meta.get("serves", item.output))
        return items

    def run_schedule(self, dims: dict[str, int] | None = None, device: str | None = None) -> list[ScheduleItem]:
        """The schedule of the kernels `run` launches on one device: one chunk's where the program runs in chunks
        (`chunking`: a chunk's kernels have the chunk's sizes, other ASTs than the whole program's), else
        `schedule`'s. What `beam` searches: winners stored for the whole program's kernels would not be used."""
        dev = _device(device_names(device)[0])
        dims = self.resolve_dims(dims)
        ch = self._chunking(dev, dims, 0, False)
        if ch is None:
            return self.schedule(dims, dev.name)
        items = create_schedule([u for _, u in ch.low.outputs], dev.caps)
        for item in items:
            item.line = self.line_of(item.meta.get("serves", item.output))
        return items

    def compile(self, device: str | list[str] | None = None, dims: dict[str, int] | None = None,
                beam: int | None = None, tuned: bool = True, progress: Any = None,
                shard: dict[str, int] | None = None, defer: bool = False) -> list[Kernel]:
        """The program's kernels in launch order, rendered and (where this machine can) compiled.
        `beam=W` searches kernels without a stored winner from a search at least W wide; `tuned=False`
        ignores stored winners; `progress(event)` follows the searches as in `Program.beam`. For a device
        list (with `shard`), each distinct kernel once (`device_kernels` says which device runs which).
        `defer=True` leaves the compiles to the first call that needs the binaries (`Kernel.deferred`)."""
        names = device_names(device)
        if len(names) > 1:
            seen: dict[tuple, Kernel] = {}
            for _, k in self.device_kernels(names, dims, shard, beam, tuned):
                seen.setdefault((k.device.kind, k.src), k)
            return list(seen.values())
        dev = _device(names[0])
        dims = self.resolve_dims(dims)
        beam = env_int("BEAM", 0) if beam is None else beam
        key = (dev.name, tuple(sorted(dims.items())), beam, tuned)
        if key not in self._kernels:
            outs, _ = self._trace(dims)
            self._kernels[key] = self._build_kernels(dev, outs, beam, tuned, progress, defer=defer)
            if debug_level() >= 2:
                rec = self._recompute(self._kernels[key], outs)
                print(f"*** recompute factor {rec['factor']:.3f}: the kernels execute {rec['executed']} ops, the "
                      f"program as written has {rec['written']}", file=sys.stderr)
        if not defer:
            compile_deferred(self._kernels[key])  # (kernels an earlier `defer=True` call left uncompiled)
        return self._kernels[key]

    def recompute(self, device: str | None = None, dims: dict[str, int] | None = None, beam: int | None = None,
                  tuned: bool = True) -> dict[str, Any]:
        """The recompute factor of the program's kernels on one device (`tgc.engine.flops`): `written` (the
        tensor graph's ops, each node once over its own shape), `executed` (the same ops as the kernels run
        them, `Kernel.graph_flops` summed) and `factor` = executed / written (1.0: nothing computed twice)."""
        dev = _device(device)
        dims = self.resolve_dims(dims)
        kernels = self.compile(device=dev.name, dims=dims, beam=beam, tuned=tuned)
        return self._recompute(kernels, self._trace(dims)[0])

    @staticmethod
    def _recompute(kernels: list[Kernel], outs: list[UOp]) -> dict[str, Any]:
        written, executed = written_flops(outs), sum(k.graph_flops for k in kernels)
        return {"written": written, "executed": executed, "factor": recompute_factor(executed, written)}

    def _build_kernels(self, dev: Any, outs: list[UOp], beam: int, tuned: bool, progress: Any = None,
                       defer: bool = False) -> list[Kernel]:
        """The kernels computing `outs` on `dev`, in launch order."""
        with timings.phase("schedule"):
            items = create_schedule(outs, dev.caps)
        items = [item for item in items if item.ast.src]  # (an empty output computes nothing)
        for item in items:
            item.line = self.line_of(item.meta.get("serves", item.output))
        return build_kernels(list(zip(items, kernel_names(items))), dev, beam=beam, tuned=tuned, progress=progress,
                             defer=defer)

    def chunking(self, device: str | None = None, dims: dict[str, int] | None = None, beam: int | None = None,
                 tuned: bool = True) -> Chunking | None:
        """How `run` splits the program along a batch axis to lower its peak memory (`tgc.engine.chunk`), or
        None where it runs whole: `TGC_CHUNK=0`, a device whose buffers are not host memory, a program whose
        planned peak is within `chunk.LIMIT` x its inputs+outputs, or one not separable along axis 0."""
        return self._chunking(_device(device), self.resolve_dims(dims), env_int("BEAM", 0) if beam is None else beam,
                              tuned)

    def _chunking(self, dev: Any, dims: dict[str, int], beam: int, tuned: bool) -> Chunking | None:
        if env_int("TGC_CHUNK", 1) == 0 or not chunk.host_memory(dev):
            return None
        key = (dev.name, tuple(sorted(dims.items())), beam, tuned)
        if key not in self._chunks and not chunk.chunk_counts(self._all_decls(), dims, *self._trace(dims)):
            self._chunks[key] = None  # nothing it could chunk along: decided without lowering (the first run's
            # compiles then overlap its lowering, `build_kernels`, instead of following a deferred lowering)
        if key not in self._chunks:
            # the memory plans that decide need no binaries: only the program that runs (the whole one, or the
            # chunk chosen) is compiled, not every candidate (the fused attention of a transformer block at each)
            whole = self.lower(dev.name, dims, beam=beam, tuned=tuned, defer=True)
            outs, in_bufs = self._trace(dims)

            def lower_chunk(local_outs: list[UOp], inputs: list[tuple[UOp, str]]) -> Executable:
                kernels = self._build_kernels(dev, local_outs, beam, tuned, defer=True)
                outputs = list(zip(self.output_names, local_outs))
                return Executable(dev, kernels, inputs, outputs,
                                  memory=plan_for(dev, kernels, inputs, outputs, fixed_outputs=True))

            ch = chunk.choose(whole, self._all_decls(), dims, outs, in_bufs, lower_chunk)
            if ch is not None:
                compile_deferred(ch.low.kernels)
            if ch is not None and debug_level() >= 2:
                print(f"*** chunk: {ch.line()}", file=sys.stderr)
            self._chunks[key] = ch
        return self._chunks[key]

    def lower(self, device: str | None = None, dims: dict[str, int] | None = None, beam: int | None = None,
              tuned: bool = True, defer: bool = False) -> Executable:
        """The program compiled for one device and set of dims, as the realizer and bench run it (`defer`: as in
        `compile`)."""
        dev = _device(device)
        dims = self.resolve_dims(dims)
        kernels = self.compile(device=dev.name, dims=dims, beam=beam, tuned=tuned, defer=defer)
        outs, in_bufs = self._trace(dims)
        exe = Executable(dev, kernels, [(b, self._in_names[b.arg[0]]) for b in in_bufs],
                         list(zip(self.output_names, outs)))
        exe.bound = frozenset(self.weights)  # (their kernels run once per launch plan: tgc.engine.bound)
        return exe

    # --- symbolic sizes (tgc/codegen/sizes.py)
    def compile_symbolic(self, device: str | None = None, size_class: Any = None) -> SymbolicPlan:
        """The program's kernels compiled once for every size of a size class (default: every dim 2 or more),
        their sizes kernel arguments. TgcError (kind "user") when the program has no symbolic form."""
        dev = _device(device)
        cls = size_class if size_class is not None else tuple((n, "n") for n in self.dim_names)
        plan = self._symbolic(dev, tuple(cls))
        if isinstance(plan, str):
            raise TgcError(f"the program has no kernels valid for every size ({sizes.class_text(tuple(cls))}): "
                           f"{plan}", hint=f"give its dims ({', '.join(self.dim_names)}) to compile it for one size",
                           cli_hint="give its dims to compile it for one size: "
                                    + " ".join(f"-D {n}=INT" for n in self.dim_names), kind="user")
        return plan

    def _symbolic(self, dev: Any, cls: tuple) -> SymbolicPlan | str:
        key = (dev.name, cls)
        if key not in self._plans:
            try:
                self._plans[key] = self._build_symbolic(dev, cls)
            except TgcError as e:  # (the compiler's own reason, e.g. an index past 64 bits at every bound tried)
                self._plans[key] = f"its symbolic kernels could not be built: {e.msg}"
            except Exception as e:  # noqa: BLE001 - no symbolic form is a reason to compile per size, not a crash
                self._plans[key] = "its symbolic kernels could not be built (an internal error: DEBUG=2 prints it)"
                _internal_reason(e, "its symbolic kernels")
        return self._plans[key]

    def _build_symbolic(self, dev: Any, cls: tuple, templates_only: bool = False) -> SymbolicPlan | str:
        """The plan for one size class, or why there is none. The dim variables' bound (`sizes.var_bound`)
        assumes a kernel's index multiplies each dim once; where one multiplies a dim by itself (`w: f32[C, 3 *
        C]` indexes c * 3C + j, about 3 * C**2 * N) and its index range passes 64 bits at that bound, the plan is
        built again with a smaller bound (larger sizes run size-specialized kernels, checked at launch).
        `templates_only`: each kernel's general form lowered, not compiled, and no fast variants: a plan that
        cannot launch, for its kernels' templates and names (`_store_class_winners`); never kept in `_plans`."""
        with wanted_multiples() as wanted:
            plan = self._build_symbolic_bounded(dev, cls, templates_only)
        if isinstance(plan, str) and wanted:
            self._divided_dims.add((dev.name, cls))  # (`lower_symbolic`: a class-n narrowing may serve these dims)
        multiples: list[tuple[str, str | int, str]] = []
        cls2, path = cls, self.symbolic_paths.get((dev.name, cls), "")
        for _ in range(3):  # (a quotient of a quotient, `C // D // KH`, is met once `C // D` is exact)
            if not isinstance(plan, str):
                break
            # a constant divisor (`C // 12`) only where the program fails in the class (it is no size of the
            # program there: `cannot reshape`), or within a class already narrowed; `x[N // 2:]`, refused for a
            # remainder, is right at every N and keeps its reason
            failed = path.startswith(f"probes: {TRACED_ONCE}")
            more = self._with_multiples(cls2, multiples, wanted, constants=failed or bool(multiples))
            if more is None:
                break
            cls2, multiples = more
            with wanted_multiples() as wanted:
                plan2 = self._build_symbolic_bounded(dev, cls2, templates_only)
            path = self.symbolic_paths.pop((dev.name, cls2), "")  # (the program's classes only: said below)
            if isinstance(plan2, str):
                continue  # (today's reason is kept: the narrower class has no plan either)
            plan2.multiples = list(multiples)
            # (its layouts sized at the probe with the program's dims too: a declared input no kernel reads is
            # shaped in them, `C`, not `C_D * D`; review 18: every bind failed, "dim C is unknown")
            probe = sizes.probes(cls2)[0]
            plan2._layouts = classbind.Layouts({**probe, **self._program_dims(probe)}, plan2._layouts.share)
            plan2.user_class = cls
            plan = plan2
            first = self.symbolic_paths.get((dev.name, cls), "")
            self.symbolic_paths[(dev.name, cls)] = f"{first}; with {plan.class_text().split(', with ', 1)[1]}: {path}"
        return plan

    def _with_multiples(self, cls: tuple, multiples: list[tuple[str, str | int, str]],
                        wanted: list[tuple[str, str | int]], constants: bool = True
                        ) -> tuple[tuple, list[tuple[str, str | int, str]]] | None:
        """The class that makes the floor divisions the trace met (`symsize.wanted_multiples`) exact: each dim X of
        class n that the program divides by a dim Y of class n (`C // D`; by a constant k where no dim divides
        one, `C // 12`) traced as a hidden dim Q times Y, Q of class n (`_hidden`: `C = C_D * D`, so `C // D` is
        C_D, exact), with the multiples so far; or None (nothing to add, or a name taken)."""
        cur = dict(cls)
        by_dims = [(x, y) for x, y in wanted if isinstance(y, str)]
        new = [(x, y) for x, y in (by_dims or (wanted if constants else [])) if cur.get(x) == "n" and
               (cur.get(y) == "n" if isinstance(y, str) else y % sizes.UNIT != 0)]
        if not new:
            return None
        out, added = list(cls), list(multiples)
        for x, y in new:
            q = f"{x}_{y}"
            if q in self.dim_names or (q in self._hidden and self._hidden[q] != (x, y)) or \
                    any(n == q for n, _ in out) or all(n != x for n, _ in out):
                return None
            self._hidden[q] = (x, y)
            out = [(q, "n") if n == x else (n, c) for n, c in out]
            added.append((x, y, q))
        return tuple(out), added

    def _build_symbolic_bounded(self, dev: Any, cls: tuple, templates_only: bool) -> SymbolicPlan | str:
        # the first bound: `var_bound(k)` for k dims, raised to 2^15 where that is less (a product of two dims at
        # 2^15 is still a 32-bit launch value: the odd-size splits' derived arguments of a loop over two dims stay
        # within it; above, `fitted_bound` could raise further but those splits would be dropped); then lowered to
        # what the kernels' index math fits in 64 bits: by `sizes.fitted_bound` on the symbolic ASTs and, where
        # lowering still passes it, by the loop below
        bound = max(sizes.var_bound(sum(1 for _, c in cls if c in sizes.SYMBOLIC)), min(sizes.var_bound(1), 1 << 15))
        self._raise_dims = True
        while True:
            # (the bounds the kernels were lowered at: `_build_symbolic_at` sets them by `sizes.fitted_bound`)
            self._fitted_bound, self._raised = bound, {}
            try:
                plan = self._build_symbolic_at(dev, cls, bound, templates_only)
                if not isinstance(plan, str):
                    # (none where the front end's decisions cut the common bound: `_bounded_by_decisions`)
                    # (a raised dim is capped by the decisions too: `w[:2000]` at a raised G of 2^15 is all of
                    # w only up to G = 2000, above it the class's kernels would read all of w)
                    upto = plan.decided_upto
                    plan.dim_bounds = {n: b if upto is None else min(b, upto) for n, b in self._raised.items()} \
                        if plan.bound == self._fitted_bound else {}
                return plan
            except CompileError as e:
                if not e.msg.endswith("past 64 bits"):
                    raise
                if self._raised:  # (an index past 64 bits with dims raised: the common bound alone, as before)
                    self._raise_dims, bound = False, self._fitted_bound
                    continue
                bound = self._fitted_bound
                if bound < 2 ** 8:
                    raise
                bound = 2 ** _smaller_exponent(bound.bit_length() - 1, e.msg)

    def _build_symbolic_at(self, dev: Any, cls: tuple, bound: int, templates_only: bool = False
                           ) -> SymbolicPlan | str:
        if dev.kind == "REMOTE":
            # a REMOTE server checks every launch against the buffer sizes and grid its kernel source states
            return "kernels with symbolic sizes are not built for REMOTE devices: a server checks each launch " \
                   "against the sizes its kernel was compiled for"
        once = self._build_one_trace(dev, cls, bound, templates_only) if self.one_trace else "one trace is off"
        if isinstance(once, _NotProbeable):  # (no plan: the probes would accept what they cannot check)
            self.symbolic_paths[(dev.name, cls)] = f"none: {once}"
            return f"{once}, which the sizes tried for the class cannot check"
        self.symbolic_paths[(dev.name, cls)] = "one trace" if not isinstance(once, str) else f"probes: {once}"
        if not isinstance(once, str):
            return once
        p1, p2 = sizes.probes(cls)
        symbolic = [n for n, c in cls if c in sizes.SYMBOLIC]
        runs = []
        traced = []
        for probe in (p1, p2):
            try:
                traced.append(self._trace(probe)[0])
            except TgcError as e:
                return _failed_at_probe(probe, e.msg, once if probe is p1 else None)
        # a graph of another size at the two probes (a loop over a dim, unrolled) has no symbolic form: found
        # before scheduling it (a loop of 227 layers takes minutes to schedule); `graph_signature` below checks the
        # graphs of equal size
        sizes_of_graphs = {len(UOp(Ops.SINK, None, tuple(outs)).toposort()) for outs in traced}
        if len(sizes_of_graphs) > 1:
            return "its operations change with the sizes (a loop over a dim is unrolled: its length depends on it)"
        for probe, outs in zip((p1, p2), traced):
            try:
                items = [i for i in create_schedule(outs, dev.caps, split_columns=False) if i.ast.src]
            except TgcError as e:
                return _failed_at_probe(probe, e.msg, None)
            asts = [_symbolic_ast(i, probe, symbolic, bound) for i in items]
            slots, kslots, oslots = sizes.slots_of(items, outs, probe, symbolic)
            runs.append((outs, items, asts, slots, kslots, oslots))
        (outs1, items1, asts1, slots1, k1, o1), (_, items2, asts2, slots2, k2, o2) = runs
        if len(items1) != len(items2) or any(a is not b for a, b in zip(asts1, asts2)):
            return "its kernels change with the sizes in ways that are not products of dims"
        bound, raised, asts1 = sizes.fitted_bound(asts1, bound, self._raise_dims)  # (set by the products of dims)
        self._fitted_bound, self._raised = bound, raised
        if not sizes.same_slots(slots1, slots2) or k1 != k2 or o1 != o2:
            return "its buffers change with the sizes in ways that are not products of dims"
        signature = sizes.graph_signature(outs1, p1, symbolic)
        if sizes.instantiate_signature(signature, p2) != sizes.graph_signature(self._trace(p2)[0]):
            return "its operations change with the sizes"
        # every declared input's buffer, its shape as products of dims (bound at launch without tracing)
        in_shapes = []
        for b1, b2 in zip(self._trace(p1)[1], self._trace(p2)[1]):
            shape = tuple(sizes.factor(int(s), p1, symbolic) for s in b1.arg[2])
            if tuple(sizes.mono_value(m, p2) for m in shape) != tuple(b2.arg[2]):
                return "its input shapes change with the sizes in ways that are not products of dims"
            in_shapes.append((b1.dtype, b1.arg[1], shape))
        # the optimizations the heuristic picks at a representative size, each kernel's fast variant where they
        # apply to its symbolic form (launched where its checks hold at the dims given)
        rep = {n: sizes.REPRESENTATIVE[c] if c in sizes.SYMBOLIC else int(c) for n, c in cls}
        rep_items = None
        if not env_flag("NOOPT") and not templates_only:
            try:
                rep_items = [_unfused(i) for i in create_schedule(self._trace(rep)[0], dev.caps, split_columns=False)
                             if i.ast.src]
            except TgcError:
                rep_items = None
            if rep_items is not None and [sizes.name_shape(i.name) for i in rep_items] != \
                    [sizes.name_shape(i.name) for i in items1]:
                rep_items = None
        plan = self._plan_from(dev, cls, bound, templates_only, symbolic, p1, items1, asts1, slots1, k1, o1,
                               signature, in_shapes, rep_items, [sizes.name_shape(i.name) for i in items1])
        # the probes agree where a slice clamps the same at both (`x[:300]`): the front end's decisions bound it
        return self._bounded_by_decisions(plan, self._front_decisions(cls))

    def _plan_from(self, dev: Any, cls: tuple, bound: int, templates_only: bool, symbolic: list[str],
                   probe: dict[str, int], items1: list[ScheduleItem], asts1: list[UOp], slots1: list, k1: list,
                   o1: list, signature: tuple, in_shapes: list, rep_items: list[ScheduleItem] | None,
                   shapes: list[str], named: bool = False) -> SymbolicPlan:
        """The plan from a class's symbolic kernels (found by the probes or by one trace): each kernel's general
        form, and its fast variant with the opts the heuristic picks for `rep_items` (the same kernels at the
        representative size). `named`: the kernels' names already read as dims (one trace)."""
        p1 = probe
        rep = {n: sizes.REPRESENTATIVE[c] if c in sizes.SYMBOLIC else int(c) for n, c in cls}
        kernels, fast = [], []
        tails: list[list[Kernel]] = []  # per kernel, the tail kernels its fast variant needs (class n splits)
        alt: dict[int, Kernel | None] = {}  # per split kernel, its main kernel without threads (small sizes)
        derived: dict[str, tuple] = {}  # the splits' derived kernel arguments (`sizes.Split`)
        names: dict[str, int] = {}
        for i, (item, ast) in enumerate(zip(items1, asts1)):
            base = item.name if named else sizes.symbolic_name(item.name, p1, symbolic, self._hidden)
            n = names.get(base, 0)
            names[base] = n + 1
            item.line = self.line_of(item.meta.get("serves", item.output))
            sym_item = ScheduleItem(ast, item.bufs, base, item.line, item.meta)
            kname = f"{base}n{n}" if n else base
            kernels.append(build_symbolic_kernel(sym_item, dev, p1, kname, compile=not templates_only))
            fast.append(None)
            tails.append([])
            if templates_only:
                continue
            if is_fused_attention(ast):  # its fast variant: the same kernel with threads (tgc.codegen.attention)
                fast[-1] = _fast_attention(sym_item, dev, rep, kname) if rep_items is not None else None
                continue
            split = None
            if rep_items is not None and not dev.caps.gpu and any(c == "n" for _, c in cls):
                split = _split_variant(sym_item, dev, cls, p1, kname, f"k{i}", bound)
            if split is not None:
                fast[-1], alt[i], tails[-1], more = split
                derived.update(more)
            elif rep_items is not None:
                fast[-1], plain = _fast_variant(sym_item, rep_items[i], dev, rep, kname)
                if plain is not None:
                    alt[i] = plain
        plan = SymbolicPlan(dev, cls, kernels, slots1, k1, o1, signature, bound, symbolic, fast)
        plan.tails, plan.derived = tails, derived
        plan.unthreaded = [alt.get(i) for i in range(len(kernels))]
        plan.shapes = shapes
        plan.asts = asts1
        plan.item_bufs = [list(i.bufs) for i in items1]
        plan.input_shapes = in_shapes
        return plan

    def _build_one_trace(self, dev: Any, cls: tuple, bound: int, templates_only: bool = False
                         ) -> SymbolicPlan | str:
        """The plan for one size class from ONE trace whose dims are front-end size variables
        (`tgc.ir.symsize.SymSize` at the representative size): shapes, slice bounds and the scheduler's index
        constants carry their products of dims, which become the `D_<dim>` variables; the heuristic's opts are
        picked on the same kernels at the representative size. Or why not (the probe path then runs): a floor
        division of a `32n` dim that is not exact (`_unit_mono`), a size decision the class does
        not answer (`NotTraceable`: a floor division of a dim, a loop over a dim, an order between unrelated
        dims, ...), or a size that lost its dims."""
        symbolic = [n for n, c in cls if c in sizes.SYMBOLIC]
        if not symbolic:
            return "one trace serves classes with a dim of n or 32n"
        units = {n for n, c in cls if c == "32n"}  # (their variables start at 32, as the probe path writes them)
        lows = {n: sizes.UNIT for n in units}
        rep = {n: sizes.REPRESENTATIVE[c] if c in sizes.SYMBOLIC else int(c) for n, c in cls}
        p1, p2 = sizes.probes(cls)  # traced at the first; each size decision must come out the same at both
        tagged = {n: SymSize.dim(n, v) if n in symbolic else v for n, v in p1.items()}
        try:
            with checked_at((p1, p2)) as decided:
                outs, bufs = self._trace(tagged)
                with representative(rep):  # (the scheduler's speed choices answered there: `speed_choice`)
                    items = [i for i in create_schedule(outs, dev.caps, split_columns=False) if i.ast.src]
            for i in items if self._hidden else ():  # (a narrowed class's names: C, not `C_D * D`'s probe value)
                i.name = ("attn_" if "unfused_ast" in i.meta else "") + \
                    kernel_name(i.meta.get("unfused_ast", i.ast), self._hidden)
            if (why := decided_by_remainder(decided)) is not None:
                return why
            if any("attention" in i.meta for i in items):
                return "a fused attention kernel is scheduled by its sizes"
            mono = (lambda m: _unit_mono(m, units)) if units else None
            asts = [_tagged_ast(i, bound, lows, mono) for i in items]
            for a in asts:
                if isinstance(a, str):
                    return a
                if (why := sizes.lost_sizes(a, p1, symbolic)) is not None:
                    return why
            bound, raised, fitted = sizes.fitted_bound([a for a in asts if isinstance(a, UOp)], bound,
                                                       self._raise_dims)
            asts = list(fitted)  # (the products of dims the kernels form set the bounds: `sizes.fitted_bound`)
            self._fitted_bound, self._raised = bound, raised
            slots, kslots, oslots = sizes.slots_of(items, outs, p1, ())
            signature = sizes.graph_signature(outs, p1, ())
            in_shapes = [(b.dtype, b.arg[1], tuple(sizes.factor(s, p1, ()) for s in b.arg[2])) for b in bufs]
            if units:
                signature = _unit_atoms(slots, in_shapes, signature, units)
            # the kernels' buffers at the traced sizes, as the probe path holds them (lowering sizes them)
            concrete: dict[UOp, UOp] = {}
            for i in items:
                i.bufs = [_at_trace_sizes(b, concrete) for b in i.bufs]
            # each kernel at the representative size, where the heuristic picks the fast variants' opts (a fused
            # attention: its plain lowering, `_unfused`), and its name's shape there (`attn_` the fused one's)
            plains = [a if "unfused_ast" not in i.meta or not isinstance(a, UOp) or not is_fused_attention(a)
                      else sizes.symbolize_tagged(i.meta["unfused_ast"], bound, lows, mono)
                      for a, i in zip(asts, items)]
            rep_items: list[ScheduleItem] | None = [
                ScheduleItem(sizes.instantiate_ast(a, rep), i.bufs, "", i.line, i.meta) for a, i in zip(plains, items)]
            shapes = [sizes.name_shape(("attn_" if "unfused_ast" in i.meta else "") + kernel_name(r.ast))
                      for i, r in zip(items, rep_items or [])]
            if not _fuses_alike(outs, rep):
                # the scheduler fuses attentions by their sizes (a head dim of at most 256): where it fuses others
                # at the representative size, its kernels there are not these, and the probe path, scheduling
                # there, picks no fast variants
                rep_items = None
            plan = self._plan_from(dev, cls, bound, templates_only, symbolic, p1, items, asts, slots, kslots,
                                   oslots, signature, in_shapes, None if env_flag("NOOPT") else rep_items, shapes,
                                   named=True)
            return self._bounded_by_decisions(plan, self._trace_decisions[tuple(sorted(tagged.items()))])
        except NotProbeable as e:
            return _NotProbeable(str(e))
        except NotTraceable as e:
            return str(e)
        except TgcError as e:
            if isinstance(e, CompileError) and e.msg.endswith("past 64 bits"):
                raise  # (`_build_symbolic` builds again with a smaller bound)
            return f"{TRACED_ONCE}{e.msg}"
        except Exception as e:  # noqa: BLE001 - a size that code does not expect: the probes decide, never a crash
            _internal_reason(e, "the one trace")
            return "the one trace met code that takes no symbolic size (an internal error: DEBUG=2 prints it)"

    def _front_decisions(self, cls: tuple) -> list:
        """The front end's size decisions for a class traced at its first probe with its dims as `SymSize`s
        (answered as the probes answer them): what the probe path, tracing at plain sizes, does not see. Where
        the trace refuses (`NotTraceable`), the decisions made before the refusal."""
        symbolic = [n for n, c in cls if c in sizes.SYMBOLIC]
        p1, p2 = sizes.probes(cls)
        tagged = {n: SymSize.dim(n, v) if n in symbolic else v for n, v in p1.items()}
        key = tuple(sorted(tagged.items()))
        if key not in self._trace_decisions:
            with checked_at((p1, p2)):
                try:
                    self._trace(tagged)
                except Exception:  # noqa: BLE001 - a refusal or error: the decisions made before it are kept
                    pass
        return self._trace_decisions.get(key, [])

    @staticmethod
    def _bounded_by_decisions(plan: SymbolicPlan, decided: list) -> SymbolicPlan | str:
        """`plan` trusted only where the front end's size decisions keep their answers at the probes: from
        where those bounding the dims from below hold (a slice's clamp at `N - 100`: checked with the source
        below), up to where those bounding them from above hold (`x[:300]` is all of x up to N = 299: above,
        the dims leave the class's range and run size-specialized). A decision comparing dims with each other
        (`2M - N > 0`, `M == N`) bounds no range: the class has no symbolic form (why, `decided_across`). The
        scheduler's decisions are not counted: its thresholds (split-reduce, packing) change the speed, not the
        result."""
        if (why := decided_across(decided)) is not None:
            return why
        plan.trusted_from = max(plan.trusted_from, decided_from(decided))
        upto = decided_upto(decided)
        if upto is not None:
            plan.bound = min(plan.bound, upto)
            plan.decided_upto = upto if plan.decided_upto is None else min(plan.decided_upto, upto)
        return plan

    def _store_class_winners(self, dev: Any, dims: dict[str, int]) -> int:
        """After BEAM at `dims`: each kernel's stored winner also becomes the winner of its symbolic form for the
        dims' size class (so a later run at a nearby size uses it). Returns how many were stored."""
        cls = sizes.size_class(self.dim_names, dims)
        plan = self._plans.get((dev.name, cls))  # (built already: its templates; else lowered, not compiled)
        if plan is None:
            try:
                plan = self._build_symbolic(dev, cls, templates_only=True)
            except Exception as e:  # noqa: BLE001 - as `_symbolic`: no symbolic form, no class winners
                plan = f"its symbolic kernels could not be built ({type(e).__name__}: {e})"
        if isinstance(plan, str):
            return 0
        items = [i for i in self.schedule(dims, dev.name) if i.ast.src]
        if [sizes.name_shape(i.name) for i in items] != plan.shapes:
            return 0
        stored = 0
        for item, k in zip(items, plan.kernels):
            entry = search.lookup_entry(prepare_ast(item.ast, dev), dev)
            if entry is not None:  # (a dropped winner stays dropped: `search.drop`; a partial one partial)
                search.store(k.template, dev, entry["opts"], entry.get("time_s") or 0.0, k.name, entry["width"],
                             dropped=entry["dropped"], partial=entry["partial"])
                stored += 1
        self._plans.pop((dev.name, cls), None)  # rebuilt with the class winners on its next use
        return stored

    def lower_symbolic(self, device: str | None, dims: dict[str, int]) -> tuple[Executable | None, str]:
        """The program's symbolic kernels bound to these dims, as the realizer runs them, and "" ; or (None, why
        not) where the launch-time checks fail (the caller runs the size-specialized kernels instead). Only the
        size class's first use traces, schedules and lowers; binding evaluates its sizes (`SymbolicPlan.bind`)."""
        dev = _device(device)
        dims = self.resolve_dims(dims)
        cls = sizes.size_class(self.dim_names, dims)
        # (a failure text, a 32n class's without a plan of its own, is not built: its entry holds narrowed plans)
        built = not isinstance(self._plans.get((dev.name, cls), ""), str)
        if not built:  # the program cache's entry for the class (the saved plan): bound here, nothing traced
            found = self._cached_symbolic(dev, dims)
            entry = None if found is None else progcache.bind_symbolic(found, self.source, dims, self.path)
            try:
                if entry is not None:
                    return entry.executable(dev.name), ""
            except PackageError:
                pass  # (a check the saved kernels fail at these dims: the plan below says what runs instead)
        plan = self._symbolic(dev, cls)
        narrowed_why = ""
        if isinstance(plan, str) and (dev.name, cls) in self._divided_dims:
            # a class with 32n dims and no plan, whose trace divided a dim: the class-n narrowing's multiples at
            # these dims (`_narrowed_for`: its plan where the hidden dims are of class n, else a plan built for
            # the hidden dims' own classes, C_D of class n and D of 32n at C = 768, D = 64)
            alt = self._narrowed_for(dev, cls, dims)
            if not isinstance(alt, str):
                low, narrowed_why = alt.bind(self, dims)
                if low is not None:
                    self._store_narrowed(dev, dims, cls, alt)
                    return low, ""
            else:
                narrowed_why = alt
        if isinstance(plan, str):
            return None, f"no kernels valid for every size ({sizes.class_text(cls)}): {plan}" + \
                (f"; narrowed: {narrowed_why}" if narrowed_why else "")
        low, why = plan.bind(self, dims)
        key = (dev.name, "symbolic", tuple(sorted(cls)), env_int("BEAM", 0))
        # (stored once the class's lookup missed and some dims bind: the entry's plan is the class's, not the dims')
        if low is not None and self._symbolic_entries.get(key, False) is None and key not in self._stored:
            self._stored.add(key)
            progcache.store_symbolic(self, dev, dims, plan)
        return low, why

    def _narrowed_for(self, dev: Any, cls: tuple, dims: dict[str, int]) -> SymbolicPlan | str:
        """For dims whose class `cls` (with 32n dims) has no plan: the narrowed plan serving them, or why none
        ("" where nothing narrows). The class with each 32n dim read as n is narrowed as ever (`_build_symbolic`:
        X traced as Q * Y, Q and Y of class n); its multiples give the hidden dims' values at `dims` (Y divides
        X: else that plan, whose bind says why), and their classes, each exactly of its class, pick the plan: that
        one where every hidden dim is of class n (C = 64 of D = 8 heads), else one built for those classes (C =
        768, D = 64: C_D of class n, D of 32n; C = 2048: both 32n; cached per hidden class). A plan built for a
        class is exact over it (every size of it is X = Q * Y with Q and Y of their classes), and its bind
        (`SymbolicPlan.class_dims`) accepts only dims whose hidden dims are exactly of that class."""
        base = self._symbolic(dev, tuple((n, "n" if c == "32n" else c) for n, c in cls))
        if isinstance(base, str) or not base.multiples:
            return ""
        d, bad = sizeexpr.with_quotients(base.multiples, dims)
        hidden = [(n, c if c not in sizes.SYMBOLIC else "1" if d[n] < 2 else sizeexpr.size_class([n], d)[0][1])
                  for n, c in base.size_class] if bad is None else []
        if bad is not None or any(c == "1" for (_, c), (_, b) in zip(hidden, base.size_class) if b != "1"):
            return base  # (its bind says why: X no multiple of Y, or a quotient below 2)
        hidden_cls = tuple(hidden)
        if hidden_cls == base.size_class:
            return base
        return self._narrowed_plan(dev, base, hidden_cls)

    def _narrowed_plan(self, dev: Any, base: SymbolicPlan, hidden: tuple) -> SymbolicPlan | str:
        """The plan of `base`'s multiples built for the hidden class `hidden` (its Qs and Ys of class n or 32n),
        or why none; built once per device and class."""
        key = (dev.name, hidden)
        if key not in self._narrowed:
            try:
                plan = self._build_symbolic_bounded(dev, hidden, False)
            except TgcError as e:
                plan = f"its symbolic kernels could not be built: {e.msg}"
            except Exception as e:  # noqa: BLE001 - as `_symbolic`: no plan, size-specialized kernels run
                plan = "its symbolic kernels could not be built (an internal error: DEBUG=2 prints it)"
                _internal_reason(e, "its symbolic kernels")
            self.symbolic_paths.pop((dev.name, hidden), None)  # (the program's classes only)
            if not isinstance(plan, str):
                plan.multiples = list(base.multiples)
                probe = sizes.probes(hidden)[0]
                plan._layouts = classbind.Layouts({**probe, **self._program_dims(probe)}, plan._layouts.share)
                plan.user_class = _made_class(base, hidden)
            else:
                written = sizeexpr.quotients(base.multiples)
                wide = [written.get(n, n) for (n, c), (_, b) in zip(hidden, base.size_class) if c != b]
                plan = f"with {' and '.join(f'{x} a multiple of {y}' for x, y in base._written())}, " \
                       f"{' and '.join(wide)} a multiple of {sizes.UNIT}: {plan}"
            self._narrowed[key] = plan
        return self._narrowed[key]

    def narrowed_variants(self, dev: Any, base: SymbolicPlan, room: int = 1 << 30
                          ) -> list[tuple[tuple, SymbolicPlan | str]]:
        """The plans (or why none) of `base`'s multiples for each hidden class whose Qs and dim Ys are of class
        n or 32n (some 32n), every other dim as in `base` (`tgc.package.build_symbolic`: a package of a narrowed
        class holds them, so C = 768 of D = 64 heads is served), each with the class of the program's dims it
        makes: one build per class, none built once `room` plans were."""
        from itertools import product
        free = [n for n in dict.fromkeys([*(q for _, _, q in base.multiples),
                                           *(y for _, y, _ in base.multiples if isinstance(y, str))])
                if dict(base.size_class).get(n) == "n"]
        out: list[tuple[tuple, SymbolicPlan | str]] = []
        for pick in product(("n", "32n"), repeat=len(free)):
            if "32n" in pick and sum(not isinstance(p, str) for _, p in out) < room:
                at = dict(zip(free, pick))
                hidden = tuple((n, at.get(n, c)) for n, c in base.size_class)
                out.append((_made_class(base, hidden), self._narrowed_plan(dev, base, hidden)))
        return out

    def _store_narrowed(self, dev: Any, dims: dict[str, int], cls: tuple, plan: SymbolicPlan) -> None:
        """A narrowed plan bound at dims of class `cls` (with 32n dims): stored with the others that served this
        class in this process as the class's program-cache entry (one symbolic package holding each), where the
        class's entry, loaded again now (another process may have written it since), does not hold it; the
        entry's other classes are kept (copied, not built again)."""
        served = self._served.setdefault((dev.name, cls), [])
        if any(p is plan for p in served) or self.weights:
            return
        served.append(plan)
        key = (dev.name, "symbolic", tuple(sorted(cls)), env_int("BEAM", 0))
        found = progcache.load_symbolic(self.source, dims, dev, self.path, self.weights_digest)
        self._symbolic_entries[key] = found
        if found is not None and any((c.hidden or c.cls) == dict(plan.size_class) for c in found[1].classes):
            return
        # (8 at most: this process's latest, then the entry's; a package holds at most `MAX_CLASSES`, and the
        # entry is written again for each new one)
        progcache.store_symbolic(self, dev, dims, plan, more=served[-8:-1], held=found)

    def _cached_symbolic(self, dev: Any, dims: dict[str, int]) -> tuple[dict, Any] | None:
        """The program cache's symbolic entry for the size class of `dims` on `dev` (loaded once per program,
        class, device and BEAM; `progcache.load_symbolic`), or None."""
        cls = sizes.size_class(self.dim_names, dims)
        key = (dev.name, "symbolic", tuple(sorted(cls)), env_int("BEAM", 0))
        if key not in self._symbolic_entries:
            found = None if self.weights else \
                progcache.load_symbolic(self.source, dims, dev, self.path, self.weights_digest)
            self._symbolic_entries[key] = found
            if debug_level() >= 2:
                hit = "hit: nothing to lower or compile" if found is not None else "miss"
                print(f"*** program cache {hit} ({self.path or self.filename}, {dev.name}, "
                      f"{sizes.class_text(cls)})", file=sys.stderr)
        return self._symbolic_entries[key]

    # --- running
    def run(self, device: str | list[str] | None = None, dims: dict[str, int] | None = None, cast: bool = False,
            inputs: dict[str, Any] | None = None, shard: dict[str, int] | None = None, symbolic: bool = False,
            **kw_inputs: Any) -> dict[str, np.ndarray]:
        """Execute on a device; returns {output name: numpy array}. Inputs come as keywords (`x=arr`) or,
        for names that clash with these parameters, as `inputs={"device": arr}`. A device list
        (`"CPU:0,CPU:1"` or a list) runs the program sharded: `shard={"x": 0}` splits input x along axis 0
        across the devices, inputs not named are replicated; outputs come back whole. `symbolic=True` (one
        device) runs the kernels compiled once for the dims' size class (`compile_symbolic`) where the
        launch-time checks allow, else the size-specialized ones; `last_run` says which ran."""
        dims, arrays = self.bind({**(inputs or {}), **kw_inputs}, dims, cast=cast)
        names = device_names(device)
        shard_axes = self.shard_axes(shard, dims, len(names))
        self.last_chunking = None
        if len(names) > 1:
            if symbolic:
                raise TgcError("symbolic sizes run on one device, not a device list",
                               hint="drop symbolic=True to run sharded")
            self.last_run = "specialized"
            return self._run_list(names, dims, shard_axes, arrays)
        name = names[0]
        dev = _device(name)
        dev.ensure_runnable()
        if symbolic:
            low, why = self.lower_symbolic(name, dims)
            self.last_run = "symbolic" if low is not None else f"specialized: {why}"
            if low is not None:  # (run again at these dims: one launch plan, as one device graph)
                key = (dev.name, tuple(sorted(dims.items())), "symbolic")
                return executable.run(low, arrays, replay=self._launch_plans, key=key)
        else:
            self.last_run = "specialized"
        ready, first = self._ready_for(dev, dims, arrays)
        self.last_chunking = ready.chunking
        out = ready.run(arrays)
        if first:
            self._keep_ready(dev, dims, ready)
        return out

    def _ready_key(self, dev: Any, dims: dict[str, int]) -> tuple:
        return (dev.name, tuple(sorted(dims.items())), tuple(os.environ.get(v) for v in progcache.KERNEL_ENV))

    def _ready_for(self, dev: Any, dims: dict[str, int], arrays: dict[str, np.ndarray]) -> tuple[_Ready, bool]:
        """What a run of the program at `dims` on `dev` runs, and whether it is new: the one an earlier run here
        built or loaded (kept by device, dims and `progcache.KERNEL_ENV`'s values: nothing traced, scheduled,
        lowered or looked up again), else the program cache's entry (lowered once) or the program lowered now."""
        ready = self._ready.get(self._ready_key(dev, dims))
        if ready is not None and ready.device is dev:
            return ready, False
        entry = self._cached_entry(dev, dims)
        if entry is not None and entry.fits(arrays):  # the program cache: nothing to lower
            exe, replay, key, own = entry.prepared(dev.name)
            return _Ready(dev, exe, replay, key, entry.chunking(dev.name), own, entry), True
        ch = self._chunking(dev, dims, env_int("BEAM", 0), True)
        if ch is not None:
            return _Ready(dev, ch.executable(), None, None, ch), True
        key = (dev.name, tuple(sorted(dims.items())), env_int("BEAM", 0))
        return _Ready(dev, self.lower(dev.name, dims), self._launch_plans, key, None), True

    MAX_READY = 16  # executables kept for reuse per program (the least recently built dropped first)

    def _keep_ready(self, dev: Any, dims: dict[str, int], ready: _Ready,
                    recompute: dict[str, Any] | None = None) -> None:
        """After a first run at a key that succeeded: keep what it ran; store a cold run in the program cache
        (with `recompute`, the recompute factor where the caller has it: `_store_entry`)."""
        self._ready[self._ready_key(dev, dims)] = ready
        while len(self._ready) > self.MAX_READY:
            self._ready.pop(next(iter(self._ready)))
        if ready.entry is None:
            self._store_entry(dev, dims, ready.chunking, ready.exe, recompute)

    def _run_list(self, names: list[str], dims: dict[str, int], shard: dict[str, int],
                  arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A run on a device list: from the program cache's entry where it holds one (nothing lowered), else the
        executable lowered here (then stored); run again at a key, replayed (`executable.StepsPlan`)."""
        entry = self._cached_list_entry(names, dims, shard)
        if entry is not None and entry.fits(arrays):
            return entry.run(",".join(names), arrays)
        key = (tuple(names), tuple(sorted(dims.items())), tuple(sorted(shard.items())), env_int("BEAM", 0))
        exe = self.lower_multi(names, dims, shard)
        out = executable.run(exe, arrays, replay=self._launch_plans, key=key)
        if self._entries.get(key, False) is None and key not in self._stored:
            self._stored.add(key)
            progcache.store_list(self, exe.devices, names, dims, shard, exe)
        return out

    def _cached_list_entry(self, names: list[str], dims: dict[str, int], shard: dict[str, int]
                           ) -> progcache.Entry | None:
        """The program cache's entry for these dims on the device list, sharded as `shard` (looked up once per
        program, list, dims, shard and BEAM), or None."""
        key = (tuple(names), tuple(sorted(dims.items())), tuple(sorted(shard.items())), env_int("BEAM", 0))
        if key not in self._entries:
            devs = progcache.list_devices(names)
            entry = None if devs is None or self.weights else \
                progcache.lookup_list(self.source, dims, devs, names, shard, self.path)
            self._entries[key] = entry
            if debug_level() >= 2:
                hit = "hit: nothing to lower or compile" if entry is not None else "miss"
                print(f"*** program cache {hit} ({self.path or self.filename}, {','.join(names)})", file=sys.stderr)
        return self._entries[key]

    def cached(self, device: str | None = None, dims: dict[str, int] | None = None,
               shard: dict[str, int] | None = None) -> bool:
        """Whether the program cache holds this program for the device (or device list, sharded as `shard`) and
        these dims (a run needs no compile)."""
        names = device_names(device)
        dims = self.resolve_dims(dims)
        if len(names) > 1:
            return self._cached_list_entry(names, dims, self.shard_axes(shard, dims, len(names))) is not None
        return self._cached_entry(_device(names[0]), dims) is not None

    def _cached_entry(self, dev: Any, dims: dict[str, int]) -> progcache.Entry | None:
        """The program cache's entry for these dims on `dev` (looked up once per program, dims, device and
        BEAM), or None (`tgc.progcache`)."""
        key = (dev.name, tuple(sorted(dims.items())), env_int("BEAM", 0))
        if key not in self._entries:
            entry = progcache.lookup(self.source, dims, dev, self.path, self.weights_digest)
            self._entries[key] = entry
            if debug_level() >= 2:
                hit = "hit: nothing to lower or compile" if entry is not None else "miss"
                print(f"*** program cache {hit} ({self.path or self.filename}, {dev.name})", file=sys.stderr)
                if entry is not None and entry.chunk is not None:
                    print(f"*** chunk: {entry.chunking(dev.name).line()}", file=sys.stderr)
        return self._entries[key]

    def _store_entry(self, dev: Any, dims: dict[str, int], chunking: Chunking | None,
                     ran: Executable | None = None, recompute: dict[str, Any] | None = None) -> None:
        """After a cold run: store the program as built (once per program, dims, device and BEAM); `ran`, the
        executable the run ran (the whole program's: its memory plan is the one the entry holds, planned once)."""
        key = (dev.name, tuple(sorted(dims.items())), env_int("BEAM", 0))
        if self._entries.get(key, False) is None and key not in self._stored:
            self._stored.add(key)
            # the recompute factor where the whole program's kernels at these dims are built already (a warm
            # `tgc bench` reports it from the entry); not where only a chunk's are (nothing compiled for it)
            rec = recompute
            if rec is None:
                kernels = self._kernels.get((dev.name, tuple(sorted(dims.items())), key[2], True))
                rec = None if kernels is None else self._recompute(kernels, self._trace(dims)[0])
            progcache.store(self, dev, dims, chunking, low=ran if chunking is None else None, recompute=rec)

    MAX_PLANS = 4  # launch plans (with their device buffers) kept per program, for the sizes run last

    def release(self) -> None:
        """Give back the device buffers that this program's launch plans (and chunked runs) keep between runs."""
        self._launch_plans.release()
        for ready in self._ready.values():
            release_kept(ready.exe)
        self._ready.clear()
        for entry in self._entries.values():
            if entry is not None:
                entry.release()

    # --- many devices
    def device_kernels(self, device: str | list[str], dims: dict[str, int] | None = None,
                       shard: dict[str, int] | None = None, beam: int | None = None, tuned: bool = True
                       ) -> list[tuple[str, Kernel]]:
        """(device name, kernel) for every launch of the program on a device list, in launch order."""
        names = device_names(device)
        dims = self.resolve_dims(dims)
        ml = self.lower_multi(names, dims, self.shard_axes(shard, dims, len(names)), beam, tuned)
        return [(names[d], k) for d, k in ml.launches()]

    def shard_axes(self, shard: dict[str, int] | None, dims: dict[str, int], n: int) -> dict[str, int]:
        """Check `shard` ({input name: axis}) against the declarations, dims and the device count; the axes
        made non-negative. Sharding on one device is an error (it would silently do nothing)."""
        out: dict[str, int] = {}
        if shard and n == 1:
            raise TgcError("sharding an input needs a device list, not one device",
                           hint="give a device list, e.g. device='CPU:0,CPU:1', or drop shard=")
        declared = {d.name: d for d in self.inputs}
        if shard is not None and not isinstance(shard, Mapping):
            raise TgcError(f"shard must be a dict of input name to axis, e.g. {{'x': 0}}, not a "
                           f"{type(shard).__name__}")
        for name, axis in (shard or {}).items():
            decl = declared.get(name)
            if decl is None:
                raise TgcError(f"cannot shard '{name}': the program has no input of that name", file=self.filename,
                               hint=names_hint(name, sorted(declared)))
            if not isinstance(axis, int) or isinstance(axis, bool):
                raise TgcError(f"the shard axis of '{name}' must be an integer, got {axis!r}")
            shape = concrete_shape(decl, dims)
            if not -len(shape) <= axis < len(shape):
                raise TgcError(f"cannot shard '{name}' along axis {axis}: it has {len(shape)} "
                               f"ax{'is' if len(shape) == 1 else 'es'} ({_decl_text(decl)})", **self._at(decl),
                               hint=f"use an axis from 0 to {len(shape) - 1}" if shape else "a scalar is replicated")
            axis %= len(shape)
            if shape[axis] < n:
                raise TgcError(f"cannot shard '{name}' along axis {axis} across {n} devices: that axis has only "
                               f"{shape[axis]} row{'s' if shape[axis] != 1 else ''}", **self._at(decl),
                               hint="shard along a longer axis, use fewer devices, or leave it replicated")
            out[name] = axis
        return out

    def lower_multi(self, devices: list[str], dims: dict[str, int], shard: dict[str, int], beam: int | None = None,
                    tuned: bool = True) -> Executable:
        """The program planned across a device list (`tgc.engine.multi.plan`) with each device's part compiled
        through the single-device pipeline (each distinct shard scheduled, and each distinct kernel lowered and
        compiled, once per group of devices that lower alike, `_lowers_alike`: CPU:0 and CPU:1 share them; each
        device launches its own copy), made one `Executable` (`tgc.engine.multi.build_executable`)."""
        return self._lower_multi(devices, dims, shard, beam, tuned)[0]

    def _lower_multi(self, devices: list[str], dims: dict[str, int], shard: dict[str, int], beam: int | None = None,
                     tuned: bool = True) -> tuple[Executable, list[list[ScheduleItem]]]:
        """`lower_multi`'s executable, and per device its schedule items (what BEAM searches)."""
        dims = self.resolve_dims(dims)
        beam = env_int("BEAM", 0) if beam is None else beam
        key = (tuple(devices), tuple(sorted(dims.items())), tuple(sorted(shard.items())), beam, tuned)
        if key in self._multi:
            return self._multi[key]
        devs = device_list(devices)
        for dev in devs:
            dev.ensure_runnable()
        outs, in_bufs = trace(self.parsed, dims, {})
        index = {n: i for i, n in enumerate(self._in_names)}
        p = plan_multi(outs, in_bufs, {index[k]: v for k, v in shard.items()}, len(devs))
        memo: dict[tuple, Kernel] = {}
        alike: dict[tuple, Kernel] = {}  # (`_lowers_alike(dev)`, ast, bufs) -> the first device's kernel
        schedules: dict[tuple, tuple[dict, list[ScheduleItem]]] = {}  # (`_lowers_alike(dev)`, nodes) -> schedule
        items_of: list[list[ScheduleItem]] = [[] for _ in devs]
        # one name per distinct kernel code across the executable (the same AST on two devices keeps one name;
        # two different kernels of the same shape get `r_6_4`, `r_6_4n1`, as on one device)
        name_of: dict[UOp, str] = {}
        taken: dict[str, int] = {}

        def unique_name(item: ScheduleItem) -> str:
            if item.ast not in name_of:
                n = taken.get(item.name, 0)
                taken[item.name] = n + 1
                name_of[item.ast] = f"{item.name}n{n}" if n else item.name
            return name_of[item.ast]

        def build(d: int, nodes: list[UOp]) -> tuple[list[UOp], list[Kernel]]:
            """Device d's kernels computing `nodes`; the nodes that then hold them (split reductions differ)."""
            dev = devs[d]
            todo = [n for n in dict.fromkeys(nodes) if n.op is not Ops.BUFFER]
            sk = (_lowers_alike(dev), tuple(todo))  # (equal shards on devices alike: one schedule)
            if sk not in schedules:
                split = dict(zip(todo, split_large_reduces(todo))) if todo else {}
                schedules[sk] = split, [it for it in create_schedule(list(dict.fromkeys(split.values())), dev.caps)
                                        if it.ast.src]
            split, items = schedules[sk]
            items_of[d].extend(items)
            kernels = []
            for item in items:
                item.line = None
                mk = (id(dev), item.ast, tuple(item.bufs))  # (equal ASTs may read different buffers)
                if mk not in memo:
                    # a device that lowers and compiles alike (`_lowers_alike`: CPU:0 and CPU:1, equal shards)
                    # takes the kernel built for the first one, bound to itself
                    ak = (_lowers_alike(dev), *mk[1:])
                    memo[mk] = build_kernel(item, dev, beam=beam, name=unique_name(item), tuned=tuned) \
                        if ak not in alike else _dc_replace(alike[ak], device=dev, _program=None)
                    alike.setdefault(ak, memo[mk])
                kernels.append(memo[mk])
            return [split.get(n, n) for n in nodes], kernels

        step_nodes, step_kernels = [], []
        for step in p.steps:
            built = [build(d, [step.srcs[d]]) for d in range(len(devs))]
            step_nodes.append([b[0][0] for b in built])
            step_kernels.append([b[1] for b in built])
        out_nodes, out_kernels = [], []
        for d in range(len(devs)):
            mine = [o.locals[d] if o.axis is not None or d == 0 else None for o in p.outputs]
            nodes, kernels = build(d, [m for m in mine if m is not None])
            it = iter(nodes)
            out_nodes.append([next(it) if m is not None else None for m in mine])
            out_kernels.append(kernels)
        exe = build_executable(devs, p, step_nodes, step_kernels, out_nodes, out_kernels,
                               dict(enumerate(self._in_names)), list(self.output_names))
        if env_int("DEBUG", 0) >= 2:
            for note in p.notes:
                print(f"*** multi: {note}", file=sys.stderr)
        self._multi[key] = (exe, items_of)
        return self._multi[key]

    def reference(self, dims: dict[str, int] | None = None, **inputs: Any) -> dict[str, np.ndarray]:
        """The program evaluated by numpy in float64 (ints exact), for `--check`."""
        dims, arrays = self.bind(inputs, dims, cast=True)
        outs, bufs = self._trace(dims)
        env = {b: arrays[self._in_names[b.arg[0]]] for b in bufs}
        return {name: evaluate(o, env) for name, o in zip(self.output_names, outs)}

    def reference_with_scale(self, dims: dict[str, int] | None = None, **inputs: Any
                             ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """`reference`, and for each output the error scale of every element (`tgc.engine.reference`): the
        tolerance `--check` allows an element grows with it (`tgc.engine.compare`)."""
        dims, arrays = self.bind(inputs, dims, cast=True)
        outs, bufs = self._trace(dims)
        env = {b: arrays[self._in_names[b.arg[0]]] for b in bufs}
        values, scales = {}, {}
        for name, o in zip(self.output_names, outs):
            values[name], scales[name] = evaluate_with_scale(o, env)
        return values, scales

    def output_types(self, dims: dict[str, int]) -> list[tuple[str, DType, tuple[int, ...]]]:
        outs, _ = self._trace(self.resolve_dims(dims))
        return [(n, o.dtype, shape_of(o)) for n, o in zip(self.output_names, outs)]

    def bench(self, device: str | list[str] | None = None, dims: dict[str, int] | None = None, repeat: int = 10,
              beam: int = 0, inputs: dict[str, np.ndarray] | None = None,
              warmup: int = 1, tuned: bool = True, shard: dict[str, int] | None = None,
              symbolic: bool = False) -> dict[str, Any]:
        """Time the program on device-resident inputs (random ones by default, `tgc.engine.inputs`); see
        `tgc bench --json`. numpy's time beside it is the CLI's (`tgc.baselines.numpy_eval.time_numpy`).
        On a device list: per-device kernel time, the collectives' time and bandwidth, the whole program.
        `symbolic=True` times the kernels compiled for the dims' size class (`run(symbolic=True)`); the
        result's `kernels_for` says "size class" or "these sizes" (when the launch checks fell back)."""
        if inputs is None:
            dims = self.resolve_dims(dims)
            inputs = random_inputs(self, dims)
        dims, arrays = self.bind(inputs, dims, cast=True)
        names = device_names(device)
        if shard and len(names) == 1:
            self.shard_axes(shard, dims, 1)  # (the error)
        if len(names) > 1:
            if symbolic:
                raise TgcError("symbolic sizes run on one device, not a device list",
                               hint="drop symbolic=True to time it sharded")
            axes = self.shard_axes(shard, dims, len(names))
            timing = self._bench_list(names, dims, axes, arrays, repeat, warmup, beam, tuned)
            return {"device": ",".join(names), "dims": dims, "repeat": repeat, "beam": beam, "shard": axes,
                    **timing, "identity": {**self.identity(names[0], dims), "device": ",".join(names),
                                           "shard": axes}}
        dev = _device(names[0])
        low = self.lower_symbolic(dev.name, dims)[0] if symbolic else None
        kernels_for = "size class" if low is not None else "these sizes"
        cacheable = low is None and tuned and (beam is None or beam == env_int("BEAM", 0))
        rec = None  # the recompute factor: a program-cache entry's, or computed (before the entry is stored: it
        # keeps it for a warm `tgc bench`)
        if cacheable:  # what `run` runs at these dims (kept, from the program cache, or lowered now)
            dev.ensure_runnable()
            ready, first = self._ready_for(dev, dims, arrays)
            timing = executable.bench(ready.exe, arrays, repeat=repeat, warmup=warmup)
            rec = ready.entry.recompute if ready.entry is not None else None
            if first:
                if ready.entry is None and not symbolic:
                    rec = self.recompute(dev.name, dims, beam=beam, tuned=tuned)
                self._keep_ready(dev, dims, ready, rec)
        else:
            ch = self.chunking(dev.name, dims, beam=beam, tuned=tuned) if low is None else None
            if ch is not None:  # timed as `run` runs it: in chunks
                low = ch.executable()
            elif low is None:
                low = self.lower(dev.name, dims, beam=beam, tuned=tuned)
            timing = executable.bench(low, arrays, repeat=repeat, warmup=warmup)
        result: dict[str, Any] = {"device": dev.name, "dims": dims, "repeat": repeat, "beam": beam, **timing,
                                  "identity": self.identity(dev.name, dims), "kernels_for": kernels_for}
        if not symbolic:  # (the kernels just timed, from the compile cache)
            result["recompute"] = rec if rec is not None else self.recompute(dev.name, dims, beam=beam, tuned=tuned)
        return result

    def _bench_list(self, names: list[str], dims: dict[str, int], shard: dict[str, int],
                    arrays: dict[str, np.ndarray], repeat: int, warmup: int, beam: int | None, tuned: bool
                    ) -> dict[str, Any]:
        """`bench` on a device list: from the program cache's entry where it holds one (nothing lowered), else
        the executable lowered here (then stored, as `_run_list` stores it); replayed either way
        (`executable.bench`)."""
        cacheable = tuned and (beam is None or beam == env_int("BEAM", 0))
        entry = self._cached_list_entry(names, dims, shard) if cacheable else None
        if entry is not None and entry.fits(arrays):
            return entry.bench(",".join(names), arrays, repeat=repeat, warmup=warmup)
        exe = self.lower_multi(names, dims, shard, beam=beam, tuned=tuned)
        timing = executable.bench(exe, arrays, repeat=repeat, warmup=warmup)
        key = (tuple(names), tuple(sorted(dims.items())), tuple(sorted(shard.items())), env_int("BEAM", 0))
        if cacheable and self._entries.get(key, False) is None and key not in self._stored:
            self._stored.add(key)
            progcache.store_list(self, exe.devices, names, dims, shard, exe)
        return timing

    def identity(self, device: str | None, dims: dict[str, int]) -> dict[str, Any]:
        """What a timing of this program depends on beyond its kernels' code (`tgc bench --baseline` compares
        only equal identities): the source's hash, dims, the device and its model, the tgc version."""
        names = device_names(device)
        ident = bench.identity(self, _device(names[0]), dims)
        return ident if len(names) == 1 else {**ident, "device": ",".join(names)}

    def beam(self, device: str | list[str] | None = None, dims: dict[str, int] | None = None, width: int = 4,
             progress: Any = None, force: bool = False, shard: dict[str, int] | None = None,
             budget_s: float | None = DEFAULT_BUDGET_S, started: float | None = None) -> dict[str, Any]:
        """Search every kernel of the program (BEAM): on one device the kernels `run` launches (`run_schedule`: a
        chunk's where it runs in chunks); store the winners; report before/after per kernel. On one device the
        winners in use are then checked against the memory plan (`_check_structure`: the result's
        `structure_check`, kernel name -> why its winner was dropped) and timed in the program (below).
        `budget_s` bounds this call in seconds from `started` (a `time.perf_counter()` value, default now; the
        CLI passes its process start), scheduling included (None: unbounded; `tgc.codegen.search.beam_items`):
        the search ends by `1 - search.FINISH_SHARE - search.CHECK_SHARE` of it, the program check (below) by
        `1 - search.FINISH_SHARE`, and the size class's winners are stored after it
        only where it ended in time (else a later `beam`, finding the kernels stored, stores them); on a device
        list, per device kind. The result's `seconds` is the time from `started`, `budget_s` the budget.
        On a device list: each device's per-shard kernels, searched once per device kind (on the first device
        of that kind, with its share of the cores); winners are stored per kind, so every device uses them."""
        started = time.perf_counter() if started is None else started
        search_budget = None if budget_s is None else budget_s * (1 - search.FINISH_SHARE)
        names = device_names(device)
        if len(names) > 1:
            dims = self.resolve_dims(dims)
            ml, items_of = self._lower_multi(names, dims, self.shard_axes(shard, dims, len(names)), beam=0)
            rows, seconds = [], 0.0
            kinds: dict[str, int] = {}
            for d, dev in enumerate(ml.devices):
                kinds.setdefault(dev.kind, d)
            for kind, first in kinds.items():
                dev = ml.devices[first]
                if dev.compiler is None:
                    raise CompileError(dev.compile_error or f"cannot compile for {kind} here, so it cannot be tuned")
                items = {}
                for d, its in enumerate(items_of):
                    if ml.devices[d].kind == kind:
                        for it in its:
                            items.setdefault(it.ast, it)
                kind_start = time.perf_counter()
                r, sec = beam_items(list(items.values()), dev, width, progress=progress, force=force,
                                    budget_s=search_budget, started=kind_start)
                rows += [{**row, "device": kind} for row in r]
                seconds += sec
            self._multi.clear()
            return {"device": ",".join(names), "dims": dims, "width": width, "kernels": rows, "seconds": seconds,
                    "budget_s": budget_s, "interrupted": any(r.get("interrupted") for r in rows)}
        dev = _device(names[0])
        if dev.compiler is None:
            raise CompileError(dev.compile_error or f"cannot compile for {dev.kind} here, so it cannot be tuned here")
        dims = self.resolve_dims(dims)
        items = self.run_schedule(dims, dev.name)
        if budget_s is not None:  # (one device: the program check's share comes out of the search's)
            search_budget = budget_s * (1 - search.FINISH_SHARE - search.CHECK_SHARE)
        rows, _ = beam_items(items, dev, width, progress=progress, force=force, budget_s=search_budget,
                             started=started, measured=self._per_call_costs(dev, dims, items))
        self._forget_kernels()  # later compiles pick up the stored winners
        interrupted = any(r.get("interrupted") for r in rows)
        in_time = search_budget is None or time.perf_counter() - started <= search_budget
        live = [it for it in items if it.ast.src]
        structure: dict[str, str] = {}
        if not interrupted and any(search.lookup(search.search_ast(it, dev), dev) is not None for it in live):
            try:
                structure = self._check_structure(dev, dims, items)
            except TgcError:  # (it could not be lowered: the first run says why)
                structure = {}
            except KeyboardInterrupt:  # (no decision: nothing is dropped before both plans are known)
                interrupted = True
            if len(rows) == len(live):
                for row, name in zip(rows, kernel_names(live)):
                    if name in structure:
                        row["dropped"] = True
        check: dict[str, Any] | None = None
        # (only where this search stored a winner other than a default: `_confirm` keeps the default's time for
        # it, so a winner took less; nothing is compiled to find out that nothing changed)
        won = [r for r in rows if not r.get("cached") and not r.get("skipped") and r.get("stored", True)
               and r.get("after_s") is not None
               and r.get("before_s") is not None and r["after_s"] < r["before_s"]]
        if not interrupted and won and len(rows) == len(live):  # (one row per kernel, in order)
            check_deadline = None if budget_s is None else started + budget_s * (1 - search.FINISH_SHARE)
            # only the winners this search stored are judged: those an earlier check kept, or an earlier search
            # found, stay as they are (`_program_check`)
            keys = [search.beam_key(search.search_ast(it, dev), dev) for it in live]
            fresh = {key for key, row in zip(keys, rows) if any(row is r for r in won)}
            # skipped where the time left is less than it is estimated to cost (`search.check_cost`)
            setups = [r["setup_s"] for r in rows if r.get("setup_s") is not None]
            estimate = search.check_cost(setups, len(set(keys)), search.program_seconds(rows))
            try:
                check = self._check_in_program(dev, dims, items, check_deadline, fresh, estimate)
            except KeyboardInterrupt:  # (Ctrl-C: no decision; the table and JSON are still printed, exit 130)
                check = {**_no_check(), "skipped": "interrupted"}
                interrupted = True
            self._forget_kernels()
            for row, name in zip(rows, kernel_names(live)):
                if name in check["dropped"]:
                    row["dropped"] = True
        class_winners = False
        if not dev.caps.gpu and not interrupted and in_time:
            self._store_class_winners(dev, dims)  # and symbolic kernels of the dims' size class
            class_winners = True
        self.release()  # (and later runs)
        return {"device": dev.name, "dims": dims, "width": width, "kernels": rows,
                "seconds": time.perf_counter() - started, "budget_s": budget_s, "class_winners": class_winners,
                "interrupted": interrupted, "program_check": check, "structure_check": structure}

    def _check_structure(self, dev: Any, dims: dict[str, int], items: list[ScheduleItem]) -> dict[str, str]:
        """After BEAM's search, before the program is timed (`_check_in_program`): the stored winners of `items`
        (the kernels `run` launches) checked against the program's memory plan, which a search timing a kernel
        alone cannot see. (1) A winner whose kernel cannot write its output over an input where the default
        kernel's plan does (`plan.inplace`, from `inplace_pairs` of the linear UOps: a matmul part accumulating
        into the partial sum it reads) is dropped: with it the plan keeps both buffers, grows, and can pass the
        chunking limit (mixer's channel parts with a PADTO winner: 1.56x planned, run in 2 chunks, against its
        default's 1.35x whole). (2) Where the program still runs in other chunks with the winners than with its
        default kernels, every winner in use among its kernels is dropped (the timing check cannot pair them).
        Deterministic, so every winner in use is judged, not only this search's. Returns {kernel name: why} of
        the drops, stored (`search.drop`)."""
        live = [it for it in items if it.ast.src]
        asts = {n: search.search_ast(it, dev) for n, it in zip(kernel_names(live), live)}
        before = self._chunking(dev, dims, 0, False)
        default, tuned, kept = self._plan_kernels(dev, dims, before)
        if [k.name for k in default] != [k.name for k in tuned]:  # (one schedule: never seen)
            return {}
        drops: dict[str, str] = {}
        for d, t in zip(default, tuned):
            if d.name not in asts or [str(o) for o in d.opts] == [str(o) for o in t.opts]:
                continue
            own = inplace_pairs(t)
            if any(p in kept and p not in own for p in inplace_pairs(d)):
                drops[d.name] = ("its kernel cannot write its output over its input as the default's does: the "
                                 "program's memory plan would keep both")
        for name, why in drops.items():
            search.drop(asts[name], dev, why, name)
        if drops:
            self._forget_kernels()
        after = self._chunking(dev, dims, 0, True)
        if (before is None) != (after is None) or (before is not None and after is not None
                                                   and (before.count, before.dim) != (after.count, after.dim)):
            why = (f"with the winners the program runs {after.line() if after is not None else 'whole'}, with its "
                   f"default kernels {before.line() if before is not None else 'whole'}")
            for d, t in zip(default, tuned):
                if d.name in asts and d.name not in drops and [str(o) for o in d.opts] != [str(o) for o in t.opts]:
                    drops[d.name] = why
                    search.drop(asts[d.name], dev, why, d.name)
            self._forget_kernels()
        return drops

    def _plan_kernels(self, dev: Any, dims: dict[str, int], ch: Chunking | None
                      ) -> tuple[list[Kernel], list[Kernel], list[tuple[Any, Any]]]:
        """(the default kernels `run` launches, the same kernels with the stored winners, the default plan's
        in-place pairs): the whole program's, or one chunk's where the default runs in chunks (`ch`). Lowered,
        not compiled (`defer`)."""
        if ch is None:
            low = self.lower(dev.name, dims, beam=0, tuned=False, defer=True)
            tuned = self.compile(device=dev.name, dims=dims, beam=0, tuned=True, defer=True)
        else:
            low = ch.low
            tuned = self._build_kernels(dev, [u for _, u in low.outputs], 0, True, defer=True)
        return list(low.kernels), tuned, list(low.memory_plan().inplace)

    def _forget_kernels(self) -> None:
        """Drop the kernels compiled in this process (after the BEAM table changed: later compiles pick it up)."""
        self._kernels.clear()
        self._ready.clear()
        self._chunks.clear()
        self._entries.clear()  # (the program cache's key holds the BEAM table's state: they miss)
        self._stored.clear()

    def _check_timed(self, dev: Any, dims: dict[str, int], arrays: dict[str, np.ndarray], tuned: bool
                     ) -> tuple[Executable, dict[str, np.ndarray]]:
        """The executable `run` launches at `dims` (one chunk's where it runs in chunks, with the chunk's slices of
        the inputs, as `executable.bench` times it), with or without the stored winners."""
        ch = self._chunking(dev, dims, 0, tuned)
        if ch is None:
            return self.lower(dev.name, dims, beam=0, tuned=tuned), arrays
        return ch.low, first_chunk_inputs(ch.low.inputs, arrays, ch.count, ch.sliced)

    def _check_in_program(self, dev: Any, dims: dict[str, int], items: list[ScheduleItem],
                          deadline: float | None, fresh: set[str] | None = None, estimate_s: float = 0.0
                          ) -> dict[str, Any]:
        """After BEAM's search: the whole program timed with the stored winners against its default kernels
        (`bench.program_rounds`); where it is slower with them, the winners of the kernels slower inside the
        program are dropped (`search.drop`), and where the program is still slower, every winner of `items`
        (`search.PROGRAM_ROUNDS`, above it). Returns what `tgc beam` prints: the program's seconds with the
        default kernels, with the winners and with those kept (`default_s`, `tuned_s`, `final_s`: the least of the
        rounds), the winners' time over the default's (`ratio`, `final_ratio`: `search.paired_ratio`, what
        decides), the kernels kept and dropped by name, and `skipped` (why nothing was decided) where it was not
        timed. Only the winners whose store key is in `fresh` (those this search stored; None: every winner) are
        judged; the check is skipped where less than `estimate_s` (`search.check_cost`) is left before
        `deadline`. The program is slower only beyond the noise (`search.slower_in_program`). A
        KeyboardInterrupt leaves the store as it was before the check (drops made for the second timing are
        undone) and propagates."""
        began = time.perf_counter()
        result = self._program_check(dev, dims, items, deadline, fresh, estimate_s)
        result["seconds"] = time.perf_counter() - began
        return result

    def _program_check(self, dev: Any, dims: dict[str, int], items: list[ScheduleItem],
                       deadline: float | None, fresh: set[str] | None = None, estimate_s: float = 0.0
                       ) -> dict[str, Any]:
        live = [it for it in items if it.ast.src]
        asts = {name: search.search_ast(it, dev) for name, it in zip(kernel_names(live), live)}
        result = _no_check()
        if len(live) < 2:  # (`_confirm` alternated the winner and the default on the program's own buffers)
            result["skipped"] = "one kernel: the search timed its winner against its default as the program runs it"
            return result
        if deadline is not None and time.perf_counter() >= deadline:
            result["skipped"] = "the budget was spent"
            return result
        if deadline is not None and deadline - time.perf_counter() < estimate_s:
            result["skipped"] = (f"the budget left {max(deadline - time.perf_counter(), 0.0):.1f} s for it, "
                                 f"it is estimated to take {estimate_s:.1f} s")
            return result
        try:
            arrays = self.bind(random_inputs(self, dims), dims, cast=True)[1]
            began = time.perf_counter()
            default, d_arrays = self._check_timed(dev, dims, arrays, False)
            tuned, t_arrays = self._check_timed(dev, dims, arrays, True)
            result["compile_s"] = time.perf_counter() - began
        except TgcError as e:
            result["skipped"] = f"it could not be compiled ({e.msg})"
            return result
        if d_arrays.keys() != t_arrays.keys() or any(d_arrays[n].shape != t_arrays[n].shape for n in d_arrays):
            result["skipped"] = "the default kernels and the winners run in other chunks"
            return result
        d_opts = {k.name: [str(o) for o in k.opts] for k in default.kernels}
        changed = {k.name: search.beam_key(asts[k.name], dev) for k in tuned.kernels
                   if k.name in asts and k.name in d_opts and [str(o) for o in k.opts] != d_opts[k.name]}
        changed = {n: k for n, k in changed.items() if fresh is None or k in fresh}
        if not changed:
            result["skipped"] = "every winner of this search has its kernel's default opts"
            return result
        key_ast = {search.beam_key(a, dev): a for a in asts.values()}
        try:
            timed = bench.program_rounds([default, tuned], d_arrays, search.PROGRAM_ROUNDS, search.PROGRAM_RUNS,
                                         deadline, search.PROGRAM_MIN_ROUNDS)
        except TgcError as e:
            result["skipped"] = f"it could not be run ({e.msg})"
            return result
        d_prog, t_prog = timed[0]["program"], timed[1]["program"]
        result.update(default_s=min(d_prog), tuned_s=min(t_prog), final_s=min(t_prog), rounds=len(t_prog),
                      ratio=search.paired_ratio(d_prog, t_prog))
        result["final_ratio"] = result["ratio"]
        names_of = {key: sorted(n for n, k in changed.items() if k == key) for key in set(changed.values())}
        if not search.slower_in_program(d_prog, t_prog):
            result["kept"] = sorted(changed)
            return result
        # slower with the winners: drop those whose kernels are not faster inside the program, then time again
        timed_names = set(timed[0]["kernels"][0]) & set(timed[1]["kernels"][0])
        slow = search.kernels_slower_in_program(timed[0]["kernels"], timed[1]["kernels"],
                                                {n: k for n, k in changed.items() if n in timed_names})
        slow |= {k for n, k in changed.items() if n not in timed_names}  # (not timed each run: nothing says it won)
        why = (f"the program was slower with the winners ({result['ratio']:.3f}x its time with the default kernels, "
               f"median of {len(t_prog)} rounds)")
        # decided first, written together at the end; only the drops the second timing needs (it compiles the
        # program with the winners still stored) are written before it, and undone where it is interrupted
        drops = {key: f"{why}, and this kernel was not faster inside it" for key in slow}
        kept = set(names_of) - slow
        if kept and deadline is not None and time.perf_counter() >= deadline:
            # no time left to time the program with only these: it was slower with them among the winners, so they
            # are not kept on the kernels' own times (a kernel faster inside a program can still slow the others)
            drops.update({key: f"{why}; the budget left no time to time it with this one alone" for key in kept})
            kept = set()
        if kept:
            for key in slow:
                search.drop(key_ast[key], dev, drops[key], names_of[key][0])
            try:
                self._forget_kernels()
                tuned, t_arrays = self._check_timed(dev, dims, arrays, True)
                again = bench.program_rounds([default, tuned], d_arrays, search.PROGRAM_ROUNDS, search.PROGRAM_RUNS,
                                             deadline, search.PROGRAM_MIN_ROUNDS)
            except BaseException:  # (Ctrl-C, or it could not be run: the winners stay as this search stored them)
                for key in slow:
                    search.undrop(key_ast[key], dev, names_of[key][0])
                raise
            d2, t2 = again[0]["program"], again[1]["program"]
            result.update(final_s=min(t2), final_ratio=search.paired_ratio(d2, t2), retimed=True)
            if search.slower_in_program(d2, t2):
                drops.update({key: f"{why}, and still slower with only the faster kernels' winners" for key in kept})
                kept = set()
        for key, reason in drops.items():
            search.drop(key_ast[key], dev, reason, names_of[key][0])
        if not kept:  # (all dropped: the program runs its default kernels, as first timed)
            result.update(final_s=result["default_s"], final_ratio=1.0)
        result["kept"] = sorted(n for key in kept for n in names_of[key])
        result["dropped"] = sorted(n for key in set(names_of) - kept for n in names_of[key])
        return result

    def _per_call_costs(self, dev: Any, dims: dict[str, int], items: list[ScheduleItem]) -> list[float | None]:
        """What each schedule item costs a run, for BEAM's budget (`search.kernel_weights`): None for a kernel that
        runs once per program, not at every call (it reads only the bound weights: `tgc.engine.bound`, e.g. a
        convolution's weight packing); for the others the seconds of their default in a run of the program
        (`bench.kernel_times`: two runs, every launch waited for) where this process has the program compiled
        already (a `run` before the search), else their estimate (`search.estimate_cost`: nothing is compiled to
        weigh). Aligned with `items`."""
        outs, in_bufs = self._trace(dims)
        live = [i for i, it in enumerate(items) if it.ast.src]
        view = _ItemsView(bound=frozenset(self.weights), inputs=[(b, self._in_names[b.arg[0]]) for b in in_bufs],
                          outputs=list(zip(self.output_names, outs)), kernels=[_ItemKernel(items[i]) for i in live])
        prelude = set(bound_split(view).prelude)
        once = {live[j] for j, k in enumerate(view.kernels) if k in prelude}
        costs: list[float | None] = [None if i in once else search.estimate_cost(it, dev)
                                     for i, it in enumerate(items)]
        kernels = self._kernels.get((dev.name, tuple(sorted(dims.items())), env_int("BEAM", 0), True))
        if not kernels or len(kernels) != len(live) or any(k.deferred for k in kernels) or dev.caps.gpu:
            return costs
        try:
            exe = self.lower(dev.name, dims)
            times = bench.kernel_times(exe, self.bind(random_inputs(self, dims), dims, cast=True)[1])
        except TgcError:  # (it ran before: a failure here leaves the estimate)
            return costs
        measured = [None if i in once else times.get(kernels[j].name) for j, i in enumerate(live)]
        if any(t is None for j, t in enumerate(measured) if live[j] not in once):  # (a prelude the split saw
            return costs  # differently: the estimate, in one unit)
        for j, i in enumerate(live):
            costs[i] = measured[j]
        return costs


def _no_check() -> dict[str, Any]:
    """The program check's result (`Program._check_in_program`) before anything is timed or decided."""
    return {"default_s": None, "tuned_s": None, "final_s": None, "ratio": None, "final_ratio": None, "kept": [],
            "dropped": [], "rounds": 0, "retimed": False, "skipped": None}


class _NotProbeable(str):
    """Why the one trace refused a class, where the probe path cannot check the size at fault either
    (`symsize.NotProbeable`): the class gets no plan."""


TRACED_ONCE = "traced once: "  # (a reason's head: the one trace failed with this error of the program, in dims)


def _smaller_exponent(e: int, msg: str) -> int:
    """The next dim bound's exponent after an index ranged past 64 bits with every dim up to 2^e (`index_width`'s
    message: `ranges over [lo, hi]`): an index of k bits at 2^e grows as about 2^(k/e) per unit of the exponent
    (a product of dims, each at the bound), so 62 * e // k fits where that holds; at least one less than e, and
    two thirds of e where the range is not given (the rule before)."""
    found = re.search(r"ranges over \[(-?\d+), (-?\d+)\]", msg)
    if found is None:
        return 2 * e // 3
    bits = max(abs(int(found.group(1))), abs(int(found.group(2)))).bit_length()
    return max(1, min(e - 1, 62 * e // max(bits, 1)))


def _made_class(base: SymbolicPlan, hidden: tuple) -> tuple:
    """The class of the program's dims (`base.user_class`'s order) that the hidden class `hidden` of `base`'s
    multiples makes (`sizeexpr.made_classes`: each X of class 32n where its Q or Y is, else n)."""
    classes = sizeexpr.made_classes(base.multiples, dict(hidden))
    return tuple((n, classes[n]) for n, _ in base.user_class or ())


def _failed_at_probe(probe: dict[str, int], msg: str, once: Any) -> str:
    """Why a class has no symbolic form where the program fails at one of its probes (sizes the compiler
    chose: a reshape that needs N even fails at 211): the one trace's error where it failed at the same sizes
    (`once`), which names the dims (`[N//2, 2]`); the probe's error says its sizes are ones tried for the
    class, never as if they were the dims a user gave."""
    tried = ", ".join(f"{n}={v}" for n, v in probe.items())
    if isinstance(once, str) and once.startswith(TRACED_ONCE):
        return f"{once[len(TRACED_ONCE):]} (at {tried}, sizes the compiler tried for the class)"
    return f"at {tried}, sizes the compiler tried for the class (not sizes given): {msg}"


def _internal_reason(e: Exception, what: str) -> None:
    """An internal error behind a symbolic path's reason, printed at DEBUG=2 (a reason a user reads names no
    exception class and quotes no exception text)."""
    if debug_level() >= 2:
        print(f"*** symbolic: {what} stopped at {type(e).__name__}: {e}", file=sys.stderr)


class _Ready:
    """An executable a program runs again at one key (`Program._ready_for`): its device, the executable, the
    launch plans replaying it and their key (None: run once each time, as a chunked run), its chunking, the
    arrays a cached package binds itself, and the program-cache entry it came from (None: lowered here)."""

    __slots__ = ("device", "exe", "replay", "key", "chunking", "own", "entry")

    def __init__(self, device: Any, exe: Executable, replay: LaunchPlans | None, key: Any,
                 chunking: Chunking | None, own: Mapping[str, np.ndarray] | None = None, entry: Any = None):
        self.device, self.exe, self.replay, self.key, self.chunking = device, exe, replay, key, chunking
        self.own, self.entry = own or {}, entry

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.own:
            arrays = {**arrays, **self.own}
        return executable.run(self.exe, arrays, replay=self.replay, key=self.key)


class _ItemKernel:
    """A schedule item as `tgc.engine.bound.split` reads a kernel: its buffers and the ones it writes."""

    def __init__(self, item: ScheduleItem):
        self.bufs, self.ast = item.bufs, item.ast

    def written(self) -> frozenset[int]:
        return stored_indices(self.ast)


class _ItemsView:
    """A program's schedule as `tgc.engine.bound.split` reads an executable (its bound inputs, inputs, outputs)."""

    def __init__(self, bound: frozenset, inputs: list, outputs: list, kernels: list[_ItemKernel]):
        self.bound, self.inputs, self.outputs, self.kernels = bound, inputs, outputs, kernels
        self.multi, self.chunks = False, None


class SymbolicPlan:
    """A program's kernels for every size of one size class: the kernels (dim variables as arguments), the
    buffers they use (`tgc.codegen.sizes.Slot`: shapes as products of dims), the declared inputs' shapes (the
    same form), and the tensor graph's signature that a launch at dims below `trusted_from` must reproduce.

    `bind(prog, dims)` makes the executable at some dims by evaluating those expressions (buffer shapes, the
    kernels' `vals`, launch sizes, flops and bytes) and picking each kernel's variant by its launch checks, through
    the one bind of a class's plan (`tgc.engine.classbind`, on `form`: the plan in the size expressions a symbolic
    package saves, so a package's loaded plan binds by the same code): it
    traces, schedules or lowers nothing where every symbolic dim is at least `trusted_from` (at the probes every
    dim exceeds every plain constant of the graph, and so it does there). Smaller dims are checked once each
    with the source (`source_check`)."""

    def __init__(self, device: Any, cls: tuple, kernels: list[Kernel], slots: list, kernel_slots: list[list[int]],
                 output_slots: list[int], signature: tuple, bound: int, symbolic: list[str],
                 fast: list[Kernel | None] | None = None):
        self.device, self.size_class, self.kernels, self.slots = device, cls, kernels, slots
        self.kernel_slots, self.output_slots, self.signature = kernel_slots, output_slots, signature
        self.bound, self.symbolic = bound, symbolic
        # dims whose own bound is above `bound` (`sizes.fitted_bound`: only smaller products of dims hold them);
        # the kernels were lowered with them (packages keep `bound` for every dim)
        self.dim_bounds: dict[str, int] = {}
        # the largest size the front end's decisions leave every dim (`x[:2000]`: 2000), or None: caps
        # `dim_bounds` too (`_build_symbolic_bounded` sets those after `_bounded_by_decisions` ran)
        self.decided_upto: int | None = None
        self.fast = fast or [None] * len(kernels)  # per kernel, its optimized variant (launch-checked) or None
        self.tails: list[list[Kernel]] = [[] for _ in kernels]  # per kernel, its fast variant's tail kernels
        self.derived: dict[str, tuple] = {}  # the tails' derived kernel arguments (`sizes.Split.derived`)
        self.unthreaded: list[Kernel | None] = [None] * len(kernels)  # per split kernel, its main without threads
        self.chosen: list[str] = []  # per kernel of the last `bind`: "fast" or "general"
        self.shapes: list[str] = []  # per kernel, its name with sizes blanked (`r_#_#`): matches a schedule
        self.asts: list[UOp] = []  # per kernel, its symbolic AST as scheduled (before any pass)
        self.item_bufs: list[list[UOp]] = []  # per kernel, the probe's buffer nodes (kernel_slots' order)
        # per declared input, (dtype, name, shape as Monos); the least size trusted without the source
        self.input_shapes: list[tuple[Any, str, tuple]] = []
        self.trusted_from = sizes.trusted_from(signature, slots)
        self._source_checked: dict[tuple, str] = {}  # dims below `trusted_from` -> "" or why not (checked once)
        # which buffers share a slot, per set of launches, decided at the first probe's sizes (distinct primes:
        # buffers of equal size there have the same size expression) and sized at each dims
        self._layouts = classbind.Layouts(sizes.probes(cls)[0], device.allocator.features.shared_slots)
        self._form: tuple[dict, list[dict]] | str | None = None  # (`form`)
        # (X, Y, Q): the class's dim X is a multiple of Y (a dim or an int), traced as the hidden dim Q (= X // Y,
        # of class n) times Y (`Program._with_multiples`); `size_class` is then over the hidden dims and
        # `user_class` the class the plan serves (over the program's dims)
        self.multiples: list[tuple[str, str | int, str]] = []
        self.user_class: tuple | None = None

    def _written(self) -> list[tuple[str, str | int]]:
        """Per multiple (X, Y, Q), X and Y as the program's dims write them (a hidden dim as its quotient: `C // D`
        for C_D, a divisor `(D // 2)` for D_2; review 18: messages named hidden dims no program writes)."""
        return sizeexpr.written(self.multiples)

    def class_text(self) -> str:
        """The sizes the plan serves, as a user reads them: `B >= 2, C >= 2, D >= 2, with C a multiple of D
        (C // D >= 2 and no multiple of 32)`."""
        if not self.multiples:
            return sizes.class_text(self.size_class)
        cls = sizeexpr.made_classes(self.multiples, dict(self.size_class))  # (a middle quotient's class too)
        parts = [f"{x} a multiple of {y} ({x} // {y} " + (f"a multiple of {sizes.UNIT})" if cls.get(q) == "32n" else
                                                          f">= 2 and no multiple of {sizes.UNIT})")
                 for (x, y), (_, _, q) in zip(self._written(), self.multiples)]
        return f"{sizes.class_text(self.user_class or ())}, with {' and '.join(parts)}"

    def class_dims(self, dims: Mapping[str, int]) -> tuple[dict[str, int] | None, str]:
        """The program's dims as the plan's class names them (each hidden dim Q = X // Y added, X kept), or
        (None, why) where they are outside it: X no multiple of Y, or a quotient outside class n (below 2, or a
        multiple of 32, which the class's remainders read as not 0)."""
        d, bad = sizeexpr.with_quotients(self.multiples, dims)
        written = self._written()
        if bad is not None:
            (x, y, _), (xs, ys) = self.multiples[bad], written[bad]
            return None, f"{xs} = {d[x]} is not a multiple of {ys}" + (f" = {d[y]}" if isinstance(y, str) else "") + \
                f": the symbolic kernels were compiled for {self.class_text()}"
        names = [n for n, _ in self.size_class]
        if sizes.size_class(names, d) != self.size_class:  # (each of the kernels' dims exactly of its class)
            cls = dict(self.size_class)
            i = next((i for i, m in enumerate(self.multiples) if m[2] in cls and
                      sizes.size_class([m[2]], d) != ((m[2], cls[m[2]]),)), None)
            what = "these sizes are" if i is None else \
                f"{written[i][0]} // {written[i][1]} = {d[self.multiples[i][2]]} is"
            return None, f"{what} outside the symbolic kernels' class ({self.class_text()})"
        return d, ""

    def source_check(self, prog: Program, dims: dict[str, int]) -> str:
        """"" where the program traced and scheduled at `dims` is the plan's (its graph the signature there, and
        where the scheduler cuts kernels of the same shapes, each the plan's kernel with the dims substituted), else
        why not. Only `bind` below `trusted_from` needs it; kept per dims."""
        key = tuple(sorted(dims.items()))
        if key not in self._source_checked:
            self._source_checked[key] = self._check_source(prog, dims)
        return self._source_checked[key]

    def _check_source(self, prog: Program, dims: dict[str, int]) -> str:
        outs, _ = prog._trace(dims)
        want, got = sizes.instantiate_signature(self.signature, dims), sizes.graph_signature(outs)
        if want != got and not sizes.same_graph(want, got):  # (equal dims merge equal operations: the same graph)
            return "the program's operations differ at these sizes (a slice or index that clamps, or another " \
                f"decision on the sizes){self._unchecked_from(dims)}"
        # where the scheduler cuts the same kernels at these sizes (it may not: small matmuls are not packed,
        # which the plan's kernels still compute right), each must be the plan's kernel at these sizes
        items = [i for i in create_schedule(outs, self.device.caps, split_columns=False) if i.ast.src]
        shapes = [sizes.name_shape(i.name) for i in items]
        if shapes == self.shapes:
            for item, ast in zip(items, self.asts):
                if sizes.instantiate_ast(ast, dims) not in (item.ast, item.meta.get("unfused_ast")):
                    return f"kernel {item.name} differs from the size class's kernel at these sizes" + \
                        self._unchecked_from(dims)
        elif sizes.signature_divisor(self.signature, self.slots) > 1 or \
                sum(s.startswith("r") for s in shapes) != sum(s.startswith("r") for s in self.shapes):
            # a floor division of a dim (`H//2`) may be 0 or 1 here, which no probe saw; a reduce that one side
            # lacks (an axis of length 1 on it: `x[::250].sum()` at N = 251, the plan's kernel a copy of x[0];
            # `x[::64].sum()` at N = 2, the plan's reduce reading 4 elements), where the graph's signature matches
            # the plan's (the slice's bounds a no-op): only the kernels the scheduler cuts here vouch for the plan's
            return f"the scheduler cuts other kernels at these sizes ({self._cut_text(shapes)})" + \
                self._unchecked_from(dims)
        return ""

    def _cut_text(self, shapes: list[str]) -> str:
        """How the kernels cut at some sizes (`shapes`) differ from the plan's: their count (with the fused
        attentions, which a plan whose head dim is a dim has not), or of the same count, their reductions."""
        def count(n: int, what: str) -> str:
            return f"{n} {what}{'' if n == 1 else 's'}"

        fused = sum(s.startswith("attn_") for s in shapes) - sum(s.startswith("attn_") for s in self.shapes)
        here, there = count(len(shapes), "kernel"), count(len(self.shapes), "kernel")
        if fused > 0:
            here += ", one a fused attention" if fused == 1 else f", {fused} fused attentions"
        if len(shapes) == len(self.shapes):
            here += ", " + count(sum(s.startswith("r") for s in shapes), "reduction")
            there += ", " + count(sum(s.startswith("r") for s in self.shapes), "reduction")
        return f"{here}, where the size class has {there}"

    def _unchecked_from(self, dims: dict[str, int]) -> str:
        """What the reasons above add: the sizes from which the class's kernels run without this check."""
        spelled = sizeexpr.quotients(self.multiples)
        names = [spelled.get(n, n) for n in self.symbolic]
        low = [f"{spelled.get(n, n)} = {dims[n]}" for n in self.symbolic if dims[n] < self.trusted_from]
        return (f"; the class's kernels run unchecked where {', '.join(names[:-1])}"
                f"{' and ' if len(names) > 1 else ''}{names[-1]} {'are' if len(names) > 1 else 'is'} at least "
                f"{self.trusted_from} (here {', '.join(low)})") if names and low else ""

    def bind(self, prog: Program, dims: dict[str, int]) -> tuple[Executable | None, str]:
        """The launch-time checks, then the kernels bound to `dims`: (Executable, "") or (None, why not)."""
        if self.multiples:  # (the program's dims: the class's hidden dims computed from them, checked)
            at, why = self.class_dims(dims)
            if at is None:
                return None, why
            dims = at
        for n in self.symbolic:
            if not 2 <= dims[n] <= self.dim_bounds.get(n, self.bound):
                return None, f"dim {n} = {dims[n]} is outside the symbolic kernels' range " \
                    f"2..{self.dim_bounds.get(n, self.bound)}"
        if any(dims[n] < self.trusted_from for n in self.symbolic):
            why = self.source_check(prog, dims)
            if why:
                return None, why
        form = self.form(prog)
        if isinstance(form, str):
            return None, form
        doc, templates = form
        sig_inputs = {d["buffer"]: j for j, d in enumerate(doc["signature"]["inputs"])}

        def make_buffer(i: int, dtype: Any, shape: tuple, nbytes: int) -> UOp:
            j = sig_inputs.get(i)  # a declared input's node is its position and name (what `Program` binds by)
            return UOp(Ops.BUFFER, dtype, (), (j, self.input_shapes[j][1], shape) if j is not None else
                       (-1 - i, f"tmp{i}", shape))

        def make_kernel(k: Kernel, launch: dict, bufs: list, gs: tuple, vals: tuple, env: dict) -> Kernel:
            if k.binary is not None:
                k.program()  # load once; the copies share it
            return BoundKernel.of(k, env, bufs=bufs, vals=vals, global_size=gs if k.grid is not None else
                                  k.global_size)

        try:
            exe, self.chosen = classbind.bind(doc, templates, self.device, dims, make_buffer, make_kernel,
                                              self._layouts, inplace_of=inplace_pairs)
        except classbind.ClassBindError as e:
            name = doc["kernels"][e.kernel]["name"] if e.kernel is not None else None
            return None, f"kernel {name}: {e.msg}" if name is not None and e.reason == "check" else e.msg
        return exe, ""

    def form(self, prog: Program) -> tuple[dict, list[dict]] | str:
        """The plan in size expressions (`tgc.package.class_doc`, the form a symbolic package saves and
        `tgc.engine.classbind` binds) with each kernel's compiled variants, or why it has none; made once."""
        if self._form is None:
            doc = class_doc(prog, self.device, self.size_class, self)
            if isinstance(doc, str):
                self._form = doc
            else:
                templates = [{"general": k["kernel"], "fast": (k["fast"] or {}).get("kernel"),
                              "plain": (k.get("plain") or {}).get("kernel"),
                              "tails": [t["kernel"] for t in k.get("tails", [])]} for k in doc["kernels"]]
                self._form = (doc, templates)
        return self._form


class BoundKernel(Kernel):
    """A size class's kernel bound to dims (`SymbolicPlan.bind`): its `flops` and `bytes_moved` are counted from
    its UOps at those dims on first read (`symbolic_work`: on the CPU a walk per thread, most of what a bind
    would otherwise spend), since only reports and `bench` read them. A value given (a copy) is kept."""

    _work: tuple | None = None  # (the class's kernel, the launch's values) until counted
    _counted: tuple[int, int] | None = None

    @classmethod
    def of(cls, k: Kernel, env: dict[str, int], **changes: Any) -> BoundKernel:
        fields = {f: getattr(k, f) for f in k.__dataclass_fields__}
        bound = cls(**{**fields, **changes})
        bound._counted, bound._work = None, (k, env)  # (what the constructor set: counted when read)
        return bound

    def _count(self) -> tuple[int, int]:
        if self._counted is None:
            k, env = self._work  # type: ignore[misc]
            self._counted = symbolic_work(k, env, self.bufs)
        return self._counted

    @property  # type: ignore[override]
    def flops(self) -> int:
        return self._count()[0]

    @flops.setter
    def flops(self, v: int) -> None:
        self._counted, self._work = (v, self._counted[1] if self._counted else 0), None

    @property  # type: ignore[override]
    def bytes_moved(self) -> int:
        return self._count()[1]

    @bytes_moved.setter
    def bytes_moved(self, v: int) -> None:
        self._counted, self._work = (self._counted[0] if self._counted else 0, v), None


def _unfused(item: ScheduleItem) -> ScheduleItem:
    """`item` with its plain lowering where the scheduler fused an attention (`meta["unfused_ast"]`): what the
    heuristic's opts are picked on for a symbolic plan's kernel that keeps the chain (`_symbolic_ast`)."""
    plain = item.meta.get("unfused_ast")
    return item if plain is None else ScheduleItem(plain, item.bufs, item.name, item.line, item.meta)

def _symbolic_ast(item: ScheduleItem, probe: dict[str, int], symbolic: list[str], bound: int) -> UOp:
    """`item`'s kernel AST with its sizes dim variables (`sizes.symbolize_ast`). A fused attention keeps its
    online-softmax kernel where its head dims are constants (`is_fused_attention` of the symbolic AST: the batch,
    query rows and keys may be dims); where a head dim is a dim, the plain lowering (`meta["unfused_ast"]`)."""
    ast = sizes.symbolize_ast(item.ast, probe, symbolic, bound)
    plain = item.meta.get("unfused_ast")
    return ast if plain is None or is_fused_attention(ast) else sizes.symbolize_ast(plain, probe, symbolic, bound)


def _lowers_alike(dev: Any) -> tuple:
    """What a kernel's lowering and binary depend on in a device: its class, kind, capabilities and compiler
    (name, version key, and where it compiles). Devices with equal tuples (CPU:0 and CPU:1) give the same
    kernel for the same AST and buffers; only the device it launches on differs."""
    comp = dev.compiler
    return (type(dev), dev.kind, dev.caps,
            None if comp is None else (type(comp), comp.name, comp.cache_key, comp.cache_identity))


def _fuses_alike(outs: list[UOp], dims: dict[str, int]) -> bool:
    """Whether the scheduler's rule fuses the same attentions of a graph traced once (`SymSize` dims) at these
    dims as at the traced sizes (`engine.attention.find`, its size decisions answered there)."""
    here = attention_find(outs)
    with answering_at(dims):
        there = attention_find(outs)
    return here.keys() == there.keys() and all(here[k].inline == there[k].inline for k in here)


def _tagged_ast(item: ScheduleItem, bound: int, lows: dict[str, int], mono: Any) -> UOp | str:
    """`_symbolic_ast` of a one trace (`sizes.symbolize_tagged`): a fused attention keeps its online-softmax
    kernel where its head dims are constants; where a head dim is a dim, the plain lowering."""
    ast = sizes.symbolize_tagged(item.ast, bound, lows, mono)
    plain = item.meta.get("unfused_ast")
    if plain is None or isinstance(ast, str) or is_fused_attention(ast):
        return ast
    return sizes.symbolize_tagged(plain, bound, lows, mono)


def _fast_attention(item: ScheduleItem, dev: Any, rep: dict[str, int], name: str) -> Kernel | None:
    """A symbolic fused attention's fast variant: a stored BEAM winner for its class, else the heuristic's form,
    with the CPU's threads over its first loop (launched where the dims give them enough work); None where
    there is nothing to add (a GPU or one core without a winner) or it does not apply."""
    opts = lookup(item.ast, dev)
    base = list(opts) if opts is not None else attention_kernel(item, dev).applied
    if not dev.caps.gpu and dev.cores > 1 and not any(o.op is OptOps.THREAD for o in base):
        base.append(Opt(OptOps.THREAD, 0, dev.cores))
    elif opts is None:
        return None
    try:
        return build_symbolic_kernel(item, dev, rep, name, opts=base)
    except (OptError, CompileError):
        return None


def _unit_mono(m: tuple, units: set[str]) -> tuple:
    """A size of a class with `32n` dims as the probe path writes it. A floor division of a 32n dim by one of
    32's divisors is exact there (`a * N / k`; `symsize._exact_atom`), and the trace holds it as an atom
    `(a*N+0)//k`; a size with such atoms, `coef * atoms * dims + offset`, is `(coef * a.., dims.., offset, k..)`
    reduced by the common divisor of its coefficient and divisor, as `sizes.factor` reads it from the probes
    (`4 * (M//32) * (N//32)` is `(1, (M, N), 0, 256)`; an atom's remainder r < k adds nothing there). A floor
    division of a dim of class n is kept; one of a 32n dim by a number that does not divide 32 is refused."""
    atoms = [n for n in m[1] if "/" in n and base_dim(n) in units]
    if not atoms:
        return m
    coef, names, div = m[0], [n for n in m[1] if n not in atoms], m[3]
    for n in atoms:
        a, dim, r, k = atom_parts(n)  # type: ignore[misc]
        if sizes.UNIT % k:  # (a remainder 0 <= r < k adds nothing: `(32c + 1) // 2` is 16c)
            raise NotTraceable(f"a floor division of a 32n dim, {n}, is not exact (by a number that does not "
                               "divide 32)")
        coef, div = coef * a, div * k
        names.append(dim)
    g = math.gcd(coef, div) or 1
    return (coef // g, tuple(sorted(names)), m[2], div // g)


def _unit_atoms(slots: list, in_shapes: list, signature: tuple, units: set[str]) -> tuple:
    """The buffers' shapes and the graph signature of a one trace of a class with `32n` dims written as the probe
    path writes them (`_unit_mono`); returns the signature. NotTraceable where a size is not exact."""
    def norm_value(v: Any) -> Any:  # a signature's arg (`sizes.symbolize_value`: ("#", mono) for a size)
        if isinstance(v, tuple) and len(v) == 2 and v[0] in ("#", "#f", "#r") and isinstance(v[1], tuple):
            return (v[0], _unit_mono(v[1], units))
        return tuple(norm_value(x) for x in v) if isinstance(v, tuple) else v

    for slot in slots:
        slot.shape = tuple(_unit_mono(m, units) for m in slot.shape)
    in_shapes[:] = [(d, name, tuple(_unit_mono(m, units) for m in ms)) for d, name, ms in in_shapes]
    return tuple(row[:2] + (norm_value(row[2]),) + row[3:] if row[0] != "outs" else row for row in signature)


def _at_trace_sizes(node: UOp, memo: dict[UOp, UOp]) -> UOp:
    """A kernel buffer of a trace with `SymSize` dims as a node of its shape at the traced sizes (an input's
    BUFFER as the probe's trace makes it; a computed tensor as a RESHAPE of it to plain ints), one per node."""
    if node not in memo:
        shape = tuple(int.__int__(s) for s in shape_of(node))
        memo[node] = UOp(Ops.BUFFER, node.dtype, (), (node.arg[0], node.arg[1], shape)) if node.op is Ops.BUFFER \
            else UOp(Ops.RESHAPE, node.dtype, (node,), shape)
    return memo[node]


def _split_variant(item: ScheduleItem, dev: Any, cls: tuple, probe: dict[str, int], name: str, key: str,
                   bound: int) -> tuple[Kernel, Kernel | None, list[Kernel], dict] | None:
    """For a class with odd dims (`n`): the opts the heuristic picks for this kernel where every symbolic dim is
    512, on a main kernel over the part of each split loop its splits divide, plus a tail kernel per split loop
    for the remainder (`sizes.split_remainders`); None where there is no stored BEAM winner to prefer, no split
    or an opt that does not apply."""
    if lookup(prepare_ast(item.ast, dev), dev) is not None:
        return None  # a BEAM winner stored for the class: `_fast_variant` uses it
    at = {n: 512 if c in sizes.SYMBOLIC else int(c) for n, c in cls}
    ast = prepare_ast(item.ast, dev)
    opts = heuristic_opts(prepare_ast(sizes.instantiate_ast(item.ast, at), dev), dev)
    split = sizes.split_remainders(ast, opts, key, bound) if opts else None
    if split is None:
        return None
    values = sizes.derived_values(split.derived, probe)
    try:
        main = build_symbolic_kernel(ScheduleItem(split.main, item.bufs, name, item.line, item.meta), dev, values,
                                     name, opts=split.main_opts)
        tails = [build_symbolic_kernel(ScheduleItem(t, item.bufs, f"{name}t{j}", item.line, item.meta), dev,
                                       values, f"{name}t{j}", opts=o) for j, (t, o) in enumerate(split.tails)]
        # small sizes fail the threads' launch check: the same main kernel without threads serves them
        plain = [o for o in split.main_opts if o.op is not OptOps.THREAD]
        alt = None if plain == split.main_opts else build_symbolic_kernel(
            ScheduleItem(split.main, item.bufs, name, item.line, item.meta), dev, values, f"{name}s", opts=plain)
    except (OptError, CompileError):
        return None
    if main.binary is None or any(t.binary is None for t in tails):
        return None
    return main, (alt if alt is not None and alt.binary is not None else None), tails, split.derived


def _fast_variant(item: ScheduleItem, rep_item: ScheduleItem, dev: Any, rep: dict[str, int], name: str
                  ) -> tuple[Kernel | None, Kernel | None]:
    """(a symbolic kernel with the opts the heuristic picks for `rep_item` (the same kernel at a representative
    size), or None when there are none or they do not apply to the symbolic form; the same kernel without
    threads where they were added to a stored winner's opts, else None)."""
    # a BEAM winner stored for this size class (`Program.beam` at a size of the class), else the heuristic's
    # choice at the representative size
    opts = lookup(prepare_ast(item.ast, dev), dev)
    if opts is None:
        opts = heuristic_opts(prepare_ast(rep_item.ast, dev), dev)
        if not opts:
            return None, None
    elif not dev.caps.gpu and not any(o.op is OptOps.THREAD for o in opts):
        # a stored winner has no THREAD (BEAM leaves threads to the automatic split at its constant size, which
        # a symbolic loop never gets): the threads the heuristic picks at the representative size, and the
        # winner alone for sizes too small for them
        threads = [o for o in heuristic_opts(prepare_ast(rep_item.ast, dev), dev) if o.op is OptOps.THREAD]
        if threads:
            try:
                fast = build_symbolic_kernel(item, dev, rep, name, opts=[*opts, *threads])
                plain = build_symbolic_kernel(item, dev, rep, f"{name}s", opts=opts)
                return fast, (plain if plain.binary is not None else None)
            except (OptError, CompileError):
                pass  # the winner alone, as stored
    if not opts:
        return None, None
    try:
        return build_symbolic_kernel(item, dev, rep, name, opts=opts), None
    except (OptError, CompileError):
        return None, None


def _name_of(obj: Any) -> str | None:
    if obj is None or isinstance(obj, property):
        return None
    return obj.__name__ if isinstance(obj, type) else type(obj).__name__


def devices(info: bool = True) -> list[dict[str, Any]]:
    """One row per registered backend (what `tgc devices` and `tgc --version` list): `device`, `available`
    (its cheap `probe()`) and `why_not`, `renderer`; with `info` also `compiler`, `version`, `peak_gflops`,
    `peak_gbps` and the device's own facts (`info`). Never raises for a backend that does not work here."""

    rows = []
    for kind in known_kinds():
        row: dict[str, Any] = {"device": kind, "available": False, "why_not": "", "renderer": None,
                               "compiler": None, "version": None, "peak_gflops": None, "peak_gbps": None,
                               "peak_source": None, "info": {}}
        try:
            cls = device_class(kind)
            ok, why = cls.probe()
            row.update(available=bool(ok), why_not="" if ok else str(why))
            row["renderer"] = _name_of(cls.renderer)
        except Exception as e:  # a backend that cannot even be imported is unavailable, not a crash
            row["why_not"] = f"cannot load the backend: {type(e).__name__}: {e}"
            rows.append(row)
            continue
        if info:
            try:
                # an unavailable device may still render and compile here (CUDA without a GPU, METAL's lint)
                dev = get_device(kind) if row["available"] or kind != "REMOTE" else None
                facts = dict(dev.info()) if dev is not None else {}
                if dev is not None:
                    row["renderer"] = facts.get("renderer") or _name_of(dev.renderer)
                    comp = dev.compiler
                    row["compiler"] = facts.get("compiler") or (f"{comp.name}" if comp is not None else None)
                    row["version"] = facts.get("version") or (comp.version if comp is not None else None)
                    if comp is None and not row["why_not"]:
                        row["why_not"] = dev.compile_error or ""
                row["peak_gflops"] = facts.get("peak_gflops")
                row["peak_gbps"] = facts.get("peak_gbps")
                row["peak_source"] = "device" if row["peak_gflops"] or row["peak_gbps"] else None
                stored = bench.stored_peak(dev) if dev is not None and not row["peak_source"] else None
                if stored is not None:  # (the CPU's: measured by an earlier `tgc bench`, kept in the cache)
                    row.update(peak_gflops=stored["gflops"], peak_gbps=stored["gbps"], peak_source="measured",
                               peak_measured=stored["measured"])
                row["info"] = facts
            except Exception as e:
                row["why_not"] = row["why_not"] or f"{type(e).__name__}: {e}"
        rows.append(row)
    return _remote_servers(rows, info)


def _remote_servers(rows: list[dict[str, Any]], info: bool) -> list[dict[str, Any]]:
    """`rows` with REMOTE's row replaced by one per server (`REMOTE:i`, with `server`: host:port) when
    `TGC_REMOTE` names several."""
    try:
        cls = device_class("REMOTE")
        addrs = cls.addresses()
    except Exception:
        return rows
    if len(addrs) <= 1:
        return rows
    out = []
    for row in rows:
        if row["device"] != "REMOTE":
            out.append(row)
            continue
        for i, addr in enumerate(addrs):
            ok, why = cls.probe(i)
            r = {**row, "device": f"REMOTE:{i}", "server": addr, "available": ok, "why_not": "" if ok else why,
                 "renderer": None, "compiler": None, "version": None, "peak_gflops": None, "peak_gbps": None,
                 "info": {}}
            if ok and info:
                try:
                    dev = get_device(f"REMOTE:{i}")
                    facts = dict(dev.info())
                    comp = dev.compiler
                    r.update(renderer=facts.get("renderer") or _name_of(dev.renderer), info=facts,
                             compiler=facts.get("compiler") or (comp.name if comp is not None else None),
                             version=facts.get("version") or (comp.version if comp is not None else None),
                             peak_gflops=facts.get("peak_gflops"), peak_gbps=facts.get("peak_gbps"))
                except Exception as e:
                    r["why_not"] = f"{type(e).__name__}: {e}"
            out.append(r)
    return out



def _device(device: str | None) -> Any:
    return one_device(device)


def device_names(device: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """A device or device list (`"CPU:0,CPU:1"` or a list of names; None: TGC_DEVICE or CPU) as its names."""
    if device is None:
        device = default_device()
    if not isinstance(device, (str, list, tuple)):  # (device=0 was "TypeError: 'int' object is not iterable")
        raise TgcError(f"device must be a name such as 'CPU' or 'CPU:0,CPU:1', or a list of names, got {device!r}")
    parts = device.split(",") if isinstance(device, str) else [str(x) for x in device]
    names = [x.strip() for x in parts]
    if not names or any(not x for x in names):
        raise TgcError(f"bad device list '{device if isinstance(device, str) else ','.join(parts)}'",
                       hint="write names separated by commas, e.g. CPU:0,CPU:1")
    return names


def device_list(names: list[str]) -> list[Any]:
    """The device objects of a device list: each name checked (an unknown or unavailable one is one user
    error), none twice; several devices of a kind each get their share (`Device.shared`: CPU cores)."""
    keys = []
    for name in names:
        key = canonical(name)
        if key in keys:
            raise TgcError(f"device {name} appears twice in the device list '{','.join(names)}'",
                           hint="name each device once, e.g. CPU:0,CPU:1")
        keys.append(key)
    devs = [get_device(name) for name in names]
    for name, dev in zip(names, devs):
        if dev.kind == "REMOTE" and not device_class("REMOTE").addresses():  # (not a server that is down: exit 1)
            raise TgcError(f"device {name} in the device list is not available here: TGC_REMOTE is not set",
                           hint="set TGC_REMOTE=host1:port,host2:port (the servers of REMOTE:0, REMOTE:1, ...) "
                                "or pass --remote")
        # (a REMOTE device that has its server's properties has shown the server answers with this token: the
        # class's probe, of REMOTE:0 on two more connections, adds nothing and could be refused as busy)
        if dev.compiler is None or (dev.kind != "REMOTE" and not device_class(dev.kind).probe()[0]):
            why = dev.compile_error or device_class(dev.kind).probe()[1]
            raise TgcError(f"device {name} in the device list is not available here: {why}",
                           hint="list only devices that `tgc devices` shows as available")
    out = []
    for dev in devs:
        same = [d for d in devs if d.kind == dev.kind]
        out.append(dev.shared(same.index(dev), len(same)))
    return out


def _decl_text(decl: InputDecl) -> str:
    return f"{decl.dtype.name}[{', '.join(map(str, decl.shape))}]"


_ = (concrete_shape, prod, to_user_array)
