"""One executable (issue 21 item 0; tgc/engine/executable.py, tgc/interfaces.py): every single-device way of
running a program gives an `Executable` that one `run` and one `bench` consume; runtime features are declared
(`MemoryFeatures`, `RuntimeFeatures`), never probed; a compiled kernel and a package's kernel are one
`LaunchableKernel`. Small programs on the CPU: every test here is fast."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

import tgc
from tgc import package
from tgc.backends import get_device
from tgc.backends.base import Allocator, Device
from tgc.codegen.kernel import Kernel
from tgc.engine import executable
from tgc.engine.executable import Chunks, Executable, Launch
from tgc.engine.realize import LaunchPlans, plan_for
from tgc.interfaces import LaunchableKernel, MemoryFeatures, RuntimeFeatures
from tgc.package import PackagedKernel

ROOT = Path(__file__).resolve().parent.parent / "tgc"

# probes still allowed, each with its reason: the duck-typed *user* values the binder accepts (array protocols),
# and the REMOTE server's request dispatch by request name (not a device feature)
ALLOWED_PROBES = {
    ("engine/conform.py", "__dlpack__"), ("engine/conform.py", "__array__"),
    ("backends/remote/server.py", None),  # getattr(self, "_do_" + name): the request handler
}


def _probes(path: Path) -> list[tuple[int, str | None]]:
    """(line, probed name or None where not a constant) of every getattr/hasattr call in a module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            arg = node.args[1] if len(node.args) > 1 else None
            out.append((node.lineno, arg.value if isinstance(arg, ast.Constant) else None))
    return out


def test_the_engine_and_the_remote_server_probe_no_runtime_feature():
    found = []
    for path in sorted((ROOT / "engine").glob("*.py")) + [ROOT / "backends/remote/server.py"]:
        rel = str(path.relative_to(ROOT))
        found += [f"{rel}:{line} probes {name!r}" for line, name in _probes(path) if (rel, name) not in ALLOWED_PROBES]
    assert found == []


def _allocator_classes() -> list[type]:
    from tgc.backends import cpu, cuda, metal, opencl, python  # noqa: F401  (every backend's allocators)
    from tgc.backends.remote import client, launcher  # noqa: F401

    seen, todo = [], [Allocator]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo += cls.__subclasses__()
    return [c for c in seen if c.__module__.startswith("tgc.")]


def test_every_allocator_declares_what_it_overrides():
    """A method behind a feature is overridden exactly where the feature is declared (a new ranged copy, view or
    zero-copy path that is not declared would never be used; a declared one without the method would fail)."""
    assert len(_allocator_classes()) >= 8
    for cls in _allocator_classes():
        f = cls.features
        assert isinstance(f, MemoryFeatures), cls
        own = {name: getattr(cls, name) is not getattr(Allocator, name) for name in
               ("view", "copyin_range", "copyout_range", "offset", "wrap", "give", "pooled_bytes")}
        assert own["view"] == f.views, cls
        assert own["copyin_range"] == own["copyout_range"] == f.ranged_copies, cls
        assert own["offset"] == f.offsets, cls
        assert own["pooled_bytes"] == f.pool, cls
        if f.zero_copy_align is not None:
            assert own["wrap"] and own["give"] and f.host_buffers, cls


def test_zero_copy_follows_the_declaration():
    alloc = get_device("CPU").allocator
    x = np.zeros(64, np.float32)
    assert alloc.features.zero_copy_align and (alloc.wrap(x) is not None) == (x.ctypes.data % alloc.zero_copy_align
                                                                              == 0)
    plain = get_device("PYTHON").allocator
    assert plain.features.zero_copy_align is None and plain.wrap(x) is None  # the default: always a copy


