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

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tgc.dtype import DType, dtypes
from tgc.errors import TgcError
from tgc.onnx import control, hostops, mlops, moreops, quant, recurrent  # noqa: F401  (register control flow, ...)
from tgc.onnx.core import (
    _NP_TO_TGC,
    _ONNX_DTYPES,
    _ONNX_OF,
    MIN_OPSET,
    Ctx,
    Names,
    NeedDims,
    NeedHost,
    NeedStatic,
    Value,
    _to_array,
    _type_of,
    onnx_dtype,
)
from tgc.onnx.functions import expand as expand_function
from tgc.onnx.functions import infer_types
from tgc.onnx.nnops import OPS  # the op table, with the NN library's ops wired in


@dataclass
class Translation:
    source: str
    weights: dict[str, np.ndarray]
    inputs: dict[str, str]  # ONNX name -> .tg name (the model's real inputs, in order)
    outputs: dict[str, str]  # ONNX name -> .tg name
    dims: dict[str, str] = field(default_factory=dict)  # ONNX dim_param -> .tg dim name
    opset: int = 0
    ops: list[str] = field(default_factory=list)
    nodes: dict[int, str] = field(default_factory=dict)  # line of `source` -> the ONNX node it translates (for viz)


def read_model(path: str) -> Any:
    """Load and check an ONNX file (`onnx.load`, `onnx.checker`); a clear TgcError when it is not a model."""
    import onnx
    from google.protobuf.message import DecodeError

    if not os.path.exists(path):
        raise TgcError(f"no such file: {path}")
    try:
        model = onnx.load(path)
    except onnx.checker.ValidationError as e:  # (its external data file is missing, or not a file)
        raise _external_data_error(path, e) from None
    except (DecodeError, ValueError, RuntimeError, TypeError, UnicodeDecodeError) as e:
        if str(e).lower().startswith("external data"):  # (its external data file is too short)
            raise _external_data_error(path, e) from None
        raise TgcError(f"{path} is not an ONNX model: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                       hint="tgc reads .onnx model files (ModelProto) and .tg programs") from None
    except OSError as e:
        raise TgcError(f"cannot read {path}: {e}") from None
    if not model.HasField("graph") or model.ir_version == 0:
        raise TgcError(f"{path} is not an ONNX model: it holds no graph and no IR version",
                       hint="tgc reads .onnx model files (ModelProto) and .tg programs")
    check(model, path)
    return model


def _external_data_error(path: str, e: Exception) -> TgcError:
    said = " ".join(str(e).split())[:600]
    return TgcError(f"{path}: cannot load the model's weights (external data): {said}",
                    hint="keep the model's external data files beside it, as they were saved")


def check(model: Any, where: str) -> None:
    import onnx

    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as e:
        # the whole complaint on one line: the checker names the node on the lines after the first
        said = " ".join(str(e).replace("==> Context:", ";").split()).replace(" ;", ";")[:600] or type(e).__name__
        raise TgcError(f"{where}: the ONNX checker rejects the model: {said}") from None


DOMAINS = ("", "ai.onnx", "ai.onnx.ml")  # ai.onnx.ml: its numeric ops (tgc/onnx/mlops.py)


def op_key(node: Any) -> str:
    """A node's key in `OPS`: the op type for ai.onnx, `domain.op` for another domain."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def opset_of(model: Any) -> int:
    """The model's ai.onnx opset (a model of ai.onnx.ml ops only: the onnx package's latest)."""
    import onnx

    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    if any(imp.domain == "ai.onnx.ml" for imp in model.opset_import):
        return int(onnx.defs.onnx_opset_version())
    domains = ", ".join(sorted({imp.domain for imp in model.opset_import})) or "none"
    raise TgcError(f"the model imports no ai.onnx opset (domains: {domains}): tgc supports the ai.onnx domain "
                   "(and ai.onnx.ml's numeric ops) only")


def supported_ops() -> set[str]:
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
        key = op_key(n)
        used[key] = used.get(key, 0) + 1
    have = supported_ops()
    return {"opset": opset_of(model), "ir_version": model.ir_version, "producer": model.producer_name,
            "inputs": [io(v) for v in g.input if v.name not in inits], "outputs": [io(v) for v in g.output],
            "weights": len(g.initializer),
            "weight_bytes": int(sum(_tensor_nbytes(t) for t in g.initializer)),
            "ops": dict(sorted(used.items())),
            "missing": _missing_ops(model, have),
            "host": sorted(k for k in used if k in hostops.HOST_OPS)}


def _missing_ops(model: Any, have: set[str]) -> list[str]:
    """The ops of `model` that tgc lacks: those with no entry in `OPS` and, for an op ONNX defines as a function,
    those its body needs (`RandomUniformLike (in Bernoulli)`), as the translator would meet them."""
    import onnx

    from tgc.onnx.functions import _function_proto

    opset = opset_of(model)
    types: dict[str, Value | None] = {}

    def infer() -> None:  # the values' types, for the bodies that depend on them (context-dependent functions)
        try:
            g = onnx.shape_inference.infer_shapes(model).graph
        except Exception:  # noqa: BLE001 - no types: such bodies are then not built, and their ops reported
            g = model.graph
        for vi in [*g.input, *g.value_info, *g.output]:
            tt = vi.type.tensor_type
            if tt.elem_type in _ONNX_DTYPES and tt.HasField("shape"):
                types[vi.name] = Value(vi.name, _ONNX_DTYPES[tt.elem_type],
                                       tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim))
        for t in g.initializer:
            if t.data_type in _ONNX_DTYPES:
                types[t.name] = Value(t.name, _ONNX_DTYPES[t.data_type], tuple(t.dims))
        types[""] = None  # (inferred once)

    missing: set[str] = set()

    def visit(node: Any, within: str | None, depth: int) -> None:
        key = op_key(node)
        if key in have:
            return
        label = f"{key} (in {within})" if within else key
        if depth > 8 or not _is_function_op(key, opset):
            missing.add(label)
            return
        if "" not in types:
            infer()
        fp = _function_proto(node, [types.get(i) if i else None for i in node.input], opset)
        if fp is None:
            missing.add(label)
            return
        for inner in fp.node:
            visit(inner, within or key, depth + 1)

    for n in _all_nodes(model.graph):
        visit(n, None, 0)
    return sorted(missing)


def _is_function_op(key: str, opset: int) -> bool:
    """Whether ai.onnx op `key` has a function body at `opset` (it is then translated through its body)."""
    import onnx

    if "." in key:
        return False
    try:
        schema = onnx.defs.get_schema(key, opset, "")
    except onnx.defs.SchemaError:
        return False
    return any(v <= opset for v in [*schema.function_opset_versions,
                                    *schema.context_dependent_function_opset_versions])


def _data_sources(producers: dict[str, list[str]], name: str, inputs: set[str]) -> list[str]:
    """The graph inputs whose values (not only their shapes: Shape and Size stop the walk) `name` is computed
    from, so a shape-deciding value names the input a user must make constant."""
    out: list[str] = []
    seen: set[str] = set()
    todo = [name]
    while todo:
        v = todo.pop()
        if v in seen or not v:
            continue
        seen.add(v)
        if v in inputs:
            out.append(v)
            continue
        todo.extend(producers.get(v, []))
    return sorted(out)


def _graph_reads(g: Any) -> set[str]:
    return {i for n in _all_nodes(g) for i in n.input} | {o.name for o in g.output}


def _all_value_infos(g: Any) -> list:
    """The typed values of a graph and of its subgraphs (If branches, Loop and Scan bodies)."""
    out = [*g.value_info, *g.output, *g.input]
    for n in g.node:
        for a in n.attribute:
            if a.type == a.GRAPH:
                out += _all_value_infos(a.g)
    return out


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


def translate(model: Any, where: str = "<model>") -> Translation:
    """A checked ModelProto -> `Translation` (source, weights, name maps). Every TgcError names the model file
    `where` (and, where one node is at fault, the node)."""
    try:
        return _translate(model, where)
    except TgcError as e:
        if e.file is None and not e.msg.startswith(f"{where}:"):
            e.msg = f"{where}: {e.msg}"  # (in place: NeedHost and NeedStatic keep their type and fields)
        raise


def at_node(e: TgcError, tr: Translation) -> TgcError:
    """A source error `e` in a translation's `.tg` text, also said of the ONNX node its line translates."""
    about = tr.nodes.get(e.line) if e.line is not None else None
    if about and "(ONNX node " not in e.msg:
        e.msg = f"{e.msg} (ONNX node {about})"
    return e


