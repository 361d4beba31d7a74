"""Every program in kernels/ runs through the Python API and matches numpy.

The numpy side is `numpy_program`, an independent evaluation of the same file with plain numpy
functions (np.matmul, sliding windows for conv/pool, ...), not tgc's own reference.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import tgc
from tgc.baselines.numpy_eval import numpy_program
from tgc.engine.compare import compare
from tgc.engine.inputs import random_inputs

KERNELS = sorted(pathlib.Path(__file__).resolve().parent.parent.joinpath("kernels").glob("*.tg"))
# small sizes that satisfy every example's constraints (even spatial sizes for 2x2 pooling, ...)
SIZES = {"N": 4, "D": 8, "K": 6, "M": 5, "B": 2, "H": 8, "W": 8, "C": 3, "O": 4, "T": 6, "F": 7, "R": 6,
         "IN": 12, "HID": 16, "OUT": 5}
# programs whose dims are tied (4 heads of C // 4); tiny_gpt's random ids (-8..8) wrap into a vocabulary of 16
SIZES_OF = {"transformer_block.tg": {"B": 2, "T": 6, "C": 8}, "tiny_gpt.tg": {"B": 2, "T": 5, "V": 16, "C": 8, "L": 2}}


def test_there_are_at_least_twelve_examples():
    assert len(KERNELS) >= 12
    for path in KERNELS:
        first = path.read_text().splitlines()[0]
        assert first.startswith("#") and len(first) > 20, f"{path.name} needs a comment line saying what it computes"


@pytest.mark.parametrize("path", KERNELS, ids=[p.name for p in KERNELS])
def test_example_matches_numpy(path):
    prog = tgc.load(path)
    dims = {name: SIZES_OF.get(path.name, SIZES).get(name, SIZES.get(name, 4)) for name in prog.dim_names}
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
            bad, _ = compare(name, g, w, "f16" if g.dtype == np.float16 else "f32")  # the engine's one rule
            assert bad is None, f"{path.name}: {bad.describe()}"


def _bench_models():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_models", KERNELS[0].parent.parent / "bench" / "models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("b, t, c", [(2, 8, 16), (1, 5, 12), (3, 17, 8)])
def test_transformer_block_matches_the_numpy_model(b, t, c):
    """The bench's transformer block, against the same block written with numpy (bench/models.py)."""
    models = _bench_models()
    inputs = models.transformer_inputs(b, t, c, seed=b + t)
    got = tgc.load(KERNELS[0].parent / "transformer_block.tg").run(dims=models.transformer_dims(b, t, c), **inputs)
    want = models.transformer_block(np, *(inputs[k].astype(np.float64) for k in ("x", *models.TRANSFORMER_WEIGHTS)))
    bad, _ = compare("out0", got["out0"], want, "f32")
    assert bad is None, bad.describe()


def test_small_kernels_is_twenty_kernels_and_matches_numpy():
    models = _bench_models()
    prog = tgc.load(KERNELS[0].parent / "small_kernels.tg")
    x = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    assert len(prog.compile(device="CPU", dims={"R": 16, "N": 64})) == 20
    np.testing.assert_allclose(prog.run(x=x)["y19"], models.small_kernels(np, x.astype(np.float64)), rtol=1e-4,
                               atol=1e-5)
