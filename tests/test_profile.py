"""Profile traces (`tgc run|bench --profile`, `tgc.profiling`): the trace validates against the trace-event
format (tests/trace_check.py), its kernels carry their args and match the program's launches, graphs show
their kernels, compiles sit on the compile track, multi-device runs show collectives with bytes, REMOTE runs
show client and server spans, and the error paths of --profile."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from clikit import assert_clean, invoke
from trace_check import kernel_spans, problems, process_names, thread_names

import tgc
from tgc import profile
from tgc.backends.remote import protocol as P

# a matmul and a column sum of its result: two kernels (a reduction over another axis cannot fuse)
MATMUL_SUM = "a: f32[M, K]\nb: f32[K, N]\nc = a @ b\nreturn c, sum(c, axis=0)\n"


def _inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((6, 5)).astype(np.float32), "b": rng.standard_normal((5, 4)).astype(np.float32)}


# --- the checker itself catches broken traces


def test_checker_rejects_what_perfetto_would_misdraw():
    ok = {"traceEvents": [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "CPU"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "kernels"}},
        {"name": "outer", "ph": "X", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"name": "inner", "ph": "X", "ts": 2, "dur": 3, "pid": 1, "tid": 1}], "displayTimeUnit": "ms"}
    assert problems(ok) == []
    overlap = json.loads(json.dumps(ok))
    overlap["traceEvents"][3]["dur"] = 20
    assert any("without nesting" in p for p in problems(overlap))
    negative = json.loads(json.dumps(ok))
    negative["traceEvents"][2]["dur"] = -1
    assert any("dur" in p for p in problems(negative))
    unnamed = json.loads(json.dumps(ok))
    del unnamed["traceEvents"][1]
    assert any("no thread_name" in p for p in problems(unnamed))
    assert problems({"traceEvents": [], "displayTimeUnit": "s"})
    assert problems([]) == ["the document is not an object with a traceEvents list"]


# --- a run through the Python API


def test_api_trace_has_each_kernel_launch_with_its_args_and_the_graph_run_shows_its_kernels(tmp_path):
    prog = tgc.loads(MATMUL_SUM)
    x = _inputs()
    kernels = prog.compile(device="CPU", dims={"M": 6, "K": 5, "N": 4})
    assert len(kernels) >= 2
    path = tmp_path / "t.json"
    with tgc.profiling(path) as prof:
        first = prog.run(device="CPU", **x)
        second = prog.run(device="CPU", **x)  # the second run at these dims: a launch plan run as a device graph
    assert profile.active is None  # off again after the block
    for out in (first, second):
        np.testing.assert_allclose(out["c"], x["a"] @ x["b"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["out1"], (x["a"] @ x["b"]).sum(axis=0), rtol=1e-5, atol=1e-4)
    doc = json.loads(path.read_text())
    assert problems(doc) == []
    assert len(prof.events) == len(doc["traceEvents"])
    spans = kernel_spans(doc, "CPU")
    measured = [e for e in spans if not e["args"].get("approximated")]
    graph_children = [e for e in spans if e["args"].get("approximated")]
    # the first run: every kernel launched once, in order, with its own args
    assert [e["name"] for e in measured] == [k.name for k in kernels]
    for e, k in zip(measured, kernels):
        a = e["args"]
        assert a["global_size"] == list(k.global_size) and a["flops"] == k.flops and a["bytes"] == k.bytes_moved
        assert a["opts"] == [str(o) for o in k.opts] and a["timer"] in ("device", "host")
        assert e["dur"] > 0 and a["gflops_per_s"] == pytest.approx(k.flops / (e["dur"] * 1e-6) / 1e9, rel=0.01)
    # the second run: one graph span holding one child per kernel, in order, splitting its time
    graphs = [e for e in doc["traceEvents"] if e.get("cat") == "graph"]
    assert len(graphs) == 1 and graphs[0]["args"]["kernels"] == len(kernels)
    g = graphs[0]
    assert [e["name"] for e in graph_children] == [k.name for k in kernels]
    for e in graph_children:
        assert g["ts"] <= e["ts"] and e["ts"] + e["dur"] <= g["ts"] + g["dur"] + 1e-3
    assert sum(e["dur"] for e in graph_children) == pytest.approx(g["dur"], abs=0.01)
    # copies: the second run copies the inputs in and the outputs out (the first one may run in place)
    copies = [e for e in doc["traceEvents"] if e.get("cat") == "copy"]
    nbytes = {e["args"]["bytes"] for e in copies if e["name"] == "copy in"}
    assert {6 * 5 * 4, 5 * 4 * 4} <= nbytes
    assert {6 * 4 * 4, 4 * 4} <= {e["args"]["bytes"] for e in copies if e["name"] == "copy out"}
    # two runs on the host track
    runs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"] == "run on CPU"]
    assert len(runs) == 2


def test_compile_track_has_each_kernel_built_with_its_phases_and_cache_result():
    src = MATMUL_SUM.replace("c, sum", "c * 3, sum")
    dims = {"M": 7, "K": 3, "N": 9}  # sizes no other test compiles: every kernel is new to the disk cache
    with tgc.profiling() as prof:
        ks = tgc.loads(src).compile(device="CPU", dims=dims)
    with tgc.profiling() as again:  # a new Program: the binaries come from the disk cache
        tgc.loads(src).compile(device="CPU", dims=dims)
    for p, cache in ((prof, "miss"), (again, "hit")):
        doc = p.doc()
        assert problems(doc) == []
        tracks = thread_names(doc)
        builds = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("build ")]
        assert [e["name"] for e in builds] == [f"build {k.name}" for k in ks]
        assert all(tracks[(e["pid"], e["tid"])] == "compile" and e["args"]["cache"] == cache for e in builds)
        phases = {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "compile"}
        assert {"schedule", "optimize", "render"} <= phases
        assert ("compile" in phases) == (cache == "miss")  # a cache hit runs no compiler


def test_profiling_off_records_nothing_and_costs_no_state():
    assert profile.active is None
    prog = tgc.loads("x: f32[N]\nreturn x * 2\n")
    with tgc.profiling() as prof:
        pass
    prog.run(device="CPU", x=np.ones(4, np.float32))
    assert prof.events == [] and profile.active is None


# --- the command line


def test_cli_bench_profile_counts_every_timed_launch(tmp_path, monkeypatch):
    from tgc.engine import bench  # (the machine's peak is not what this tests: measuring it takes seconds)
    monkeypatch.setattr(bench, "machine_peak", lambda dev, measure=True: {
        "gflops": None, "gbps": None, "source": "unknown", "cache_bytes": None})
    src = tmp_path / "mm.tg"
    src.write_text(MATMUL_SUM)
    path = tmp_path / "bench.json"
    r = invoke("bench", str(src), "-d", "CPU", "-D", "M=6", "-D", "K=5", "-D", "N=4", "--repeat", "2", "--json",
               "--profile", str(path))
    assert r.exit_code == 0, r.stderr
    result = json.loads(r.stdout)  # --json: stdout is the JSON document alone
    assert f"wrote {path}" in r.stderr
    doc = json.loads(path.read_text())
    assert problems(doc) == []
    names = [k["name"] for k in result["kernels"]]
    spans = kernel_spans(doc, "CPU")
    runs = 1 + 2  # warmup + repeat, each kernel on its own, then the whole program as many times
    assert len([e for e in spans if e["args"].get("warmup")]) == len(names) * (2 if result["program"]["graph"] else 1)
    for name in names:
        own = [e for e in spans if e["name"] == name and not e["args"].get("approximated")]
        inside = [e for e in spans if e["name"] == name and e["args"].get("approximated")]
        assert len(own) == runs
        assert len(inside) == (runs if result["program"]["graph"] else 0)
    graphs = [e for e in doc["traceEvents"] if e.get("cat") == "graph"]
    assert len(graphs) == (runs if result["program"]["graph"] else 0)
    host = {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "host"}
    assert {"bench: each kernel on CPU", "bench: whole program on CPU"} <= host


def test_cli_profile_to_a_missing_directory_is_refused_before_running(tmp_path):
    src = tmp_path / "p.tg"
    src.write_text("x: f32[N]\nreturn x + 1\n")
    r = invoke("run", str(src), "--random", "-D", "N=3", "--profile", str(tmp_path / "nope" / "t.json"))
    assert_clean(r, 2, "--profile", "does not exist")
    assert r.stdout == ""


def test_cli_profile_named_over_the_file_systems_limit_is_refused_before_running_with_its_own_advice(tmp_path):
    src = tmp_path / "p.tg"
    src.write_text("x: f32[N]\nreturn x + 1\n")
    r = invoke("run", str(src), "--random", "-D", "N=3", "--profile", str(tmp_path / ("t" * 300 + ".json")))
    assert_clean(r, 2, "--profile", "file name too long")
    assert "shorter file name" in r.stderr and "directory that exists" not in r.stderr
    assert r.stdout == ""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc here")
def test_cli_profile_to_a_directory_where_no_file_can_be_made_is_refused_before_running(tmp_path):
    """/proc takes no new file, even from root (for whom os.access says every directory is writable)."""
    src = tmp_path / "p.tg"
    src.write_text("x: f32[N]\nreturn x + 1\n")
    for opt, path in (("--profile", "/proc/tgc-trace.json"), ("-o", "/proc/tgc-out.npz")):
        r = invoke("run", str(src), "--random", "-D", "N=3", opt, path)
        assert_clean(r, 2, f"cannot write '{path}'")
        assert r.stdout == ""  # refused before the run
        assert not os.path.exists(path)


def test_cli_output_named_with_a_trailing_slash_is_refused_before_running(tmp_path):
    src = tmp_path / "p.tg"
    src.write_text("x: f32[N]\nreturn x + 1\n")
    r = invoke("run", str(src), "--random", "-D", "N=3", "--profile", str(tmp_path / "p.json") + "/")
    assert_clean(r, 2, "cannot end with '/'")
    assert r.stdout == "" and sorted(os.listdir(tmp_path)) == ["p.tg"]


def test_a_full_disk_met_by_the_output_check_is_a_runtime_failure(tmp_path, monkeypatch):
    """Exit 1 as when the write itself meets it (a full disk is not the user's mistake), never a probe file left."""
    import errno

    from tgc.cli import outputs
    from tgc.errors import TgcError

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "open", full)
    with pytest.raises(TgcError, match="no space left") as e:
        outputs.check_writable(str(tmp_path / "o.npz"))
    assert e.value.kind == "runtime"
    monkeypatch.undo()
    outputs.check_writable(str(tmp_path / "o.npz"))
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full (a file that is always full) here")
def test_cli_profile_that_fails_to_write_keeps_the_run_output(tmp_path):
    src = tmp_path / "p.tg"
    src.write_text("x: f32[N]\nreturn x + 1\n")
    out = tmp_path / "o.npz"
    r = invoke("run", str(src), "-i", f"x={_npy(tmp_path, np.arange(3, dtype=np.float32))}", "-o", str(out),
               "--profile", "/dev/full")
    assert r.exit_code == 1, r.stderr
    assert r.stderr.splitlines()[-2:] == [  # after the run's own lines: one error, no traceback
        "error: cannot write the profile trace '/dev/full': No space left on device",
        "  help: name a writable file for the trace (the run itself finished)"]
    np.testing.assert_array_equal(np.load(out)["out0"], np.arange(3, dtype=np.float32) + 1)
    r = invoke("run", str(src), "--random", "-D", "N=3", "--profile", "/dev/full")
    assert r.exit_code == 1 and "out0" in r.stdout  # the output table is printed before the trace fails


