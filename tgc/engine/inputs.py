"""The one random-input generator: `tgc run --random`, `tgc bench`, the API's bench and BEAM's correctness
check all draw their inputs here, so the same seed gives the same values everywhere.

Floats are standard normal (drawn in f32 for types of 4 bytes or fewer, then rounded; bf16 as its bits), ints
uniform in [-8, 8] ([0, 8] unsigned), bools 50/50. Each input has its own stream, seeded by `(seed, index)`
with `index` its position among the program's inputs (or the kernel's buffers), so giving one input from a file
does not change the values of the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tgc.dtype import DType, f32_to_bf16


def random_values(dtype: DType, shape: Sequence[int], seed: int = 0, index: int = 0) -> np.ndarray:
    """A deterministic random array of `dtype` (bf16 as uint16 bits) and `shape`, from stream `(seed, index)`."""
    rng = np.random.default_rng([seed, index])
    shape = [int(s) for s in shape]
    if dtype.is_bool:
        return rng.random(shape) < 0.5
    if dtype.is_int:
        lo = 0 if dtype.is_unsigned else -8
        return rng.integers(lo, 9, size=shape).astype(dtype.np)
    values = rng.standard_normal(shape, dtype=np.float32 if dtype.itemsize <= 4 else np.float64)
    if dtype.name == "bf16":
        return f32_to_bf16(values)
    return values.astype(dtype.np)


def random_inputs(prog: Any, dims: Mapping[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """A random array for every input the program declares, its dims resolved from `dims`."""
    from tgc.dsl.frontend import concrete_shape  # (here: a package's run needs no parser)

    return {decl.name: random_values(decl.dtype, concrete_shape(decl, dims), seed, index)
            for index, decl in enumerate(prog.inputs)}
