"""The Python API: `load`/`loads` give a `Program`; `Program.run` executes, `Program.compile` shows kernels."""

from __future__ import annotations

import difflib
import os
from typing import Any

import numpy as np

from tgc.backends import default_device, device_class, get_device, known_kinds
from tgc.codegen.kernel import Kernel, build_kernel
from tgc.codegen.search import beam_items
from tgc.dsl.frontend import InputDecl, Parsed, concrete_shape, dim_names, parse, trace
from tgc.dtype import DType, dtypes, f32_to_bf16
from tgc.engine import bench
from tgc.engine.inputs import random_inputs
from tgc.engine.realize import Lowered, run_program, to_user_array
from tgc.engine.reference import evaluate
from tgc.engine.schedule import ScheduleItem, create_schedule, split_large_reduces
from tgc.env import env_int
from tgc.errors import BindError, CompileError, TgcError
from tgc.ir.shapes import prod, shape_of
from tgc.ir.uop import Ops, UOp

__all__ = ["Program", "Kernel", "load", "loads", "InputDecl", "devices"]


def load(path: str | os.PathLike) -> Program:
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a leading byte-order mark is not source
            source = f.read()
    except FileNotFoundError:
        raise TgcError(f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TgcError(f"cannot read {path}: {e}") from None
    prog = loads(source, filename=path)
    prog.path = path
    return prog


def loads(source: str, filename: str = "<string>") -> Program:
    return Program(source, filename)


class Program:
    """A parsed `.tg` program. Traced, scheduled and compiled lazily for each set of dims and device."""

    def __init__(self, source: str, filename: str = "<string>"):
        self.source, self.path = source, None
        self.filename = filename
        self.parsed: Parsed = parse(source, filename)
        self._traces: dict[tuple, tuple[list[UOp], list[UOp]]] = {}
        self._kernels: dict[tuple, list[Kernel]] = {}
        self._lines: dict[UOp, int] = {}  # tensor node -> the .tg line that first computed it
        self._check_without_dims()

    @property
    def inputs(self) -> list[InputDecl]:
        return self.parsed.inputs

    @property
    def output_names(self) -> list[str]:
        return self.parsed.output_names

    @property
    def dim_names(self) -> list[str]:
        return dim_names(self.parsed)

    def _check_without_dims(self) -> None:
        """Report errors that do not depend on dim sizes at load time (unknown names, dtype errors, ...)."""
        trial = {name: 2 + i for i, name in enumerate(self.dim_names)}  # distinct small sizes
        try:
            self._trace(trial)
        except TgcError as e:
            if not getattr(e, "shape_dependent", False):
                raise
        finally:
            self._traces.clear()

    # --- binding inputs
    def bind(self, inputs: dict[str, Any], dims: dict[str, int] | None = None, cast: bool = False
             ) -> tuple[dict[str, int], dict[str, np.ndarray]]:
        """Check inputs against the declarations; return (dims, arrays in the declared dtypes)."""
        dims = dict(dims or {})
        for k, v in dims.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise TgcError(f"dim {k} must be a non-negative integer, got {v!r}")
        declared = {d.name for d in self.inputs}
        for name in inputs:
            if name not in declared:
                close = difflib.get_close_matches(name, declared, n=1)
                raise TgcError(f"unknown input '{name}'", file=self.filename,
                               hint=f"did you mean '{close[0]}'?" if close else
                               "inputs: " + (", ".join(sorted(declared)) or "(none)"))
        bound_by: dict[str, str] = {k: "" for k in dims}  # "": from the dims given
        arrays: dict[str, np.ndarray] = {}
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
                                       file=self.filename, line=decl.line, col=decl.col, end_col=decl.end_col,
                                       text=self.parsed.lines[decl.line - 1])
                elif want in dims:
                    if dims[want] != have:
                        source = f"input '{bound_by[want]}'" if bound_by[want] else "the dims given"
                        raise TgcError(f"dim {want} mismatch: input '{decl.name}' axis {axis} has size {have}, "
                                       f"but {want} = {dims[want]} from {source}", file=self.filename,
                                       line=decl.line, col=decl.col, end_col=decl.end_col,
                                       text=self.parsed.lines[decl.line - 1])
                else:
                    dims[want] = have
                    bound_by[want] = decl.name
            arrays[decl.name] = arr
        return dims, arrays

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
        dims = dict(dims or {})
        missing = [d for d in self.dim_names if d not in dims]
        if missing:
            raise BindError(f"dim {missing[0]} is unknown", need="dim", name=missing[0], hint="give its size in dims")
        return dims

    # --- tracing, scheduling, compiling
    def _trace(self, dims: dict[str, int]) -> tuple[list[UOp], list[UOp]]:
        key = tuple(sorted(dims.items()))
        if key not in self._traces:
            outs, bufs = trace(self.parsed, dims, self._lines)
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
        """The kernels' ASTs before optimization (what `--emit schedule` shows)."""
        dev = _device(device)
        outs, _ = self._trace(self.resolve_dims(dims))
        items = create_schedule(outs, dev.caps)
        for item in items:
            item.line = self.line_of(item.meta.get("serves", item.output))
        return items

    def compile(self, device: str | None = None, dims: dict[str, int] | None = None, beam: int | None = None,
                tuned: bool = True, progress: Any = None) -> list[Kernel]:
        """The program's kernels in launch order, rendered and (where this machine can) compiled.
        `beam=W` searches kernels without a stored winner from a search at least W wide; `tuned=False`
        ignores stored winners; `progress(event)` follows the searches as in `Program.beam`."""
        dev = _device(device)
        dims = self.resolve_dims(dims)
        beam = env_int("BEAM", 0) if beam is None else beam
        key = (dev.name, tuple(sorted(dims.items())), beam, tuned)
        if key not in self._kernels:
            outs, _ = self._trace(dims)
            items = create_schedule(outs, dev.caps)
            names: dict[str, int] = {}
            kernels = []
            items = [item for item in items if item.ast.src]  # (an empty output computes nothing)
            for i, item in enumerate(items):
                n = names.get(item.name, 0)
                names[item.name] = n + 1
                item.line = self.line_of(item.meta.get("serves", item.output))

                def report(event: dict, i: int = i) -> None:
                    progress({**event, "index": i, "total": len(items)})

                kernels.append(build_kernel(item, dev, beam=beam, name=f"{item.name}n{n}" if n else item.name,
                                            tuned=tuned, progress=report if progress is not None else None))
            self._kernels[key] = kernels
        return self._kernels[key]

    def lower(self, device: str | None = None, dims: dict[str, int] | None = None, beam: int | None = None,
              tuned: bool = True) -> Lowered:
        """The program compiled for one device and set of dims, as the realizer and bench run it."""
        dev = _device(device)
        dims = self.resolve_dims(dims)
        kernels = self.compile(device=dev.name, dims=dims, beam=beam, tuned=tuned)
        outs, in_bufs = self._trace(dims)
        return Lowered(dev, kernels, [(b, self.inputs[b.arg[0]].name) for b in in_bufs],
                       list(zip(self.output_names, outs)))

    # --- running
    def run(self, device: str | None = None, dims: dict[str, int] | None = None, cast: bool = False,
            inputs: dict[str, Any] | None = None, **kw_inputs: Any) -> dict[str, np.ndarray]:
        """Execute on a device; returns {output name: numpy array}. Inputs come as keywords (`x=arr`) or,
        for names that clash with these parameters, as `inputs={"device": arr}`."""
        dims, arrays = self.bind({**(inputs or {}), **kw_inputs}, dims, cast=cast)
        name = device or default_device()
        if "," in name:
            raise TgcError(f"device lists such as '{name}' (one program sharded across devices) are not supported "
                           "yet", hint="run on one device, e.g. " + name.split(",")[0].strip())
        _device(name).ensure_runnable()
        return run_program(self.lower(name, dims), arrays)

    def reference(self, dims: dict[str, int] | None = None, **inputs: Any) -> dict[str, np.ndarray]:
        """The program evaluated by numpy in float64 (ints exact), for `--check`."""
        dims, arrays = self.bind(inputs, dims, cast=True)
        outs, bufs = self._trace(dims)
        env = {b: arrays[self.inputs[b.arg[0]].name] for b in bufs}
        return {name: evaluate(o, env) for name, o in zip(self.output_names, outs)}

    def output_types(self, dims: dict[str, int]) -> list[tuple[str, DType, tuple[int, ...]]]:
        outs, _ = self._trace(self.resolve_dims(dims))
        return [(n, o.dtype, shape_of(o)) for n, o in zip(self.output_names, outs)]

    def bench(self, device: str | None = None, dims: dict[str, int] | None = None, repeat: int = 10,
              beam: int = 0, inputs: dict[str, np.ndarray] | None = None,
              warmup: int = 1, tuned: bool = True) -> dict[str, Any]:
        """Time the program on device-resident inputs (random ones by default, `tgc.engine.inputs`); see
        `tgc bench --json`. numpy's time beside it is the CLI's (`tgc.baselines.numpy_eval.time_numpy`)."""
        dev = _device(device)
        if inputs is None:
            dims = self.resolve_dims(dims)
            inputs = random_inputs(self, dims)
        dims, arrays = self.bind(inputs, dims, cast=True)
        timing = bench.bench_lowered(self.lower(dev.name, dims, beam=beam, tuned=tuned), arrays, repeat=repeat,
                                     warmup=warmup)
        result: dict[str, Any] = {"device": dev.name, "dims": dims, "repeat": repeat, "beam": beam, **timing,
                                  "identity": self.identity(dev.name, dims)}
        return result

    def identity(self, device: str | None, dims: dict[str, int]) -> dict[str, Any]:
        """What a timing of this program depends on beyond its kernels' code (`tgc bench --baseline` compares
        only equal identities): the source's hash, dims, the device and its model, the tgc version."""
        return bench.identity(self, _device(device), dims)

    def beam(self, device: str | None = None, dims: dict[str, int] | None = None, width: int = 4,
             progress: Any = None, force: bool = False) -> dict[str, Any]:
        """Search every kernel of the program (BEAM); store the winners; report before/after per kernel."""
        dev = _device(device)
        if dev.compiler is None:
            raise CompileError(dev.compile_error or f"cannot compile for {dev.kind} here, so it cannot be tuned here")
        dims = self.resolve_dims(dims)
        rows, seconds = beam_items(self.schedule(dims, dev.name), dev, width, progress=progress, force=force)
        self._kernels.clear()  # later compiles pick up the stored winners
        return {"device": dev.name, "dims": dims, "width": width, "kernels": rows, "seconds": seconds,
                "interrupted": any(r.get("interrupted") for r in rows)}


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
                               "compiler": None, "version": None, "peak_gflops": None, "peak_gbps": None, "info": {}}
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
                row["info"] = facts
            except Exception as e:
                row["why_not"] = row["why_not"] or f"{type(e).__name__}: {e}"
        rows.append(row)
    return rows



