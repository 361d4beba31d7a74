"""ONNX ModelProto -> `.tg` source + weights.

Every ONNX value becomes a `.tg` name (the ONNX name where it is a valid, free identifier, else a sanitized
one: `gpu_0/data_0` -> `gpu_0_data_0`; the map is kept for inputs and outputs, which users address by their
ONNX names). Graph inputs that are not initializers are the program's inputs; initializers, and constants the
program needs as tensors, are weight inputs bound at load (`Translation.weights`). Values known at load time
(initializers, `Constant`, and shape arithmetic on them: `Shape`, `Gather` of a shape, `Concat`, ...) are
folded with numpy, so `Reshape`/`Slice`/`Pad` see their static arguments. Output types and shapes come from
ONNX's shape inference; `dim_param` dims of the inputs are `.tg` dims.

The op table is `tgc.onnx.ops.OPS`: one function per op type, `(cx, node, inputs, attrs, opset) -> outputs`.
"""

from __future__ import annotations

import keyword
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tgc.dsl.functions import FUNCTIONS
from tgc.dtype import DType, dtypes
from tgc.errors import TgcError

MIN_OPSET = 7  # numpy broadcasting for binary ops starts here

# ONNX TensorProto element types -> tgc dtypes (the others: strings, complex, float8, int4 are not supported)
_ONNX_DTYPES = {1: dtypes.f32, 2: dtypes.u8, 3: dtypes.i8, 4: dtypes.u16, 5: dtypes.i16, 6: dtypes.i32,
                7: dtypes.i64, 9: dtypes.bool, 10: dtypes.f16, 11: dtypes.f64, 12: dtypes.u32, 13: dtypes.u64,
                16: dtypes.bf16}

_ONNX_OF = {dt: code for code, dt in _ONNX_DTYPES.items()}
_NP_TO_TGC = {dt.np.str[1:]: dt for dt in _ONNX_DTYPES.values() if dt != dtypes.bf16}

_RESERVED = set(FUNCTIONS) | {d.name for d in dtypes.all} | set(keyword.kwlist) | {
    "range", "float", "int", "bool", "True", "False", "None", "inf", "nan", "len", "print"}


def onnx_dtype(elem_type: int, what: str) -> DType:
    if elem_type not in _ONNX_DTYPES:
        import onnx

        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() \
            else str(elem_type)
        raise TgcError(f"{what} has ONNX type {name}, which tgc does not support",
                       hint="supported: float, double, float16, bfloat16, bool and the integer types")
    return _ONNX_DTYPES[elem_type]


class NeedStatic(TgcError):
    """An input whose value decides a shape (Reshape's shape, Slice's starts, ...) is a graph input, not a
    constant: tgc compiles for static shapes. `name` is the ONNX input."""

    def __init__(self, msg: str, name: str, **kw: Any):
        super().__init__(msg, **kw)
        self.name = name


@dataclass
class Value:
    """One ONNX value: its `.tg` expression (a name), dtype, shape (ints and dim names; None where unknown) and,
    when known at load time, its numpy value."""

    name: str
    dtype: DType
    shape: tuple | None
    expr: str | None = None
    const: np.ndarray | None = None

    @property
    def rank(self) -> int:
        if self.shape is None:
            raise TgcError(f"the shape of '{self.name}' is unknown (ONNX shape inference gave none)")
        return len(self.shape)


@dataclass
class Translation:
    source: str
    weights: dict[str, np.ndarray]
    inputs: dict[str, str]  # ONNX name -> .tg name (the model's real inputs, in order)
    outputs: dict[str, str]  # ONNX name -> .tg name
    dims: dict[str, str] = field(default_factory=dict)  # ONNX dim_param -> .tg dim name
    opset: int = 0
    ops: list[str] = field(default_factory=list)


