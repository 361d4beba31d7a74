"""Many devices: the ring all-reduce alone, placement rules, device lists, --shard errors, CPU core shares,
tgc run / bench / compile on device lists. (The language suite sharded is tests/test_multi_lang.py.)"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from clikit import assert_clean, invoke

import tgc
from tgc.backends import get_device
from tgc.backends.base import Allocator
from tgc.dsl.frontend import trace
from tgc.dtype import dtypes
from tgc.engine.multi import Transfers, even_bounds, gather_shards, plan, ring_allreduce
from tgc.interfaces import RuntimeFeatures

OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def cpu_list(n: int) -> list:
    return [get_device(f"CPU:{i}").shared(i, n) for i in range(n)]


# --- the ring all-reduce alone


@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("size", [1, 7, 1001])
def test_ring_allreduce(n, op, size):
    rng = np.random.default_rng(n * 100 + size)
    devs = cpu_list(n)
    values = [rng.uniform(0.5, 1.5, size).astype(np.float32) for _ in range(n)]
    handles = []
    for dev, v in zip(devs, values):
        h = dev.allocator.alloc(v.nbytes)
        dev.allocator.copyin(h, memoryview(v).cast("B"))
        handles.append(h)
    stats = ring_allreduce(devs, handles, values[0].nbytes, dtypes.f32, op)
    want = values[0].astype(np.float64)
    for v in values[1:]:
        want = OPS[op](want, v)
    for dev, h in zip(devs, handles):
        got = np.empty(size, np.float32)
        dev.allocator.copyout(memoryview(got).cast("B"), h)
        np.testing.assert_allclose(got, want, rtol=1e-5)
    # each device sends and receives 2(n-1) of the n chunks: 2(n-1)/n of the tensor, to within a chunk's
    # rounding (chunks differ by at most one element); all devices together exactly 2(n-1) tensors
    nbytes = values[0].nbytes
    assert sum(stats.sent) == sum(stats.received) == 2 * (n - 1) * nbytes
    for d in range(n):
        for moved in (stats.sent[d], stats.received[d]):
            assert abs(moved - 2 * (n - 1) * nbytes / n) <= 2 * 4, (d, moved)


@pytest.mark.parametrize("n", [2, 4])
def test_ring_allreduce_divisible_sizes_move_exactly_2_n_minus_1_over_n(n):
    devs = cpu_list(n)
    size = 12 * n
    handles = [dev.allocator.alloc(size * 4) for dev in devs]
    for dev, h in zip(devs, handles):
        dev.allocator.copyin(h, memoryview(np.ones(size, np.int32)).cast("B"))
    stats = ring_allreduce(devs, handles, size * 4, dtypes.i32, "sum")
    assert stats.sent == stats.received == [2 * (n - 1) * size * 4 // n] * n
    got = np.empty(size, np.int32)
    devs[-1].allocator.copyout(memoryview(got).cast("B"), handles[-1])
    assert (got == n).all()


@pytest.mark.parametrize("dt, op", [("i32", "max"), ("bool", "sum"), ("i64", "prod"), ("bf16", "sum")])
def test_ring_allreduce_dtypes(dt, op):
    devs = cpu_list(3)
    dtype = getattr(dtypes, dt)
    rng = np.random.default_rng(1)
    if dt == "bf16":
        from tgc.dtype import bf16_to_f32, f32_to_bf16
        values = [f32_to_bf16(rng.integers(-4, 5, 5).astype(np.float32)) for _ in devs]
        want = sum(bf16_to_f32(v) for v in values)
    elif dt == "bool":
        values = [rng.random(5) < 0.3 for _ in devs]
        want = np.logical_or.reduce(values)
    else:
        values = [rng.integers(-3, 4, 5).astype(dtype.np) for _ in devs]
        want = OPS[op].reduce(values)
    handles = []
    for dev, v in zip(devs, values):
        h = dev.allocator.alloc(v.nbytes)
        dev.allocator.copyin(h, memoryview(np.ascontiguousarray(v)).cast("B"))
        handles.append(h)
    ring_allreduce(devs, handles, values[0].nbytes, dtype, op)
    got = np.empty_like(values[0])
    devs[1].allocator.copyout(memoryview(got).cast("B"), handles[1])
    if dt == "bf16":
        got = bf16_to_f32(got)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_shards_counts_each_shard_to_every_other_device(axis):
    devs = cpu_list(3)
    x = np.arange(7 * 5, dtype=np.float32).reshape(7, 5)
    bounds = even_bounds(x.shape[axis], 3)
    shards, outs = [], []
    for dev, (s, e) in zip(devs, bounds):
        part = np.ascontiguousarray(x[(slice(None),) * axis + (slice(s, e),)])
        h = dev.allocator.alloc(part.nbytes)
        dev.allocator.copyin(h, memoryview(part).cast("B"))
        shards.append(h)
        outs.append(dev.allocator.alloc(x.nbytes))
    stats = gather_shards(devs, shards, outs, x.shape, dtypes.f32, axis, bounds, Transfers.for_devices(3))
    for dev, h in zip(devs, outs):
        got = np.empty_like(x)
        dev.allocator.copyout(memoryview(got).cast("B"), h)
        np.testing.assert_array_equal(got, x)
    row = x.nbytes // x.shape[axis]
    assert stats.sent == [2 * (e - s) * row for s, e in bounds]
    assert sum(stats.received) == sum(stats.sent)


def test_even_bounds_differ_by_at_most_one_row():
    assert even_bounds(10, 3) == ((0, 4), (4, 7), (7, 10))
    assert even_bounds(4, 4) == ((0, 1), (1, 2), (2, 3), (3, 4))


# --- placement


def placed(src: str, dims: dict, shard: dict, n: int = 2):
    prog = tgc.loads(src)
    outs, bufs = trace(prog.parsed, dims, {})
    index = {d.name: i for i, d in enumerate(prog.inputs)}
    return plan(outs, bufs, {index[k]: v for k, v in shard.items()}, n)


def test_elementwise_stays_sharded_and_replicated_operand_is_used_as_is():
    p = placed("x: f32[N, D]\nb: f32[N, D]\nreturn exp(x) + b", {"N": 5, "D": 3}, {"x": 0})
    assert not p.steps and p.outputs[0].axis == 0 and p.outputs[0].bounds == ((0, 3), (3, 5))


def test_permute_moves_the_axis_and_reshape_keeps_it():
    assert placed("x: f32[N, D]\nreturn x.T", {"N": 4, "D": 3}, {"x": 0}).outputs[0].axis == 1
    p = placed("x: f32[4, 3]\nreturn x.reshape(1, 4, 3)", {}, {"x": 0})
    assert (p.outputs[0].axis, p.steps) == (1, [])


def test_reshape_that_splits_the_axis_gathers_and_says_so():
    p = placed("x: f32[4, 3]\nreturn x.reshape(3, 4)", {}, {"x": 0})
    assert [s.kind for s in p.steps] == ["gather"] and p.outputs[0].axis is None
    assert "reshape" in p.notes[0]


def test_reduction_over_other_axes_stays_sharded_over_the_axis_all_reduces():
    p = placed("x: f32[N, D]\nreturn sum(x, axis=1)", {"N": 4, "D": 3}, {"x": 0})
    assert (p.outputs[0].axis, p.steps) == (0, [])
    p = placed("x: f32[N, D]\nreturn x.max(axis=0)", {"N": 4, "D": 3}, {"x": 0})
    assert [s.kind for s in p.steps] == ["allreduce"] and p.outputs[0].axis is None


def test_matmul_rows_stay_sharded_and_a_sharded_contraction_all_reduces():
    src = "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b"
    p = placed(src, {"M": 6, "K": 4, "N": 5}, {"a": 0})
    assert (p.outputs[0].axis, p.steps) == (0, [])
    p = placed(src, {"M": 6, "K": 4, "N": 5}, {"a": 1, "b": 0})
    assert [s.kind for s in p.steps] == ["allreduce"] and p.outputs[0].axis is None


@pytest.mark.parametrize("device", ["CPU:0,CPU:1", "CPU:0,CPU:1,CPU:2", "PYTHON:0,PYTHON:1", "CPU:0,PYTHON:1"])
@pytest.mark.parametrize("shard", [{"a": 0}, {"a": 1, "b": 0}, {"b": 1}, {}])
def test_matmul_sharded_matches_numpy(device, shard):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((7, 5)).astype(np.float32)
    b = rng.standard_normal((5, 4)).astype(np.float32)
    out = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b, sum(a @ b)").run(device=device, shard=shard, a=a, b=b)
    np.testing.assert_allclose(out["out0"], a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["out1"], (a.astype(np.float64) @ b).sum(), rtol=1e-4, atol=1e-4)


def test_device_list_as_a_python_list_and_from_tgc_device(monkeypatch):
    prog = tgc.loads("x: i32[N]\nreturn x * 2, sum(x)")
    x = np.arange(9, dtype=np.int32)
    out = prog.run(device=["CPU:0", "CPU:1"], shard={"x": 0}, x=x)
    assert (out["out0"] == x * 2).all() and out["out1"] == x.sum()
    monkeypatch.setenv("TGC_DEVICE", "CPU:0,CPU:1,CPU:2")
    out = prog.run(shard={"x": -1}, x=x)
    assert (out["out0"] == x * 2).all() and out["out1"] == x.sum()


def test_cpu_devices_in_a_list_split_the_cores(monkeypatch):
    monkeypatch.setenv("TGC_THREADS", "5")
    shares = [d.cores for d in cpu_list(2)]
    assert shares == [3, 2]
    assert [d.cores for d in cpu_list(3)] == [2, 2, 1]
    assert [d.cores for d in cpu_list(8)] == [1] * 8  # never fewer than one
    assert get_device("CPU").cores == 5  # alone, a CPU device keeps every core
    a, b = cpu_list(2)
    assert a is not b and a.pool(1) is not b.pool(1)  # each its own thread pool


# --- errors

SOFTMAX = "kernels/softmax.tg"


@pytest.mark.parametrize("args, words", [
    (["--shard", "x=2"], ["axis 2", "2 axes"]),
    (["--shard", "xx=0"], ["'xx'", "did you mean 'x'"]),
    (["--shard", "x=0", "-D", "N=1"], ["only 1 row", "2 devices"]),
    (["--shard", "x"], ["NAME=AXIS"]),
])
def test_shard_errors(args, words):
    dims = ["-D", "D=3"] + ([] if "N=1" in args else ["-D", "N=4"])
    assert_clean(invoke("run", SOFTMAX, "--random", *dims, "-d", "CPU:0,CPU:1", *args), 2, *words)


def test_api_shard_that_is_not_a_dict_is_a_user_error():
    import tgc
    prog = tgc.load(SOFTMAX)
    x = np.ones((4, 3), np.float32)
    with pytest.raises(tgc.TgcError, match="shard must be a dict of input name to axis") as e:
        prog.run(device="CPU:0,CPU:1", shard=[("x", 0)], x=x)  # was an AttributeError
    assert e.value.exit_code == 2


@pytest.mark.parametrize("device, words", [
    ("CPU:0,CPU:999", ["CPU:999"]),
    ("CPU:0,CPU:0", ["twice"]),
    ("CPU:0,,CPU:1", ["device list"]),
    ("CPU:0,NOPE", ["NOPE"]),
])
def test_bad_device_lists(device, words):
    assert_clean(invoke("run", SOFTMAX, "--random", "-D", "N=4", "-D", "D=3", "-d", device), 2, *words)


def test_a_remote_device_in_a_list_without_tgc_remote_is_a_user_error(monkeypatch):
    monkeypatch.delenv("TGC_REMOTE", raising=False)
    from tgc import backends
    from tgc.backends.remote.client import RemoteDevice
    monkeypatch.setattr(RemoteDevice, "_configured", None)  # (no --remote of an earlier test)
    for key in [k for k in backends._instances if k[0] == "REMOTE"]:
        backends._instances.pop(key)
    # was exit 1 ("the REMOTE device needs a server"), unlike any other unavailable device of a list
    assert_clean(invoke("run", SOFTMAX, "--random", "-D", "N=4", "-D", "D=3", "-d", "CPU:0,REMOTE:0",
                        "--shard", "x=0"), 2, "REMOTE:0", "not available", "TGC_REMOTE is not set")


def test_unavailable_device_in_a_list(monkeypatch):
    from tgc.backends.python import PythonDevice
    monkeypatch.setattr(PythonDevice, "probe", classmethod(lambda cls: (False, "switched off for the test")))
    assert_clean(invoke("run", SOFTMAX, "--random", "-D", "N=4", "-D", "D=3", "-d", "CPU:0,PYTHON:1"), 2,
                 "PYTHON:1", "not available", "switched off")


# --- the commands


def test_cli_run_sharded_checks_against_the_reference_and_debug_names_devices_and_bytes():
    r = invoke("run", SOFTMAX, "--random", "-D", "N=5", "-D", "D=7", "-d", "CPU:0,CPU:1,CPU:2", "--shard", "x=1",
               "--check", env={"DEBUG": "2"})
    assert r.exit_code == 0, r.stderr
    assert "check: ok" in r.stderr
    for dev in ("CPU:0", "CPU:1", "CPU:2"):
        assert re.search(rf"\*\*\* {dev}\s+\S+\s+launch", r.stderr), r.stderr
    m = re.search(r"all-reduce \(max\) f32\[5, 1\]: CPU:0 sent (\d+) B, CPU:1 sent (\d+) B, CPU:2 sent (\d+) B",
                  r.stderr)
    assert m, r.stderr
    assert sorted(map(int, m.groups())) == [24, 28, 28]  # 2(n-1) of 3 chunks of 2, 2, 1 floats: 80 B in all


def test_cli_debug_says_when_it_gathers():
    r = invoke("run", "kernels/slicing.tg", "--random", "-D", "N=9", "-D", "R=4", "-D", "C=6", "-d", "CPU:0,CPU:1",
               "--shard", "x=0", "--shard", "m=0", "--check", env={"DEBUG": "2"})
    assert r.exit_code == 0, r.stderr
    assert "check: ok" in r.stderr
    assert "*** multi: gather" in r.stderr and "*** gather axis 0" in r.stderr


def test_cli_bench_json_on_a_device_list():
    r = invoke("bench", SOFTMAX, "-D", "N=64", "-D", "D=32", "-d", "CPU:0,CPU:1", "--shard", "x=1", "--repeat", "2",
               "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["devices"] == ["CPU:0", "CPU:1"] and doc["shard"] == {"x": 1}
    assert [k["device"] for k in doc["kernels"][:2]] == ["CPU:0", "CPU:1"]
    coll = doc["collectives"]
    assert coll["steps"] == ["allreduce", "allreduce"]
    assert coll["sent_bytes"] == [2 * 64 * 4 // 2 * 2] * 2  # two all-reduces of f32[64, 1], n = 2
    assert coll["median_s"] > 0 and doc["program"]["median_s"] > 0


def test_cli_compile_lists_each_distinct_kernel_once():
    r = invoke("compile", SOFTMAX, "-D", "N=8", "-D", "D=4", "-d", "CPU:0,CPU:1", "--shard", "x=0")
    assert r.exit_code == 0, r.stderr
    assert "CPU:0 runs 1 kernel" in r.stderr and "CPU:1 runs 1 kernel" in r.stderr
    assert r.stdout.count("define void") == 1  # both devices run the same (4, 4) softmax kernel
    prog = tgc.load(SOFTMAX)
    kernels = prog.device_kernels("CPU:0,CPU:1,CPU:2", {"N": 8, "D": 4}, {"x": 0})
    assert [d for d, _ in kernels] == ["CPU:0", "CPU:1", "CPU:2"]
    assert len(prog.compile(device="CPU:0,CPU:1,CPU:2", dims={"N": 8, "D": 4}, shard={"x": 0})) == 2  # 3, 3, 2 rows


def test_tgc_devices_says_how_cpu_devices_split_the_cores(monkeypatch):
    monkeypatch.setenv("TGC_THREADS", "3")
    r = invoke("devices", env={"TGC_THREADS": "3"})
    assert r.exit_code == 0, r.stderr
    assert "split the 3 cores between them" in r.stdout and "(CPU:0,CPU:1: 2 + 1)" in r.stdout


def test_a_replicated_broadcast_is_expanded_to_the_shard_not_sliced():
    """The matmul's replicated right-hand side stays a plain broadcast on each device (so the scheduler still
    sees a matmul and packs it), not a slice of the whole broadcast."""
    from tgc.ir.uop import Ops
    p = placed("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b", {"M": 6, "K": 4, "N": 5}, {"a": 0})
    for local in p.outputs[0].locals:
        assert not any(u.op is Ops.SHRINK for u in local.toposort())


class _WholeCopies(Allocator):
    """An allocator with only whole-buffer copies (as CUDA's, OpenCL's): collectives stage whole buffers."""

    def __init__(self, inner):
        self.inner = inner

    def alloc(self, nbytes):
        return self.inner.alloc(nbytes)

    def copyin(self, handle, src):
        self.inner.copyin(handle, src)

    def copyout(self, dest, handle):
        self.inner.copyout(dest, handle)


class _Dev:
    runtime = RuntimeFeatures()  # (no direct or batched copies)

    def __init__(self, i):
        self.name, self.allocator = f"FAKE:{i}", _WholeCopies(get_device("CPU").allocator)


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_without_ranged_copies(n):
    devs = [_Dev(i) for i in range(n)]
    values = [np.arange(7, dtype=np.float32) * (d + 1) for d in range(n)]
    handles = []
    for dev, v in zip(devs, values):
        h = dev.allocator.alloc(v.nbytes)
        dev.allocator.copyin(h, memoryview(v).cast("B"))
        handles.append(h)
    stats = ring_allreduce(devs, handles, 28, dtypes.f32, "sum")
    assert sum(stats.sent) == 2 * (n - 1) * 28
    for dev, h in zip(devs, handles):
        got = np.empty(7, np.float32)
        dev.allocator.copyout(memoryview(got).cast("B"), h)
        np.testing.assert_array_equal(got, sum(values))
    x = np.arange(12, dtype=np.int32).reshape(4, 3)
    bounds = even_bounds(4, n)
    shards, outs = [], []
    for dev, (s, e) in zip(devs, bounds):
        part = np.ascontiguousarray(x[s:e])
        h = dev.allocator.alloc(part.nbytes)
        dev.allocator.copyin(h, memoryview(part).cast("B"))
        shards.append(h)
        outs.append(dev.allocator.alloc(x.nbytes))
    gather_shards(devs, shards, outs, x.shape, dtypes.i32, 0, bounds)
    for dev, h in zip(devs, outs):
        got = np.empty_like(x)
        dev.allocator.copyout(memoryview(got).cast("B"), h)
        np.testing.assert_array_equal(got, x)


def test_shard_without_a_device_list_is_a_usage_error():
    r = invoke("run", SOFTMAX, "--random", "-D", "N=4", "-D", "D=3", "--shard", "x=0")
    assert r.exit_code == 2 and "--shard needs a device list" in r.stderr, r.stderr


def test_schedule_of_a_device_list_names_one_device():
    r = invoke("compile", SOFTMAX, "-D", "N=4", "-D", "D=3", "--emit", "schedule", env={"TGC_DEVICE": "CPU:0,CPU:1"})
    assert r.exit_code == 0, r.stderr  # the schedule does not depend on the device
    with pytest.raises(tgc.TgcError, match="device list"):
        tgc.load(SOFTMAX).lower("CPU:0,CPU:1", {"N": 4, "D": 3})


class _BatchDev(_Dev):
    """A device class that does a whole step's copies in one call (as REMOTE servers would, one round trip)."""

    runtime = RuntimeFeatures(batched_copies=True, batched_reduces=True)

    calls: list[int] = []
    reduces: list[int] = []

    @classmethod
    def reduce_batch(cls, devices, handles, moves, op, dtype) -> bool:
        cls.reduces.append(len(moves))
        from tgc.engine.multi import _combine
        datas = []
        for m in moves:
            whole = np.empty(m.src_size, np.uint8)
            devices[m.src].allocator.copyout(memoryview(whole), handles[m.src])
            datas.append(whole[m.src_offset:m.src_offset + m.nbytes].copy())
        for m, data in zip(moves, datas):
            out = np.empty(m.dst_size, np.uint8)
            devices[m.dst].allocator.copyout(memoryview(out), handles[m.dst])
            out[m.dst_offset:m.dst_offset + m.nbytes] = _combine(op, dtype, out[m.dst_offset:m.dst_offset + m.nbytes],
                                                                 data)
            devices[m.dst].allocator.copyin(handles[m.dst], memoryview(out))
        return True

    @classmethod
    def copy_batch(cls, devices, src_handles, dst_handles, moves) -> bool:
        cls.calls.append(len(moves))
        for m in moves:
            src, dst = src_handles[m.src], dst_handles[m.dst]
            whole = np.empty(m.src_size, np.uint8)
            devices[m.src].allocator.copyout(memoryview(whole), src)
            out = np.empty(m.dst_size, np.uint8)
            devices[m.dst].allocator.copyout(memoryview(out), dst)
            out[m.dst_offset:m.dst_offset + m.nbytes] = whole[m.src_offset:m.src_offset + m.nbytes]
            devices[m.dst].allocator.copyin(dst, memoryview(out))
        return True


