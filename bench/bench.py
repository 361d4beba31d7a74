"""`make bench`: tgc against numpy, XLA and the machine's peak, measured in one run.

For each workload: tgc's default kernels, tgc after `tgc beam` (winners come from the disk cache after
the first run), numpy on the same inputs, XLA (`jax.jit` of the same program written with `jax.numpy`, inputs
already on the device, `block_until_ready`), tgc's ratio to each, and the share of the machine's peak FLOP/s
(compute-bound work) or of its copy bandwidth (memory-bound work: bytes read plus bytes written, as the
workloads count theirs), both measured in this run by the CPU backend's own peak kernels
(`tgc/backends/cpu_peak.py`: an FMA loop, a threaded copy of a buffer far larger than the caches; a threaded
read beside it, printed too), the same figures `tgc bench` compares with. A compute-bound workload's share
compares each of its timings with the FMA peaks measured just before and after it (in runs as long as the
workload's, their median like the workload's) and takes the median of those ratios (`paired_share`): on a
shared machine they see about the same load.
Also: peak memory while running (the inputs plus all the run allocates) against inputs plus outputs, met or not,
the start-up time of a small `tgc run`, and a compiled package run cold in a fresh process against
`tgc run FILE` with a warm cache (`--only package` runs just that).

numpy runs with its best BLAS kernels: where the environment forces an OpenBLAS core type
(`OPENBLAS_CORETYPE`, with `OPENBLAS_L2_SIZE`), this script says so and starts itself again without both, in
this process alone (OpenBLAS reads them when numpy loads), and prints the kernel OpenBLAS then uses.

    python bench/bench.py [--quick] [--no-beam] [--no-symbolic] [--only NAME|symbolic|onnx] [--json] [--multi-only]

Symbolic sizes: softmax and matmul at five sizes each, the kernels compiled once for the size's class
(`Program.run(symbolic=True)`) against those compiled for the size (`--only symbolic` runs just this table).
The ONNX model table (bench/bench_onnx.py: light models against onnxruntime and tinygrad's runner, first call in
a fresh process, steady-state median, peak memory, issue 23's targets) ends the run: `--only onnx` runs just it,
`--onnx-all` all nine models (slow), `--onnx-beam` adds tgc after BEAM (`--onnx-beam-budget SECONDS` per model),
`--no-onnx` skips it.
"""

from __future__ import annotations

import os
import sys

_FORCED = [k for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ]
if _FORCED and "TGC_BENCH_UNFORCED" not in os.environ:
    note = ", ".join(f"{k}={os.environ[k]}" for k in _FORCED)
    print(f"note: the environment forces {note}; numpy's OpenBLAS would run slower kernels, so this benchmark "
          "runs without them", file=sys.stderr)
    env = {k: v for k, v in os.environ.items() if k not in _FORCED}
    env["TGC_BENCH_UNFORCED"] = note
    os.execve(sys.executable, [sys.executable, *sys.argv], env)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

import tgc  # noqa: E402
from tgc.backends.cpu_peak import cpu_cache_bytes, measure_copy_bandwidth, measure_fma_peak  # noqa: E402
from tgc.backends.cpu_peak import measure_peak as measure_cpu_peak  # noqa: E402
from tgc.engine.bench import CACHE_FACTOR  # noqa: E402


def blas_note() -> str:
    """Which BLAS numpy uses and, for OpenBLAS, which kernel (core type) it runs."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "numpy BLAS: unknown (pip install threadpoolctl to see it)"
    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not libs:
        return "numpy BLAS: none found"
    i = libs[0]
    forced = os.environ.get("TGC_BENCH_UNFORCED")
    return (f"numpy BLAS: {i.get('internal_api')} {i.get('version')}, kernel {i.get('architecture')}, "
            f"{i.get('num_threads')} threads" + (f" (run without the environment's {forced})" if forced else ""))


def xla_timer(fn, inputs: dict[str, np.ndarray], names: list[str]):
    """A zero-argument callable running `fn(jnp, *inputs)` jitted by XLA on device-resident inputs, or None
    (with the reason in `XLA_MISSING`) where jax is not installed."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        XLA_MISSING[0] = f"jax is not installed ({e}); pip install 'tgc[bench]'"
        return None
    jax.config.update("jax_enable_x64", False)
    args = [jax.device_put(inputs[n]) for n in names]
    jitted = jax.jit(lambda *a: fn(jnp, *a))
    jax.block_until_ready(jitted(*args))  # compile
    return lambda: jax.block_until_ready(jitted(*args))


XLA_MISSING = [""]


