"""The program cache: a whole program compiled for one device and one set of dims, kept in the disk cache
(`tgc.cache`, table `program`) in package form (`tgc.package`), so that a warm run neither parses, schedules,
optimizes, lowers nor compiles anything: it loads the entry and runs it through the package runner.

Contract:

- **Key** (`key`): the program's source, normalized (`normalize`: a byte-order mark, line endings, trailing
  spaces and trailing blank lines do not count; nothing that moves a line does), its dims, the device (kind,
  name, binary target, its thread count), the compiler's identity (name and version: `Compiler.cache_key`),
  tgc's version and the identity of its code on disk (`tgc.version.code_identity`: an edited or reinstalled tgc
  misses), every environment variable that changes the kernels or how they run (`KERNEL_ENV`), and the
  state of the `beam` table (`cache.table_state`): a new BEAM winner, or `tgc cache clear --table beam`,
  misses every entry stored before it. Any change to one of these is a miss, never a stale program.
- **Models** (a Program with weights bound at load, `tgc.load("m.onnx")`): the key adds the digest of the
  weights (`Program.weights_digest`: names, dtypes, shapes and bytes), never the weights themselves; the entry
  leaves them out too (its header names them: the Program binds them at every run).
- **Entry** (`Entry`): `MAGIC`, one line of JSON (the dims, the whole program's inputs and outputs, and, for a
  run in chunks along a batch axis, the chunking), then the package's bytes (one chunk's program for a chunked
  run). The cache's own checksum covers the whole value, the package its own; an entry that fails either, or
  that does not load, is a miss with one warning (`cache.invalidate`), and is rebuilt: never a wrong result.
- **Device lists** (`lookup_list`, `store_list`): the entry holds the list's package (`tgc.package.MultiPackage`, one
  multi-device executable); the key adds every device of the list (kind, name as listed, binary target, its
  share of the cores, compiler identity) and the shard spec ({input: axis}); models with bound weights are
  not cached on lists.
- **Symbolic sizes** (`lookup_symbolic`, `store_symbolic`): the entry is the symbolic package of one size class
  (`tgc.package.SymbolicPackage`, the saved `SymbolicPlan`), keyed as `key` with the size class (by dim name:
  "1", "n" or "32n"; a dim of 0 is not cached) in place of the dims, so a run at new dims of a cached class is
  warm: the package's plan is bound to them (`SizeClassPlan.bind`). It serves dims from the plan's
  `trusted_from` up; smaller dims miss (the cold path checks them with the source). CPU and PYTHON only (the
  devices symbolic packages are built for).
- **Not cached** (`usable` says why): REMOTE devices (a server's binaries are its
  own), devices that cannot compile here, `DEBUG` 3 and above (they print the lowering), `TGC_VERIFY_BOUNDS`
  (it checks the lowering), and `DISABLE_COMPILER_CACHE` (the `program` table obeys it as `compile` does).

This module imports neither the front end, the scheduler, the optimizer nor a compiler: `lookup` and
`Entry.run` are the warm path of `tgc run` and `Program.run`. `store` is given what the cold path built.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from tgc import cache, profile, sizeexpr
from tgc.dtype import DType, dtypes
from tgc.env import env_int
from tgc.errors import TgcError
from tgc.package import SYMBOLIC_KINDS, Package, PackageError, SymbolicPackage, build, build_symbolic, loads_package
from tgc.version import __version__, code_identity

TABLE = "program"
MAGIC = b"TGPC1\n"
# environment variables that change the kernels built, or the plan they run in
KERNEL_ENV = ("BEAM", "NOOPT", "TGC_THREADS", "TGC_CUDA_ARCH", "TGC_CHUNK", "TGC_GRAPH")


def normalize(source: str) -> str:
    """The source as the key sees it: without a byte-order mark, with `\\n` line ends, without trailing spaces
    on a line or blank lines at the end. Line numbers (in errors and `tgc bench`'s table) do not change."""
    text = source.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip("\n") + "\n"


def usable(device: Any) -> str | None:
    """None where the program cache serves this device and environment, else why not."""
    if not cache.enabled():
        return "DISABLE_COMPILER_CACHE is set"
    if env_int("DEBUG", 0) >= 3:
        return "DEBUG >= 3 shows the lowering"
    if os.environ.get("TGC_VERIFY_BOUNDS", "").strip() not in ("", "0"):
        return "TGC_VERIFY_BOUNDS checks the lowering"
    if device.kind == "REMOTE":
        return "a REMOTE server loads only binaries it compiled itself"
    if device.compiler is None:
        return f"no compiler for {device.kind} here"
    return None


def key(source: str, dims: dict[str, int], device: Any, weights: str = "") -> str:
    """The cache key of `source` compiled for `device` at `dims` (see the module's docstring); `weights`: the
    digest of a model's weights bound at load (`Program.weights_digest`), "" for a program without."""
    return cache.make_key("program/1", *_key_parts(source, sorted(dims.items()), device, weights))


def _key_parts(source: str, sizes: Any, device: Any, weights: str) -> list:
    comp = device.compiler
    parts = [normalize(source), sizes, device.kind, device.name, device.binary_target(),
             device.cores, comp.name, comp.cache_key, __version__, code_identity(),
             {name: os.environ.get(name, "").strip() for name in KERNEL_ENV}, list(cache.table_state("beam"))]
    if weights:
        parts.append({"weights": weights})
    return parts


@dataclass
class WholeInput:
    """An input or output of the whole program (a chunked entry's package holds one chunk's)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]


class Entry:
    """A program-cache entry: the package, the whole program's signature and, for a chunked run, how it is
    chunked. `run` and `bench` as `Program.run` and `Program.bench`; `inputs`, `output_names`, `dim_names`,
    `output_types` as a Program's, for the command line."""

    def __init__(self, header: dict, package: Package, source: str, path: str | None):
        self.header, self.package, self.source, self.path = header, package, source, path
        self.filename = path
        self.dims: dict[str, int] = {str(k): int(v) for k, v in header["dims"].items()}
        self.inputs = [_whole(d) for d in header["inputs"]]
        self.outputs = [_whole(d) for d in header["outputs"]]
        self.chunk: dict | None = header.get("chunk")
        self.weights: set[str] = set(header.get("weights", []))  # inputs the Program binds (a model's weights)
        if self.weights and isinstance(package, Package):  # (the same arrays every run: work on them once)
            package.bound_names |= self.weights

    @property
    def output_names(self) -> list[str]:
        return [d.name for d in self.outputs]

    @property
    def dim_names(self) -> list[str]:
        return list(self.dims)

    def output_types(self, dims: dict[str, int] | None = None) -> list[tuple[str, DType, tuple[int, ...]]]:
        return [(d.name, d.dtype, d.shape) for d in self.outputs]

    def fits(self, arrays: dict[str, np.ndarray]) -> bool:
        """Whether `arrays` are exactly the program's inputs, in their declared dtypes and shapes (else the
        caller takes the cold path, whose binder words the error)."""
        if set(arrays) != {d.name for d in self.inputs} | self.weights:
            return False
        for d in self.inputs:
            a = arrays[d.name]
            if not isinstance(a, np.ndarray) or a.shape != d.shape or a.dtype != d.dtype.np:
                return False
        return True

    def run(self, device: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs of one run on `arrays` (bound: the declared dtypes and shapes, `fits`)."""
        if self.chunk is None:
            return self.package.run(device=device, inputs=arrays)
        from tgc.engine import executable

        exe = self.executable(device)
        exe.device.ensure_runnable()
        return executable.run(exe, arrays)

    def bench(self, device: str, arrays: dict[str, np.ndarray], repeat: int, warmup: int = 1) -> dict[str, Any]:
        """`Program.bench`'s timing of the run as `run` runs it (chunked or whole)."""
        from tgc.engine import executable

        exe = self.executable(device)
        for dev in exe.devices:
            dev.ensure_runnable()
        return executable.bench(exe, arrays, repeat=repeat, warmup=warmup)

    @property
    def shard(self) -> dict[str, int] | None:
        """A device list's entry: its shard spec ({input: axis}); None for one device."""
        if "devices" not in self.header:
            return None
        return {str(k): int(v) for k, v in (self.header.get("shard") or {}).items()}

    def bench_result(self, device: str, arrays: dict[str, np.ndarray], repeat: int) -> dict[str, Any]:
        """What `Program.bench` returns (`tgc bench --json`), timed from this entry (on a device list: per
        device, the collectives and the program, with the shard spec)."""
        timing = self.bench(device, arrays, repeat)
        if self.shard is not None:
            return {"device": device, "dims": dict(self.dims), "repeat": repeat, "beam": None, "shard": self.shard,
                    **timing, "identity": self.identity(device)}
        # the recompute factor as the cold run that stored the entry computed it; None where that run had not
        # compiled the whole program at these dims (a run in chunks): `tgc bench` then says it is unknown
        return {"device": device, "dims": dict(self.dims), "repeat": repeat, "beam": None, **timing,
                "identity": self.identity(device), "kernels_for": "these sizes",
                "recompute": self.recompute}

    @property
    def recompute(self) -> dict[str, Any] | None:
        """The program's recompute factor ({written, executed, factor}) stored with the entry, or None."""
        rec = self.header.get("recompute")
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), (int, float)) for k in
                                                ("written", "executed", "factor")):
            return None
        return {"written": int(rec["written"]), "executed": int(rec["executed"]), "factor": float(rec["factor"])}

    def identity(self, device: str) -> dict[str, Any]:
        """`Program.identity`: the same for the warm and the cold path (`tgc bench --baseline` compares it); on
        a device list (`device` "CPU:0,CPU:1"), the first device's with the list and the shard spec."""
        from tgc.backends import one_device
        from tgc.engine import bench

        if self.shard is None:
            return bench.identity(self, one_device(device), self.dims)
        first = device.split(",")[0].strip()
        return {**bench.identity(self, one_device(first), self.dims), "device": device, "shard": self.shard}

    def executable(self, device: str) -> Any:
        """The entry's saved executable on `device` (`tgc.engine.executable.Executable`): the package's, run in
        the header's chunks where the entry is chunked."""
        exe = self.package.lower(device)
        if self.chunk is None:
            return exe
        return exe.chunked(int(self.chunk["count"]), set(self.chunk["sliced"]))

    def prepared(self, device: str) -> tuple[Any, Any, Any, dict[str, np.ndarray]]:
        """What `run` runs on `device`, lowered once: (the executable, the launch plans that replay it or None,
        their key, the arrays the package binds itself). A Program keeps it to run the entry again without
        lowering it (`Program._ready`)."""
        exe = self.executable(device)
        if self.chunk is not None:
            return exe, None, None, {}
        return exe, self.package._launch_plans, (exe.device.name,), self.package.weights

    def chunking(self, device: str) -> Any:
        """How the entry runs in chunks (`tgc.engine.chunk.Chunking`, its `low` the packaged chunk), or None."""
        if self.chunk is None:
            return None
        from tgc.engine.chunk import Chunking

        c = self.chunk
        return Chunking(c["dim"], int(self.dims[c["dim"]]), int(c["count"]), self.package.lower(device),
                        set(c["sliced"]), int(c["before"]), int(c["after"]), int(c["io"]))

    def release(self) -> None:
        self.package.release()