def _npy(tmp_path, arr: np.ndarray) -> str:
    p = tmp_path / "x.npy"
    np.save(p, arr)
    return str(p)


# --- many devices


def test_multi_device_trace_has_collectives_with_the_bytes_each_device_moved(tmp_path):
    prog = tgc.loads(MATMUL_SUM)
    x = _inputs(1)
    with tgc.profiling() as prof:  # K split across two devices: the product is all-reduced
        out = prog.run(device="CPU:0,CPU:1", shard={"a": 1, "b": 0}, **x)
    np.testing.assert_allclose(out["c"], x["a"] @ x["b"], rtol=1e-5, atol=1e-5)
    doc = prof.doc()
    assert problems(doc) == []
    procs = process_names(doc)
    coll = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "collective"
            and procs[e["pid"]] in ("CPU:0", "CPU:1")]
    assert {procs[e["pid"]] for e in coll} == {"CPU:0", "CPU:1"}
    # a ring all-reduce of n=2 devices: each sends and receives 2(n-1)/n of the f32[6, 4] product
    reduce = [e for e in coll if e["name"].startswith("all-reduce")]
    assert len(reduce) == 2
    assert all(e["args"]["sent_bytes"] == 6 * 4 * 4 and e["args"]["received_bytes"] == 6 * 4 * 4 for e in reduce)
    assert {procs[e["pid"]] for e in doc["traceEvents"] if e.get("ph") == "C"} == {"CPU:0", "CPU:1"}
    for dev in ("CPU:0", "CPU:1"):  # every kernel launch on its device's track
        assert kernel_spans(doc, dev)