def timeit(fn, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        st = time.perf_counter()
        fn()
        times.append(time.perf_counter() - st)
    return statistics.median(times)


def conv_np(x, w):
    """im2col + one BLAS matmul: what a numpy user would write."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))  # n c h w kh kw
    cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * wd, c * kh * kw)
    out = cols @ w.reshape(o, -1).T
    return out.reshape(n, h, wd, o).transpose(0, 3, 1, 2)


# what limits each workload where its target is missed (from reading the kernels' assembly and timings)
LIMITS = {
    "matmul": "a 4x64 register tile over a right-hand side packed into 32-column panels (the kernel alone ran "
              "at 95-100% of the FMA peak on quiet moments, the packing copy adds ~3%); no K blocking: the "
              "left-hand side streams from the L3 that other processes share, once per 64 columns",
    "chain": "polynomial exp2 is compute-heavy (~25 vector ops per 16 values); the 2 cores saturate before memory",
    "sum": "one pass at the 2 cores' read bandwidth; XLA's reduction reads as fast (memory-bound either way)",
    "softmax": "exp once per element (the sum pass stores it into the output row, the output pass scales the row "
               "in place); per row the max pass streams x from memory and the exp pass (~25 vector ops per 16 "
               "values) runs from cache, one after the other in each thread: on fast memory the exp work is not "
               "hidden behind the traffic (no prefetch of the next row)",
    "conv": "output channels as 16-lane vectors over weights packed (O/16, C, 3, 3, 16), a tile of 2x16 channels "
            "x 8 columns (~470 GFLOP/s, ~90% of peak, the kernel alone in a quiet moment); a miss comes from the "
            "shared cores: the 8 images are split statically over 2 threads, so a busy core holds back the kernel",
    "attention": "one fused online-softmax kernel (tgc/codegen/attention.py: 16 query rows per vector, 16 keys per "
                 "block; BEAM tries 8/16 rows x 8/16 keys and fewer threads); at D=64 the Dv output accumulators "
                 "and the gathered q tile (64 + 64 vectors) exceed the 32 vector registers and live on the stack",
    "layernorm": "three passes per row (mean from memory, then variance and output from cache), each row "
                 "reduction computed once per row",
    "mlp": "the erf GELU epilogue is fused into the matmul's output loop; XLA's matmul kernel is better blocked",
    "small": "the 20 kernels run as one CPU graph (one native call); XLA fuses the chain into fewer kernels, and "
             "each of tgc's kernels recomputes the column means before it",
    "transformer": "its kernels run in 4 chunks of 2 batch rows (for peak memory): matmuls with their epilogues "
                   "fused (the GELU hidden layer realized once), the causal attention one fused kernel whose "
                   "128-wide heads BEAM does not search (each candidate compiles for seconds)",
}
MEMORY_TARGET = 1.5  # peak memory / (inputs + outputs); elementwise work and softmax keep nothing else alive
MEMORY_TARGETS = {"exp": 1.1, "softmax": 1.1}
MEMORY_LIMITS = {
    "attention": "the score matrix between the two matmuls when attention is not fused",
    "transformer": "runs in 4 chunks of 2 batch rows (tgc/engine/chunk.py; TGC_CHUNK=0: whole, 2.20x): one chunk's "
                   "intermediates are 10 MiB beside the 20.0 MiB of inputs+outputs, 1.50x, at the bound; most of "
                   "it is the packed copies of w_fc and w_proj (4 MiB each), which do not shrink with the chunks "
                   "(8 chunks: 1.35x); whole-batch kernels cannot go below 1.80x (the GELU hidden layer "
                   "[8,256,2048], 16 MiB, with the output)",
    "matmul": "the packed copy of the right-hand side (one extra B-sized buffer)",
    "mlp": "the packed copy of the weight (one extra w-sized buffer)",
    "20": "each kernel recomputes the chain from x and the 19 column means (256 B each), so all 19 are read "
          "by the last kernel and live to the end: x, the output and the means are 1.59x; with the 64 B "
          "alignment padding of each of the 20 allocations, 1.75x (realizing each step in place would be "
          "about 1.05x)",
    "default": "intermediate buffers between the program's kernels",
}


def memory_target(name: str) -> float:
    return MEMORY_TARGETS.get(name.split()[0], MEMORY_TARGET)


def _np(fn):
    """The numpy version of a model from bench/models.py, in float32 like tgc."""
    return lambda *a: fn(np, *a)


def workloads(quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    f32 = np.float32
    m = 1 << (22 if quick else 24)
    a, b, c = (rng.standard_normal(m).astype(f32) for _ in range(3))
    sm = 1024 if quick else 4096
    x = rng.standard_normal((sm, sm)).astype(f32)
    out = []
    for n in ((256, 512) if quick else (1024, 2048)):
        ma, mb = rng.standard_normal((n, n)).astype(f32), rng.standard_normal((n, n)).astype(f32)
        out.append(dict(name=f"matmul {n}^3", src="a: f32[N, N]\nb: f32[N, N]\nreturn a @ b",
                        inputs={"a": ma, "b": mb}, model=lambda xp, p, q: p @ q, flops=2 * n ** 3, bound="flops",
                        targets=[("numpy", 0.7), ("xla", 1.0)] + ([("share", 0.85)] if n == 2048 else []),
                        limit=LIMITS["matmul"]))
    out.append(dict(name=f"exp chain {m >> 20}M", src="a: f32[N]\nb: f32[N]\nc: f32[N]\nreturn exp(a*b+c)*0.5-a",
                    inputs={"a": a, "b": b, "c": c}, model=lambda xp, a, b, c: xp.exp(a * b + c) * 0.5 - a,
                    bytes=16 * m, bound="bytes", targets=[("share", 0.75), ("xla", 1.0)], limit=LIMITS["chain"]))
    out.append(dict(name=f"sum {m >> 20}M", src="a: f32[N]\nreturn a.sum()", inputs={"a": a},
                    model=lambda xp, a: a.sum(), bytes=4 * m, bound="bytes", targets=[("share", 0.75), ("xla", 1.0)],
                    limit=LIMITS["sum"]))
    out.append(dict(name=f"softmax {sm}^2", src="x: f32[N, D]\nreturn softmax(x, axis=1)", inputs={"x": x},
                    model=lambda xp, x: models.softmax(xp, x, axis=1), bytes=8 * sm * sm, bound="bytes",
                    targets=[("numpy", 3.0), ("share", 0.75), ("xla", 1.0)], limit=LIMITS["softmax"]))
    out.append(dict(name=f"layernorm {sm}^2", src="x: f32[N, D]\nreturn layernorm(x)", inputs={"x": x},
                    model=lambda xp, x: models.layernorm(xp, x), bytes=8 * sm * sm, bound="bytes",
                    targets=[("xla", 1.0)], limit=LIMITS["layernorm"]))
    mm, mk, mn = (1024, 256, 256) if quick else (4096, 1024, 1024)
    mx, mw, mbias = (rng.standard_normal(s).astype(f32) for s in ((mm, mk), (mk, mn), (mn,)))
    out.append(dict(name=f"mlp gelu(x@w+b) {mm}x{mk}x{mn}", src="x: f32[M, K]\nw: f32[K, N]\nb: f32[N]\n"
                    "return gelu(x @ w + b)", inputs={"x": mx, "w": mw, "b": mbias}, model=models.mlp_layer,
                    flops=2 * mm * mk * mn, bound="flops", targets=[("xla", 1.0)], limit=LIMITS["mlp"]))
    nb, ch, hw = (2, 32, 28) if quick else (8, 64, 56)
    cx = rng.standard_normal((nb, ch, hw, hw)).astype(f32)
    cw = rng.standard_normal((ch, ch, 3, 3)).astype(f32)

    def conv_xla(xp, x, w):
        import jax
        return jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)))
    out.append(dict(name=f"conv2d {nb}x{ch}x{hw}^2 3x3", src="x: f32[N, C, H, W]\nw: f32[O, C, 3, 3]\n"
                    "return conv2d(x, w, padding=1)", inputs={"x": cx, "w": cw}, numpy=lambda: conv_np(cx, cw),
                    model=conv_xla, flops=2 * nb * ch * ch * 9 * hw * hw, bound="flops",
                    targets=[("numpy", 2.0), ("xla", 1.2), ("share", 0.5)], limit=LIMITS["conv"]))
    for h, sq, d in (((4, 128, 64),) if quick else ((8, 512, 64), (8, 2048, 64))):
        q, k, v = (rng.standard_normal((h, sq, d)).astype(f32) for _ in range(3))
        out.append(dict(name=f"attention {h}x{sq}x{d}", src="q: f32[H, S, D]\nk: f32[H, S, D]\nv: f32[H, S, D]\n"
                        "return softmax(q @ k.transpose(1, 2) * (1.0 / 8.0), axis=-1) @ v",
                        inputs={"q": q, "k": k, "v": v}, model=models.attention,
                        flops=4 * h * sq * sq * d, bound="flops", targets=[("xla", 1.0)], limit=LIMITS["attention"]))
    sx = rng.standard_normal((16, 64)).astype(f32)
    out.append(dict(name="20 small kernels 16x64", path="kernels/small_kernels.tg", inputs={"x": sx},
                    model=models.small_kernels, bytes=20 * 2 * sx.nbytes, bound="bytes", targets=[("xla", 1.0)],
                    limit=LIMITS["small"], launch_overhead=True))
    tb, tt, tc = (2, 64, 128) if quick else (8, 256, 512)
    tin = models.transformer_inputs(tb, tt, tc)
    tflops = 2 * tb * tt * tc * (3 * tc + tc + 8 * tc) + 4 * tb * tt * tt * tc
    out.append(dict(name=f"transformer block {tb}x{tt}x{tc}", path="kernels/transformer_block.tg", inputs=tin,
                    dims=models.transformer_dims(tb, tt, tc), model=models.transformer_block, flops=tflops,
                    bound="flops", targets=[("xla", 1.0), ("xla default", 0.8)], limit=LIMITS["transformer"]))
    return out


TGC_ROUNDS = 3  # default and BEAM timings alternate this many times (the best of each counts)
# every workload: the default kernels (no search) take at most 1/0.8 of BEAM's time, in the same run
DEFAULT_VS_BEAM = 0.8
DEFAULT_LIMIT = ("the hand-coded heuristic picks another tile than BEAM's winner (`tgc beam --json` shows its opts); "
                 "within the noise of this shared machine where the gap is small")


def paired_share(amount: float, pairs: list[list]) -> float:
    """A workload's share of the peak from its timings in the order taken, each with the peak measured right
    after it ([tuned, seconds, peak]: the FMA loop's GFLOP/s for compute-bound work, the copy's GB/s for
    memory-bound work, `amount` being FLOPs or bytes): a timing's ratio is to the better of the
    peaks measured just before and just after it (the previous timing's and its own), the share the median of
    those ratios for the default kernels and for BEAM's, the better of the two. On a shared machine the run's
    overall peak may come from a quiet moment while the workload ran busy (matmul 2048 read 61% that way);
    the peaks beside a timing see about the same load, and the better of two keeps a busy one from reading
    the share high."""
    ratios: dict[bool, list[float]] = {}
    for i, (tuned, t, peak) in enumerate(pairs):
        beside = max(peak, pairs[i - 1][2]) if i else peak
        ratios.setdefault(tuned, []).append(amount / t / 1e9 / beside)
    return max(statistics.median(v) for v in ratios.values())
# every workload: `tgc beam` (the CLI's defaults: `Program.beam`'s width, no --force) searches it within this
BEAM_TIME_TARGET_S = 60.0
BEAM_TIME_LIMIT = ("width 4 tries ~30-80 candidates per kernel that matters (a kernel under 2% of the program's "
                   "default time gets a width-1 one-round search; kernels with the same AST are searched once), "
                   "each rendered in the main process (~50 ms of Python) and compiled by LLVM in 2 worker processes "
                   "on this machine, then timed: the wall time grows with the machine's load (2 cores shared); "
                   "`tgc beam --json` shows the candidates tried per kernel")


def _target_text(kind: str, want: float) -> str:
    return {"numpy": f">= {want}x numpy", "xla": f">= {want}x XLA", "xla default": f"default >= {want}x XLA",
            "share": f">= {100 * want:.0f}% of peak", "beam": f"default >= {want}x BEAM",
            "beam time": f"tgc beam < {want:.0f} s"}[kind]


def _target_met(kind: str, want: float, r: dict) -> bool | None:
    if kind == "beam time":  # a search that found every winner cached measured nothing: not judged
        s = r.get("beam_search_s")
        return None if s is None or r.get("beam_cached") else s < want
    got = {"numpy": r["ratio"], "xla": r["xla_ratio"], "share": r["peak_share"],
           "xla default": (r["xla_ms"] / r["default_ms"]) if r["xla_ms"] is not None else None,
           "beam": (r["beam_ms"] / r["default_ms"]) if r["beam_ms"] is not None else None}[kind]
    return None if got is None else got >= want


def peak_memory(prog, inputs, dims=None) -> tuple[int, int]:
    """(peak bytes while running: the inputs, already in memory, plus the array data the run allocates,
    bytes of inputs plus outputs). Traced from an empty allocator pool, so that intermediates a previous run
    left in the pool count. Only numpy's data (tracemalloc's numpy domain: buffers with their alignment
    padding, copies) counts, not the run's Python objects (a few hundred bytes per kernel, whatever the
    sizes). The pool frees nothing during a run (a freed buffer waits there for the next), so the data it
    holds after the run, with the outputs, is the most the run held at once; a copy made and dropped within
    the run (an input that must be cast or made contiguous) would not count, and the inputs here need none."""
    outs = prog.run(dims=dims, inputs=inputs)  # warm: compile
    in_bytes = sum(v.nbytes for v in inputs.values())
    io = in_bytes + sum(v.nbytes for v in outs.values())
    from tgc.backends import get_device
    prog.release()  # a first run's allocations: not the buffers a launch plan keeps between runs
    get_device("CPU").allocator.free_cache()
    del outs
    data = [tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)]
    tracemalloc.start()
    before = sum(t.size for t in tracemalloc.take_snapshot().filter_traces(data).traces)
    outs = prog.run(dims=dims, inputs=inputs)
    after = sum(t.size for t in tracemalloc.take_snapshot().filter_traces(data).traces)
    tracemalloc.stop()
    del outs
    return in_bytes + after - before, io


LAUNCH_TARGET_US = 2.0  # launch overhead per kernel of a program of small kernels on the CPU


def launch_overhead(prog, inputs: dict, dims=None) -> dict:
    """Launch cost per kernel of a program of small kernels, in one run: the whole program's median time divided
    by its kernel count, run as one CPU graph (what `Program.run` does from a program's second run) and with every
    kernel launched from Python (`TGC_GRAPH=0`), and the time of a whole `Program.run` call (binding, copies in
    and out, the graph). Both per-kernel figures are upper bounds: they include the kernels' own work."""
    graphed = prog.bench(inputs=inputs, dims=dims, repeat=50)
    old = os.environ.get("TGC_GRAPH")
    os.environ["TGC_GRAPH"] = "0"
    try:
        single = prog.bench(inputs=inputs, dims=dims, repeat=50)["program"]["median_s"]
    finally:
        if old is None:
            os.environ.pop("TGC_GRAPH")
        else:
            os.environ["TGC_GRAPH"] = old
    n = len(graphed["kernels"])
    run_s = timeit(lambda: prog.run(dims=dims, inputs=inputs), repeat=200)
    per = graphed["program"]["median_s"] / n * 1e6
    return {"kernels": n, "graph": graphed["program"]["graph"], "us_per_kernel": per,
            "us_per_kernel_no_graph": single / n * 1e6, "run_us": run_s * 1e6, "met": per <= LAUNCH_TARGET_US}


def startup_time() -> float | None:
    exe = os.path.join(os.path.dirname(sys.executable), "tgc")
    if not os.path.exists(exe):
        return None
    cmd = [exe, "run", "kernels/softmax.tg", "--random", "-D", "N=4", "-D", "D=8"]
    subprocess.run(cmd, capture_output=True, check=False)  # warm the disk cache
    times = []
    for _ in range(5):
        st = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=False)
        times.append(time.perf_counter() - st)
    return statistics.median(times)


