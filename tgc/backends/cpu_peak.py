"""The CPU's peak FLOP/s and memory bandwidth, measured with hand-written LLVM IR kernels (what `tgc bench`
compares kernels with; `tgc.engine.bench.machine_peak` keeps the result in the disk cache)."""

from __future__ import annotations

import glob
import os
from typing import Any

import numpy as np


def cpu_cache_bytes() -> int | None:
    """This machine's largest CPU cache (the last level, shared by the cores), or None where unknown."""
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
define void @fma_peak(ptr %out, i32 %iters, i32 %core_id) #0 {{
entry:
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %next, %loop ]
{phis}
{fmas}
  %next = add i32 %i, 1
  %done = icmp sge i32 %next, %iters
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



def _phis(chains: int, init: str) -> str:
    """The loop's `chains` independent <16 x float> accumulators %a0.. (from `init`, then %b0..)."""
    return "\n".join(f"  %a{j} = phi <16 x float> [ {init}, %entry ], [ %b{j}, %loop ]" for j in range(chains))


def _sum_chains(chains: int) -> str:
    """%b0 + %b1 + ... as %s0 .. %s{chains-2}, the last of which the templates store."""
    return "\n".join(["  %s0 = fadd <16 x float> %b0, %b1"] +
                     [f"  %s{j - 1} = fadd <16 x float> %s{j - 2}, %b{j}" for j in range(2, chains)])

