"""A `--shard` spec made non-negative for the warm path's program-cache lookup, without the front end.

The program cache keys a device list's entry by the shard spec as the cold path makes it (`Program.shard_axes`:
every axis non-negative). A negative axis (counting from the end, as numpy's) is turned into that form here from
the input's rank in the source's declaration (`name: dtype[d0, d1, ...]`, read with Python's `ast`, as the DSL is
Python syntax); the caller checks the entry's own signature against these ranks (`ranks_match`). Anything that
does not read (no such input, an axis out of range, a source `ast` refuses) is None: the cold path reports it.
"""

from __future__ import annotations

import ast
from typing import Any


def declared_ranks(source: str) -> dict[str, int]:
    """{input name: rank} of the source's top-level input declarations; {} where the source does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    ranks: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is None:
            ann = node.annotation
            if isinstance(ann, ast.Name):
                ranks[node.target.id] = 0
            elif isinstance(ann, ast.Subscript):
                ranks[node.target.id] = len(ann.slice.elts) if isinstance(ann.slice, ast.Tuple) else 1
    return ranks


def normalize(source: str, shard: dict[str, int]) -> dict[str, int] | None:
    """`shard` with every axis non-negative (a negative one counts from the end of its input's declared rank), or
    None where an axis cannot be placed so (the cold path then says why)."""
    if all(axis >= 0 for axis in shard.values()):
        return dict(shard)
    ranks = declared_ranks(source)
    out: dict[str, int] = {}
    for name, axis in shard.items():
        rank = ranks.get(name)
        if rank is None or not -rank <= axis < rank:
            return None
        out[name] = axis + rank if axis < 0 else axis
    return out


def ranks_match(header: dict[str, Any], source: str, shard: dict[str, int]) -> bool:
    """Whether a cache entry's signature (`header["inputs"]`) gives each sharded input the rank the source
    declares (so a negative axis was made non-negative as the cold path made it)."""
    ranks = declared_ranks(source)
    shapes = {d.get("name"): d.get("shape") for d in header.get("inputs", []) if isinstance(d, dict)}
    return all(isinstance(shapes.get(n), list) and len(shapes[n]) == ranks.get(n) for n in shard)
