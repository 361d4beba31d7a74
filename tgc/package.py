"""Compiled packages (`.tgpkg`): a program compiled once for one device, run later without its source and
without a compiler.

A package is a zip archive of data only (never pickle, nothing runs on load):

- `manifest.json`: the format and its version, the tgc version, the device (kind, binary target, compiler),
  the dims it was compiled for, the signature (inputs and outputs: names, dtypes, shapes), the buffers (dtype,
  shape, bytes), the launch plan (kernels in order: buffers, launch sizes, values), the memory plan (which
  buffers share an allocation, the peak), and the size and SHA-256 of every other member. Every size is an
  expression of the dims (`tgc.sizeexpr`: plain integers when every dim was given).
- `kernels/<i>.bin` and `kernels/<i>.src`: each kernel's binary and its source.
- `runtime/cpu_graph.bin` (CPU packages): the object of the CPU graph runner (`tgc.backends.cpu_graph`, one
  small generic function that calls every kernel of a launch plan in order), described by the manifest's
  `graph_runner` (the table layout it was built for). A package run repeatedly runs its launch plan as one
  device graph from its second run on: on the CPU with the compile cache's runner, else the shipped one
  (loaded by `tgc.backends.elf`), else (a runner for another table layout) kernel by kernel; never compiling.

The manifest's `content_hash` is the SHA-256 of the manifest itself without that field (canonical JSON), which
names every member's hash: the package's identity. The archive's comment, its last 64 bytes, is the SHA-256 of
every byte before it: one flipped byte anywhere in the file is found, even in a zip field readers ignore.

Reading validates before it uses anything: the archive's size and member count, member names (no paths
outside the archive, no unexpected or duplicate members), uncompressed sizes and compression ratios (zip
bombs), every field's type and range, the memory plan (buffers fit their slots, slots are never shared by
buffers alive at once). The kernels' binaries are native code for the device: running a package runs them,
as running any program does, so run packages you trust.

A program compiled for a device list (`-d CPU:0,CPU:1 --shard ...`) is a format-3 package (`MultiPackage`,
"device-list packages" below): its one multi-device executable, per device its kernels, buffers and memory plan,
and the copies and collectives as steps. Formats 1 and 2 are unchanged.

This module imports neither the compiler nor llvmlite on the load path (`load_package`, `Package.run`).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import io
import json
import os
import re
import stat
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tgc import sizeexpr
from tgc.dtype import DType, dtypes
from tgc.engine.conform import as_array, check_input_names
from tgc.errors import BindError, TgcError, dim_flags, unknown_dims
from tgc.files import stage
from tgc.interfaces import BufferSpec, LaunchableKernel
from tgc.ir.symsize import atom_parts
from tgc.version import __version__

FORMAT = "tgpkg"
FORMAT_VERSION = 1
MULTI_VERSION = 3  # a device list's package ("device-list packages", below); 2 is a symbolic package's
MANIFEST = "manifest.json"
SUFFIX = ".tgpkg"
ZIP_MAGIC = b"PK\x03\x04"
CHECKSUM_LEN = 64

MAX_FILE = 2 << 30  # the archive
MAX_MEMBERS = 4096
MAX_KERNELS = (MAX_MEMBERS - 1) // 2
MAX_MANIFEST = 16 << 20
MAX_MEMBER = 512 << 20
MAX_TOTAL = 1 << 30  # uncompressed, all members
MAX_RATIO = 200  # uncompressed / compressed, for members over RATIO_FREE bytes
RATIO_FREE = 1 << 20
MAX_BUFFER = 1 << 48  # bytes of one buffer
MAX_BUFFERS = 1 << 16
MAX_RANK = 16
MAX_LAUNCH = (1 << 31) - 1
MAX_DIM = 1 << 48

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
_MEMBER = re.compile(r"kernels/(0|[1-9][0-9]{0,5})\.(bin|src)\Z|runtime/cpu_graph\.bin\Z|"
                     r"weights/(0|[1-9][0-9]{0,5})\.npy\Z")
RUNNER_MEMBER = "runtime/cpu_graph.bin"
_IO_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/\-]{0,255}\Z")  # (ONNX names: never used as paths)
_HEX = re.compile(r"[0-9a-f]{64}\Z")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed: the same program and device give the same bytes


class PackageError(TgcError):
    """A package that cannot be used here: damaged, tampered with, for another device or format (exit 2)."""

    def __init__(self, msg: str, **kw: Any):
        kw.setdefault("kind", "user")
        super().__init__(msg, **kw)


def is_package(path: str | os.PathLike) -> bool:
    """A path names a package: its suffix is .tgpkg, or it starts as a zip archive does."""
    path = os.fspath(path)
    if path.endswith(SUFFIX):
        return True
    if not os.path.isfile(path):  # (a pipe's open() waits for a writer; /dev/zero is no package either)
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == ZIP_MAGIC
    except OSError:
        return False


def canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def content_hash(manifest: dict) -> str:
    return hashlib.sha256(canonical({k: v for k, v in manifest.items()
                                     if k not in ("content_hash", SIGNATURE)})).hexdigest()


SIGNATURE = "hmac"  # the manifest field of a signed package
KEY_ENV = "TGC_PACKAGE_KEY"


def package_key() -> bytes | None:
    """The key in the file named by `TGC_PACKAGE_KEY` (None when unset): packages are signed with it when written
    and must carry its signature when read. TgcError (exit 2) for a file that cannot be read or is empty."""
    path = os.environ.get(KEY_ENV)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            key = f.read(1 << 16).removeprefix(b"\xef\xbb\xbf").strip()
    except OSError as e:
        raise TgcError(f"cannot read the package key file '{path}' ({KEY_ENV}): {e.strerror or e}") from None
    if not key:
        raise TgcError(f"the package key file '{path}' ({KEY_ENV}) is empty")
    return key


def signature(key: bytes, content: str) -> str:
    """A package's signature: HMAC-SHA256 of its content hash (which names every member's hash) with `key`."""
    return hmac.new(key, content.encode(), hashlib.sha256).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# writing


def _no_bound_weights(prog: Any) -> None:
    """A symbolic package of a program with weights bound at load (an ONNX model with symbolic dims) is not
    supported: its size classes have no place for them."""
    from tgc.errors import TgcError

    if getattr(prog, "weights", None):
        raise TgcError("a symbolic package of an ONNX model (weights bound at load) is not supported",
                       hint="give every dim (-D NAME=INT): a package of a model at fixed sizes holds its weights")


# --- weights bound at load (an ONNX model's initializers): members `weights/<i>.npy`, the manifest's "weights"
# names the signature input each one fills; a package's callers never pass them (as a Program's).

def _declared_inputs(prog: Any) -> list:
    """Every declared input of a Program, weights bound at load included (by the engine's names)."""
    return prog._all_decls() if getattr(prog, "weights", None) else list(prog.inputs)


def _weight_members(prog: Any, blobs: dict[str, bytes], files: dict[str, dict]) -> list[dict]:
    """The program's bound weights as `.npy` members (numpy's format: data only, never pickled)."""
    out = []
    for i, (name, arr) in enumerate(sorted(prog.weights.items())):
        f = io.BytesIO()
        np.save(f, np.require(arr, requirements="C"), allow_pickle=False)  # (0-d stays 0-d)
        member = f"weights/{i}.npy"
        blobs[member] = f.getvalue()
        files[member] = {"size": len(blobs[member]), "sha256": hashlib.sha256(blobs[member]).hexdigest()}
        out.append({"name": name, "member": member})
    return out


def _read_weights(pkg: Any, raw: Any) -> dict[str, np.ndarray]:
    """The weights a package holds (name -> array), each checked against its signature input's buffer."""
    if raw is None:
        if any(m.startswith("weights/") for m in pkg._members):
            raise _bad(pkg.path, "it holds weights its manifest does not describe")
        return {}
    by_name = {d.name: d for d in pkg.inputs}
    out: dict[str, np.ndarray] = {}
    for i, w in enumerate(_list(raw, "weights", pkg.path, MAX_BUFFERS)):
        w = _obj(w, f"weight {i}", pkg.path)
        name = _name(w.get("name"), f"weight {i} name", pkg.path)
        member = w.get("member")
        if name not in by_name or name in out:
            raise _bad(pkg.path, f"weight {name} is not an input of its signature, or is given twice")
        if not isinstance(member, str) or not member.startswith("weights/") or member not in pkg._members:
            raise _bad(pkg.path, f"weight {name} names no member of the package")
        try:
            arr = np.load(io.BytesIO(pkg._members[member]), allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise _bad(pkg.path, f"weight {name} ({member}) is not a numpy array: {str(e)[:80]}") from None
        buf = pkg.buffers[by_name[name].buffer]
        if arr.dtype != buf.dtype.np or tuple(arr.shape) != tuple(buf.plan_shape):
            raise _bad(pkg.path, f"weight {name} is {arr.dtype}{list(arr.shape)}, but its buffer is "
                                 f"{buf.dtype.name}{list(buf.plan_shape)}")
        out[name] = arr
    return out


def build(prog: Any, device: str | None = None, dims: dict[str, int] | None = None, low: Any = None,
          weights: bool = True) -> bytes:
    """The package of a `tgc.api.Program` compiled for `device` with every dim in `dims`, as bytes. `low`: a
    lowered program to package instead of `prog.lower(device, dims)` (the program cache packages one chunk of a
    chunked run; `dims` are then that chunk's). A model's weights bound at load are members of the package
    (`weights=False`: they stay inputs of its signature, as the program cache, which has the model, keeps them)."""
    from tgc.backends import one_device
    from tgc.errors import CompileError

    dev = one_device(device)
    if low is None:
        dims = prog.resolve_dims(dims)
        low = prog.lower(dev.name, dims)
    missing = next((k for k in low.kernels if k.binary is None), None)
    if missing is not None:
        raise CompileError(f"cannot package for {dev.name}: kernel {missing.name} could not be compiled here: "
                           f"{missing.compile_error or 'no compiler on this machine'}",
                           hint="package on a machine that can compile for this device")
    plan = low.memory_plan()
    index: dict[Any, int] = {}
    buffers: list[dict] = []
    roles: dict[Any, tuple[str, str | None]] = {}
    for node, name in low.inputs:
        roles[node] = ("input", name)
    for name, node in low.outputs:
        roles.setdefault(node, ("output", name))

    def buf(node: Any) -> int:
        if node not in index:
            from tgc.engine.realize import buffer_type
            dtype, shape = buffer_type(node)
            role, name = roles.get(node, ("temp", None))
            index[node] = len(buffers)
            buffers.append({"dtype": dtype.name, "shape": [int(s) for s in shape],
                            "nbytes": max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1),
                            "role": role, "name": name})
        return index[node]

    decls = {d.name: d for d in _declared_inputs(prog)}
    inputs = [{"name": name, "dtype": decls[name].dtype.name, "buffer": buf(node)} for node, name in low.inputs]
    for d in inputs:
        d["shape"] = _decl_shape(decls[d["name"]].shape, buffers[d["buffer"]]["shape"])
    files: dict[str, dict] = {}
    blobs: dict[str, bytes] = {}
    kernels = []
    for i, k in enumerate(low.kernels):
        bin_name, src_name = f"kernels/{i}.bin", f"kernels/{i}.src"
        for member, data in ((bin_name, bytes(k.binary)), (src_name, k.src.encode())):
            blobs[member] = data
            files[member] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        kernels.append({"name": k.name, "binary": bin_name, "source": src_name, "bufs": [buf(n) for n in k.bufs],
                        "global_size": [int(x) for x in k.global_size],
                        "local_size": [int(x) for x in k.local_size] if k.local_size else None,
                        "vals": [int(v) for v in k.vals], "flops": int(k.flops), "bytes": int(k.bytes_moved),
                        "line": k.line, "opts": [str(o) for o in k.opts]})
    outputs = [{"name": name, "dtype": buffers[buf(node)]["dtype"], "shape": buffers[buf(node)]["shape"],
                "buffer": buf(node)} for name, node in low.outputs]
    slots = [0] * len(buffers)
    for node, i in index.items():
        slots[i] = plan.slot_of.get(node, -1)
    bound = {"weights": _weight_members(prog, blobs, files)} if weights and getattr(prog, "weights", None) else {}
    return _archive(prog, dev, FORMAT_VERSION, {
        **bound,
        "dims": {k: int(v) for k, v in sorted(dims.items())},
        "signature": {"inputs": inputs, "outputs": outputs},
        "buffers": buffers,
        "kernels": kernels,
        "memory": {"slots": list(plan.slots), "slot_of": slots, "peak_bytes": plan.peak_bytes,
                   **({"inplace": [[index[o], index[i]] for o, i in plan.inplace]} if plan.inplace else {})},
    }, blobs, files)


def _graph_runner(dev: Any) -> tuple[dict, bytes] | None:
    """On the CPU: the graph runner's object (`tgc.backends.cpu_graph`: one small generic function that calls
    every kernel of a launch plan in order), shipped so that a package runs as one native call per run without
    the compile cache and without llvmlite; with the table layout it was built for. None elsewhere, or where it
    cannot be compiled (the package then launches kernel by kernel where the cache lacks the runner)."""
    if dev.kind != "CPU" or dev.compiler is None:
        return None
    from tgc.backends import cpu_graph
    try:
        obj = cpu_graph.runner_object(dev.compiler)
    except Exception:  # noqa: BLE001 - no runner: the package runs kernel by kernel
        return None
    return {"member": RUNNER_MEMBER, **cpu_graph.ABI}, obj


def file_checksum(data: bytes) -> bytes:
    """The archive's comment, its last bytes: the SHA-256 (hex) of every byte before it. Fields of the zip
    container that readers ignore (times, attributes, the container's own headers) are covered too."""
    return hashlib.sha256(data[:-CHECKSUM_LEN]).hexdigest().encode()


def _decl_shape(declared: Any, concrete: list[int]) -> list:
    """An input's declared shape as size expressions: its dim names kept, anything else (a declaration this
    format cannot spell) by its concrete size."""
    out = []
    for s, n in zip(declared, concrete):
        if isinstance(s, int) and not isinstance(s, bool):
            out.append(int(s))
        elif isinstance(s, str) and s.isidentifier():
            out.append(s)
        else:
            try:
                out.append(sizeexpr.validate(_dim_expr(s)))
            except TgcError:
                out.append(None if n is None else n if isinstance(n, list) else int(n))
    return out


def _dim_expr(d: Any) -> Any:
    """A declaration's dim (`tgc.dsl.frontend.DimExpr`, `3 * C`) as a size expression (`["*", 3, "C"]`)."""
    op = getattr(d, "op", None)
    if isinstance(op, str) and hasattr(d, "a") and hasattr(d, "b"):
        return [op, _dim_expr(d.a), _dim_expr(d.b)]
    return d


def write(prog: Any, path: str | os.PathLike, device: str | list[str] | None = None,
          dims: dict[str, int] | None = None, shard: dict[str, int] | None = None) -> Package | SymbolicPackage:
    """Build a package and write it to `path` (atomically: a failed write leaves no partial file); return it
    as loaded back from the bytes written. Without dims, a program with dims is packaged symbolically (its
    kernels for every size of its size classes, CPU and PYTHON: `build_symbolic`). A device list (`"CPU:0,CPU:1"`,
    with `shard` {input: axis}) is packaged as its one multi-device executable (`build_multi`, every dim
    needed)."""
    names = [x.strip() for x in device.split(",")] if isinstance(device, str) else list(device or [])
    if len(names) > 1:
        dims = prog.resolve_dims(dims)
        axes = prog.shard_axes(shard, dims, len(names))
        data = build_multi(prog, prog.lower_multi(names, dims, axes), names, dims, axes)
    elif shard:
        raise TgcError("sharding an input needs a device list, not one device",
                       hint="give a device list, e.g. CPU:0,CPU:1, or drop the shard")
    elif not dims and prog.dim_names:
        from tgc.backends import one_device
        dev = one_device(names[0] if names else None)
        if dev.kind not in SYMBOLIC_KINDS:
            raise TgcError(f"a package for {dev.kind} needs every dim: kernels with symbolic sizes are packaged for "
                           f"{', '.join(SYMBOLIC_KINDS)} only", hint="give its dims (-D NAME=INT)")
        data = build_symbolic(prog, dev)
    else:
        data = build(prog, names[0] if names else None, dims)
    path = os.fspath(path)
    try:  # loaded back before it is written: a package that fails its own checks is a bug here, not a file
        pkg = loads_package(data, path)
    except PackageError as e:
        raise TgcError(f"internal error: the package built for {path} fails the checks of loading it, so it was "
                       f"not written: {e.msg}", kind="runtime",
                       hint="please report it; meanwhile give every dim (-D) or run the .tg program") from None
    if _is_stream(path):  # a pipe or a device (/dev/stdout): written in place, as `tgc run -o` writes one
        try:
            with open(path, "wb") as f:
                f.write(data)
        except OSError as e:  # (/dev/full: the disk's failure, exit 1, not the user's)
            kind = "user" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else "runtime"
            raise TgcError(f"cannot write {path}: {e.strerror or e}", kind=kind) from None
        return pkg
    tmp = None
    try:  # (staged as every output file is, `tgc.files.stage`: any name the file system allows can be written)
        tmp = stage(path, lambda f: f.write(data))
        os.replace(tmp, path)
    except BaseException as e:  # (Ctrl-C between the two included: no temporary file is left)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(e, OSError):
            raise TgcError(f"cannot write {path}: {e.strerror or e}") from None
        raise
    return pkg


# ---------------------------------------------------------------------------------------------------------------
# reading and validating


def _is_stream(path: str) -> bool:
    """An existing file that is neither a regular file nor a directory (a FIFO, a character device): renaming a
    staged file over it would replace the pipe or the device node itself."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _bad(path: str, why: str) -> PackageError:
    return PackageError(f"{path}: not a usable package: {why}",
                        hint="the file is damaged or was changed after `tgc compile --package` wrote it; "
                             "compile it again")


def load_package(path: str | os.PathLike) -> Package:
    """Read, validate and return a package (`tgc.load_package`)."""
    path = os.fspath(path)
    try:
        size = os.stat(path).st_size
        if size > MAX_FILE:
            raise _bad(path, f"it is {size} bytes, more than the {MAX_FILE} a package may take")
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise PackageError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise PackageError(f"{path} is a directory, not a package") from None
    except OSError as e:
        raise PackageError(f"cannot read {path}: {e.strerror or e}") from None
    return loads_package(data, path)


def loads_package(data: bytes, path: str = "<bytes>") -> Package | SymbolicPackage:
    manifest, members = read_members(data, path)
    if manifest.get("format_version") in (SYMBOLIC_VERSION, SPLIT_SYMBOLIC_VERSION, OLD_SYMBOLIC_VERSION):
        return SymbolicPackage(manifest, members, path)
    if manifest.get("format_version") == MULTI_VERSION:  # a device list's (below)
        return MultiPackage(manifest, members, path)  # type: ignore[return-value]
    return Package(manifest, members, path)


def read_members(data: bytes, path: str) -> tuple[dict, dict[str, bytes]]:
    """The validated manifest and every member's bytes (hashes checked)."""
    if len(data) > MAX_FILE:
        raise _bad(path, "it is too large")
    if not data.startswith(ZIP_MAGIC):
        raise _bad(path, "it is not a zip archive" if data else "it is empty")
    if len(data) >= 22 and data[-22:-18] == b"PK\x05\x06" and data[-2:] == b"\0\0":
        # a whole zip archive with no comment (an .npz, a .zip): not damaged, just no package (whose comment is
        # its checksum)
        raise PackageError(f"{path}: not a tgc package: a zip archive without a package's checksum (an .npz?)",
                           hint="tgc compile FILE -D ... --package OUT.tgpkg writes packages; inputs in an .npz go "
                                "to tgc run --inputs PATH.npz")
    if len(data) < CHECKSUM_LEN + 22 or data[-CHECKSUM_LEN:] != file_checksum(data):
        raise _bad(path, "its checksum does not match its bytes (damaged, truncated or changed)")
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as e:
        raise _bad(path, f"the archive is damaged or truncated ({e})") from None
    with z:
        infos = z.infolist()
        if len(infos) > MAX_MEMBERS:
            raise _bad(path, f"it has {len(infos)} members, more than {MAX_MEMBERS}")
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            raise _bad(path, "a member appears twice")
        total = 0
        for info in infos:
            name = info.filename
            if name != MANIFEST and not _MEMBER.match(name):
                raise _bad(path, f"unexpected member {name[:80]!r}")
            if info.flag_bits & 0x1:
                raise _bad(path, f"member {name} is encrypted")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise _bad(path, f"member {name} uses an unsupported compression")
            limit = MAX_MANIFEST if name == MANIFEST else MAX_MEMBER
            if info.file_size > limit:
                raise _bad(path, f"member {name} is {info.file_size} bytes, more than {limit}")
            if info.file_size > RATIO_FREE and info.file_size > MAX_RATIO * max(info.compress_size, 1):
                raise _bad(path, f"member {name} expands more than {MAX_RATIO} times (a zip bomb?)")
            total += info.file_size
            if total > MAX_TOTAL:
                raise _bad(path, f"its members expand to more than {MAX_TOTAL} bytes")
        if MANIFEST not in names:
            raise _bad(path, f"it has no {MANIFEST}")
        members: dict[str, bytes] = {}
        for info in infos:
            try:
                with z.open(info) as f:
                    blob = f.read(info.file_size + 1)
            except (zipfile.BadZipFile, ValueError, OSError, EOFError, RuntimeError) as e:
                raise _bad(path, f"member {info.filename} is damaged ({e})") from None
            except Exception as e:  # zlib.error and friends: any failure to inflate is damage
                raise _bad(path, f"member {info.filename} is damaged ({type(e).__name__})") from None
            if len(blob) != info.file_size:
                raise _bad(path, f"member {info.filename} is not the size the archive states")
            members[info.filename] = blob
    manifest = _parse_manifest(members.pop(MANIFEST), path)
    _check_format(manifest, path)
    if manifest.get("content_hash") != content_hash(manifest):
        raise _bad(path, "its content hash does not match its manifest")
    key = package_key()
    if key is not None:
        got = manifest.get(SIGNATURE)
        if not isinstance(got, str) or not hmac.compare_digest(got, signature(key, manifest["content_hash"])):
            why = "carries no signature" if got is None else "is not signed with that key"
            raise PackageError(f"{path} {why}, and {KEY_ENV} ({os.environ.get(KEY_ENV)}) requires its signature",
                               hint=f"compile the package again with {KEY_ENV} set to the same key file")
    files = _obj(manifest.get("files"), "files", path)
    if set(files) != set(members):
        extra = sorted(set(members) - set(files)) or sorted(set(files) - set(members))
        raise _bad(path, f"member {extra[0]} is {'not listed' if extra[0] in members else 'missing'}")
    for name, meta in files.items():
        meta = _obj(meta, f"files.{name}", path)
        if meta.get("size") != len(members[name]) or meta.get("sha256") != hashlib.sha256(members[name]).hexdigest():
            raise _bad(path, f"member {name} does not match its hash")
    return manifest, members


def _parse_manifest(blob: bytes, path: str) -> dict:
    def no_dupes(pairs: list[tuple[str, Any]]) -> dict:
        out = dict(pairs)
        if len(out) != len(pairs):
            raise ValueError("a key appears twice")
        return out

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        doc = json.loads(blob.decode("utf-8"), object_pairs_hook=no_dupes, parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _bad(path, f"its manifest is not valid JSON ({str(e)[:120]})") from None
    if not isinstance(doc, dict):
        raise _bad(path, "its manifest is not a JSON object")
    return doc


def _check_format(manifest: dict, path: str) -> None:
    if manifest.get("format") != FORMAT:
        raise _bad(path, "its manifest is not a tgc package's")
    version = manifest.get("format_version")
    if version not in (FORMAT_VERSION, OLD_SYMBOLIC_VERSION, MULTI_VERSION, SPLIT_SYMBOLIC_VERSION, SYMBOLIC_VERSION):
        made = manifest.get("tgc_version")
        raise PackageError(
            f"{path}: package format version {version!r} (written by tgc {str(made)[:40]}), but this tgc "
            f"({__version__}) reads versions {FORMAT_VERSION}, {OLD_SYMBOLIC_VERSION}, {MULTI_VERSION}, "
            f"{SPLIT_SYMBOLIC_VERSION} and {SYMBOLIC_VERSION}",
            hint="compile the package again with this tgc")


def _obj(v: Any, where: str, path: str) -> dict:
    if not isinstance(v, dict):
        raise _bad(path, f"{where} is not an object")
    return v


def _list(v: Any, where: str, path: str, most: int) -> list:
    if not isinstance(v, list) or len(v) > most:
        raise _bad(path, f"{where} is not a list of at most {most} entries")
    return v


def _int(v: Any, where: str, path: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(path, f"{where} is not an integer in [{lo}, {hi}]")
    return v


def _name(v: Any, where: str, path: str) -> str:
    if not isinstance(v, str) or not _NAME.match(v):
        raise _bad(path, f"{where} is not a valid name")
    return v


def _io_name(v: Any, where: str, path: str) -> str:
    """An input's or output's name: an identifier, or an ONNX model's name for it (`input.1`, `out/prob`)."""
    if not isinstance(v, str) or not _IO_NAME.match(v):
        raise _bad(path, f"{where} is not a valid name")
    return v


def _dtype(v: Any, where: str, path: str) -> DType:
    dt = dtypes.by_name.get(v) if isinstance(v, str) else None
    if dt is None:
        raise _bad(path, f"{where}: {str(v)[:20]!r} is not a dtype")
    return dt


def _size(e: Any, dims: dict[str, int], where: str, path: str, lo: int, hi: int) -> int:
    try:
        v = sizeexpr.evaluate(e, dims, where)
    except TgcError as err:
        raise _bad(path, err.msg) from None
    return _int(v, where, path, lo, hi)


# ---------------------------------------------------------------------------------------------------------------
# the package


@dataclass
class PackageInput:
    """An input of the signature, as `tgc.cli.inputs` reads declarations: name, dtype, shape (ints and dim
    names), `expr` the stored expressions."""

    name: str
    dtype: DType
    shape: list
    expr: list
    buffer: int


@dataclass(eq=False)
class PlanBuffer(BufferSpec):
    """One buffer of a package's launch plan: the realizer's buffer key (a `BufferSpec`: `plan_shape` its
    concrete shape)."""

    index: int = 0
    nbytes: int = 0
    role: str = ""
    name: str | None = None


@dataclass
class PackagedKernel(LaunchableKernel):
    """A kernel of a package: a `LaunchableKernel` (tgc/interfaces.py) as a compiled `Kernel` is, from its
    source and binary (no AST, no UOps)."""

    name: str
    src: str
    binary: bytes
    bufs: list
    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int] | None
    vals: tuple[int, ...]
    flops: int
    bytes_moved: int
    line: int | None
    opts: list
    device: Any = None
    index: int = 0
    graph_flops: int = 0  # (a package holds no tensor graph: no recompute factor)
    _program: Any = field(default=None, repr=False)
    contract_grid: tuple | None = None  # a symbolic package's kernel: the largest grid its launch contract states

    def program(self) -> Any:
        if self._program is None:
            try:
                binary = self.binary
                if self.device.kind == "REMOTE":
                    # a server loads only binaries it compiled itself (and forgets them when it restarts, or
                    # never saw them: another server of TGC_REMOTE): it compiles the packaged source (cached
                    # there by source), nothing compiles here
                    binary = self.device.compiler.compile(self.src)
                self._program = self.device.program(self.name, binary)
            except TgcError:
                raise
            except Exception as e:
                raise PackageError(f"kernel {self.name} of the package does not load on {self.device.name}: "
                                   f"{type(e).__name__}: {str(e)[:200]}",
                                   hint="compile the package again on this machine") from None
        return self._program

    def uops_text(self) -> str:
        return "(a packaged kernel keeps its source and binary, not its UOps)"

    def written(self) -> frozenset[int]:
        """A packaged kernel writes its output, parameter 0 (the package's launch contract)."""
        return frozenset((0,))

    def linear_uops(self) -> list | None:
        return None


CONTRACT_FREE = {"PYTHON"}  # devices whose kernel sources state no launch contract (the emulator checks accesses)
_CONTRACT_LINE = re.compile(r"(?:;|//) tgc-launch: (\{.*\})\Z")  # `tgc.codegen.pipeline.render_kernel`'s line


def read_contract(src: str) -> tuple[tuple[int, ...], tuple[int, int, int], tuple[int, int, int] | None, int] | \
        str | None:
    """The launch contract that ends a kernel's source (`tgc.codegen.pipeline.launch_contract`) as (least bytes
    per buffer, largest global size, local size, number of values); None where the source has none; a string
    saying what is wrong where it is malformed. (Read here, not with `tgc.backends.remote.contract`, so that
    loading a package imports no compiler module.)"""
    line = next((ln for ln in reversed(src[-65536:].splitlines()[-8:]) if "tgc-launch:" in ln), None)
    if line is None:
        return None
    m = _CONTRACT_LINE.fullmatch(line.strip())
    try:
        raw = json.loads(m.group(1)) if m else None
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        return "it is not a JSON object"

    def sizes(v: Any, what: str) -> tuple[int, int, int]:
        if not isinstance(v, list) or not 1 <= len(v) <= 3 or \
                any(type(x) is not int or not 1 <= x <= MAX_LAUNCH for x in v):
            raise ValueError(f"its {what} is not 1 to 3 sizes in [1, 2^31)")
        return tuple([*v, 1, 1][:3])  # type: ignore[return-value]

    bufs, vals, local = raw.get("bufs"), raw.get("vals"), raw.get("local_size")
    if not isinstance(bufs, list) or len(bufs) > MAX_BUFFERS or \
            any(type(b) is not int or not 0 <= b <= MAX_BUFFER for b in bufs):
        return "its bufs are not byte counts"
    if type(vals) is not int or not 0 <= vals <= 64:
        return "its vals is not a count from 0 to 64"
    try:
        return tuple(bufs), sizes(raw.get("global_size"), "global_size"), \
            None if local is None else sizes(local, "local_size"), vals
    except ValueError as e:
        return str(e)


def _read_header(pkg: Any, manifest: dict, members: dict[str, bytes], path: str) -> dict:
    """The parts every package (fixed-size or symbolic) starts with: its device and tgc version, checked."""
    pkg.manifest, pkg.path, pkg.filename = manifest, path, path
    pkg._members = members
    dev = _obj(manifest.get("device"), "device", path)
    pkg.device_kind = _name(dev.get("kind"), "device.kind", path)
    pkg.device_name = str(dev.get("name") or pkg.device_kind)[:64]
    pkg.target = dev.get("target")
    if not isinstance(pkg.target, str) or len(pkg.target) > 256:
        raise _bad(path, "device.target is not a string")
    pkg.tgc_version = str(manifest.get("tgc_version"))[:40]
    return manifest


class _Signature:
    """What a fixed-size package offers the command line as a Program does: its outputs' and dims' names, its one
    set of dims, and inputs bound against its signature (`_check_shape`: how a package checks an input's shape)."""

    path: str
    dims: dict[str, int]
    inputs: list[PackageInput]
    outputs: list[PackageInput]

    @property
    def output_names(self) -> list[str]:
        return [d.name for d in self.outputs]

    @property
    def dim_names(self) -> list[str]:
        return list(self.dims)

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
                raise BindError(f"missing input '{decl.name}' ({_type_text(decl)})", need="input", name=decl.name,
                                hint="pass an array for it", file=self.path)
            arr = self.conform(decl.name, inputs[decl.name], cast)
            self._check_shape(decl, arr)
            arrays[decl.name] = arr
        return dims, arrays

    def _check_shape(self, decl: PackageInput, arr: np.ndarray) -> None:
        raise NotImplementedError


class Package(_Signature):
    """A validated package: its signature, launch plan and memory plan; `run` and `bench` on its device."""

    symbolic = False

    def __init__(self, manifest: dict, members: dict[str, bytes], path: str = "<bytes>",
                 from_symbolic: bool = False, contract_sizes: bool = True):
        """`from_symbolic`: the plan of a symbolic package at some sizes (`SymbolicPackage.at`), whose members
        number a kernel's binary n and its source n + 1 (a fixed-size package: both i). `contract_sizes`: check
        buffer sizes against the kernels' launch contracts (a symbolic package's kernels state the sizes of the
        probe they were built at: checked there, `SymbolicPackage`)."""
        self._from_symbolic, self._contract_sizes = from_symbolic, contract_sizes
        m = _read_header(self, manifest, members, path)
        dims = _obj(m.get("dims"), "dims", path)
        self.dims = {_name(k, "a dim name", path): _int(v, f"dim {k}", path, 0, MAX_DIM) for k, v in dims.items()}
        sig = _obj(m.get("signature"), "signature", path)
        self.buffers = self._read_buffers(m.get("buffers"))
        self.inputs = [self._read_io(d, f"input {i}", "input") for i, d in
                       enumerate(_list(sig.get("inputs"), "signature.inputs", path, MAX_BUFFERS))]
        self.outputs = [self._read_io(d, f"output {i}", "output") for i, d in
                        enumerate(_list(sig.get("outputs"), "signature.outputs", path, MAX_BUFFERS))]
        for what, group in (("input", self.inputs), ("output", self.outputs)):
            names = [d.name for d in group]
            if len(set(names)) != len(names):
                raise _bad(path, f"two {what}s have the same name")
        if len({d.buffer for d in self.inputs + self.outputs}) != len(self.inputs) + len(self.outputs):
            raise _bad(path, "two inputs or outputs share a buffer")
        self.weights = _read_weights(self, m.get("weights"))  # bound here: callers never pass them
        self._bound = [d for d in self.inputs if d.name in self.weights]
        # inputs bound to the same arrays every run: the package's weights, or (a program cache entry's package,
        # kept without them) the weights its Program passes (`progcache.Entry`)
        self.bound_names: set[str] = set(self.weights)
        self.inputs = [d for d in self.inputs if d.name not in self.weights]
        self.kernels = [self._read_kernel(k, i) for i, k in
                        enumerate(_list(m.get("kernels"), "kernels", path, MAX_KERNELS))]
        self.memory = self._read_memory(_obj(m.get("memory"), "memory", path))
        self.content_hash = m["content_hash"]
        self.graph_runner = self._read_runner(m.get("graph_runner"))
        from tgc.engine.realize import LaunchPlans
        self._launch_plans = LaunchPlans(self.MAX_PLANS)  # by device: see `run`

    # --- validation of the manifest's parts
    def _read_runner(self, doc: Any) -> bytes | None:
        """The CPU graph runner's object the package ships (None: none, or one built for another table layout:
        then the runner comes from the compile cache, or the kernels launch one by one)."""
        if doc is None:
            if RUNNER_MEMBER in self._members:
                raise _bad(self.path, f"member {RUNNER_MEMBER} is not described")
            return None
        doc = _obj(doc, "graph_runner", self.path)
        if doc.get("member") != RUNNER_MEMBER or RUNNER_MEMBER not in self._members:
            raise _bad(self.path, "graph_runner names no member of the package")
        from tgc.backends.cpu_graph import ABI
        if self.device_kind != "CPU" or any(doc.get(k) != v for k, v in ABI.items()):
            return None
        return self._members[RUNNER_MEMBER]

    def _read_buffers(self, raw: Any) -> list[PlanBuffer]:
        out = []
        for i, b in enumerate(_list(raw, "buffers", self.path, MAX_BUFFERS)):
            b = _obj(b, f"buffer {i}", self.path)
            dt = _dtype(b.get("dtype"), f"buffer {i}", self.path)
            shape = tuple(_size(s, self.dims, f"buffer {i} shape", self.path, 0, MAX_DIM)
                          for s in _list(b.get("shape"), f"buffer {i} shape", self.path, MAX_RANK))
            n = dt.itemsize
            for s in shape:
                n = min(n * s, MAX_BUFFER + 1)
            nbytes = max(n, 1)
            if nbytes > MAX_BUFFER:
                raise _bad(self.path, f"buffer {i} takes more than {MAX_BUFFER} bytes")
            # (a symbolic package's size expression is 0 where the buffer is empty, as x[2:] at N=2: that is 1 byte)
            if max(_size(b.get("nbytes"), self.dims, f"buffer {i} bytes", self.path, 0, MAX_BUFFER), 1) != nbytes:
                raise _bad(self.path, f"buffer {i}'s size does not match its shape")
            role = b.get("role")
            if role not in ("input", "output", "temp"):
                raise _bad(self.path, f"buffer {i} has no valid role")
            name = b.get("name")
            if name is not None:
                _io_name(name, f"buffer {i} name", self.path)
            out.append(PlanBuffer(dt, shape, i, nbytes, role, name))
        return out

    def _read_io(self, d: Any, where: str, role: str) -> PackageInput:
        d = _obj(d, where, self.path)
        name = _io_name(d.get("name"), f"{where} name", self.path)
        dt = _dtype(d.get("dtype"), where, self.path)
        exprs = _list(d.get("shape"), f"{where} shape", self.path, MAX_RANK)
        shape = []
        for e in exprs:
            v = _size(e, self.dims, f"{where} shape", self.path, 0, MAX_DIM)
            shape.append(e if isinstance(e, str) else v)
        b = _int(d.get("buffer"), f"{where} buffer", self.path, 0, len(self.buffers) - 1)
        buf = self.buffers[b]
        concrete = tuple(sizeexpr.evaluate(e, self.dims) for e in exprs)
        if buf.role != role or buf.dtype != dt or buf.plan_shape != concrete or buf.name != name:
            raise _bad(self.path, f"{where} does not match its buffer")
        return PackageInput(name, dt, shape, exprs, b)

    def _read_kernel(self, k: Any, i: int) -> PackagedKernel:
        where, path = f"kernel {i}", self.path
        k = _obj(k, where, path)
        name = _name(k.get("name"), f"{where} name", path)
        members = []
        for key, suffix in (("binary", ".bin"), ("source", ".src")):
            member = k.get(key)
            if not isinstance(member, str) or member not in self._members:
                raise _bad(path, f"{where}'s {key} is not a member of the package")
            if not (member.startswith("kernels/") and member.endswith(suffix)):  # (not the graph runner)
                raise _bad(path, f"{where}'s {key} is {member}, not a kernel {key} (kernels/<i>{suffix})")
            members.append(member)
        numbers = [int(m.split("/")[1].split(".")[0]) for m in members]
        if numbers[1] != numbers[0] + (1 if self._from_symbolic else 0):  # its own source: the contract read below
            raise _bad(path, f"{where}'s binary {members[0]} and source {members[1]} are not one kernel's")
        bufs = [self.buffers[_int(b, f"{where} buffer", path, 0, len(self.buffers) - 1)]
                for b in _list(k.get("bufs"), f"{where} buffers", path, MAX_BUFFERS)]
        gs = _list(k.get("global_size"), f"{where} global size", path, 3)
        if len(gs) != 3:
            raise _bad(path, f"{where} global size is not 3 sizes")
        global_size = tuple(_size(s, self.dims, f"{where} global size", path, 1, MAX_LAUNCH) for s in gs)
        ls = k.get("local_size")
        local_size = None
        if ls is not None:
            ls = _list(ls, f"{where} local size", path, 3)
            if len(ls) != 3:
                raise _bad(path, f"{where} local size is not 3 sizes")
            local_size = tuple(_size(s, self.dims, f"{where} local size", path, 1, MAX_LAUNCH) for s in ls)
        vals = tuple(_size(v, self.dims, f"{where} value", path, -(1 << 31), (1 << 31) - 1)
                     for v in _list(k.get("vals"), f"{where} values", path, 64))
        flops = _size(k.get("flops"), self.dims, f"{where} flops", path, 0, 1 << 62)
        nbytes = _size(k.get("bytes"), self.dims, f"{where} bytes", path, 0, 1 << 62)
        line = k.get("line")
        if line is not None:
            line = _int(line, f"{where} line", path, 0, 1 << 31)
        opts = [str(o)[:200] for o in _list(k.get("opts", []), f"{where} opts", path, 256)]
        try:
            src = self._members[members[1]].decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(path, f"{where}'s source is not UTF-8 text") from None
        self._check_contract(where, src, bufs, global_size, local_size, vals)  # type: ignore[arg-type]
        return PackagedKernel(name, src, self._members[members[0]], bufs, global_size, local_size, vals, flops,
                              nbytes, line, opts, index=i)  # type: ignore[arg-type]

    def _check_contract(self, where: str, src: str, bufs: list[PlanBuffer], global_size: tuple[int, int, int],
                        local_size: tuple[int, int, int] | None, vals: tuple[int, ...]) -> None:
        """A launch of the plan against the kernel's launch contract, the `tgc-launch:` line that ends its
        source (what a REMOTE server checks, `tgc.backends.remote.contract`): as many buffers as it takes, each
        at least as large as it needs, a grid no larger than it was built for, its local size, as many values;
        and the buffer it writes (parameter 0) never an input, which runs in place in the caller's array."""
        path = self.path
        if bufs and bufs[0].role == "input":
            raise _bad(path, f"{where} writes input '{bufs[0].name}'")
        contract = read_contract(src)
        if contract is None:
            if self.device_kind in CONTRACT_FREE:
                return
            raise _bad(path, f"{where}'s source states no launch contract")
        if isinstance(contract, str):
            raise _bad(path, f"{where}'s launch contract is malformed: {contract}")
        need, grid, local, nvals = contract
        if len(bufs) != len(need):
            raise _bad(path, f"{where} takes {len(need)} buffers (its launch contract), the plan gives {len(bufs)}")
        if self._contract_sizes:
            for j, (b, n) in enumerate(zip(bufs, need)):
                if b.nbytes < n:
                    raise _bad(path, f"{where}'s buffer {j} (plan buffer {b.index}) has {b.nbytes} bytes; the "
                                     f"kernel needs {n}")
        if any(g > c for g, c in zip(global_size, grid)):
            raise _bad(path, f"{where}'s global size {list(global_size)} is larger than the kernel's {list(grid)}")
        if local_size != local:
            raise _bad(path, f"{where}'s local size {list(local_size) if local_size else None} is not the kernel's "
                             f"{list(local) if local else None}")
        if len(vals) != nvals:
            raise _bad(path, f"{where} takes {nvals} values (its launch contract), the plan gives {len(vals)}")

    def _read_memory(self, mem: dict) -> Any:
        from tgc.engine.memplan import MemoryPlan, check_plan, lifetimes

        path = self.path
        slots = [_size(s, self.dims, "memory slot", path, 1, MAX_BUFFER)
                 for s in _list(mem.get("slots"), "memory.slots", path, MAX_BUFFERS)]
        slot_of = _list(mem.get("slot_of"), "memory.slot_of", path, MAX_BUFFERS)
        if len(slot_of) != len(self.buffers):
            raise _bad(path, "the memory plan does not cover every buffer")
        inputs = [self.buffers[d.buffer] for d in self.inputs + self._bound]
        spans = lifetimes([k.bufs for k in self.kernels], inputs, [self.buffers[d.buffer] for d in self.outputs])
        plan = MemoryPlan(slots=slots, lifetimes=spans)
        for buf, slot in zip(self.buffers, slot_of):
            if buf in spans:
                plan.slot_of[buf] = _int(slot, "memory slot", path, 0, len(slots) - 1)
                plan.sizes[buf] = buf.nbytes
            elif slot != -1:
                raise _bad(path, "the memory plan places a buffer no kernel uses")
        # in-place pairs (an elementwise kernel writing its output over an input that dies there): buffer indices
        for pair in _list(mem.get("inplace", []), "memory.inplace", path, MAX_BUFFERS):
            if len(_list(pair, "memory.inplace pair", path, 2)) != 2:
                raise _bad(path, "a memory.inplace pair is not [output buffer, input buffer]")
            out, src = (_int(i, "memory.inplace buffer", path, 0, len(self.buffers) - 1) for i in pair)
            if self.buffers[out] not in plan.slot_of or self.buffers[src] not in plan.slot_of:
                raise _bad(path, "the memory plan's in-place pair is not two buffers its kernels use")
            if "input" in (self.buffers[out].role, self.buffers[src].role):
                raise _bad(path, "the memory plan writes over an input (an in-place pair with an input)")
            plan.inplace.append((self.buffers[out], self.buffers[src]))
        fixed = {plan.slot_of[b] for b in inputs}
        if len(fixed) != len(inputs) or any(s in fixed for b, s in plan.slot_of.items() if b not in inputs):
            raise _bad(path, "the memory plan shares an input's memory")
        why = check_plan(plan)
        if why is not None:
            raise _bad(path, f"its memory plan is unsafe: {why}")
        if set(plan.slot_of.values()) != set(range(len(slots))):
            raise _bad(path, "the memory plan has slots no buffer uses")
        peak = _size(mem.get("peak_bytes"), self.dims, "memory.peak_bytes", path, 0, 1 << 62)
        if peak != plan.peak_bytes:
            raise _bad(path, "the memory plan's peak does not match its slots")
        return plan

    # --- what `tgc.cli.inputs` and the commands read, as from a Program (the rest: `_Signature`)
    @property
    def peak_bytes(self) -> int:
        return self.memory.peak_bytes

    def _check_shape(self, decl: PackageInput, arr: np.ndarray) -> None:
        want = self.buffers[decl.buffer].plan_shape
        if arr.ndim != len(want):
            raise TgcError(f"input '{decl.name}' has {arr.ndim} dims {list(arr.shape)}, but the package "
                           f"declares it {_type_text(decl)} with {len(want)}", file=self.path)
        for axis, (w, have, e) in enumerate(zip(want, arr.shape, decl.expr)):
            if w != have:
                named = f" ({sizeexpr.text(e)} = {w})" if not isinstance(e, int) else ""
                raise TgcError(f"input '{decl.name}' axis {axis} has size {have}, but the package declares "
                               f"{w}{named}", file=self.path,
                               hint="the package holds the sizes it was compiled for; compile another for "
                                    "these sizes")

    def output_types(self, dims: dict[str, int] | None = None) -> list[tuple[str, DType, tuple[int, ...]]]:
        return [(d.name, d.dtype, self.buffers[d.buffer].plan_shape) for d in self.outputs]

    # --- running
    def open_device(self, device: str | None = None) -> Any:
        """The device to run on: the package's own kind (any index), after checking the binaries load there."""
        from tgc.backends import canonical, get_device

        name = device or self.device_name
        if "," in name:
            raise TgcError(f"device lists such as '{name}' are not supported for packages",
                           hint=f"run on one {self.device_kind} device")
        kind, _ = canonical(name)
        if kind != self.device_kind:
            raise PackageError(f"{self.path} was compiled for {self.device_kind}, not {kind}",
                               hint=f"run it with -d {self.device_kind}, or compile a package for {kind}")
        dev = get_device(name)
        here = dev.binary_target()
        if here != self.target:
            raise PackageError(f"{self.path} holds {self.device_kind} binaries for {self.target}, but {dev.name} "
                               f"here needs {here}",
                               hint="compile the package again on (or for) this machine")
        return dev

    def lower(self, device: str | None = None) -> Any:
        """The package's saved executable on a device (`tgc.engine.executable.Executable`: its kernels over its
        planned buffers, with its memory plan)."""
        from tgc.engine.executable import Executable

        dev = self.open_device(device)
        for k in self.kernels:
            if k.device is not dev:
                k.device, k._program = dev, None
        # a CPU package runs its launch plan as one native call (the graph runner it ships, or the compile
        # cache's), never compiling it: without either, kernel by kernel
        options = {"runner_object": self.graph_runner, "compile_runner": False} if dev.kind == "CPU" else None
        exe = Executable(dev, self.kernels, [(self.buffers[d.buffer], d.name) for d in self.inputs + self._bound],
                         [(d.name, self.buffers[d.buffer]) for d in self.outputs], memory=self.memory,
                         graph_options=options)
        exe.bound = frozenset(self.bound_names)  # (their kernels run once per launch plan: tgc.engine.bound)
        return exe

    MAX_PLANS = 4  # launch plans (with their device buffers) kept between runs, per device

    def run(self, device: str | None = None, dims: dict[str, int] | None = None, cast: bool = False,
            inputs: dict[str, Any] | None = None, **kw_inputs: Any) -> dict[str, np.ndarray]:
        """Execute the launch plan; {output name: numpy array}, as `Program.run`. The plan is kept with its
        buffers between runs and, from its second run on, runs as one device graph (`LaunchPlan`)."""

        from tgc.engine import executable

        low = self.lower(device)  # a package for another device is refused before its inputs are read
        _, arrays = self.bind({**(inputs or {}), **kw_inputs}, dims, cast=cast)
        arrays.update(self.weights)
        low.device.ensure_runnable()
        return executable.run(low, arrays, replay=self._launch_plans, key=(low.device.name,))

    def release(self) -> None:
        """Give back the device buffers that the package's launch plans keep between runs."""
        self._launch_plans.release()

    def bench(self, device: str | None = None, dims: dict[str, int] | None = None, repeat: int = 10,
              inputs: dict[str, np.ndarray] | None = None, warmup: int = 1, **_: Any) -> dict[str, Any]:
        """Time the launch plan on device-resident inputs (random by default), as `Program.bench`."""
        from tgc.engine import executable
        from tgc.engine.inputs import random_values

        if inputs is None:
            inputs = {d.name: random_values(d.dtype, self.buffers[d.buffer].plan_shape, 0, i)
                      for i, d in enumerate(self.inputs)}
        dims, arrays = self.bind(inputs, dims, cast=True)
        arrays.update(self.weights)
        low = self.lower(device)
        low.device.ensure_runnable()
        timing = executable.bench(low, arrays, repeat=repeat, warmup=warmup, measure_peak=False)
        return {"device": low.device.name, "dims": dims, "repeat": repeat, "beam": None, **timing,
                "identity": self.identity(low.device, dims)}

    def identity(self, device: Any, dims: dict[str, int]) -> dict[str, Any]:
        from tgc.engine.bench import device_model

        dev = device if not isinstance(device, (str, type(None))) else self.open_device(device)
        return {"program_sha256": self.manifest["program"].get("source_sha256") if isinstance(
                    self.manifest.get("program"), dict) else None,
                "file": self.path, "dims": dict(sorted(dims.items())), "device": dev.name,
                "device_model": device_model(dev), "tgc_version": __version__, "package": self.content_hash}

    # --- inspect
    def describe(self) -> dict[str, Any]:
        """What `tgc inspect --json` prints."""
        mem = self.memory
        temps = [b for b in self.buffers if b.role == "temp" and b in mem.slot_of]
        prog = self.manifest.get("program") if isinstance(self.manifest.get("program"), dict) else {}
        return {
            "path": self.path, "format": FORMAT, "format_version": FORMAT_VERSION, "tgc_version": self.tgc_version,
            "content_hash": self.content_hash,
            "device": {"kind": self.device_kind, "name": self.device_name, "target": self.target,
                       "compiler": self.manifest["device"].get("compiler")},
            "program": {"file": prog.get("file"), "source_sha256": prog.get("source_sha256")},
            "dims": dict(self.dims),
            "graph_runner": self.graph_runner is not None,
            "inputs": [_io_doc(d, self.buffers[d.buffer]) for d in self.inputs],
            "outputs": [_io_doc(d, self.buffers[d.buffer]) for d in self.outputs],
            "weights": {"count": len(self.weights), "bytes": int(sum(a.nbytes for a in self.weights.values()))},
            "kernels": [{"name": k.name, "global_size": list(k.global_size),
                         "local_size": list(k.local_size) if k.local_size else None, "vals": list(k.vals),
                         "buffers": [b.index for b in k.bufs], "binary_bytes": len(k.binary),
                         "source_bytes": len(k.src.encode()), "flops": k.flops, "bytes": k.bytes_moved,
                         "line": k.line} for k in self.kernels],
            "buffers": [{"index": b.index, "role": b.role, "name": b.name, "dtype": b.dtype.name,
                         "shape": list(b.plan_shape), "nbytes": b.nbytes, "slot": mem.slot_of.get(b)}
                        for b in self.buffers],
            "memory": {"peak_bytes": mem.peak_bytes, "unshared_bytes": mem.unshared_bytes,
                       "slots": list(mem.slots), "buffers": len(mem.slot_of),
                       "intermediates": len(temps), "intermediate_slots": len({mem.slot_of[b] for b in temps}),
                       "input_bytes": sum(self.buffers[d.buffer].nbytes for d in self.inputs),
                       "output_bytes": sum(self.buffers[d.buffer].nbytes for d in self.outputs
                                           if self.buffers[d.buffer] in mem.slot_of)},
        }


def _type_text(decl: PackageInput) -> str:
    return f"{decl.dtype.name}[{', '.join(map(str, decl.shape))}]"


def _io_doc(d: PackageInput, buf: PlanBuffer) -> dict[str, Any]:
    return {"name": d.name, "dtype": d.dtype.name, "shape": list(buf.plan_shape),
            "declared": [sizeexpr.text(e) for e in d.expr]}


# ---------------------------------------------------------------------------------------------------------------
# device-list packages (format version 3, `MULTI_VERSION`)
#
# Device-list packages (format version 3): a program compiled for a device list (`-d CPU:0,OPENCL:0`, with
# `--shard`), saved as its multi-device `Executable` (`Executable.across`, `tgc.engine.multi.build_executable`)
# and run later without its source and without a compiler.
#
# The archive is a version-1 package's (`tgc.package`: data only, the file checksum, the content hash, every
# member hashed, the same member names and limits); the manifest differs:
#
# - `devices`: the device list, in order: each `kind`, `name` (as listed, `CPU:0`), `target` (what its binaries
#   need to load, `Device.binary_target()`) and `compiler`; `device` is kept (the first device) so that every
#   reader of a package's header reads one;
# - `shard`: {input name: axis} as compiled (inputs not named are replicated);
# - `signature`: the whole program's `inputs`/`outputs` (`name`, `dtype`, `shape`, integers); each input also
#   `declared`, its declared shape as size expressions of the dims (as a version-1 package's signature);
#   `dims` holds the program's dims only, each named by some input's declaration;
# - `parts`: per device its `buffers` (as a version-1 package's: `dtype`, `shape`, `nbytes`, `role`, `name`)
#   and its `memory` plan (`slots`, `slot_of` per buffer, -1 for one no step uses, `peak_bytes`, `inplace`);
# - `kernels`: every distinct kernel once (`device`: its position in the list, then a version-1 kernel's fields,
#   `bufs` indices into its device's buffers; members `kernels/<i>.bin|src`);
# - `steps` in order: `["launch", kernel]`, `["copy", src_device, src_buffer, dst_device, dst_buffer]`,
#   `["allreduce", op, [buffer per device], index]` (in place, `op` one of ADD MUL MAX MIN), `["gather", axis,
#   bounds, [shard per device], [whole buffer per device], index]`;
# - `input_parts`: `[name, device, buffer, axis, [start, end]]` (axis and rows null: the whole input);
#   `output_parts`: `[name, [[device, buffer], ...], axis]` (axis null: one replicated copy, the first holder's).
#
# Loading validates all of it before anything runs (`MultiPackage`): every index in range, every buffer's size
# against its shape, copies between buffers of one size, collectives over buffers of one type and shard bounds
# that tile the whole, the dims against the inputs' declared shapes, input parts that are the named input's
# rows, kernels against their launch contracts (never writing an input), and each device's memory plan against
# the lifetimes its steps give (as `tgc.engine.realize.plan_device` computes them). At run the devices are
# opened by their names (or a `-d` list of as many devices of the same kinds): a device this machine lacks, or
# one of another binary target, is one `PackageError` (exit 2) naming it. Imports neither the front end nor a
# compiler on the load path.


def _dims_text(dims: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in dims.items()) or "none"


@dataclass
class WholeSpec:
    """An input or output of a device-list package's whole program: name, dtype, concrete shape."""

    name: str
    dtype: DType
    shape: tuple[int, ...]


MAX_DEVICES = 64
MAX_STEPS = 1 << 16
REDUCE_OPS = ("ADD", "MUL", "MAX", "MIN")


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

    dims = {k: int(v) for k, v in dims.items() if k in prog.dim_names}  # (a -D the program lacks: not its dim)
    sig_inputs = []
    for d in prog.inputs:
        shape = [int(x) for x in concrete_shape(d, dims)]
        sig_inputs.append({"name": d.name, "dtype": d.dtype.name, "shape": shape,
                           "declared": _decl_shape(d.shape, shape)})
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


class _Part(Package):
    """One device's part of a device-list package: read with a version-1 package's checks (buffers, kernels and
    their launch contracts), by the package's path, dims and members."""

    def __init__(self, pkg: MultiPackage, d: int, doc: dict):  # (not Package.__init__: a part has no header)
        self.path, self.dims, self._members = pkg.path, pkg.dims, pkg._members
        self.device_kind = pkg.device_docs[d]["kind"]
        self._from_symbolic, self._contract_sizes = False, True
        self.buffers = self._read_buffers(doc.get("buffers"))


class MultiPackage(_Signature):
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
        raw_inputs = _list(sig.get("inputs"), "signature.inputs", path, MAX_BUFFERS)
        self.inputs = [self._read_whole(d, f"input {i}") for i, d in enumerate(raw_inputs)]
        self._check_dims(raw_inputs)
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
    def _read_whole(self, d: Any, where: str) -> WholeSpec:
        d = _obj(d, where, self.path)
        name = _io_name(d.get("name"), f"{where} name", self.path)
        shape = tuple(_int(s, f"{where} shape", self.path, 0, MAX_DIM)
                      for s in _list(d.get("shape"), f"{where} shape", self.path, MAX_RANK))
        return WholeSpec(name, _dtype(d.get("dtype"), where, self.path), shape)

    def _check_dims(self, raw_inputs: list) -> None:
        """The dims against the inputs' declared shapes (size expressions of the dims, as a version-1 package's
        signature): each must evaluate to its input's concrete shape, and every dim must be one a declaration
        names (a dim is bound by the first input that uses it), so an edited `dims` is refused."""
        named: set[str] = set()
        for i, (raw, whole) in enumerate(zip(raw_inputs, self.inputs)):
            where = f"input {i}"
            exprs = _list(raw.get("declared"), f"{where} declared shape", self.path, MAX_RANK)
            if len(exprs) != len(whole.shape):
                raise _bad(self.path, f"{where}'s declared shape does not match its shape")
            for e, n in zip(exprs, whole.shape):
                if _size(e, self.dims, f"{where} declared shape", self.path, 0, MAX_DIM) != n:
                    raise _bad(self.path, f"its dims ({_dims_text(self.dims)}) do not give {where} "
                                          f"'{whole.name}' its shape {list(whole.shape)}")
                named |= sizeexpr.names(sizeexpr.validate(e))
        extra = sorted(set(self.dims) - named)
        if extra:
            raise _bad(self.path, f"dim {extra[0]} is named by no input's declared shape")

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
        split = {p.name: p.axis for p in self.input_parts if p.axis is not None}
        if split != self.shard or any(p.axis != split.get(p.name) for p in self.input_parts):
            raise _bad(path, "its shard spec is not how its input parts split the inputs")
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

    # --- what the command line reads, as from a Program (the rest: `_Signature`)
    @property
    def peak_bytes(self) -> int:
        return sum(p.peak_bytes for p in self.memories)

    def _check_shape(self, decl: PackageInput, arr: np.ndarray) -> None:
        if tuple(arr.shape) != decl.shape:
            raise TgcError(f"input '{decl.name}' has shape {list(arr.shape)}, but the package declares "
                           f"{list(decl.shape)}", file=self.path,
                           hint="the package holds the sizes it was compiled for; compile another for these sizes")

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
            # REMOTE with servers set: a server that is down or refuses the token is a device error (exit 1) when the
            # device is first used, as on a `.tg` device list and a one-device package (the class probe would ask
            # only the first server, and call its failure "not available", exit 2)
            ok, why = (True, None) if doc["kind"] == "REMOTE" and device_class("REMOTE").addresses() else \
                device_class(doc["kind"]).probe()
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
        # (the list as named, each device with its index, as `Program.bench` on a list: OPENCL:0, not OPENCL)
        names = ",".join(self.device_names if device is None else
                         [x.strip() for x in (device.split(",") if isinstance(device, str) else device)])
        return {"device": names, "dims": dims, "repeat": repeat, "beam": None, **timing,
                "identity": {**self.identity(exe.devices, dims), "device": names, "shard": dict(self.shard)}}

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


# ---------------------------------------------------------------------------------------------------------------
# symbolic packages: the program's kernels for every size of its size classes (format version 2)

SYMBOLIC_VERSION = 5  # a symbolic package as written now: a class may be narrowed ("multiples": X a multiple of Y)
SPLIT_SYMBOLIC_VERSION = 4  # one without narrowed classes: split kernels (derived sizes, remainder kernels), grids
OLD_SYMBOLIC_VERSION = 2  # a symbolic package without either (read as before)
# the devices symbolic packages are built for: a GPU kernel's grid is saved as expressions of the dims (format 4);
# REMOTE checks each launch against the sizes its kernel's source states (the probe's); CUDA and METAL: not yet
# run from a package here (no GPU on the project machine)
SYMBOLIC_KINDS = ("CPU", "PYTHON", "OPENCL")
MAX_CLASSES = 16
MAX_ONES = 3  # programs of at most this many dims package every class of dims at 1; more: one dim at 1 at a time


def _size_classes(names: list[str]) -> list[tuple[tuple[str, str], ...]]:
    """The classes a symbolic package holds: every dim "n" (2 or more) first, then dims at 1 (a dim of 1 changes
    the program's graph: its own kernels). Multiples of 32 run the "n" kernels (valid for every size)."""
    from itertools import combinations
    most = len(names) if len(names) <= MAX_ONES else 1
    out = []
    for r in range(most + 1):
        for ones in combinations(names, r):
            out.append(tuple((n, "1" if n in ones else "n") for n in names))
    return out[:MAX_CLASSES]


def _mul(a: Any, b: Any) -> Any:
    """a * b as a size expression, integers folded."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(b, int) and not isinstance(a, int):
        a, b = b, a
    return ["*", a, b]


def _mono_expr(m: tuple) -> Any:
    """A size of tgc.codegen.sizes (coef * product of dims // div + offset) as a size expression."""
    coef, names, off, div = m
    e: Any = 1
    for n in names:
        parts = atom_parts(n) if "/" in n else None  # (a floor division of a dim: `symsize.atom`)
        e = _mul(e, n if parts is None else ["//", ["+", _mul(parts[0], parts[1]), parts[2]], parts[3]])
    e = _mul(coef, e)
    if div != 1:
        e = e // div if isinstance(e, int) else ["//", e, div]
    return e + off if isinstance(e, int) else (e if off == 0 else ["+", e, off])


def _product_expr(parts: list, scale: int) -> Any:
    """scale * the product of `parts` (every size of a packaged class is 1 or more: so is the product)."""
    e: Any = scale
    for p in parts:
        e = _mul(e, p)
    return e


def _uop_expr(u: Any) -> Any:
    """A launch check's integer expression (kernel variables `D_name`, constants, + * // % max) as a size
    expression; None where it has anything else (the fast variant is then left out: never a wrong answer)."""
    from tgc.codegen.sizes import VAR_PREFIX
    from tgc.ir.uop import Ops
    if u.op is Ops.CONST and isinstance(u.arg, int) and not isinstance(u.arg, bool):
        return int(u.arg)
    if u.op is Ops.DEFINE_VAR and isinstance(u.arg, tuple) and str(u.arg[0]).startswith(VAR_PREFIX):
        return str(u.arg[0])[len(VAR_PREFIX):]
    if u.op is Ops.NEG and len(u.src) == 1:
        a = _uop_expr(u.src[0])
        return None if a is None else -a if isinstance(a, int) else ["-", 0, a]
    ops = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.MAX: "max", Ops.IDIV: "//", Ops.MOD: "%"}
    if u.op in ops and len(u.src) == 2:
        a, b = _uop_expr(u.src[0]), _uop_expr(u.src[1])
        if a is None or b is None:
            return None
        if u.op in (Ops.IDIV, Ops.MOD) and not (isinstance(b, int) and b > 0):
            return None  # (C's truncating division equals floor division for the non-negative sizes here)
        return _mul(a, b) if u.op is Ops.MUL else [ops[u.op], a, b]
    if u.op is Ops.CAST and len(u.src) == 1:
        return _uop_expr(u.src[0])
    return None


_SCAN_LIMIT = 4096  # the largest `trusted_from` below which `_class_minimum` checks each size with the source


def _class_minimum(prog: Any, plan: Any, cls: tuple) -> dict[str, int]:
    """Per symbolic dim, the least size the package accepts. At the probes (primes of 211 and more) every
    symbolic dim exceeds every constant of the program, so the symbolic kernels hold wherever each dim exceeds
    the largest constant of the graph plus the sizes' offsets (`T`). Below T a slice or index may clamp, or the
    scheduler cut another kernel: each dim alone at 2 .. T-1 (the others at T, T+1, ...) is checked with the
    source (`SymbolicPlan.bind`), its least size the one above its last failure; then every dim at once at its
    least size (else every dim at T). The dims are kept distinct: equal dims can merge equal nodes of the
    graph, which `bind` reads as another graph, whatever the sizes."""
    from tgc.codegen import sizes
    sym = list(plan.symbolic)
    top = plan.trusted_from  # (one trace: raised to where its size decisions hold, `symsize.decided_from`)
    fixed = {n: int(c) for n, c in cls if c not in sizes.SYMBOLIC}

    def holds(dims: dict[str, int]) -> bool:
        at = {**fixed, **dims}
        if plan.multiples:  # (a narrowed class, `sym` its hidden dims: bound at the program's dims they make)
            at = {n: v for n, v in prog._program_dims(at).items() if n in prog.dim_names}
        try:
            return plan.bind(prog, at)[0] is not None
        except TgcError:
            return False

    if top > _SCAN_LIMIT:  # (sizes below a constant this large cannot be checked one by one: none taken)
        return {n: top for n in sym}
    # the other dims held where the plan holds without the source: from T up, but within its bound (a plan
    # bounded by a decision of the front end, `x[::250]`'s step count, may be trusted from above its bound: there
    # the source check is what holds below T)
    bound = int(plan.bound)
    # (a narrowed class's dims are exactly of their class: a 32n dim at multiples of 32, an n dim at no multiple)
    wide = {n for n, c in cls if c == "32n"}
    step = {n: 32 if n in wide else 1 for n in sym}

    def fits(n: str, v: int) -> bool:
        return v % 32 == 0 if n in wide else not (plan.multiples and v % 32 == 0)

    held: list[int] = []
    for j, n in enumerate(sym):
        v = top + j if top + len(sym) <= bound else max(2, bound - j)
        while not fits(n, v) or v in held:
            v += 1
        held.append(v)
    least = {}
    for n in sym:
        least[n] = step[n] if n in wide else 2
        for v in range(least[n], min(top, bound + 1), step[n]):
            if fits(n, v) and not holds({m: (v if m == n else held[j]) for j, m in enumerate(sym)}):
                least[n] = v + step[n]
    taken: set[int] = set()
    together = {}
    for n in sym:  # every dim at its least size at once, distinct
        v = least[n]
        while v in taken or not fits(n, v):
            v += 1
        taken.add(v)
        together[n] = v
    return least if holds(together) else {n: top for n in sym}


def _past_max_buffer(doc: dict) -> str:
    """Why a class's doc cannot be packaged where a buffer at its probe sizes takes more than `MAX_BUFFER` bytes
    (the loader validates every buffer there: a narrowed class of hidden dims of class 32n, whose probes are
    primes times 32, may pass it: C = C_D * D at 223 * 32 and 227 * 32 is 5e7, a weight of C * C past 2^48
    bytes), else ""."""
    from tgc.engine import classbind
    try:
        env = classbind.environment(doc, doc["probe"])
        for b in doc["buffers"]:
            n = dtypes.by_name[b["dtype"]].itemsize
            for e in b["shape"]:
                n *= sizeexpr.evaluate(e, env)
            if n > MAX_BUFFER:
                return (f"its kernels were built at sizes ({', '.join(f'{k}={v}' for k, v in doc['probe'].items())})"
                        f" where a buffer takes more than {MAX_BUFFER} bytes, past what a package holds")
    except (TgcError, KeyError, TypeError, ValueError):
        return ""  # (the loader's own check says why)
    return ""


def build_symbolic(prog: Any, dev: Any, plans: list[tuple[tuple, Any]] | None = None,
                   held: Any = None) -> bytes:
    """The symbolic package of a program (no dims given) for a CPU or PYTHON device, as bytes: the saved
    `SymbolicPlan` of each of its size classes (`_size_classes`), or of the classes `plans` gives ((class,
    plan) pairs: a program-cache entry's one class). A class's least sizes (`min`) are sampled with the source
    (`_class_minimum`) for the package's classes; for `plans`, the plan's `trusted_from` (the sizes below it are
    checked with the source by `SymbolicPlan.bind`, which a cache entry's Program has). `held`: classes of a
    loaded package of the same program (`SizeClassPlan`s, with their package's members) copied after `plans`'s
    as they are (a cache entry's narrowed classes that other processes built: nothing rebuilt)."""
    from tgc.codegen import sizes
    from tgc.errors import CompileError

    _no_bound_weights(prog)
    names = list(prog.dim_names)
    decls = list(prog.inputs)
    files: dict[str, dict] = {}
    blobs: dict[str, bytes] = {}
    classes, skipped = [], []
    narrowed: list[Any] = []  # the narrowed plan of the class of every dim >= 2: its 32n variants go after

    def member(data: bytes) -> str:
        name = f"kernels/{len(blobs)}.{'bin' if len(blobs) % 2 == 0 else 'src'}"
        blobs[name] = data
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        return name

    def one_class(cls: tuple, plan: Any) -> dict | str:
        """The package's doc of one size class, or why it is left out (with the blobs it wrote)."""
        before = set(blobs)
        doc = _one_class(cls, plan)
        if isinstance(doc, str):
            for name in set(blobs) - before:
                del blobs[name], files[name]
        return doc

    def _one_class(cls: tuple, plan: Any) -> dict | str:
        cls = plan.size_class if plan.multiples else cls  # (a narrowed class: over its kernels' dims)
        try:
            doc = class_doc(prog, dev, cls, plan, member=member)
        except sizeexpr.ExprError:  # (a buffer's size past 2^62 at the class's probes: vit's 32n variant, IMG of
            # IMG_P * P at two probe primes of ~7000 each; the loader could not evaluate it either)
            at = ", ".join(f"{k}={v}" for k, v in sizes.probes(cls)[0].items())
            return f"its kernels were built at sizes ({at}) where a buffer's size passes what a package holds"
        if isinstance(doc, str):
            return doc
        sym = list(plan.symbolic)
        if plan.multiples:  # (a narrowed class: the program's class, its multiples and the hidden dims' sizes,
            # from where the plan holds without the source; `SizeClassPlan.class_dims` checks them at each bind)
            doc["class"] = dict(plan.user_class)
            doc["multiples"] = [[x, y, q] for x, y, q in plan.multiples]
            if "32n" in dict(plan.size_class).values() or "32n" in doc["class"].values():
                doc["hidden"] = dict(plan.size_class)  # (the classes of its kernels' dims: some of 32n)
        too_large = _past_max_buffer(doc)
        if too_large:  # (the loader checks every buffer at the probe: a class of such probes cannot load)
            return too_large
        doc["min"] = ({n: max(2, plan.trusted_from) for n in sym} if plans is not None else
                      _class_minimum(prog, plan, cls)) if sym else {}
        doc["max"] = {n: int(plan.bound) for n in sym}
        if any(doc["min"][n] > doc["max"][n] for n in sym):  # (no size the plan holds at: the class is left out)
            return (f"its kernels hold at no size: from {min(doc['min'].values())} without the source, but only up "
                    f"to {max(doc['max'].values())}")
        return doc

    for cls, plan in (plans if plans is not None else [(c, None) for c in _size_classes(names)]):
        text = sizes.class_text(cls)
        plan = prog._symbolic(dev, cls) if plan is None else plan
        if isinstance(plan, str):
            if all(c == "n" for _, c in cls):
                raise TgcError(f"the program has no kernels valid for every size ({text}): {plan}", kind="user",
                               hint=f"give its dims ({', '.join(names)}) to package it for one size",
                               cli_hint="give its dims to package it for one size: "
                                        + " ".join(f"-D {n}=INT" for n in names))
            skipped.append({"class": dict(cls), "why": plan[:300]})
            continue
        bad = next((k for k in [*plan.kernels, *[f for f in plan.fast if f]] if k.binary is None), None)
        if bad is not None:
            raise CompileError(f"cannot package for {dev.name}: kernel {bad.name} could not be compiled here: "
                               f"{bad.compile_error or 'no compiler on this machine'}")
        doc = one_class(cls, plan)
        if isinstance(doc, str):
            skipped.append({"class": dict(cls), "why": doc})
        else:
            classes.append(doc)
        if plans is None and plan.multiples and all(c == "n" for _, c in cls):
            narrowed.append(plan)
    for c, members in held or ():  # (each launch's binary and source stored again under this package's names)
        doc = json.loads(json.dumps(c.doc))
        for k in doc["kernels"]:
            for launch in [k, k.get("fast"), k.get("plain"), *k.get("tails", [])]:
                if launch is not None:
                    launch["binary"] = member(members[launch["binary"]])
                    launch["source"] = member(members[launch["source"]])
        classes.append(doc)
    # the narrowed class of every dim 2 or more with hidden dims of class 32n too (C = 768 of D = 64 heads: C_D of
    # class n, D of 32n), each its own class, after the program's classes, while the package has room for them
    # (only that class's: each is a compile of the program, which for llama_block takes seconds)
    for plan in narrowed:
        for made, wide in prog.narrowed_variants(dev, plan, room=MAX_CLASSES - len(classes)):
            doc = wide if isinstance(wide, str) else one_class(wide.size_class, wide)
            if isinstance(doc, str):  # (said as the class of the program's dims it makes: C and D of 32n)
                skipped.append({"class": dict(made), "why": doc[:300]})
            else:
                classes.append(doc)
    skipped = skipped[:MAX_CLASSES]
    return _archive(prog, dev, SYMBOLIC_VERSION, {
        "dims": {},
        "symbolic": {"dims": names, "classes": classes, "skipped": skipped},
        "signature": {"inputs": [{"name": d.name, "dtype": d.dtype.name,
                                  "shape": _decl_shape(d.shape, [None] * len(d.shape))} for d in decls],
                      "outputs": [{"name": n} for n in prog.output_names]},
    }, blobs, files)


def _archive(prog: Any, dev: Any, version: int, body: dict, blobs: dict[str, bytes],
             files: dict[str, dict]) -> bytes:
    """The package file: the manifest (what every package holds, the device's CPU graph runner where it has
    one, then `body`) with its content hash, and the blobs, zipped, ending in the file's checksum."""
    runner = _graph_runner(dev)
    if runner is not None:
        blobs[RUNNER_MEMBER] = runner[1]
        files[RUNNER_MEMBER] = {"size": len(runner[1]), "sha256": hashlib.sha256(runner[1]).hexdigest()}
    manifest = {
        "format": FORMAT, "format_version": version, "tgc_version": __version__,
        "device": {"kind": dev.kind, "name": dev.name, "target": dev.binary_target(),
                   "compiler": dev.compiler.cache_key if dev.compiler is not None else None},
        "program": {"file": os.path.basename(prog.path or prog.filename),
                    "source_sha256": hashlib.sha256(prog.source.encode()).hexdigest()},
        **body,
        "files": files,
    }
    if runner is not None:
        manifest["graph_runner"] = runner[0]
    manifest["content_hash"] = content_hash(manifest)
    key = package_key()
    if key is not None:
        manifest[SIGNATURE] = signature(key, manifest["content_hash"])
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for member, data in [(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode()), *blobs.items()]:
            info = zipfile.ZipInfo(member, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
        z.comment = b"0" * CHECKSUM_LEN  # replaced below: the file's checksum
    data = out.getvalue()
    return data[:-CHECKSUM_LEN] + file_checksum(data)


def _check_text(what: str, e: Any, v: int) -> str:
    return f"{sizeexpr.text(e)} % {v} == 0" if what == "divides" else \
        f"{sizeexpr.text(e)} <= {v}" if what == "at most" else f"{sizeexpr.text(e)} >= {v}"


def _unserved(path: str, dims: dict[str, int], why: str, i: int, name: Any) -> PackageError:
    """The error for kernel `i` (`name`) of a symbolic package whose launch check `why` fails at `dims`."""
    given = ", ".join(f"{n}={v}" for n, v in dims.items())
    return PackageError(f"{path}: at the sizes {given}, {why} (kernel {i}, {str(name)[:64]}): this package's "
                        f"kernels do not serve these sizes",
                        hint="compile a package for these sizes: tgc compile FILE "
                             + " ".join(f"-D {n}={v}" for n, v in dims.items()) + " --package OUT")


@dataclass
class SizeClassPlan:
    """One size class of a symbolic package: each dim "n" (its sizes `min` .. `max`), "32n" (the multiples of
    32 among them: a program-cache entry's class) or "1"; with its saved plan (`bind`)."""

    cls: dict[str, str]
    min: dict[str, int]
    max: dict[str, int]
    doc: dict
    # a narrowed class (format 5, `SymbolicPlan.multiples`): (X, Y, Q), X a multiple of Y (a dim or an int), Q = X // Y
    # a hidden dim; `hidden` the class of the dims its kernels were built for (each X replaced by its Q), over
    # which `min` and `max` are; without multiples, `cls`
    multiples: list = field(default_factory=list)
    hidden: dict = field(default_factory=dict)

    # set when the package is loaded (after every field was validated at the class's probe and least sizes)
    # per kernel, its `PackagedKernel`s by variant (`general`, `fast`, `plain`: one or None; `tails`: a list)
    templates: list = field(default_factory=list)
    slot_of: list = field(default_factory=list)  # per buffer, its slot (-1: used by no kernel)
    inplace: list = field(default_factory=list)  # [output buffer, input buffer] pairs sharing a slot
    chosen: list = field(default_factory=list)  # per kernel of the last `bind`: "fast", "split" or "general"

    def text(self) -> str:
        out = ", ".join(f"{n}={self.min.get(n, 2)}..{self.max.get(n)}" if c == "n" else
                        f"{n}={self.min.get(n, 32)}..{self.max.get(n)} (multiples of 32)" if c == "32n" else
                        f"{n}={c}" for n, c in (self.hidden or self.cls).items()) or "(no dims)"
        if self.multiples:  # (each quotient named with what it is and its class: C_D (= C // D) no multiple of 32)
            cls = sizeexpr.made_classes(self.multiples, self.hidden or self.cls)  # (a middle quotient's too)
            out += ", with " + ", and ".join(
                f"{xs} a multiple of {ys}, {q} (= {xs} // {ys}) "
                + ("a multiple of 32" if cls.get(q) == "32n" else "no multiple of 32")
                for (xs, ys), (_, _, q) in zip(sizeexpr.written(self.multiples), self.multiples))
        return out

    def short(self) -> str:
        """The class in short: its dims' classes and multiples, no sizes (`B >= 2, T=1, C a multiple of 4`)."""
        cls = {n: "n" if any(x == n for x, _, _ in self.multiples) else v for n, v in self.cls.items()}
        out = sizeexpr.class_text(cls.items())
        return out + "".join(f", {xs} a multiple of {ys}" for xs, ys in sizeexpr.written(self.multiples))

    def peak_text(self, limit: int | None = 100) -> str | None:
        """The planned peak bytes as a short sum of products of the class's dims (`sizeexpr.short_text`: every
        one at least 1 here), or None where it is longer than `limit` characters (None: any length)."""
        return sizeexpr.short_text(self.doc["memory"]["peak_bytes"], limit if limit is not None else 1 << 20,
                                   positive=list(self.hidden or self.cls))

    def least(self) -> dict[str, int]:
        """The program's dims at the class's least sizes (each hidden dim at its least, X = Q * Y made from it)."""
        d = {n: self.min.get(n, 2) if c in ("n", "32n") else int(c)
             for n, c in (self.hidden or self.cls).items()}
        for x, y, q in reversed(self.multiples):
            d[x] = d[q] * (d[y] if isinstance(y, str) else y)
        return {n: d[n] for n in self.cls}

    def class_dims(self, dims: dict[str, int], ranges: bool = True) -> tuple[dict[str, int] | None, str]:
        """The dims as the class's kernels name them (each hidden dim Q = X // Y added, X kept), or (None, why)
        where they are outside the class: the check `SymbolicPlan.class_dims` makes in memory (Y divides X, the
        dims of the class's kernels exactly of their class: a Q below 2 or a multiple of 32 is not), then each
        of them within the class's sizes (`min` .. `max`). Made before any size expression is evaluated."""
        d, bad = sizeexpr.with_quotients(self.multiples, {n: int(dims[n]) for n in self.cls})
        if bad is not None:
            x, y, _ = self.multiples[bad]
            return None, f"{x} = {d[x]} is not a multiple of {y}" + (f" = {d[y]}" if isinstance(y, str) else "")
        cls = self.hidden or self.cls
        got = dict(sizeexpr.size_class(list(cls), d))
        # (a hidden dim named with what it is: `C_D (= C // D)`)
        quotients = {q: f"{q} (= {x})" for q, x in sizeexpr.quotients(self.multiples).items()}
        for n, c in cls.items():
            if got[n] != c and (self.multiples or c != "n" or got[n] != "32n"):
                # (a plain class's "n" kernels serve multiples of 32 too; a narrowed class's exactly its class)
                want = " >= 2, no multiple of 32" if c == "n" else " a multiple of 32" if c == "32n" else f" = {c}"
                return None, f"{quotients.get(n, n)} = {d[n]} is outside its class ({n}{want})"
            if ranges and c in ("n", "32n") and not self.min[n] <= d[n] <= self.max[n]:
                return None, f"{quotients.get(n, n)} = {d[n]} is outside the class's sizes {self.min[n]}..{self.max[n]}"
        return d, ""

    def bind(self, pkg: Any, dev: Any, dims: dict[str, int]) -> Any:
        """The class's saved plan at these dims, as an `Executable`, by the one bind of a size class's plan
        (`tgc.engine.classbind.bind`, which a plan built in memory uses too): its size expressions evaluated
        (buffers, derived sizes, launch sizes, values, work), each kernel's fast variant (with a split's remainder
        kernels) where its launch checks hold, else its general kernel, the memory layout saved with it sized at
        the dims (each slot its largest buffer) and checked. Nothing is traced, scheduled, lowered or
        re-validated but what changes with the dims (`PackageError`, exit 2: a general kernel's check fails, a
        size out of range, a launch past its kernel's grid or the device's)."""
        import dataclasses

        from tgc.engine import classbind

        path, doc = pkg.path, self.doc
        at, why = self.class_dims(dims)  # (before any size expression is evaluated)
        if at is None:
            raise PackageError(f"{path}: at the sizes {', '.join(f'{n}={v}' for n, v in dims.items())}, {why}: "
                               f"this package's kernels do not serve these sizes ({self.text()})",
                               hint="compile a package for these sizes")
        dims = at

        def make_buffer(i: int, dtype: DType, shape: tuple, nbytes: int) -> PlanBuffer:
            b = doc["buffers"][i]
            return PlanBuffer(dtype, shape, i, nbytes, b["role"], b.get("name"))

        def make_kernel(tmpl: PackagedKernel, launch: dict, bufs: list, gs: tuple, vals: tuple, env: dict) -> Any:
            grid = tmpl.contract_grid
            if grid is not None and any(g > c for g, c in zip(gs, grid)):
                raise _bad(path, f"kernel {launch['name']}'s global size {list(gs)} is larger than the kernel's "
                                 f"{list(grid)}")
            if tmpl.device is not dev:
                tmpl.device, tmpl._program = dev, None
            return dataclasses.replace(
                tmpl, bufs=bufs, global_size=gs, vals=vals,
                flops=_size(launch["flops"], env, f"kernel {launch['name']} flops", path, 0, 1 << 62),
                bytes_moved=_size(launch["bytes"], env, f"kernel {launch['name']} bytes", path, 0, 1 << 62),
                _program=tmpl.program())  # (loaded once: every binding shares it)

        options = {"runner_object": pkg.graph_runner, "compile_runner": False} if dev.kind == "CPU" else None
        try:
            exe, self.chosen = classbind.bind(doc, self.templates, dev, dims, make_buffer, make_kernel,
                                              classbind.Layouts({}, False, self.slot_of, self.inplace),
                                              max_buffer=MAX_BUFFER, graph_options=options)
        except classbind.ClassBindError as e:
            if e.reason == "check":
                raise _unserved(path, dims, e.msg, e.kernel or 0, doc["kernels"][e.kernel or 0].get("name")) \
                    from None
            if e.reason in ("memory", "grid"):
                raise PackageError(f"{path}: {e.msg}", hint="compile a package for these sizes") from None
            raise _bad(path, e.msg) from None
        return exe


class SymbolicPackage:
    """A package of a program's kernels for every size of its size classes (`tgc compile FILE --package OUT`
    without -D): the dims come from the inputs' shapes at each run; the class's plan is instantiated at those
    dims (sizes, buffers and the memory plan are expressions of the dims) and run as a `Package` of those
    sizes, each kernel's fast variant where its launch checks hold there, else its general kernel."""

    symbolic = True
    MAX_SIZES = 4  # instantiations (with their launch plans and buffers) kept, for the sizes run last

    def __init__(self, manifest: dict, members: dict[str, bytes], path: str = "<bytes>"):
        m = _read_header(self, manifest, members, path)
        self.content_hash = m["content_hash"]
        self.format_version = int(m["format_version"])
        if _obj(m.get("dims"), "dims", path):
            raise _bad(path, "a symbolic package fixes no dims")
        sym = _obj(m.get("symbolic"), "symbolic", path)
        self.dims_names = [_name(n, "a dim name", path) for n in _list(sym.get("dims"), "symbolic.dims", path, 64)]
        if len(set(self.dims_names)) != len(self.dims_names):
            raise _bad(path, "a dim name appears twice")
        sig = _obj(m.get("signature"), "signature", path)
        self.inputs: list[PackageInput] = []
        for i, d in enumerate(_list(sig.get("inputs"), "signature.inputs", path, MAX_BUFFERS)):
            d = _obj(d, f"input {i}", path)
            exprs = _list(d.get("shape"), f"input {i} shape", path, MAX_RANK)
            for e in exprs:
                if e is not None:
                    try:
                        sizeexpr.validate(e, f"input {i} shape")
                    except TgcError as err:
                        raise _bad(path, err.msg) from None
            self.inputs.append(PackageInput(_name(d.get("name"), f"input {i} name", path),
                                            _dtype(d.get("dtype"), f"input {i}", path),
                                            [e if isinstance(e, (int, str)) else "?" for e in exprs], exprs, i))
        self.output_names = [_name(_obj(d, f"output {i}", path).get("name"), f"output {i} name", path)
                             for i, d in enumerate(_list(sig.get("outputs"), "signature.outputs", path,
                                                         MAX_BUFFERS))]
        self.classes: list[SizeClassPlan] = []
        for i, c in enumerate(_list(sym.get("classes"), "symbolic.classes", path, MAX_CLASSES)):
            c = _obj(c, f"class {i}", path)
            cls = _obj(c.get("class"), f"class {i}", path)
            if set(cls) != set(self.dims_names) or any(v not in ("n", "32n", "1") for v in cls.values()):
                raise _bad(path, f"class {i} is not a size class of the dims")
            cls = {n: cls[n] for n in self.dims_names}
            multiples, hidden = self._read_multiples(c, cls, i)
            lo = {n: _int(v, f"class {i} min", path, 2, MAX_DIM) for n, v in _obj(c.get("min"), "min", path).items()}
            hi = {n: _int(v, f"class {i} max", path, 2, MAX_DIM) for n, v in _obj(c.get("max"), "max", path).items()}
            want = {n for n, v in (hidden or cls).items() if v in ("n", "32n")}
            if set(lo) != want or set(hi) != want or any(lo[n] > hi[n] for n in want):
                raise _bad(path, f"class {i}'s size ranges do not match its dims")
            self.classes.append(SizeClassPlan(dict(cls), lo, hi, c, multiples, hidden))
        if not self.classes or len({(tuple(c.cls.values()), tuple(c.hidden.items())) for c in self.classes}) != \
                len(self.classes):  # (a narrowed class may be there once per hidden class)
            raise _bad(path, "its size classes are missing or repeated")
        self.skipped = []  # (the class as the dims' classes where it reads as one, else its text)
        for s in _list(sym.get("skipped", []), "symbolic.skipped", path, MAX_CLASSES):
            cls = _obj(s, "skipped", path).get("class")
            if isinstance(cls, dict) and set(cls) == set(self.dims_names) and \
                    all(v in ("n", "32n", "1") for v in cls.values()):
                cls = {n: cls[n] for n in self.dims_names}
            else:
                cls = str(cls)[:200]
            self.skipped.append({"class": cls, "why": str(s.get("why"))[:300]})
        runner = m.get("graph_runner")
        self._runner_doc = runner
        self._bound: dict[tuple, Any] = {}  # (device, dims) -> the executable bound there (the sizes run last)
        from tgc.engine.realize import LaunchPlans
        self._launch_plans = LaunchPlans(self.MAX_SIZES)
        # every class validated now (every member, every expression at the class's least sizes), both variants
        used: set[str] = set()
        pkg: Package | None = None
        for i, c in enumerate(self.classes):
            dims = {n: (c.min[n] if v == "n" else -(-c.min[n] // 32) * 32 if v == "32n" else 1)
                    for n, v in (c.hidden or c.cls).items()}
            if any(dims[n] > c.max[n] for n in c.max):
                raise _bad(path, f"class {i}'s size ranges hold no size")
            if c.multiples:  # (the least sizes of the program's dims: each X = Q * Y, checked as a bind checks)
                dims = {n: v + 1 if c.hidden[n] == "n" and v % 32 == 0 and v < c.max.get(n, 0) else v
                        for n, v in dims.items()}
                dims = self._program_dims(c, dims, f"class {i}'s least sizes")
            # at the probe sizes the kernels were built at, every buffer must hold what their launch contracts state
            if "probe" not in c.doc:  # (symbolic packages written before the probe was recorded)
                raise PackageError(f"{path}: not a usable package: class {i} does not record the sizes its kernels "
                                   "were built at, which are checked against their launch contracts",
                                   hint="compile the package again with this tgc")
            probe = _obj(c.doc.get("probe"), f"class {i} probe", path)
            probe = {n: _int(probe.get(n), f"class {i} probe {n}", path, 1, MAX_DIM)
                     for n in dict.fromkeys([*self.dims_names, *c.hidden])}
            if any(probe[n] != 1 if v == "1" else not 2 <= probe[n] <= c.max[n] or (v == "32n" and probe[n] % 32)
                   for n, v in (c.hidden or c.cls).items()) or \
                    (c.multiples and any(self._program_dims(c, probe, f"class {i}'s probe", ranges=False)[n] != v
                                         for n, v in probe.items())):
                raise _bad(path, f"class {i}'s probe sizes are not sizes of the class")
            self._check_split_fields(c, i)
            # every variant of every kernel validated as a package at the probe and the least sizes; the templates
            # `bind` launches are the validated kernels (`_instantiate` says which kernel each one is)
            c.templates = [{"general": None, "fast": None, "plain": None, "tails": [None] * len(k.get("tails", []))}
                           for k in c.doc["kernels"]]
            for pick in ("general", "fast", "plain"):
                self._instantiate(c, probe, pick, at_probe=True)
                pkg, which = self._instantiate(c, dims, pick, with_sources=True)
                used |= {k.binary_member for k in pkg.kernels} | {k.source_member for k in pkg.kernels}
                for k, (j, variant, t) in zip(pkg.kernels, which):
                    if variant == "tails":
                        c.templates[j]["tails"][t] = k
                    else:
                        c.templates[j][variant] = k
            for t in c.templates:
                for k in [t["general"], t["fast"], t["plain"], *t["tails"]]:
                    if k is not None:
                        contract = read_contract(k.src)
                        k.contract_grid = contract[1] if isinstance(contract, tuple) else None
            c.slot_of = [int(x) for x in c.doc["memory"]["slot_of"]]
            c.inplace = [(int(a), int(b)) for a, b in c.doc["memory"].get("inplace", [])]
        unused = set(members) - used - {RUNNER_MEMBER}
        if unused:
            raise _bad(path, f"member {sorted(unused)[0]} is used by no kernel")
        self.graph_runner = pkg.graph_runner if pkg is not None else None

    def _read_multiples(self, c: dict, cls: dict[str, str], i: int) -> tuple[list, dict]:
        """A narrowed class's multiples ([X, Y, Q]: X a dim or an earlier Q, Y one (not X) or an int of 2 or more,
        Q a new name) and the class of its kernels' dims (each X replaced by its Q); ([], {}) for a class of the
        program's dims. Without `hidden`, X, Y and Q are of class n (as written before hidden dims of class 32n);
        with it (`hidden`: the kernels' dims' classes), each Q and dim Y of class n or 32n and X of class 32n
        wherever Q or Y is, `hidden` exactly the classes the multiples make. Format 5 only: an older reader
        refuses the version (a reader without `hidden` refuses such a class: its X is of class 32n)."""
        path = self.path
        if "multiples" not in c:
            if "hidden" in c:
                raise _bad(path, f"class {i} has hidden dims but no multiples")
            return [], {}
        if self.format_version != SYMBOLIC_VERSION:
            raise _bad(path, f"class {i} is narrowed (multiples), which format version {self.format_version} has not")
        raw = _list(c.get("multiples"), f"class {i} multiples", path, 8)
        if not raw:
            raise _bad(path, f"class {i}'s multiples are empty")
        given = None
        if "hidden" in c:
            given = _obj(c.get("hidden"), f"class {i} hidden", path)
            if any(not isinstance(v, str) or v not in ("n", "32n", "1") for v in given.values()):
                raise _bad(path, f"class {i}'s hidden dims are not of size classes")
        wide = ("n", "32n") if given is not None else ("n",)
        parsed = []
        for m in raw:
            m = _list(m, f"class {i} multiple", path, 3)
            if len(m) != 3:
                raise _bad(path, f"class {i} has a malformed multiple")
            x, q = _name(m[0], "a multiple's dim", path), _name(m[2], "a hidden dim", path)
            y = m[1] if isinstance(m[1], int) and not isinstance(m[1], bool) else _name(m[1], "a divisor", path)
            parsed.append((m, x, y, q))
        # with `hidden`: every dim's class made from the last multiple back (`sizeexpr.made_classes`), so a middle
        # quotient (C_D of `C // D // KH`, replaced in `hidden` by C_D_KH) has the class its own multiple makes; a
        # leaf of another class than n or 32n is refused below (its multiple's Q or Y check, or `given != hidden`)
        made = sizeexpr.made_classes([(x, y, q) for _m, x, y, q in parsed], given) if given is not None else {}
        hidden, out = dict(cls), []
        for m, x, y, q in parsed:
            cq = made.get(q) if given is not None else hidden.get(x)
            if hidden.get(x) not in wide or cq not in wide or q in hidden or q in self.dims_names or \
                    (isinstance(y, int) and not 2 <= y <= MAX_DIM) or (isinstance(y, str) and
                                                                      (y == x or hidden.get(y) not in wide)) or \
                    (given is not None and made.get(x) != hidden.get(x)):
                raise _bad(path, f"class {i}'s multiple {str(m)[:80]} is not one of its dims")
            hidden = {(q if n == x else n): (cq if n == x else v) for n, v in hidden.items()}
            out.append((x, y, q))
        if given is not None and given != hidden:
            raise _bad(path, f"class {i}'s hidden dims are not the ones its multiples make")
        return out, hidden

    def _program_dims(self, c: SizeClassPlan, dims: dict[str, int], what: str, ranges: bool = True
                      ) -> dict[str, int]:
        """A narrowed class's dims (over its kernels' dims) with each X = Q * Y made (a Y that is itself
        made first), checked as a bind checks them (`class_dims`): the dims as a bind makes them."""
        d = {n: v for n, v in dims.items() if n in c.hidden}
        todo = list(c.multiples)
        while todo:
            ready = [m for m in todo if m[2] in d and (not isinstance(m[1], str) or m[1] in d)]
            if not ready:
                raise _bad(self.path, f"{what}: its multiples make no sizes of the program's dims")
            x, y, q = ready[-1]
            d[x] = d[q] * (d[y] if isinstance(y, str) else y)
            todo.remove(ready[-1])
        at, why = c.class_dims({n: d[n] for n in self.dims_names}, ranges)
        if at is None:
            raise _bad(self.path, f"{what} are outside the class: {why}")
        return at

    # --- the size classes
    def size_class(self, dims: dict[str, int]) -> SizeClassPlan:
        """The class holding these dims (`SizeClassPlan.class_dims`: a narrowed class's multiples checked);
        PackageError (exit 2) for sizes outside every packaged class, with a narrowed class's reason."""
        given = ", ".join(f"{n}={dims[n]}" for n in self.dims_names)
        held, whys = [], []
        for c in self.classes:
            at, why = c.class_dims(dims)
            if at is not None:
                held.append(c)
            elif all(dims[n] >= 2 if v == "n" else dims[n] % 32 == 0 if v == "32n" else dims[n] == int(v)
                     for n, v in c.cls.items()):
                whys.append((why, c))  # (a class of the dims: why not)
        if held:  # (a class of multiples of 32, where one holds them, before "n": its kernels assume them)
            return max(held, key=lambda c: sum(v == "32n" for v in c.cls.values()))
        # the reason first, then the class of these sizes (or every class, each in short, where none is theirs):
        # that of a class whose hidden dims' classes (and program dims' classes) the dims have first, a 32n
        # variant's (C // 12 = 32: T below its least size) before the narrowed class n whose rules they also fit
        n = len(self.classes)
        if whys:
            why, c = next((w for w in whys if self._dims_of_class(w[1], dims)), whys[0])
            where = f"their class: {c.text()}" + (f"; `tgc inspect` lists all {n}" if n > 1 else "")
        else:
            why = self._missing_class(dims)
            where = "; ".join(c.short() for c in self.classes)
        raise PackageError(f"{self.path}: {why}, so the sizes {given} are outside the size classes this package "
                           f"holds ({where})",
                           hint="compile a package for these sizes: tgc compile FILE "
                                + " ".join(f"-D {n}={dims[n]}" for n in self.dims_names) + " --package OUT")

    @staticmethod
    def _dims_of_class(c: SizeClassPlan, dims: dict[str, int]) -> bool:
        """Whether each of the dims (and of a narrowed class's hidden dims, made by its multiples) is of its
        class in `c`, whatever its ranges."""
        d, bad = sizeexpr.with_quotients(c.multiples, dims)
        return bad is None and all(dict(sizeexpr.size_class([n], d))[n] == v for n, v in (c.hidden or c.cls).items())

    def _missing_class(self, dims: dict[str, int]) -> str:
        """Why no class of the package is that of `dims`: a dim of 0, a class not packaged (and why), or left out
        of the classes tried (`_size_classes`)."""
        zero = [n for n in self.dims_names if dims[n] == 0]
        if zero:
            return f"{zero[0]} = 0 is in no size class (a symbolic package holds no empty dim)"
        theirs = {n: "1" if dims[n] == 1 else "n" for n in self.dims_names}
        text = sizeexpr.class_text(theirs.items())
        for s in self.skipped:
            if s["class"] == theirs:
                return f"their size class ({text}) was not packaged: {s['why']}"
        return f"their size class ({text}) is not one this package holds"

    def class_dims(self, c: SizeClassPlan, dims: dict[str, int]) -> dict[str, int]:
        """The dims as class `c`'s size expressions name them (`SizeClassPlan.class_dims`), or PackageError."""
        at, why = c.class_dims(dims)
        if at is None:
            raise PackageError(f"{self.path}: {why}: this package's kernels do not serve these sizes ({c.text()})",
                               hint="compile a package for these sizes")
        return at

    def infer_dims(self, arrays: dict[str, np.ndarray], dims: dict[str, int] | None = None) -> dict[str, int]:
        """The dims: given ones, then each input axis declared by a dim name gives its size."""
        out = dict(dims or {})
        for k in out:
            if k not in self.dims_names:
                raise TgcError(f"the package has no dim {k}",
                               hint="dims: " + (", ".join(self.dims_names) or "(none)"))
        for d in self.inputs:
            arr = arrays.get(d.name)
            if arr is None:
                continue
            if np.ndim(arr) != len(d.expr):
                shape = ", ".join(sizeexpr.text(e) if e is not None else "?" for e in d.expr)
                raise TgcError(f"input '{d.name}' has {np.ndim(arr)} dims {list(np.shape(arr))}, but the package "
                               f"declares it {d.dtype.name}[{shape}] with {len(d.expr)}", file=self.path)
            for axis, e in enumerate(d.expr):
                if isinstance(e, str) and e in self.dims_names:
                    have = int(np.shape(arr)[axis])
                    if out.setdefault(e, have) != have:
                        raise TgcError(f"input '{d.name}' axis {axis} has size {have}, but {e} = {out[e]}",
                                       file=self.path, hint=f"give arrays whose sizes agree on {e}")
        missing = [n for n in self.dims_names if n not in out]
        if missing:
            raise BindError(f"{unknown_dims(missing)}: no input's shape gives {'it' if len(missing) == 1 else 'them'}",
                            need="dim", name=missing[0], names=missing,
                            hint=f"give {'it' if len(missing) == 1 else 'them'} ({dim_flags(missing)})",
                            file=self.path)
        return out

    def _check_split_fields(self, c: SizeClassPlan, i: int) -> None:
        """A class's derived sizes, each kernel's launch checks and its `plain` and `tails` variants (format
        version 4: a version-2 class has none), their shapes checked before any is evaluated."""
        path, doc = self.path, c.doc
        derived = _obj(doc.get("derived", {}), f"class {i} derived", path)
        kernels = _list(doc.get("kernels"), "kernels", path, MAX_KERNELS)
        split = bool(derived) or any(isinstance(k, dict) and ("plain" in k or "tails" in k) for k in kernels)
        if split and self.format_version == OLD_SYMBOLIC_VERSION:
            raise _bad(path, f"class {i} has split kernels, which format version {OLD_SYMBOLIC_VERSION} has not")
        names = {*self.dims_names, *(q for _, _, q in c.multiples)}  # (a narrowed class's hidden dims too)
        for name, e in derived.items():
            if not isinstance(name, str) or not name.isidentifier() or name in names:
                raise _bad(path, f"class {i} has a derived size that is no name of its own")
            try:
                sizeexpr.validate(e, f"class {i} derived size {name}")
            except TgcError as err:
                raise _bad(path, err.msg) from None
            if not sizeexpr.names(e) <= names:
                raise _bad(path, f"class {i}'s derived size {name} is not an expression of the dims")
        for j, k in enumerate(kernels):
            k = _obj(k, f"kernel {j}", path)
            tails = _list(k.get("tails", []), f"kernel {j} tails", path, 8)
            if (tails or k.get("plain") is not None) and k.get("fast") is None:
                raise _bad(path, f"kernel {j} has remainder kernels or a plain variant but no fast variant")
            for v in [k, k.get("fast"), k.get("plain"), *tails]:
                if v is not None:
                    v = _obj(v, f"kernel {j} variant", path)
                    for check in _list(v.get("checks", []), f"kernel {j} checks", path, 64):
                        check = _list(check, f"kernel {j} check", path, 3)
                        if len(check) != 3 or check[0] not in ("divides", "at least", "at most"):
                            raise _bad(path, f"kernel {j} has a malformed launch check")
                        _int(check[2], f"kernel {j} check value", path, 1, 1 << 62)
                        try:
                            sizeexpr.validate(check[1], f"kernel {j} check")
                        except TgcError as err:
                            raise _bad(path, err.msg) from None
                    if v.get("skip_if_zero") is not None:
                        try:
                            sizeexpr.validate(v["skip_if_zero"], f"kernel {j} remainder")
                        except TgcError as err:
                            raise _bad(path, err.msg) from None

    def _instantiate(self, c: SizeClassPlan, dims: dict[str, int], pick: str = "auto", at_probe: bool = False,
                     with_sources: bool = False) -> Any:
        """The class's plan at these dims written out as a package of fixed sizes and validated as any package is
        (at load, and for `tgc inspect -D`). `pick`: "auto", the launches `bind` makes there (`classbind.choose`);
        "general", every general kernel; "fast" and "plain", that variant (with its tails) wherever a kernel has
        one, the general kernel elsewhere (to validate every variant). `with_sources`: also (kernel index,
        variant, tail index) per packaged kernel: (package, those)."""
        from tgc.engine import classbind

        doc, path = c.doc, self.path
        try:
            env = classbind.environment(doc, dims)
            if pick == "auto":
                launches = classbind.choose(doc, env)[0]
            else:
                launches = []
                for i, k in enumerate(_list(doc.get("kernels"), "kernels", path, MAX_KERNELS)):
                    k = _obj(k, f"kernel {i}", path)
                    why = classbind.failed_check(_list(k.get("checks", []), f"kernel {i} checks", path, 64), env)
                    if why is not None:
                        raise _unserved(path, dims, why, i, k.get("name"))
                    use = k.get(pick) if pick != "general" else None
                    if use is None:
                        launches.append((i, "general", -1, k))
                        continue
                    launches.append((i, pick, -1, _obj(use, f"kernel {i} {pick}", path)))
                    launches += [(i, "tails", j, _obj(t, f"kernel {i} tail", path))
                                 for j, t in enumerate(k.get("tails", []))]
        except classbind.ClassBindError as e:
            if e.reason == "check":
                raise _unserved(path, dims, e.msg, e.kernel or 0, doc["kernels"][e.kernel or 0].get("name")) from None
            raise _bad(path, e.msg) from None
        except (TypeError, KeyError, ValueError):
            raise _bad(path, "a launch check is malformed") from None
        kernels = [{key: v for key, v in use.items() if key not in ("fast", "checks", "plain", "tails",
                                                                   "skip_if_zero")}
                   for _, _, _, use in launches]
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "tgc_version": self.tgc_version,
                    "device": self.manifest["device"], "program": self.manifest.get("program"),
                    "dims": dict(env), "signature": doc.get("signature"), "buffers": doc.get("buffers"),
                    "kernels": kernels, "memory": doc.get("memory"), "files": self.manifest["files"],
                    "content_hash": self.content_hash}
        if self._runner_doc is not None:
            manifest["graph_runner"] = self._runner_doc
        pkg = Package(manifest, self._members, path, from_symbolic=True, contract_sizes=at_probe)
        for k, kd in zip(pkg.kernels, kernels):
            k.binary_member, k.source_member = kd["binary"], kd["source"]
        return (pkg, [(i, v, j) for i, v, j, _ in launches]) if with_sources else pkg

    def at(self, dims: dict[str, int], device: str | None = None) -> Any:
        """The package's saved plan bound to these dims (`bind_dims`): kept for the sizes run last."""
        return self.lower(device, dims)

    def lower(self, device: str | None = None, dims: dict[str, int] | None = None) -> Any:
        """The executable at these dims on a device (`tgc.engine.executable.Executable`): the class's saved plan
        bound to them (`SizeClassPlan.bind`), kept for the sizes run last (with their launch plans)."""
        dev = self.open_device(device)
        dims = {n: int((dims or {})[n]) for n in self.dims_names if n in (dims or {})}
        missing = [n for n in self.dims_names if n not in dims]
        if missing:
            raise BindError(f"{unknown_dims(missing)}: no input's shape gives {'it' if len(missing) == 1 else 'them'}",
                            need="dim", name=missing[0], names=missing,
                            hint=f"give {'it' if len(missing) == 1 else 'them'} ({dim_flags(missing)})",
                            file=self.path)
        key = (dev.name, tuple(dims[n] for n in self.dims_names))
        exe = self._bound.pop(key, None)
        if exe is None:
            exe = self.size_class(dims).bind(self, dev, dims)
        self._bound[key] = exe
        while len(self._bound) > self.MAX_SIZES:
            self._bound.pop(next(iter(self._bound)))
        return exe

    def _check_shapes(self, arrays: dict[str, np.ndarray], dims: dict[str, int]) -> None:
        """Every input's shape against its class's buffer at these dims (the words of a fixed-size package)."""
        c = self.size_class(dims)
        dims = self.class_dims(c, dims)
        for d in c.doc["signature"]["inputs"]:
            arr = arrays.get(d["name"])
            if arr is None:
                continue
            want = [sizeexpr.evaluate(e, dims) for e in d["shape"]]
            if arr.ndim != len(want):
                raise TgcError(f"input '{d['name']}' has {arr.ndim} dims {list(arr.shape)}, but the package "
                               f"declares it with {len(want)}", file=self.path)
            for axis, (w, have, e) in enumerate(zip(want, arr.shape, d["shape"])):
                if w != have:
                    named = f" ({sizeexpr.text(e)} = {w})" if not isinstance(e, int) else ""
                    raise TgcError(f"input '{d['name']}' axis {axis} has size {have}, but the package declares "
                                   f"{w}{named}", file=self.path,
                                   hint="the inputs' shapes must agree with their declarations at "
                                        + ", ".join(f"{n}={dims[n]}" for n in self.dims_names))

    # --- what the commands read, as from a Program or a Package
    @property
    def dim_names(self) -> list[str]:
        return list(self.dims_names)

    @property
    def dims(self) -> dict[str, int]:
        return {}

    @property
    def peak_bytes(self) -> None:
        return None

    def peak_text(self) -> str:
        """The planned peak memory of each class, as an expression of the dims."""
        return "; ".join(f"{c.text()}: {sizeexpr.text(c.doc['memory']['peak_bytes'])} bytes" for c in self.classes)

    @property
    def kernels(self) -> list:
        return [k for c in self.classes for k in c.doc["kernels"]]

    def resolve_dims(self, dims: dict[str, int] | None = None) -> dict[str, int]:
        return dict(dims or {})

    conform = Package.conform  # (the same signature checks)

    def bind(self, inputs: dict[str, Any], dims: dict[str, int] | None = None, cast: bool = False
             ) -> tuple[dict[str, int], dict[str, np.ndarray]]:
        check_input_names(inputs, [d.name for d in self.inputs], self.path)
        for decl in self.inputs:  # a missing input first: its shape is what gives the dims
            if decl.name not in inputs:
                shape = ", ".join(sizeexpr.text(e) if e is not None else "?" for e in decl.expr)
                raise BindError(f"missing input '{decl.name}' ({decl.dtype.name}[{shape}])", need="input",
                                name=decl.name, hint="pass an array for it", file=self.path)
        arrays = {n: self.conform(n, v, cast) for n, v in inputs.items()}
        dims = self.infer_dims(arrays, dims)
        self._check_shapes(arrays, dims)
        return dims, arrays

    def output_types(self, dims: dict[str, int] | None = None) -> list[tuple[str, DType, tuple[int, ...]]]:
        dims = self.infer_dims({}, dims)
        c = self.size_class(dims)
        dims = self.class_dims(c, dims)
        return [(d["name"], dtypes.by_name[d["dtype"]], tuple(sizeexpr.evaluate(e, dims) for e in d["shape"]))
                for d in c.doc["signature"]["outputs"]]

    open_device = Package.open_device  # (the same device and binary-target checks)

    def run(self, device: str | None = None, dims: dict[str, int] | None = None, cast: bool = False,
            inputs: dict[str, Any] | None = None, **kw_inputs: Any) -> dict[str, np.ndarray]:
        """Run at the sizes of the inputs (and `dims`), as `Package.run`: the saved plan bound to them."""
        from tgc.engine import executable

        self.open_device(device)  # a package for another device is refused before its inputs are read
        given = {**(inputs or {}), **kw_inputs}
        dims, arrays = self.bind(given, dims, cast=cast)
        low = self.lower(device, dims)
        low.device.ensure_runnable()
        key = (low.device.name, tuple(dims[n] for n in self.dims_names))
        return executable.run(low, arrays, replay=self._launch_plans, key=key)

    def bench(self, device: str | None = None, dims: dict[str, int] | None = None, repeat: int = 10,
              inputs: dict[str, np.ndarray] | None = None, warmup: int = 1, **kw: Any) -> dict[str, Any]:
        from tgc.engine import executable

        if inputs is None:  # random inputs at the dims given (every dim: else one clear error)
            from tgc.engine.inputs import random_values

            at = self.infer_dims({}, dims)
            c = self.size_class(at)
            sig, at = c.doc["signature"]["inputs"], self.class_dims(c, at)
            inputs = {d["name"]: random_values(dtypes.by_name[d["dtype"]],
                                               tuple(sizeexpr.evaluate(e, at) for e in d["shape"]), 0, i)
                      for i, d in enumerate(sig)}
        dims, arrays = self.bind(inputs, dims, cast=True)
        low = self.lower(device, dims)
        low.device.ensure_runnable()
        timing = executable.bench(low, arrays, repeat=repeat, warmup=warmup, measure_peak=False)
        return {"device": low.device.name, "dims": dims, "repeat": repeat, "beam": None, **timing,
                "identity": self.identity(low.device, dims)}

    def identity(self, device: Any, dims: dict[str, int]) -> dict[str, Any]:
        return Package.identity(self, device, dims)  # type: ignore[arg-type]

    def release(self) -> None:
        self._launch_plans.release()

    def describe(self, dims: dict[str, int] | None = None) -> dict[str, Any]:
        """What `tgc inspect --json` prints: the signature with symbolic shapes, each size class's kernels
        (general and fast variants with their launch checks) and its planned peak memory as an expression of
        the dims; with `dims`, `at` is the package of those sizes described (its peak in bytes)."""
        prog = self.manifest.get("program") if isinstance(self.manifest.get("program"), dict) else {}
        classes = []
        for c in self.classes:
            kernels = []
            for k in c.doc["kernels"]:
                fast = k.get("fast")
                kernels.append({"name": k["name"], "vals": k["vals"], "global_size": k["global_size"],
                                "checks": [_check_text(w, e, v) for w, e, v in k.get("checks", [])],
                                "fast": None if fast is None else {
                                    "global_size": fast["global_size"], "opts": fast.get("opts", []),
                                    "checks": [_check_text(w, e, v) for w, e, v in fast["checks"]],
                                    # a split's remainder kernels (launched with it) and its unthreaded form
                                    "tails": [{"name": t["name"], "vals": t["vals"]} for t in k.get("tails", [])],
                                    "plain": k.get("plain") is not None}})
            mem = c.doc["memory"]
            classes.append({"class": dict(c.cls), "sizes": c.text(), "min": dict(c.min), "max": dict(c.max),
                            "multiples": [list(m) for m in c.multiples],
                            "kernels": kernels, "derived": {n: sizeexpr.text(e) for n, e in
                                                            c.doc.get("derived", {}).items()},
                            "buffers": [{"index": i, "role": b["role"], "name": b["name"], "dtype": b["dtype"],
                                         "shape": [sizeexpr.text(e) for e in b["shape"]],
                                         "slot": mem["slot_of"][i]} for i, b in enumerate(c.doc["buffers"])],
                            "memory": {"peak_bytes": sizeexpr.text(mem["peak_bytes"]),
                                       "peak_short": c.peak_text(None),
                                       "slots": [sizeexpr.text(e) for e in mem["slots"]]}})
        doc: dict[str, Any] = {
            "path": self.path, "format": FORMAT, "format_version": self.format_version,
            "tgc_version": self.tgc_version, "content_hash": self.content_hash,
            "device": {"kind": self.device_kind, "name": self.device_name, "target": self.target,
                       "compiler": self.manifest["device"].get("compiler")},
            "program": {"file": prog.get("file"), "source_sha256": prog.get("source_sha256")},
            "dims": {}, "symbolic": True, "dim_names": list(self.dims_names),
            "graph_runner": self.graph_runner is not None,
            "inputs": [{"name": d.name, "dtype": d.dtype.name,
                        "declared": [sizeexpr.text(e) if e is not None else "?" for e in d.expr]}
                       for d in self.inputs],
            "outputs": [{"name": n} for n in self.output_names],
            "classes": classes,
            "skipped": [{**x, "sizes": x["class"] if isinstance(x["class"], str) else
                         sizeexpr.class_text(x["class"].items())} for x in self.skipped],
        }
        if dims:  # (inspect only: the class's plan written out as a fixed-size package at these dims, validated)
            dims = self.infer_dims({}, dims)
            c = self.size_class(dims)
            at = self._instantiate(c, self.class_dims(c, {n: dims[n] for n in self.dims_names})).describe()
            at["format_version"] = self.format_version  # (the file's: the in-memory plan is no format-1 package)
            doc["at"] = at
        return doc


def _derived_expr(kind: str, end: Any, m: int) -> Any:
    """A split's derived kernel argument (`tgc.codegen.sizes.Split.derived`) as a size expression: the main part
    of a loop of `end` iterations split by m, or its remainder; None where `end` is not expressible."""
    e = _uop_expr(end)
    if e is None:
        return None
    return (e // m * m if isinstance(e, int) else ["*", ["//", e, m], m]) if kind == "main" else \
        (e % m if isinstance(e, int) else ["%", e, m])


def class_doc(prog: Any, dev: Any, cls: tuple, plan: Any, member: Any = None) -> dict | str:
    """A size class's `SymbolicPlan` in size expressions (the form `tgc.engine.classbind` binds, see there), or
    why it has none. With `member` (a symbolic package being written: stores a blob, returns its member name) each
    launch carries its kernel's `binary` and `source`, flops and bytes as expressions where they are one product of
    dims, the class its `probe` and the memory layout decided at the representative size; every fast variant is
    run through the bounds verifier at the first probe and left out if flagged. Without (the plan in memory, bound
    by `SymbolicPlan.bind`), the launches name no member and count no work (a bound kernel counts its own), and the
    layout is left to `classbind.Layouts` (per set of launches, with in-place pairs)."""
    from tgc.codegen import sizes
    from tgc.codegen.kernel import symbolic_work
    from tgc.engine.memplan import plan_memory
    from tgc.ir.uop import Ops, UOp

    saving = member is not None
    decls = _declared_inputs(prog)  # (weights bound at load included: the slots' input indices count them)
    p1, p2 = sizes.probes(cls)
    rep = {n: sizes.REPRESENTATIVE[c] if c in sizes.SYMBOLIC else int(c) for n, c in cls}
    if plan.multiples:  # (a narrowed class, `cls` over its hidden dims: each X = Q * Y too, which a declared
        # input's shape may name)
        p1, p2, rep = ({**p, **prog._program_dims(p)} for p in (p1, p2, rep))
    sym = list(plan.symbolic)
    # the buffers: the plan's slots, then any declared input no kernel reads
    roles: dict[int, tuple[str, str | None]] = {}
    bufs: list[dict] = []
    for s in plan.slots:
        shape = [_mono_expr(m) for m in s.shape]
        bufs.append({"dtype": s.dtype.name, "shape": shape, "nbytes": _product_expr(shape, s.dtype.itemsize)})
    input_buf: dict[int, int] = {s.input: i for i, s in enumerate(plan.slots) if s.input is not None}
    for j, d in enumerate(decls):
        if j not in input_buf:  # (no kernel reads it: its declared shape, which must be expressible)
            shape = _decl_shape(d.shape, [None] * len(d.shape))
            if any(e is None for e in shape):
                return f"input {d.name} is read by no kernel and its shape is not expressible"
            input_buf[j] = len(bufs)
            bufs.append({"dtype": d.dtype.name, "shape": shape, "nbytes": _product_expr(shape, d.dtype.itemsize)})
        roles[input_buf[j]] = ("input", d.name)
    for name, j in zip(prog.output_names, plan.output_slots):
        if j in roles:
            return f"output {name} is an input or another output"
        roles[j] = ("output", name)
    for i, b in enumerate(bufs):
        b["role"], b["name"] = roles.get(i, ("temp", None))
    derived: dict[str, Any] = {}
    rests = set()
    for name, (kind, end, m) in plan.derived.items():
        derived[name] = _derived_expr(kind, end, m)
        if derived[name] is None:
            return f"the size {name} of a split kernel cannot be written as a size expression"
        if kind == "rest":
            rests.add(name)

    def slot_nodes(dims: dict[str, int]) -> list:
        return [UOp(Ops.BUFFER, s.dtype, (), (-1 - i, f"tmp{i}", tuple(sizes.mono_value(m, dims) for m in s.shape)))
                for i, s in enumerate(plan.slots)]

    nodes1, nodes2 = (slot_nodes(p1), slot_nodes(p2)) if saving else ([], [])

    def work(k: Any, idx: list[int]) -> tuple[Any, Any]:
        """(flops, bytes) of a launch as expressions of the dims where they are one product of dims, else 0."""
        if not saving or not set(k.var_names) <= set(prog.dim_names) | set(p1):
            return 0, 0
        out = []
        for a, b in zip(symbolic_work(k, p1, [nodes1[i] for i in idx]),
                        symbolic_work(k, p2, [nodes2[i] for i in idx])):
            m = sizes.factor(int(a), p1, sym)
            out.append(_mono_expr(m) if sizes.mono_value(m, p2) == b else 0)
        return out[0], out[1]

    def in_bounds(k: Any) -> bool:
        """Whether the bounds verifier (tgc/codegen/verify.py) finds every access of a fast variant inside its
        buffers at the first probe's sizes (its buffers' and, where the launch checks allow, its dims'): a package
        ships no variant it flags."""
        from tgc.codegen import verify
        from tgc.codegen.kernel import launch_allows
        if not saving:
            return True
        at = sizes.derived_values(plan.derived, p1) if plan.derived else p1
        if not launch_allows(k, at):
            return True  # (not verifiable at the probe; the launch checks guard it as they do for `run`)
        try:
            verify.verify_kernel(k.name, k.uops, k.bufs, {"global_size": k.global_size, "local_size": k.local_size,
                                                         "vals": tuple(at[n] for n in k.var_names)})
        except TgcError:
            return False
        return True

    def launch_doc(k: Any, ks: list[int], item_bufs: list) -> dict | None:
        """A kernel's launch in size expressions; None where one of its sizes or checks has none."""
        idx = [ks[next(i for i, b in enumerate(item_bufs) if b is kb)] for kb in k.bufs]
        gs: list[Any] = [int(x) for x in k.global_size]
        if k.grid is not None:  # a GPU kernel's work-groups, expressions of its dim variables
            gs = [_uop_expr(g) for g in k.grid]
        checks = [[what, _uop_expr(expr), int(v)] for what, expr, v in k.checks]
        if any(g is None for g in gs) or any(c[1] is None for c in checks):
            return None
        flops, nbytes = work(k, idx)
        doc = {"name": k.name, "bufs": idx, "global_size": gs,
               "local_size": [int(x) for x in k.local_size] if k.local_size else None,
               "vals": list(k.var_names), "flops": flops, "bytes": nbytes, "line": k.line,
               "opts": [str(o) for o in k.opts], "checks": checks, "_kernel": k}
        empty = [n for n in k.var_names if n in rests]
        if empty:
            doc["skip_if_zero"] = _product_expr(empty, 1)
        return doc

    kernels = []
    for i, (general, fast, tails, ks, item_bufs) in enumerate(zip(plan.kernels, plan.fast, plan.tails,
                                                                 plan.kernel_slots, plan.item_bufs)):
        doc = launch_doc(general, ks, item_bufs)
        if doc is None:
            return f"kernel {general.name}'s sizes or launch checks cannot be written as size expressions"
        doc["fast"] = doc["plain"] = None
        doc["tails"] = []
        plain = plan.unthreaded[i] if i < len(plan.unthreaded) else None
        variants = [launch_doc(v, ks, item_bufs) if v is not None and v.binary is not None else None
                    for v in [fast, plain, *tails]]
        if fast is not None and variants[0] is not None and all(v is not None for v in variants[2:]) and \
                all(in_bounds(v["_kernel"]) for v in [variants[0], *variants[2:]]) and \
                (not saving or all(set(v["bufs"]) <= set(doc["bufs"]) for v in variants if v is not None)):
            doc["fast"], doc["tails"] = variants[0], variants[2:]
            if variants[1] is not None and in_bounds(plain):
                doc["plain"] = variants[1]
        kernels.append(doc)
    sig_in = [{"name": d.name, "dtype": d.dtype.name, "buffer": input_buf[j],
               "shape": _decl_shape(d.shape, bufs[input_buf[j]]["shape"])} for j, d in enumerate(decls)]
    for d in sig_in:
        if any(e is None for e in d["shape"]):  # a declaration this format cannot spell: the buffer's sizes
            d["shape"] = bufs[d["buffer"]]["shape"]
    sig_out = [{"name": name, "dtype": bufs[j]["dtype"], "shape": bufs[j]["shape"], "buffer": j}
               for name, j in zip(prog.output_names, plan.output_slots)]
    out = {"class": dict(cls), "signature": {"inputs": sig_in, "outputs": sig_out}, "buffers": bufs,
           "kernels": kernels}
    if derived:
        out["derived"] = derived
    if saving:
        # the memory plan: which buffers share an allocation (decided at the representative size; safe at every
        # size: an allocation is as large as its largest buffer there, an expression of the dims)
        used = [d["bufs"] for d in kernels]
        inputs = [input_buf[j] for j in range(len(decls))]
        rep_bytes = {i: max(sizeexpr.evaluate(b["nbytes"], rep), 1) for i, b in enumerate(bufs)}
        mp = plan_memory(used, rep_bytes, inputs, list(plan.output_slots), share=dev.allocator.features.shared_slots)
        sharing: list[list[Any]] = [[] for _ in mp.slots]
        slot_of = [-1] * len(bufs)
        for i, s in mp.slot_of.items():
            slot_of[i] = s
            sharing[s].append(bufs[i]["nbytes"])
        # (one shallow expression however many buffers share a slot or the plan has: `sizeexpr.combine`)
        slot_exprs: list[Any] = [sizeexpr.combine("max", es) if es else None for es in sharing]
        # (a buffer empty at every size of the class, `y: f32[N // 2]` at N = 1, still takes a byte: as the
        # allocator allocates it, and as the loader checks a slot)
        slot_exprs = [max(e, 1) if isinstance(e, int) else ["max", e, 1] if sizeexpr.evaluate(e, p1) < 1 else e
                      for e in slot_exprs]
        peak: Any = sizeexpr.combine("+", slot_exprs) if slot_exprs else 0
        out["probe"] = {n: int(v) for n, v in p1.items()}
        out["memory"] = {"slots": slot_exprs, "slot_of": slot_of, "peak_bytes": peak}
    # every launch names its kernel's binary and source (stored now that the class is kept), or its kernel
    for doc in kernels:
        for launch in [doc, doc["fast"], doc["plain"], *doc["tails"]]:
            if launch is None:
                continue
            k = launch.pop("_kernel")
            if saving:
                launch["binary"], launch["source"] = member(bytes(k.binary)), member(k.src.encode())
            else:
                launch["kernel"] = k
        if doc["plain"] is None:
            del doc["plain"]
        if not doc["tails"]:
            del doc["tails"]
        if not doc["checks"] and saving:
            del doc["checks"]
    return out