def test_a_backend_can_take_each_collective_step_in_one_batch():
    n = 4
    _BatchDev.calls, _BatchDev.reduces = [], []
    devs = [_BatchDev(i) for i in range(n)]
    values = [np.arange(10, dtype=np.float32) + d for d in range(n)]
    handles = []
    for dev, v in zip(devs, values):
        h = dev.allocator.alloc(v.nbytes)
        dev.allocator.copyin(h, memoryview(v).cast("B"))
        handles.append(h)
    stats = ring_allreduce(devs, handles, 40, dtypes.f32, "max")
    assert _BatchDev.calls == [n] * (n - 1)  # the all-gather: one batch of n copies per step
    assert _BatchDev.reduces == [n] * (n - 1)  # the reduce-scatter likewise
    assert sum(stats.sent) == 2 * (n - 1) * 40
    for dev, h in zip(devs, handles):
        got = np.empty(10, np.float32)
        dev.allocator.copyout(memoryview(got).cast("B"), h)
        np.testing.assert_array_equal(got, values[-1])


def test_beam_on_a_device_list_tunes_each_distinct_shard_kernel_once_per_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    prog = tgc.load(SOFTMAX)
    dims = {"N": 8, "D": 4}
    result = prog.beam(device="CPU:0,CPU:1,PYTHON:2", dims=dims, width=1, shard={"x": 0})
    kinds = [r["device"] for r in result["kernels"]]
    # CPU:0 and CPU:1 hold 3 rows each (one kernel, searched once), PYTHON:2 holds 2 rows
    assert kinds.count("CPU") == 1 and kinds.count("PYTHON") == 1, result["kernels"]
    out = prog.run(device="CPU:0,CPU:1,PYTHON:2", shard={"x": 0}, x=np.ones((8, 4), np.float32))
    np.testing.assert_allclose(out["out0"], np.full((8, 4), 0.25), rtol=1e-6)


