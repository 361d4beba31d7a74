"""The Python API: `load`/`loads` give a `Program`; `Program.run` executes, `Program.compile` shows kernels."""

from __future__ import annotations

import difflib
import os
import sys
from typing import Any

import numpy as np

from tgc.backends import canonical, default_device, device_class, get_device, known_kinds
from tgc.codegen.kernel import Kernel, build_kernel
from tgc.codegen.search import beam_items
from tgc.dsl.frontend import InputDecl, Parsed, concrete_shape, dim_names, parse, trace
from tgc.dtype import DType
from tgc.engine import bench
from tgc.engine.conform import as_array as _as_array
from tgc.engine.inputs import random_inputs
from tgc.engine.multi import MultiLowered, bench_multi, run_multi
from tgc.engine.multi import plan as plan_multi
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
        self._multi: dict[tuple, MultiLowered] = {}
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
        """The kernels' ASTs before optimization (what `--emit schedule` shows); for a device list, the whole
        program's schedule on its first device (before sharding)."""
        dev = _device(device_names(device)[0])
        outs, _ = self._trace(self.resolve_dims(dims))
        items = create_schedule(outs, dev.caps)
        for item in items:
            item.line = self.line_of(item.meta.get("serves", item.output))
        return items

    def compile(self, device: str | list[str] | None = None, dims: dict[str, int] | None = None,
                beam: int | None = None, tuned: bool = True, progress: Any = None,
                shard: dict[str, int] | None = None) -> list[Kernel]:
        """The program's kernels in launch order, rendered and (where this machine can) compiled.
        `beam=W` searches kernels without a stored winner from a search at least W wide; `tuned=False`
        ignores stored winners; `progress(event)` follows the searches as in `Program.beam`. For a device
        list (with `shard`), each distinct kernel once (`device_kernels` says which device runs which)."""
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
    def run(self, device: str | list[str] | None = None, dims: dict[str, int] | None = None, cast: bool = False,
            inputs: dict[str, Any] | None = None, shard: dict[str, int] | None = None,
            **kw_inputs: Any) -> dict[str, np.ndarray]:
        """Execute on a device; returns {output name: numpy array}. Inputs come as keywords (`x=arr`) or,
        for names that clash with these parameters, as `inputs={"device": arr}`. A device list
        (`"CPU:0,CPU:1"` or a list) runs the program sharded: `shard={"x": 0}` splits input x along axis 0
        across the devices, inputs not named are replicated; outputs come back whole."""
        dims, arrays = self.bind({**(inputs or {}), **kw_inputs}, dims, cast=cast)
        names = device_names(device)
        shard_axes = self.shard_axes(shard, dims, len(names))
        if len(names) == 1:
            _device(names[0]).ensure_runnable()
            return run_program(self.lower(names[0], dims), arrays)
        return run_multi(self.lower_multi(names, dims, shard_axes), arrays).outputs

    # --- many devices
    def device_kernels(self, device: str | list[str], dims: dict[str, int] | None = None,
                       shard: dict[str, int] | None = None, beam: int | None = None, tuned: bool = True
                       ) -> list[tuple[str, Kernel]]:
        """(device name, kernel) for every launch of the program on a device list, in launch order."""
        names = device_names(device)
        dims = self.resolve_dims(dims)
        ml = self.lower_multi(names, dims, self.shard_axes(shard, dims, len(names)), beam, tuned)
        return [(names[d], k) for d, k in ml.kernels()]

    def shard_axes(self, shard: dict[str, int] | None, dims: dict[str, int], n: int) -> dict[str, int]:
        """Check `shard` ({input name: axis}) against the declarations, dims and the device count; the axes
        made non-negative."""
        out: dict[str, int] = {}
        declared = {d.name: d for d in self.inputs}
        for name, axis in (shard or {}).items():
            decl = declared.get(name)
            if decl is None:
                close = difflib.get_close_matches(name, declared, n=1)
                raise TgcError(f"cannot shard '{name}': the program has no input of that name", file=self.filename,
                               hint=f"did you mean '{close[0]}'?" if close else
                               "inputs: " + (", ".join(sorted(declared)) or "(none)"))
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
                    tuned: bool = True) -> MultiLowered:
        """The program planned across a device list (`tgc.engine.multi.plan`) with each device's part compiled
        through the single-device pipeline; kernels compiled once per device and distinct kernel."""
        dims = self.resolve_dims(dims)
        beam = env_int("BEAM", 0) if beam is None else beam
        key = (tuple(devices), tuple(sorted(dims.items())), tuple(sorted(shard.items())), beam, tuned)
        if key in self._multi:
            return self._multi[key]
        devs = device_list(devices)
        for dev in devs:
            dev.ensure_runnable()
        outs, in_bufs = trace(self.parsed, dims, {})
        index = {d.name: i for i, d in enumerate(self.inputs)}
        p = plan_multi(outs, in_bufs, {index[k]: v for k, v in shard.items()}, len(devs))
        memo: dict[tuple, Kernel] = {}
        items_of: list[list[ScheduleItem]] = [[] for _ in devs]

        def build(d: int, nodes: list[UOp]) -> tuple[list[UOp], list[Kernel]]:
            """Device d's kernels computing `nodes`; the nodes that then hold them (split reductions differ)."""
            dev = devs[d]
            todo = [n for n in dict.fromkeys(nodes) if n.op is not Ops.BUFFER]
            split = dict(zip(todo, split_large_reduces(todo))) if todo else {}
            items = [it for it in create_schedule(list(dict.fromkeys(split.values())), dev.caps) if it.ast.src]
            items_of[d].extend(items)
            kernels = []
            for item in items:
                item.line = None
                mk = (id(dev), item.ast, tuple(item.bufs))  # (equal ASTs may read different buffers)
                if mk not in memo:
                    memo[mk] = build_kernel(item, dev, beam=beam, tuned=tuned)
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
        ml = MultiLowered(devs, p, step_nodes, step_kernels, out_nodes, out_kernels,
                          {i: d.name for i, d in enumerate(self.inputs)}, list(self.output_names), items_of)
        if env_int("DEBUG", 0) >= 2:
            for note in p.notes:
                print(f"*** multi: {note}", file=sys.stderr)
        self._multi[key] = ml
        return ml

    def reference(self, dims: dict[str, int] | None = None, **inputs: Any) -> dict[str, np.ndarray]:
        """The program evaluated by numpy in float64 (ints exact), for `--check`."""
        dims, arrays = self.bind(inputs, dims, cast=True)
        outs, bufs = self._trace(dims)
        env = {b: arrays[self.inputs[b.arg[0]].name] for b in bufs}
        return {name: evaluate(o, env) for name, o in zip(self.output_names, outs)}

    def output_types(self, dims: dict[str, int]) -> list[tuple[str, DType, tuple[int, ...]]]:
        outs, _ = self._trace(self.resolve_dims(dims))
        return [(n, o.dtype, shape_of(o)) for n, o in zip(self.output_names, outs)]

    def bench(self, device: str | list[str] | None = None, dims: dict[str, int] | None = None, repeat: int = 10,
              beam: int = 0, inputs: dict[str, np.ndarray] | None = None,
              warmup: int = 1, tuned: bool = True, shard: dict[str, int] | None = None) -> dict[str, Any]:
        """Time the program on device-resident inputs (random ones by default, `tgc.engine.inputs`); see
        `tgc bench --json`. numpy's time beside it is the CLI's (`tgc.baselines.numpy_eval.time_numpy`).
        On a device list: per-device kernel time, the collectives' time and bandwidth, the whole program."""
        if inputs is None:
            dims = self.resolve_dims(dims)
            inputs = random_inputs(self, dims)
        dims, arrays = self.bind(inputs, dims, cast=True)
        names = device_names(device)
        if len(names) > 1:
            axes = self.shard_axes(shard, dims, len(names))
            timing = bench_multi(self.lower_multi(names, dims, axes, beam=beam, tuned=tuned), arrays,
                                 repeat=repeat, warmup=warmup)
            return {"device": ",".join(names), "dims": dims, "repeat": repeat, "beam": beam, "shard": axes,
                    **timing, "identity": {**self.identity(names[0], dims), "device": ",".join(names),
                                           "shard": axes}}
        dev = _device(names[0])
        timing = bench.bench_lowered(self.lower(dev.name, dims, beam=beam, tuned=tuned), arrays, repeat=repeat,
                                     warmup=warmup)
        result: dict[str, Any] = {"device": dev.name, "dims": dims, "repeat": repeat, "beam": beam, **timing,
                                  "identity": self.identity(dev.name, dims)}
        return result

    def identity(self, device: str | None, dims: dict[str, int]) -> dict[str, Any]:
        """What a timing of this program depends on beyond its kernels' code (`tgc bench --baseline` compares
        only equal identities): the source's hash, dims, the device and its model, the tgc version."""
        names = device_names(device)
        ident = bench.identity(self, _device(names[0]), dims)
        return ident if len(names) == 1 else {**ident, "device": ",".join(names)}

    def beam(self, device: str | list[str] | None = None, dims: dict[str, int] | None = None, width: int = 4,
             progress: Any = None, force: bool = False, shard: dict[str, int] | None = None) -> dict[str, Any]:
        """Search every kernel of the program (BEAM); store the winners; report before/after per kernel.
        On a device list: each device's per-shard kernels, searched once per device kind (on the first device
        of that kind, with its share of the cores); winners are stored per kind, so every device uses them."""
        names = device_names(device)
        if len(names) > 1:
            dims = self.resolve_dims(dims)
            ml = self.lower_multi(names, dims, self.shard_axes(shard, dims, len(names)), beam=0)
            rows, seconds = [], 0.0
            kinds: dict[str, int] = {}
            for d, dev in enumerate(ml.devices):
                kinds.setdefault(dev.kind, d)
            for kind, first in kinds.items():
                dev = ml.devices[first]
                if dev.compiler is None:
                    raise CompileError(dev.compile_error or f"cannot compile for {kind} here, so it cannot be tuned")
                items = {}
                for d, its in enumerate(ml.items):
                    if ml.devices[d].kind == kind:
                        for it in its:
                            items.setdefault(it.ast, it)
                r, sec = beam_items(list(items.values()), dev, width, progress=progress, force=force)
                rows += [{**row, "device": kind} for row in r]
                seconds += sec
            self._multi.clear()
            return {"device": ",".join(names), "dims": dims, "width": width, "kernels": rows, "seconds": seconds,
                    "interrupted": any(r.get("interrupted") for r in rows)}
        dev = _device(names[0])
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
    name = device or default_device()
    if "," in name:
        raise TgcError(f"'{name}' is a device list; this needs one device",
                       hint="name one device, e.g. " + name.split(",")[0].strip())
    return get_device(name)


def device_names(device: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """A device or device list (`"CPU:0,CPU:1"` or a list of names; None: TGC_DEVICE or CPU) as its names."""
    if device is None:
        device = default_device()
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
        if dev.compiler is None or not device_class(dev.kind).probe()[0]:
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