PACKAGE_CASES = [("softmax", "kernels/softmax.tg", ["N=256", "D=1024"]),
                 ("matmul", "kernels/matmul.tg", ["M=256", "K=256", "N=256"])]


def package_times(repeat: int = 5) -> list[dict] | None:
    """Compile once, run anywhere: the time of a whole `tgc run PKG --random` process that starts cold (a fresh
    process, an empty compile cache: nothing to compile, nothing cached) against `tgc run FILE --random` with
    a warm compile cache, for softmax and matmul (medians of `repeat` processes)."""
    import tempfile

    exe = os.path.join(os.path.dirname(sys.executable), "tgc")
    if not os.path.exists(exe):
        return None
    out = []
    with tempfile.TemporaryDirectory(prefix="tgc-bench-pkg-") as tmp:
        for name, path, dims in PACKAGE_CASES:
            pkg = os.path.join(tmp, f"{name}.tgpkg")
            path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), path)
            d_args = [a for dim in dims for a in ("-D", dim)]
            subprocess.run([exe, "compile", path, *d_args, "-d", "CPU", "--package", pkg], capture_output=True,
                           check=True)
            file_cmd = [exe, "run", path, "--random", *d_args]
            subprocess.run(file_cmd, capture_output=True, check=True)  # warm the compile cache

            def median(cmd: list[str], env: dict | None = None) -> float:
                times = []
                for _ in range(repeat):
                    st = time.perf_counter()
                    subprocess.run(cmd, capture_output=True, check=True, env=env)
                    times.append(time.perf_counter() - st)
                return statistics.median(times)

            cold = []
            for i in range(repeat):  # each process gets its own empty cache directory
                env = {**os.environ, "TGC_CACHE_DIR": os.path.join(tmp, f"cold-{name}-{i}")}
                st = time.perf_counter()
                subprocess.run([exe, "run", pkg, "--random"], capture_output=True, check=True, env=env)
                cold.append(time.perf_counter() - st)
            warm = median(file_cmd)
            pkg_s = statistics.median(cold)
            out.append({"name": name, "dims": dims, "package_cold_s": pkg_s, "file_warm_s": warm,
                        "ratio": pkg_s / warm})
    return out