def test_shard_on_one_device_is_an_error_not_ignored():
    prog = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b")
    a, b = np.ones((4, 3), np.float32), np.ones((3, 2), np.float32)
    for call in (lambda: prog.run(device="CPU", shard={"a": 0}, a=a, b=b),
                 lambda: prog.bench(device="CPU", shard={"a": 0}, inputs={"a": a, "b": b}, repeat=1)):
        with pytest.raises(tgc.TgcError, match="needs a device list"):
            call()


def test_debug_2_names_each_transfer_between_host_and_devices_with_its_bytes(monkeypatch, capsys):
    monkeypatch.setenv("DEBUG", "2")
    prog = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b")
    a, b = np.ones((5, 3), np.float32), np.ones((3, 2), np.float32)
    out = prog.run(device="CPU:0,CPU:1", shard={"a": 0}, a=a, b=b)["out0"]
    np.testing.assert_allclose(out, a @ b)
    err = capsys.readouterr().err
    assert "copy in  a (rows 0:3 of axis 0): 36 B host -> CPU:0" in err
    assert "copy in  a (rows 3:5 of axis 0): 24 B host -> CPU:1" in err
    assert "copy in  b (replicated): 24 B host -> CPU:1" in err
    assert "copy out out0: 24 B CPU:0 -> host" in err and "copy out out0: 16 B CPU:1 -> host" in err


