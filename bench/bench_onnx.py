"""ONNX models: tgc against onnxruntime (and tinygrad's ONNX runner where it runs), each measured in a fresh
process with an empty tgc cache.

For each model: the first call (a fresh process: import, load, compile with an empty tgc cache, one run; the
wall time of the call and of the whole process), the steady-state median of later calls, and memory: the
process's peak RSS for every runner, and for tgc its data peak (the weights, the inputs and the numpy data one
run allocates from an empty pool: tracemalloc, as bench.py's workloads). Runners: tgc (`tgc.load(model).run`,
default kernels, CPU), tgc after BEAM (`--beam`: one call to compile, then `Program.beam` within `--beam-budget`
seconds, default BEAM_BUDGET_S; its winners then used, its first call is the first after the search; the row
says how many of the kernels a run launches the budget reached, and how many kernels on the weights alone run
once per program and are not searched), onnxruntime
(CPU provider) and tinygrad's `OnnxRunner` (DEV=CPU; it needs `clang` on PATH: where it does not run, its row
says why). Inputs: the model's own generator (arange / size, as ONNX's runner uses for the light models).

Targets (issue 23), each printed met or not with its limit: default kernels >= 0.7x onnxruntime's steady-state
speed; after BEAM >= 1.0x (measured with `--beam` only); ResNet-50's first call <= 3 s; tgc's data peak <= 1.3x
(weights + the activations of the largest layer: its inputs and outputs, from ONNX's shape inference).

    python bench/bench_onnx.py [--repeat N] [--beam [--beam-budget SECONDS]] [--interleaved] [--all]
                               [MODEL.onnx | LIGHT_NAME ...]
    python bench/bench.py --only onnx [--onnx-all] [--onnx-beam [--onnx-beam-budget S]]  (the same table)

Default models: the light models that compile in about a minute each here (AlexNet, SqueezeNet, ShuffleNet,
ZFNet-512); `--all` adds the rest of the nine (ResNet-50, DenseNet-121, Inception v1/v2, VGG-19: minutes of
cold LLVM compiles each on 2 cores). Needs `pip install -e '.[bench]'` (onnxruntime, tinygrad).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

LIGHT = ["bvlc_alexnet", "squeezenet", "shufflenet", "zfnet512", "resnet50", "densenet121", "inception_v1",
         "inception_v2", "vgg19"]
QUICK = LIGHT[:4]  # the default run: each compiles in about a minute here
DEFAULT_TARGET = 0.7  # x onnxruntime's steady-state speed, default kernels
BEAM_TARGET = 1.0  # after `tgc beam`
FIRST_CALL_TARGET_S = {"resnet50": 3.0}
MEMORY_TARGET = 1.3  # x (weights + activations of the largest layer)
TIMEOUT_S = 3600
BEAM_BUDGET_S = 120.0  # `tgc beam --budget` of the tgc-beam runner: the search's seconds per model

CHILD = r"""
import json, os, resource, sys, time
t0 = time.perf_counter()
import numpy as np
path, runner, repeat, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
extra = {}
if runner.startswith("tgc"):
    import tgc
    prog = tgc.load(path)
    decls = [(d.name, tuple(int(s) for s in d.shape), d.dtype.np) for d in prog.inputs]
    call = lambda feeds: prog.run(device="CPU", inputs=feeds)
