"""Every program in kernels/ runs through the Python API and matches numpy.

The numpy side is `numpy_program`, an independent evaluation of the same file with plain numpy
functions (np.matmul, sliding windows for conv/pool, ...), not tgc's own reference.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import tgc
from tgc.engine.bench import random_inputs
from tgc.engine.numpy_eval import numpy_program

KERNELS = sorted(pathlib.Path(__file__).resolve().parent.parent.joinpath("kernels").glob("*.tg"))
# small sizes that satisfy every example's constraints (even spatial sizes for 2x2 pooling, ...)
SIZES = {"N": 4, "D": 8, "K": 6, "M": 5, "B": 2, "H": 8, "W": 8, "C": 3, "O": 4, "T": 6, "F": 7, "R": 6,
         "IN": 12, "HID": 16, "OUT": 5}


def test_there_are_at_least_twelve_examples():
    assert len(KERNELS) >= 12
    for path in KERNELS:
        first = path.read_text().splitlines()[0]
        assert first.startswith("#") and len(first) > 20, f"{path.name} needs a comment line saying what it computes"


@pytest.mark.parametrize("path", KERNELS, ids=[p.name for p in KERNELS])
def test_example_matches_numpy(path):
    prog = tgc.load(path)
    dims = {name: SIZES.get(name, 4) for name in prog.dim_names}
    inputs = random_inputs(prog, dims, seed=7)
    got = prog.run(**inputs)
    want = numpy_program(prog, dims)(inputs)
    assert set(got) == set(want) == set(prog.output_names)
    for name in prog.output_names:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        assert g.shape == w.shape, name
        if g.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w.astype(g.dtype), err_msg=f"{path.name}: {name}")
        else:
            tol = 1e-2 if g.dtype == np.float16 else 1e-4
            scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol * scale,
                                       err_msg=f"{path.name}: {name}")
