"""Timing a program: each kernel and the whole program on device-resident inputs, against the machine's peak.

Peak figures are measured once per machine and kept in the disk cache (table `peak`): on the CPU, an
FMA-bound kernel for FLOP/s and a plain 2-thread copy for bandwidth, both compiled by tgc itself.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import numpy as np

from tgc.engine.realize import allocate
from tgc.ir.shapes import prod, shape_of


def random_inputs(prog, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for every declaration: standard normal floats, small ints, random bools."""
    from tgc.dsl.frontend import concrete_shape
    rng = np.random.default_rng(seed)
    out = {}
    for decl in prog.inputs:
        shape = concrete_shape(decl, dims)
        d = decl.dtype
        if d.is_bool:
            out[decl.name] = rng.random(shape) < 0.5
        elif d.is_int:
            lo = 0 if d.is_unsigned else -8
            out[decl.name] = rng.integers(lo, 9, size=shape).astype(d.np)
        elif d.name == "bf16":
            out[decl.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            out[decl.name] = rng.standard_normal(shape).astype(d.np)
    return out


def _stats(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    q1 = times[len(times) // 4]
    q3 = times[(3 * len(times)) // 4]
    return {"median_s": statistics.median(times), "min_s": times[0], "max_s": times[-1], "iqr_s": q3 - q1}


def bench_program(prog, device: str | None = None, dims: dict[str, int] | None = None, repeat: int = 10,
                  beam: int = 0, inputs: dict[str, np.ndarray] | None = None, vs_numpy: bool = False,
                  warmup: int = 1, tuned: bool = True) -> dict[str, Any]:
    from tgc.backends import default_device, get_device

    name = device or default_device()
    dev = get_device(name)
    if inputs is None:
        dims = prog.resolve_dims(dims)
        inputs = random_inputs(prog, dims)
    dims, arrays = prog.bind(inputs, dims, cast=True)
    kernels = prog.compile(device=name, dims=dims, beam=beam, tuned=tuned)
    outs, in_bufs = prog._trace(dims)
    buffers: dict = {}
    try:
        allocate(dev, prog, kernels, in_bufs, arrays, buffers)
        launches = [(k, k.program(), [buffers[n].handle for n in k.bufs]) for k in kernels]

        def run_all(wait: bool) -> list[float]:
            ts = []
            for k, p, handles in launches:
                t = p(*handles, global_size=k.global_size, local_size=k.local_size, vals=k.vals, wait=wait)
                ts.append(t or 0.0)
            return ts

        for _ in range(warmup):
            run_all(True)
        per_kernel: list[list[float]] = [[] for _ in kernels]
        whole: list[float] = []
        for _ in range(max(repeat, 1)):
            st = time.perf_counter()
            ts = run_all(True)
            dev.synchronize()
            whole.append(time.perf_counter() - st)
            for i, t in enumerate(ts):
                per_kernel[i].append(t)
    finally:
        for buf in buffers.values():
            buf.free()

    peak = machine_peak(dev)
    rows = []
    total_flops = sum(k.flops for k in kernels)
    total_bytes = sum(k.bytes_moved for k in kernels)
    for k, ts in zip(kernels, per_kernel):
        st = _stats(ts)
        row = {"name": k.name, "line": k.line, "global_size": list(k.global_size),
               "local_size": list(k.local_size) if k.local_size else None, "opts": [str(o) for o in k.opts],
               "flops": k.flops, "bytes": k.bytes_moved, **st}
        row.update(_rates(k.flops, k.bytes_moved, st["median_s"], peak))
        rows.append(row)
    prog_stats = _stats(whole)
    program = {**prog_stats, "flops": total_flops, "bytes": total_bytes,
               **_rates(total_flops, total_bytes, prog_stats["median_s"], peak)}
    result: dict[str, Any] = {"device": dev.name, "dims": dims, "repeat": repeat, "beam": beam, "kernels": rows,
                              "program": program, "peak": peak}
    if vs_numpy:
        result["numpy"] = _bench_numpy(prog, dims, inputs, repeat, program["median_s"])
    return result


def _rates(flops: int, nbytes: int, seconds: float, peak: dict) -> dict[str, float]:
    gflops = flops / seconds / 1e9 if seconds > 0 else 0.0
    gbps = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    share = max(gflops / peak["gflops"] if peak.get("gflops") else 0.0,
                gbps / peak["gbps"] if peak.get("gbps") else 0.0)
    return {"gflops": gflops, "gbps": gbps, "peak_share": share}


def _bench_numpy(prog, dims, inputs, repeat, tgc_median) -> dict[str, float]:
    """numpy on the same inputs (float64 reference path avoided: numpy in the inputs' own dtypes)."""
    from tgc.engine.numpy_eval import numpy_program
    fn = numpy_program(prog, dims)
    fn(inputs)
    times = []
    for _ in range(max(repeat, 1)):
        st = time.perf_counter()
        fn(inputs)
        times.append(time.perf_counter() - st)
    med = statistics.median(times)
    return {"median_s": med, "min_s": min(times), "ratio": med / tgc_median if tgc_median > 0 else 0.0}


def valid_peak(value: Any) -> bool:
    """A stored peak is usable: {"gflops": >0, "gbps": >0, ...} with finite numbers (else it is measured again)."""
    import math

    return isinstance(value, dict) and all(
        isinstance(value.get(k), (int, float)) and not isinstance(value.get(k), bool) and math.isfinite(value[k])
        and value[k] > 0 for k in ("gflops", "gbps"))


def machine_peak(dev) -> dict[str, float]:
    """Peak FLOP/s and bandwidth of a device, measured once per machine and cached on disk."""
    from tgc import __version__, cache
    info = dev.info() if hasattr(dev, "info") else {}
    if info.get("peak_gflops") and info.get("peak_gbps"):
        return {"gflops": info["peak_gflops"], "gbps": info["peak_gbps"], "source": "device"}
    if dev.kind != "CPU":
        return {"gflops": info.get("peak_gflops", 0.0), "gbps": info.get("peak_gbps", 0.0), "source": "unknown"}
    key = cache.make_key("peak", dev.kind, dev.compiler.cache_key, dev.cores, __version__)
    hit = cache.get_json("peak", key, valid_peak)
    if hit is not None:
        return hit
    peak = measure_cpu_peak(dev)
    cache.put("peak", key, json.dumps(peak).encode(), meta=f"{dev.kind} peak")
    return peak


_FMA_LOOP = """
define void @fma_peak(ptr %out, i32 %core_id) #0 {{
entry:
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %next, %loop ]
{phis}
{fmas}
  %next = add i32 %i, 1
  %done = icmp eq i32 %next, {iters}
  br i1 %done, label %exit, label %loop
exit:
{sum}
  %slot = getelementptr <16 x float>, ptr %out, i32 %core_id
  store <16 x float> %s{last}, ptr %slot, align 4
  ret void
}}
declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
attributes #0 = {{ nounwind "prefer-vector-width"="512" }}
"""


def measure_cpu_peak(dev) -> dict[str, float]:
    """FMA throughput with 12 independent accumulators per thread, and a multi-threaded copy's bandwidth."""
    from tgc.backends.cpu import CPUProgram
    chains, iters = 12, 2_000_000  # ~20 ms a run: long enough that thread start-up does not count
    phis = "\n".join(f"  %a{j} = phi <16 x float> [ splat (float 1.0), %entry ], [ %b{j}, %loop ]"
                     for j in range(chains))
    fmas = "\n".join(f"  %b{j} = call <16 x float> @llvm.fma.v16f32(<16 x float> %a{j}, "
                     f"<16 x float> splat (float 0x3FEFFFFFE0000000), <16 x float> splat (float 0x3F50624DE0000000))"
                     for j in range(chains))
    sums = ["  %s0 = fadd <16 x float> %b0, %b1"] + [f"  %s{j - 1} = fadd <16 x float> %s{j - 2}, %b{j}"
                                                    for j in range(2, chains)]
    src = _FMA_LOOP.format(phis=phis, fmas=fmas, iters=iters, sum="\n".join(sums), last=chains - 2)
    prog = CPUProgram(dev, "fma_peak", dev.compiler.compile(src))
    threads = dev.cores
    out = np.zeros(16 * threads, np.float32)
    best = min(prog(out, global_size=(threads, 1, 1), wait=True) for _ in range(5))
    gflops = threads * iters * chains * 16 * 2 / best / 1e9
    # bandwidth: a 2-way threaded copy of 64 MiB, compiled by tgc
    import tgc
    n = 1 << 24
    copy = tgc.loads("x: f32[N]\nreturn x + 0.0")
    x = np.ones(n, np.float32)
    kernels = copy.compile(device=dev.name, dims={"N": n})
    k = kernels[0]
    a, b = dev.allocator.alloc(4 * n), dev.allocator.alloc(4 * n)
    try:
        dev.allocator.copyin(a, memoryview(x).cast("B"))
        p = k.program()
        t = min(p(b, a, global_size=k.global_size, vals=k.vals, wait=True) for _ in range(5))
    finally:
        dev.allocator.free(a, 4 * n)
        dev.allocator.free(b, 4 * n)
    return {"gflops": gflops, "gbps": 8 * n / t / 1e9, "source": "measured"}


_ = (prod, shape_of)