# --- REMOTE


def test_remote_trace_has_client_round_trips_and_the_servers_own_spans(remote_server, tmp_path):
    from tgc import backends
    for key in [k for k in backends._instances if k[0] == "REMOTE"]:
        backends._instances.pop(key).close()
    prog = tgc.loads(MATMUL_SUM)
    x = _inputs(2)
    with tgc.profiling() as prof:
        out = prog.run(device="REMOTE", **x)
    np.testing.assert_allclose(out["c"], x["a"] @ x["b"], rtol=1e-5, atol=1e-5)
    doc = prof.doc()
    assert problems(doc) == []
    procs, tracks = process_names(doc), thread_names(doc)
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    client = [e for e in xs if tracks[(e["pid"], e["tid"])].startswith("REMOTE client")]
    server = [e for e in xs if procs[e["pid"]].startswith("REMOTE server")]
    assert client and all(e["name"] == "POST /batch" for e in client)
    batches = [e for e in server if e["name"].startswith("batch of")]
    assert len(batches) == len(client)  # one server batch per round trip
    for c, b in zip(sorted(client, key=lambda e: e["ts"]), sorted(batches, key=lambda e: e["ts"])):
        assert c["ts"] <= b["ts"] and b["ts"] + b["dur"] <= c["ts"] + c["dur"] + 1e-3  # inside its round trip
    assert {"ProgramExec", "CopyIn", "CopyOut"} <= {e["name"].split(" x")[0] for e in server}
    assert len([e for e in doc["traceEvents"] if e.get("ph") == "s"]) == len(client)  # an arrow each
    launched = kernel_spans(doc, "REMOTE")
    assert len(launched) == len(prog.compile(device="CPU", dims={"M": 6, "K": 5, "N": 4}))
    assert all(e["args"]["timer"] == "device" for e in launched)  # the server's device timed them


