"""Device-list packages (format version 3): a program compiled for a device list (`-d CPU:0,OPENCL:0`, with
`--shard`), saved as its multi-device `Executable` (`Executable.across`, `tgc.engine.multi.build_executable`)
and run later without its source and without a compiler.

The archive is a version-1 package's (`tgc.package`: data only, the file checksum, the content hash, every
member hashed, the same member names and limits); the manifest differs:

- `devices`: the device list, in order: each `kind`, `name` (as listed, `CPU:0`), `target` (what its binaries
  need to load, `Device.binary_target()`) and `compiler`; `device` is kept (the first device) so that every
  reader of a package's header reads one;
- `shard`: {input name: axis} as compiled (inputs not named are replicated);
- `signature`: the whole program's `inputs`/`outputs` (`name`, `dtype`, `shape`, integers);
- `parts`: per device its `buffers` (as a version-1 package's: `dtype`, `shape`, `nbytes`, `role`, `name`)
  and its `memory` plan (`slots`, `slot_of` per buffer, -1 for one no step uses, `peak_bytes`, `inplace`);
- `kernels`: every distinct kernel once (`device`: its position in the list, then a version-1 kernel's fields,
  `bufs` indices into its device's buffers; members `kernels/<i>.bin|src`);
- `steps` in order: `["launch", kernel]`, `["copy", src_device, src_buffer, dst_device, dst_buffer]`,
  `["allreduce", op, [buffer per device], index]` (in place, `op` one of ADD MUL MAX MIN), `["gather", axis,
  bounds, [shard per device], [whole buffer per device], index]`;
- `input_parts`: `[name, device, buffer, axis, [start, end]]` (axis and rows null: the whole input);
  `output_parts`: `[name, [[device, buffer], ...], axis]` (axis null: one replicated copy, the first holder's).

Loading validates all of it before anything runs (`MultiPackage`): every index in range, every buffer's size
against its shape, copies between buffers of one size, collectives over buffers of one type and shard bounds
that tile the whole, input parts that are the named input's rows, kernels against their launch contracts
(never writing an input), and each device's memory plan against the lifetimes its steps give (as
`tgc.engine.realize.plan_device` computes them). At run the devices are opened by their names (or a `-d` list
of as many devices of the same kinds): a device this machine lacks, or one of another binary target, is one
`PackageError` (exit 2) naming it. Imports neither the front end nor a compiler on the load path.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from tgc.dtype import DType
from tgc.engine.conform import as_array, check_input_names
from tgc.errors import BindError, TgcError
from tgc.package import (
    MAX_BUFFERS,
    MAX_DIM,
    MAX_KERNELS,
    MAX_RANK,
    Package,
    PackagedKernel,
    PackageError,
    PlanBuffer,
    _archive,
    _bad,
    _dtype,
    _int,
    _io_name,
    _list,
    _name,
    _obj,
    _read_header,
)
from tgc.version import __version__

MULTI_VERSION = 3
MAX_DEVICES = 64
MAX_STEPS = 1 << 16
REDUCE_OPS = ("ADD", "MUL", "MAX", "MIN")


# ---------------------------------------------------------------------------------------------------------------
# writing


def build_multi(prog: Any, exe: Any, names: list[str], dims: dict[str, int], shard: dict[str, int]) -> bytes:
    """The device-list package of `exe` (`Program.lower_multi(names, dims, shard)`'s executable) as bytes."""
    from tgc.engine.realize import Collective, Copy, Launch, buffer_type
    from tgc.errors import CompileError

    if getattr(prog, "weights", None):
        raise TgcError("a device-list package of an ONNX model (weights bound at load) is not supported",
                       hint="package it for one device")
    devs = exe.devices
    missing = next((k for k in exe.kernels if k.binary is None), None)
    if missing is not None:
        raise CompileError(f"cannot package for {','.join(names)}: kernel {missing.name} could not be compiled "
                           f"here: {missing.compile_error or 'no compiler on this machine'}",
                           hint="package on a machine that can compile for these devices")
    n = len(devs)
    index: list[dict[Any, int]] = [{} for _ in range(n)]
    buffers: list[list[dict]] = [[] for _ in range(n)]
    roles: list[dict[Any, tuple[str, str | None]]] = [{} for _ in range(n)]
    for part in exe.inputs:
        roles[part.device][part.key] = ("input", part.name)
    for out in exe.outputs:
        for d, key in out.holders:
            roles[d].setdefault(key, ("output", out.name))

    def buf(d: int, key: Any) -> int:
        if key not in index[d]:
            dtype, shape = buffer_type(key)
            role, name = roles[d].get(key, ("temp", None))
            index[d][key] = len(buffers[d])
            buffers[d].append({"dtype": dtype.name, "shape": [int(s) for s in shape],
                               "nbytes": max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1),
                               "role": role, "name": name})
        return index[d][key]

    files: dict[str, dict] = {}
    blobs: dict[str, bytes] = {}
    kernels: list[dict] = []
    kernel_index: dict[tuple[int, int], int] = {}  # (device, id(kernel)) -> its entry
    steps: list[list] = []
    for s in exe.steps:
        if isinstance(s, Launch):
            k, d = s.kernel, s.device
            if (d, id(k)) not in kernel_index:
                i = kernel_index[(d, id(k))] = len(kernels)
                for member, data in ((f"kernels/{i}.bin", bytes(k.binary)), (f"kernels/{i}.src", k.src.encode())):
                    blobs[member] = data
                    files[member] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                kernels.append({"device": d, "name": k.name, "binary": f"kernels/{i}.bin",
                                "source": f"kernels/{i}.src", "bufs": [buf(d, key) for key in k.bufs],
                                "global_size": [int(x) for x in k.global_size],
                                "local_size": [int(x) for x in k.local_size] if k.local_size else None,
                                "vals": [int(v) for v in k.vals], "flops": int(k.flops), "bytes": int(k.bytes_moved),
                                "line": k.line, "opts": [str(o) for o in k.opts]})
            steps.append(["launch", kernel_index[(d, id(k))]])
        elif isinstance(s, Copy):
            steps.append(["copy", s.src_device, buf(s.src_device, s.src), s.dst_device, buf(s.dst_device, s.dst)])
        elif isinstance(s, Collective) and s.kind == "allreduce":
            op = s.arg if isinstance(s.arg, str) else s.arg.name
            steps.append(["allreduce", op.upper(), [buf(d, b) for d, b in enumerate(s.bufs)], s.index])
        elif isinstance(s, Collective):
            axis, bounds = s.arg
            steps.append(["gather", int(axis), [[int(a), int(b)] for a, b in bounds],
                          [buf(d, b) for d, b in enumerate(s.srcs)], [buf(d, b) for d, b in enumerate(s.bufs)],
                          s.index])
        else:
            raise TgcError(f"cannot package a step {type(s).__name__}")
    input_parts = [[p.name, p.device, buf(p.device, p.key), p.axis, list(p.rows) if p.rows is not None else None]
                   for p in exe.inputs]
    output_parts = [[o.name, [[d, buf(d, key)] for d, key in o.holders], o.axis] for o in exe.outputs]
    parts = []
    for d in range(n):
        plan = exe.memory_plan(d)
        for key in plan.slot_of:
            buf(d, key)
        slots = [plan.slot_of.get(key, -1) for key in index[d]]
        parts.append({"buffers": buffers[d],
                      "memory": {"slots": list(plan.slots), "slot_of": slots, "peak_bytes": plan.peak_bytes,
                                 **({"inplace": [[index[d][o], index[d][i]] for o, i in plan.inplace]}
                                    if plan.inplace else {})}})
    types = {name: (dt, shape) for name, dt, shape in prog.output_types(dims)}
    from tgc.dsl.frontend import concrete_shape  # (writing: the program is parsed already)

    sig_inputs = [{"name": d.name, "dtype": d.dtype.name, "shape": [int(x) for x in concrete_shape(d, dims)]}
                  for d in prog.inputs]
    sig_outputs = [{"name": nm, "dtype": types[nm][0].name, "shape": [int(x) for x in types[nm][1]]}
                   for nm in prog.output_names]
    cpu = next((dev for dev in devs if dev.kind == "CPU"), devs[0])  # (its graph runner ships, as a CPU package's)
    return _archive(prog, cpu, MULTI_VERSION, {
        "devices": [{"kind": dev.kind, "name": nm, "target": dev.binary_target(),
                     "compiler": dev.compiler.cache_key if dev.compiler is not None else None}
                    for dev, nm in zip(devs, names)],
        "dims": {k: int(v) for k, v in sorted(dims.items())},
        "shard": {k: int(v) for k, v in sorted(shard.items())},
        "signature": {"inputs": sig_inputs, "outputs": sig_outputs},
        "parts": parts, "kernels": kernels, "steps": steps,
        "input_parts": input_parts, "output_parts": output_parts,
    }, blobs, files)