def read_model(path: str) -> Any:
    """Load and check an ONNX file (`onnx.load`, `onnx.checker`); a clear TgcError when it is not a model."""
    import onnx
    from google.protobuf.message import DecodeError

    if not os.path.exists(path):
        raise TgcError(f"no such file: {path}")
    try:
        model = onnx.load(path)
    except (DecodeError, ValueError, RuntimeError, TypeError, UnicodeDecodeError) as e:
        raise TgcError(f"{path} is not an ONNX model: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                       hint="tgc reads .onnx model files (ModelProto) and .tg programs") from None
    except OSError as e:
        raise TgcError(f"cannot read {path}: {e}") from None
    if not model.HasField("graph") or model.ir_version == 0:
        raise TgcError(f"{path} is not an ONNX model: it holds no graph and no IR version",
                       hint="tgc reads .onnx model files (ModelProto) and .tg programs")
    check(model, path)
    return model


def check(model: Any, where: str) -> None:
    import onnx

    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TgcError(f"{where}: the ONNX checker rejects the model: {first}") from None


def opset_of(model: Any) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    domains = ", ".join(sorted({imp.domain for imp in model.opset_import})) or "none"
    raise TgcError(f"the model imports no ai.onnx opset (domains: {domains}): tgc supports the ai.onnx domain only")


def supported_ops() -> set[str]:
    from tgc.onnx.ops import OPS

    return set(OPS)


def inspect_model(model: Any) -> dict[str, Any]:
    """What `tgc inspect model.onnx` prints: opset, inputs, outputs, ops used and the ones tgc lacks."""
    g = model.graph
    inits = {t.name for t in g.initializer}

    def io(v: Any) -> dict[str, Any]:
        tt = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
        dt = _ONNX_DTYPES.get(tt.elem_type)
        return {"name": v.name, "dtype": dt.name if dt else str(tt.elem_type), "shape": shape}

    used: dict[str, int] = {}
    for n in _all_nodes(g):
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        used[key] = used.get(key, 0) + 1
    have = supported_ops()
    return {"opset": opset_of(model), "ir_version": model.ir_version, "producer": model.producer_name,
            "inputs": [io(v) for v in g.input if v.name not in inits], "outputs": [io(v) for v in g.output],
            "weights": len(g.initializer),
            "weight_bytes": int(sum(_tensor_nbytes(t) for t in g.initializer)),
            "ops": dict(sorted(used.items())), "missing": sorted(k for k in used if k not in have)}


def _tensor_nbytes(t: Any) -> int:
    n = math.prod(t.dims) if len(t.dims) else 1
    dt = _ONNX_DTYPES.get(t.data_type)
    return n * (dt.itemsize if dt else 0)


def _all_nodes(g: Any) -> list:
    out = []
    for n in g.node:
        out.append(n)
        for a in n.attribute:
            if a.type == a.GRAPH:
                out += _all_nodes(a.g)
    return out


class Names:
    """`.tg` identifiers for ONNX names: the name itself where it is a free identifier, else a sanitized one."""

    def __init__(self) -> None:
        self.used: set[str] = set(_RESERVED)

    def new(self, onnx_name: str, prefix: str = "v") -> str:
        base = re.sub(r"\W", "_", onnx_name).strip("_") or prefix
        if base[0].isdigit():
            base = f"{prefix}_{base}"
        name, i = base, 1
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name


def _literal(v: Any, dtype: DType) -> str | None:
    """A `.tg` literal for one scalar, or None where none is exact (nan, inf, huge ints)."""
    if dtype == dtypes.bool:
        return "True" if bool(v) else "False"
    if dtype.name.startswith(("i", "u")):
        iv = int(v)
        return str(iv) if -(2 ** 31) <= iv < 2 ** 31 else None
    fv = float(v)
    if not math.isfinite(fv):
        return None
    r = repr(fv)
    return r if ("." in r or "e" in r) else r + ".0"


def shape_text(shape: Sequence) -> str:
    parts = [str(s) for s in shape]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


class Ctx:
    """The translation state an op function works with: emit lines, make temporaries, read static values."""

    def __init__(self, opset: int, types: dict[str, tuple[DType, tuple | None]], dims: dict[str, str]):
        self.opset = opset
        self.types = types
        self.dims = dims  # ONNX dim_param -> .tg dim name
        self.names = Names()
        self.lines: list[str] = []
        self.weights: dict[str, np.ndarray] = {}
        self.decls: list[str] = []
        self.values: dict[str, Value] = {}
        self.node: Any = None
        self.out_names: dict[str, str] = {}  # graph outputs not yet computed -> their reserved .tg names

    # --- errors
    def where(self) -> str:
        n = self.node
        return f"node '{n.name or n.output[0]}' ({n.op_type}, opset {self.opset})" if n is not None else "the graph"

    def unsupported(self, what: str) -> TgcError:
        n = self.node
        return TgcError(f"unsupported: {what} in {self.where()}",
                        hint=f"tgc supports {n.op_type} without it" if n is not None else None)

    # --- emitting
    def let(self, expr: str, hint: str = "t") -> str:
        name = self.names.new(hint, "t")
        self.lines.append(f"{name} = {expr}")
        return name

    def weight(self, arr: np.ndarray, dtype: DType, hint: str = "w") -> str:
        name = self.names.new(hint, "w")
        arr = np.ascontiguousarray(arr)
        if dtype == dtypes.bf16 and arr.dtype != np.uint16:
            arr = _bf16_bits(arr)
        elif dtype != dtypes.bf16:
            arr = arr.astype(dtype.np, copy=False)
        self.weights[name] = arr
        dims = ", ".join(str(s) for s in arr.shape)
        self.decls.append(f"{name}: {dtype.name}[{dims}]" if arr.ndim else f"{name}: {dtype.name}")
        return name

    def tensor(self, v: Value, literal_for: Value | None = None) -> str:
        """`v` as a `.tg` expression; a constant becomes a weight (a scalar may stay a literal when the other
        operand `literal_for` is a tensor of its dtype, so its type is that operand's)."""
        if v.expr is not None:
            return v.expr
        assert v.const is not None
        if (literal_for is not None and v.const.ndim == 0 and literal_for.const is None
                and literal_for.dtype == v.dtype):
            lit = _literal(v.const.item() if v.dtype != dtypes.bf16 else 0.0, v.dtype)
            if lit is not None and v.dtype != dtypes.bf16:
                return lit if not lit.startswith("-") else f"({lit})"
        v.expr = self.weight(v.const, v.dtype, v.name)
        return v.expr

    def static(self, v: Value | None, what: str) -> np.ndarray | None:
        """The load-time value of an input that decides shapes (None for an absent optional input)."""
        if v is None:
            return None
        if v.const is None:
            raise NeedStatic(f"{what} ('{v.name}') of {self.where()} must be a constant (an initializer): tgc "
                             "compiles for static shapes", v.name,
                             hint="make it an initializer or a Constant node, or fold the shape computation")
        return v.const

    def dim(self, d: Any) -> str:
        return str(d)


def _bf16_bits(arr: np.ndarray) -> np.ndarray:
    f = np.asarray(arr, np.float32)
    bits = f.view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _to_array(t: Any) -> tuple[np.ndarray, DType]:
    from onnx import numpy_helper

    dt = onnx_dtype(t.data_type, f"tensor '{t.name}'")
    arr = numpy_helper.to_array(t)
    if dt == dtypes.bf16:
        arr = np.asarray(arr).view(np.uint16) if arr.dtype.itemsize == 2 else _bf16_bits(arr)
    else:
        arr = np.asarray(arr).astype(dt.np, copy=False)
    return arr, dt


def _type_of(vi: Any, dims: dict[str, str]) -> tuple[DType, tuple | None] | None:
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if tt is None or tt.elem_type not in _ONNX_DTYPES:
        return None
    if not tt.HasField("shape"):
        return _ONNX_DTYPES[tt.elem_type], None
    shape: list = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            shape.append(int(d.dim_value))
        elif d.dim_param and d.dim_param in dims:
            shape.append(dims[d.dim_param])
        else:
            return _ONNX_DTYPES[tt.elem_type], None
    return _ONNX_DTYPES[tt.elem_type], tuple(shape)


def translate(model: Any, where: str = "<model>") -> Translation:
    """A checked ModelProto -> `Translation` (source, weights, name maps)."""
    import onnx

    from tgc.onnx.ops import OPS

    opset = opset_of(model)
    if opset < MIN_OPSET:
        raise TgcError(f"{where}: opset {opset} is older than tgc supports (opset {MIN_OPSET} and later)",
                       hint="convert it with onnx.version_converter.convert_version")
    for imp in model.opset_import:
        if imp.domain not in ("", "ai.onnx") and any(n.domain == imp.domain for n in model.graph.node):
            bad = next(n for n in model.graph.node if n.domain == imp.domain)
            raise TgcError(f"unsupported: op '{imp.domain}.{bad.op_type}' (node '{bad.name or bad.output[0]}', "
                           f"domain {imp.domain} opset {imp.version}): tgc supports the ai.onnx domain only")
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    names = Names()
    dims: dict[str, str] = {}
    real_inputs = [v for v in g.input if v.name not in inits]
    for v in real_inputs:
        tt = v.type.tensor_type
        for d in tt.shape.dim:
            if not d.HasField("dim_value") and d.dim_param and d.dim_param not in dims:
                dims[d.dim_param] = names.new(d.dim_param, "D")
    # shape inference for the types of every value
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - a model inference cannot handle still translates where shapes are known
        inferred = model
    types: dict[str, tuple[DType, tuple | None]] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]:
        t = _type_of(vi, dims)
        if t is not None and (vi.name not in types or types[vi.name][1] is None):
            types[vi.name] = t
    cx = Ctx(opset, types, dims)
    cx.names = names
    out_names = {o.name: names.new(o.name, "y") for o in g.output if o.name not in {v.name for v in g.input}}
    cx.out_names = dict(out_names)
    tr_inputs: dict[str, str] = {}
    for v in real_inputs:
        tt = v.type.tensor_type
        if not v.type.HasField("tensor_type"):
            raise TgcError(f"input '{v.name}' is not a tensor: tgc takes tensor inputs only")
        dt = onnx_dtype(tt.elem_type, f"input '{v.name}'")
        shape = []
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
            elif d.dim_param:
                shape.append(dims[d.dim_param])
            else:
                key = f"{v.name}_dim{i}"
                dims[key] = names.new(key.upper(), "D")
                shape.append(dims[key])
        tg = names.new(v.name, "x")
        tr_inputs[v.name] = tg
        cx.decls.append(f"{tg}: {dt.name}[{', '.join(map(str, shape))}]" if shape else f"{tg}: {dt.name}")
        cx.values[v.name] = Value(v.name, dt, tuple(shape), expr=tg)
    for name, t in inits.items():
        arr, dt = _to_array(t)
        cx.values[name] = Value(name, dt, tuple(arr.shape), const=arr)
    ops_used: list[str] = []
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    for node in g.node:
        cx.node = node
        if node.op_type not in ops_used:
            ops_used.append(node.op_type)
        fn = OPS.get(node.op_type)
        if fn is None:
            raise TgcError(f"unsupported op '{node.op_type}' (node '{node.name or node.output[0]}', opset {opset})",
                           hint="`tgc inspect MODEL.onnx` lists every op the model uses and the ones tgc lacks")
        ins = [cx.values[i] if i else None for i in node.input]
        for i, name in enumerate(node.input):
            if name and name not in cx.values:
                raise TgcError(f"{cx.where()}: input '{name}' is not produced by any node (subgraph values "
                               "are not supported)")
        attrs = {a.name: _attr(a, cx) for a in node.attribute}
        outs = _fold(cx, node, ins, opset)
        if outs is None:
            try:
                outs = fn(cx, node, ins, attrs, opset)
            except TgcError:
                raise
            except (TypeError, KeyError, IndexError, ValueError, AttributeError, ZeroDivisionError) as e:
                # an input of unknown shape, an attribute combination the op function does not handle
                raise TgcError(f"cannot translate {cx.where()}: {type(e).__name__}: {e}",
                               hint="an op's inputs may need shapes that ONNX shape inference did not give") from None
        for i, out_name in enumerate(node.output):
            if not out_name or out_name not in used:  # (an output nothing reads, as Dropout's mask)
                continue
            if i >= len(outs) or outs[i] is None:
                raise cx.unsupported(f"output {i} ('{out_name}')")
            cx.values[out_name] = _bind_output(cx, out_name, outs[i])
    tr_outputs: dict[str, str] = {}
    rets = []
    for o in g.output:
        v = cx.values.get(o.name)
        if v is None:
            raise TgcError(f"output '{o.name}' is not produced by any node")
        tg = out_names.get(o.name) or names.new(o.name, "y")
        expr = cx.tensor(v)
        if expr != tg:
            cx.lines.append(f"{tg} = {expr}")
        tr_outputs[o.name] = tg
        rets.append(tg)
    head = [f"# translated by tgc from ONNX: {where} (opset {opset}, {len(g.node)} nodes)"]
    renamed = [(k, v) for k, v in [*tr_inputs.items(), *tr_outputs.items()] if k != v]
    for k, v in renamed:
        head.append(f"# onnx-name: {v} = {k}")
    source = "\n".join([*head, *cx.decls, *cx.lines, "return " + ", ".join(rets)]) + "\n"
    return Translation(source, cx.weights, tr_inputs, tr_outputs, dims, opset, ops_used)


