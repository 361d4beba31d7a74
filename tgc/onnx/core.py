"""The translation state the ONNX op functions share: `Value` (one ONNX value), `Ctx` (emit lines, make
weights, read load-time values), the dtype map, and `.tg` naming and literal helpers."""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
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


class NeedDims(TgcError):
    """A node needs the value of a symbolic dim (an ONNX `dim_param`) as a number: a shape computed from the
    inputs' sizes (Shape -> Gather -> ... -> Slice's ends, TopK's k, Range's limit, Resize's sizes, an unrolled
    recurrence) that the one symbolic `.tg` program cannot express. The model is translated per size instead,
    once the dims are known (`tgc.staged.StagedModel`, one stage); its symbolic path (`--symbolic`, symbolic
    packages) is refused with this message. `dims`: the dim_params of the model's inputs."""

    def __init__(self, msg: str, dims: list[str], **kw: Any):
        super().__init__(msg, **kw)
        self.dims = dims


class NeedHost(TgcError):
    """A node whose output shape depends on input values (NonZero, Unique, NonMaxSuppression) has inputs that are
    not known at load. The model cannot be one static `.tg` program: `tgc.staged.StagedModel` runs it in stages
    (the graph before the node as a tgc program, the node on the host, the rest with its outputs as constants).
    `index`: the top-level graph node being translated when it was raised (set by `translate`)."""

    def __init__(self, msg: str, op: str, **kw: Any):
        super().__init__(msg, **kw)
        self.op = op
        self.index = -1


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
        # (subgraph, input values) -> its output values: one pass through an If branch or a Loop/Scan step
        self.run_body: Any = None
        # small integer values known as size expressions of the dims (`tgc.onnx.symshapes`): value -> (rank,
        # its elements as ints and .tg texts), for the ops whose k, repeats or limit come from the inputs' sizes
        self.size_values: dict[str, tuple[int, list]] = {}
        self.producers: dict[str, list[str]] = {}  # ONNX value -> the values it is computed from (not via Shape)
        # the program so far as the front end traced it, for types ONNX did not give (`translate._probe`):
        # .tg name -> tensor, the input BUFFERs, and how many of `decls` and `lines` it has taken in
        self.traced: dict[str, Any] = {}
        self.traced_inputs: list[Any] = []
        self.traced_upto = (0, 0)

    # --- errors
    def where(self) -> str:
        n = self.node
        return f"node '{n.name or n.output[0]}' ({n.op_type}, opset {self.opset})" if n is not None else "the graph"

    def need_dims(self, what: str) -> NeedDims:
        """`what` in this node needs a symbolic dim's value (see NeedDims)."""
        return NeedDims(f"{self.where()} needs {what} as a number, but the model's inputs have symbolic sizes "
                        f"({', '.join(self.dims)})", list(self.dims))

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
        arr = np.require(arr, requirements="C")  # (ascontiguousarray would make a 0-d array 1-d)
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
        known = self.size_values.get(v.name) if v.const is None else None
        if known is not None and all(isinstance(e, (int, bool)) for e in known[1]):
            # computed from the inputs' fixed sizes only (Shape(x)[1] where axis 1 is not symbolic): a number
            return np.array(known[1], v.dtype.np).reshape(() if known[0] == 0 else (-1,))
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