def test_server_timing_header_round_trips_and_rejects_anything_else():
    entries = [("Decode", 1, 1_000, 3_500), ("ProgramExec", 3, 3_500, 10_000)]
    text = P.timing_header(entries, 0)
    assert P.parse_timing(text) == [("Decode", 1, 1.0, 2.5), ("ProgramExec", 3, 3.5, 6.5)]
    for bad in ("Decode;1;1.0", "x;1;1;1,<script>;1;1;1", "Decode;1;-1;2", "", None, "a;1;1;1" + ",a;1;1;1" * 20000):
        assert P.parse_timing(bad) == []
    many = [("CopyIn", 1, i * 1000, i * 1000 + 500) for i in range(P.MAX_TIMINGS + 50)]
    parsed = P.parse_timing(P.timing_header(many, 0))
    assert len(parsed) == P.MAX_TIMINGS and parsed[-1][0] == "Rest" and parsed[-1][1] == 51


# --- the summary of a trace


def test_summary_orders_kernels_by_total_time_with_exact_shares():
    doc = {"traceEvents": [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "CPU"}},
        {"name": "a", "cat": "kernel", "ph": "X", "ts": 0, "dur": 10, "pid": 1, "tid": 1,
         "args": {"flops": 1000, "bytes": 40}},
        {"name": "b", "cat": "kernel", "ph": "X", "ts": 20, "dur": 30, "pid": 1, "tid": 1,
         "args": {"flops": 0, "bytes": 300}},
        {"name": "a", "cat": "kernel", "ph": "X", "ts": 60, "dur": 10, "pid": 1, "tid": 1,
         "args": {"flops": 1000, "bytes": 40, "approximated": True}},
        {"name": "b", "cat": "kernel", "ph": "X", "ts": 80, "dur": 500, "pid": 1, "tid": 1,
         "args": {"flops": 0, "bytes": 300, "warmup": True}},
        {"name": "copy in", "cat": "copy", "ph": "X", "ts": 0, "dur": 99, "pid": 1, "tid": 2}],
        "displayTimeUnit": "ms"}
    rows = profile.summarize(doc)
    assert [(r["name"], r["launches"], r["total_us"]) for r in rows] == [("b", 1, 30), ("a", 2, 20)]
    assert rows[0]["share"] == pytest.approx(0.6) and rows[1]["share"] == pytest.approx(0.4)
    assert rows[1]["gflops_per_s"] == pytest.approx(2000 / 20e-6 / 1e9) and rows[1]["approximated"] == 1
    table = profile.summary_markdown(rows)
    assert rows[1]["mean_us"] == 10 and rows[1]["median_us"] == 10
    assert table.splitlines()[2].startswith("| b | CPU | 1 | 0 | 30.0 us | 30.0 us | 30.0 us | 60.0% |")
    assert len(table.splitlines()) == 4
    assert profile.summarize(doc, warmup=True)[0]["total_us"] == 530  # the warm-up launch, when asked for


