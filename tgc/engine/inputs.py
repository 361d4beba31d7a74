"""The one random-input generator: `tgc run --random`, `tgc bench`, the API's bench and BEAM's correctness
check all draw their inputs here, so the same seed gives the same values everywhere.

Floats are uniform in [-sqrt(3), sqrt(3)): mean 0 and variance 1, the scale of the standard normal values drawn
before (branch warmrun), at a fifth of the cost (numpy's normal draw took ~11 ns a value, ~0.05 s of CPU for
the 4.2 M weights of kernels/transformer_block.tg, more than everything but the kernels in a warm run). A value
is `(u - 0.5) * F32_SPREAD` with `u` numpy's `Generator.random` in the float's own precision (f32 for types of 4
bytes or fewer, then rounded to f16 or bf16; bf16 as its bits; f64 for f64): the subtraction is exact and the
product rounded once, so the values are the same bits on every machine. Ints uniform in [-8, 8] ([0, 8]
unsigned), bools 50/50 (both as before). Each input has its own stream, seeded by `(seed, index)` with `index`
its position among the program's inputs (or the kernel's buffers), so giving one input from a file does not
change the values of the others.

`random_arrays` draws several inputs at once: the large ones on several threads (numpy's generators fill an
array without holding the GIL), with exactly the values `random_values` gives each one (its own stream).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tgc.dtype import DType, f32_to_bf16

SPREAD = 2 * math.sqrt(3)  # the width of the floats' interval: uniform on it has variance SPREAD^2 / 12 = 1
F32_SPREAD = np.float32(SPREAD)


def random_values(dtype: DType, shape: Sequence[int], seed: int = 0, index: int = 0) -> np.ndarray:
    """A deterministic random array of `dtype` (bf16 as uint16 bits) and `shape`, from stream `(seed, index)`."""
    rng = np.random.default_rng([seed, index])
    shape = [int(s) for s in shape]
    if dtype.is_bool:
        return rng.random(shape) < 0.5
    if dtype.is_int:
        lo = 0 if dtype.is_unsigned else -8
        return rng.integers(lo, 9, size=shape).astype(dtype.np)
    wide = dtype.itemsize > 4
    values = rng.random(shape, dtype=np.float64 if wide else np.float32)  # [0, 1), in place from here on
    np.subtract(values, 0.5, out=values)  # (exact: u is a multiple of 2^-24, or 2^-53)
    np.multiply(values, SPREAD if wide else F32_SPREAD, out=values)
    if dtype.name == "bf16":
        return f32_to_bf16(values)
    return values.astype(dtype.np, copy=False)  # (f32 and f64 are drawn in their own type: no copy)


# an array of fewer elements is drawn on the calling thread: a thread's start costs more than its draw
PARALLEL_MIN_ELEMENTS = 1 << 16


class DrawError(Exception):
    """`random_arrays` could not draw input `index` (numpy's MemoryError or "array is too big" ValueError)."""

    def __init__(self, index: int, error: BaseException):
        super().__init__(str(error))
        self.index, self.error = index, error


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every OS)
        return os.cpu_count() or 1


def random_arrays(specs: Sequence[tuple[DType, Sequence[int], int]], seed: int = 0) -> list[np.ndarray]:
    """`random_values(dtype, shape, seed, index)` for each `(dtype, shape, index)` of `specs`, in order. Arrays
    of `PARALLEL_MIN_ELEMENTS` or more are drawn on up to one thread per core (the largest first), the rest
    here; the values do not depend on the threads. A failed draw raises `DrawError` (the first by position)."""
    sizes = [_count(shape) for _, shape, _ in specs]
    big = sorted((i for i, n in enumerate(sizes) if n >= PARALLEL_MIN_ELEMENTS), key=lambda i: -sizes[i])
    threads = min(len(big), _cores())
    out: list[Any] = [None] * len(specs)
    errors: dict[int, BaseException] = {}

    def draw(positions: Sequence[int]) -> None:
        for i in positions:
            dtype, shape, index = specs[i]
            try:
                out[i] = random_values(dtype, shape, seed, index)
            except (MemoryError, ValueError) as e:
                errors[i] = e

    if threads < 2:
        draw(range(len(specs)))
    else:  # the large arrays dealt to the threads largest first (each to the least loaded), the rest drawn here
        loads, parts = [0] * threads, [[] for _ in range(threads)]
        for i in big:
            t = loads.index(min(loads))
            parts[t].append(i)
            loads[t] += sizes[i]
        workers = [threading.Thread(target=draw, args=(part,), daemon=True) for part in parts[1:]]
        for w in workers:
            w.start()
        large = set(big)
        draw(parts[0] + [i for i in range(len(specs)) if i not in large])
        for w in workers:
            w.join()
    if errors:
        first = min(errors)
        raise DrawError(first, errors[first])
    return out


def _count(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def random_inputs(prog: Any, dims: Mapping[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """A random array for every input the program declares, its dims resolved from `dims`."""
    from tgc.dsl.frontend import concrete_shape  # (here: a package's run needs no parser)

    try:
        arrays = random_arrays([(decl.dtype, concrete_shape(decl, dims), index)
                                for index, decl in enumerate(prog.inputs)], seed)
    except DrawError as e:
        raise e.error from None
    return {decl.name: a for decl, a in zip(prog.inputs, arrays)}
