"""Launch plans run as device graphs (tgc.engine.realize.LaunchPlan, Device.graph): a program run again with the
same dims and device runs every kernel through one graph (on the CPU one native call, tgc/backends/cpu_graph.py).
Results are checked against numpy and against per-kernel launches; no timings here (they live in `make bench`)."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.errors import DeviceError

RNG = np.random.default_rng(15)
F32 = np.float32


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _layernorm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    c = x - mu
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5) * g + b


def _small(x):
    for _ in range(19):
        x = (x - x.mean(axis=0)) * 1.001
    return x


def _attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    return _softmax(s, -1) @ v


# (program source or kernels/ file, input shapes, numpy of the inputs -> the first output)
PROGRAMS = [
    ("x: f32[N, D]\nreturn softmax(x, 1), x.T @ x, x.sum(0)", {"x": (64, 48)},
     lambda x: _softmax(x, 1)),
    ("kernels/layernorm.tg", {"x": (33, 40), "gamma": (40,), "beta": (40,)}, _layernorm),
    ("kernels/small_kernels.tg", {"x": (16, 64)}, _small),
    ("kernels/attention.tg", {"q": (1, 2, 17, 8), "k": (1, 2, 17, 8), "v": (1, 2, 17, 8)}, _attention),
    ("a: f32[N]\nb: f32[N]\nreturn exp(a * b + 1.0) * 0.5 - a", {"a": (1000,), "b": (1000,)},
     lambda a, b: np.exp(a * b + 1.0) * 0.5 - a),
]


def _load(src: str) -> tgc.Program:
    return tgc.load(src) if src.endswith(".tg") else tgc.loads(src)


def _inputs(shapes: dict) -> dict:
    return {name: RNG.standard_normal(shape).astype(F32) for name, shape in shapes.items()}


def _first(out: dict) -> np.ndarray:
    return next(iter(out.values()))


def _plan(prog: tgc.Program):
    (plan,) = prog._launch_plans.plans.values()
    return plan


@pytest.mark.parametrize("src, shapes, ref", PROGRAMS, ids=[p[0].split("\n")[-1][:30] for p in PROGRAMS])
def test_graph_runs_match_numpy_and_per_kernel_launches(device, src, shapes, ref, monkeypatch):
    prog = _load(src)
    runs = [_inputs(shapes) for _ in range(3)]
    got = [prog.run(device=device, **arrays) for arrays in runs]  # the 2nd and 3rd run as a graph where it can
    plan = _plan(prog)
    if device == "CPU":
        assert plan.graph is not None, plan.graph_error
    monkeypatch.setenv("TGC_GRAPH", "0")
    single = [_load(src).run(device=device, **arrays) for arrays in runs]
    for arrays, out, one in zip(runs, got, single):
        np.testing.assert_allclose(_first(out), ref(*arrays.values()), rtol=1e-4, atol=1e-4)
        for name in out:  # the same kernels, launched one by one: the same bits
            np.testing.assert_array_equal(out[name], one[name])


@pytest.mark.parametrize("threads", [2, 3])
def test_parallel_kernels_stay_parallel_in_a_cpu_graph(threads, monkeypatch):
    from tgc.backends import cpu_graph
    monkeypatch.setattr(cpu_graph, "oversubscribed", lambda threads, cores: False)  # (threaded, whatever the load)
    monkeypatch.setenv("TGC_THREADS", str(threads))
    prog = tgc.loads("x: f32[N, D]\nreturn softmax(x, 1), x.T @ x, x.sum(0)")
    widths = [k.global_size[0] for k in prog.lower("CPU", {"N": 256, "D": 64}).kernels]
    assert max(widths) == threads and min(widths) == 1  # a mix of parallel and single-thread kernels
    for _ in range(4):
        x = RNG.standard_normal((256, 64)).astype(F32)
        out = prog.run(x=x)
        np.testing.assert_allclose(out["out0"], _softmax(x, 1), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(out["out1"], x.T @ x, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(out["out2"], x.sum(0), rtol=1e-4, atol=1e-4)
    plan = _plan(prog)
    assert plan.graph is not None and plan.graph.threads == threads


def test_the_graph_is_captured_once_and_new_inputs_flow_through_it(monkeypatch):
    from tgc.backends import get_device
    dev = get_device("CPU")
    made = []
    real = type(dev).graph

    def counting(self, launches):
        made.append(len(launches))
        return real(self, launches)

    monkeypatch.setattr(type(dev), "graph", counting)
    prog = tgc.load("kernels/small_kernels.tg")
    for i in range(5):
        x = RNG.standard_normal((16, 64)).astype(F32) * (i + 1)
        np.testing.assert_allclose(_first(prog.run(x=x)), _small(x), rtol=1e-4, atol=1e-4)
    assert made == [20]  # captured at the second run, reused by the three after it
    x = RNG.standard_normal((8, 64)).astype(F32)  # other dims: another plan, another graph
    prog.run(x=x)
    np.testing.assert_allclose(_first(prog.run(x=x)), _small(x), rtol=1e-4, atol=1e-4)
    assert made == [20, 20] and len(prog._launch_plans.plans) == 2
    prog.release()
    assert prog._launch_plans.plans == {}


def test_outputs_are_copies_not_the_plans_buffers():
    prog = tgc.loads("x: f32[N]\nreturn x * 2.0")
    a = prog.run(x=np.ones(8, F32))["out0"]
    prog.run(x=np.full(8, 3.0, F32))
    b = prog.run(x=np.full(8, 5.0, F32))["out0"]
    assert a.tolist() == [2.0] * 8 and b.tolist() == [10.0] * 8


def test_debug_2_says_when_a_graph_ran(monkeypatch, capsys):
    prog = tgc.load("kernels/small_kernels.tg")
    x = RNG.standard_normal((16, 64)).astype(F32)
    monkeypatch.setenv("DEBUG", "2")
    prog.run(x=x)
    first = capsys.readouterr().err
    assert "first launch" in first and "graph" not in first  # the first run: kernel by kernel
    out = prog.run(x=x)
    err = capsys.readouterr().err
    assert "graph of 20 kernels (r_64_16, ..., E_16_64) ran in one launch" in err and "first launch" not in err
    np.testing.assert_allclose(_first(out), _small(x), rtol=1e-4, atol=1e-4)


def test_debug_2_counts_a_graph_of_one_kernel_in_the_singular(monkeypatch, capsys):
    prog = tgc.loads("x: f32[N]\nreturn x * 2.0")
    monkeypatch.setenv("DEBUG", "2")
    for _ in range(2):
        prog.run(device="CPU", x=np.ones(8, F32))
    err = capsys.readouterr().err
    assert "graph of 1 kernel (E_8) ran in one launch" in err, err  # was "graph of 1 kernels"


def test_tgc_graph_0_launches_kernel_by_kernel(monkeypatch, capsys):
    monkeypatch.setenv("TGC_GRAPH", "0")
    monkeypatch.setenv("DEBUG", "2")
    prog = tgc.loads("x: f32[N]\nreturn (x * 2.0).sum()")
    for _ in range(3):
        prog.run(x=np.ones(8, F32))
    assert "graph" not in capsys.readouterr().err and _plan(prog).graph is None


def test_a_device_without_graphs_waits_once(device, monkeypatch, capsys):
    """PYTHON (and OpenCL) have no graph object: the plan launches every kernel without waiting, then waits."""
    from tgc.backends import get_device
    from tgc.backends.base import Device
    remote = device.upper().startswith("REMOTE")
    if device == "CPU" or (not remote and type(get_device(device)).graph is not Device.graph):
        pytest.skip(f"{device} has graphs")  # CPU, CUDA
    prog = tgc.loads("x: f32[N]\nreturn softmax(x, 0)")
    monkeypatch.setenv("DEBUG", "2")
    x = RNG.standard_normal(9).astype(F32)
    for _ in range(3):
        np.testing.assert_allclose(prog.run(device=device, x=x)["out0"], _softmax(x, 0), rtol=1e-4)
    if device.upper().startswith("REMOTE"):
        assert "graph of" in capsys.readouterr().err
    else:
        assert "has no device graphs" in capsys.readouterr().err


def test_a_failing_graph_is_one_clear_device_error(monkeypatch):
    from tgc.backends import get_device

    class Broken:
        def __call__(self, wait=False):
            raise RuntimeError("launch failed: illegal address")

        def free(self):
            pass

    monkeypatch.setattr(type(get_device("CPU")), "graph", lambda self, launches: Broken())
    prog = tgc.load("kernels/small_kernels.tg")
    x = RNG.standard_normal((16, 64)).astype(F32)
    prog.run(x=x)
    with pytest.raises(DeviceError, match=r"the graph of 20 kernels \(r_64_16, \.\.\., E_16_64\) failed on CPU: "
                                          "launch failed: illegal address"):
        prog.run(x=x)
    monkeypatch.undo()
    np.testing.assert_allclose(_first(prog.run(x=x)), _small(x), rtol=1e-4, atol=1e-4)  # a fresh plan


def test_a_kernel_with_too_many_arguments_falls_back_to_launches(monkeypatch, capsys):
    from tgc.backends import cpu_graph
    monkeypatch.setattr(cpu_graph, "MAX_ARGS", 4)  # every kernel of this program takes more
    monkeypatch.setenv("DEBUG", "2")
    prog = tgc.loads("a: f32[N]\nb: f32[N]\nc: f32[N]\nd: f32[N]\nreturn a * b + c * d")
    arrays = {k: RNG.standard_normal(5).astype(F32) for k in "abcd"}
    for _ in range(3):
        out = prog.run(**arrays)["out0"]
    np.testing.assert_allclose(out, arrays["a"] * arrays["b"] + arrays["c"] * arrays["d"], rtol=1e-6)
    assert "no graph for 1 kernels" in capsys.readouterr().err
    assert "a CPU graph calls at most 4" in _plan(prog).graph_error


def test_a_plan_in_use_by_another_thread_runs_on_buffers_of_its_own():
    prog = tgc.loads("x: f32[N]\nreturn x + 1.0")
    prog.run(x=np.zeros(4, F32))  # a first run keeps nothing; the second makes the plan
    prog.run(x=np.zeros(4, F32))
    plan = _plan(prog)
    with plan.lock:  # as if another thread were running it
        assert prog.run(x=np.ones(4, F32))["out0"].tolist() == [2.0] * 4
    assert prog.run(x=np.ones(4, F32))["out0"].tolist() == [2.0] * 4


def test_bench_times_the_program_as_a_graph():
    prog = tgc.load("kernels/small_kernels.tg")
    r = prog.bench(inputs={"x": RNG.standard_normal((16, 64)).astype(F32)}, repeat=2)
    assert r["program"]["graph"] is True and len(r["kernels"]) == 20


def test_bench_times_the_kernels_one_by_one_before_the_program(monkeypatch):
    """The whole program's timed runs follow every one-by-one launch instead of alternating with them: a graph
    run right after the one-by-one launches paid for waking the device's threads (a 0.5 ms transformer block
    at small sizes was timed at 3-7 ms)."""
    from tgc.engine import realize
    order: list[str] = []
    capture = realize.LaunchPlan.capture

    def spy_capture(self):
        graph = capture(self)

        def run(wait: bool = False):
            order.append("G")
            return graph(wait=wait)
        return run if graph is not None else None
    monkeypatch.setattr(realize.LaunchPlan, "capture", spy_capture)
    from tgc.backends.cpu import CPUProgram
    launch = CPUProgram.__call__

    def counted(self, *a, **kw):
        order.append("K")
        return launch(self, *a, **kw)
    monkeypatch.setattr(CPUProgram, "__call__", counted)
    prog = tgc.load("kernels/small_kernels.tg")
    r = prog.bench(inputs={"x": RNG.standard_normal((16, 64)).astype(F32)}, repeat=3, warmup=1)
    assert r["program"]["graph"] is True
    first, last = order.index("G"), len(order) - 1 - order[::-1].index("G")
    assert order.count("G") == 4 and order[first:last + 1] == ["G"] * 4  # no launch between the program's runs
    assert order[:first].count("K") == 4 * 20  # warm-up and 3 timed rounds of the 20 kernels, all before


def test_the_graph_runner_ir_calls_kernels_of_any_arity():
    from tgc.backends.cpu_graph import MAX_ARGS, graph_ir
    ir = graph_ir()
    assert ir.count("select i1") == MAX_ARGS and "@sched_yield" in ir


def test_a_plan_that_cannot_allocate_reports_the_devices_error_and_gives_back_what_it_had(monkeypatch):
    from tgc.backends import get_device
    alloc = get_device("CPU").allocator
    prog = tgc.loads("x: f32[N]\nreturn (x * 2.0).sum()")
    real, given = alloc.alloc, []

    def failing(nbytes):
        if given:
            raise DeviceError("out of device memory (test)")
        given.append(real(nbytes))
        return given[-1]

    prog.run(x=np.ones(4, F32))  # compiled; the next run makes the launch plan, whose allocation fails
    monkeypatch.setattr(alloc, "alloc", failing)
    with pytest.raises(DeviceError, match="out of device memory"):
        prog.run(x=np.ones(4, F32))
    assert any(h is given[0] for h in alloc.cached[given[0].nbytes])  # the input buffer went back to the pool


def test_a_program_keeps_the_plans_of_its_last_sizes_and_frees_the_others():
    from tgc.backends import get_device
    alloc = get_device("CPU").allocator
    prog = tgc.loads("x: f32[N]\nreturn x * 3.0")
    first = None
    for n in range(1, 7):
        x = np.arange(n, dtype=F32) + 100 * n
        for _ in range(2):  # (the second run at a size makes its plan)
            assert prog.run(x=x)["out0"].tolist() == (x * 3).tolist()
        if first is None:
            first = _plan(prog)
            handles = [b.handle for b in first.buffers.values()]
    assert [dict(k[1])["N"] for k in prog._launch_plans.plans] == [3, 4, 5, 6]  # the last MAX_PLANS sizes, oldest first
    # the plan of N=1 was freed: its buffers went back to the allocator's pool
    assert first.buffers == {} and len(handles) == 2
    assert all(any(h is c for c in alloc.cached[4]) for h in handles)
    prog.run(x=np.ones(4, F32))  # a kept size moves to the end
    assert [dict(k[1])["N"] for k in prog._launch_plans.plans] == [3, 5, 6, 4]


def test_cpu_buffers_carry_their_address_and_views_fall_back():
    from tgc.backends import get_device
    from tgc.backends.cpu import data_address
    h = get_device("CPU").allocator.alloc(256)
    try:
        assert h.address == h.ctypes.data == data_address(h)
        view = h[64:]  # a view knows no address of its own: the launch asks numpy
        assert getattr(view, "address", None) is None and data_address(view) == h.ctypes.data + 64
    finally:
        get_device("CPU").allocator.free(h, 256)


def test_a_kernel_launched_on_a_view_of_a_buffer_reads_the_view():
    from tgc.backends import get_device
    dev = get_device("CPU")
    (k,) = tgc.loads("x: f32[N]\nreturn x * 2.0").compile(device="CPU", dims={"N": 4})
    src, out = dev.allocator.alloc(32), dev.allocator.alloc(16)
    src.view(F32)[:] = np.arange(8, dtype=F32)
    k.program()(out, src[16:], global_size=k.global_size, local_size=k.local_size, vals=k.vals)
    assert out.view(F32).tolist() == [8.0, 10.0, 12.0, 14.0]


def test_ctrl_c_during_a_threaded_cpu_graph_arrives_once_no_thread_is_in_it(python_sigint, monkeypatch):
    """Ctrl-C while a multi-thread graph runs is held back until the native call on the calling thread returns,
    which is once every chunk is done and no other thread is in the run: nothing is left running (no buffers
    kept busy), the run's results are whole, and the next graph can run."""
    import signal
    import threading
    import time

    from tgc.backends import cpu, cpu_graph, get_device
    monkeypatch.setattr(cpu_graph, "oversubscribed", lambda threads, cores: False)  # (threaded, whatever the load)
    monkeypatch.setenv("TGC_THREADS", "2")
    prog = tgc.loads("x: f32[N]\nreturn exp(x) * 2.0")
    x = RNG.standard_normal(1 << 18).astype(F32)
    for _ in range(2):
        prog.run(x=x)
    graph = _plan(prog).graph
    if graph is None or graph.threads != 2:
        pytest.skip("this program's graph runs on one thread here")
    real, calls = graph.fn, []

    def slow(tab, n, core, state, ticket):  # the calling thread is in native code when Ctrl-C comes
        if core == 0:
            time.sleep(0.3)
        real(tab, n, core, state, ticket)
        calls.append(core)
    graph.fn = slow
    main_thread = threading.get_ident()
    threading.Timer(0.1, signal.pthread_kill, (main_thread, signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        prog.run(x=x)
    assert 0 in calls  # the run went on to its end
    assert not cpu.kernels_running()
    assert not get_device("CPU").graph_lock.locked()
    graph.fn = real
    np.testing.assert_allclose(prog.run(x=x)["out0"], np.exp(x) * 2.0, rtol=1e-5)


def test_a_program_without_kernels_runs_again_without_a_graph(monkeypatch, capsys):
    monkeypatch.setenv("DEBUG", "2")
    prog = tgc.loads("x: f32[N]\nreturn x * 2.0")
    for _ in range(3):
        assert prog.run(x=np.zeros(0, F32))["out0"].shape == (0,)
    assert _plan(prog).graph_error == "no kernels to run"


def test_threads_that_sleep_at_the_barrier_are_woken(monkeypatch):
    """With no spinning and no yielding, every wait at a barrier sleeps on the futex: the graph must still finish
    with the right results (a lost wake-up would hang here)."""
    from tgc.backends import cpu_graph
    monkeypatch.setattr(cpu_graph, "SPINS", 0)
    monkeypatch.setattr(cpu_graph, "YIELDS", 0)
    monkeypatch.setattr(cpu_graph, "_RUNNER", None)  # built again with these settings (another cache key)
    monkeypatch.setattr(cpu_graph, "oversubscribed", lambda threads, cores: False)  # (threaded, whatever the load)
    monkeypatch.setenv("TGC_THREADS", "3")
    prog = tgc.loads("x: f32[N, D]\nreturn softmax(x, 1), x.T @ x, x.sum(0)")
    for _ in range(20):
        x = RNG.standard_normal((96, 32)).astype(F32)
        out = prog.run(x=x)
        np.testing.assert_allclose(out["out0"], _softmax(x, 1), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(out["out1"], x.T @ x, rtol=1e-4, atol=1e-3)
    assert _plan(prog).graph.threads == 3
    assert "icmp ult i32 %k1, 0" in cpu_graph.graph_ir()


def test_symbolic_runs_repeated_run_as_a_graph(monkeypatch, capsys):
    prog = tgc.load("kernels/softmax.tg")
    x = RNG.standard_normal((5, 7)).astype(F32)
    want = np.exp(x - x.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    monkeypatch.setenv("DEBUG", "2")
    for _ in range(3):
        got = _first(prog.run(symbolic=True, x=x))
        assert prog.last_run == "symbolic"
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert "ran in one launch" in capsys.readouterr().err


def test_a_cpu_graph_table_holds_each_kernels_entry_chunks_and_arguments():
    """The table a CPU graph builds (cpu_graph's module docstring: entry, chunks, after the previous row, nargs,
    then the arguments): a buffer two kernels read and a view give their own addresses in every row, the kernels'
    values follow the buffers, and the rest of a row is zero. Then the graph runs: numpy's results."""
    from tgc.backends import get_device
    from tgc.backends.cpu import data_address
    dev = get_device("CPU")
    (k,) = tgc.loads("x: f32[N]\nreturn x * 2.0").compile(device="CPU", dims={"N": 4})
    src, mid, out = dev.allocator.alloc(32), dev.allocator.alloc(16), dev.allocator.alloc(16)
    try:
        src.view(F32)[:] = np.arange(8, dtype=F32)
        view = src[16:]  # (no address of its own: numpy's)
        launches = [(k.program(), [mid, view], k.global_size, k.local_size, [7, 9]),
                    (k.program(), [out, mid], k.global_size, k.local_size, [])]
        graph = dev.graph([(p, b, g, lo, ()) for p, b, g, lo, _ in launches])
        graph()
        assert out.view(F32).tolist() == [16.0, 20.0, 24.0, 28.0]
        graph = dev.graph(launches)  # (the values are only written here: these kernels take none)
        table = graph.table.view(np.uint64)
        entry, chunks = k.program().address, max(1, int(k.global_size[0]))
        want = [[entry, chunks, 0, 4, data_address(mid), data_address(view), 7, 9],
                [entry, chunks, 1, 2, data_address(out), data_address(mid)]]
        assert data_address(view) == src.address + 16
        for row, words in zip(table, want):
            assert row[:len(words)].tolist() == words and not row[len(words):].any()
    finally:
        for h, n in ((src, 32), (mid, 16), (out, 16)):
            dev.allocator.free(h, n)