def _with_threads(threads: int, fn):
    """fn() with TGC_THREADS set (the CPU's core count as tgc sees it), then the old value back."""
    old = os.environ.get("TGC_THREADS")
    os.environ["TGC_THREADS"] = str(threads)
    try:
        return fn()
    finally:
        if old is None:
            os.environ.pop("TGC_THREADS", None)
        else:
            os.environ["TGC_THREADS"] = old


def _alternate(one, two, rounds: int) -> tuple[float, dict]:
    """Best time of `one()` and the result of `two()` with the best program time, run alternately (so that
    both see the same load on a shared machine)."""
    best_one, best_two = float("inf"), None
    for _ in range(rounds):
        best_one = min(best_one, one()["program"]["min_s"])
        r = two()
        if best_two is None or r["program"]["min_s"] < best_two["program"]["min_s"]:
            best_two = r
    assert best_two is not None
    return best_one, best_two


def multi_device(quick: bool) -> list[dict]:
    """Many devices: a data-parallel matmul with its rows sharded on CPU:0,CPU:1 (one core each: TGC_THREADS=2
    split between them) against one CPU device with one thread, and a sum of 64M floats sharded the same way
    (the all-reduce's share of the program). Default kernels (no BEAM winners) on both sides; the best of a
    few alternating runs of each (this machine may be shared)."""
    rng = np.random.default_rng(0)
    rows = []
    size = 512 if quick else 2048
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    n = (4 if quick else 64) << 20
    x = rng.standard_normal(n, dtype=np.float32)
    cases = [(f"matmul {size}^3, rows sharded", "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b", {"a": a, "b": b},
              {"a": 0}, 1.8),
             (f"sum of {n >> 20}M f32, sharded", "x: f32[N]\nreturn sum(x)", {"x": x}, {"x": 0}, None)]
    for name, src, inputs, shard, target in cases:
        single, multi = tgc.loads(src), tgc.loads(src)
        one, two = _alternate(
            lambda single=single, inputs=inputs: _with_threads(1, lambda: single.bench(
                device="CPU", inputs=inputs, repeat=1, warmup=1, tuned=False)),
            lambda multi=multi, inputs=inputs, shard=shard: _with_threads(2, lambda: multi.bench(
                device="CPU:0,CPU:1", shard=shard, inputs=inputs, repeat=1, warmup=1, tuned=False)), 3)
        t2 = two["program"]["min_s"]
        rows.append({"name": name, "one_ms": one * 1e3, "two_ms": t2 * 1e3, "speedup": one / t2, "target": target,
                     "allreduce_share": two["collectives"]["median_s"] / t2 if two["collectives"]["steps"] else None,
                     "per_device_ms": [k["median_s"] * 1e3 for k in two["kernels"] if "device" in k]})
    return rows