# --- Perfetto's own trace processor, where it can run here


def test_perfetto_trace_processor_loads_the_trace(tmp_path):
    """The trace as written loads in Perfetto's trace processor with one slice per complete event. Where the
    package or its trace_processor_shell is missing (this offline machine: the package downloads the shell on
    first use), the same file is still checked against the trace-event format before the test skips."""
    prog = tgc.loads(MATMUL_SUM)
    path = tmp_path / "t.json"
    with tgc.profiling(path):
        prog.run(device="CPU", **_inputs())
    doc = json.loads(path.read_text())
    assert problems(doc) == [] and kernel_spans(doc, "CPU")
    tp_mod = pytest.importorskip("perfetto.trace_processor", reason="the perfetto package is not installed")
    shell = os.environ.get("TGC_TRACE_PROCESSOR") or shutil.which("trace_processor_shell")
    config = tp_mod.TraceProcessorConfig(bin_path=shell, load_timeout=20) if shell else None
    if config is None:
        cached = os.path.expanduser("~/.local/share/perfetto/prebuilts")
        if not (os.path.isdir(cached) and any(n.startswith("trace_processor_shell") for n in os.listdir(cached))):
            pytest.skip("perfetto's trace_processor_shell is not on this machine and the package would download "
                        "it (offline here); set TGC_TRACE_PROCESSOR to a local binary")
        config = tp_mod.TraceProcessorConfig(load_timeout=20)
    try:
        tp = tp_mod.TraceProcessor(trace=str(path), config=config)
    except Exception as e:  # noqa: BLE001 - the shell failed to start: say why
        pytest.skip(f"perfetto's trace processor did not start: {type(e).__name__}: {e}")
    try:
        slices = list(tp.query("select name, dur from slice"))
    finally:
        tp.close()
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert len(slices) == len(xs)
    assert {s.name for s in slices} == {e["name"] for e in xs}


def test_compiles_in_worker_processes_are_on_the_compile_track(monkeypatch):
    from tgc.codegen import kernel
    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")  # every kernel compiles
    monkeypatch.setattr(kernel, "PARALLEL_MIN_SOURCE", 0)  # these kernels are small: send them all
    monkeypatch.setenv("TGC_JOBS", "2")
    with tgc.profiling() as prof:
        ks = tgc.loads(MATMUL_SUM.replace("c, sum", "c + 1, sum")).compile("CPU", {"M": 3, "K": 2, "N": 5})
    doc = prof.doc()
    assert problems(doc) == []
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "compile"]
    in_worker = [e["name"].removeprefix("compiled in a worker: ") for e in xs if e["name"].startswith("compiled in")]
    here = [e for e in xs if e["name"] == "compile"]  # the compiler's phase in this process (the first kernel)
    assert in_worker and set(in_worker) <= {k.name for k in ks}
    assert len(in_worker) + len(here) == len(ks)
    assert all(e["args"]["worker_ms"] > 0 for e in xs if e["name"].startswith("compiled in"))


def test_cuda_launches_and_graphs_are_timed_by_cuda_events_through_the_stand_in():
    import cuda_standin
    why = cuda_standin.why_unavailable()
    if why is not None:
        pytest.skip(str(why))
    from test_cuda_standin import script_json
    out = script_json("""
        import json, numpy as np, tgc
        prog = tgc.loads("x: f32[N, D]\\nreturn x.max(axis=1) + 1, x * 2\\n")
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        with tgc.profiling() as prof:
            runs = [prog.run(device="CUDA", x=x) for _ in range(2)]  # the second: one CUDA graph launch
        print(json.dumps({"max": [r["out0"].tolist() for r in runs], "doc": prof.doc(),
                          "kernels": [k.name for k in prog.compile(device="CUDA", dims={"N": 3, "D": 4})]}))
    """)
    assert out["max"] == [[4.0, 8.0, 12.0]] * 2
    doc = out["doc"]
    assert problems(doc) == []
    spans = kernel_spans(doc, "CUDA")
    own = [e for e in spans if not e["args"].get("approximated")]
    assert [e["name"] for e in own] == out["kernels"] and all(e["args"]["timer"] == "device" for e in own)
    graphs = [e for e in doc["traceEvents"] if e.get("cat") == "graph"]
    assert len(graphs) == 1 and graphs[0]["args"]["timer"] == "device"
    assert [e["name"] for e in spans if e["args"].get("approximated")] == out["kernels"]


