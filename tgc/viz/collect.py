"""What the `tgc viz` page shows, gathered from a loaded program as one JSON-ready dict (`collect`).

Contract: `collect(prog, device, dims, ...)` takes any loaded program, a `tgc.api.Program` from whatever front end
(`.tg` text, or a model a later front end turns into one) or a compiled package (`tgc.package.Package`: no tensor
graph or passes, only its kernels), and returns plain data (str, int, float, None, lists, dicts) that
`tgc.viz.page.render` writes into the page. It compiles what `tgc compile` compiles (the disk cache makes it cheap
the second time), lowers each kernel once more with the pipeline's trace (`tgc.codegen.pipeline.lower(...,
trace=)`, the same opts the kernel was built with) and, unless `measure=False`, times every kernel as `tgc bench`
does (`tgc.engine.executable.bench`) on random inputs. Nothing here draws: the page's script does.

The tensor graph is the traced program with constants and the broadcasting plumbing (RESHAPE and EXPAND, and
any node computed from constants alone) folded into their users: what is left are inputs, ops, reductions and
the movement ops that move data (PERMUTE, SHRINK, PAD, ...). Each node lists the kernels that compute it: a
kernel computes the nodes from its output down to the buffers it reads (a node in two kernels is recomputed). A
kernel that packs a matmul or conv operand (`meta["serves"]`) computes no node of the graph: it is listed on the
inputs it reads. Each node's `cluster` is the kernel it is drawn in when the page folds a large graph (`collapse`,
past MAX_DRAWN nodes) into one box per kernel. For a model translated from ONNX, `onnx_nodes` maps each source
line to the ONNX node it translates, and each graph node of such a line names it (`onnx`).
"""

from __future__ import annotations

import difflib
import hashlib
import re
from typing import Any

from tgc.api import _device, device_names
from tgc.codegen import search
from tgc.codegen.attention import is_fused_attention, lower_attention
from tgc.codegen.kernel import prepare_ast
from tgc.codegen.pipeline import lower
from tgc.engine.bench import machine_peak
from tgc.engine.executable import bench as bench_executable
from tgc.engine.flops import recompute_factor, written_flops
from tgc.engine.inputs import random_inputs
from tgc.errors import DeviceError
from tgc.ir.shapes import shape_of
from tgc.ir.uop import Ops, UOp, pretty

PLUMBING = {Ops.RESHAPE, Ops.EXPAND, Ops.CONST}  # folded into their users in the drawn graph


def collect(prog: Any, device: str | list[str] | None = None, dims: dict[str, int] | None = None,
            shard: dict[str, int] | None = None, measure: bool = True, repeat: int = 5,
            filename: str | None = None) -> dict[str, Any]:
    """The page's data for `prog` on `device` (a name, or a device list with `shard`) at `dims`."""
    names = device_names(device)
    if hasattr(prog, "manifest"):  # a compiled package: its kernels only
        return _collect_package(prog, names[0], dims, measure, repeat, filename)
    dims = prog.resolve_dims(dims)
    source = getattr(prog, "source", None)
    doc: dict[str, Any] = {"file": filename or getattr(prog, "filename", None) or "<program>",
                           "device": ",".join(names), "dims": dims,
                           "source": source.splitlines() if isinstance(source, str) else None,
                           "notes": []}
    if _onnx_nodes(prog):  # the ONNX node of each line of the translated source
        doc["onnx_nodes"] = {str(line): text for line, text in _onnx_nodes(prog).items()}
    outs, _in_bufs = prog._trace(dims)
    if len(names) > 1:
        return _collect_multi(prog, names, dims, shard or {}, measure, repeat, doc, outs)
    dev = _device(names[0])
    items = [it for it in prog.schedule(dims, dev.name) if it.ast.src]
    kernels = prog.compile(dev.name, dims)
    if len(items) != len(kernels):  # (cannot happen today: `Program._build_kernels` keeps the same items)
        doc["notes"].append("the schedule and the compiled kernels differ: passes not shown")
        items = [None] * len(kernels)
    doc["kernels"] = [_kernel_doc(k, it, dev) for k, it in zip(kernels, items)]
    doc["graph"] = _graph(prog, outs, [it for it in items if it is not None])
    rec = prog.recompute(dev.name, dims)
    doc["program"] = {"written_ops": rec["written"], "executed_ops": rec["executed"], "recompute": rec["factor"],
                      "flops": sum(k.flops for k in kernels), "bytes": sum(k.bytes_moved for k in kernels)}
    doc["peak"] = _peak(dev, measure)
    if measure:
        def bench() -> dict[str, Any]:
            dev.ensure_runnable()
            arrays = prog.bind(random_inputs(prog, dims), dims, cast=True)[1]
            return bench_executable(prog.lower(dev.name, dims), arrays, repeat=repeat, warmup=1)
        timing = _timed(doc, bench)
        if timing is not None:
            _add_times(doc, timing["kernels"], timing["program"]["median_s"])
    return doc


