"""The one way from a kernel AST to linear UOps and source: `lower`, a list of named passes.

Every kernel goes through `lower`: the heuristic (`tgc.codegen.kernel.build_kernel`, so `tgc run` and
`tgc compile`) and every BEAM candidate (`tgc.codegen.search`). The passes, in order:

  prepare (device-independent; the BEAM store keys a kernel by the AST after these)
    legalize_half              rewrite   f16/bf16 arithmetic in f32 (`legalize.half_rules`)
    tee_row_values             function  an expensive value a row reduction and its output pass both compute:
                                         stored by the reduction's pass, reread by the output pass (`rowreuse`)
    decompose_transcendentals  rewrite   exp2/log2/sin as polynomials (renderers that ask for it)
  optimize
    apply_opts                 function  the given opts (BEAM's, a stored winner's) or the hand-coded heuristic,
                                         then CPU threads (`opt.OptKernel`: a search state, not a rewrite)
    resolve_row_values         function  that stored form kept where the loop order makes it correct (CPU rows
                                         outside their columns), else the value recomputed
    lower_groups               rewrite   GROUP reductions: warp shuffles, a shared-memory tree (GPUs)
    stage_tiles                function  STAGE: a reduction's operand tiles copied to shared memory (GPUs)
    map_to_grid                function  output loops -> GPU indices (one decision over all loops at once)
  lower to linear
    narrow_index               rewrite   index arithmetic in i32 where it provably fits, else i64
    unroll_reduce              rewrite   UNROLL ranges -> copies of the reduced value
    vectorize                  function  one contiguous UPCAST range -> vector lanes (renderers with vectors)
    upcast_stores              function  the remaining UPCAST ranges -> copies of the stores
    widen_memory               function  scalar loads (outside reductions) and stores of one buffer at
                                         consecutive indices -> one vector op (`widen.py`: a tile's epilogue)
    drop_unused_buffers        function  renumber the buffers left after folding (a substitution); last, since
                                         every pass before it may fold a buffer's loads away (an UPCAST copy's
                                         constant decides a pad's gate)
    linearize                  function  the AST -> a list of UOps with explicit loops (`linearize.py`)
    verify                     function  the spec and bounds verifiers (`TGC_VERIFY_BOUNDS=1`)
    render                     function  the renderer's source and the launch contract

`DEBUG=6` prints the AST after every pass and the linear UOps (stderr), one pass at a time;
`passes_text` returns the same text.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tgc import timings
from tgc.codegen import verify
from tgc.codegen.expand import unroll_reduces, upcast_stores, vectorize
from tgc.codegen.heuristic import hand_coded
from tgc.codegen.index import narrow_index
from tgc.codegen.legalize import legalize
from tgc.codegen.linearize import linearize
from tgc.codegen.opt import apply_opts, launch_limits, lower_groups, map_to_grid, stage_tiles
from tgc.codegen.rowreuse import resolve_row_values, tee_row_values
from tgc.codegen.sizes import eval_int
from tgc.codegen.spec import verify_spec
from tgc.codegen.transcendental import decompose_transcendentals
from tgc.codegen.widen import MERGE_MAX_LANES, widen_memory
from tgc.env import debug_level
from tgc.errors import CompileError
from tgc.ir.shapes import prod, shape_of
from tgc.ir.uop import Ops, UOp, format_uops, pretty, substitute


@dataclass
class LowerCtx:
    """What the passes share: the device, the kernel's buffers (tensor nodes of DEFINE_GLOBAL 0, 1, ...), the
    opts to apply (None: the heuristic), and what the passes decide (applied opts, launch facts)."""

    device: Any
    name: str
    bufs: list[UOp]
    opts: list | None = None
    applied: list = field(default_factory=list)
    launch: dict = field(default_factory=dict)
    trace: list[tuple[str, str]] | None = None  # (pass name, text after it), when asked for

    @property
    def gpu(self) -> bool:
        return self.device.caps.gpu

    @property
    def vectors(self) -> bool:
        return self.device.caps.vectors


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[UOp, LowerCtx], UOp]
    kind: str  # "rewrite" (a graph_rewrite with a PatternMatcher) or "function"
    when: Callable[[LowerCtx], bool] = lambda ctx: True


@dataclass
class LoweredKernel:
    """A kernel lowered for a device: the optimized AST, its linear UOps, the source and launch facts. `bufs`
    are the kernel's parameters (DEFINE_GLOBAL 0, 1, ... of `uops`); `ast` numbers its buffers as `ast_bufs`
    does, which may hold more (buffers whose loads the passes after optimization folded away)."""

    name: str
    ast: UOp
    uops: list[UOp]
    src: str
    bufs: list[UOp]
    launch: dict
    applied: list
    ast_bufs: list[UOp] = field(default_factory=list)
    # `lower(template=True)`: the source with `NAME_SLOT` where its name goes (`render_template`), or None where the
    # renderer gave none (each kernel of its group is then rendered under its own name)
    template: str | None = None


# ---------------------------------------------------------------------------------------------------- the passes


def _legalize(ast: UOp, ctx: LowerCtx) -> UOp:
    return legalize(ast)


def _transcendentals(ast: UOp, ctx: LowerCtx) -> UOp:
    return decompose_transcendentals(ast)


def _apply_opts(ast: UOp, ctx: LowerCtx) -> UOp:
    ast, threads, ctx.applied = apply_opts(ast, ctx.device, ctx.opts, hand_coded)
    if threads > 1:
        ctx.launch["global_size"] = (threads, 1, 1)
    return ast


def _tee_rows(ast: UOp, ctx: LowerCtx) -> UOp:
    return tee_row_values(ast)


def _resolve_rows(ast: UOp, ctx: LowerCtx) -> UOp:
    return resolve_row_values(ast, ctx.gpu or not ctx.device.caps.reread_rows)


def heuristic_opts(ast: UOp, device: Any) -> list:
    """The opts `lower` would apply to a prepared AST without a list (the hand-coded heuristic, then threads)."""
    return apply_opts(ast, device, None, hand_coded)[2]


def _lower_groups(ast: UOp, ctx: LowerCtx) -> UOp:
    return lower_groups(ast, ctx.device.caps.shuffle_width)


def _stage_tiles(ast: UOp, ctx: LowerCtx) -> UOp:
    return stage_tiles(ast, async_copy=ctx.device.caps.async_copy)


def _map_to_grid(ast: UOp, ctx: LowerCtx) -> UOp:
    lim = launch_limits(ctx.device)
    ast, launch = map_to_grid(ast, max_local=min(ctx.device.caps.preferred_local_size, lim.threads),
                              max_grid=lim.grid)
    ctx.launch.update(launch)
    return ast


def _drop_unused(ast: UOp, ctx: LowerCtx) -> UOp:
    ast, ctx.bufs = drop_unused_buffers(ast, ctx.bufs)
    return ast


def _narrow_index(ast: UOp, ctx: LowerCtx) -> UOp:
    return narrow_index(ast)


def _unroll_reduce(ast: UOp, ctx: LowerCtx) -> UOp:
    return unroll_reduces(ast)


def _vectorize(ast: UOp, ctx: LowerCtx) -> UOp:
    return vectorize(ast, ctx.device.caps.vector_widths)


def _upcast_stores(ast: UOp, ctx: LowerCtx) -> UOp:
    return upcast_stores(ast)


def _widen_memory(ast: UOp, ctx: LowerCtx) -> UOp:
    caps = ctx.device.caps
    return widen_memory(ast, tuple(w for w in caps.vector_widths if w <= MERGE_MAX_LANES), caps.memory_any_width)


PREPARE = [
    Pass("legalize_half", _legalize, "rewrite"),
    Pass("tee_row_values", _tee_rows, "function"),
    Pass("decompose_transcendentals", _transcendentals, "rewrite",
         lambda ctx: ctx.device.caps.decompose_transcendentals),
]
OPTIMIZE = [
    Pass("apply_opts", _apply_opts, "function"),
    Pass("resolve_row_values", _resolve_rows, "function"),
    Pass("lower_groups", _lower_groups, "rewrite", lambda ctx: ctx.gpu),
    Pass("stage_tiles", _stage_tiles, "function", lambda ctx: ctx.gpu),
    Pass("map_to_grid", _map_to_grid, "function", lambda ctx: ctx.gpu),
]
TO_LINEAR = [
    Pass("narrow_index", _narrow_index, "rewrite"),
    Pass("unroll_reduce", _unroll_reduce, "rewrite"),
    Pass("vectorize", _vectorize, "function", lambda ctx: ctx.vectors),
    Pass("upcast_stores", _upcast_stores, "function"),
    Pass("widen_memory", _widen_memory, "function", lambda ctx: ctx.vectors),
    Pass("drop_unused_buffers", _drop_unused, "function"),  # last: the passes above fold loads away
]
PASSES = PREPARE + OPTIMIZE + TO_LINEAR  # then linearize, verify and render


def run_passes(ast: UOp, ctx: LowerCtx, passes: list[Pass], quiet: bool = False) -> UOp:
    show = not quiet and (ctx.trace is not None or debug_level() >= 6)
    for p in passes:
        if not p.when(ctx):
            continue
        ast = p.run(ast, ctx)
        if show:
            _show(ctx, p.name, pretty(ast))
    return ast


def _show(ctx: LowerCtx, name: str, text: str) -> None:
    if ctx.trace is not None:
        ctx.trace.append((name, text))
    if debug_level() >= 6:
        print(f"--- {ctx.name}: after {name}\n{text}", file=sys.stderr)


_PREPARED: dict[tuple[UOp, bool], UOp] = {}


def prepare(ast: UOp, device: Any) -> UOp:
    """The device-independent passes every kernel gets before optimization (memoized: BEAM prepares a kernel's
    AST once and lowers many candidates of it; preparing a prepared AST returns it unchanged)."""
    key = (ast, device.caps.decompose_transcendentals)
    hit = _PREPARED.get(key)
    if hit is not None:
        return hit
    out = run_passes(ast, LowerCtx(device, "kernel", []), PREPARE, quiet=True)  # `lower` shows them
    if len(_PREPARED) > 4096:
        _PREPARED.clear()
    _PREPARED[key] = _PREPARED[(out, key[1])] = out
    return out


def lower(ast: UOp, device: Any, bufs: list[UOp], name: str, opts: list | None = None,
          trace: list[tuple[str, str]] | None = None, vals: tuple[int, ...] = (),
          template: bool = False) -> LoweredKernel:
    """Kernel AST (as scheduled, or already prepared) -> linear UOps and source for `device`. `opts` replays a
    list of opts (BEAM's); None runs the hand-coded heuristic (nothing with NOOPT). `trace`, when a list, gets
    (pass name, text after the pass) for every pass that ran. `vals`: the values of the kernel's dim variables
    (DEFINE_VARs other than core_id, in their linear order) that the bounds verifier checks the kernel at.
    `template`: the kernel's source is rendered once as its group's template (`LoweredKernel.template`: kernels
    identical but for their names, `codegen.kernel._renamed`), its own source that template with `name` put in."""
    ctx = LowerCtx(device, name, list(bufs), opts=None if opts is None else list(opts), trace=trace)
    if vals:
        ctx.launch["vals"] = tuple(vals)
    with timings.phase("prepare"):
        if trace is not None or debug_level() >= 6:
            ast = run_passes(ast, ctx, PREPARE)
        else:
            ast = prepare(ast, device)
    with timings.phase("optimize"):
        optimized = run_passes(ast, ctx, OPTIMIZE)
    ast_bufs = list(ctx.bufs)
    with timings.phase("to_linear"):
        ast = run_passes(optimized, ctx, TO_LINEAR)
    with timings.phase("linearize"):
        uops = linearize(ast, device.caps.decompose_transcendentals)
    check_parameters(name, uops, ctx.bufs)
    if ctx.trace is not None or debug_level() >= 6:
        _show(ctx, "linearize", uops_text(uops))
    return finish(device, name, optimized, uops, ctx.bufs, ctx.launch, list(ctx.applied), ast_bufs, template)


def finish(device: Any, name: str, ast: UOp, uops: list[UOp], bufs: list[UOp], launch: dict,
           applied: list | None = None, ast_bufs: list[UOp] | None = None, template: bool = False) -> LoweredKernel:
    """Linear UOps -> a `LoweredKernel`: the spec and bounds verifiers (`TGC_VERIFY_BOUNDS=1`), then the
    renderer's source with its launch contract. The end of `lower`, and of the kernels written as linear UOps
    directly (the fused attention, `tgc.codegen.attention`)."""
    if verify.enabled():
        with timings.phase("verify"):
            verify_spec(name, uops)
            verify.verify_kernel(name, uops, bufs, _launch_at_vals(launch, uops))
    check_shared_memory(device, name, uops)
    slot = render_template(device, uops, bufs, launch) if template else None
    if slot is not None and name.isidentifier() and NAME_SLOT not in name:
        src = render_renamed(device, name, uops, bufs, launch, slot)
    else:
        with timings.phase("render"):
            src = render_kernel(device, name, uops, bufs, launch)
    return LoweredKernel(name, ast, uops, src, bufs, launch, list(applied or []),
                   list(bufs) if ast_bufs is None else ast_bufs, slot)


def shared_memory_bytes(nodes: list[UOp]) -> int:
    """The shared memory the DEFINE_LOCALs among `nodes` declare, in bytes as rendered (a half float is held as a
    4-byte float in registers and in shared memory alike)."""
    total = 0
    for u in nodes:
        if u.op is Ops.DEFINE_LOCAL:
            size = 4 if u.dtype.name in ("f16", "bf16") else u.dtype.itemsize
            total += int(u.arg[1]) * size * u.dtype.count
    return total


def check_shared_memory(device: Any, name: str, uops: list[UOp]) -> None:
    """Every kernel's shared memory against the device's limit (`launch_limits`: the renderer's declared
    `max_shared_bytes`, lowered to what the runtime reports where it can be asked: OpenCL's
    CL_DEVICE_LOCAL_MEM_SIZE, CUDA's MAX_SHARED_MEMORY_PER_BLOCK). The lowerings keep within it (the opts'
    checks, the fused attention's smaller blocks); a kernel past it is a tgc bug, refused here rather than by
    the driver (ptxas: "too much shared data") or, worse, not at all."""
    need = shared_memory_bytes(uops)
    if need and need > launch_limits(device).shared_bytes:
        raise CompileError(f"kernel {name} needs {need} bytes of shared memory, more than the "
                           f"{launch_limits(device).shared_bytes} this device allows (a tgc bug)")


def check_parameters(name: str, uops: list[UOp], bufs: list[UOp]) -> None:
    """Renderers make DEFINE_GLOBAL i the i-th parameter and a launch passes `bufs` in order, so the kernel's
    DEFINE_GLOBALs must be exactly 0 .. len(bufs)-1. A gap (a buffer whose loads folded away after it was
    renumbered) would shift every later buffer by one parameter: a wrong answer, not an error."""
    args = sorted(u.arg for u in uops if u.op is Ops.DEFINE_GLOBAL)
    if args != list(range(len(bufs))):
        raise CompileError(f"kernel {name}: parameters {args} do not match its {len(bufs)} buffers (a tgc bug)")


def _launch_at_vals(launch: dict, uops: list[UOp]) -> dict:
    """The launch the bounds verifier checks: a symbolic GPU kernel's grid (`launch["grid"]`, expressions of its
    dim variables) evaluated at `launch["vals"]`, the sizes it is verified at."""
    if "grid" not in launch or "vals" not in launch:
        return launch
    names = [u.arg[0] for u in uops if u.op is Ops.DEFINE_VAR and u.arg[0] != "core_id"]
    env = dict(zip(names, launch["vals"]))
    grid = tuple(eval_int(e, env) for e in launch["grid"])
    if any(g is None for g in grid):
        return launch
    return {**launch, "global_size": grid}


def passes_text(ast: UOp, device: Any, bufs: list[UOp], name: str = "kernel", opts: list | None = None) -> str:
    """The AST after every pass and the linear UOps, as DEBUG=6 prints them."""
    trace: list[tuple[str, str]] = []
    lower(ast, device, bufs, name, opts=opts, trace=trace)
    return "\n".join(f"--- {name}: after {p}\n{text}" for p, text in trace)


def uops_text(uops: list[UOp]) -> str:
    """Linear UOps one per line (the one UOp printer, `tgc.ir.uop.format_uops`)."""
    return format_uops(uops)


# ---- rendering with the launch contract, and renumbering buffers (used by `lower`)

CONTRACT_TAG = "tgc-launch:"
_COMMENT = {"llvm": ";", "c": "//"}  # renderer language -> line comment


def launch_contract(bufs: list[UOp], launch: dict) -> dict[str, Any]:
    """What a launch of this kernel must provide: the bytes of each buffer (in parameter order), the most
    work-items per dimension, the local size, and the number of `vals`."""
    local = launch.get("local_size")
    return {"bufs": [int(prod(shape_of(b)) * b.dtype.itemsize) for b in bufs],
            "global_size": [int(g) for g in launch.get("global_size", (1, 1, 1))],
            "local_size": None if local is None else [int(v) for v in local], "vals": len(launch.get("vals", ()))}


# the name a source template is rendered under (`render_template`); no kernel is named so
NAME_SLOT = "tgc_kernel_name_slot_9d2f"


def render_template(device: Any, uops: list[UOp], bufs: list[UOp], launch: dict) -> str | None:
    """The source of a kernel already lowered (`uops`) with `NAME_SLOT` where its name goes: renderers use a
    kernel's name as an opaque identifier, so the source under any identifier `name` is this text with `name` put
    in (`render_renamed`): a group of identical kernels (`codegen.kernel._renamed`) is rendered once. None where
    the renderer refuses the kernel (its error names the kernel: each is then rendered under its own name)."""
    with timings.phase("render"):
        try:
            src = render_kernel(device, NAME_SLOT, uops, bufs, launch)
        except CompileError:
            return None
    return src if NAME_SLOT in src else None


def render_renamed(device: Any, name: str, uops: list[UOp], bufs: list[UOp], launch: dict,
                   template: str | None = None) -> str:
    """The source of a kernel already lowered (`uops`), under another name and for other buffers of the same
    shapes: `build_kernels` lowers identical kernels once (`codegen.kernel._renamed`). With `template`
    (`render_template` of the same uops, buffers of the same sizes and launch) and a plain identifier for a name,
    the template with the name put in, byte for byte what rendering gives; else a render."""
    if template is not None and name.isidentifier() and NAME_SLOT not in name:
        return template.replace(NAME_SLOT, name)
    with timings.phase("render"):
        return render_kernel(device, name, uops, bufs, launch)


def render_kernel(device: Any, name: str, uops: list[UOp], bufs: list[UOp], launch: dict) -> str:
    """The renderer's source, ending in a comment that states the launch contract (`launch_contract`),
    which a REMOTE server checks every launch against."""
    src = device.renderer.render(name, uops)
    prefix = _COMMENT.get(device.renderer.language)
    if prefix is None:
        return src
    text = json.dumps(launch_contract(bufs, launch), separators=(",", ":"))
    return src.rstrip("\n") + f"\n{prefix} {CONTRACT_TAG} {text}\n"


def drop_unused_buffers(ast: UOp, bufs: list[UOp]) -> tuple[UOp, list[UOp]]:
    """Buffers whose loads folded away (`a % -1` is 0) are not kernel parameters: renumber the rest. A
    substitution, not a rewrite: DEFINE_GLOBAL 3 -> 2 while 2 -> 1 would apply twice to a hash-consed node."""
    used = sorted({u.arg for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL})
    if used == list(range(len(bufs))):
        return ast, bufs
    mapping = {u: u.replace(arg=used.index(u.arg)) for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL}
    return substitute(ast, mapping), [bufs[i] for i in used]


__all__ = ["PASSES", "LoweredKernel", "Pass", "check_shared_memory", "finish", "heuristic_opts", "lower", "passes_text",
           "prepare", "render_renamed", "render_template", "shared_memory_bytes", "uops_text"]
