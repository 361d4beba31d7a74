"""ONNX's own node cases for the operators of tgc/dsl/nnlib.py, each node written as one `.tg` call.

    .venv/bin/python tools/nnlib_onnx_cases.py [OP ...] [--device CPU] [-v]

Contract: needs the `onnx` package (its `collect_testcases`: inputs and expected outputs included). Every case
whose model is a single node of an operator in `OPS` becomes a `.tg` program: the node's attributes become
keyword arguments of the same names, tensor inputs become `.tg` inputs, and the inputs ONNX gives as tensors
but tgc needs when compiling (Resize's roi/scales/sizes, OneHot's depth and values) are written into the call.
Each output is compared with the case's expected one (its rtol/atol, at least 1e-3/1e-5). Prints one line per
case that fails, then the counts; exit status 1 when any fails. This is also the reference for the ONNX
importer's mapping of these operators onto tgc's functions.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import numpy as np

import tgc

OPS = {"Conv": "conv", "ConvTranspose": "conv_transpose", "MaxPool": "max_pool", "AveragePool": "avg_pool",
       "LpPool": "lp_pool", "GlobalAveragePool": "global_avg_pool", "GlobalMaxPool": "global_max_pool",
       "GlobalLpPool": "global_lp_pool", "BatchNormalization": "batch_norm",
       "InstanceNormalization": "instance_norm", "GroupNormalization": "group_norm",
       "LayerNormalization": "layer_norm", "LRN": "lrn", "MeanVarianceNormalization": "mean_variance_normalization",
       "Resize": "resize", "GatherElements": "gather_elements", "GatherND": "gather_nd",
       "ScatterElements": "scatter_elements", "ScatterND": "scatter_nd", "OneHot": "one_hot",
       "DepthToSpace": "depth_to_space", "SpaceToDepth": "space_to_depth", "Hardmax": "hardmax"}
IGNORED_ATTRIBUTES = {"stash_type", "spatial", "is_test", "consumed_inputs"}  # no effect on the values here
DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "int64": "i64", "int32": "i32", "int16": "i16",
          "int8": "i8", "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "bool"}


def literal(v: Any) -> str:
    """A `.tg` literal: tuples for lists and arrays, strings in double quotes."""
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(literal(e) for e in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, bytes):
        v = v.decode()
    return f'"{v}"' if isinstance(v, str) else repr(v)


def node_call(node: Any, opset: int, values: dict[str, np.ndarray]) -> tuple[str, dict[str, np.ndarray]]:
    """The `.tg` call of one node and the tensors it reads."""
    from onnx import helper
    op, names = node.op_type, list(node.input)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in IGNORED_ATTRIBUTES}
    used: dict[str, np.ndarray] = {}

    def tensor(name: str) -> str:
        if not name:
            return "None"
        used[name] = values[name]
        return name

    def given(i: int) -> np.ndarray | None:
        v = values.get(names[i]) if i < len(names) and names[i] else None
        return v if v is not None and v.size else None

    kw = {k: literal(v) for k, v in attrs.items()}
    if op == "Resize":
        args = [tensor(names[0])]
        for i, key in ((1, "roi"), (2, "scales"), (3, "sizes")):
            if given(i) is not None:
                kw[key] = literal(given(i).astype(float) if key != "sizes" else given(i))
        if opset < 11:  # Upsample-era Resize: asymmetric coordinates
            kw.setdefault("coordinate_transformation_mode", '"asymmetric"')
    elif op == "OneHot":
        args = [tensor(names[0]), literal(int(values[names[1]].reshape(-1)[0]))]
        kw["values"] = literal(values[names[2]].reshape(-1))
    else:
        args = [tensor(n) for n in names]
        while args and args[-1] == "None":
            args.pop()
    if op == "LayerNormalization" and len(node.output) > 1:
        kw["return_stats"] = "True"
    if op == "MaxPool" and len(node.output) > 1:
        kw["return_indices"] = "True"
    if op == "Hardmax" and opset < 13:
        raise NotImplementedError("Hardmax before opset 13 (coerced to 2-d): reshape around hardmax")
    return f"{OPS[op]}({', '.join(args + [f'{k}={v}' for k, v in kw.items()])})", used


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help="ONNX op types (default: all of OPS)")
    parser.add_argument("--device", default="CPU")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every case")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from onnx.backend.test.case.node import collect_testcases
    wanted = set(args.ops) or set(OPS)
    passed = failed = skipped = 0
    for case in collect_testcases(None):
        graph = case.model.graph
        if len(graph.node) != 1 or graph.node[0].op_type not in wanted:
            continue
        node = graph.node[0]
        opset = max(o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx"))
        for inputs, outputs in case.data_sets:
            values = dict(zip([n for n in node.input if n], inputs))
            try:
                call, used = node_call(node, opset, values)
                if any(v.dtype.name not in DTYPES for v in used.values()):
                    raise NotImplementedError("an input dtype numpy cannot hand to tgc (bfloat16)")
                outs = [f"out{i}" for i in range(len(outputs))]
                src = "".join(f"{n}: {DTYPES[v.dtype.name]}[{', '.join(map(str, v.shape))}]\n" for n, v in used.items())
                src += f"{', '.join(outs)} = {call}\nreturn {', '.join(outs)}\n"
                got = list(tgc.loads(src).run(device=args.device, **used).values())
            except NotImplementedError as e:
                skipped += 1
                print(f"skip  {case.name}: {e}")
                continue
            except Exception as e:  # noqa: BLE001 - every failure is reported as a line, then counted
                failed += 1
                print(f"error {case.name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
                continue
            bad = [i for i, (g, w) in enumerate(zip(got, outputs)) if g.shape != w.shape or not np.allclose(
                g.astype(np.float64), w.astype(np.float64), rtol=max(case.rtol, 1e-3), atol=max(case.atol, 1e-5),
                equal_nan=True)]
            if bad:
                failed += 1
                print(f"FAIL  {case.name}: output(s) {bad} differ; {call}")
            else:
                passed += 1
                if args.verbose:
                    print(f"ok    {case.name}: {call}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