def _device(device: str | None) -> Any:
    return get_device(device or default_device())


def _decl_text(decl: InputDecl) -> str:
    return f"{decl.dtype.name}[{', '.join(map(str, decl.shape))}]"


def _as_array(value: Any, decl: InputDecl, cast: bool, at: dict[str, Any]) -> np.ndarray:
    want = decl.dtype
    if isinstance(value, (bool, int, float, np.generic)) or (isinstance(value, (list, tuple))):
        value = np.asarray(value)
        if value.dtype == np.float64 and want.is_float or value.dtype.kind in "iub" and not want.is_float:
            cast = True
    if not isinstance(value, np.ndarray):
        raise TgcError(f"input '{decl.name}' must be a numpy array, got {type(value).__name__}")
    if want == dtypes.bf16:
        if value.dtype == np.uint16:  # bf16 bit patterns (how tgc holds bf16), with or without cast
            return np.require(value, requirements="C")
        if value.dtype.kind == "f" or cast:
            return f32_to_bf16(value.astype(np.float32))
    if value.dtype != want.np:
        if value.dtype.kind in "OVSUM" or value.dtype.kind == "c":
            raise TgcError(f"input '{decl.name}' has dtype {value.dtype}, which tgc cannot use")
        if not cast:
            got = dtypes.from_numpy(value.dtype)
            raise BindError(f"input '{decl.name}' is {got.name if got else value.dtype}, but the program declares it "
                            f"{_decl_text(decl)}", need="cast", name=decl.name, dtype=want.name,
                            hint=f"convert the array to {want.name}, or bind with cast=True", **at)
        value = value.astype(want.np)
    return np.require(value, requirements="C")  # (ascontiguousarray would turn a 0-d array into 1-d)


_ = (concrete_shape, prod, to_user_array)