# ---------------------------------------------------------------------------------------------------------------
# reading


class _Part(Package):
    """One device's part of a device-list package: read with a version-1 package's checks (buffers, kernels and
    their launch contracts), by the package's path, dims and members."""

    def __init__(self, pkg: MultiPackage, d: int, doc: dict):  # (not Package.__init__: a part has no header)
        self.path, self.dims, self._members = pkg.path, pkg.dims, pkg._members
        self.device_kind = pkg.device_docs[d]["kind"]
        self._from_symbolic, self._contract_sizes = False, True
        self.buffers = self._read_buffers(doc.get("buffers"))


class MultiPackage:
    """A validated device-list package: its signature, each device's buffers, kernels and memory plan, the steps;
    `run` and `bench` on its device list (see the module's docstring)."""

    symbolic = False
    multi = True
    MAX_PLANS = 4

    def __init__(self, manifest: dict, members: dict[str, bytes], path: str = "<bytes>"):
        m = _read_header(self, manifest, members, path)
        docs = _list(m.get("devices"), "devices", path, MAX_DEVICES)
        if len(docs) < 2:
            raise _bad(path, "a device-list package names fewer than two devices")
        self.device_docs = []
        for i, doc in enumerate(docs):
            doc = _obj(doc, f"device {i}", path)
            kind = _name(doc.get("kind"), f"device {i} kind", path)
            name, target = doc.get("name"), doc.get("target")
            if not isinstance(name, str) or not 0 < len(name) <= 64 or not isinstance(target, str) or \
                    len(target) > 256:
                raise _bad(path, f"device {i} has no valid name or target")
            self.device_docs.append({"kind": kind, "name": name, "target": target})
        self.device_names = [d["name"] for d in self.device_docs]
        self.device_name = ",".join(self.device_names)
        n = len(self.device_docs)
        dims = _obj(m.get("dims"), "dims", path)
        self.dims = {_name(k, "a dim name", path): _int(v, f"dim {k}", path, 0, MAX_DIM) for k, v in dims.items()}
        shard = _obj(m.get("shard", {}), "shard", path)
        self.shard = {_io_name(k, "a shard input", path): _int(v, f"shard {k}", path, 0, MAX_RANK - 1)
                      for k, v in shard.items()}
        sig = _obj(m.get("signature"), "signature", path)
        self.inputs = [self._read_whole(d, f"input {i}") for i, d in
                       enumerate(_list(sig.get("inputs"), "signature.inputs", path, MAX_BUFFERS))]
        self.outputs = [self._read_whole(d, f"output {i}") for i, d in
                        enumerate(_list(sig.get("outputs"), "signature.outputs", path, MAX_BUFFERS))]
        for what, group in (("input", self.inputs), ("output", self.outputs)):
            if len({d.name for d in group}) != len(group):
                raise _bad(path, f"two {what}s have the same name")
        raw_parts = _list(m.get("parts"), "parts", path, MAX_DEVICES)
        if len(raw_parts) != n:
            raise _bad(path, f"it has {len(raw_parts)} device parts for {n} devices")
        self.parts = [_Part(self, d, _obj(p, f"part {d}", path)) for d, p in enumerate(raw_parts)]
        self.kernels: list[PackagedKernel] = []
        self.kernel_device: list[int] = []
        for i, k in enumerate(_list(m.get("kernels"), "kernels", path, MAX_KERNELS)):
            k = _obj(k, f"kernel {i}", path)
            d = _int(k.get("device"), f"kernel {i} device", path, 0, n - 1)
            self.kernels.append(self.parts[d]._read_kernel(k, i))
            self.kernel_device.append(d)
        self._read_parts(m)
        self.steps = self._read_steps(_list(m.get("steps"), "steps", path, MAX_STEPS))
        self.memories = [self._read_memory(d, _obj(_obj(p, f"part {d}", path).get("memory"), f"part {d} memory",
                                                   path)) for d, p in enumerate(raw_parts)]
        self.content_hash = m["content_hash"]
        self.graph_runner = Package._read_runner(self, m.get("graph_runner")) \
            if self.device_kind == "CPU" else None
        self.weights: dict[str, np.ndarray] = {}
        from tgc.engine.realize import LaunchPlans
        self._launch_plans = LaunchPlans(self.MAX_PLANS)
        self._exes: dict[tuple, Any] = {}

    # --- validation
    def _read_whole(self, d: Any, where: str) -> Any:
        from tgc.progcache import WholeInput

        d = _obj(d, where, self.path)
        name = _io_name(d.get("name"), f"{where} name", self.path)
        shape = tuple(_int(s, f"{where} shape", self.path, 0, MAX_DIM)
                      for s in _list(d.get("shape"), f"{where} shape", self.path, MAX_RANK))
        return WholeInput(name, _dtype(d.get("dtype"), where, self.path), shape)

    def _buf(self, d: Any, b: Any, where: str) -> PlanBuffer:
        d = _int(d, f"{where} device", self.path, 0, len(self.parts) - 1)
        bufs = self.parts[d].buffers
        return bufs[_int(b, f"{where} buffer", self.path, 0, len(bufs) - 1)]

    def _read_parts(self, m: dict) -> None:
        from tgc.engine.realize import InputPart, OutputPart

        path = self.path
        whole = {d.name: d for d in self.inputs}
        self.input_parts = []
        for i, raw in enumerate(_list(m.get("input_parts"), "input_parts", path, MAX_BUFFERS)):
            raw = _list(raw, f"input part {i}", path, 5)
            if len(raw) != 5:
                raise _bad(path, f"input part {i} is not [name, device, buffer, axis, rows]")
            name, d, b, axis, rows = raw
            decl = whole.get(name)
            if decl is None:
                raise _bad(path, f"input part {i} names no input of the signature")
            buf = self._buf(d, b, f"input part {i}")
            shape = list(decl.shape)
            if axis is not None:
                axis = _int(axis, f"input part {i} axis", path, 0, len(shape) - 1)
                rows = _list(rows, f"input part {i} rows", path, 2)
                if len(rows) != 2:
                    raise _bad(path, f"input part {i} rows are not [start, end]")
                lo, hi = (_int(r, f"input part {i} rows", path, 0, shape[axis]) for r in rows)
                if lo > hi:
                    raise _bad(path, f"input part {i} rows are not [start, end]")
                rows = (lo, hi)
                shape[axis] = hi - lo
            elif rows is not None:
                raise _bad(path, f"input part {i} has rows but no axis")
            if buf.role != "input" or buf.name != name or buf.dtype != decl.dtype or buf.plan_shape != tuple(shape):
                raise _bad(path, f"input part {i} does not match its buffer")
            self.input_parts.append(InputPart(name, d, buf, axis, rows))
        if {p.name for p in self.input_parts} != set(whole):
            raise _bad(path, "an input of the signature goes to no device")
        outs = {d.name: d for d in self.outputs}
        self.output_parts = []
        for i, raw in enumerate(_list(m.get("output_parts"), "output_parts", path, MAX_BUFFERS)):
            raw = _list(raw, f"output part {i}", path, 3)
            if len(raw) != 3 or raw[0] not in outs:
                raise _bad(path, f"output part {i} is not [output name, holders, axis]")
            decl = outs[raw[0]]
            holders = []
            for j, h in enumerate(_list(raw[1], f"output part {i} holders", path, MAX_DEVICES)):
                h = _list(h, f"output part {i} holder {j}", path, 2)
                if len(h) != 2:
                    raise _bad(path, f"output part {i} holder {j} is not [device, buffer]")
                holders.append((h[0], self._buf(h[0], h[1], f"output part {i} holder {j}")))
            if not holders or any(b.dtype != decl.dtype for _, b in holders):
                raise _bad(path, f"output part {i} does not match its buffers")
            axis = raw[2]
            if axis is None:
                if holders[0][1].plan_shape != decl.shape:
                    raise _bad(path, f"output part {i} does not match its buffers")
            else:
                axis = _int(axis, f"output part {i} axis", path, 0, max(len(decl.shape) - 1, 0))
                shapes = [b.plan_shape for _, b in holders]
                if any(len(s) != len(decl.shape) or any(x != y for a, (x, y) in enumerate(zip(s, decl.shape))
                                                        if a != axis) for s in shapes) \
                        or sum(s[axis] for s in shapes) != decl.shape[axis]:
                    raise _bad(path, f"output part {i}'s buffers do not make up the output")
            self.output_parts.append(OutputPart(decl.name, tuple(holders), axis))
        if [p.name for p in self.output_parts] != [d.name for d in self.outputs]:
            raise _bad(path, "the output parts are not the signature's outputs")

    def _read_steps(self, raw: list) -> list:
        from tgc.engine.realize import Collective, Copy, Launch

        path, n = self.path, len(self.parts)
        steps: list[Any] = []
        for i, s in enumerate(raw):
            s = _list(s, f"step {i}", path, 6)
            kind = s[0] if s else None
            if kind == "launch" and len(s) == 2:
                k = _int(s[1], f"step {i} kernel", path, 0, len(self.kernels) - 1)
                steps.append(Launch(self.kernels[k], self.kernel_device[k]))
            elif kind == "copy" and len(s) == 5:
                src, dst = self._buf(s[1], s[2], f"step {i}"), self._buf(s[3], s[4], f"step {i}")
                if src.nbytes != dst.nbytes or dst.role == "input":
                    raise _bad(path, f"step {i} copies between buffers of different sizes, or into an input")
                steps.append(Copy(s[1], src, s[3], dst))
            elif kind == "allreduce" and len(s) == 4:
                if s[1] not in REDUCE_OPS:
                    raise _bad(path, f"step {i}'s reduce op is not one of {', '.join(REDUCE_OPS)}")
                bufs = self._device_bufs(s[2], f"step {i}")
                if len({(b.dtype, b.plan_shape) for b in bufs}) != 1:
                    raise _bad(path, f"step {i} all-reduces buffers of different types")
                from tgc.ir.uop import Ops  # (an enum of the IR: imports nothing of the compiler)

                op = "min" if s[1] == "MIN" else Ops[s[1]]
                steps.append(Collective("allreduce", op, tuple(bufs), tuple(bufs),
                                        _int(s[3], f"step {i} index", path, 0, MAX_STEPS)))
            elif kind == "gather" and len(s) == 6:
                srcs, bufs = self._device_bufs(s[3], f"step {i}"), self._device_bufs(s[4], f"step {i}")
                shape = bufs[0].plan_shape
                axis = _int(s[1], f"step {i} axis", path, 0, max(len(shape) - 1, 0))
                bounds = [tuple(_int(x, f"step {i} bounds", path, 0, MAX_DIM) for x in _list(b, "bounds", path, 2))
                          for b in _list(s[2], f"step {i} bounds", path, MAX_DEVICES)]
                ok = len(bounds) == n and all(len(b) == 2 for b in bounds) and len(shape) > axis and \
                    bounds[0][0] == 0 and bounds[-1][1] == shape[axis] and \
                    all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])) and all(lo <= hi for lo, hi in bounds)
                ok = ok and all(b.plan_shape == shape and b.dtype == bufs[0].dtype and b.role != "input"
                                for b in bufs)
                ok = ok and all(sb.dtype == bufs[0].dtype and sb.plan_shape == tuple(
                    hi - lo if a == axis else x for a, x in enumerate(shape)) for sb, (lo, hi) in zip(srcs, bounds))
                if not ok:
                    raise _bad(path, f"step {i} gathers shards that do not make up its buffers")
                steps.append(Collective("gather", (axis, tuple(bounds)), tuple(srcs), tuple(bufs),
                                        _int(s[5], f"step {i} index", path, 0, MAX_STEPS)))
            else:
                raise _bad(path, f"step {i} is not a launch, copy, allreduce or gather")
        return steps

    def _device_bufs(self, raw: Any, where: str) -> list[PlanBuffer]:
        raw = _list(raw, where, self.path, MAX_DEVICES)
        if len(raw) != len(self.parts):
            raise _bad(self.path, f"{where} does not name one buffer per device")
        return [self._buf(d, b, where) for d, b in enumerate(raw)]

    def _read_memory(self, d: int, mem: dict) -> Any:
        """Device d's memory plan, checked against the lifetimes its steps give its buffers (as
        `tgc.engine.realize.plan_device` computes them)."""
        from tgc.engine.memplan import MemoryPlan, check_plan, lifetimes
        from tgc.engine.realize import Collective, Copy, Launch

        path, bufs = self.path, self.parts[d].buffers
        where = f"part {d} memory"
        uses: list[list] = []
        for s in self.steps:
            if isinstance(s, Launch):
                if s.device == d:
                    uses.append(list(s.kernel.bufs))
            elif isinstance(s, Copy):
                uses.append([k for dev, k in ((s.src_device, s.src), (s.dst_device, s.dst)) if dev == d])
            elif isinstance(s, Collective):
                uses.append([s.srcs[d], s.bufs[d]])
        inputs = list(dict.fromkeys(p.key for p in self.input_parts if p.device == d))
        outputs = list(dict.fromkeys(k for p in self.output_parts for dev, k in p.holders if dev == d))
        spans = lifetimes(uses, inputs, outputs)
        slots = [_int(s, f"{where} slot", path, 1, 1 << 48) for s in _list(mem.get("slots"), where, path, MAX_BUFFERS)]
        slot_of = _list(mem.get("slot_of"), f"{where} slot_of", path, MAX_BUFFERS)
        if len(slot_of) != len(bufs):
            raise _bad(path, f"the {where} plan does not cover every buffer")
        plan = MemoryPlan(slots=slots, lifetimes=spans)
        for buf, slot in zip(bufs, slot_of):
            if buf in spans:
                plan.slot_of[buf] = _int(slot, f"{where} slot", path, 0, len(slots) - 1)
                plan.sizes[buf] = buf.nbytes
            elif slot != -1:
                raise _bad(path, f"the {where} plan places a buffer no step uses")
        for pair in _list(mem.get("inplace", []), f"{where} inplace", path, MAX_BUFFERS):
            if len(_list(pair, f"{where} inplace pair", path, 2)) != 2:
                raise _bad(path, f"a {where} inplace pair is not [output buffer, input buffer]")
            out, src = (bufs[_int(i, f"{where} inplace buffer", path, 0, len(bufs) - 1)] for i in pair)
            if out not in plan.slot_of or src not in plan.slot_of or "input" in (out.role, src.role):
                raise _bad(path, f"the {where} plan's in-place pair is not two temporary buffers its steps use")
            plan.inplace.append((out, src))
        fixed = {plan.slot_of[b] for b in inputs}
        if len(fixed) != len(inputs) or any(s in fixed for b, s in plan.slot_of.items() if b not in inputs):
            raise _bad(path, f"the {where} plan shares an input's memory")
        why = check_plan(plan)
        if why is not None:
            raise _bad(path, f"its {where} plan is unsafe: {why}")
        if set(plan.slot_of.values()) != set(range(len(slots))):
            raise _bad(path, f"the {where} plan has slots no buffer uses")
        if _int(mem.get("peak_bytes"), f"{where} peak", path, 0, 1 << 62) != plan.peak_bytes:
            raise _bad(path, f"the {where} plan's peak does not match its slots")
        return plan

    # --- what the command line reads, as from a Program
    @property
    def output_names(self) -> list[str]:
        return [d.name for d in self.outputs]

    @property
    def dim_names(self) -> list[str]:
        return list(self.dims)

    @property
    def peak_bytes(self) -> int:
        return sum(p.peak_bytes for p in self.memories)

    def resolve_dims(self, dims: dict[str, int] | None = None) -> dict[str, int]:
        """The package's dims; a dim given with another size is an error (the package holds one size)."""
        for k, v in (dims or {}).items():
            if k in self.dims and v != self.dims[k]:
                raise TgcError(f"dim {k} = {v}, but the package {self.path} was compiled for {k} = {self.dims[k]}",
                               hint=f"compile a package for it: tgc compile FILE -D {k}={v} ... --package OUT")
        return dict(self.dims)

    def conform(self, name: str, value: Any, cast: bool = False) -> np.ndarray:
        decl = next((d for d in self.inputs if d.name == name), None)
        if decl is None:
            raise TgcError(f"unknown input '{name}'", file=self.path)
        return as_array(value, decl, cast, {"file": self.path})

    def bind(self, inputs: dict[str, Any], dims: dict[str, int] | None = None, cast: bool = False
             ) -> tuple[dict[str, int], dict[str, np.ndarray]]:
        """Check inputs against the signature; return (dims, arrays in the declared dtypes)."""
        dims = self.resolve_dims(dims)
        check_input_names(inputs, [d.name for d in self.inputs], self.path)
        arrays = {}
        for decl in self.inputs:
            if decl.name not in inputs:
                raise BindError(f"missing input '{decl.name}' ({decl.dtype.name}{list(decl.shape)})", need="input",
                                name=decl.name, hint="pass an array for it", file=self.path)
            arr = self.conform(decl.name, inputs[decl.name], cast)
            if tuple(arr.shape) != decl.shape:
                raise TgcError(f"input '{decl.name}' has shape {list(arr.shape)}, but the package declares "
                               f"{list(decl.shape)}", file=self.path,
                               hint="the package holds the sizes it was compiled for; compile another for these sizes")
            arrays[decl.name] = arr
        return dims, arrays

    def output_types(self, dims: dict[str, int] | None = None) -> list[tuple[str, DType, tuple[int, ...]]]:
        return [(d.name, d.dtype, d.shape) for d in self.outputs]

    # --- running
    def open_devices(self, device: str | list[str] | None = None) -> list[Any]:
        """The device list to run on: the package's (or `device`, as many devices of the same kinds, in order),
        each present here with the binary target its kernels were built for; else one PackageError (exit 2)."""
        from tgc.backends import canonical, device_class, get_device

        if device is None:
            names = list(self.device_names)
        else:
            names = [x.strip() for x in (device.split(",") if isinstance(device, str) else device)]
        kinds = [d["kind"] for d in self.device_docs]
        if len(names) != len(kinds) or [canonical(x)[0] for x in names] != kinds:
            raise PackageError(f"{self.path} was compiled for the device list {self.device_name}, not "
                               f"{','.join(names)}", hint=f"run it with -d {self.device_name}, or compile a "
                                                          "package for that list")
        if len({canonical(x) for x in names}) != len(names):
            raise PackageError(f"a device appears twice in the device list '{','.join(names)}'")
        devs = []
        for name, doc in zip(names, self.device_docs):
            ok, why = device_class(doc["kind"]).probe()
            try:
                dev = get_device(name) if ok else None
            except TgcError as e:
                ok, why = False, e.msg
            if not ok or dev is None:
                raise PackageError(f"{self.path} runs on {','.join(names)}, but {name} is not available here: "
                                   f"{why or 'no such device'}",
                                   hint="run it on a machine with these devices, or compile a package for the "
                                        "devices this machine has (tgc devices lists them)")
            here = dev.binary_target()
            if here != doc["target"]:
                raise PackageError(f"{self.path} holds {doc['kind']} binaries for {doc['target']}, but {name} here "
                                   f"needs {here}", hint="compile the package again on (or for) this machine")
            devs.append(dev)
        out = []
        for dev in devs:
            same = [x for x in devs if x.kind == dev.kind]
            out.append(dev.shared(same.index(dev), len(same)))
        return out

    def lower(self, device: str | list[str] | None = None) -> Any:
        """The package's saved executable on its device list (`Executable.across`, with each device's memory
        plan as saved)."""
        from tgc.engine.realize import Executable

        devs = self.open_devices(device)
        for k, d in zip(self.kernels, self.kernel_device):
            if k.device is not devs[d]:
                k.device, k._program = devs[d], None
        exe = Executable.across(devs, self.steps, self.input_parts, self.output_parts)
        exe.memories = list(self.memories)
        exe.graph_options_of = [{"runner_object": self.graph_runner, "compile_runner": False}
                                if dev.kind == "CPU" else None for dev in devs]
        return exe

    def run(self, device: str | list[str] | None = None, dims: dict[str, int] | None = None, cast: bool = False,
            inputs: dict[str, Any] | None = None, **kw_inputs: Any) -> dict[str, np.ndarray]:
        """Run the saved steps; {output name: numpy array}. From its second run on at a device list the run is
        replayed: buffers kept, each device's launches as its graph (`tgc.engine.executable.StepsPlan`)."""
        from tgc.engine import executable

        key = tuple(self.device_names if device is None else
                    (device.split(",") if isinstance(device, str) else device))
        if key not in self._exes:  # (one executable per device list: its launch plans are kept by key)
            self._exes[key] = self.lower(device)
        exe = self._exes[key]
        _, arrays = self.bind({**(inputs or {}), **kw_inputs}, dims, cast=cast)
        for dev in exe.devices:
            dev.ensure_runnable()
        return executable.run(exe, arrays, replay=self._launch_plans, key=key)

    def release(self) -> None:
        self._launch_plans.release()

    def bench(self, device: str | list[str] | None = None, dims: dict[str, int] | None = None, repeat: int = 10,
              inputs: dict[str, np.ndarray] | None = None, warmup: int = 1, **_: Any) -> dict[str, Any]:
        """Time the steps per device, the collectives and the whole program, as `Program.bench` on a list."""
        from tgc.engine import executable
        from tgc.engine.inputs import random_values

        if inputs is None:
            inputs = {d.name: random_values(d.dtype, list(d.shape), 0, i) for i, d in enumerate(self.inputs)}
        dims, arrays = self.bind(inputs, dims, cast=True)
        exe = self.lower(device)
        timing = executable.bench(exe, arrays, repeat=repeat, warmup=warmup)
        return {"device": ",".join(d.name for d in exe.devices), "dims": dims, "repeat": repeat, "beam": None,
                **timing, "identity": self.identity(exe.devices, dims)}

    def identity(self, device: Any, dims: dict[str, int]) -> dict[str, Any]:
        prog = self.manifest.get("program") if isinstance(self.manifest.get("program"), dict) else {}
        return {"program_sha256": prog.get("source_sha256"), "file": self.path, "dims": dict(sorted(dims.items())),
                "device": self.device_name, "tgc_version": __version__, "package": self.content_hash}

    def describe(self) -> dict[str, Any]:
        """What `tgc inspect --json` prints."""
        from tgc.engine.realize import Collective

        prog = self.manifest.get("program") if isinstance(self.manifest.get("program"), dict) else {}
        return {
            "path": self.path, "format": "tgpkg", "format_version": MULTI_VERSION, "tgc_version": self.tgc_version,
            "content_hash": self.content_hash, "devices": [dict(d) for d in self.device_docs],
            "shard": dict(self.shard),
            "program": {"file": prog.get("file"), "source_sha256": prog.get("source_sha256")},
            "dims": dict(self.dims),
            "inputs": [{"name": d.name, "dtype": d.dtype.name, "shape": list(d.shape)} for d in self.inputs],
            "outputs": [{"name": d.name, "dtype": d.dtype.name, "shape": list(d.shape)} for d in self.outputs],
            "kernels": [{"name": k.name, "device": self.device_names[d], "global_size": list(k.global_size),
                         "buffers": [b.index for b in k.bufs], "binary_bytes": len(k.binary)}
                        for k, d in zip(self.kernels, self.kernel_device)],
            "steps": [s.kind if isinstance(s, Collective) else type(s).__name__.lower() for s in self.steps],
            "memory": [{"device": nm, "peak_bytes": p.peak_bytes, "slots": list(p.slots)}
                       for nm, p in zip(self.device_names, self.memories)],
        }