def _translate(model: Any, where: str) -> Translation:
    import onnx

    opset = opset_of(model)
    if opset < MIN_OPSET:
        _check_old_opset(model, opset, where)
    for imp in model.opset_import:
        if imp.domain not in DOMAINS and any(n.domain == imp.domain for n in model.graph.node):
            bad = next(n for n in model.graph.node if n.domain == imp.domain)
            raise TgcError(f"unsupported: op '{imp.domain}.{bad.op_type}' (node '{bad.name or bad.output[0]}', "
                           f"domain {imp.domain} opset {imp.version}): tgc supports the ai.onnx domain (and "
                           "ai.onnx.ml's numeric ops) only")
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
    size_values: dict[str, tuple[int, list]] = {}
    exprs: dict[str, str] = {}  # a dim_param tgc made for a computed size -> its .tg text
    if dims:
        inferred, exprs, size_values = _sized_shapes(model, inferred, dims)
    types: dict[str, tuple[DType, tuple | None]] = {}
    for vi in _all_value_infos(inferred.graph):
        t = _type_of(vi, {**dims, **exprs})
        if t is not None and (vi.name not in types or types[vi.name][1] is None):
            types[vi.name] = t
    cx = Ctx(opset, types, dims)
    cx.names = names
    cx.size_values = size_values
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
    cx.run_body = lambda body, values: _run_body(cx, body, values, ops_used)
    used = {i for n in _all_nodes(g) for i in n.input} | {o.name for o in g.output}
    line_nodes: dict[int, str] = {}  # index in cx.lines -> the (top-level) node that emitted it
    try:
        for index, node in enumerate(g.node):
            first_line = len(cx.lines)
            try:
                _run_nodes(cx, [node], used, ops_used)
            except NeedHost as e:
                e.index = index
                raise
            about = f"{node.op_type} '{node.name}'" if node.name else node.op_type
            for i in range(first_line, len(cx.lines)):
                line_nodes[i] = f"{about} -> {', '.join(o for o in node.output if o)}"
    except NeedStatic as e:
        if e.name in tr_inputs:
            raise
        sources = _data_sources(cx.producers, e.name, set(tr_inputs))
        if not sources and cx.dims:  # computed from the inputs' sizes alone: known once the dims are
            raise NeedDims(f"{e.msg.split(' must be a constant')[0]}: computed from the inputs' sizes beyond "
                           "what tgc keeps as size expressions; the translation takes the values of the symbolic "
                           f"dims {', '.join(cx.dims)}",
                           list(cx.dims), hint="it runs with the dims known (-D or the inputs' arrays), "
                           "translated per size") from None
        if not sources:
            raise
        raise NeedStatic(f"{e.msg}; it is computed from the input(s) {', '.join(sources)}", sources[0],
                         hint=e.hint) from None
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
    if dims:  # shape arithmetic whose consumers took size expressions instead is dead: not in the text
        line_nodes = _drop_dead(cx, rets, line_nodes)
    head = [f"# translated by tgc from ONNX: {where} (opset {opset}, {len(g.node)} nodes)"]
    renamed = [(k, v) for k, v in [*tr_inputs.items(), *tr_outputs.items()] if k != v]
    for k, v in renamed:
        head.append(f"# onnx-name: {v} = {k}")
    source = "\n".join([*head, *cx.decls, *cx.lines, "return " + ", ".join(rets)]) + "\n"
    first = len(head) + len(cx.decls) + 1  # the source line of cx.lines[0]
    return Translation(source, cx.weights, tr_inputs, tr_outputs, dims, opset, ops_used,
                       {first + i: about for i, about in line_nodes.items()})


