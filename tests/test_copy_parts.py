"""A packed weight copy made in column parts where the whole copy would take a program over its memory target
(issue 20 item 5, branch memory: `tgc.engine.schedule.split_large_copies`). Kernel structure and memory plans
are compared with exact expectations, values with numpy; the memory target is monkeypatched (no test depends
on the corpus's sizes or on the host's caches: every matmul here packs whatever the cache, by its 256 rows)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tgc
from tgc.engine import schedule
from tgc.engine.inputs import random_inputs

MIB = 1 << 20
MATMUL = "x: f32[M, K]\nw: f32[K, N]\nreturn x @ w\n"
DIMS = {"M": 256, "K": 512, "N": 512}  # x 0.5 MiB, w 1 MiB (its packed copy too), out 0.5 MiB: io 2 MiB


@pytest.fixture
def low_target(monkeypatch, tmp_path):
    """A memory target of 1.25x inputs + outputs (0.5 MiB of room beside the 2 MiB of MATMUL's io), nothing
    from or into the shared program cache."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(schedule, "MEMORY_LIMIT", 1.25)


def _names(src: str, dims: dict[str, int], device: str = "CPU") -> list[str]:
    return [i.name for i in tgc.loads(src).schedule(dims, device=device) if i.ast.src]


def test_a_copy_within_the_target_stays_whole():
    """At the default target (1.5x: 1 MiB of room) the 1 MiB copy fits: one copy, one matmul."""
    assert _names(MATMUL, DIMS) == ["E_16_512_32", "r_256_512_512"]


def test_a_copy_over_the_target_is_made_in_parts(low_target):
    """With 0.5 MiB of room the copy is made as two copies of 256 columns, each read by the matmul over its
    columns (stored straight into the output), the two copies in one slot of the memory plan."""
    assert _names(MATMUL, DIMS) == ["E_8_512_32", "r_256_256_512", "E_8_512_32", "r_256_256_512"]
    plan = tgc.loads(MATMUL).lower("CPU", dims=DIMS).memory_plan()
    assert plan.peak_bytes == 2 * MIB + MIB // 2  # io and one half-size copy (the whole copy: 3 MiB)


def test_parts_match_numpy(low_target, device):
    prog = tgc.loads(MATMUL)
    inputs = random_inputs(prog, DIMS, seed=1)
    want = inputs["x"].astype(np.float64) @ inputs["w"]
    got = prog.run(device=device, **inputs)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


MLP = "x: f32[M, C]\nw1: f32[C, F]\nb1: f32[F]\nw2: f32[F, C]\nreturn gelu(x @ w1 + b1) @ w2\n"
MLP_DIMS = {"M": 256, "C": 288, "F": 1000}  # odd hidden size: 992 columns + the last 16 (issue 20 item 2)
# io 2.76 MiB: at the default target (1.5x) 0.41 MiB of room beside the first matmul's 0.97 MiB output, for a
# 1.09 MiB copy: three parts of whole panels (11, 11 and 9 of the 31)


def test_an_odd_split_part_is_split_again_and_placed(tmp_path, monkeypatch):
    """The first matmul's main part (992 columns) is made in parts; every part, and the last 16 columns, is
    stored straight into the hidden layer (no kernel joins them but the one copying the 8 columns of the rest
    that the main part does not cover)."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    names = _names(MLP, MLP_DIMS)
    first = [n for n in names if n.startswith("r_256_") and n.endswith("_288")]
    assert first == ["r_256_352_288", "r_256_352_288", "r_256_288_288", "r_256_16_288"]
    assert [n for n in names if n.startswith("E_256_")] == ["E_256_8"]


def test_an_mlp_in_parts_matches_numpy(tmp_path, monkeypatch):
    """On the CPU (the device that packs copies: where the parts are)."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    prog = tgc.loads(MLP)
    inputs = random_inputs(prog, MLP_DIMS, seed=2)
    x, w1, w2 = (inputs[k].astype(np.float64) for k in ("x", "w1", "w2"))
    h = x @ w1 + inputs["b1"]
    h = 0.5 * h * (1 + np.vectorize(math.erf)(h / np.sqrt(2)))
    want = h @ w2
    got = prog.run(**inputs)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


def test_copy_parts_is_arithmetic_and_bounded():
    """The count of parts comes from sizes alone, at any size (no search over sizes): 1 where there is no
    room at all or the parts would be narrower than COPY_PART_MIN_COLUMNS."""
    prog = tgc.loads(MATMUL)
    outs, _ = prog._trace(prog.resolve_dims(DIMS))
    r = next(u for u in outs[0].toposort() if u.op is schedule.Ops.REDUCE_AXIS)
    assert schedule.copy_parts(r, MIB, 2 * MIB, True) == 1  # 1 MiB of room at 1.5x
    assert schedule.copy_parts(r, 2 * MIB, 2 * MIB, True) == 2
    assert schedule.copy_parts(r, MIB, 2 * MIB // 5, True) == 1  # 0.2 MiB of room: parts narrower than 128
    assert schedule.copy_parts(r, 2 ** 62, 2 * MIB, True) == 1  # (not a copy of 2^62 bytes in 1 MiB pieces)
    assert schedule.copy_parts(r, MIB, MIB, False) == 1  # no room at all beside io and the 0.5 MiB output
    assert schedule.copy_parts(r, MIB, MIB, True) == 2