def _whole(d: dict) -> WholeInput:
    dt = dtypes.by_name[d["dtype"]]
    return WholeInput(str(d["name"]), dt, tuple(int(s) for s in d["shape"]))


def lookup(source: str, dims: dict[str, int], device: Any, path: str | None = None, weights: str = ""
           ) -> Entry | None:
    """The entry stored for `source` at `dims` on `device` (with weights of digest `weights`), or None (not
    stored, not usable here, or damaged: a damaged one is dropped with one warning)."""
    if usable(device) is not None:
        return None
    return _load_entry(key(source, dims, device, weights), source, dims, device.name, path, multi=False)


def _trace_hit(fields: dict[str, Any]) -> None:
    """A hit on a profile trace's compile track, where a profile is on (nothing is built for this run)."""
    prof = profile.active
    if prof is not None:
        prof.instant(profile.HOST, prof.host_thread("compile"), "program cache hit: nothing to compile",
                     {"cache": "hit", **fields})


def _split_entry(value: bytes, field: str, expected: Any) -> tuple[dict, bytes]:
    """An entry's (header, package bytes); ValueError unless it has the header and the header's `field` is
    `expected` (what its key was made from)."""
    if not value.startswith(MAGIC):
        raise ValueError("no entry header")
    head, _, data = value[len(MAGIC):].partition(b"\n")
    header = json.loads(head)
    if not isinstance(header, dict) or header.get(field) != expected:
        raise ValueError("its header does not match its key")
    return header, data