def measure_read_bandwidth(dev: Any, nbytes: int | None = None) -> float:
    """GB/s of every thread summing its share of a buffer far larger than the caches (`peak_buffer_bytes`), with
    8 independent vector accumulators: memory read bandwidth, counted as the bytes read."""
    if nbytes is None:
        nbytes = peak_buffer_bytes()
    chains, threads = 8, dev.cores
    chunk = (nbytes // 64 // threads) // chains * chains  # 64-byte vectors per thread
    phis = _phis(chains, "zeroinitializer")
    loads = "\n".join(f"  %i{j} = add i32 %at, {j}\n  %p{j} = getelementptr <16 x float>, ptr %x, i32 %i{j}\n"
                      f"  %v{j} = load <16 x float>, ptr %p{j}, align 4\n  %b{j} = fadd <16 x float> %a{j}, %v{j}"
                      for j in range(chains))
    src = _READ_LOOP.format(phis=phis, loads=loads, chains=chains, sum=_sum_chains(chains), last=chains - 2)
    prog = dev.program("read_peak", dev.compiler.compile(src))
    prog.serial_when_busy = False  # (the machine's peak: on every core, whatever the load)
    x = np.ones(chunk * threads * 16, np.float32)
    out = np.zeros(16 * threads, np.float32)
    best = min(prog(out, x, global_size=(threads, 1, 1), vals=(chunk,), wait=True) for _ in range(5))
    if float(out.astype(np.float64).sum()) != x.size:  # every element read once (sums of ones are exact here)
        raise RuntimeError(f"read_peak summed {out.sum()} instead of {x.size}")
    return x.nbytes / best / 1e9


def measure_fma_peak(dev: Any, seconds: float | None = None) -> float:
    """GFLOP/s of every thread running FMAs on 12 independent vector accumulators: the best of 5 runs of a few
    ms. With `seconds`, timed like a workload that takes that long instead: runs of about `seconds` each, the
    median of 5 (`bench/bench.py` compares a kernel's median with this; on a shared machine a run of a few ms
    often escapes the other processes that a longer one meets)."""
    chains, iters = 12, 2_000_000  # a few ms a run: long enough that thread start-up does not count
    phis = _phis(chains, "splat (float 1.0)")
    fmas = "\n".join(f"  %b{j} = call <16 x float> @llvm.fma.v16f32(<16 x float> %a{j}, "
                     f"<16 x float> splat (float 0x3FEFFFFFE0000000), <16 x float> splat (float 0x3F50624DE0000000))"
                     for j in range(chains))
    src = _FMA_LOOP.format(phis=phis, fmas=fmas, sum=_sum_chains(chains), last=chains - 2)
    prog = dev.program("fma_peak", dev.compiler.compile(src))
    prog.serial_when_busy = False  # (the machine's peak: on every core, whatever the load)
    threads = dev.cores
    out = np.zeros(16 * threads, np.float32)

    def run(n: int) -> float:
        return prog(out, global_size=(threads, 1, 1), vals=(n,), wait=True)
    if seconds is None:
        t = min(run(iters) for _ in range(5))
    else:
        iters = max(iters, min(int(iters * seconds / min(run(iters) for _ in range(2))), 2**31 - 1))
        t = float(np.median([run(iters) for _ in range(5)]))
    return threads * iters * chains * 16 * 2 / t / 1e9


def measure_peak(dev: Any) -> dict[str, Any]:
    """FMA throughput (`measure_fma_peak`) and two memory bandwidths: a threaded copy (`copy_gbps`, bytes read
    plus bytes written) and a threaded read (`read_gbps`). `gbps`, what shares of the memory peak are of
    (`tgc bench`, bench/bench.py), is the copy's: a kernel reads its inputs and writes its outputs, as a copy
    does (a read-only kernel, a sum, may then pass 100%)."""
    gflops = measure_fma_peak(dev)
    copy_gbps, read_gbps = measure_copy_bandwidth(dev), measure_read_bandwidth(dev)
    return {"gflops": gflops, "gbps": copy_gbps, "copy_gbps": copy_gbps, "read_gbps": read_gbps,
            "source": "measured"}


_COPY_LOOP = """
define void @copy_peak(ptr %dst, ptr %src, i32 %chunk, i32 %core_id) #0 {{
entry:
  %base = mul i32 %core_id, %chunk
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %next, %loop ]
  %at = add i32 %base, %i
{copies}
  %next = add i32 %i, {chains}
  %done = icmp sge i32 %next, %chunk
  br i1 %done, label %exit, label %loop
exit:
  ret void
}}
attributes #0 = {{ nounwind "prefer-vector-width"="512" }}
"""


def peak_buffer_bytes() -> int:
    """The size of the buffer the bandwidth kernels stream: 8 times the last-level cache, at least 64 MiB, at
    most 1 GiB (far larger than any cache, so every byte comes from memory)."""
    return min(max(64 << 20, 8 * (cpu_cache_bytes() or 0)), 1 << 30)


def copy_bytes_counted(nbytes: int) -> int:
    """The bytes a copy of an `nbytes` buffer counts: each byte read once and written once (what a kernel's
    GB/s counts: an elementwise kernel's loads and stores). The hardware moves more: a plain store first reads
    its destination line in (unless the CPU streams it), so a copy touches about 3 bytes per byte counted 2."""
    return 2 * nbytes


def measure_copy_bandwidth(dev: Any, nbytes: int | None = None) -> float:
    """GB/s of every thread copying its share of a buffer far larger than the caches (`peak_buffer_bytes`) to
    another one, 8 vectors of 16 floats per step with ordinary loads and stores (what tgc's kernels use),
    counted as bytes read plus bytes written (`copy_bytes_counted`); the best of 5 runs. The copy is checked:
    every element must arrive."""
    if nbytes is None:
        nbytes = peak_buffer_bytes()
    chains, threads = 8, dev.cores
    chunk = max((nbytes // 64 // threads) // chains * chains, chains)  # 64-byte vectors per thread
    copies = "\n".join(f"  %i{j} = add i32 %at, {j}\n  %ps{j} = getelementptr <16 x float>, ptr %src, i32 %i{j}\n"
                       f"  %v{j} = load <16 x float>, ptr %ps{j}, align 4\n"
                       f"  %pd{j} = getelementptr <16 x float>, ptr %dst, i32 %i{j}\n"
                       f"  store <16 x float> %v{j}, ptr %pd{j}, align 4" for j in range(chains))
    prog = dev.program("copy_peak", dev.compiler.compile(_COPY_LOOP.format(copies=copies, chains=chains)))
    prog.serial_when_busy = False  # (the machine's peak: on every core, whatever the load)
    x = np.arange(chunk * threads * 16, dtype=np.float32)
    y = np.zeros_like(x)
    best = min(prog(y, x, global_size=(threads, 1, 1), vals=(chunk,), wait=True) for _ in range(5))
    if not np.array_equal(x, y):
        raise RuntimeError("copy_peak did not copy every element")
    return copy_bytes_counted(x.nbytes) / best / 1e9
