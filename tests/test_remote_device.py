"""`-d REMOTE` behaves as the device it serves: the real CPU device behind a `tgc serve` subprocess."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.test_remote_datapath import _drop_remote_instances
from tgc.backends.remote.process import ServerProcess
from tgc.errors import CompileError, DeviceError


def _cpu_ready() -> bool:
    if importlib.util.find_spec("tgc.backends.cpu") is None or importlib.util.find_spec("tgc.api") is None:
        return False
    from tgc.backends import device_class
    return device_class("CPU").probe()[0]


pytestmark = pytest.mark.skipif(not _cpu_ready(), reason="the CPU device is not available yet")

SOFTMAX = """x: f32[N, D]
m = x.max(axis=1, keepdim=True)
e = exp(x - m)
return e / sum(e, axis=1, keepdim=True)
"""


@pytest.fixture(scope="module")
def server():
    with ServerProcess("CPU") as srv:
        yield srv


@pytest.fixture
def remote(server, monkeypatch):
    monkeypatch.setenv("TGC_REMOTE", server.address)
    monkeypatch.delenv("TGC_REMOTE_TOKEN", raising=False)
    monkeypatch.delenv("TGC_REMOTE_TOKEN_FILE", raising=False)
    _drop_remote_instances()
    from tgc.backends import get_device
    yield get_device("REMOTE")
    _drop_remote_instances()


PROGRAMS = [
    ("x: f32[N]\na: f32[N]\nreturn relu(a * x + 1.5) ** 2 + x.sin()\n", {"x": (257,), "a": (257,)}),
    (SOFTMAX, {"x": (33, 70)}),
    ("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b\n", {"a": (17, 31), "b": (31, 9)}),
    ("x: i32[N, D]\nreturn sum(x, axis=0), x.max(axis=1), x * 3 - 7\n", {"x": (40, 12)}),
]


def _inputs(prog, shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for decl in prog.inputs:
        dt = decl.dtype.np
        if np.issubdtype(dt, np.integer):
            out[decl.name] = rng.integers(-100, 100, size=shapes[decl.name]).astype(dt)
        else:
            out[decl.name] = rng.standard_normal(shapes[decl.name]).astype(dt)
    return out


@pytest.mark.parametrize("src, shapes", PROGRAMS)
def test_results_match_the_served_device_and_numpy(remote, src, shapes):
    import tgc
    prog = tgc.loads(src)
    inputs = _inputs(prog, shapes)
    got = prog.run(device="REMOTE", **inputs)
    local = tgc.loads(src).run(device="CPU", **inputs)
    ref = prog.reference(**inputs)
    assert list(got) == list(local) == list(ref)
    for name in got:
        assert got[name].dtype == local[name].dtype and got[name].shape == local[name].shape
        np.testing.assert_array_equal(got[name], local[name])  # same binaries on the same machine
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-5)


MULTI_KERNEL = [  # one output each; the first with several kernels under the current scheduler is used
    ("x: f32[N, D]\nw: f32[D, D]\nh = relu(x @ w)\nreturn h @ w\n", {"x": (16, 32), "w": (32, 32)}),
    ("x: f32[N, D]\nreturn x / sum(x, axis=0, keepdim=True)\n", {"x": (16, 100)}),
    (SOFTMAX, {"x": (16, 100)}),
]


def test_a_program_of_k_kernels_costs_one_round_trip(remote):
    import tgc
    for src, shapes in MULTI_KERNEL:
        prog = tgc.loads(src)
        inputs = _inputs(prog, shapes)
        if len(prog.compile(device="REMOTE", dims=prog.bind(inputs)[0])) >= 2:
            break
    prog.run(device="REMOTE", **inputs)  # loads the programs
    before = remote.round_trips
    for i in range(3):
        moved = {k: v + i for k, v in inputs.items()}
        out = prog.run(device="REMOTE", **moved)["out0"]
        np.testing.assert_allclose(out, prog.reference(**moved)["out0"], rtol=1e-4, atol=1e-4)
    assert remote.round_trips - before == 3


def test_queued_launches_go_in_one_round_trip(remote):
    import tgc
    from tgc.ir.uop import Ops
    prog = tgc.loads("x: f32[N]\nreturn x * 2 + 1\n")
    (k,) = prog.compile(device="REMOTE", dims={"N": 64})
    x = np.arange(64, dtype=np.float32)
    handles = _buffers(remote, k, {"x": x})
    out_node = next(n for n in k.bufs if n.op is not Ops.BUFFER)
    remote.flush()
    before = remote.round_trips
    program = k.program()
    for _ in range(7):  # alloc + load + 7 launches + copy out: nothing is sent before the copy out
        assert program(*[handles[n] for n in k.bufs], global_size=k.global_size, local_size=k.local_size,
                       vals=k.vals) is None
    assert remote.round_trips == before
    out = np.empty(64, np.float32)
    remote.allocator.copyout(memoryview(out).cast("B"), handles[out_node])
    assert remote.round_trips - before == 1
    np.testing.assert_array_equal(out, x * 2 + 1)
    remote.synchronize()  # the copy out already waited for the launches
    assert remote.round_trips - before == 1


def test_compile_renders_with_the_served_devices_renderer(remote):
    import tgc
    dims = {"N": 8, "D": 40}
    # (heuristic kernels on both: a BEAM winner another test stored for one device must not make them differ)
    here = tgc.loads(SOFTMAX).compile(device="CPU", dims=dims, tuned=False)
    there = tgc.loads(SOFTMAX).compile(device="REMOTE", dims=dims, tuned=False)
    assert [k.src for k in there] == [k.src for k in here]
    assert [k.name for k in there] == [k.name for k in here]
    assert all(k.binary for k in there)
    assert "r_" in there[0].name and ".globl" in there[0].asm()


def test_the_compilers_message_comes_back_as_a_compile_error(remote):
    from tgc.backends import get_device
    bad = "define void @k() {\n  ret i32 0\n}\n"
    with pytest.raises(CompileError) as local:
        get_device("CPU").compiler.compile(bad)
    with pytest.raises(CompileError) as there:
        remote.compiler.compile(bad)
    assert there.value.msg == local.value.msg and "LLVM" in there.value.msg
    assert there.value.exit_code == 1


def test_it_shows_the_served_device(remote):
    from tgc.backends import get_device
    cpu = get_device("CPU")
    info = remote.info()
    assert info["serves"] == "CPU" and info["server"] == os.environ["TGC_REMOTE"]
    assert info["cores"] == cpu.cores == remote.cores  # the served device's facts are the client's
    assert hasattr(remote, "cores") and not hasattr(remote, "has_fp16") and not hasattr(cpu, "has_fp16")
    assert remote.launch_style == cpu.launch_style
    assert remote.compiler.name == f"remote-{cpu.compiler.name}" and remote.compiler.version == cpu.compiler.version
    assert type(remote.renderer) is type(cpu.renderer)
    assert remote.compile_error is None


def _buffers(dev, kernel, arrays: dict[str, np.ndarray]) -> dict:
    from tgc.ir.shapes import prod, shape_of
    from tgc.ir.uop import Ops
    handles = {}
    for node in kernel.bufs:
        handles[node] = dev.allocator.alloc(prod(shape_of(node)) * node.dtype.itemsize)
        if node.op is Ops.BUFFER:
            dev.allocator.copyin(handles[node], memoryview(arrays[node.arg[1]]).cast("B"))
    return handles


def test_graph_and_wait(remote):
    import tgc
    from tgc.ir.uop import Ops
    prog = tgc.loads("x: f32[N]\nreturn x * 2 + 1\n")
    (k,) = prog.compile(device="REMOTE", dims={"N": 1000})
    x = np.arange(1000, dtype=np.float32)
    handles = _buffers(remote, k, {"x": x})
    out_node = next(n for n in k.bufs if n.op is not Ops.BUFFER)
    launch = (k.program(), [handles[n] for n in k.bufs], k.global_size, k.local_size, k.vals)
    graph = remote.graph([launch] * 3)
    remote.flush()
    before = remote.round_trips
    graph()
    out = np.empty(1000, np.float32)
    remote.allocator.copyout(memoryview(out).cast("B"), handles[out_node])
    assert remote.round_trips - before == 1
    np.testing.assert_array_equal(out, x * 2 + 1)
    t = graph(wait=True)
    assert isinstance(t, float) and t >= 0
    t = k.program()(*launch[1], global_size=k.global_size, local_size=k.local_size, vals=k.vals, wait=True)
    assert isinstance(t, float) and t >= 0
    graph.free()
    remote.allocator.free(handles[out_node], 4000)
    with pytest.raises(DeviceError, match=f"no buffer {handles[out_node]} in this session"):
        k.program()(*launch[1], global_size=k.global_size, vals=k.vals, wait=True)


def test_remote_i_is_its_own_session(remote):
    import tgc
    from tgc.backends import get_device
    other = get_device("REMOTE:1")
    assert other is not remote and other.session != remote.session and other.name == "REMOTE:1"
    x = np.ones(10, np.float32)
    prog = tgc.loads("x: f32[N]\nreturn x + 1\n")
    np.testing.assert_array_equal(prog.run(device="REMOTE:1", x=x)["out0"], x + 1)
    np.testing.assert_array_equal(prog.run(device="REMOTE", x=x)["out0"], x + 1)


def test_large_buffers_round_trip(remote):
    import tgc
    x = np.random.default_rng(3).standard_normal(3_000_000).astype(np.float32)
    out = tgc.loads("x: f32[N]\nreturn -x\n").run(device="REMOTE", x=x)["out0"]
    np.testing.assert_array_equal(out, -x)


def test_token_file_on_both_ends(tmp_path, monkeypatch):
    import tgc
    token = tmp_path / "token"
    token.write_text("tok-" + "9" * 30 + "\n")
    with ServerProcess("CPU", "--token-file", str(token)) as srv:
        monkeypatch.setenv("TGC_REMOTE", srv.address)
        monkeypatch.delenv("TGC_REMOTE_TOKEN", raising=False)
        monkeypatch.delenv("TGC_REMOTE_TOKEN_FILE", raising=False)
        _drop_remote_instances()
        prog = tgc.loads("x: f32[N]\nreturn x * x\n")
        x = np.arange(5, dtype=np.float32)
        with pytest.raises(DeviceError, match="missing or wrong token"):
            prog.run(device="REMOTE", x=x)
        monkeypatch.setenv("TGC_REMOTE_TOKEN_FILE", str(token))
        _drop_remote_instances()
        np.testing.assert_array_equal(prog.run(device="REMOTE", x=x)["out0"], x * x)
        _drop_remote_instances()
        assert "(token required)" in srv.stderr()


def _tgc(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tgc.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


@pytest.mark.skipif(importlib.util.find_spec("tgc.cli.main") is None, reason="no CLI yet")
def test_cli_against_tgc_serve(tmp_path):
    src = tmp_path / "softmax.tg"
    src.write_text(SOFTMAX)
    with ServerProcess("CPU") as srv:
        env = {"TGC_REMOTE": srv.address}
        run = _tgc("run", str(src), "-d", "REMOTE", "--random", "-D", "N=4", "-D", "D=8", "--check", env=env)
        assert run.returncode == 0, run.stderr
        env_free = {k: v for k, v in os.environ.items() if k != "TGC_REMOTE"}
        comp = subprocess.run([sys.executable, "-m", "tgc.cli.main", "compile", str(src), "-d", "REMOTE",
                               "--remote", srv.address, "-D", "N=4", "-D", "D=8"],
                              capture_output=True, text=True, env=env_free, timeout=120)
        assert comp.returncode == 0, comp.stderr
        assert "define" in comp.stdout
        devs = _tgc("devices", "--json", env=env)
        assert devs.returncode == 0, devs.stderr
        assert srv.address in devs.stdout and "CPU" in devs.stdout
        json.loads(devs.stdout)
        assert srv.stop() == 0
    assert "shutting down" in srv.stderr()