def print_multi(rows: list[dict]) -> None:
    print("\nMany devices (CPU:0,CPU:1 with one core each against one CPU device with one thread; best of 3):")
    print("| workload | 1 device, 1 thread | CPU:0,CPU:1 | speed-up | target | all-reduce share |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        target = "-" if r["target"] is None else f">= {r['target']}x: {'yes' if r['speedup'] >= r['target'] else 'no'}"
        share = "-" if r["allreduce_share"] is None else f"{100 * r['allreduce_share']:.2f}%"
        print(f"| {r['name']} | {r['one_ms']:.2f} ms | {r['two_ms']:.2f} ms | {r['speedup']:.2f}x | {target} | "
              f"{share} |")


SYMBOLIC_TARGET = 1.2  # symbolic kernels' time over the size-specialized ones, at the two largest sizes


def symbolic_sizes(quick: bool) -> list[tuple[str, str, list[dict[str, int]]]]:
    """Five sizes each of softmax and matmul: small, odd ones (the size class of sizes >= 2) and multiples of 32
    (their own class, with the optimized symbolic kernels)."""
    if quick:
        return [("softmax", "kernels/softmax.tg", [{"N": n, "D": d} for n, d in
                                                   ((7, 9), (33, 65), (64, 64), (100, 129), (128, 256))]),
                ("matmul", "kernels/matmul.tg", [{"M": m, "K": m, "N": m} for m in (7, 33, 64, 100, 128)])]
    return [("softmax", "kernels/softmax.tg", [{"N": n, "D": d} for n, d in
                                               ((64, 100), (333, 777), (256, 256), (1024, 1024), (2048, 2048))]),
            ("matmul", "kernels/matmul.tg", [{"M": m, "K": m, "N": m} for m in (33, 100, 128, 512, 1024)])]


def symbolic_rows(quick: bool) -> list[dict]:
    """Each size: the kernels compiled once for its size class (`Program.run(symbolic=True)`) against kernels
    compiled for that size, both with default opts (no BEAM winners), timed in this run."""
    rows = []
    for name, path, dimsets in symbolic_sizes(quick):
        prog = tgc.load(path)
        for i, dims in enumerate(dimsets):
            from tgc.engine.inputs import random_inputs
            inputs = random_inputs(prog, dims, seed=0)
            sym = prog.bench(inputs=inputs, dims=dims, repeat=5, tuned=False, symbolic=True)
            spec = prog.bench(inputs=inputs, dims=dims, repeat=5, tuned=False)
            plan = next((p for (dev, cls), p in prog._plans.items() if not isinstance(p, str)
                         and cls == tgc_sizes().size_class(prog.dim_names, dims)), None)
            sym_s, spec_s = sym["program"]["median_s"], spec["program"]["median_s"]
            large = i >= len(dimsets) - 2
            rows.append({"name": f"{name} {'x'.join(str(v) for v in dims.values())}",
                         "size_class": tgc_sizes().class_text(tgc_sizes().size_class(prog.dim_names, dims)),
                         "kernels": sym["kernels_for"] + (f" ({', '.join(plan.chosen)})" if plan else ""),
                         "symbolic_ms": sym_s * 1e3, "specialized_ms": spec_s * 1e3, "ratio": sym_s / spec_s,
                         "target": SYMBOLIC_TARGET if large else None,
                         "met": (sym_s / spec_s <= SYMBOLIC_TARGET) if large else None})
    return rows


def tgc_sizes():
    from tgc.codegen import sizes
    return sizes


def print_symbolic(rows: list[dict]) -> None:
    print("\nSymbolic sizes: kernels compiled once per size class vs compiled for the size (default opts)")
    head = "| workload | size class | kernels | symbolic | specialized | symbolic / specialized | target |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for r in rows:
        target = "-" if r["target"] is None else f"<= {r['target']}x: {'yes' if r['met'] else 'no'}"
        print(f"| {r['name']} | {r['size_class']} | {r['kernels']} | {r['symbolic_ms']:.3f} ms | "
              f"{r['specialized_ms']:.3f} ms | {r['ratio']:.2f}x | {target} |")


def remote_rows(quick: bool) -> list[dict]:
    """Two `tgc serve` processes on loopback as REMOTE:0,REMOTE:1 against local devices (bench_remote_multi)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_remote_multi import remote_pair_overhead
    try:
        return remote_pair_overhead(quick)
    except Exception as e:  # noqa: BLE001 - a bench section that cannot run says why, the rest still prints
        return [{"what": "REMOTE pair", "skipped": f"{type(e).__name__}: {e}"}]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--no-beam", action="store_true")
    ap.add_argument("--no-xla", action="store_true", help="skip XLA (jax) even where it is installed")
    ap.add_argument("--only", default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--multi-only", action="store_true", help="only the many-devices section")
    ap.add_argument("--no-symbolic", action="store_true", help="skip the symbolic-vs-specialized sizes")
    ap.add_argument("--corpus-beam", action="store_true",
                    help="run `tgc beam` on each corpus model first (else its BEAM column uses the stored winners)")
    ap.add_argument("--corpus-beam-budget", type=float, default=None, metavar="SECONDS",
                    help="--corpus-beam's search per model (`tgc beam --budget`; default corpus.BEAM_BUDGET_S; "
                         "0: unbounded)")
    ap.add_argument("--no-corpus", action="store_true", help="skip the model-corpus table")
    ap.add_argument("--no-compile-table", action="store_true", help="skip the compile table")
    ap.add_argument("--model", default=None, help="corpus and compile tables: only corpus models with this in "
                    "their name (the compile table then leaves out the bench workloads)")
    ap.add_argument("--no-onnx", action="store_true", help="skip the ONNX model table (bench/bench_onnx.py)")
    ap.add_argument("--onnx-all", action="store_true", help="the ONNX table: all nine light models (slow: "
                    "ResNet-50, DenseNet-121, Inception v1/v2 and VGG-19 compile for minutes each)")
    ap.add_argument("--onnx-beam", action="store_true", help="the ONNX table: time tgc after BEAM too (slow)")
    ap.add_argument("--onnx-beam-budget", type=float, default=None, metavar="SECONDS",
                    help="the ONNX table's BEAM search per model (`tgc beam --budget`; default "
                         "bench_onnx.BEAM_BUDGET_S)")
    args = ap.parse_args()
    if args.only == "onnx":  # only the ONNX model table against onnxruntime (and tinygrad's runner)
        onnx_table(args)
        return
    if args.only in ("corpus", "compile", "corpus,compile"):  # only the model-corpus and/or the compile table
        corpus_rows, compile_rows = model_tables(args, set(args.only.split(",")))
        if args.json:
            print(json.dumps({"corpus": corpus_rows, "compile": compile_rows}, indent=1))
        else:
            print_model_tables(corpus_rows, compile_rows, args.quick)
        return
    if args.multi_only:
        rows = multi_device(args.quick)
        print(json.dumps(rows, indent=1)) if args.json else print_multi(rows)
        return
    if args.only == "symbolic":  # only the symbolic-sizes table
        rows = symbolic_rows(args.quick)
        print(json.dumps({"symbolic": rows}, indent=1)) if args.json else print_symbolic(rows)
        return

    from tgc.backends import get_device
    dev = get_device("CPU")
    peak = measure_cpu_peak(dev)
    print(f"machine: {dev.cores} threads, FMA peak {peak['gflops']:.0f} GFLOP/s, read {peak['read_gbps']:.1f} GB/s, "
          f"copy {peak['copy_gbps']:.1f} GB/s", file=sys.stderr)
    print(blas_note(), file=sys.stderr)
    rows = []
    for w in workloads(args.quick):
        if args.only and args.only not in w["name"]:
            continue
        prog = tgc.load(w["path"]) if "path" in w else tgc.loads(w["src"])
        dims = w.get("dims")
        names = [d.name for d in prog.inputs]
        print(f"... {w['name']}", file=sys.stderr)

        beside: list[list] = []  # a flops-bound workload: [tuned, its time, the FMA peak measured right after]

        def time_tgc(tuned: bool, prog=prog, w=w, dims=dims, beside=beside) -> float:
            t = prog.bench(inputs=w["inputs"], dims=dims, repeat=5, tuned=tuned)["program"]["median_s"]
            if w["bound"] == "flops":  # timed the same way: runs as long as the workload's, their median
                beside.append([tuned, t, measure_fma_peak(dev, seconds=t)])
            else:  # this VM's memory bandwidth swings between moments (41-74 GB/s in two quiet runs): a copy beside it
                beside.append([tuned, t, measure_copy_bandwidth(dev)])
            return t
        tuned = None
        if args.no_beam:
            default = time_tgc(False)
        else:
            st = time.perf_counter()
            found = prog.beam(dims=prog.bind(w["inputs"], dims)[0])  # what `tgc beam` does by default
            beam_s = time.perf_counter() - st
            beam_cached = all(k.get("cached") for k in found["kernels"])
            # default and BEAM alternate, the best of 3 each: on a shared machine one measurement after the
            # other compares two different loads, not two kernels
            pairs = [(time_tgc(False), time_tgc(True)) for _ in range(TGC_ROUNDS)]
            default, tuned = min(p[0] for p in pairs), min(p[1] for p in pairs)
        args_np = [w["inputs"][n] for n in names]
        numpy_s = timeit(w.get("numpy") or (lambda w=w, args_np=args_np: w["model"](np, *args_np)))
        xla = xla_timer(w["model"], w["inputs"], names) if not args.no_xla else None
        xla_s = timeit(xla) if xla is not None else None
        best = min(t for t in (default, tuned) if t is not None)
        mem, io = peak_memory(prog, w["inputs"], dims)
        r = {"name": w["name"], "default_ms": default * 1e3, "beam_ms": tuned * 1e3 if tuned else None,
             "beam_search_s": beam_s if tuned else None, "beam_cached": beam_cached if tuned else None,
             "numpy_ms": numpy_s * 1e3,
             "xla_ms": xla_s * 1e3 if xla_s is not None else None, "ratio": numpy_s / best,
             "xla_ratio": xla_s / best if xla_s is not None else None,
             "peak_mem_ratio": mem / io, "memory_target": memory_target(w["name"]),
             "memory_met": mem / io <= memory_target(w["name"]), "peak_pairs": beside}
        if w.get("launch_overhead"):
            r["launch"] = launch_overhead(prog, w["inputs"], dims)
        rows.append((w, best, r))
    # the peaks again at the end, keeping the better of the two: one measurement on a busy or still-waking
    # machine reads low, and every share of peak would then read high (above 100%)
    again = measure_cpu_peak(dev)
    peak = {k: max(peak[k], again[k]) if isinstance(peak.get(k), (int, float)) else peak[k] for k in peak}
    # what a memory-bound workload's share is of: the backend's own copy kernel (bytes read + written, as the
    # workloads count theirs); the read peak is printed beside it (a read-only sum may pass 100% of the copy)
    copy_gbs, read_gbs = peak["copy_gbps"], peak["read_gbps"]
    done = []
    for w, best, r in rows:
        amount = w["flops"] if w["bound"] == "flops" else w["bytes"]
        r["peak_share"] = amount / best / 1e9 / (peak["gflops"] if w["bound"] == "flops" else copy_gbs)
        if w["bound"] == "bytes":
            r["read_share"] = amount / best / 1e9 / read_gbs
            r["near_cache"] = bool(cpu_cache_bytes()) and amount <= CACHE_FACTOR * (cpu_cache_bytes() or 0)
        if r["peak_pairs"]:
            r["peak_share"] = paired_share(amount, r["peak_pairs"])
        r["rate"] = f"{amount / best / 1e9:.1f} {'GFLOP/s' if w['bound'] == 'flops' else 'GB/s'}"
        targets = [*w["targets"], ("beam", DEFAULT_VS_BEAM), ("beam time", BEAM_TIME_TARGET_S)]
        checks = [(_target_text(k, v), _target_met(k, v, r)) for k, v in targets]
        r["targets"] = [{"target": t, "met": m} for t, m in checks]
        r["met"] = None if all(m is None for _, m in checks) else all(m is not False for _, m in checks)
        missed = {k for (k, _), (_, m) in zip(targets, checks) if m is False}
        r["limit"] = "; ".join(([w["limit"]] if missed - {"beam", "beam time"} else []) +
                               ([f"default: {DEFAULT_LIMIT}"] if "beam" in missed else []) +
                               ([f"search {r['beam_search_s']:.0f} s: {BEAM_TIME_LIMIT}"] if "beam time" in missed
                                else []))
        done.append(r)
    rows = done
    startup = startup_time()
    packages = package_times() if not args.only or args.only == "package" else None
    multi = multi_device(args.quick) if not args.only or args.only in "many devices" else []
    remote = remote_rows(args.quick) if not args.only or args.only in "many devices remote" else []
    sym_rows = symbolic_rows(args.quick) if not args.no_symbolic and not args.only else []
    corpus_rows, compile_rows = model_tables(args, {t for t, skip in (("corpus", args.no_corpus),
                                                                      ("compile", args.no_compile_table))
                                                    if not skip and not args.only})
    if args.json:
        print(json.dumps({"corpus": corpus_rows, "compile": compile_rows, "peak": peak, "copy_gbs": copy_gbs,
                          "read_gbs": read_gbs, "rows": rows, "startup_s": startup,
                          "packages": packages,
                          "blas": blas_note(), "xla_missing": XLA_MISSING[0] or None, "multi_device": multi,
                          "remote_pair": remote, "symbolic": sym_rows},
                         indent=1))
        return
    head = ("| workload | tgc default | tgc beam | numpy | XLA | x numpy | x XLA | rate | share of peak | targets |"
            " peak mem / io |")
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.1f} us" if v < 0.1 else f"{v:.2f} ms"
    for r in rows:
        xr = "-" if r["xla_ratio"] is None else f"{r['xla_ratio']:.2f}x"
        targets = "; ".join(f"{t['target']}: {'-' if t['met'] is None else 'yes' if t['met'] else 'no'}"
                            for t in r["targets"]) or "-"
        print(f"| {r['name']} | {ms(r['default_ms'])} | {ms(r['beam_ms'])} | {ms(r['numpy_ms'])} | "
              f"{ms(r['xla_ms'])} | {r['ratio']:.2f}x | {xr} | {r['rate']} | {100 * r['peak_share']:.0f}% | "
              f"{targets} | {r['peak_mem_ratio']:.2f} (<= {r['memory_target']}: "
              f"{'yes' if r['memory_met'] else 'no'}) |")
    for r in rows:
        if "launch" in r:
            lo = r["launch"]
            how = "as one CPU graph" if lo["graph"] else "launched one by one (no graph was made)"
            print(f"\n{r['name']}: {lo['us_per_kernel']:.2f} us per kernel {how} (target <= {LAUNCH_TARGET_US} us: "
                  f"{'met' if lo['met'] else 'no'}), {lo['us_per_kernel_no_graph']:.2f} us per kernel launched one "
                  f"by one (TGC_GRAPH=0): {lo['us_per_kernel_no_graph'] / lo['us_per_kernel']:.0f}x; both include "
                  f"the kernels' own work. A whole Program.run call: {lo['run_us']:.1f} us")
    missed = [r for r in rows if r["met"] is False or not r["memory_met"]]
    if missed:
        print("\nMissed targets and what limits them:")
        for r in missed:
            if r["met"] is False:
                lost = ", ".join(t["target"] for t in r["targets"] if t["met"] is False)
                print(f"- {r['name']}: missed {lost}: {r['limit']}")
            if not r["memory_met"]:
                why = MEMORY_LIMITS.get(r["name"].split()[0], MEMORY_LIMITS["default"])
                print(f"- {r['name']}: peak memory {r['peak_mem_ratio']:.2f}x inputs+outputs "
                      f"(target {r['memory_target']}x): {why}")
    if XLA_MISSING[0]:
        print(f"\nXLA column empty: {XLA_MISSING[0]}")
    print(blas_note())
    print(f"\nFMA peak {peak['gflops']:.0f} GFLOP/s, copy peak {copy_gbs:.1f} GB/s (bytes read + written), read "
          f"peak {read_gbs:.1f} GB/s (the CPU backend's own kernels, tgc/backends/cpu_peak.py, measured in this "
          f"run; memory-bound shares are of the copy peak, as the issue's targets are: a read-only sum may pass "
          f"100%; each workload's share is of the peaks measured beside its own timings: the FMA loop, or the copy)")
    shares = [f"{r['name']} {100 * r['read_share']:.0f}%" for r in rows if "read_share" in r]
    if shares:
        print(f"memory-bound shares of the read peak instead: {', '.join(shares)}")
    near = [r["name"] for r in rows if r.get("near_cache")]
    if near:
        print(f"partly served from the {cpu_cache_bytes() >> 20} MiB last-level cache between timed runs (bytes "
              f"within {CACHE_FACTOR}x of it, as `tgc bench` marks them), so their shares can pass 100%: "
              f"{', '.join(near)}")
    if startup is not None:
        print(f"warm `tgc run kernels/softmax.tg --random` as a whole process: {startup * 1e3:.0f} ms")
    for p in packages or []:
        print(f"{p['name']} ({' '.join(p['dims'])}): `tgc run PKG --random` cold (fresh process, empty cache) "
              f"{p['package_cold_s'] * 1e3:.0f} ms vs `tgc run FILE --random` warm cache "
              f"{p['file_warm_s'] * 1e3:.0f} ms ({p['ratio']:.2f}x)")
    if multi:
        print_multi(multi)
    if remote:
        from bench_remote_multi import format_rows
        print()
        print(format_rows(remote))
    if sym_rows:
        print_symbolic(sym_rows)
    print_model_tables(corpus_rows, compile_rows, args.quick)
    if not args.no_onnx and not args.only:
        onnx_table(args)


def onnx_table(args: argparse.Namespace) -> None:
    """The ONNX model table (bench/bench_onnx.py): the quick light models, or all nine with --onnx-all."""
    import bench_onnx

    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("\nONNX model table skipped: onnxruntime is not installed (pip install -e '.[bench]')")
        return
    models = bench_onnx.LIGHT if args.onnx_all else bench_onnx.QUICK
    budget = args.onnx_beam_budget if args.onnx_beam_budget is not None else bench_onnx.BEAM_BUDGET_S
    rows = bench_onnx.onnx_rows(models, repeat=5, beam=args.onnx_beam, log=lambda s: print(s, file=sys.stderr),
                                beam_budget_s=budget)
    if args.json:
        print(json.dumps({"onnx": rows}, indent=1))
    else:
        bench_onnx.print_onnx(rows)


def model_tables(args: argparse.Namespace, which: set[str]) -> tuple[list[dict], list[dict]]:
    """The model-corpus table (bench/corpus.py) and the compile table (bench/compile_table.py), as asked."""
    import compile_table
    import corpus

    def log(msg: str) -> None:
        print(msg, file=sys.stderr)
    budget = corpus.BEAM_BUDGET_S if args.corpus_beam_budget is None else args.corpus_beam_budget or None
    rows = corpus.corpus_rows(args.quick, args.corpus_beam, peak_memory,
                              None if args.no_xla else xla_timer, timeit, only=args.model, log=log,
                              beam_budget_s=budget) \
        if "corpus" in which else []
    comp = compile_table.compile_rows(args.quick, workloads(args.quick), xla=not args.no_xla, only=args.model,
                                      log=log) if "compile" in which else []
    return rows, comp


def print_model_tables(corpus_rows: list[dict], compile_rows: list[dict], quick: bool) -> None:
    import compile_table
    import corpus
    if corpus_rows:
        corpus.print_corpus(corpus_rows, quick)
    if compile_rows:
        compile_table.print_compile(compile_rows, quick)


if __name__ == "__main__":
    main()