_IDENT = re.compile(r"[A-Za-z_]\w*")


def _drop_dead(cx: Ctx, rets: list[str], line_nodes: dict[int, str]) -> dict[int, str]:
    """Drop the lines of `cx` no return value depends on, and the weights only they read (each line assigns a
    fresh name, so a name's one line; any identifier in a line's text counts as read, which keeps a line at
    worst). The model's inputs stay declared. Returns `line_nodes` for the lines kept."""
    live = set(rets)
    keep = []
    for i in range(len(cx.lines) - 1, -1, -1):
        name, _, expr = cx.lines[i].partition(" = ")
        if name in live:
            keep.append(i)
            live.update(_IDENT.findall(expr))
    keep.reverse()
    cx.lines = [cx.lines[i] for i in keep]
    dead = {w for w in cx.weights if w not in live}
    cx.weights = {w: a for w, a in cx.weights.items() if w not in dead}
    cx.decls = [d for d in cx.decls if d.partition(":")[0] not in dead]
    return {j: line_nodes[i] for j, i in enumerate(keep) if i in line_nodes}


def _sized_shapes(model: Any, inferred: Any, dims: dict[str, str]) -> tuple[Any, dict[str, str], dict]:
    """ONNX's inference `inferred` of a model with symbolic dims, again with the shapes `symshapes.propagate`
    computes from the inputs' sizes pinned (the outputs of Reshape, Expand, ... by a shape from Shape), so the
    values after them are typed in the dims: (the inferred model, {dim_param tgc made: its .tg text}, {value:
    (rank, its sizes as .tg text and ints)} for the op functions). Rounds until one pins nothing new, as a
    pinned shape may type a Shape the next round follows (a chain of view(b, s, -1) pins one layer a round)."""
    import onnx
    from onnx import helper, numpy_helper

    from tgc.onnx import symshapes

    consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and any(a.name == "value" for a in n.attribute):
            consts[n.output[0]] = numpy_helper.to_array(next(a.t for a in n.attribute if a.name == "value"))
    param_of = {tg: p for p, tg in dims.items()}
    taken = {d.dim_param for vi in _all_value_infos(inferred.graph) for d in vi.type.tensor_type.shape.dim}
    # the model as inference needs it: a big initializer (a weight, not a shape) as a typed graph input, so a
    # round copies and infers the structure, not the weights (64 MB of weights: 0.59 -> 0.32 s CPU to translate)
    light = onnx.ModelProto()
    _without_big_weights(model, light)
    exprs: dict[str, str] = {}
    size_of: dict[str, Any] = {}  # a .tg text in a shape -> its symshapes size
    pinned: dict[str, list] = {}
    known: dict[str, tuple[int, list]] = {}
    for _ in range(len(model.graph.node) + 1):  # (until a round pins nothing new: each pins at least one output)
        shapes: dict[str, tuple | None] = {}
        elem: dict[str, int] = {}
        for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
            t = _type_of(vi, {**dims, **exprs})
            elem[vi.name] = vi.type.tensor_type.elem_type
            if t is not None and t[1] is not None:
                shapes[vi.name] = tuple(size_of.get(d, d) if isinstance(d, str) else d for d in t[1])
        known, out_shapes = symshapes.propagate(model.graph, shapes, consts)
        new = {o: sh for o, sh in out_shapes.items()
               if o not in pinned and o not in shapes and sh is not None and elem.get(o)}
        if not new:
            break
        pinned.update(new)
        m2 = onnx.ModelProto()
        m2.CopyFrom(light)
        outputs = {o.name: o for o in m2.graph.output}
        for name, sh in pinned.items():
            entries: list = []
            for v in sh:
                if isinstance(v, int):
                    entries.append(v)
                elif isinstance(v, symshapes.Mono) and v.coef == 1 and len(v.names) == 1 and v.names[0] in param_of:
                    entries.append(param_of[v.names[0]])
                else:
                    text = symshapes.text(v)
                    param = next((p for p, t in exprs.items() if t == text), None)
                    if param is None:
                        param = f"tgc_size_{len(exprs)}"
                        while param in taken:
                            param += "_"
                        exprs[param] = text
                        size_of[text] = v
                    entries.append(param)
            vi = helper.make_tensor_value_info(name, elem[name], entries)
            if name in outputs:
                outputs[name].type.CopyFrom(vi.type)
            else:
                m2.graph.value_info.append(vi)
        try:
            again = onnx.shape_inference.infer_shapes(m2, strict_mode=False, data_prop=True)
        except Exception:  # noqa: BLE001 - the pinned shapes conflict with ONNX's: keep what it gave before
            break
        inferred = _keep_types(inferred, again, {**dims, **exprs})
    values = {name: (rank, [symshapes.text(v) if not isinstance(v, (int, bool)) else v for v in vals])
              for name, (rank, vals) in known.items()}
    return inferred, exprs, values