def _load_entry(k: str, source: str, dims: dict[str, int], where: str, path: str | None, multi: bool
                ) -> Entry | None:
    value = cache.get(TABLE, k)
    if value is None:
        return None
    try:
        header, data = _split_entry(value, "dims", {n: v for n, v in sorted(dims.items())})
        entry = Entry(header, loads_package(data, path or "<program cache>"), source, path)
        if entry.package.symbolic:
            raise ValueError("it holds a symbolic package")
        if isinstance(entry.package, Package) == multi:
            raise ValueError("it holds a package for another kind of device (one device or a list)")
    except (ValueError, KeyError, TypeError, PackageError) as e:
        cache.invalidate(TABLE, k, f"is not a usable program ({str(e)[:120]})")
        return None
    _trace_hit({"device": where, "dims": dict(dims)})
    return entry


# --- device lists: the entry holds the device list's package (`tgc.package.MultiPackage`), keyed by every device of the
# list (kind, name as listed, binary target, its share of the cores, compiler identity) and the shard spec


def list_devices(names: list[str]) -> list[Any] | None:
    """The device objects of a device list as a run uses them (several of a kind share it: `Device.shared`),
    or None where one cannot be opened here (the cold path then says why). Imports no compiler."""
    from tgc.backends import canonical, get_device

    try:
        devs = [get_device(n) for n in names]
        if len({canonical(n) for n in names}) != len(names):
            return None
    except TgcError:
        return None
    out = []
    for dev in devs:
        same = [d for d in devs if d.kind == dev.kind]
        out.append(dev.shared(same.index(dev), len(same)))
    return out