def _probe(cx: Ctx, expr: str, out_name: str) -> tuple[DType, tuple]:
    """The dtype and shape of `expr` where ONNX's shape inference gave none (inside expanded functions, say):
    the program so far is traced by the front end (without dims: a model with symbolic dims needs inference)."""
    from tgc.dsl.frontend import parse, trace
    from tgc.ir.shapes import shape_of

    if cx.dims:
        raise TgcError(f"the type of '{out_name}' from {cx.where()} is unknown (ONNX shape inference gave none)")
    source = "\n".join([*cx.decls, *cx.lines, f"probe_value_ = {expr}", "return probe_value_"]) + "\n"
    try:
        outs, _ = trace(parse(source, "<onnx>"), {})
    except TgcError as e:
        raise TgcError(f"cannot translate {cx.where()}: {e.msg}") from None
    return outs[0].dtype, tuple(shape_of(outs[0]))


FOLD_LIMIT = 1 << 16
_FOLDS_ITSELF = {"Constant", "ConstantOfShape", "Shape", "Size", "Identity", "Cast", "Reshape", "Unsqueeze",
                 "Squeeze", "Flatten", "Concat", "Gather", "Transpose", "Slice"}  # (ops.py computes these directly)  # elements: constants up to this size are computed at load time


def _fold(cx: Ctx, node: Any, ins: list, opset: int) -> list | None:
    """A node whose inputs are all known at load time (shape arithmetic, small constants), computed now by
    ONNX's reference evaluator, the way any compiler folds constants; None where it does not apply."""
    present = [v for v in ins if v is not None]
    if not present or any(v.const is None or v.const.size > FOLD_LIMIT or v.dtype == dtypes.bf16 for v in present):
        return None
    if node.op_type in _FOLDS_ITSELF or node.op_type.startswith("Random") or any(a.type in (a.GRAPH, a.GRAPHS) for a in node.attribute):
        return None
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"i{i}" if v is not None else "" for i, v in enumerate(ins)]
    one = helper.make_node(node.op_type, names, [f"o{i}" for i in range(len(node.output))], domain=node.domain)
    one.attribute.extend(node.attribute)
    g = helper.make_graph([one], "fold", [helper.make_tensor_value_info(n, _ONNX_OF[v.dtype], list(v.const.shape))
                                          for n, v in zip(names, ins) if v is not None],
                          [helper.make_tensor_value_info(f"o{i}", onnx.TensorProto.UNDEFINED, None)
                           for i in range(len(node.output))])
    try:
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        res = ReferenceEvaluator(model).run(None, {n: v.const for n, v in zip(names, ins) if v is not None})
    except Exception:  # noqa: BLE001 - the op function translates it instead (and says what is wrong)
        return None
    outs = []
    for name, arr in zip(node.output, res):
        arr = np.asarray(arr)
        dt = _NP_TO_TGC.get(arr.dtype.str[1:])
        if dt is None or arr.size > FOLD_LIMIT:
            return None
        outs.append(Value(name, dt, tuple(arr.shape), const=arr))
    return outs


def _bind_output(cx: Ctx, out_name: str, out: Any) -> Value:
    if isinstance(out, Value):
        if out.name != out_name:
            out = Value(out_name, out.dtype, out.shape, out.expr, out.const)
        return out
    dt, shape = cx.types.get(out_name, (None, None))
    if dt is None or shape is None:
        dt, shape = _probe(cx, out, out_name)
    name = cx.out_names.pop(out_name, None) or cx.names.new(out_name, "t")
    cx.lines.append(f"{name} = {out}")
    return Value(out_name, dt, shape, expr=name)


def _attr(a: Any, cx: Ctx) -> Any:
    from onnx import helper

    if a.type == a.TENSOR:
        arr, dt = _to_array(a.t)
        return Value("attr", dt, tuple(arr.shape), const=arr)
    if a.type in (a.GRAPH, a.GRAPHS):
        return a  # the op decides (If/Loop/Scan are not supported)
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode("utf-8", "replace") for s in v]
    return v