def _keep_types(before: Any, after: Any, dims: dict[str, str]) -> Any:
    """`after` (a round's inference, the model without its weights) with the shapes `before` had for the values
    it leaves untyped (a Resize by a float scales initializer, typed only with the values), appended to its
    value_info (the translation takes a value's first typed entry)."""
    typed = {vi.name for vi in [*after.graph.input, *after.graph.value_info, *after.graph.output]
             if (t := _type_of(vi, dims)) is not None and t[1] is not None}
    for vi in [*before.graph.value_info, *before.graph.output]:
        t = _type_of(vi, dims)
        if vi.name not in typed and t is not None and t[1] is not None:
            after.graph.value_info.append(vi)
            typed.add(vi.name)
    return after


def _without_big_weights(model: Any, out: Any, limit: int = 4096) -> None:
    """`model` into `out` with each initializer of more than `limit` elements, or of a float type and more
    than 64 elements, replaced by a graph input of its type and shape (shape inference reads the values of
    small ones only: integer shapes, a Resize's scales)."""
    from onnx import helper

    small, big = [], []
    for t in model.graph.initializer:
        n = math.prod(t.dims) if len(t.dims) else 1
        (small if n <= 64 or (n <= limit and t.data_type in (6, 7)) else big).append(t)  # (INT32, INT64)
    g = model.graph
    keep = helper.make_graph([], g.name, list(g.input), list(g.output), small, value_info=list(g.value_info))
    keep.node.extend(g.node)
    names = {v.name for v in g.input}
    keep.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in big
                      if t.name not in names)
    out.ir_version, out.producer_name = model.ir_version, model.producer_name
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    out.graph.CopyFrom(keep)