elif runner == "tinygrad":
    os.environ.setdefault("DEV", "CPU")
    import onnx
    from tinygrad import Tensor
    from tinygrad.nn.onnx import OnnxRunner
    run = OnnxRunner(path)
    m = onnx.load(path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    np_of = {1: np.float32, 7: np.int64, 6: np.int32}
    decls = [(i.name, tuple(d.dim_value or 1 for d in i.type.tensor_type.shape.dim),
              np_of[i.type.tensor_type.elem_type]) for i in m.graph.input if i.name not in inits]
    call = lambda feeds: [v.numpy() for v in run({k: Tensor(a) for k, a in feeds.items()}).values()]
else:
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    np_of = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
    decls = [(i.name, tuple(d if isinstance(d, int) else 1 for d in i.shape), np_of[i.type]) for i in sess.get_inputs()]
    call = lambda feeds: sess.run(None, feeds)
feeds = {}
for name, shape, dt in decls:
    n = int(np.prod(shape))
    feeds[name] = (np.arange(n).reshape(shape) / max(n, 1)).astype(dt)
if runner == "tgc-beam":  # compiled first, so that the budget goes to the search, not to the cold compile
    call(feeds)
    s = time.perf_counter()
    report = prog.beam(device="CPU", dims={}, budget_s=budget)
    extra["beam_s"] = time.perf_counter() - s
    extra["beam_budget_s"] = budget
    extra["beam_kernels"] = len(report["kernels"])
    extra["beam_skipped"] = sum(1 for k in report["kernels"] if k.get("skipped"))
    extra["beam_once"] = sum(1 for k in report["kernels"] if k.get("once"))  # run once per program: not searched
t1 = time.perf_counter()
call(feeds)
t2 = time.perf_counter()
times = []
for _ in range(repeat):
    s = time.perf_counter(); call(feeds); times.append(time.perf_counter() - s)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if runner.startswith("tgc"):  # the data one run allocates from an empty pool, with the weights and inputs held
    import tracemalloc
    from tgc.backends import get_device
    prog.release()
    get_device("CPU").allocator.free_cache()
    domain = [tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)]
    tracemalloc.start()
    before = sum(t.size for t in tracemalloc.take_snapshot().filter_traces(domain).traces)
    outs = call(feeds)
    after = sum(t.size for t in tracemalloc.take_snapshot().filter_traces(domain).traces)
    tracemalloc.stop()
    extra["data_peak_bytes"] = (sum(a.nbytes for a in prog.weights.values()) + sum(a.nbytes for a in feeds.values())
                                + after - before)
print(json.dumps({"first_call_s": t2 - t1, "first_process_s": t2 - t0, "median_s": float(np.median(times)),
                  "peak_bytes": peak, **extra}))
"""

# `--interleaved`: tgc's default kernels, tgc after BEAM (with `--beam`) and onnxruntime in one process, timed run
# by run in turn, so that on a loaded machine every runner sees the same load (one after the other, minutes apart,
# their ratios say mostly how the load moved between them). First calls: tgc's in this fresh process, tgc-beam's
# the first after its search; peak RSS is the one process' (not per runner), and no data peak is measured.
# After each timed run the process sleeps SETTLE_S (untimed): onnxruntime's pool threads spin for a while after
# its run, and the next runner timed beside them lost a core (SqueezeNet's tgc median 30-41 ms beside a spinning
# pool, 14-16 ms beside a quiet one, at load 5-6); every runner gets the same pause, none is reconfigured.
SETTLE_S = 0.05
CHILD_INTERLEAVED = r"""
import json, os, resource, sys, time
t0 = time.perf_counter()
import numpy as np
import tgc
import onnxruntime as ort
path, repeat, budget, beam = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
SETTLE_S = float(sys.argv[5])
prog = tgc.load(path)
feeds = {}
for d in prog.inputs:
    shape = tuple(int(s) for s in d.shape)
    n = int(np.prod(shape))
    feeds[d.name] = (np.arange(n).reshape(shape) / max(n, 1)).astype(d.dtype.np)