def test_devices_declare_their_runtime():
    from tgc.backends.remote.client import RemoteDevice

    assert get_device("CPU").runtime == RuntimeFeatures(native_launch=True, rebind_graphs=True)
    assert get_device("PYTHON").runtime == RuntimeFeatures()
    assert RemoteDevice.runtime.batched_copies and RemoteDevice.runtime.direct_copies
    # the defaults decline, so the engine copies through host memory
    assert Device.copy_batch([], [], [], []) is False and Device.reduce_batch([], [], [], "sum", None) is False


def test_the_remote_client_forwards_no_unknown_attribute(monkeypatch):
    from tgc.backends.remote.client import RemoteDevice

    assert "__getattr__" not in vars(RemoteDevice)
    dev = RemoteDevice(address="127.0.0.1:1", token="")
    monkeypatch.setattr(RemoteDevice, "properties", property(lambda self: {"attrs": {"has_fp16": True, "x": [1]}}))
    assert dev.served_fact("has_fp16") is True
    assert dev.served_fact("x") is None and dev.served_fact("missing") is None  # (a list is not a plain fact)
    with pytest.raises(AttributeError):
        dev.has_fp16  # noqa: B018


def test_a_compiled_and_a_packaged_kernel_are_one_protocol(tmp_path):
    assert LaunchableKernel in Kernel.__mro__ and LaunchableKernel in PackagedKernel.__mro__  # (declared)
    members = [n for n, v in vars(LaunchableKernel).items() if inspect.isfunction(v)]
    for cls in (Kernel, PackagedKernel):
        assert all(getattr(cls, n) is not getattr(LaunchableKernel, n) for n in members), cls
    prog = tgc.loads("x: f32[N]\nreturn x * 2.0 + 1.0\n")
    low = prog.lower("CPU", {"N": 100})
    assert [k.written() for k in low.kernels] == [frozenset({0})]
    assert low.kernels[0].linear_uops() is low.kernels[0].uops
    path = tmp_path / "p.tgpkg"
    package.write(prog, path, "CPU", {"N": 100})
    packaged = tgc.load_package(path).lower("CPU")
    assert isinstance(packaged, Executable) and packaged.kernels[0].written() == frozenset({0})
    assert packaged.kernels[0].linear_uops() is None


def test_one_run_and_bench_of_a_program_executable():
    prog = tgc.loads("x: f32[N]\ny: f32[N]\nreturn (x * y).sum(), x + 1.0\n")
    exe = prog.lower("CPU", {"N": 1000})
    assert isinstance(exe, Executable) and exe.chunks is None
    assert [s.kernel for s in exe.steps] == exe.kernels and all(isinstance(s, Launch) for s in exe.steps)
    x, y = np.arange(1000, dtype=np.float32), np.full(1000, 0.5, np.float32)
    want = {"out0": (x * y).sum(), "out1": x + 1}
    plans = LaunchPlans()
    for i in range(3):  # once, then bound to a launch plan of its own, then replayed
        got = executable.run(exe, {"x": x, "y": y}, replay=plans, key="k")
        np.testing.assert_allclose(got["out0"], want["out0"], rtol=1e-5)
        np.testing.assert_array_equal(got["out1"], want["out1"])
        assert len(plans.plans) == (0 if i == 0 else 1)
    plans.release()
    timing = executable.bench(exe, {"x": x, "y": y}, repeat=2, warmup=0, measure_peak=False)
    assert [r["name"] for r in timing["kernels"]] == [k.name for k in exe.kernels]
    assert "chunks" not in timing["program"]