def _run_nodes(cx: Ctx, nodes: list, used: set[str], ops_used: list[str]) -> None:
    """Translate `nodes` in order into cx (their outputs into cx.values); `used`: the names something reads."""
    opset = cx.opset
    for node in nodes:
        cx.node = node
        reads = [] if node.op_type in ("Shape", "Size") else [*node.input, *(
            i for a in node.attribute if a.type == a.GRAPH for i in _graph_reads(a.g))]
        for o in node.output:
            cx.producers[o] = reads
        if op_key(node) not in ops_used:
            ops_used.append(op_key(node))
        for name in node.input:
            if name and name not in cx.values:
                raise TgcError(f"{cx.where()}: input '{name}' is not produced by any node")
        ins = [cx.values[i] if i else None for i in node.input]
        fn = OPS.get(op_key(node))
        if fn is None:
            expanded = expand_function(cx, node, ins)  # an op ONNX defines as a function of other ops
            if expanded is None:
                raise TgcError(f"unsupported op '{op_key(node)}' (node '{node.name or node.output[0]}', "
                               f"opset {opset})", hint="`tgc inspect MODEL.onnx` lists every op the model uses "
                               "and the ones tgc lacks")
            body, cx.opset = expanded
            try:
                inner = {i for n in body for i in n.input} | {i for n in body for a in n.attribute
                                                              if a.type == a.GRAPH for i in _graph_reads(a.g)}
                _run_nodes(cx, body, used | inner, ops_used)
            finally:
                cx.opset, cx.node = opset, node
            continue
        attrs = {a.name: _attr(a, cx) for a in node.attribute}
        outs = _fold(cx, node, ins, opset)
        if outs is None:
            try:
                outs = fn(cx, node, ins, attrs, opset)
            except TgcError:
                raise
            except (TypeError, KeyError, IndexError, ValueError, AttributeError, ZeroDivisionError) as e:
                # an input of unknown shape, an attribute combination the op function does not handle
                sym = [(v.name, ax, d) for v in ins if v is not None and v.shape
                       for ax, d in enumerate(v.shape) if isinstance(d, str)]
                if sym and isinstance(e, TypeError):  # (arithmetic on a dim name: the op needs that size's value)
                    param = {tg: p for p, tg in cx.dims.items()}
                    what = ", ".join(f"axis {ax} of '{n}' is '{param.get(d, d)}'" for n, ax, d in sym)
                    raise NeedDims(f"cannot translate {cx.where()} symbolically: it needs its inputs' sizes as "
                                   f"numbers here, but {what} (an ONNX dim_param, a symbolic size)", list(cx.dims),
                                   hint="it runs with the dims known (-D or the inputs' arrays), translated per "
                                   "size") from None
                raise TgcError(f"cannot translate {cx.where()}: {type(e).__name__}: {e}",
                               hint="an op's inputs may need shapes that ONNX shape inference did not give") from None
        for i, out_name in enumerate(node.output):
            if not out_name or out_name not in used:  # (an output nothing reads, as Dropout's mask)
                continue
            if i >= len(outs) or outs[i] is None:
                raise cx.unsupported(f"output {i} ('{out_name}')")
            cx.values[out_name] = _bind_output(cx, out_name, outs[i])