out = {"load": [os.getloadavg()[0]]}
s = time.perf_counter(); prog.run(device="CPU", inputs=feeds)
out["tgc"] = {"first_call_s": time.perf_counter() - s, "first_process_s": time.perf_counter() - t0}
calls = {"tgc": lambda: prog.run(device="CPU", inputs=feeds)}
if beam:
    tuned = tgc.load(path)
    tuned.run(device="CPU", inputs=feeds)
    s = time.perf_counter()
    report = tuned.beam(device="CPU", dims={}, budget_s=budget)
    kernels = report["kernels"]
    extra = {"beam_s": time.perf_counter() - s, "beam_budget_s": budget, "beam_kernels": len(kernels),
             "beam_skipped": sum(1 for k in kernels if k.get("skipped")),
             "beam_once": sum(1 for k in kernels if k.get("once"))}
    tuned = tgc.load(path)  # (its kernels compiled with the winners stored)
    s = time.perf_counter(); tuned.run(device="CPU", inputs=feeds)
    out["tgc-beam"] = {"first_call_s": time.perf_counter() - s, "first_process_s": time.perf_counter() - t0, **extra}
    calls["tgc-beam"] = lambda: tuned.run(device="CPU", inputs=feeds)
sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
names = [i.name for i in sess.get_inputs()]
s = time.perf_counter(); sess.run(None, {k: feeds[k] for k in names})
out["onnxruntime"] = {"first_call_s": time.perf_counter() - s, "first_process_s": time.perf_counter() - t0}
calls["onnxruntime"] = lambda: sess.run(None, {k: feeds[k] for k in names})
for f in calls.values():
    f()
times = {k: [] for k in calls}
for _ in range(repeat):
    for k, f in calls.items():
        s = time.perf_counter(); f(); times[k].append(time.perf_counter() - s)
        time.sleep(SETTLE_S)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
for k, ts in times.items():
    out[k].update(median_s=float(np.median(ts)), min_s=min(ts), peak_bytes=peak)
out["load"].append(os.getloadavg()[0])
print(json.dumps(out))
"""


def measure_interleaved(path: str, repeat: int, beam: bool, beam_budget_s: float = BEAM_BUDGET_S) -> dict:
    """The runners of `--interleaved` in one fresh process with an empty tgc cache: {runner: measurement,
    "load": [the 1-minute load average before, after]}, or {"error": why}."""
    with tempfile.TemporaryDirectory(prefix="tgc-bench-onnx-") as cache:
        env = {**os.environ, "TGC_CACHE_DIR": cache}
        try:
            r = subprocess.run([sys.executable, "-c", CHILD_INTERLEAVED, path, str(repeat), str(beam_budget_s),
                                "1" if beam else "0", str(SETTLE_S)],
                               capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"error": f"over {TIMEOUT_S} s"}
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1][:160]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(path: str, runner: str, repeat: int, beam_budget_s: float = BEAM_BUDGET_S) -> dict:
    """One runner on one model in a fresh process with an empty tgc cache (tgc-beam: `Program.beam` within
    `beam_budget_s` seconds first, its winners then used)."""
    with tempfile.TemporaryDirectory(prefix="tgc-bench-onnx-") as cache:
        env = {**os.environ, "TGC_CACHE_DIR": cache}
        try:
            r = subprocess.run([sys.executable, "-c", CHILD, path, runner, str(repeat), str(beam_budget_s)],
                               capture_output=True,
                               text=True, env=env, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"error": f"over {TIMEOUT_S} s"}
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1][:160]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def model_path(arg: str) -> str:
    if arg.endswith(".onnx"):
        return arg
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{arg}.onnx")


def memory_budget(path: str) -> tuple[int, int]:
    """(the weights' bytes, the bytes of the largest layer's inputs and outputs), from ONNX's shape inference."""
    import numpy as np
    import onnx

    m = onnx.shape_inference.infer_shapes(onnx.load(path))
    g = m.graph
    inits = {t.name for t in g.initializer}
    weights = sum(int(np.prod(t.dims)) * 4 for t in g.initializer)
    sizes = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if dims and all(dims):
            sizes[vi.name] = int(np.prod(dims)) * 4
    for n in g.node:  # weights made in the graph (the light models' ConstantOfShape fills) are weights too
        if n.op_type in ("Constant", "ConstantOfShape"):
            weights += sum(sizes.get(o, 0) for o in n.output)
            inits.update(n.output)
    layer = max((sum(sizes.get(v, 0) for v in [*n.input, *n.output] if v not in inits) for n in g.node), default=0)
    return weights, layer