def list_key(source: str, dims: dict[str, int], devices: list[Any], names: list[str], shard: dict[str, int],
             weights: str = "") -> str:
    """The cache key of `source` compiled for the device list `devices` (listed as `names`) at `dims`, its inputs
    sharded as `shard` ({input name: axis, non-negative}): as `key`, with every device and the shard spec."""
    devs = [[d.kind, n.strip().upper(), d.binary_target(), d.cores, d.compiler.name, d.compiler.cache_key]
            for d, n in zip(devices, names)]
    parts = [normalize(source), sorted(dims.items()), devs, sorted(shard.items()), __version__, code_identity(),
             {name: os.environ.get(name, "").strip() for name in KERNEL_ENV}, list(cache.table_state("beam"))]
    if weights:
        parts.append({"weights": weights})
    return cache.make_key("program-list/1", *parts)


def usable_list(devices: list[Any]) -> str | None:
    """None where the program cache serves this device list, else why not (the first device it does not serve)."""
    return next((why for why in map(usable, devices) if why is not None), None)


def lookup_list(source: str, dims: dict[str, int], devices: list[Any], names: list[str], shard: dict[str, int],
                path: str | None = None) -> Entry | None:
    """The entry stored for `source` at `dims` on the device list, sharded as `shard`, or None (as `lookup`)."""
    if usable_list(devices) is not None:
        return None
    return _load_entry(list_key(source, dims, devices, names, shard), source, dims, ",".join(names), path,
                       multi=True)