def _run_body(cx: Ctx, body: Any, values: list[Value], ops_used: list[str]) -> list[Value]:
    """One pass through a subgraph (If's branch, one Scan or Loop step): its inputs bound to `values`, the outer
    scope's values visible, its outputs returned; the outer scope is as before afterwards."""
    saved, node = dict(cx.values), cx.node
    try:
        for vi, v in zip(body.input, values):
            cx.values[vi.name] = Value(vi.name, v.dtype, v.shape, v.expr, v.const)
        for t in body.initializer:
            arr, dt = _to_array(t)
            cx.values[t.name] = Value(t.name, dt, tuple(arr.shape), const=arr)
        used = {i for n in _all_nodes(body) for i in n.input} | {o.name for o in body.output}
        if any(n.output and n.output[0] not in cx.types for n in body.node):  # (types once, not per value)
            infer_types(cx, list(body.node), [(vi.name, v) for vi, v in zip(body.input, values)],
                        [o.name for o in body.output], cx.opset)
        _run_nodes(cx, list(body.node), used, ops_used)
        outs = []
        for o in body.output:
            if o.name not in cx.values:
                raise TgcError(f"{cx.where()}: subgraph output '{o.name}' is not produced by any node")
            outs.append(cx.values[o.name])
        return outs
    finally:
        cx.values, cx.node = saved, node


def _check_old_opset(model: Any, opset: int, where: str) -> None:
    """A model older than opset MIN_OPSET translates when every op it uses has the same schema at its opset as
    at MIN_OPSET (as Not, Relu, ...); an op that changed since (legacy broadcasting, consumed_inputs) is refused."""
    import onnx

    for n in _all_nodes(model.graph):
        try:
            old = onnx.defs.get_schema(n.op_type, opset, n.domain).since_version
            new = onnx.defs.get_schema(n.op_type, MIN_OPSET, n.domain).since_version
        except onnx.defs.SchemaError:
            old, new = -1, 0
        if old != new:
            raise TgcError(f"{where}: opset {opset} is older than tgc supports (opset {MIN_OPSET} and later): op "
                           f"'{n.op_type}' (node '{n.name or n.output[0]}') changed since",
                           hint="convert it with onnx.version_converter.convert_version")


def _probe(cx: Ctx, expr: str, out_name: str) -> tuple[DType, tuple]:
    """The dtype and shape of `expr` where ONNX's shape inference gave none (inside expanded functions, an
    unrolled Scan step, ...): traced by the front end onto the program so far, whose lines are traced once, as
    they come (`cx.traced`), so a probe costs the lines since the last one, not the whole program (without dims:
    a model with symbolic dims needs inference)."""
    from tgc.dsl.frontend import parse, trace_onto
    from tgc.ir.shapes import shape_of

    if cx.dims:
        raise NeedDims(f"the type of '{out_name}' from {cx.where()} is unknown (ONNX shape inference gave none, "
                       f"and the model's inputs have symbolic sizes: {', '.join(cx.dims)})", list(cx.dims),
                       hint="it runs with the dims known (-D or the inputs' arrays), translated per size")
    n_decls, n_lines = cx.traced_upto
    # the new lines, then the probed expression as the one return (a name of its own, not kept in `cx.traced`)
    source = "\n".join([*cx.decls[n_decls:], *cx.lines[n_lines:], f"return {expr}"]) + "\n"
    try:
        parsed = parse(source, "<onnx>")
        probed = parsed.returns
        parsed.returns = []
        trace_onto(parsed, cx.traced, cx.traced_inputs)
        cx.traced_upto = (len(cx.decls), len(cx.lines))
        parsed.body, parsed.inputs, parsed.returns = [], [], probed
        out = trace_onto(parsed, cx.traced, cx.traced_inputs)[0].uop
    except TgcError as e:
        raise TgcError(f"cannot translate {cx.where()}: {e.msg}") from None
    return out.dtype, tuple(shape_of(out))


FOLD_LIMIT = 1 << 16  # elements: constants up to this size are computed at load time
_FOLDS_ITSELF = {"Constant", "ConstantOfShape", "Shape", "Size", "Identity", "Cast", "Reshape", "Unsqueeze",
                 "Squeeze", "Flatten", "Concat", "Gather", "Transpose", "Slice"}  # (ops.py computes these directly)


def _fold(cx: Ctx, node: Any, ins: list, opset: int) -> list | None:
    """A node whose inputs are all known at load time (shape arithmetic, small constants), computed now by
    ONNX's reference evaluator, the way any compiler folds constants; None where it does not apply."""
    present = [v for v in ins if v is not None]
    if not present or any(v.const is None or v.const.size > FOLD_LIMIT or v.dtype == dtypes.bf16 for v in present):
        return None
    if node.op_type in _FOLDS_ITSELF or node.op_type.startswith("Random") or \
            any(a.type in (a.GRAPH, a.GRAPHS) for a in node.attribute):
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