def available_runners(beam: bool) -> list[str]:
    runners = ["onnxruntime", "tgc"] + (["tgc-beam"] if beam else [])
    try:
        import tinygrad  # noqa: F401
        runners.append("tinygrad")
    except ImportError:
        pass
    return runners


def _speed(runs: dict, runner: str, want: float, what: str) -> dict:
    """A speed target against onnxruntime's steady-state median."""
    ort, r = runs["onnxruntime"].get("median_s"), runs.get(runner)
    if r is None or "error" in r or not ort:
        why = "--beam not given" if r is None else r.get("error", "no onnxruntime time")
        return {"target": f"{what} >= {want}x onnxruntime", "met": None, "value": why}
    x = ort / r["median_s"]
    return {"target": f"{what} >= {want}x onnxruntime", "met": x >= want, "value": f"{x:.2f}x"}


def onnx_rows(models: list[str], repeat: int = 5, beam: bool = False, log=None,
              beam_budget_s: float = BEAM_BUDGET_S, interleaved: bool = False) -> list[dict]:
    """One row per model: every runner's measurement and the targets, met or not (`interleaved`: tgc, tgc-beam
    and onnxruntime in one process, run by run in turn: `CHILD_INTERLEAVED`)."""
    rows = []
    for m in models:
        path = model_path(m)
        name = os.path.basename(path).removeprefix("light_").removesuffix(".onnx")
        if log:
            log(f"... onnx {name}")
        if interleaved:
            got = measure_interleaved(path, repeat, beam, beam_budget_s)
            wanted = ["onnxruntime", "tgc"] + (["tgc-beam"] if beam else [])
            runs = {r: got.get(r, {"error": got.get("error", "not measured")}) for r in wanted}
            if "load" in got:
                runs["onnxruntime"]["load"] = got["load"]
        else:
            runs = {runner: measure(path, runner, repeat, beam_budget_s) for runner in available_runners(beam)}
        weights, layer = memory_budget(path)
        targets = [_speed(runs, "tgc", DEFAULT_TARGET, "default kernels"),
                   _speed(runs, "tgc-beam", BEAM_TARGET, "after BEAM")]
        if name in FIRST_CALL_TARGET_S:
            lim, r = FIRST_CALL_TARGET_S[name], runs["tgc"]
            targets.append({"target": f"first call <= {lim:.0f} s", "met": None if "error" in r else
                            r["first_call_s"] <= lim, "value": r.get("error") or f"{r['first_call_s']:.1f} s"})
        r = runs["tgc"]
        budget = MEMORY_TARGET * (weights + layer)
        targets.append({"target": f"data peak <= {MEMORY_TARGET}x (weights + largest layer: "
                                  f"{(weights + layer) / 2**20:.0f} MiB)",
                        "met": None if "data_peak_bytes" not in r else r["data_peak_bytes"] <= budget,
                        "value": r.get("error") or (f"{r['data_peak_bytes'] / (weights + layer):.2f}x"
                                                    if "data_peak_bytes" in r else "not measured (--interleaved)")})
        rows.append({"model": name, "runs": runs, "weights_bytes": weights, "largest_layer_bytes": layer,
                     "targets": targets})
    return rows


LIMITS = {
    "default kernels": "grouped convolutions whose channels per group are no multiple of 16 (ShuffleNet) get no "
                       "packed lane tile; pooling is one strided read per window tap; on a loaded machine each "
                       "runner's time varies 2-5x from run to run (without --interleaved the runners also run "
                       "minutes apart, at different loads)",
    "after BEAM": "BEAM tunes the opts of the heaviest kernels its budget reaches, not the algorithm; on a loaded "
                  "machine a kernel timed alone measures the load as much as the kernel",
    "first call": "a cold first call compiles every kernel with LLVM (hundreds for ResNet-50) on 2 cores; "
                  "another branch works on compile time",
    "data peak": "intermediates the memory plan cannot share (a launch plan keeps its buffers between runs)",
}


