"""The ONNX op table: `OPS[op_type](cx, node, inputs, attrs, opset) -> [output, ...]`.

An output is a `.tg` expression (a string; its type and shape are ONNX shape inference's) or a `Value` (a
constant folded at load time, or a value with its type known). Inputs are `Value`s (None for an absent optional
input). An attribute or mode tgc does not support raises `cx.unsupported(...)`, which names the op, the node and
the opset. To add an op: write one function and add it to `OPS` (the NN library's functions plug in here).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tgc.dtype import DType, bf16_to_f32, dtypes, f32_to_bf16
from tgc.onnx.core import Ctx, Value, _literal, onnx_dtype, shape_text

OpFn = Callable[[Ctx, Any, list, dict, int], list]
OPS: dict[str, OpFn] = {}


def op(*names: str) -> Callable[[OpFn], OpFn]:
    def deco(fn: OpFn) -> OpFn:
        for n in names:
            OPS[n] = fn
        return fn
    return deco


def _is_float(dt: DType) -> bool:
    return dt.name.startswith(("f", "bf"))


def _is_int(dt: DType) -> bool:
    return dt.name.startswith(("i", "u"))


def _out_type(cx: Ctx, node: Any, i: int = 0) -> tuple[DType | None, tuple | None]:
    return cx.types.get(node.output[i], (None, None))


def _out_shape(cx: Ctx, node: Any, i: int = 0) -> tuple:
    shape = _out_type(cx, node, i)[1]
    if shape is None:
        raise cx.unsupported(f"an output of unknown shape ('{node.output[i]}')")
    return shape


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _ints(v: Any) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


def _sized_by_dims(cx: Ctx, node: Any, v: Value | None) -> tuple | None:
    """The output shape of a node whose shape argument `v` is computed at run time from the inputs' symbolic
    sizes (Shape -> Gather -> Concat -> ...), where ONNX's shape inference (with data propagation) gave it in
    the model's dims and constants: the node then translates with that shape, a `.tg` size expression, and
    the program stays symbolic. None where `v` is a constant or the shape is not known so."""
    if v is None or v.const is not None or not cx.dims:
        return None
    return _out_type(cx, node)[1]


def _size_value(cx: Ctx, v: Value | None) -> list | None:
    """The elements of a small integer value computed from the inputs' symbolic sizes, as `.tg` size texts and
    ints (`Ctx.size_values`), where the value is not a constant and its output shapes are typed; else None."""
    if v is None or v.const is not None or v.name not in cx.size_values:
        return None
    return cx.size_values[v.name][1]


def _all_const(ins: list) -> bool:
    return all(v is None or v.const is not None for v in ins) and any(v is not None for v in ins)


def _const(arr: Any, dt: DType, name: str = "c") -> Value:
    a = np.asarray(arr)
    if dt != dtypes.bf16:
        a = a.astype(dt.np)
    return Value(name, dt, tuple(a.shape), const=a)


def _num(x: float, dt: DType) -> str:
    lit = _literal(x, dt)
    if lit is None:
        if _is_float(dt):  # (the DSL's names `nan` and `inf`: numbers, as `full` takes; the translation's names
            # never shadow them)
            return "nan" if math.isnan(x) else "inf" if x > 0 else "(-inf)"
        return str(int(x))
    return lit if not lit.startswith("-") else f"({lit})"


def _cast(expr: str, dt: DType) -> str:
    """`expr` in dtype `dt`: floats keep their dtype through tgc's ops (weak literals included), so only an
    integer, bool or f16/bf16 result is cast back (tgc's `sum` of i8 gives i32, ONNX's keeps i8; some functions
    compute f16 in f32)."""
    return expr if dt in (dtypes.f32, dtypes.f64) else f"cast({expr}, {dt.name})"


def _wide(expr: str, dt: DType) -> str:
    """An f16/bf16 operand of a product-sum (MatMul, Gemm, Conv) in f32: its products and their sum are then
    rounded once, at the op's result, as ONNX's reference and onnxruntime compute them (tgc would otherwise
    multiply in f16 and round every product before its f32 accumulation)."""
    return f"cast({expr}, f32)" if dt in (dtypes.f16, dtypes.bf16) else expr


# --- elementwise -------------------------------------------------------------------------------------------------

# Stable forms of the functions whose plain formulas overflow or cancel where the result is ordinary. Above
# 2**28, sqrt(x*x +- 1) is |x| to f64's precision (and x*x overflows f32 from 1.8e19): log(|x|) + ln 2. Above
# |x| = 20, exp(-|x|) is below f64's precision next to exp(|x|): exp(|x| / 2) squared (no overflow of exp(|x|)
# where the halved result is still finite). Small |x| use log1p/expm1 (no cancellation of 1 + tiny).
_LN2 = "0.6931471805599453"
_SOFTPLUS = "(maximum({0}, 0) + log1p(exp(-abs({0}))))"
_ASINH_ABS = (f"where(abs({{0}}) > 268435456.0, log(abs({{0}})) + {_LN2}, "
              "log1p(abs({0}) + {0} * {0} / (1 + sqrt({0} * {0} + 1))))")
_ACOSH = f"where({{0}} > 268435456.0, log({{0}}) + {_LN2}, log1p(({{0}} - 1) + sqrt(({{0}} - 1) * ({{0}} + 1))))"
_HALF_EXP_SQ = "(exp(abs({0}) * 0.5) * (exp(abs({0}) * 0.5) * 0.5))"
_SINH_ABS = (f"where(abs({{0}}) > 20, {_HALF_EXP_SQ}, "
             "(expm1(abs({0})) + expm1(abs({0})) / (expm1(abs({0})) + 1)) * 0.5)")
_COSH = f"where(abs({{0}}) > 20, {_HALF_EXP_SQ}, (exp(abs({{0}})) + exp(-abs({{0}}))) * 0.5)"
# Mish: tanh(softplus(x)) = n / (n + 2) with n = e^x (e^x + 2), no cancellation for small e^x (tanh's does)
_MISH = "where({0} > 20, {0}, {0} * (exp({0}) * (exp({0}) + 2)) / (exp({0}) * (exp({0}) + 2) + 2))"

_UNARY = {"Abs": "abs({})", "Neg": "(-{})", "Exp": "exp({})", "Log": "log({})", "Sqrt": "sqrt({})",
          "Sin": "sin({})", "Cos": "cos({})", "Tan": "tan({})", "Tanh": "tanh({})", "Sigmoid": "sigmoid({})",
          "Relu": "relu({})", "Floor": "floor({})", "Ceil": "ceil({})", "Sign": "sign({})", "Erf": "erf({})",
          "Reciprocal": "recip({})", "Atan": "atan({})", "IsNaN": "isnan({})", "Not": "(~{})",
          "BitwiseNot": "(~{})", "Softsign": "({0} / (1 + abs({0})))", "Identity": "{}",
          "Sinh": "where({0} < 0, -{S}, {S})".replace("{S}", _SINH_ABS), "Cosh": _COSH,
          "Asinh": "where({0} < 0, -{A}, {A})".replace("{A}", _ASINH_ABS), "Acosh": _ACOSH,
          "Atanh": "(0.5 * (log1p({0}) - log1p(-{0})))",
          "Asin": "atan2({0}, sqrt((1 - {0}) * (1 + {0})))", "Acos": "atan2(sqrt((1 - {0}) * (1 + {0})), {0})",
          "Round": "round({})", "Softplus": _SOFTPLUS, "Mish": _MISH}
# computed in f32 for an f16/bf16 input (rounded once at the end), as onnxruntime: their intermediate values
# (exp, x * x) leave f16's range long before their results do
_UNARY_IN_F32 = {"Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Softplus", "Mish"}

_NP_UNARY = {"Abs": np.abs, "Neg": np.negative, "Sqrt": np.sqrt, "Floor": np.floor, "Ceil": np.ceil,
             "Identity": lambda x: x, "Not": np.logical_not, "Sign": np.sign, "Reciprocal": np.reciprocal}


def _unary(cx: Ctx, node: Any, ins: list, at: dict, opset: int) -> list:
    x = ins[0]
    if x.const is not None and node.op_type in _NP_UNARY and x.const.size <= 4096:
        return [_const(_NP_UNARY[node.op_type](x.const), x.dtype, node.output[0])]
    if node.op_type in ("Identity",) and x.const is None:
        return [Value(node.output[0], x.dtype, x.shape, expr=x.expr)]
    e = cx.tensor(x)
    if node.op_type in _UNARY_IN_F32 and x.dtype in (dtypes.f16, dtypes.bf16):
        e = cx.let(_wide(e, x.dtype), "wide")
    out = _UNARY[node.op_type].format(e)
    if node.op_type == "Round" and _is_float(x.dtype):  # numpy's round: half to even
        out = f"round({e})"
    if node.op_type == "Abs" and x.dtype.name.startswith("u"):
        out = e
    if node.op_type == "Identity":
        return [out]
    return [_cast(out, x.dtype) if node.op_type not in ("IsNaN", "Not", "BitwiseNot") else out]


for _n in _UNARY:
    OPS[_n] = _unary


@op("IsInf")
def _isinf(cx, node, ins, at, opset):
    e = cx.tensor(ins[0])
    pos, neg = at.get("detect_positive", 1), at.get("detect_negative", 1)
    if pos and neg:
        return [f"isinf({e})"]
    if pos:
        return [f"(isinf({e}) & ({e} > 0))"]
    if neg:
        return [f"(isinf({e}) & ({e} < 0))"]
    return [f"({e} != {e}) & ({e} == {e})"]


_BINARY = {"Add": "+", "Sub": "-", "Mul": "*", "And": "&", "Or": "|", "Xor": "^", "BitwiseAnd": "&",
           "BitwiseOr": "|", "BitwiseXor": "^", "Equal": "==", "Less": "<", "LessOrEqual": "<=",
           "Greater": ">", "GreaterOrEqual": ">="}
_NP_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Equal": np.equal, "Less": np.less,
              "Greater": np.greater, "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal}


def _operands(cx: Ctx, a: Value, b: Value) -> tuple[str, str]:
    return cx.tensor(a, literal_for=b), cx.tensor(b, literal_for=a)


@op(*_BINARY)
def _binary(cx, node, ins, at, opset):
    a, b = ins
    t = node.op_type
    if a.const is not None and b.const is not None and t in _NP_BINARY and max(a.const.size, b.const.size) <= 4096:
        r = _NP_BINARY[t](a.const, b.const)
        return [_const(r, dtypes.bool if r.dtype == bool else a.dtype, node.output[0])]
    ea, eb = _operands(cx, a, b)
    e = f"({ea} {_BINARY[t]} {eb})"
    if t in ("Add", "Sub", "Mul") and a.dtype != dtypes.bool:
        e = _cast(e, a.dtype)  # i8 + i8 stays i8 (literal promotion aside)
    return [e]


@op("Div")
def _div(cx, node, ins, at, opset):
    a, b = ins
    if a.const is not None and b.const is not None and max(a.const.size, b.const.size) <= 4096:
        if _is_int(a.dtype):
            q = np.trunc(a.const.astype(np.float64) / np.where(b.const == 0, 1, b.const))
            return [_const(q, a.dtype, node.output[0])]
        return [_const(a.const / b.const, a.dtype, node.output[0])]
    ea, eb = _operands(cx, a, b)
    if _is_int(a.dtype):  # C division: truncate toward zero
        q = cx.let(f"({ea} // {eb})", "q")
        fix = f"cast((({ea} % {eb}) != 0) & (({ea} < 0) != ({eb} < 0)), {a.dtype.name})"
        return [_cast(f"({q} + {fix})", a.dtype)]
    return [_cast(f"({ea} / {eb})", a.dtype)]


@op("Mod")
def _mod(cx, node, ins, at, opset):
    a, b = ins
    ea, eb = _operands(cx, a, b)
    if at.get("fmod", 0):  # C fmod: the sign of the dividend
        if _is_float(a.dtype):
            # the language's float `%` is exact (the ALU's fmod moved to the divisor's sign); on |x| and |y| it
            # moves nothing, so it is fmod(|x|, |y|) exactly (nan for y = 0 or x = +-inf, |x| for y = +-inf),
            # which takes the sign of x (a zero x keeps its own: x - m is -0 for x = -0)
            m = cx.let(f"(abs({ea}) % abs({eb}))", "m")
            return [_cast(f"where({ea} < 0, -{m}, where({ea} == 0, {ea} - {m}, {m}))", a.dtype)]
        r = cx.let(f"({ea} % {eb})", "r")
        return [_cast(f"where(({r} != 0) & (({ea} < 0) != ({eb} < 0)), {r} - {eb}, {r})", a.dtype)]
    return [_cast(f"({ea} % {eb})", a.dtype)]  # floats: the language's exact `%` (numpy's mod)


@op("Pow")
def _pow(cx, node, ins, at, opset):
    a, b = ins
    ea = cx.tensor(a)
    if b.const is not None and b.const.ndim == 0 and float(b.const) == 2.0:
        return [_cast(f"({ea} * {ea})", a.dtype)]
    eb = cx.tensor(b)
    if _is_int(a.dtype) and _is_int(b.dtype):  # the language's exact integer power (square and multiply), in
        return [f"pow({ea}, cast({eb}, {a.dtype.name}))"]  # a's type: 10**18 and 3**39 exact (f64's were not)
    if _is_int(a.dtype):
        return [_cast(f"round(pow(cast({ea}, f64), cast({eb}, f64)))", a.dtype)]  # (exp/log's 728.99 is 729)
    return [_cast(f"pow({ea}, cast({eb}, {a.dtype.name}))", a.dtype)]


@op("BitShift")
def _bitshift(cx, node, ins, at, opset):
    a, b = ins
    ea, eb = _operands(cx, a, b)
    return [f"({ea} {'<<' if at['direction'] == 'LEFT' else '>>'} {eb})"]


@op("Max", "Min", "Sum", "Mean")
def _variadic(cx, node, ins, at, opset):
    vals = [v for v in ins if v is not None]
    dt = vals[0].dtype
    fn = {"Max": "maximum", "Min": "minimum"}.get(node.op_type)
    acc = cx.tensor(vals[0])
    for v in vals[1:]:
        e = cx.tensor(v)
        acc = f"{fn}({acc}, {e})" if fn else f"({acc} + {e})"  # maximum/minimum propagate nan (numpy's)
    if node.op_type == "Mean":
        acc = f"({acc} / {len(vals)})"
    return [_cast(acc, dt)]


@op("Where")
def _where(cx, node, ins, at, opset):
    c, a, b = ins
    return [_cast(f"where({cx.tensor(c)}, {cx.tensor(a, literal_for=b)}, {cx.tensor(b, literal_for=a)})", a.dtype)]


@op("Clip")
def _clip(cx, node, ins, at, opset):
    x = ins[0]
    e = cx.tensor(x)
    if opset < 11:
        lo, hi = at.get("min"), at.get("max")
        lo_e = _num(lo, x.dtype) if lo is not None else None
        hi_e = _num(hi, x.dtype) if hi is not None else None
    else:
        lo_v = ins[1] if len(ins) > 1 else None
        hi_v = ins[2] if len(ins) > 2 else None
        lo_e = cx.tensor(lo_v, literal_for=x) if lo_v is not None else None
        hi_e = cx.tensor(hi_v, literal_for=x) if hi_v is not None else None
    if lo_e is not None:
        e = f"where({e} < {lo_e}, {lo_e}, {e})"
    if hi_e is not None:
        e = f"where({e} > {hi_e}, {hi_e}, {e})"
    return [_cast(e, x.dtype)]


def _float_unary(fmt: str, defaults: dict[str, float]) -> OpFn:
    def fn(cx, node, ins, at, opset):
        x = ins[0]
        e = cx.tensor(x)
        vals = {k: _num(float(at.get(k, d)), x.dtype) for k, d in defaults.items()}
        return [_cast(fmt.format(x=e, **vals), x.dtype)]
    return fn


OPS["LeakyRelu"] = _float_unary("where({x} < 0, {x} * {alpha}, {x})", {"alpha": 0.01})
OPS["Elu"] = _float_unary("where({x} < 0, {alpha} * (exp({x}) - 1), {x})", {"alpha": 1.0})
OPS["Selu"] = _float_unary("where({x} <= 0, {gamma} * ({alpha} * exp({x}) - {alpha}), {gamma} * {x})",
                           {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875})
OPS["Celu"] = _float_unary("(maximum({x}, 0) + minimum(0, {alpha} * (exp({x} / {alpha}) - 1)))", {"alpha": 1.0})
OPS["HardSigmoid"] = _float_unary("maximum(0, minimum(1, {alpha} * {x} + {beta}))", {"alpha": 0.2, "beta": 0.5})
OPS["HardSwish"] = _float_unary("({x} * maximum(0, minimum(1, {x} / 6 + 0.5)))", {})
OPS["ThresholdedRelu"] = _float_unary("where({x} > {alpha}, {x}, 0)", {"alpha": 1.0})
OPS["Shrink"] = _float_unary("where({x} < -{lambd}, {x} + {bias}, where({x} > {lambd}, {x} - {bias}, 0))",
                             {"lambd": 0.5, "bias": 0.0})


@op("Gelu")
def _gelu(cx, node, ins, at, opset):
    x = ins[0]
    approx = at.get("approximate", "none")
    return [_cast(f"gelu({cx.tensor(x)}, approximate=\"{approx}\")", x.dtype)]


@op("PRelu")
def _prelu(cx, node, ins, at, opset):
    x, s = ins
    e, se = cx.tensor(x), cx.tensor(s, literal_for=x)
    return [_cast(f"where({e} < 0, {e} * {se}, {e})", x.dtype)]


@op("Cast")
def _cast_op(cx, node, ins, at, opset):
    x = ins[0]
    to = onnx_dtype(at["to"], f"Cast's target in {cx.where()}")
    if x.const is not None and x.const.size <= 4096 and to != dtypes.bf16 and x.dtype != dtypes.bf16:
        return [_const(x.const.astype(to.np), to, node.output[0])]
    return [f"cast({cx.tensor(x)}, {to.name})"]


@op("CastLike")
def _castlike(cx, node, ins, at, opset):
    return [f"cast({cx.tensor(ins[0])}, {ins[1].dtype.name})"]


@op("Dropout")
def _dropout(cx, node, ins, at, opset):
    x = ins[0]
    mode = ins[2] if len(ins) > 2 and ins[2] is not None else None
    ratio = ins[1] if len(ins) > 1 and ins[1] is not None else None
    if mode is not None and bool(np.asarray(cx.static(mode, "training_mode")).reshape(-1)[0]):
        # training mode drops at random: only a ratio of 0 (keep everything, as inference does) is supported
        r = cx.static(ratio, "the ratio") if ratio is not None else np.array(0.5)
        if float(np.asarray(r).reshape(-1)[0]) != 0.0:
            raise cx.unsupported("training mode")
    outs: list = [Value(node.output[0], x.dtype, x.shape, expr=cx.tensor(x))]
    if len(node.output) > 1 and node.output[1]:
        outs.append(f"full({shape_text(x.shape)}, True, dtype=bool)")
    return outs


# --- matrices ----------------------------------------------------------------------------------------------------

@op("MatMul")
def _matmul(cx, node, ins, at, opset):
    a, b = ins
    if a.dtype in (dtypes.f16, dtypes.bf16):
        return [_cast(f"({_wide(cx.tensor(a), a.dtype)} @ {_wide(cx.tensor(b), b.dtype)})", a.dtype)]
    return [f"({cx.tensor(a)} @ {cx.tensor(b)})"]


@op("Gemm")
def _gemm(cx, node, ins, at, opset):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    ea, eb = _wide(cx.tensor(a), a.dtype), _wide(cx.tensor(b), b.dtype)
    if at.get("transA", 0):
        ea = f"{ea}.T"
    if at.get("transB", 0):
        eb = f"{eb}.T"
    e = f"({ea} @ {eb})"
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    if alpha != 1.0:
        e = f"({e} * {_num(alpha, a.dtype)})"
    if c is not None:
        ec = _wide(cx.tensor(c), c.dtype)
        e = f"({e} + {ec})" if beta == 1.0 else f"({e} + {ec} * {_num(beta, a.dtype)})"
    return [_cast(e, a.dtype)]


@op("Einsum")
def _einsum(cx, node, ins, at, opset):
    eq = at["equation"].replace(" ", "")
    return [_cast(f"einsum(\"{eq}\", {', '.join(cx.tensor(v) for v in ins)})", ins[0].dtype)]


# --- shapes ------------------------------------------------------------------------------------------------------

@op("Shape")
def _shape(cx, node, ins, at, opset):
    x = ins[0]
    shape = list(x.shape) if x.shape is not None else None
    if shape is None:
        raise cx.unsupported("Shape of a value of unknown shape")
    start, end = at.get("start", 0), at.get("end", len(shape))
    part = shape[slice(start, end)]
    if all(isinstance(s, int) for s in part):
        return [_const(np.array(part, np.int64), dtypes.i64, node.output[0])]
    items = ", ".join(f"full((1,), {s}, dtype=i64)" for s in part)
    return [f"cat({items}, axis=0)"]


@op("Size")
def _size(cx, node, ins, at, opset):
    shape = ins[0].shape
    if shape is not None and all(isinstance(s, int) for s in shape):
        return [_const(np.array(math.prod(shape), np.int64), dtypes.i64, node.output[0])]
    return [f"full((), {' * '.join(str(s) for s in shape)}, dtype=i64)"]


@op("Constant")
def _constant(cx, node, ins, at, opset):
    if "value" in at:
        v = at["value"]
        return [Value(node.output[0], v.dtype, v.shape, const=v.const)]
    for k, dt in (("value_float", dtypes.f32), ("value_int", dtypes.i64)):
        if k in at:
            return [_const(np.array(at[k]), dt, node.output[0])]
    for k, dt in (("value_floats", dtypes.f32), ("value_ints", dtypes.i64)):
        if k in at:
            return [_const(np.array(at[k]), dt, node.output[0])]
    raise cx.unsupported(f"attribute {', '.join(at)}")


@op("ConstantOfShape")
def _constant_of_shape(cx, node, ins, at, opset):
    sized = _sized_by_dims(cx, node, ins[0])
    shape = list(sized) if sized is not None else _ints(cx.static(ins[0], "the shape"))
    v = at.get("value")
    dt, val = (v.dtype, v.const.reshape(-1)[0]) if v is not None else (dtypes.f32, 0.0)
    if sized is None and math.prod(shape) <= 4096 and dt != dtypes.bf16:
        return [_const(np.full(shape, val, dt.np), dt, node.output[0])]
    return [Value(node.output[0], dt, tuple(shape), expr=cx.let(
        f"full({shape_text(shape)}, {_num(val, dt)}, dtype={dt.name})", node.output[0]))]


def _reshape_to(cx: Ctx, x: Value, shape: tuple, name: str) -> Value | str:
    if x.const is not None and x.const.size <= 4096 and all(isinstance(s, int) for s in shape):
        return _const(x.const.reshape(shape), x.dtype, name)
    if x.shape == tuple(shape):
        return Value(name, x.dtype, x.shape, expr=cx.tensor(x))
    return f"reshape({cx.tensor(x)}, {shape_text(shape)})"


def _reshape_target(cx: Ctx, node: Any, x: Value, want: list[int], allowzero: bool) -> tuple:
    inferred = _out_type(cx, node)[1]
    if inferred is not None:
        return inferred
    shape = list(want)
    for i, s in enumerate(shape):
        if s == 0 and not allowzero:
            shape[i] = x.shape[i]
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = math.prod(x.shape) // known if known else 0
    return tuple(shape)


@op("Reshape")
def _reshape(cx, node, ins, at, opset):
    x = ins[0]
    if opset < 5:
        want = at["shape"]
    else:
        sized = _sized_by_dims(cx, node, ins[1])
        if sized is not None:
            return [_reshape_to(cx, x, sized, node.output[0])]
        want = _ints(cx.static(ins[1], "the shape"))
    return [_reshape_to(cx, x, _reshape_target(cx, node, x, want, bool(at.get("allowzero", 0))), node.output[0])]


@op("Flatten")
def _flatten(cx, node, ins, at, opset):
    x = ins[0]
    r = x.rank
    ax = _axis(at.get("axis", 1), r)
    shape = _out_type(cx, node)[1] or (math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))
    return [_reshape_to(cx, x, shape, node.output[0])]


def _axes_arg(cx: Ctx, ins: list, at: dict, opset: int, since: int) -> list[int] | None:
    if opset >= since:
        v = ins[1] if len(ins) > 1 else None
        return _ints(cx.static(v, "the axes")) if v is not None else None
    return list(at["axes"]) if "axes" in at else None


@op("Squeeze")
def _squeeze(cx, node, ins, at, opset):
    x = ins[0]
    axes = _axes_arg(cx, ins, at, opset, 13)
    r = x.rank
    if axes is None and any(not isinstance(s, int) for s in x.shape):  # (which axes are 1 is decided by the sizes)
        raise cx.need_dims("each axis's size (a Squeeze without axes drops those of size 1)")
    axes = [_axis(a, r) for a in axes] if axes is not None else [i for i, s in enumerate(x.shape) if s == 1]
    shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
    return [_reshape_to(cx, x, shape, node.output[0])]


@op("Unsqueeze")
def _unsqueeze(cx, node, ins, at, opset):
    x = ins[0]
    axes = _axes_arg(cx, ins, at, opset, 13)
    r = x.rank + len(axes)
    axes = sorted(_axis(a, r) for a in axes)
    shape, it = [], iter(x.shape)
    for i in range(r):
        shape.append(1 if i in axes else next(it))
    return [_reshape_to(cx, x, tuple(shape), node.output[0])]


@op("Transpose")
def _transpose(cx, node, ins, at, opset):
    x = ins[0]
    perm = at.get("perm", list(range(x.rank))[::-1])
    if x.const is not None and x.const.size <= 4096:
        return [_const(np.transpose(x.const, perm), x.dtype, node.output[0])]
    return [f"permute({cx.tensor(x)}, {shape_text(perm)})"]


@op("Concat")
def _concat(cx, node, ins, at, opset):
    vals = [v for v in ins if v is not None]
    ax = _axis(at["axis"], vals[0].rank)
    if all(v.const is not None for v in vals) and sum(v.const.size for v in vals) <= 4096:
        return [_const(np.concatenate([v.const for v in vals], ax), vals[0].dtype, node.output[0])]
    vals = [v for v in vals if v.shape is None or v.shape[ax] != 0]
    if len(vals) == 1:
        return [_cast(cx.tensor(vals[0]), vals[0].dtype)]
    return [f"cat({', '.join(cx.tensor(v) for v in vals)}, axis={ax})"]


def _slice_text(start: int, stop: int | None, step: int) -> str:
    s = f"{start}:{'' if stop is None else stop}"
    return s + (f":{step}" if step != 1 else "")


@op("Slice")
def _slice(cx, node, ins, at, opset):
    x = ins[0]
    r = x.rank
    if opset < 10:
        starts, ends = at["starts"], at["ends"]
        axes = at.get("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = _ints(cx.static(ins[1], "the starts"))
        ends = _ints(cx.static(ins[2], "the ends"))
        axes = _ints(cx.static(ins[3], "the axes")) if len(ins) > 3 and ins[3] is not None else \
            list(range(len(starts)))
        steps = _ints(cx.static(ins[4], "the steps")) if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    idx = [":"] * r
    np_idx: list = [slice(None)] * r
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax = _axis(ax, r)
        dim = x.shape[ax]
        if not isinstance(dim, int):
            raise cx.need_dims(f"the size of axis {ax} ('{dim}')")
        st = st + dim if st < 0 else st
        en = en + dim if en < 0 else en
        if sp > 0:
            st, en = min(max(st, 0), dim), min(max(en, 0), dim)
            stop: int | None = en
        else:
            st, en = min(max(st, 0), dim - 1), min(max(en, -1), dim - 1)
            stop = en if en >= 0 else None
        idx[ax] = _slice_text(st, stop, sp)
        np_idx[ax] = slice(st, stop, sp)
    if x.const is not None and x.const.size <= 4096:
        return [_const(x.const[tuple(np_idx)], x.dtype, node.output[0])]
    shape = _out_type(cx, node)[1]
    if shape is not None and 0 in shape:
        return [f"zeros({shape_text(shape)}, dtype={x.dtype.name})"]
    return [f"{cx.tensor(x)}[{', '.join(idx)}]"]


@op("Split")
def _split(cx, node, ins, at, opset):
    x = ins[0]
    r = x.rank
    ax = _axis(at.get("axis", 0), r)
    dim = x.shape[ax]
    n = len(node.output)
    if opset >= 13 and len(ins) > 1 and ins[1] is not None:
        sizes = _ints(cx.static(ins[1], "the split"))
    elif "split" in at:
        sizes = list(at["split"])
    else:
        k = at.get("num_outputs", n)
        each = -(-dim // k)
        sizes = [min(each, dim - i * each) for i in range(k)]
    e = cx.tensor(x)
    outs, pos = [], 0
    for s in sizes:
        idx = [":"] * r
        idx[ax] = f"{pos}:{pos + s}"
        outs.append(f"{e}[{', '.join(idx)}]" if s else f"zeros({shape_text([*x.shape[:ax], 0, *x.shape[ax + 1:]])}"
                    f", dtype={x.dtype.name})")
        pos += s
    return outs


@op("Expand")
def _expand(cx, node, ins, at, opset):
    x = ins[0]
    shape = _sized_by_dims(cx, node, ins[1])
    want = _ints(cx.static(ins[1], "the shape")) if shape is None else []
    shape = shape or _out_type(cx, node)[1]
    if shape is None:
        shape = tuple(np.broadcast_shapes(tuple(x.shape), tuple(want)))
    e = cx.tensor(x)
    if x.rank < len(shape):
        e = f"reshape({e}, {shape_text((1,) * (len(shape) - x.rank) + tuple(x.shape))})"
    return [f"expand({e}, {shape_text(shape)})"]


@op("Tile")
def _tile(cx, node, ins, at, opset):
    reps = _size_value(cx, ins[1]) if _out_type(cx, node)[1] is not None else None
    if reps is None:
        reps = _ints(cx.static(ins[1], "the repeats"))
    return [f"tile({cx.tensor(ins[0])}, {shape_text(reps)})"]


@op("Range")
def _range(cx, node, ins, at, opset):
    shape = _out_type(cx, node)[1]
    sized = [_size_value(cx, v) for v in ins] if shape is not None and len(shape) == 1 else [None]
    if any(v is not None and (isinstance(shape[0], str) or any(isinstance(e, str) for e in v)) for v in sized):
        # a length or a start from the inputs' sizes (Range(seq, seq + 5): 5 from seq): arange of that size
        start, delta = (sz[0] if sz is not None else int(cx.static(v, w).reshape(-1)[0])
                        for sz, v, w in ((sized[0], ins[0], "the start"), (sized[2], ins[2], "the delta")))
        e = f"arange({shape[0]})"
        if delta != 1:
            e = f"({e} * {delta})"
        if start != 0:
            e = f"({e} + {start})"
        return [Value(node.output[0], ins[0].dtype, shape, expr=cx.let(_cast(e, ins[0].dtype), node.output[0]))]
    start, limit, delta = (cx.static(v, w) for v, w in zip(ins, ("the start", "the limit", "the delta")))
    dt = ins[0].dtype
    if dt.name == "bf16":  # (bf16 constants are uint16 bits: compute on the values in f32, round back to bits)
        start, limit, delta = (bf16_to_f32(np.asarray(v)) for v in (start, limit, delta))
    n = max(int(math.ceil((float(limit) - float(start)) / float(delta))), 0)
    arr = np.asarray(start) + np.arange(n) * np.asarray(delta)
    arr = f32_to_bf16(arr.astype(np.float32)) if dt.name == "bf16" else arr.astype(dt.np)
    if n <= 4096:
        return [_const(arr, dt, node.output[0])]
    return [_cast(f"(arange({n}) * {_num(delta.item(), dt)} + {_num(start.item(), dt)})", dt)]


@op("Pad")
def _pad(cx, node, ins, at, opset):
    x = ins[0]
    r = x.rank
    if opset < 11:
        pads, value = list(at["pads"]), float(at.get("value", 0.0))
        axes = list(range(r))
    else:
        pads = _ints(cx.static(ins[1], "the pads"))
        cv = ins[2] if len(ins) > 2 else None
        value = cv.const.reshape(-1)[0].item() if cv is not None and cv.const is not None else 0
        if cv is not None and cv.const is None:  # a computed pad value: pad, then put it where padding is
            value = None
        axes = _ints(cx.static(ins[3], "the axes")) if len(ins) > 3 and ins[3] is not None else list(range(r))
    mode = at.get("mode", "constant")
    axes = [_axis(a, r) for a in axes]
    k = len(axes)
    before, after = [0] * r, [0] * r
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[i + k]
    e = cx.tensor(x)
    shape = list(x.shape)
    if any(p < 0 for p in before + after):  # negative pads crop (numpy: crop first, then pad the cropped sizes)
        idx = [f"{max(-b, 0)}:{s - max(-a_, 0)}" for b, a_, s in zip(before, after, x.shape)]
        e = cx.let(f"{e}[{', '.join(idx)}]", "crop")
        shape = [s - max(-b, 0) - max(-a_, 0) for b, a_, s in zip(before, after, x.shape)]
        before, after = [max(b, 0) for b in before], [max(a_, 0) for a_ in after]
    if mode == "constant":
        pairs = ", ".join(f"({b}, {a_})" for b, a_ in zip(before, after))
        if value is None:
            inside = f"pad(full({shape_text(shape)}, True, dtype=bool), ({pairs},), value=False)"
            return [f"where({inside}, pad({e}, ({pairs},)), reshape({cx.tensor(cv)}, ()))"]
        val = _num(value, x.dtype) if x.dtype != dtypes.bool else str(bool(value))
        return [f"pad({e}, ({pairs},), value={val})"]
    # edge / reflect / wrap: concatenate slices axis by axis
    for ax in range(r):
        b, a_ = before[ax], after[ax]
        if not b and not a_:
            continue
        n = shape[ax]

        def sl(i: int, ax: int = ax, e: str = e) -> str:
            idx = [":"] * r
            idx[ax] = f"{i}:{i + 1}"
            return f"{e}[{', '.join(idx)}]"
        if mode == "edge":
            parts = [sl(0)] * b + [e] + [sl(n - 1)] * a_
        elif mode == "reflect":
            parts = [sl(i) for i in range(b, 0, -1)] + [e] + [sl(n - 2 - i) for i in range(a_)]
        elif mode == "wrap":
            parts = [sl((n - b + i) % n) for i in range(b)] + [e] + [sl(i % n) for i in range(a_)]
        else:
            raise cx.unsupported(f"mode '{mode}'")
        e = cx.let(f"cat({', '.join(parts)}, axis={ax})", "pad")
        shape[ax] = n + b + a_
    return [e]


@op("Gather")
def _gather(cx, node, ins, at, opset):
    x, idx = ins
    ax = _axis(at.get("axis", 0), x.rank)
    if x.const is not None and idx.const is not None and x.const.size <= 4096:
        i = np.where(idx.const < 0, idx.const + x.const.shape[ax], idx.const)
        return [_const(np.take(x.const, i, axis=ax), x.dtype, node.output[0])]
    if idx.const is not None and idx.const.ndim == 0:
        return [f"take({cx.tensor(x)}, {int(idx.const)}, axis={ax})"]
    return [f"take({cx.tensor(x)}, {_wrapped(cx, idx, x.shape[ax])}, axis={ax})"]


@op("GatherElements")
def _gather_elements(cx, node, ins, at, opset):
    x, idx = ins
    ax = _axis(at.get("axis", 0), x.rank)
    return [f"gather({cx.tensor(x)}, {ax}, {_wrapped(cx, idx, x.shape[ax])})"]


@op("Trilu")
def _trilu(cx, node, ins, at, opset):
    k = int(cx.static(ins[1], "the k").reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else 0
    fn = "triu" if at.get("upper", 1) else "tril"
    return [f"{fn}({cx.tensor(ins[0])}, {k})"]


def _scan(fn: str, first: str, cx, ins, at) -> list:
    """CumSum/CumProd: `fn` along the axis; `exclusive` shifts by one element of `first` (the op's identity),
    `reverse` scans from the end."""
    x = ins[0]
    ax = _axis(int(cx.static(ins[1], "the axis").reshape(-1)[0]), x.rank)
    e = cx.tensor(x)
    if at.get("reverse", 0):
        e = f"flip({e}, {ax})"
    e = f"{fn}({e}, axis={ax})"
    if at.get("exclusive", 0):
        pads = ", ".join("(1, 0)" if i == ax else "(0, 0)" for i in range(x.rank))
        idx = ", ".join(f":{x.shape[i]}" if i == ax else ":" for i in range(x.rank))
        e = f"pad({e}, ({pads},){first})[{idx}]"
    if at.get("reverse", 0):
        e = f"flip({e}, {ax})"
    return [_cast(e, x.dtype)]


@op("CumSum")
def _cumsum(cx, node, ins, at, opset):
    return _scan("cumsum", "", cx, ins, at)


@op("EyeLike")
def _eyelike(cx, node, ins, at, opset):
    x = ins[0]
    dt = onnx_dtype(at["dtype"], "EyeLike's dtype") if "dtype" in at else x.dtype
    n, m = x.shape
    k = at.get("k", 0)
    return [f"cast((arange({n})[:, None] + {k}) == arange({m})[None, :], {dt.name})"]


@op("DepthToSpace")
def _depth_to_space(cx, node, ins, at, opset):
    x = ins[0]
    b, c, h, w = x.shape
    s = at["blocksize"]
    e = cx.tensor(x)
    if at.get("mode", "DCR") == "DCR":
        t = f"permute(reshape({e}, ({b}, {s}, {s}, {c // (s * s)}, {h}, {w})), (0, 3, 4, 1, 5, 2))"
    else:
        t = f"permute(reshape({e}, ({b}, {c // (s * s)}, {s}, {s}, {h}, {w})), (0, 1, 4, 2, 5, 3))"
    return [f"reshape({t}, ({b}, {c // (s * s)}, {h * s}, {w * s}))"]


@op("SpaceToDepth")
def _space_to_depth(cx, node, ins, at, opset):
    x = ins[0]
    b, c, h, w = x.shape
    s = at["blocksize"]
    t = f"permute(reshape({cx.tensor(x)}, ({b}, {c}, {h // s}, {s}, {w // s}, {s})), (0, 3, 5, 1, 2, 4))"
    return [f"reshape({t}, ({b}, {c * s * s}, {h // s}, {w // s}))"]


# --- reductions --------------------------------------------------------------------------------------------------

_REDUCE = {"ReduceSum": ("sum({})", 13), "ReduceMean": ("mean({})", 18), "ReduceMax": ("max({})", 18),
           "ReduceMin": ("min({})", 18), "ReduceProd": ("prod({})", 18), "ReduceL1": ("sum(abs({}))", 18),
           "ReduceL2": ("sqrt(sum({0} * {0}))", 18), "ReduceLogSum": ("log(sum({}))", 18),
           "ReduceLogSumExp": ("logsumexp({})", 18), "ReduceSumSquare": ("sum({0} * {0})", 18)}


@op(*_REDUCE)
def _reduce(cx, node, ins, at, opset):
    x = ins[0]
    fmt, since = _REDUCE[node.op_type]
    axes = _axes_arg(cx, ins, at, opset, since)
    keep = bool(at.get("keepdims", 1))
    e = cx.tensor(x)
    if not axes:
        if at.get("noop_with_empty_axes", 0):
            return [Value(node.output[0], x.dtype, x.shape, expr=e)]
        axes = list(range(x.rank))
    axes = sorted(_axis(a, x.rank) for a in axes)
    ax = shape_text(axes)
    if any(x.shape[a] == 0 for a in axes) and node.op_type in ("ReduceMax", "ReduceMin", "ReduceLogSumExp"):
        shape = _out_shape(cx, node)
        big = float("inf") if node.op_type == "ReduceMin" else float("-inf")
        if x.dtype == dtypes.bool:
            v: Any = node.op_type == "ReduceMin"
        else:
            v = big if _is_float(x.dtype) else (np.iinfo(x.dtype.np).max if big > 0 else np.iinfo(x.dtype.np).min)
        return [_const(np.full(shape, v), x.dtype, node.output[0])]  # (the identity of an empty max/min)
    if node.op_type not in ("ReduceMax", "ReduceMin"):  # f16/bf16 sums in f32, rounded once (as onnxruntime):
        e = _wide(e, x.dtype)  # a mean, L2 or log-sum of many f16 values would pass 65504 and give inf
    inner = fmt.format(e)
    # put the axis/keepdim arguments into the outermost reduction of the format
    name = inner.split("(", 1)[0]
    outer_fn = {"sqrt": "sum", "log": "sum"}.get(name)
    if outer_fn:  # sqrt(sum(...)) / log(sum(...)): the axes go to the inner sum
        body = inner[len(name) + 1:-1]
        red = body[:-1] + f", axis={ax}, keepdim={keep})"
        out = f"{name}({red})"
    else:
        out = inner[:-1] + f", axis={ax}, keepdim={keep})"
    if x.dtype in (dtypes.f16, dtypes.bf16) or _is_int(x.dtype) or x.dtype == dtypes.bool:
        out = _cast(out, x.dtype)
    return [out]


@op("ArgMax", "ArgMin")
def _argmax(cx, node, ins, at, opset):
    x = ins[0]
    ax = _axis(at.get("axis", 0), x.rank)
    keep = bool(at.get("keepdims", 1))
    fn = node.op_type.lower()
    e = cx.tensor(x)
    if at.get("select_last_index", 0):
        n = x.shape[ax]
        return [f"cast({n - 1} - {fn}(flip({e}, {ax}), axis={ax}, keepdim={keep}), i64)"]
    return [f"cast({fn}({e}, axis={ax}, keepdim={keep}), i64)"]


def _softmax_like(fn: str) -> OpFn:
    def impl(cx, node, ins, at, opset):
        x = ins[0]
        r = x.rank
        e = _wide(cx.tensor(x), x.dtype)  # (f16 LogSoftmax: in f32, rounded once)
        if opset >= 13:
            ax = _axis(at.get('axis', -1), r)
            if fn == "softmax" and x.dtype in (dtypes.f16, dtypes.bf16):  # ONNX's reference rounds each step
                t = x.dtype.name
                xe = cx.let(f"cast({cx.tensor(x)}, f32)", "wide")
                d = cx.let(f"cast(cast({xe} - max({xe}, axis={ax}, keepdim=True), {t}), f32)", "shifted")
                ex = cx.let(f"cast(cast(exp({d}), {t}), f32)", "exps")
                sm = cx.let(f"cast(cast(sum({ex}, axis={ax}, keepdim=True), {t}), f32)", "total")
                return [f"cast({ex} / {sm}, {t})"]
            return [_cast(f"{fn}({e}, axis={ax})", x.dtype)]
        ax = _axis(at.get("axis", 1), r)
        flat = (math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))
        return [_cast(f"reshape({fn}(reshape({e}, {shape_text(flat)}), axis=1), {shape_text(x.shape)})", x.dtype)]
    return impl


OPS["Softmax"] = _softmax_like("softmax")
OPS["LogSoftmax"] = _softmax_like("log_softmax")


@op("Hardmax")
def _hardmax(cx, node, ins, at, opset):
    x = ins[0]
    r = x.rank
    e = cx.tensor(x)
    ax = _axis(at.get("axis", -1 if opset >= 13 else 1), r)
    if opset < 13:
        flat = (math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))
        am = f"argmax(reshape({e}, {shape_text(flat)}), axis=1, keepdim=True)"
        oh = f"cast(arange({flat[1]})[None, :] == {am}, {x.dtype.name})"
        return [f"reshape({oh}, {shape_text(x.shape)})"]
    am = f"argmax({e}, axis={ax}, keepdim=True)"
    shape = [1] * r
    shape[ax] = x.shape[ax]
    return [f"cast(reshape(arange({x.shape[ax]}), {shape_text(shape)}) == {am}, {x.dtype.name})"]


@op("TopK")
def _topk(cx, node, ins, at, opset):
    x = ins[0]
    sized = _size_value(cx, ins[1]) if opset >= 10 and _out_type(cx, node)[1] is not None else None
    if sized is not None:
        k = sized[0]
    else:
        k = int(cx.static(ins[1], "the k").reshape(-1)[0]) if opset >= 10 else at["k"]
    ax = _axis(at.get("axis", -1), x.rank)
    largest = bool(at.get("largest", 1))
    t = cx.let(f"topk({cx.tensor(x)}, {k}, axis={ax}, largest={largest})", "topk")
    outs: list = [f"{t}[0]", f"cast({t}[1], i64)"]
    if x.shape is not None:  # typed here: ONNX's inference gives none for a k computed by a node
        shape = tuple(k if i == ax else s for i, s in enumerate(x.shape))
        for i, dt in ((0, x.dtype), (1, dtypes.i64)):
            if i < len(node.output) and node.output[i] and _out_type(cx, node, i)[1] is None:
                name = cx.out_names.pop(node.output[i], None) or cx.names.new(node.output[i], "t")
                cx.lines.append(f"{name} = {outs[i]}")
                outs[i] = Value(node.output[i], dt, shape, expr=name)
    return outs


# --- normalization -----------------------------------------------------------------------------------------------

def _channel_shape(rank: int, c: Any) -> tuple:
    return (1, c) + (1,) * (rank - 2)


@op("BatchNormalization")
def _batchnorm(cx, node, ins, at, opset):
    x, scale, bias, mean, var = ins[:5]
    if at.get("training_mode", 0) or (opset < 7 and not at.get("is_test", 0)):
        raise cx.unsupported("training_mode=1")
    eps = float(at.get("epsilon", 1e-5))
    shp = shape_text(_channel_shape(x.rank, x.shape[1]))
    if all(v.const is not None for v in (scale, bias, mean, var)):  # fold into one multiply-add
        s = scale.const.astype(np.float64) / np.sqrt(var.const.astype(np.float64) + eps)
        b = bias.const.astype(np.float64) - mean.const.astype(np.float64) * s
        ws = cx.weight(s.reshape(_channel_shape(x.rank, -1)), x.dtype, f"{node.output[0]}_scale")
        wb = cx.weight(b.reshape(_channel_shape(x.rank, -1)), x.dtype, f"{node.output[0]}_shift")
        return [_cast(f"({cx.tensor(x)} * {ws} + {wb})", x.dtype)]
    r = [f"reshape({cx.tensor(v)}, {shp})" for v in (scale, bias, mean, var)]
    return [_cast(f"(({cx.tensor(x)} - {r[2]}) / sqrt({r[3]} + {_num(eps, x.dtype)}) * {r[0]} + {r[1]})", x.dtype)]


@op("InstanceNormalization")
def _instancenorm(cx, node, ins, at, opset):
    x, scale, bias = ins
    eps = float(at.get("epsilon", 1e-5))
    axes = shape_text(list(range(2, x.rank)))
    e = cx.tensor(x)
    m = cx.let(f"mean({e}, axis={axes}, keepdim=True)", "mean")
    d = cx.let(f"({e} - {m})", "centered")
    v = cx.let(f"mean({d} * {d}, axis={axes}, keepdim=True)", "var")
    shp = shape_text(_channel_shape(x.rank, x.shape[1]))
    return [_cast(f"({d} / sqrt({v} + {_num(eps, x.dtype)}) * reshape({cx.tensor(scale)}, {shp}) + "
                  f"reshape({cx.tensor(bias)}, {shp}))", x.dtype)]


@op("LayerNormalization")
def _layernorm(cx, node, ins, at, opset):
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    r = x.rank
    ax = _axis(at.get("axis", -1), r)
    eps = float(at.get("epsilon", 1e-5))
    axes = shape_text(list(range(ax, r)))
    e = cx.tensor(x)
    xf = cx.let(f"cast({e}, f32)" if x.dtype in (dtypes.f16, dtypes.bf16) else e, "xf")
    m = cx.let(f"mean({xf}, axis={axes}, keepdim=True)", "mean")
    d = cx.let(f"({xf} - {m})", "centered")
    v = cx.let(f"mean({d} * {d}, axis={axes}, keepdim=True)", "var")
    inv = cx.let(f"rsqrt({v} + {_num(eps, dtypes.f32)})", "inv_std")
    y = f"({d} * {inv} * {cx.tensor(scale)}"
    y += f" + {cx.tensor(bias)})" if bias is not None else ")"
    outs: list = [_cast(y, x.dtype)]
    if len(node.output) > 1:
        outs.append(m)
    if len(node.output) > 2:
        outs.append(inv)
    return outs


@op("LpNormalization")
def _lpnorm(cx, node, ins, at, opset):
    x = ins[0]
    ax = _axis(at.get("axis", -1), x.rank)
    p = at.get("p", 2)
    e = cx.tensor(x)
    n = f"sum(abs({e}), axis={ax}, keepdim=True)" if p == 1 else f"sqrt(sum({e} * {e}, axis={ax}, keepdim=True))"
    nn = cx.let(n, "norm")
    return [_cast(f"where({nn} == 0, 0, {e} / {nn})", x.dtype)]


@op("MeanVarianceNormalization")
def _mvn(cx, node, ins, at, opset):
    x = ins[0]
    axes = shape_text(at.get("axes", [0, 2, 3]))
    e = cx.tensor(x)
    m = cx.let(f"mean({e}, axis={axes}, keepdim=True)", "mean")
    d = cx.let(f"({e} - {m})", "centered")
    v = cx.let(f"mean({d} * {d}, axis={axes}, keepdim=True)", "var")
    return [_cast(f"({d} / (sqrt({v}) + 1e-9))", x.dtype)]


@op("LRN")
def _lrn(cx, node, ins, at, opset):
    x = ins[0]
    size = int(at["size"])
    alpha, beta, bias = float(at.get("alpha", 1e-4)), float(at.get("beta", 0.75)), float(at.get("bias", 1.0))
    e = cx.tensor(x)
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = cx.let(f"({e} * {e})", "sq")
    pads = ", ".join("(0, 0)" if i != 1 else f"({lo}, {hi})" for i in range(x.rank))
    p = cx.let(f"pad({sq}, ({pads},))", "sq_pad")
    rest = ", ".join([":"] * (x.rank - 2))
    terms = [f"{p}[:, {i}:{i + c}, {rest}]" for i in range(size)]
    s = cx.let(" + ".join(terms), "sq_sum")
    return [_cast(f"({e} / pow({_num(bias, x.dtype)} + {_num(alpha / size, x.dtype)} * {s}, "
                  f"{_num(beta, x.dtype)}))", x.dtype)]


# --- convolution and pooling -------------------------------------------------------------------------------------

def _spatial_pads(cx: Ctx, at: dict, in_sp: list[int], k: list[int], s: list[int], d: list[int]
                  ) -> tuple[list[int], list[int]]:
    n = len(in_sp)
    auto = at.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = list(at.get("pads", [0] * (2 * n)))
        return pads[:n], pads[n:]
    if auto == "VALID":
        return [0] * n, [0] * n
    before, after = [], []
    for i in range(n):
        out = -(-in_sp[i] // s[i])
        total = max((out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in_sp[i], 0)
        small = total // 2
        if auto == "SAME_UPPER":
            before.append(small)
            after.append(total - small)
        elif auto == "SAME_LOWER":
            before.append(total - small)
            after.append(small)
        else:
            raise cx.unsupported(f"auto_pad '{auto}'")
    return before, after


def _conv2d_expr(x: str, w: str, s: tuple, d: tuple, g: int) -> str:
    return f"conv2d({x}, {w}, stride={shape_text(s)}, dilation={shape_text(d)}, groups={g})"


@op("Conv")
def _conv(cx, node, ins, at, opset):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    r = x.rank
    n = r - 2
    if n < 1 or n > 3:
        raise cx.unsupported(f"a {n}-d convolution")
    ks = list(w.shape[2:])
    s = list(at.get("strides", [1] * n))
    d = list(at.get("dilations", [1] * n))
    g = int(at.get("group", 1))
    before, after = _spatial_pads(cx, at, list(x.shape[2:]), ks, s, d)
    e = _wide(cx.tensor(x), x.dtype)
    if any(before) or any(after):
        pairs = ", ".join(["(0, 0)", "(0, 0)"] + [f"({p}, {q})" for p, q in zip(before, after)])
        e = cx.let(f"pad({e}, ({pairs},))", "padded")
    we = _wide(cx.tensor(w), w.dtype)
    if n == 2:
        y = _conv2d_expr(e, we, tuple(s), tuple(d), g)
    elif n == 1:
        y = f"squeeze({_conv2d_expr(f'unsqueeze({e}, 2)', f'unsqueeze({we}, 2)', (1, s[0]), (1, d[0]), g)}, 2)"
    else:  # 3-d: a sum over the depth taps of 2-d convolutions on the depth-strided slices
        nb, c = x.shape[0], x.shape[1]
        dp = x.shape[2] + before[0] + after[0]
        od = (dp - (ks[0] - 1) * d[0] - 1) // s[0] + 1
        hp, wp = x.shape[3] + before[1] + after[1], x.shape[4] + before[2] + after[2]
        oc = w.shape[0]
        terms = []
        for kd in range(ks[0]):
            start = kd * d[0]
            sl = f"{e}[:, :, {start}:{start + s[0] * (od - 1) + 1}:{s[0]}]"
            x2 = f"reshape(permute({sl}, (0, 2, 1, 3, 4)), ({nb * od}, {c}, {hp}, {wp}))"
            terms.append(_conv2d_expr(x2, f"{we}[:, :, {kd}]", (s[1], s[2]), (d[1], d[2]), g))
        acc = cx.let(" + ".join(terms), "conv3d")
        oh = (hp - (ks[1] - 1) * d[1] - 1) // s[1] + 1
        ow = (wp - (ks[2] - 1) * d[2] - 1) // s[2] + 1
        y = f"permute(reshape({acc}, ({nb}, {od}, {oc}, {oh}, {ow})), (0, 2, 1, 3, 4))"
    if b is not None:
        y = f"({y} + reshape({_wide(cx.tensor(b), b.dtype)}, {shape_text(_channel_shape(r, w.shape[0]))}))"
    return [_cast(y, x.dtype)]


def _pool_geometry(cx: Ctx, x: Value, at: dict, n: int):
    k = list(at["kernel_shape"])
    s = list(at.get("strides", [1] * n))
    d = list(at.get("dilations", [1] * n))
    in_sp = list(x.shape[2:])
    before, after = _spatial_pads(cx, at, in_sp, k, s, d)
    ceil = bool(at.get("ceil_mode", 0))
    out, extra = [], []
    for i in range(n):
        span = in_sp[i] + before[i] + after[i] - ((k[i] - 1) * d[i] + 1)
        o = (-(-span // s[i]) if ceil else span // s[i]) + 1
        if ceil and (o - 1) * s[i] >= in_sp[i] + before[i]:
            o -= 1
        out.append(o)
        extra.append(max((o - 1) * s[i] + (k[i] - 1) * d[i] + 1 - (in_sp[i] + before[i] + after[i]), 0))
    return k, s, d, before, after, out, extra


def _window_slices(e: str, n: int, k: list[int], s: list[int], d: list[int], out: list[int]) -> list[str]:
    terms = []
    for offs in itertools.product(*[range(ki) for ki in k]):
        idx = [":", ":"]
        for i, o in enumerate(offs):
            start = o * d[i]
            stop = start + s[i] * (out[i] - 1) + 1
            idx.append(f"{start}:{stop}" + (f":{s[i]}" if s[i] != 1 else ""))
        terms.append(f"{e}[{', '.join(idx)}]")
    return terms


def _tree(terms: list[str], fn: str) -> str:
    while len(terms) > 1:
        terms = [f"{fn}({terms[i]}, {terms[i + 1]})" if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def _lowest(dt: DType) -> str:
    """The value MaxPool pads with: -inf for every float dtype (a finite -1e300 overflowed f32's range on its
    way to -inf; `inf` is a name the translation never shadows), the dtype's lowest value for an integer."""
    if _is_float(dt):
        return "(-inf)"
    return str(int(np.iinfo(dt.np).min))


@op("MaxPool")
def _maxpool(cx, node, ins, at, opset):
    x = ins[0]
    if len(node.output) > 1 and node.output[1]:
        raise cx.unsupported("the Indices output")
    if at.get("storage_order", 0):
        raise cx.unsupported("storage_order=1")
    n = x.rank - 2
    k, s, d, before, after, out, extra = _pool_geometry(cx, x, at, n)
    e = cx.tensor(x)
    if any(before) or any(after) or any(extra):
        pairs = ", ".join(["(0, 0)", "(0, 0)"] + [f"({p}, {q + z})" for p, q, z in zip(before, after, extra)])
        e = cx.let(f"pad({e}, ({pairs},), value={_lowest(x.dtype)})", "padded")
    if (n == 2 and not any(before + after + extra) and d == [1, 1] and k == s) or _window_reduction(n, k, d):
        return [f"max_pool2d({e}, {shape_text(k)}, {shape_text(s)})"]
    return [_tree(_window_slices(e, n, k, s, d, out), "maximum")]


@op("AveragePool", "LpPool")
def _avgpool(cx, node, ins, at, opset):
    x = ins[0]
    n = x.rank - 2
    k, s, d, before, after, out, extra = _pool_geometry(cx, x, at, n)
    e = cx.tensor(x)
    lp = node.op_type == "LpPool"
    p = int(at.get("p", 2))
    if lp:
        e = cx.let(f"pow(abs({e}), {p}.0)" if p != 2 else f"({e} * {e})", "powered")
    padded = any(before) or any(after) or any(extra)
    if padded:
        pairs = ", ".join(["(0, 0)", "(0, 0)"] + [f"({p_}, {q + z})" for p_, q, z in zip(before, after, extra)])
        e = cx.let(f"pad({e}, ({pairs},))", "padded")
    if not lp and _window_reduction(n, k, d):  # the window as a reduction: its mean, times count/divisor if padded
        mean = cx.let(f"avg_pool2d({e}, {shape_text(k)}, {shape_text(s)})", "window_mean")
        if not padded:
            return [_cast(mean, x.dtype)]
        cnt = _pool_counts(x, at, k, s, d, before, after, extra, out)
        w = cx.weight(math.prod(k) / np.maximum(cnt, 1), x.dtype, f"{node.output[0]}_divisor")
        return [_cast(f"({mean} * {w})", x.dtype)]
    total = cx.let(" + ".join(_window_slices(e, n, k, s, d, out)), "window_sum")
    if lp:
        return [_cast(f"pow({total}, {1.0 / p!r})" if p != 2 else f"sqrt({total})", x.dtype)]
    if not padded:
        return [_cast(f"({total} / {math.prod(k)})", x.dtype)]
    # the divisor per output position, computed now: padding counts only with count_include_pad
    cnt = _pool_counts(x, at, k, s, d, before, after, extra, out)
    w = cx.weight(1.0 / np.maximum(cnt, 1), x.dtype, f"{node.output[0]}_divisor")
    return [_cast(f"({total} * {w})", x.dtype)]


def _pool_counts(x: Value, at: dict, k: list[int], s: list[int], d: list[int], before: list[int],
                 after: list[int], extra: list[int], out: list[int]) -> np.ndarray:
    """The values each output window of an average pool divides by (padding counts only with count_include_pad;
    the ceil_mode's extra end padding never), computed at load."""
    include = bool(at.get("count_include_pad", 0))
    ones = np.ones([int(v) for v in x.shape[2:]], np.float64)
    ones = np.pad(ones, [(b_, a_) for b_, a_ in zip(before, after)], constant_values=1.0 if include else 0.0)
    ones = np.pad(ones, [(0, z) for z in extra])
    cnt = np.zeros(out)
    for offs in itertools.product(*[range(ki) for ki in k]):
        idx = tuple(slice(o * d[i], o * d[i] + s[i] * (out[i] - 1) + 1, s[i]) for i, o in enumerate(offs))
        cnt += ones[idx]
    return cnt


WINDOW_SLICES_MAX = 16  # pooling windows of up to this many taps are written as one slice per tap


def _window_reduction(n: int, k: list[int], d: list[int]) -> bool:
    """Whether a 2-d pool without dilation is written as a reduction over its window (`max_pool2d`/`avg_pool2d`:
    index math, a loop over the taps) instead of one strided slice per tap: windows of more than
    WINDOW_SLICES_MAX taps (ResNet's 7x7 average, SqueezeNet's 13x13 one). Written as slices those are a
    kernel body of hundreds of loads that the register tiling unrolls again per lane (ResNet-50's 7x7 average:
    1570 loads, 3.4 s of LLVM); small windows keep their slices (faster measured: a 3x3 max pool 1.3 ms as slices
    against 2.4 ms as the library's `max_pool`)."""
    return n == 2 and d == [1, 1] and math.prod(k) > WINDOW_SLICES_MAX


@op("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _global_pool(cx, node, ins, at, opset):
    x = ins[0]
    axes = shape_text(list(range(2, x.rank)))
    e = cx.tensor(x)
    if node.op_type == "GlobalAveragePool":
        return [_cast(f"mean({e}, axis={axes}, keepdim=True)", x.dtype)]
    if node.op_type == "GlobalMaxPool":
        return [f"max({e}, axis={axes}, keepdim=True)"]
    p = int(at.get("p", 2))
    e = _wide(e, x.dtype)  # f16/bf16: the sum of powers in f32 (it passes 65504 long before the result does)
    return [_cast(f"pow(sum(pow(abs({e}), {p}.0), axis={axes}, keepdim=True), {1.0 / p!r})", x.dtype)]


# --- losses, more normalizations, one-hot, bit casts -------------------------------------------------------------

def _nll(cx: Ctx, logp: str, x: Value, target: Value, weight: Value | None, at: dict) -> str:
    """ONNX's NegativeLogLikelihoodLoss of log-probabilities `logp` (N, C, d...) at `target` (N, d...)."""
    r = x.rank
    ignore = at.get("ignore_index")
    t = cx.tensor(target)
    if ignore is not None:  # an ignored target reads class 0 and weighs 0
        keep = cx.let(f"({t} != {int(ignore)})", "keep")
        t = cx.let(f"where({keep}, {t}, 0)", "target")
    picked = cx.let(f"(-take_along_axis({logp}, unsqueeze({t}, 1), axis=1))", "picked")
    picked = cx.let(f"squeeze({picked}, 1)", "nll")
    w = f"take({cx.tensor(weight)}, {t}, axis=0)" if weight is not None else None
    if ignore is not None:
        m = f"cast({keep}, {x.dtype.name})"
        w = f"({w} * {m})" if w is not None else m
    if w is not None:
        w = cx.let(w, "weight")
        picked = cx.let(f"({picked} * {w})", "weighted")
    red = at.get("reduction", "mean")
    if red == "none":
        return picked
    if red == "sum":
        return f"sum({picked})"
    if red == "mean":
        if w is None:
            return f"mean({picked})"
        return f"(sum({picked}) / sum({w}))"
    raise cx.unsupported(f"reduction '{red}'")
    del r


@op("NegativeLogLikelihoodLoss")
def _nll_op(cx, node, ins, at, opset):
    x, target = ins[0], ins[1]
    w = ins[2] if len(ins) > 2 else None
    return [_cast(_nll(cx, cx.tensor(x), x, target, w, at), x.dtype)]


@op("SoftmaxCrossEntropyLoss")
def _sce(cx, node, ins, at, opset):
    x, target = ins[0], ins[1]
    w = ins[2] if len(ins) > 2 else None
    logp = cx.let(f"log_softmax({cx.tensor(x)}, axis=1)", "log_prob")
    return [_cast(_nll(cx, logp, x, target, w, at), x.dtype), logp]


@op("RMSNormalization")
def _rmsnorm(cx, node, ins, at, opset):
    x, scale = ins
    r = x.rank
    ax = _axis(at.get("axis", -1), r)
    eps = float(at.get("epsilon", 1e-5))
    axes = shape_text(list(range(ax, r)))
    e = cx.tensor(x)
    xf = cx.let(f"cast({e}, f32)" if x.dtype in (dtypes.f16, dtypes.bf16) else e, "xf")
    inv = cx.let(f"rsqrt(mean({xf} * {xf}, axis={axes}, keepdim=True) + {_num(eps, dtypes.f32)})", "inv_rms")
    return [_cast(f"({xf} * {inv} * {cx.tensor(scale)})", x.dtype)]


@op("GroupNormalization")
def _groupnorm(cx, node, ins, at, opset):
    x, scale, bias = ins
    g = int(at["num_groups"])
    eps = float(at.get("epsilon", 1e-5))
    n, c = x.shape[0], x.shape[1]
    rest = list(x.shape[2:])
    e = cx.tensor(x)
    grouped = cx.let(f"reshape({e}, ({n}, {g}, -1))", "grouped")
    m = cx.let(f"mean({grouped}, axis=2, keepdim=True)", "mean")
    d = cx.let(f"({grouped} - {m})", "centered")
    v = cx.let(f"mean({d} * {d}, axis=2, keepdim=True)", "var")
    y = cx.let(f"reshape({d} / sqrt({v} + {_num(eps, x.dtype)}), {shape_text([n, c, *rest])})", "normed")
    if opset >= 21:  # per channel
        shp = shape_text(_channel_shape(x.rank, c))
        return [_cast(f"({y} * reshape({cx.tensor(scale)}, {shp}) + reshape({cx.tensor(bias)}, {shp}))", x.dtype)]
    # opset 18: scale and bias per group
    shp = shape_text([1, g, 1])
    per_channel = shape_text(_channel_shape(x.rank, c))
    sc = f"reshape(expand(reshape({cx.tensor(scale)}, {shp}), (1, {g}, {c // g})), {per_channel})"
    bi = f"reshape(expand(reshape({cx.tensor(bias)}, {shp}), (1, {g}, {c // g})), {per_channel})"
    return [_cast(f"({y} * {sc} + {bi})", x.dtype)]


@op("CumProd")
def _cumprod(cx, node, ins, at, opset):
    return _scan("cumprod", ", value=1", cx, ins, at)


@op("BitCast")
def _bitcast(cx, node, ins, at, opset):
    x = ins[0]
    to = onnx_dtype(at["to"], f"BitCast's target in {cx.where()}")
    if to.itemsize != x.dtype.itemsize:
        raise cx.unsupported(f"a bit cast between sizes ({x.dtype.name} to {to.name})")
    return [f"bitcast({cx.tensor(x)}, {to.name})"]


@op("OneHot")
def _onehot(cx, node, ins, at, opset):
    idx, depth_v, values = ins
    depth = int(cx.static(depth_v, "the depth").reshape(-1)[0])
    r = idx.rank + 1
    ax = _axis(at.get("axis", -1), r)
    i = cx.tensor(idx)
    i = cx.let(f"where({i} < 0, {i} + {depth}, {i})", "index")
    shape = [1] * r
    shape[ax] = depth
    hit = cx.let(f"(reshape(arange({depth}), {shape_text(shape)}) == unsqueeze({i}, {ax}))", "hit")
    v = cx.tensor(values)
    return [_cast(f"where({hit}, {v}[1], {v}[0])", values.dtype)]


@op("Attention")
def _attention(cx, node, ins, at, opset):
    """ONNX Attention (opset 23+): 3-d (heads from the attributes) or 4-d Q, K, V; grouped K/V heads; a bool
    or additive mask; causal (bottom-right aligned after a past cache); past/present key and value; softcap."""
    q, k, v = ins[0], ins[1], ins[2]
    def get(i: int) -> Value | None:
        return ins[i] if len(ins) > i else None

    mask, past_k, past_v = get(3), get(4), get(5)
    nonpad = get(6)
    left, right = int(at.get("left_window_size", -1)), int(at.get("right_window_size", -1))
    dt = q.dtype
    eq, ek, ev = cx.tensor(q), cx.tensor(k), cx.tensor(v)
    if q.rank == 3:
        hq, hkv = int(at["q_num_heads"]), int(at["kv_num_heads"])
        b, s, _ = q.shape
        eq = cx.let(f"permute(reshape({eq}, ({b}, {s}, {hq}, {q.shape[2] // hq})), (0, 2, 1, 3))", "q")
        ek = cx.let(f"permute(reshape({ek}, ({b}, {k.shape[1]}, {hkv}, {k.shape[2] // hkv})), (0, 2, 1, 3))", "k")
        ev = cx.let(f"permute(reshape({ev}, ({b}, {v.shape[1]}, {hkv}, {v.shape[2] // hkv})), (0, 2, 1, 3))", "v")
        d, dv, kv_len = q.shape[2] // hq, v.shape[2] // hkv, k.shape[1]
    else:
        b, hq, s, d = q.shape
        hkv, kv_len, dv = k.shape[1], k.shape[2], v.shape[3]
    past = 0
    if past_k is not None:
        past = past_k.shape[2]
        ek = cx.let(f"cat({cx.tensor(past_k)}, {ek}, axis=2)", "present_key")
        ev = cx.let(f"cat({cx.tensor(past_v)}, {ev}, axis=2)", "present_value")
        kv_len += past
    present = [ek, ev]
    if hq != hkv:  # grouped heads: each K/V head serves hq / hkv query heads
        rep = hq // hkv
        ek = cx.let(f"reshape(expand(reshape({ek}, ({b}, {hkv}, 1, {kv_len}, {d})), ({b}, {hkv}, {rep}, {kv_len}, "
                    f"{d})), ({b}, {hq}, {kv_len}, {d}))", "k_rep")
        ev = cx.let(f"reshape(expand(reshape({ev}, ({b}, {hkv}, 1, {kv_len}, {dv})), ({b}, {hkv}, {rep}, {kv_len}, "
                    f"{dv})), ({b}, {hq}, {kv_len}, {dv}))", "v_rep")
    scale = at.get("scale", 1.0 / math.sqrt(d))
    work = dtypes.f32 if dt in (dtypes.f16, dtypes.bf16) else dt
    cq = f"cast({eq}, {work.name})" if work != dt else eq
    ck = f"cast({ek}, {work.name})" if work != dt else ek
    scores = cx.let(f"(({cq} * {_num(scale, work)}) @ permute({ck}, (0, 1, 3, 2)))", "scores")
    bias = None
    if mask is not None:
        em = cx.tensor(mask)
        if mask.dtype == dtypes.bool:
            bias = f"where({em}, 0.0, (-1e300 * 1e300))"
        else:
            bias = f"cast({em}, {work.name})"
        if mask.shape is not None and mask.shape[-1] < kv_len:  # a mask shorter than the keys pads with -inf
            pads = ", ".join(["(0, 0)"] * (mask.rank - 1) + [f"(0, {kv_len - mask.shape[-1]})"])
            bias = f"pad({bias}, ({pads},), value=(-1e300))"
    cap = float(at.get("softcap", 0.0))
    if cap > 0:  # softcap before the mask, so masked scores stay -inf (ONNX's order)
        scores = cx.let(f"(tanh({scores} / {_num(cap, work)}) * {_num(cap, work)})", "capped")
    capped = scores
    if nonpad is not None:  # keys past each batch's valid length are masked; causal aligns to that length
        lens = cx.let(f"reshape({cx.tensor(nonpad)}, ({b}, 1, 1, 1))", "kv_len")
        pad_bias = f"where(reshape(arange({kv_len}), (1, 1, 1, {kv_len})) < {lens}, 0.0, (-1e300 * 1e300))"
        bias = pad_bias if bias is None else f"({bias} + {pad_bias})"
    if at.get("is_causal", 0):
        offset = f"({lens} - {s})" if nonpad is not None else str(past)
        rows = f"reshape(arange({s}), (1, 1, {s}, 1))"
        causal = f"where(reshape(arange({kv_len}), (1, 1, 1, {kv_len})) <= {rows} + {offset}, 0.0, (-1e300 * 1e300))"
        bias = causal if bias is None else f"({bias} + {causal})"
    if left >= 0 or right >= 0:  # a sliding window around each query's position (aligned as causal is)
        offset = f"({lens} - {s})" if nonpad is not None else str(past)
        diff = cx.let(f"(reshape(arange({s}), (1, 1, {s}, 1)) + {offset} - reshape(arange({kv_len}), "
                      f"(1, 1, 1, {kv_len})))", "window_diff")
        allowed = " & ".join(([f"({diff} <= {left})"] if left >= 0 else []) +
                             ([f"((0 - {diff}) <= {right})"] if right >= 0 else []))
        window = f"where({allowed}, 0.0, (-1e300 * 1e300))"
        bias = window if bias is None else f"({bias} + {window})"
    if bias is not None:
        scores = cx.let(f"({scores} + {bias})", "masked")
    with_bias = scores
    m = cx.let(f"max({scores}, axis=-1, keepdim=True)", "row_max")
    m = cx.let(f"where(isinf({m}) & ({m} < 0), 0.0, {m})", "safe_max")
    e = cx.let(f"exp({scores} - {m})", "e")
    tot = cx.let(f"sum({e}, axis=-1, keepdim=True)", "total")
    p = cx.let(f"({e} / where({tot} == 0, 1.0, {tot}))", "probs")
    if bias is not None:  # a row whose bias masks every key gives 0 (decided on the bias: scores may be nan)
        b_max = cx.let(f"max({bias}, axis=-1, keepdim=True)", "bias_max")
        p = cx.let(f"where(isinf({b_max}) & ({b_max} < 0), 0.0, {p})", "probs_guarded")
    cv = f"cast({ev}, {work.name})" if work != dt else ev
    y = cx.let(f"({p} @ {cv})", "attended")
    if q.rank == 3:
        y = f"reshape(permute({y}, (0, 2, 1, 3)), ({b}, {s}, {hq * dv}))"
    outs: list = [_cast(f"cast({y}, {dt.name})" if work != dt else y, dt)]
    outs += present
    if len(node.output) > 3 and node.output[3]:  # the scores at the stage qk_matmul_output_mode names
        stage = {0: capped, 1: capped, 2: with_bias, 3: p}.get(int(at.get("qk_matmul_output_mode", 0)))
        if stage is None:
            raise cx.unsupported(f"qk_matmul_output_mode {at['qk_matmul_output_mode']}")
        outs.append(f"cast({stage}, {dt.name})" if work != dt else stage)
    return outs


# --- Resize: separable per axis, the source indices and weights computed at load time ------------------------------

def _source_coords(mode: str, out_n: int, in_n: int, scale: float) -> np.ndarray:
    x = np.arange(out_n, dtype=np.float64)
    width = scale * in_n  # ONNX's output width here is the real-valued one
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if width > 1 else np.zeros(out_n)
    if mode == "align_corners":
        return x * (in_n - 1) / (width - 1) if width != 1 else np.zeros(out_n)
    if mode == "asymmetric":
        return x / scale
    if mode == "half_pixel_symmetric":
        adjust = out_n / (scale * in_n)
        return in_n / 2 * (1 - adjust) + (x + 0.5) / scale - 0.5
    raise ValueError(mode)


def _nearest(xs: np.ndarray, how: str) -> np.ndarray:
    if how == "floor":
        return np.floor(xs)
    if how == "ceil":
        return np.ceil(xs)
    frac = xs - np.floor(xs)
    half = np.isclose(frac, 0.5)
    if how == "round_prefer_ceil":
        return np.where(half, np.ceil(xs), np.round(xs))
    return np.where(half, np.floor(xs), np.round(xs))  # round_prefer_floor


def _cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    def near(d):  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=-1)


@op("Resize", "Upsample")
def _resize(cx, node, ins, at, opset):
    x = ins[0]
    r = x.rank
    shape = [int(s) for s in x.shape]
    if node.op_type == "Upsample" or opset < 11:
        scales_v = at.get("scales") if node.op_type == "Upsample" and opset < 9 else \
            cx.static(ins[1], "the scales")
        scales = [float(s) for s in np.asarray(scales_v).reshape(-1)]
        sizes = None
        coord, nearest_mode = "asymmetric", "floor"
        axes = list(range(r))
    else:
        if at.get("antialias", 0):
            raise cx.unsupported("antialias=1")
        coord = at.get("coordinate_transformation_mode", "half_pixel")
        if coord == "tf_crop_and_resize":
            raise cx.unsupported("coordinate_transformation_mode 'tf_crop_and_resize'")
        nearest_mode = at.get("nearest_mode", "round_prefer_floor")
        axes = [_axis(a, r) for a in at.get("axes", list(range(r)))]
        sv = ins[2] if len(ins) > 2 and ins[2] is not None and (ins[2].shape is None or math.prod(ins[2].shape)) \
            else None
        zv = ins[3] if len(ins) > 3 else None
        scales = [float(s) for s in cx.static(sv, "the scales").reshape(-1)] if sv is not None else None
        sizes = _ints(cx.static(zv, "the sizes")) if zv is not None else None
    mode = at.get("mode", "nearest")
    if scales is not None:
        full_scales = [1.0] * r
        for a, s in zip(axes, scales):
            full_scales[a] = s
        out = [int(math.floor(n * s)) for n, s in zip(shape, full_scales)]
    else:
        out = list(shape)
        policy = at.get("keep_aspect_ratio_policy", "stretch")
        if policy == "stretch":
            for a, s in zip(axes, sizes):
                out[a] = s
        else:
            ratios = [s / shape[a] for a, s in zip(axes, sizes)]
            k = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                out[a] = int(math.floor(shape[a] * k + 0.5))
            full_scales = [1.0] * r
            for a in axes:
                full_scales[a] = k
        if policy == "stretch":
            full_scales = [o / n if n else 1.0 for o, n in zip(out, shape)]
    e = cx.tensor(x)
    for a in range(r):
        if out[a] == shape[a] and full_scales[a] == 1.0:
            continue
        xs = _source_coords(coord, out[a], shape[a], full_scales[a])
        bshape = [1] * r
        bshape[a] = out[a]
        if mode == "nearest":
            idx = np.clip(_nearest(xs, nearest_mode), 0, shape[a] - 1).astype(np.int32)
            e = cx.let(f"take({e}, {cx.weight(idx, dtypes.i32, 'resize_index')}, axis={a})", "resized")
        elif mode == "linear":
            lo = np.floor(xs)
            w = (xs - lo).reshape(bshape)
            i0 = np.clip(lo, 0, shape[a] - 1).astype(np.int32)
            i1 = np.clip(lo + 1, 0, shape[a] - 1).astype(np.int32)
            wt = cx.weight(w, x.dtype, "resize_weight")
            t0 = f"take({e}, {cx.weight(i0, dtypes.i32, 'resize_index')}, axis={a})"
            t1 = f"take({e}, {cx.weight(i1, dtypes.i32, 'resize_index')}, axis={a})"
            e = cx.let(f"({t0} * (1 - {wt}) + {t1} * {wt})", "resized")
        elif mode == "cubic":
            lo = np.floor(xs)
            ws = _cubic_weights(xs - lo, float(at.get("cubic_coeff_a", -0.75)))
            taps = lo[:, None] + np.arange(-1, 3)[None, :]
            if at.get("exclude_outside", 0):
                ws = np.where((taps < 0) | (taps > shape[a] - 1), 0.0, ws)
                ws = ws / ws.sum(axis=1, keepdims=True)
            terms = []
            for j in range(4):
                ij = np.clip(taps[:, j], 0, shape[a] - 1).astype(np.int32)
                wj = cx.weight(ws[:, j].reshape(bshape), x.dtype, "resize_weight")
                terms.append(f"take({e}, {cx.weight(ij, dtypes.i32, 'resize_index')}, axis={a}) * {wj}")
            e = cx.let(" + ".join(terms), "resized")
        else:
            raise cx.unsupported(f"mode '{mode}'")
    return [Value(node.output[0], x.dtype, tuple(out), expr=e) if e != cx.tensor(x) else _cast(e, x.dtype)]


# --- scatter and gather by index tensors (torch's scatter_add underneath: O(size x updates) masked sums) ------------

def _wrapped(cx: Ctx, idx: Value, dim: Any) -> str:
    i = cx.tensor(idx)
    i = cx.let(f"clip({i}, {-dim}, {dim - 1})", "index")  # (bounded for the kernel's index math)
    return cx.let(f"where({i} < 0, {i} + {dim}, {i})", "index")


def _scatter_along(cx: Ctx, base: str, dtype: DType, shape: tuple, axis: int, idx: str, upd: str,
                   reduction: str) -> str:
    """`base` with `upd` written (or added) at `idx` along `axis` (ONNX ScatterElements' semantics)."""
    if reduction == "add":
        return f"scatter_add({base}, {axis}, {idx}, {upd})"
    if reduction != "none":
        raise cx.unsupported(f"reduction '{reduction}'")
    hit = cx.let(f"(scatter_add(zeros({shape_text(shape)}, dtype=i32), {axis}, {idx}, 1) > 0)", "written")
    new = cx.let(f"scatter_add(zeros({shape_text(shape)}, dtype={dtype.name}), {axis}, {idx}, {upd})", "written_values")
    return f"where({hit}, {new}, {base})"


@op("ScatterElements", "Scatter")
def _scatter_elements(cx, node, ins, at, opset):
    x, idx, upd = ins
    ax = _axis(at.get("axis", 0), x.rank)
    i = _wrapped(cx, idx, x.shape[ax])
    return [_cast(_scatter_along(cx, cx.tensor(x), x.dtype, x.shape, ax, i, cx.tensor(upd),
                                 at.get("reduction", "none")), x.dtype)]


def _linear_index(cx: Ctx, x: Value, idx: Value) -> tuple[str, int]:
    """GatherND/ScatterND indices (..., k) into x's first k axes as one flat index (negative ones wrapped)."""
    k = int(idx.shape[-1])
    i = cx.tensor(idx)
    terms = []
    stride = 1
    for j in range(k - 1, -1, -1):
        d = x.shape[j]
        comp = f"clip({i}[..., {j}], {-d}, {d - 1})"  # (an index's range bounded for the kernel's index math)
        terms.append(f"where({comp} < 0, {comp} + {d}, {comp}) * {stride}")
        stride *= d
    return cx.let(" + ".join(reversed(terms)), "flat_index"), k


@op("GatherND")
def _gather_nd(cx, node, ins, at, opset):
    x, idx = ins
    if at.get("batch_dims", 0):
        raise cx.unsupported("batch_dims > 0")
    lin, k = _linear_index(cx, x, idx)
    flat = f"reshape({cx.tensor(x)}, {shape_text([math.prod(x.shape[:k]), *x.shape[k:]])})"
    return [f"take({flat}, {lin}, axis=0)"]


@op("ScatterND")
def _scatter_nd(cx, node, ins, at, opset):
    x, idx, upd = ins
    lin, k = _linear_index(cx, x, idx)
    rows = math.prod(x.shape[:k])
    rest = list(x.shape[k:])
    n = math.prod(idx.shape[:-1])
    flat_x = f"reshape({cx.tensor(x)}, {shape_text([rows, *rest])})"
    flat_u = f"reshape({cx.tensor(upd)}, {shape_text([n, *rest])})"
    index = f"expand(reshape({lin}, {shape_text([n] + [1] * len(rest))}), {shape_text([n, *rest])})"
    out = _scatter_along(cx, flat_x, x.dtype, (rows, *rest), 0, index, flat_u, at.get("reduction", "none"))
    return [_cast(f"reshape({out}, {shape_text(x.shape)})", x.dtype)]


@op("ConvTranspose")
def _conv_transpose(cx, node, ins, at, opset):
    """A transposed convolution as a convolution: the input spread by the stride (zeros between), padded by the
    kernel's reach less the pads, convolved with the flipped kernel whose in/out channels swap per group."""
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    n = x.rank - 2
    if n not in (1, 2):
        raise cx.unsupported(f"a {n}-d transposed convolution")
    c, m_g = w.shape[0], w.shape[1]
    ks = list(w.shape[2:])
    g = int(at.get("group", 1))
    s = list(at.get("strides", [1] * n))
    d = list(at.get("dilations", [1] * n))
    op_ = list(at.get("output_padding", [0] * n))
    in_sp = list(x.shape[2:])
    reach = [(k - 1) * dd + 1 for k, dd in zip(ks, d)]
    auto = at.get("auto_pad", "NOTSET")
    if "output_shape" in at or auto in ("SAME_UPPER", "SAME_LOWER"):
        want = list(at["output_shape"])[-n:] if "output_shape" in at else [i * st for i, st in zip(in_sp, s)]
        total = [st * (i - 1) + o + r - wv for st, i, o, r, wv in zip(s, in_sp, op_, reach, want)]
        if auto == "SAME_UPPER":
            before = [t // 2 for t in total]
        else:
            before = [t - t // 2 for t in total]
        after = [t - bb for t, bb in zip(total, before)]
    elif auto == "VALID":
        before, after = [0] * n, [0] * n
    else:
        pads = list(at.get("pads", [0] * (2 * n)))
        before, after = pads[:n], pads[n:]
    e = cx.tensor(x)
    if n == 1:
        e = f"unsqueeze({e}, 2)"
    sp = ([1] if n == 1 else []) + in_sp
    st = ([1] if n == 1 else []) + s
    for i in range(2):  # spread by the stride: zeros between the inputs
        if st[i] == 1:
            continue
        ax = 2 + i
        shp = [x.shape[0], c] + sp
        grown = list(shp)
        grown[ax] = sp[i] * st[i]
        pairs = ", ".join(["(0, 0)"] * (ax + 1) + [f"(0, {st[i] - 1})"] + ["(0, 0)"] * (3 - ax))
        e = cx.let(f"reshape(pad(unsqueeze({e}, {ax + 1}), ({pairs},)), {shape_text(grown)})", "spread")
        idx = [":"] * 4
        idx[ax] = f":{(sp[i] - 1) * st[i] + 1}"
        e = cx.let(f"{e}[{', '.join(idx)}]", "spread")
        sp[i] = (sp[i] - 1) * st[i] + 1
    lo = ([0] if n == 1 else []) + [r - 1 - bb for r, bb in zip(reach, before)]
    hi = ([0] if n == 1 else []) + [r - 1 - a + o for r, a, o in zip(reach, after, op_)]
    if any(v < 0 for v in lo + hi):
        raise cx.unsupported("pads larger than the kernel's reach")
    if any(lo + hi):
        pairs = ", ".join(["(0, 0)", "(0, 0)"] + [f"({p}, {q})" for p, q in zip(lo, hi)])
        e = cx.let(f"pad({e}, ({pairs},))", "padded")
    ww = cx.tensor(w)
    kk = ([1] if n == 1 else []) + ks
    wt = (f"flip(reshape(permute(reshape({ww}, {shape_text([g, c // g, m_g, *kk])}), (0, 2, 1, 3, 4)), "
          f"{shape_text([g * m_g, c // g, *kk])}), (2, 3))")
    dd = ([1] if n == 1 else []) + d
    y = _conv2d_expr(e, cx.let(wt, "flipped_kernel"), (1, 1), tuple(dd), g)
    if n == 1:
        y = f"squeeze({y}, 2)"
    if b is not None:
        y = f"({y} + reshape({cx.tensor(b)}, {shape_text(_channel_shape(x.rank, g * m_g))}))"
    return [_cast(y, x.dtype)]