# --- devices that lower alike share their kernels' builds


def test_devices_that_lower_alike_build_each_kernel_once(monkeypatch):
    """CPU:0 and CPU:1 (same class, capabilities and compiler) take one build of each distinct kernel of equal
    shards, each launching its own copy on its own device; CPU with PYTHON builds for each. Results vs numpy."""
    import tgc.api
    from tgc.engine.realize import Launch

    built = []
    plain = tgc.api.build_kernel

    def build_kernel(item, dev, **kw):
        built.append(dev)
        return plain(item, dev, **kw)
    monkeypatch.setattr(tgc.api, "build_kernel", build_kernel)
    scheduled = []
    plain_schedule = tgc.api.create_schedule
    monkeypatch.setattr(tgc.api, "create_schedule", lambda *a, **kw: scheduled.append(1) or plain_schedule(*a, **kw))
    x = np.random.default_rng(3).uniform(-1, 1, (6, 7)).astype(np.float32)
    y = np.random.default_rng(4).uniform(-1, 1, (6, 7)).astype(np.float32)
    prog = tgc.loads("x: f32[6, 7]\ny: f32[6, 7]\nreturn exp(x) * y + 1, (x * y).sum(axis=1)")
    for devices, builds in (("CPU:0,CPU:1", 2), ("CPU:0,CPU:1,CPU:2", 2), ("CPU:0,PYTHON:1", 4)):
        built.clear()
        scheduled.clear()
        out = prog.run(device=devices, shard={"x": 0, "y": 0}, x=x, y=y)
        np.testing.assert_allclose(out["out0"], np.exp(x) * y + 1, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["out1"], (x.astype(np.float64) * y).sum(axis=1), rtol=1e-4, atol=1e-5)
        assert len(built) == builds, devices
        assert len(scheduled) == builds // 2, devices  # (one schedule of both outputs per distinct shard)
        exe = prog.lower_multi(devices.split(","), {}, {"x": 0, "y": 0})
        names = devices.split(",")
        launches = [s for s in exe.steps if isinstance(s, Launch)]
        assert len(launches) == 2 * len(names)
        for s in launches:  # each device launches a kernel bound to itself, never another device's
            assert s.kernel.device is exe.devices[s.device]
        assert len({id(s.kernel) for s in launches}) == len(launches)
