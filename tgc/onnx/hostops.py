"""ONNX ops whose output shape depends on input values (NonZero, Unique, NonMaxSuppression), registered into
`OPS`. With inputs known at load they are folded like any constant (`translate._fold`); otherwise the op raises
`NeedHost`: `tgc.staged.StagedModel` then runs the model in stages, computing this node on the host between two
tgc programs (docs/DESIGN.md, "ONNX in": data-dependent output shapes)."""

from __future__ import annotations

from typing import Any

from tgc.onnx.core import Ctx, NeedHost
from tgc.onnx.ops import op

HOST_OPS = ("NonZero", "Unique", "NonMaxSuppression")


@op(*HOST_OPS)
def _host(cx: Ctx, node: Any, ins: list, attrs: dict, opset: int) -> list:
    raise NeedHost(f"{cx.where()}: its output shape depends on the values of its inputs, which are not known "
                   "at load", node.op_type,
                   hint="`tgc run` and tgc.load(...).run run such a model in stages (the node on the host); "
                   "`tgc compile`, `bench`, `beam` and `import` need one static program")