def test_a_chunked_executable_runs_each_chunk_into_the_whole_outputs():
    """One chunk's program (4 of 16 rows), made an Executable of 4 chunks: run slices x, keeps w whole."""
    prog = tgc.loads("x: f32[B, N]\nw: f32[N]\nreturn (x * w).sum(1), x + 1.0\n")
    one = prog.lower("CPU", {"B": 4, "N": 64})
    dev = one.device
    exe = Executable(dev, one.kernels, one.inputs, one.outputs,
                     memory=plan_for(dev, one.kernels, one.inputs, one.outputs, fixed_outputs=True)).chunked(4, {"x"})
    assert exe.chunks == Chunks(4, frozenset({"x"})) and exe.one_chunk().chunks is None
    x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    w = np.linspace(-1, 1, 64, dtype=np.float32)
    got = executable.run(exe, {"x": x, "w": w})
    np.testing.assert_allclose(got["out0"], (x * w).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["out1"], x + 1)
    timing = executable.bench(exe, {"x": x, "w": w}, repeat=2, warmup=0, measure_peak=False)
    assert timing["program"]["chunks"] == 4 and timing["program"]["graph"] is False
    assert timing["program"]["flops"] == 4 * sum(k.flops for k in one.kernels)


def test_a_device_list_is_one_executable_of_launch_copy_and_collective_steps():
    """x sharded over two CPUs: each device's partial sum and x * 2, a copy into the all-reduce's buffer and
    the all-reduce, over each device's memory-planned buffers; run and benched by the one run/bench."""
    from tgc.engine.executable import Collective, Copy, InputPart, Launch

    prog = tgc.loads("x: f32[N]\nreturn x.sum(), x * 2.0\n")
    exe = prog.lower_multi(["CPU:0", "CPU:1"], {"N": 64}, {"x": 0})
    assert isinstance(exe, Executable) and exe.multi and [d.name for d in exe.devices] == ["CPU:0", "CPU:1"]
    kinds = [type(s) for s in exe.steps]
    first_copy = kinds.index(Copy)
    assert set(kinds[:first_copy]) == {Launch} and kinds[first_copy:first_copy + 3] == [Copy, Copy, Collective]
    assert set(kinds[first_copy + 3:]) <= {Launch}
    assert {s.device for s in exe.steps[:first_copy]} == {0, 1}
    assert [c.kind for c in exe.collectives()] == ["allreduce"]
    assert [(p.name, p.device, p.axis, p.rows) for p in exe.inputs if isinstance(p, InputPart)] == \
        [("x", 0, 0, (0, 32)), ("x", 1, 0, (32, 64))]
    for d in range(2):  # every buffer a device's steps use is placed by that device's memory plan
        keys = {k for s in exe.steps if isinstance(s, Launch) and s.device == d for k in s.kernel.bufs}
        assert keys <= set(exe.memory_plan(d).slot_of)
    x = np.arange(64, dtype=np.float32)
    got = executable.run(exe, {"x": x})
    np.testing.assert_allclose(got["out0"], x.sum(), rtol=1e-6)
    np.testing.assert_array_equal(got["out1"], x * 2)
    timing = executable.bench(exe, {"x": x}, repeat=1, warmup=0)
    assert timing["devices"] == ["CPU:0", "CPU:1"] and timing["collectives"]["steps"] == ["allreduce"]
    assert timing["collectives"]["sent_bytes"] == [4, 4]  # a 1-element ring: each device sends its half once


def test_a_device_lists_buffers_share_slots_of_each_devices_memory_plan():
    """Two all-reduces (the max, then the sum of exp(x - max)) on two CPUs: each device's partial max dies at
    its copy into the all-reduce's buffer, so its partial sum reuses that slot (the plan allocates less than
    its buffers' bytes); the collective's buffers stay live until read. Values against numpy."""
    prog = tgc.loads("x: f32[N]\nm = x.max()\nreturn (x - m).exp().sum(), m\n")
    exe = prog.lower_multi(["CPU:0", "CPU:1"], {"N": 64}, {"x": 0})
    assert [c.kind for c in exe.collectives()] == ["allreduce", "allreduce"]
    for d in range(2):
        plan = exe.memory_plan(d)
        assert plan.peak_bytes < sum(plan.sizes.values())
    x = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    got = executable.run(exe, {"x": x})
    np.testing.assert_allclose(got["m"], x.max())
    np.testing.assert_allclose(got["out0"], np.exp(x - x.max()).sum(), rtol=1e-5)
