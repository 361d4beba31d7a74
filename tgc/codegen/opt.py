"""Kernel optimizations on the AST's loop ranges.

Today: splitting the outer loop across CPU threads (THREAD). The AST keeps every loop as a RANGE, so an
optimization is a substitution of ranges by expressions over new ranges.
"""

from __future__ import annotations

import os
from typing import Any

from tgc.dtype import dtypes
from tgc.ir.shapes import prod, shape_of
from tgc.ir.symbolic import simplify
from tgc.ir.uop import Ops, RangeKind, UOp, substitute

INDEX = dtypes.i32
# below this many inner-loop iterations a kernel is not worth a thread launch
MIN_WORK_PER_THREAD = 1 << 15


def loop_ranges(ast: UOp) -> list[UOp]:
    return sorted((u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] is RangeKind.LOOP),
                  key=lambda r: r.arg[0])


def all_ranges(ast: UOp) -> list[UOp]:
    return sorted((u for u in ast.toposort() if u.op is Ops.RANGE), key=lambda r: r.arg[0])


def total_work(ast: UOp) -> int:
    return prod(r.src[0].arg for r in all_ranges(ast) if r.src[0].op is Ops.CONST)


def split_threads(ast: UOp, threads: int) -> tuple[UOp, int]:
    """Give each of `threads` threads a contiguous chunk of the first output loop."""
    loops = loop_ranges(ast)
    if not loops or threads <= 1:
        return ast, 1
    r = loops[0]
    n = r.src[0].arg
    threads = min(threads, n)
    if threads <= 1:
        return ast, 1
    chunk = -(-n // threads)
    threads = -(-n // chunk)
    core = UOp(Ops.DEFINE_VAR, INDEX, (), ("core_id", 0, threads - 1))
    start = core * UOp.const(INDEX, chunk)
    left = UOp.const(INDEX, n) - start
    end = (left < UOp.const(INDEX, chunk)).where(left, UOp.const(INDEX, chunk))
    inner = UOp(Ops.RANGE, INDEX, (end,), (r.arg[0], RangeKind.LOOP))
    inner.__dict__["_bounds"] = (0, chunk - 1)
    new = substitute(ast, {r: start + inner})
    return simplify(new), threads


def optimize(ast: UOp, device: Any, beam: int = 0, bufs: list | None = None) -> tuple[UOp, dict, list]:
    """(optimized AST, launch facts, applied opts)."""
    launch: dict[str, Any] = {}
    opts: list = []
    if os.environ.get("NOOPT", "") not in ("", "0"):
        return ast, launch, opts
    if getattr(device, "launch_style", "cpu") == "cpu" and hasattr(device, "cores"):
        cores = device.cores
        work = total_work(ast)
        if cores > 1 and work >= 2 * MIN_WORK_PER_THREAD:
            threads = min(cores, work // MIN_WORK_PER_THREAD)
            ast, threads = split_threads(ast, threads)
            if threads > 1:
                launch["global_size"] = (threads, 1, 1)
                opts.append(("THREAD", 0, threads))
    if getattr(device, "launch_style", "cpu") == "gpu":
        ast, launch = map_to_grid(ast, max_local=getattr(device, "max_local_size", 256))
        opts.append(("GRID", launch["global_size"], launch["local_size"]))
    _ = shape_of
    return ast, launch, opts


def map_to_grid(ast: UOp, max_local: int = 256) -> tuple[UOp, dict]:
    """Output loops -> GPU indices: one flat index split into work-groups of a size that divides it exactly
    (so no thread is out of range and no guard is needed)."""
    loops = loop_ranges(ast)
    total = prod(r.src[0].arg for r in loops)
    local = 1
    for cand in range(min(max_local, total), 0, -1):
        if total % cand == 0:
            local = cand
            break
    groups = total // local
    gidx = UOp(Ops.SPECIAL, INDEX, (), ("gidx0", groups))
    lidx = UOp(Ops.SPECIAL, INDEX, (), ("lidx0", local))
    flat = (gidx * UOp.const(INDEX, local) + lidx) if groups > 1 else lidx
    mapping, stride = {}, total
    for r in loops:
        n = r.src[0].arg
        stride //= n
        mapping[r] = simplify((flat // UOp.const(INDEX, stride)) % UOp.const(INDEX, n))
    return simplify(substitute(ast, mapping)), {"global_size": (groups, 1, 1), "local_size": (local, 1, 1)}