def _timed(doc: dict[str, Any], bench: Any) -> dict[str, Any] | None:
    """`bench()`'s result, or None with a note where the device cannot run kernels here (METAL off macOS, CUDA
    without a GPU): the page still shows everything else."""
    try:
        return bench()
    except DeviceError as e:
        doc["notes"].append(f"not timed: {e}")
        return None


def _peak(dev: Any, measure: bool) -> dict[str, Any]:
    peak = machine_peak(dev, measure)
    return {"gflops": peak.get("gflops"), "gbps": peak.get("gbps"), "source": peak.get("source")}


def _add_times(doc: dict[str, Any], rows: list[dict[str, Any]], program_s: float) -> None:
    total = sum(r["median_s"] for r in rows) or 1.0
    for k, r in zip(doc["kernels"], rows):
        k.update(time_s=r["median_s"], gflops=r["gflops"], gbps=r["gbps"], share=r["median_s"] / total)
    doc["program"]["time_s"] = program_s


def _opts_source(item: Any, dev: Any, k: Any) -> str:
    """Where a kernel's opts came from: a stored BEAM winner, or the hand-coded heuristic."""
    if item is None:
        return "?"
    attention = is_fused_attention(item.ast)
    if dev.compiler is not None and search.lookup(search.search_ast(item, dev), dev) is not None:
        return "BEAM"
    return "heuristic" if k.opts or not attention else "defaults"


def _kernel_doc(k: Any, item: Any, dev: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": k.name, "device": dev.name, "line": k.line, "opts": [str(o) for o in k.opts],
        "opts_from": _opts_source(item, dev, k), "global_size": list(k.global_size),
        "local_size": list(k.local_size) if k.local_size else None, "flops": int(k.flops),
        "bytes": int(k.bytes_moved), "graph_ops": int(k.graph_flops), "src": k.src,
        "lang": _lang(dev.kind, k.src), "time_s": None, "gflops": None, "gbps": None, "share": None}
    doc["passes"] = _passes(k, item, dev) if item is not None else []
    if item is not None:
        written = _written_ops(item)
        doc["recompute"] = recompute_factor(k.graph_flops, written) if written else None
    return doc


def _written_ops(item: Any) -> int:
    """The graph's ops this kernel's output stands for, each node once (the buffers it reads excluded)."""
    if "serves" in item.meta:  # a packed copy of an operand: no op of the graph
        return 0
    start = item.output
    stops = set(item.bufs[1:]) - {start}
    exclude: set[UOp] = set()
    for s in stops:
        exclude.update(s.toposort())
    return written_flops([start], exclude=exclude)


def _lang(kind: str, src: str) -> str:
    if kind == "CPU" or re.search(r"^\s*define\s", src, re.M):
        return "llvm"
    return "python" if kind == "PYTHON" else "c"


def _passes(k: Any, item: Any, dev: Any) -> list[dict[str, Any]]:
    """The kernel's AST as scheduled, after each named pass that ran, and its linear UOps; each step with the
    lines that are new since the step before (`_changed`)."""
    steps = [("scheduled", pretty(item.ast))]
    if is_fused_attention(item.ast):  # the fused online softmax (tgc/codegen/attention.py): the passes it went through
        trace = []
        try:
            lower_attention(item, dev, k.name, opts=list(getattr(k, "applied", None) or []) or None, trace=trace)
        except Exception as e:  # (the kernel itself lowered: a replay that does not is shown, not fatal)
            trace = [("lower_attention", pretty(k.ast)), ("linearize", k.uops_text()),
                     ("error", f"could not replay the lowering: {type(e).__name__}: {e}")]
        steps.extend(trace)
    else:
        trace: list[tuple[str, str]] = []
        opts = None
        if dev.compiler is not None:
            opts = search.lookup(prepare_ast(item.ast, dev), dev)
        try:
            lower(item.ast, dev, item.bufs, k.name, opts=opts, trace=trace)
        except Exception as e:  # (the kernel itself lowered: a replay that does not is shown, not fatal)
            trace.append(("error", f"could not replay the passes: {type(e).__name__}: {e}"))
        steps.extend(trace)
    out, before = [], None
    for name, text in steps:
        lines = text.splitlines()
        keys = _line_keys(lines)
        changed, removed = _changed(before, keys)
        out.append({"name": name, "text": text, "changed": changed, "removed": removed})
        before = keys
    return out


_LINE = re.compile(r"^\s*(\d+) (.*)$")
_REF = re.compile(r"%(\d+)")