def store_list(prog: Any, devices: list[Any], names: list[str], dims: dict[str, int], shard: dict[str, int],
               exe: Any) -> bool:
    """Package the device list's executable `exe` (`Program.lower_multi`) and store it; False where it cannot be
    (as `store`: never raises for that)."""
    if usable_list(devices) is not None or getattr(prog, "weights", None):
        return False
    from tgc.package import build_multi

    try:
        inputs = [{"name": d.name, "dtype": dt.name, "shape": list(shape)} for d, (dt, shape) in
                  zip(prog.inputs, _input_types(prog, dims))]
        outputs = [{"name": n, "dtype": dt.name, "shape": list(shape)} for n, dt, shape in prog.output_types(dims)]
        header = {"dims": dict(sorted(dims.items())), "inputs": inputs, "outputs": outputs, "devices": list(names),
                  "shard": dict(sorted(shard.items()))}
        data = build_multi(prog, exe, names, dims, shard)
        loads_package(data)  # what a warm run will load must load
    except (TgcError, ValueError, KeyError, TypeError):
        return False
    name = os.path.basename(getattr(prog, "path", None) or getattr(prog, "filename", "") or "<string>")
    meta = f"{name} {','.join(names)} " + " ".join(f"{n}={v}" for n, v in sorted(dims.items()))
    if shard:  # (entries of one list and dims that differ only in their shard spec must not read alike)
        meta += " shard " + ",".join(f"{n}={a}" for n, a in sorted(shard.items()))
    value = MAGIC + json.dumps(header, sort_keys=True, separators=(",", ":")).encode() + b"\n" + data
    cache.put(TABLE, list_key(prog.source, dims, devices, names, shard), value, meta=meta.strip())
    return True