def test_trace_summary_script_reads_a_written_trace_and_refuses_other_files(tmp_path, capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "trace_summary", os.path.join(os.path.dirname(__file__), "..", "tools", "trace_summary.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    prog = tgc.loads(MATMUL_SUM)
    path = tmp_path / "t.json"
    with tgc.profiling(path):
        prog.run(device="CPU", **_inputs())
    assert script.main([str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = [k.name for k in prog.compile(device="CPU", dims={"M": 6, "K": 5, "N": 4})]
    assert sorted(r["name"] for r in rows) == sorted(names) and all(r["launches"] == 1 for r in rows)
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert script.main([str(bad)]) == 2
    assert "is not a readable trace" in capsys.readouterr().err


def test_trace_timeline_draws_every_span_at_its_depth_and_refuses_other_files(tmp_path, capsys):
    """tools/trace_timeline.py (the README's trace picture): one bar per complete event in the window, a nested span
    one row below its parent, a bar's width its duration, instants as marks; a file that is not a trace: exit 2."""
    import importlib.util
    import re
    spec = importlib.util.spec_from_file_location(
        "trace_timeline", os.path.join(os.path.dirname(__file__), "..", "tools", "trace_timeline.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    doc = {"displayTimeUnit": "ms", "traceEvents": [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "CPU"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "kernels"}},
        {"name": "graph", "ph": "X", "ts": 0, "dur": 1000, "pid": 1, "tid": 1},
        {"name": "k1", "ph": "X", "ts": 100, "dur": 400, "pid": 1, "tid": 1},
        {"name": "k2", "ph": "X", "ts": 500, "dur": 500, "pid": 1, "tid": 1},
        {"name": "copy", "ph": "i", "ts": 1500, "pid": 1, "tid": 1},
        {"name": "late", "ph": "X", "ts": 5000, "dur": 10, "pid": 1, "tid": 1}]}
    assert problems(doc) == []
    path, out = tmp_path / "t.json", tmp_path / "t.html"
    path.write_text(json.dumps(doc))
    assert script.main([str(path), str(out), "--width", "1230", "--from", "0", "--to", "2"]) == 0
    page = out.read_text()
    bars = re.findall(r'<g class="span"><rect x="([\d.]+)" y="(\d+)" width="([\d.]+)"', page)
    assert len(bars) == 3 and "late" not in page  # (outside the window)
    (gx, gy, gw), (ax, ay, aw), (bx, by, bw) = [(float(x), int(y), float(w)) for x, y, w in bars]
    assert ay == by == gy + script.ROW and gw == 2 * bw and abs(aw - 0.8 * bw) < 0.2 and ax < bx
    assert page.count('<g class="instant">') == 1 and ">CPU<" in page and ">kernels<" in page
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert script.main([str(bad), str(out)]) == 2
    assert "is not a readable trace" in capsys.readouterr().err


def test_a_command_run_from_a_removed_directory_is_one_clear_error(tmp_path, monkeypatch):
    src = tmp_path / "p.tg"
    src.write_text("x: f32[N]\nreturn x + 1\n")
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    r = invoke("run", str(src), "--random", "-D", "N=3", "-o", "o.npz")
    assert_clean(r, 2, "current directory no longer exists")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc here")
def test_compile_into_a_directory_where_no_file_can_be_made_is_refused_before_compiling(tmp_path):
    src = tmp_path / "p.tg"
    src.write_text("x: f32[N]\nreturn x + 1\n")
    r = invoke("compile", str(src), "-D", "N=3", "-o", "/proc")
    assert_clean(r, 2, "-o /proc: cannot write into the directory")
    assert r.stdout == ""  # no kernel printed or compiled first