def _line_keys(lines: list[str]) -> list[str]:
    """One key per listing line that names the node by content, not position: `%3` references are replaced by the
    key of line 3, so a node keeps its key when the passes insert lines before it."""
    keys: list[str] = []
    by_index: dict[str, str] = {}
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            keys.append(line)
            continue
        body = _REF.sub(lambda r: "%" + by_index.get(r.group(1), r.group(1)), " ".join(m.group(2).split()))
        key = hashlib.blake2b(body.encode(), digest_size=6).hexdigest()
        by_index[m.group(1)] = key
        keys.append(key)
    return keys


def _changed(before: list[str] | None, after: list[str]) -> tuple[list[int], int]:
    """The lines of `after` that `before` lacks (indices) and how many of `before`'s lines are gone
    (difflib's matching of the two key sequences)."""
    if before is None:
        return [], 0
    sm = difflib.SequenceMatcher(None, before, after, autojunk=False)
    changed: list[int] = []
    removed = 0
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag in ("replace", "insert"):
            changed.extend(range(j1, j2))
        if tag in ("replace", "delete"):
            removed += i2 - i1
    return changed, removed


MAX_DRAWN = 300  # computed tensor-graph nodes beyond which the page opens the graph folded, one box per kernel


def _graph(prog: Any, outs: list[UOp], items: list[Any]) -> dict[str, Any]:
    """The graph to draw (see the module docstring): nodes with op, shape, line, kernels and cluster (the kernel
    the node is drawn in: the one that writes it, else the first that computes it; an input's is its user's; -1
    for none); edges. An input is
    drawn once per use, beside its user (one node read all over a program would pull long edges across the whole
    layout, which costs the layout most of its time). Past MAX_DRAWN computed nodes `collapse` is true: the page
    draws each kernel as one box that opens into its nodes on a click (a layout of a few hundred nodes at a time,
    however large the program)."""
    nodes = UOp(Ops.SINK, None, tuple(outs)).toposort()
    const_only: dict[UOp, bool] = {}
    for n in nodes:
        const_only[n] = n.op is Ops.CONST or (bool(n.src) and n.op is not Ops.BUFFER
                                              and all(const_only.get(s, False) for s in n.src))
    shown = [n for n in nodes if n.op not in PLUMBING and n.op is not Ops.SINK and not const_only[n]]
    shown_set = set(shown)
    memo: dict[UOp, list[UOp]] = {}

    def visible(u: UOp) -> list[UOp]:  # the shown nodes a source stands for
        if u in shown_set:
            return [u]
        if u not in memo:
            memo[u] = [] if const_only.get(u, False) else list(dict.fromkeys(v for s in u.src for v in visible(s)))
        return memo[u]

    kernels_of: dict[UOp, list[int]] = {}
    writer: dict[UOp, int] = {}  # a kernel's output node -> the kernel
    for ki, item in enumerate(items):
        if "serves" in item.meta:  # a packed copy of an operand (not a node of the graph): listed on what it reads
            for b in item.bufs[1:]:
                kernels_of.setdefault(b, []).append(ki)
            continue
        start = item.output
        writer.setdefault(start, ki)
        stops = set(item.bufs[1:]) - {start}
        stack, seen = [start], set()
        while stack:
            u = stack.pop()
            if u in seen:
                continue
            seen.add(u)
            kernels_of.setdefault(u, []).append(ki)
            stack.extend(s for s in u.src if s not in stops and s.op is not Ops.BUFFER)
    out_names = {o: name for o, name in zip(outs, getattr(prog, "output_names", []))}
    onnx_nodes = _onnx_nodes(prog)
    doc_nodes: list[dict[str, Any]] = []
    edges: set[tuple[int, int]] = set()

    def add(n: UOp, cluster: int) -> int:
        shape = shape_of(n)
        line = prog.line_of(n) if n.op is not Ops.BUFFER else None
        kernels = sorted(set(kernels_of.get(n, [])))
        doc_nodes.append({"id": len(doc_nodes), "op": n.op.name, "label": _label(n),
                          "shape": [s if isinstance(s, int) else str(s) for s in shape], "dtype": str(n.dtype),
                          "line": line, "input": n.op is Ops.BUFFER, "output": out_names.get(n),
                          "kernels": kernels, "cluster": cluster})
        if line is not None and line in onnx_nodes:
            doc_nodes[-1]["onnx"] = onnx_nodes[line]
        return len(doc_nodes) - 1

    computed = [n for n in shown if n.op is not Ops.BUFFER]
    ids: dict[UOp, int] = {n: add(n, writer.get(n, min(kernels_of.get(n, [-1])))) for n in computed}
    used: set[UOp] = set()
    for n in computed:
        for v in dict.fromkeys(v for s in n.src for v in visible(s)):
            if v.op is Ops.BUFFER:  # an input: drawn beside each of its users, in its user's kernel box
                used.add(v)
                edges.add((add(v, doc_nodes[ids[n]]["cluster"]), ids[n]))
            else:
                edges.add((ids[v], ids[n]))
    for n in shown:
        if n.op is Ops.BUFFER and n not in used:  # (an input only an output is)
            add(n, -1)
    return {"view": "tensor", "nodes": doc_nodes, "edges": sorted(edges), "tensor_nodes": len(shown),
            "collapse": len(computed) > MAX_DRAWN and bool(items)}