def print_onnx(rows: list[dict]) -> None:
    print("\n| model | runner | first call | first process | median | peak RSS MiB | x onnxruntime |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        ort = row["runs"]["onnxruntime"].get("median_s")
        for runner, r in row["runs"].items():
            if "error" in r:
                print(f"| {row['model']} | {runner} | error: {r['error']} | | | | |")
                continue
            ratio = f"{ort / r['median_s']:.2f}x" if ort else "-"
            once = r.get("beam_once", 0)
            beam = f" (search {r['beam_s']:.0f} s of a {r['beam_budget_s']:.0f} s budget, " \
                   f"{r['beam_kernels'] - r['beam_skipped']}/{r['beam_kernels'] - once} kernels searched" \
                   f"{f', {once} on weights alone run once' if once else ''})" if "beam_s" in r else ""
            print(f"| {row['model']} | {runner}{beam} | {r['first_call_s']:.2f} s | {r['first_process_s']:.2f} s | "
                  f"{r['median_s'] * 1e3:.1f} ms | {r['peak_bytes'] / 2**20:.0f} | {ratio} |")
    for row in rows:
        load = row["runs"]["onnxruntime"].get("load")
        if load:
            print(f"{row['model']}: runners interleaved in one process, load {load[0]:.1f} -> {load[-1]:.1f}")
    print("\nONNX model targets (issue 23):")
    missed = set()
    for row in rows:
        parts = []
        for t in row["targets"]:
            met = "not measured" if t["met"] is None else "met" if t["met"] else "NOT met"
            parts.append(f"{t['target']}: {t['value']} ({met})")
            if t["met"] is False:
                missed.add(next(k for k in LIMITS if t["target"].startswith(k)))
        print(f"- {row['model']}: " + "; ".join(parts))
    for k in sorted(missed):
        print(f"  limit, {k}: {LIMITS[k]}")
    if rows and "tinygrad" not in rows[0]["runs"]:
        print("  tinygrad's runner: not installed (pip install -e '.[bench]')")


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="ONNX models: tgc against onnxruntime (and tinygrad's runner).")
    ap.add_argument("models", nargs="*", metavar="MODEL", help="a .onnx file or a light model's name "
                    f"({', '.join(LIGHT)}); default: {', '.join(QUICK)}")
    ap.add_argument("--repeat", type=int, default=5, help="steady-state runs per runner (default 5)")
    ap.add_argument("--beam", action="store_true", help="also tgc after `Program.beam`")
    ap.add_argument("--beam-budget", type=float, default=BEAM_BUDGET_S, metavar="SECONDS",
                    help=f"the search's budget (default {BEAM_BUDGET_S})")
    ap.add_argument("--interleaved", action="store_true", help="the runners in one process, alternating")
    ap.add_argument("--all", action="store_true", help="all nine light models")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if not args.beam_budget > 0:  # (`Program.beam(budget_s=0)` would search nothing; `tgc beam --budget 0`: none)
        ap.error("--beam-budget must be a number of seconds above 0")
    if args.all and args.models:
        ap.error("give model names or --all, not both")
    for m in args.models:
        if not os.path.isfile(model_path(m)):
            ap.error(f"no model '{m}': give a .onnx file or one of {', '.join(LIGHT)}")
    models = args.models or (LIGHT if args.all else QUICK)
    print_onnx(onnx_rows(models, args.repeat, args.beam, log=lambda s: print(s, file=sys.stderr),
                         beam_budget_s=args.beam_budget, interleaved=args.interleaved))


if __name__ == "__main__":
    main()
