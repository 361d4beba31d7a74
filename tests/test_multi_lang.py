"""The language suite sharded: its programs run on device lists (two CPU devices, three CPU devices with
uneven shards, two PYTHON devices) with every input that has an axis at least as long as the device count
split along one such axis (the axis varies with the input's name and position), compared with numpy as in
the suite itself.

The suite's test functions are imported here, so pytest collects them again with this module's `device`
fixture; an autouse fixture gives every `Program.run` on a device list its `shard` map. Modules run:
programs, nn, shapes, ops, functions (the whole of each). Not run sharded: types (dtype promotion and casts
of single values and scalars, nothing to shard), errors (load-time errors, no device), properties
(random programs under hypothesis; slow)."""

from __future__ import annotations

import os

import pytest
from test_lang_functions import *  # noqa: F403  (collected again, sharded)
from test_lang_nn import *  # noqa: F403
from test_lang_ops import *  # noqa: F403
from test_lang_programs import *  # noqa: F403
from test_lang_shapes import *  # noqa: F403

import tgc.api

del test_kernel_counts  # noqa: F821 (how many kernels one device runs: a sharded program runs more)

# TGC_TEST_DEVICE_LISTS ("CUDA:0,CUDA:1;CUDA:0,CPU:1": lists separated by ';') replaces these, e.g. for a GPU
# (tools/gpu_check.py)
LISTS = [d.strip() for d in os.environ.get("TGC_TEST_DEVICE_LISTS", "").split(";") if d.strip()] or \
    ["CPU:0,CPU:1", "CPU:0,CPU:1,CPU:2", "PYTHON:0,PYTHON:1"]


@pytest.fixture(params=LISTS)
def device(request: pytest.FixtureRequest) -> str:  # noqa: F811 (this module's device: a list)
    return request.param


@pytest.fixture
def known_bug(request: pytest.FixtureRequest, device: str):  # noqa: F811
    from tgc.backends import canonical

    def mark(devices: set[str], reason: str) -> None:
        if canonical(device.split(",")[0])[0] in devices:
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    return mark


def auto_shard(prog: tgc.api.Program, n: int, inputs: dict, dims: dict | None, cast: bool) -> dict[str, int]:
    """Every input with an axis of at least `n` rows, split along one such axis (varied)."""
    try:
        _, arrays = prog.bind(inputs, dims, cast=cast)
    except tgc.TgcError:
        return {}  # the run reports the binding error itself
    shard = {}
    for i, (name, arr) in enumerate(sorted(arrays.items())):
        axes = [a for a, size in enumerate(arr.shape) if size >= n]
        if axes:
            shard[name] = axes[(len(name) + i) % len(axes)]
    return shard


@pytest.fixture(autouse=True)
def sharded_runs(monkeypatch: pytest.MonkeyPatch):
    plain = tgc.api.Program.run

    def run(self, device=None, dims=None, cast=False, inputs=None, shard=None, **kw):
        if device is not None and "," in str(device) and shard is None:
            shard = auto_shard(self, len(str(device).split(",")), {**(inputs or {}), **kw}, dims, cast)
        return plain(self, device=device, dims=dims, cast=cast, inputs=inputs, shard=shard, **kw)

    monkeypatch.setattr(tgc.api.Program, "run", run)
