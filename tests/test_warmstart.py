"""The warm `tgc run`'s random inputs (issue 21 item 1): drawn together, the large ones on several threads
(`tgc.engine.inputs.random_arrays`), with exactly the values one stream per input gives; and a warm CLI run of a
program with several inputs and dims gives the cold run's outputs without the front end or a compiler.
"""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tgc.dtype import dtypes
from tgc.engine import inputs
from tgc.engine.inputs import DrawError, random_arrays, random_values

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_random_arrays_are_the_streams_of_each_input_whatever_the_threads(monkeypatch):
    big = inputs.PARALLEL_MIN_ELEMENTS
    specs = [(dtypes.f32, [big + 3], 0), (dtypes.f16, [5, 7], 1), (dtypes.bf16, [big], 2), (dtypes.i32, [big, 2], 3),
             (dtypes.u8, [9], 4), (dtypes.bool, [big], 5), (dtypes.f64, [3, 4], 6), (dtypes.f32, [2, big], 7)]
    for cores in (1, 2, 3):  # one thread, and the large arrays dealt to two or three
        monkeypatch.setattr(inputs, "_cores", lambda c=cores: c)
        got = random_arrays(specs, seed=4)
        for (dt, shape, index), a in zip(specs, got):
            assert a.shape == tuple(shape) and a.dtype == dt.np
            np.testing.assert_array_equal(a, random_values(dt, shape, 4, index))
    # the values themselves: numpy's generator on stream (seed, index), floats uniform in [-sqrt(3), sqrt(3))
    # drawn in f32 (tests/test_warmrun.py checks their distribution)
    u = np.random.default_rng([4, 7]).random((2, big), dtype=np.float32)
    want = (u - np.float32(0.5)) * np.float32(2 * math.sqrt(3))
    np.testing.assert_array_equal(got[7], want)
    ints = got[3]
    assert ints.min() >= -8 and ints.max() <= 8 and len(np.unique(ints)) == 17


def test_random_arrays_report_the_first_input_that_cannot_be_drawn(monkeypatch):
    monkeypatch.setattr(inputs, "_cores", lambda: 2)
    huge = [1 << 40, 1 << 40, 1 << 40]  # numpy: "array is too big" (a ValueError), raised before allocating
    specs = [(dtypes.f32, [4], 0), (dtypes.f32, huge, 1), (dtypes.f32, [inputs.PARALLEL_MIN_ELEMENTS], 2),
             (dtypes.i32, huge, 3)]
    with pytest.raises(DrawError) as info:
        random_arrays(specs)
    assert info.value.index == 1 and isinstance(info.value.error, (ValueError, MemoryError))


from clikit import WARM_CLI as WARM  # noqa: E402


def test_a_warm_cli_run_with_several_large_inputs_gives_the_cold_runs_outputs_without_compiling(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TGC_VERIFY_BOUNDS", "DEBUG", "BEAM", "NOOPT")}
    env["TGC_CACHE_DIR"] = str(tmp_path / "cache")
    # x is 512x256 (drawn on a thread of its own where there are two cores), the weights small
    args = ["run", "kernels/mlp.tg", "--random", "--seed", "3", "-D", "B=512", "-D", "IN=256", "-D", "HID=32",
            "-D", "OUT=10"]

    def tgc(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", WARM, *args, *extra], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=300)

    cold = tgc("--check", "-o", str(tmp_path / "cold.npz"))
    assert cold.returncode == 0 and "check: ok" in cold.stderr, cold.stderr
    assert "llvmlite" in cold.stderr.rsplit("HEAVY ", 1)[-1]
    warm = tgc("-o", str(tmp_path / "warm.npz"))
    assert warm.returncode == 0, warm.stderr
    assert warm.stderr.rsplit("HEAVY ", 1)[-1].strip() == "", "the warm run parsed or compiled"
    np.testing.assert_array_equal(np.load(tmp_path / "warm.npz")["logp"], np.load(tmp_path / "cold.npz")["logp"])
    # and the inputs it drew are the documented ones: the numpy reference of the warm outputs, from them
    x = random_values(dtypes.f32, [512, 256], 3, 0)
    w1, b1 = random_values(dtypes.f32, [256, 32], 3, 1), random_values(dtypes.f32, [32], 3, 2)
    w2, b2 = random_values(dtypes.f32, [32, 10], 3, 3), random_values(dtypes.f32, [10], 3, 4)
    h = x.astype(np.float64) @ w1 + b1
    h = 0.5 * h * (1 + np.vectorize(math.erf)(h / np.sqrt(2)))  # gelu, exact (the language's default)
    logits = h @ w2 + b2
    logp = logits - logits.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(np.load(tmp_path / "warm.npz")["logp"], logp, rtol=2e-3, atol=2e-3)