def store(prog: Any, device: Any, dims: dict[str, int], chunking: Any = None, low: Any = None,
          recompute: dict[str, Any] | None = None) -> bool:
    """Package what `prog` built for `device` at `dims` (the whole program, or with `chunking` one chunk's
    program and how it is chunked) and store it; False where it cannot be (a kernel without a binary, a program
    this format cannot hold). Never raises for that: the cache is an optimization. `low`: the whole program as
    `prog.lower(device, dims)` gives it, already lowered (the run's: its memory plan is not planned again).
    `recompute`: the program's recompute factor at `dims` (`Program.recompute`), kept for a warm `tgc bench`."""
    if usable(device) is not None:
        return False
    try:
        inputs = [{"name": d.name, "dtype": dt.name, "shape": list(shape)} for d, (dt, shape) in
                  zip(prog.inputs, _input_types(prog, dims))]
        outputs = [{"name": n, "dtype": dt.name, "shape": list(shape)} for n, dt, shape in prog.output_types(dims)]
        header: dict[str, Any] = {"dims": dict(sorted(dims.items())), "inputs": inputs, "outputs": outputs}
        if recompute is not None:
            header["recompute"] = {k: recompute[k] for k in ("written", "executed", "factor")}
        bound = getattr(prog, "weights", None)
        if bound:  # a model's weights: the Program binds them at every run, the entry does not repeat them
            header["weights"] = sorted(bound)
        if chunking is None:
            data = build(prog, device.name, prog.resolve_dims(dims) if low is not None else dims, low=low,
                         weights=False)
        else:
            c = chunking
            chunk_dims = {**dims, c.dim: c.size // c.count}
            data = build(prog, device.name, chunk_dims, low=c.low, weights=False)
            header["chunk"] = {"dim": c.dim, "count": c.count, "sliced": sorted(c.sliced), "before": c.before,
                               "after": c.after, "io": c.io}
        loads_package(data)  # what a warm run will load must load
    except (TgcError, ValueError, KeyError, TypeError):
        return False
    name = os.path.basename(getattr(prog, "path", None) or getattr(prog, "filename", "") or "<string>")
    meta = f"{name} {device.name} " + " ".join(f"{n}={v}" for n, v in sorted(dims.items()))
    value = MAGIC + json.dumps(header, sort_keys=True, separators=(",", ":")).encode() + b"\n" + data
    cache.put(TABLE, key(prog.source, dims, device, getattr(prog, "weights_digest", "")), value, meta=meta.strip())
    return True


def _input_types(prog: Any, dims: dict[str, int]) -> list[tuple[DType, tuple[int, ...]]]:
    from tgc.dsl.frontend import concrete_shape  # (the cold path: the program is parsed already)

    return [(d.dtype, tuple(int(s) for s in concrete_shape(d, dims))) for d in prog.inputs]


# --- symbolic sizes: the entry holds the symbolic package of one size class (`tgc.package.SymbolicPackage`: the
# saved `SymbolicPlan`), keyed by the class, not the dims, so that a run at any dims of a cached class is warm


# (the devices symbolic packages are built for: `tgc.package.SYMBOLIC_KINDS`)


def symbolic_class(dims: dict[str, int]) -> dict[str, str] | None:
    """The size class a symbolic entry is keyed by ({dim: "1" | "n" | "32n"}, by name), or None where a dim is 0
    (no symbolic entry: a 0 dim is compiled as a constant and packages hold no such class)."""
    cls = dict(sizeexpr.size_class(sorted(dims), dims))
    return None if "0" in cls.values() else cls


def symbolic_key(source: str, cls: dict[str, str], device: Any, weights: str = "") -> str:
    """The cache key of `source`'s symbolic kernels for the size class `cls` on `device`: as `key`, with the
    class in place of the dims."""
    return cache.make_key("program-symbolic/1", *_key_parts(source, sorted(cls.items()), device, weights))


class SymbolicEntry(Entry):
    """A symbolic entry bound to the dims of one run: its package's class plan, `bind`-ed at them (`run`, `bench`,
    `executable`); `inputs`/`outputs` are the signature at those dims, as a fixed-size entry's."""

    def __init__(self, header: dict, package: SymbolicPackage, source: str, path: str | None,
                 dims: dict[str, int]):
        c = package.size_class(dims)  # (PackageError: dims below the class's least trusted size, or past its max,
        # or outside a narrowed class: X no multiple of Y)
        sig, at = c.doc["signature"], package.class_dims(c, dims)

        def whole(d: dict) -> dict:
            return {"name": d["name"], "dtype": d["dtype"],
                    "shape": [sizeexpr.evaluate(e, at) for e in d["shape"]]}

        super().__init__({**header, "dims": dict(sorted(dims.items())), "inputs": [whole(d) for d in sig["inputs"]],
                          "outputs": [whole(d) for d in sig["outputs"]]}, package, source, path)  # type: ignore
        self.bound_plan = package.lower(package.device_name, dims)  # (bound once here: a check failing is a miss)

    def run(self, device: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.package.run(device=device, dims=self.dims, inputs=arrays)

    def executable(self, device: str) -> Any:
        return self.package.lower(device, self.dims)

    def bench_result(self, device: str, arrays: dict[str, np.ndarray], repeat: int) -> dict[str, Any]:
        result = {**super().bench_result(device, arrays, repeat), "kernels_for": "size class"}
        result.pop("recompute")  # (no factor for symbolic kernels, as a cold `tgc bench --symbolic`)
        return result


def lookup_symbolic(source: str, dims: dict[str, int], device: Any, path: str | None = None, weights: str = ""
                    ) -> SymbolicEntry | None:
    """The symbolic entry of `source` for the size class of `dims` on `device`, bound to `dims`, or None: not
    stored, not usable here, damaged (dropped with one warning), or `dims` outside the sizes the entry serves
    without the source (below its plan's `trusted_from`: the cold path checks those with the source)."""
    found = load_symbolic(source, dims, device, path, weights)
    return None if found is None else bind_symbolic(found, source, dims, path)


def load_symbolic(source: str, dims: dict[str, int], device: Any, path: str | None = None, weights: str = ""
                  ) -> tuple[dict, SymbolicPackage] | None:
    """(header, symbolic package) of the entry for the size class of `dims`, loaded and validated once (a
    Program keeps it for the class: `bind_symbolic` binds it at each dims), or None as `lookup_symbolic`."""
    cls = symbolic_class(dims)
    if cls is None or usable(device) is not None or device.kind not in SYMBOLIC_KINDS:
        return None
    k = symbolic_key(source, cls, device, weights)
    value = cache.get(TABLE, k)
    if value is None:
        return None
    try:
        header, data = _split_entry(value, "class", cls)
        pkg = loads_package(data, path or "<program cache>")
        if not isinstance(pkg, SymbolicPackage) or sorted(pkg.dims_names) != sorted(dims):
            raise ValueError("it holds no symbolic package of these dims")
    except (ValueError, KeyError, TypeError, PackageError) as e:
        cache.invalidate(TABLE, k, f"is not a usable program ({str(e)[:120]})")
        return None
    _trace_hit({"device": device.name, "class": cls})
    return header, pkg


def bind_symbolic(found: tuple[dict, SymbolicPackage], source: str, dims: dict[str, int], path: str | None
                  ) -> SymbolicEntry | None:
    """The loaded entry (`load_symbolic`) at `dims`, or None where its class does not serve them (sizes below its
    trusted size, or where a general kernel's check fails: the cold path, which says what runs instead)."""
    try:
        return SymbolicEntry(found[0], found[1], source, path, dims)
    except PackageError:
        return None


def store_symbolic(prog: Any, device: Any, dims: dict[str, int], plan: Any, more: Any = (),
                   held: tuple[dict, SymbolicPackage] | None = None, most: int = 8) -> bool:
    """Save `plan` (the `SymbolicPlan` of the size class of `dims`, as `Program.run(symbolic=True)` built it) as
    the class's symbolic entry, with the plans `more` (narrowed plans of other hidden classes that served dims of
    that class: one package holding each, its lookup picking the one whose hidden classes the dims have) and the
    classes of `held` (the entry as loaded just before: `load_symbolic`) that none of them is, copied as they
    are, `most` classes in all (a package holds at most `MAX_CLASSES`); False where it cannot be (as `store`:
    never raises for that)."""
    cls = symbolic_class(dims)
    if cls is None or usable(device) is not None or getattr(prog, "weights", None) or \
            device.kind not in SYMBOLIC_KINDS:
        return False
    plans = [plan, *more][:most]
    new = [dict(p.size_class) for p in plans]
    kept = [] if held is None else [(c, held[1]._members) for c in held[1].classes if (c.hidden or c.cls) not in new]
    try:
        data = build_symbolic(prog, device, [(p.size_class, p) for p in plans], held=kept[:most - len(plans)])
        loads_package(data)  # what a warm run will load must load
    except (TgcError, ValueError, KeyError, TypeError):
        return False
    header = {"class": cls, "inputs": [d.name for d in prog.inputs], "outputs": list(prog.output_names)}
    name = os.path.basename(getattr(prog, "path", None) or getattr(prog, "filename", "") or "<string>")
    meta = f"{name} {device.name} symbolic " + " ".join(f"{n}={c}" for n, c in sorted(cls.items())) + \
        "".join(f", {x} a multiple of {y}" for x, y in sizeexpr.written(plan.multiples))  # (a narrowed class)
    value = MAGIC + json.dumps(header, sort_keys=True, separators=(",", ":")).encode() + b"\n" + data
    cache.put(TABLE, symbolic_key(prog.source, cls, device, getattr(prog, "weights_digest", "")), value,
              meta=meta.strip())
    return True