def _onnx_nodes(prog: Any) -> dict[int, str]:
    """For a program translated from ONNX, the ONNX node each line of its `.tg` source comes from, as text
    (`op 'name' -> outputs`); {} for any other program."""
    tr = getattr(prog, "onnx", None)
    return dict(getattr(tr, "nodes", None) or {})


def _label(n: UOp) -> str:
    if n.op is Ops.BUFFER:
        return str(n.arg[1])
    if n.op is Ops.REDUCE_AXIS:
        return f"{n.arg[0].name} over {list(n.arg[1])}"
    return n.op.name


def _collect_multi(prog: Any, names: list[str], dims: dict[str, int], shard: dict[str, int], measure: bool,
                   repeat: int, doc: dict[str, Any], outs: list[UOp]) -> dict[str, Any]:
    """A device list: every launch with its device, the collectives' bytes per device (timed with `measure`)."""
    axes = prog.shard_axes(shard, dims, len(names))
    ml = prog.lower_multi(names, dims, axes)
    launches = ml.launches()
    kernels = []
    for d, k in launches:
        kd = _kernel_doc(k, None, k.device)
        kd["device"] = names[d]
        kd["passes"] = [{"name": "linearize", "text": k.uops_text(), "changed": [], "removed": 0}]
        kernels.append(kd)
    doc["kernels"] = kernels
    doc["notes"].append("a device list: each device's part is scheduled on its own; the graph is the whole "
                        "program's, its kernels the list below (passes: the linear UOps only)")
    doc["graph"] = _graph(prog, outs, [])
    doc["program"] = {"flops": sum(k.flops for _, k in launches), "bytes": sum(k.bytes_moved for _, k in launches)}
    doc["peak"] = _peak(ml.devices[0], False)  # (only where known: the kernels of a device list are not timed alone)
    multi: dict[str, Any] = {"devices": names, "shard": axes, "steps": [s.kind for s in ml.collectives()],
                             "launches": {n: sum(1 for d, _ in launches if d == i) for i, n in enumerate(names)}}
    if measure:
        result = prog.bench(names, dims, repeat=repeat, shard=axes)
        coll = result.get("collectives", {})
        multi.update(sent_bytes=coll.get("sent_bytes"), received_bytes=coll.get("received_bytes"),
                     collective_s=coll.get("median_s"),
                     per_device=[{k: r.get(k) for k in ("device", "kernels", "flops", "bytes", "median_s",
                                                         "gflops", "gbps")}
                                     for r in result.get("kernels", []) if r.get("device") in names])
        doc["program"]["time_s"] = result.get("program", {}).get("median_s")
    doc["multi"] = multi
    return doc


def _collect_package(pkg: Any, device: str, dims: dict[str, int] | None, measure: bool, repeat: int,
                     filename: str | None) -> dict[str, Any]:
    """A compiled package: its kernels, sources and launch sizes (no tensor graph, no passes), timed. A package
    for every size (`SymbolicPackage`) is shown at the sizes `dims` gives, as `tgc bench` times it there."""
    if getattr(pkg, "symbolic", False):
        dims = pkg.infer_dims({}, dims)  # (no inputs: every dim from `dims`, else one clear error)
        low = pkg.lower(device, dims)
    else:
        low = pkg.lower(device)
    dev = low.device
    doc: dict[str, Any] = {"file": filename or "<package>", "device": dev.name, "dims": pkg.resolve_dims(dims),
                           "source": None, "graph": {"nodes": [], "edges": []},
                           "notes": ["a compiled package keeps its kernels' sources, not its tensor graph or passes"]}
    doc["kernels"] = []
    for k in low.kernels:
        kd = _kernel_doc(k, None, dev)
        kd["opts_from"] = "package"
        kd["passes"] = []
        doc["kernels"].append(kd)
    doc["program"] = {"flops": sum(k.flops for k in low.kernels), "bytes": sum(k.bytes_moved for k in low.kernels)}
    doc["peak"] = _peak(dev, measure)
    if measure:
        result = _timed(doc, lambda: pkg.bench(device, dims, repeat=repeat))
        if result is not None:
            _add_times(doc, result["kernels"], result["program"]["median_s"])
    return doc


__all__ = ["collect"]
