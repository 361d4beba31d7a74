"""Ops of the `ai.onnx.ml` domain on numeric tensors, registered into `OPS` as `ai.onnx.ml.<op>`: Binarizer,
ArrayFeatureExtractor and TreeEnsemble (opset 5 of the domain).

Contract (ONNX-ML's semantics): Binarizer gives 1 where x > threshold, else 0, in x's type. ArrayFeatureExtractor
gathers the last axis at the given indices (a 1-d input gives a [1, k] result). TreeEnsemble walks every tree at
load time into one nested `where` per tree (the trees are attributes: static), comparing the feature with the
split by the node's mode (<=, <, >=, >, ==, !=, set membership; a NaN feature goes the way
`nodes_missing_value_tracks_true` says), and sums (or averages) the leaf weights per target; `post_transform`
NONE, SOFTMAX or LOGISTIC. String labels (LabelEncoder's string maps) are not supported (no string dtype).
"""

from __future__ import annotations

import numpy as np

from tgc.onnx.core import shape_text
from tgc.onnx.ops import OPS, _cast, _num

ML = "ai.onnx.ml."


def _binarizer(cx, node, ins, at, opset):
    x = ins[0]
    t = _num(float(at.get("threshold", 0.0)), x.dtype)
    one, zero = ("1.0", "0.0") if x.dtype.name.startswith(("f", "bf")) else ("1", "0")
    return [_cast(f"where({cx.tensor(x)} > {t}, {one}, {zero})", x.dtype)]


def _array_feature_extractor(cx, node, ins, at, opset):
    x, idx = ins
    e = cx.tensor(x) if x.rank > 1 else f"reshape({cx.tensor(x)}, (1, {x.shape[0]}))"
    ix = cx.static(idx, "the indices") if idx.const is not None else None
    if ix is not None:
        from tgc.dtype import dtypes
        from tgc.onnx.ops import _const

        ie = cx.tensor(_const(np.asarray(ix).reshape(-1).astype(np.int64), dtypes.i64, "features"))
    else:
        ie = f"reshape({cx.tensor(idx)}, (-1,))"
    return [f"take({e}, {ie}, axis=-1)"]


_COMPARE = {0: "<=", 1: "<", 2: ">=", 3: ">", 4: "==", 5: "!="}


def _tree_ensemble(cx, node, ins, at, opset):
    x = ins[0]
    ex = cx.tensor(x)
    n_targets = int(at["n_targets"])
    agg = int(at.get("aggregate_function", 1))
    post = int(at.get("post_transform", 0))
    if agg not in (0, 1) or post not in (0, 1, 2):
        raise cx.unsupported(f"aggregate_function {agg} with post_transform {post} (SUM or AVERAGE; NONE, SOFTMAX "
                             "or LOGISTIC)")

    def arr(name: str, default=None) -> np.ndarray:
        v = at.get(name, default)
        return np.asarray(v.const if hasattr(v, "const") else v)
    feat, modes, splits = arr("nodes_featureids"), arr("nodes_modes"), arr("nodes_splits").astype(np.float64)
    t_ids, f_ids = arr("nodes_truenodeids"), arr("nodes_falsenodeids")
    t_leaf, f_leaf = arr("nodes_trueleafs"), arr("nodes_falseleafs")
    missing = arr("nodes_missing_value_tracks_true", [0] * len(feat))
    leaf_target, leaf_w = arr("leaf_targetids"), arr("leaf_weights").astype(np.float64)
    members = arr("membership_values", []).astype(np.float64).reshape(-1)
    sets, cur = [], []
    for v in members:  # one set per MEMBER node, in node order, NaN-separated
        if np.isnan(v):
            sets.append(cur)
            cur = []
        else:
            cur.append(float(v))
    if cur:
        sets.append(cur)
    member_of: dict[int, list[float]] = {}
    pending = iter(sets)

    def claim_sets(i: int, is_leaf: bool, depth: int = 0) -> None:
        """The sets belong to the MEMBER nodes in the order a walk meets them (pre-order, true branch first)."""
        if is_leaf or depth > 64:
            return
        if int(modes[i]) == 6:
            member_of[i] = next(pending, [])
        claim_sets(int(t_ids[i]), bool(t_leaf[i]), depth + 1)
        claim_sets(int(f_ids[i]), bool(f_leaf[i]), depth + 1)
    for r in arr("tree_roots").reshape(-1):
        claim_sets(int(r), False)
    col = {}

    def feature(i: int) -> str:
        f = int(feat[i])
        if f not in col:
            col[f] = cx.let(f"cast({ex}[:, {f}], f64)", "feature")
        return col[f]

    def cond(i: int) -> str:
        v, m = feature(i), int(modes[i])
        if m == 6:
            c = " | ".join(f"({v} == {float(s)!r})" for s in member_of.get(i, [])) or "False"
        elif m in _COMPARE:
            c = f"({v} {_COMPARE[m]} {float(splits[i])!r})"
        else:
            raise cx.unsupported(f"node mode {m}")
        if int(missing[i]):
            c = f"(isnan({v}) | {c})"
        return f"({c})"

    def walk(i: int, is_leaf: bool, t: int, depth: int = 0) -> str:
        if depth > 64:
            raise cx.unsupported("a tree deeper than 64")
        if is_leaf:
            return repr(float(leaf_w[i])) if int(leaf_target[i]) == t else "0.0"
        a = walk(int(t_ids[i]), bool(t_leaf[i]), t, depth + 1)
        b = walk(int(f_ids[i]), bool(f_leaf[i]), t, depth + 1)
        return a if a == b else f"where({cond(i)}, {a}, {b})"
    roots = [int(r) for r in arr("tree_roots").reshape(-1)]
    n = x.shape[0]
    outs = []
    for t in range(n_targets):
        terms = [walk(r, False, t) for r in roots]
        total = " + ".join(f"({e})" for e in terms)
        if agg == 0:
            total = f"(({total}) / {len(roots)})"
        outs.append(cx.let(f"({total}) + full(({n},), 0.0, dtype=f64)", "tree_sum"))
    y = cx.let(f"stack({', '.join(outs)}, axis=1)", "trees")
    if post == 1:
        y = f"softmax({y}, axis=1)"
    elif post == 2:
        y = f"sigmoid({y})"
    out_dt = x.dtype if x.dtype.name in ("f32", "f64", "f16") else None
    e = f"reshape({y}, {shape_text((n, n_targets))})"
    return [_cast(f"cast({e}, {out_dt.name})", out_dt) if out_dt is not None else f"cast({e}, f32)"]


OPS[ML + "Binarizer"] = _binarizer
OPS[ML + "ArrayFeatureExtractor"] = _array_feature_extractor
OPS[ML + "TreeEnsemble"] = _tree_ensemble
