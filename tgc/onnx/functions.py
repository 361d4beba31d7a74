"""ONNX ops that ONNX itself defines as functions of other ops (Swish, CenterCropPad, LinearAttention, Mish, ...):
an op with no entry in `OPS` whose schema has a function body for the model's opset is expanded into that body
and its nodes translated in its place.

Contract: `expand(cx, node, ins)` gives `(nodes, opset)`, the function's nodes with their edges renamed into
the node's (inputs, outputs; internal values prefixed with the node's name so they are unique) and attribute
references resolved (the node's value, else the function's default), and the ai.onnx opset the body is written
for; or None where the op has no function body (the caller then reports the op as unsupported). The types and
shapes of the body's values come from ONNX's shape inference on the body (`cx.types` is filled).
"""

from __future__ import annotations

from typing import Any

from tgc.onnx.core import _ONNX_OF, Ctx, Value


def _function_proto(node: Any, ins: list[Value | None], opset: int) -> Any | None:
    import onnx
    from onnx import helper

    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return None
    fp = onnx.FunctionProto()
    plain = [v for v in schema.function_opset_versions if v <= opset]
    if plain:
        fp.ParseFromString(schema.get_function_with_opset_version(max(plain)))
        return fp
    dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not dependent:
        return None
    types = []
    for v in ins:
        if v is None:
            types.append(onnx.TypeProto().SerializeToString())
            continue
        shape = [s if isinstance(s, int) else None for s in v.shape] if v.shape is not None else None
        types.append(helper.make_tensor_type_proto(_ONNX_OF[v.dtype], shape).SerializeToString())
    try:
        raw = schema.get_context_dependent_function_with_opset_version(max(dependent), node.SerializeToString(),
                                                                       types)
    except Exception:  # noqa: BLE001 - ONNX builds no body for these inputs: the op stays unsupported
        return None
    if not raw:
        return None
    fp.ParseFromString(raw)
    return fp


def _rename_graph(g: Any, rename: Any) -> None:
    for vi in [*g.input, *g.output, *g.value_info]:
        vi.name = rename(vi.name)
    for t in g.initializer:
        t.name = rename(t.name)
    for n in g.node:
        _rename_node(n, rename)


def _rename_node(n: Any, rename: Any) -> None:
    n.input[:] = [rename(i) for i in n.input]
    n.output[:] = [rename(o) for o in n.output]
    for a in n.attribute:
        if a.type == a.GRAPH:
            _rename_graph(a.g, rename)
        elif a.type == a.GRAPHS:
            for sub in a.graphs:
                _rename_graph(sub, rename)


def expand(cx: Ctx, node: Any, ins: list[Value | None]) -> tuple[list, int] | None:
    import onnx

    fp = _function_proto(node, ins, cx.opset)
    if fp is None:
        return None
    body_opset = next((int(o.version) for o in fp.opset_import if o.domain in ("", "ai.onnx")), cx.opset)
    io = {name: node.input[i] if i < len(node.input) else "" for i, name in enumerate(fp.input)}
    io.update({name: node.output[i] for i, name in enumerate(fp.output) if i < len(node.output) and node.output[i]})
    prefix = cx.names.new(f"{node.name or node.output[0]}_{node.op_type}", "f") + "__"

    def rename(name: str) -> str:
        if name in io:
            return io[name]
        return "" if name == "" else prefix + name

    given = {a.name: a for a in node.attribute}
    defaults = {a.name: a for a in fp.attribute_proto}
    try:  # the op's own defaults, for attributes the function's body refers to but does not default
        for name, spec in onnx.defs.get_schema(node.op_type, cx.opset, node.domain).attributes.items():
            if name not in defaults and spec.default_value.name:
                defaults[name] = spec.default_value
    except onnx.defs.SchemaError:
        pass
    nodes = []
    for fn_node in fp.node:
        n = onnx.NodeProto()
        n.CopyFrom(fn_node)
        attrs = []
        for a in n.attribute:
            if a.ref_attr_name:
                src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if src is None:
                    continue  # the attribute is unset: the op's own default applies
                b = onnx.AttributeProto()
                b.CopyFrom(src)
                b.name = a.name
                attrs.append(b)
            else:
                attrs.append(a)
        del n.attribute[:]
        n.attribute.extend(attrs)
        _rename_node(n, rename)
        nodes.append(n)
    infer_types(cx, nodes, list(zip(node.input, ins)), [o for o in node.output if o], body_opset)
    return nodes, body_opset


def infer_types(cx: Ctx, nodes: list, typed: list[tuple[str, Value | None]], outputs: list[str], opset: int) -> None:
    """ONNX's shape inference on `nodes` alone (an expanded function, a Loop or Scan body; their inputs typed from
    the `typed` values) into `cx.types`, so their values need no probing one by one."""
    import onnx
    from onnx import helper

    from tgc.onnx.core import _type_of

    inputs, seen = [], set()
    for name, v in typed:
        if v is None or not name or name in seen:
            continue
        seen.add(name)
        shape = [s if isinstance(s, int) else None for s in v.shape] if v.shape is not None else None
        inputs.append(helper.make_tensor_value_info(name, _ONNX_OF[v.dtype], shape))
    produced = {o for n in nodes for o in n.output}
    outer = sorted({i for n in nodes for i in n.input if i and i not in produced and i not in seen})
    for name in outer:  # values of the outer scope a body reads (rare): typed where known
        v = cx.values.get(name)
        if v is not None and v.shape is not None:
            inputs.append(helper.make_tensor_value_info(name, _ONNX_OF[v.dtype],
                                                        [s if isinstance(s, int) else None for s in v.shape]))
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outputs]
    g = helper.make_graph(nodes, "expanded", inputs, outs)
    try:
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - the values' types are then probed one by one
        return
    for vi in [*inferred.graph.value_info, *inferred.graph.output]:
        t = _type_of(vi, cx.dims)
        if t is not None and t[1] is not None and vi.name not in cx.types:
            cx.types[vi.name] = t
