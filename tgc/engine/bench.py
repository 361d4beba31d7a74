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

from tgc.engine.inputs import random_inputs
from tgc.engine.realize import allocate
from tgc.ir.shapes import prod, shape_of


def _stats(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    q1 = times[len(times) // 4]
    q3 = times[(3 * len(times)) // 4]
    return {"median_s": statistics.median(times), "min_s": times[0], "max_s": times[-1], "iqr_s": q3 - q1}


def bench_program(prog, device: str | None = None, dims: dict[str, int] | None = None, repeat: int = 10,
                  beam: int = 0, inputs: dict[str, np.ndarray] | None = None,
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
    # between two runs of a kernel every other kernel runs: whether its data is still in the cache depends on
    # all the program's buffers, whole (a strided read still brings in whole cache lines)
    working_set = sum(prod(shape_of(b)) * b.dtype.itemsize for b in buffers)
    rows = []
    total_flops = sum(k.flops for k in kernels)
    total_bytes = sum(k.bytes_moved for k in kernels)
    for k, ts in zip(kernels, per_kernel):
        st = _stats(ts)
        row = {"name": k.name, "line": k.line, "global_size": list(k.global_size),
               "local_size": list(k.local_size) if k.local_size else None, "opts": [str(o) for o in k.opts],
               "flops": k.flops, "bytes": k.bytes_moved, **st}
        row.update(rates(k.flops, k.bytes_moved, st["median_s"], peak, working_set))
        rows.append(row)
    prog_stats = _stats(whole)
    program = {**prog_stats, "flops": total_flops, "bytes": total_bytes,
               **rates(total_flops, total_bytes, prog_stats["median_s"], peak, working_set)}
    result: dict[str, Any] = {"device": dev.name, "dims": dims, "repeat": repeat, "beam": beam, "kernels": rows,
                              "program": program, "peak": peak, "working_set_bytes": working_set,
                              "identity": identity(prog, dev, dims)}
    return result


def identity(prog, dev, dims: dict[str, int]) -> dict[str, Any]:
    """What a timing depends on beyond the kernels' code: which program (its source's hash), its dims, the
    device (its kind and model) and the tgc version. `tgc bench --baseline` compares only equal identities."""
    import hashlib

    from tgc import __version__
    source = getattr(prog, "source", None) or ""
    return {"program_sha256": hashlib.sha256(source.encode()).hexdigest(),
            "file": getattr(prog, "path", None) or getattr(prog, "filename", None),
            "dims": dict(sorted((dims or {}).items())), "device": dev.name, "device_model": device_model(dev),
            "tgc_version": __version__}


def device_model(dev) -> str:
    """The device's model: the CPU's name from /proc/cpuinfo and its thread count, a GPU's name, else the kind."""
    if dev.kind == "CPU":
        name = ""
        try:
            with open("/proc/cpuinfo") as f:
                name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        except OSError:
            pass
        if not name:
            import platform
            name = platform.processor() or platform.machine()
        return f"{name} ({dev.cores} threads)"
    try:
        info = dev.info() if hasattr(dev, "info") else {}
    except Exception:  # a device that cannot describe itself still has a kind
        info = {}
    model = info.get("name") or info.get("device") or ""
    if info.get("serves"):
        model = f"{info['serves']} on {info.get('server', '?')}" + (f": {model}" if model else "")
    return str(model or dev.kind)


CACHE_FACTOR = 4  # working sets up to this many times the last-level cache count as (partly) cache-resident


def rates(flops: int, nbytes: int, seconds: float, peak: dict, working_set: int) -> dict[str, Any]:
    """GFLOP/s, GB/s and the share of the peak they reach (None where the peak is unknown).

    A program whose buffers (`working_set` bytes) fit the device's last-level cache (`peak["cache_bytes"]`)
    keeps its data in that cache between the timed runs; up to CACHE_FACTOR times that size, caches that do
    not evict in strict LRU order (AMD's L3) still serve part of it. Either way its GB/s is not a share of
    the memory peak: `in_cache` is set and `mem_share` is None. `peak_share` is the larger of the two
    shares, `bound` says which ("compute", "memory") or None.
    """
    gflops = flops / seconds / 1e9 if seconds > 0 else 0.0
    gbps = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    cache = peak.get("cache_bytes")
    in_cache = bool(cache) and 0 < working_set <= CACHE_FACTOR * cache
    flop_share = gflops / peak["gflops"] if peak.get("gflops") and flops else None
    mem_share = gbps / peak["gbps"] if peak.get("gbps") and nbytes and not in_cache else None
    shares = [(v, what) for v, what in ((flop_share, "compute"), (mem_share, "memory")) if v is not None]
    best = max(shares, key=lambda t: t[0]) if shares else (None, None)
    return {"gflops": gflops, "gbps": gbps, "flop_share": flop_share, "mem_share": mem_share,
            "peak_share": best[0], "bound": best[1], "in_cache": in_cache}


def valid_peak(value: Any) -> bool:
    """A stored peak is usable: {"gflops": >0, "gbps": >0, ...} with finite numbers (else it is measured again)."""
    import math

    return isinstance(value, dict) and all(
        isinstance(value.get(k), (int, float)) and not isinstance(value.get(k), bool) and math.isfinite(value[k])
        and value[k] > 0 for k in ("gflops", "gbps"))


def machine_peak(dev) -> dict[str, Any]:
    """Peak FLOP/s and bandwidth of a device, measured once per machine and cached on disk (CPU), from the
    device's own figures (GPUs), else None each (`source` "unknown": PYTHON, REMOTE). `cache_bytes` is
    the last-level cache where known (see `rates`). A damaged cache entry is measured again."""
    from tgc import cache
    info = dev.info() if hasattr(dev, "info") else {}
    if dev.kind != "CPU":
        gflops, gbps = info.get("peak_gflops") or None, info.get("peak_gbps") or None
        return {"gflops": gflops, "gbps": gbps, "source": "device" if gflops or gbps else "unknown",
                "cache_bytes": info.get("cache_bytes") or None}
    key = peak_key(dev)
    peak = cache.get_json("peak", key, valid_peak)
    if peak is None:
        peak = measure_cpu_peak(dev)
        cache.put("peak", key, json.dumps(peak).encode(), meta=f"{dev.kind} peak")
    return {**peak, "cache_bytes": cpu_cache_bytes()}


def peak_key(dev) -> str:
    """The cache key of a CPU device's measured peak (2: the version that measures read_gbps too)."""
    from tgc import __version__, cache
    return cache.make_key("peak", 2, dev.kind, dev.compiler.cache_key, dev.cores, __version__)


def cpu_cache_bytes() -> int | None:
    """This machine's largest CPU cache (the last level, shared by the cores), or None where unknown."""
    import glob
    import os
    best = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text[:-1] if scale > 1 else text
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    if not best:
        try:
            best = max(int(os.sysconf(n)) for n in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"))
        except (ValueError, OSError, AttributeError):
            best = 0
    return best or None


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


_READ_LOOP = """
define void @read_peak(ptr %out, ptr %x, i32 %chunk, i32 %core_id) #0 {{
entry:
  %base = mul i32 %core_id, %chunk
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %next, %loop ]
{phis}
  %at = add i32 %base, %i
{loads}
  %next = add i32 %i, {chains}
  %done = icmp sge i32 %next, %chunk
  br i1 %done, label %exit, label %loop
exit:
{sum}
  %slot = getelementptr <16 x float>, ptr %out, i32 %core_id
  store <16 x float> %s{last}, ptr %slot, align 4
  ret void
}}
attributes #0 = {{ nounwind "prefer-vector-width"="512" }}
"""


def measure_read_bandwidth(dev, nbytes: int | None = None) -> float:
    """GB/s of every thread summing its share of a buffer far larger than the caches (8 times the last level,
    at least 64 MiB, at most 1 GiB), with 8 independent vector accumulators: memory read bandwidth (a copy
    also pays for reading each destination line in)."""
    from tgc.backends.cpu import CPUProgram
    if nbytes is None:
        nbytes = min(max(64 << 20, 8 * (cpu_cache_bytes() or 0)), 1 << 30)
    chains, threads = 8, dev.cores
    chunk = (nbytes // 64 // threads) // chains * chains  # 64-byte vectors per thread
    phis = "\n".join(f"  %a{j} = phi <16 x float> [ zeroinitializer, %entry ], [ %b{j}, %loop ]"
                     for j in range(chains))
    loads = "\n".join(f"  %i{j} = add i32 %at, {j}\n  %p{j} = getelementptr <16 x float>, ptr %x, i32 %i{j}\n"
                      f"  %v{j} = load <16 x float>, ptr %p{j}, align 4\n  %b{j} = fadd <16 x float> %a{j}, %v{j}"
                      for j in range(chains))
    sums = ["  %s0 = fadd <16 x float> %b0, %b1"] + [f"  %s{j - 1} = fadd <16 x float> %s{j - 2}, %b{j}"
                                                    for j in range(2, chains)]
    src = _READ_LOOP.format(phis=phis, loads=loads, chains=chains, sum="\n".join(sums), last=chains - 2)
    prog = CPUProgram(dev, "read_peak", dev.compiler.compile(src))
    x = np.ones(chunk * threads * 16, np.float32)
    out = np.zeros(16 * threads, np.float32)
    best = min(prog(out, x, global_size=(threads, 1, 1), vals=(chunk,), wait=True) for _ in range(5))
    if float(out.astype(np.float64).sum()) != x.size:  # every element read once (sums of ones are exact here)
        raise RuntimeError(f"read_peak summed {out.sum()} instead of {x.size}")
    return x.nbytes / best / 1e9


def measure_cpu_peak(dev) -> dict[str, float]:
    """FMA throughput with 12 independent accumulators per thread; the memory bandwidth is the better of a
    multi-threaded copy (counted as 8 bytes an element) and a multi-threaded read."""
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
    kernels = copy.compile(device=dev.name, dims={"N": n}, beam=0, tuned=False)  # (BEAM does not apply here)
    k = kernels[0]
    a, b = dev.allocator.alloc(4 * n), dev.allocator.alloc(4 * n)
    try:
        dev.allocator.copyin(a, memoryview(x).cast("B"))
        p = k.program()
        t = min(p(b, a, global_size=k.global_size, vals=k.vals, wait=True) for _ in range(5))
    finally:
        dev.allocator.free(a, 4 * n)
        dev.allocator.free(b, 4 * n)
    copy_gbps, read_gbps = 8 * n / t / 1e9, measure_read_bandwidth(dev)
    return {"gflops": gflops, "gbps": max(copy_gbps, read_gbps), "copy_gbps": copy_gbps, "read_gbps": read_gbps,
            "source": "measured"}

