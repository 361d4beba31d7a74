"""`tgc bench` / `Program.bench` / a device-list package's `bench` on a device list (issue 21 item 0, branch
benchlist): every timed run is a replay (`executable.StepsPlan`: each device's buffers allocated once, its runs of
launches as its device graph), the outputs of those runs equal numpy, and a warm bench comes from the program
cache's entry without lowering anything (in-process: the lowering functions refuse; as a whole `tgc bench`
process: neither llvmlite nor the front end is imported)."""

from __future__ import annotations

import json

import numpy as np
import pytest

# a sharded matmul (all-reduce when the contraction is split), a sum over it, a slice: launches, copies, collectives
from test_multiexe import DIMS, SRC, _check, _inputs  # the device-list program both files run

import tgc
from tgc import cache, progcache
from tgc.engine import executable, realize
from tgc.package import write

LIST = "CPU:0,CPU:1"
SHARD = {"a": 1, "b": 0}


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("TGC_VERIFY_BOUNDS", "DISABLE_COMPILER_CACHE", "BEAM", "NOOPT", "DEBUG", "TGC_DEVICE", "TGC_GRAPH"):
        monkeypatch.delenv(name, raising=False)
    cache._reset_for_tests()
    yield
    cache._reset_for_tests()


class Spy:
    """Records what every step walk of a bench ran with (its plan) and gave (its outputs), and every device
    allocation: the real functions run underneath."""

    def __init__(self, monkeypatch):
        self.walks: list[tuple[object, dict]] = []
        self.allocations = 0
        real_walk, real_alloc = executable._run_steps, realize.allocate_device

        def walk(exe, arrays, timed=False, plan=None):
            r = real_walk(exe, arrays, timed, plan)
            self.walks.append((plan, r.outputs))
            return r

        def alloc(exe, d, buffers):
            self.allocations += 1
            return real_alloc(exe, d, buffers)

        monkeypatch.setattr(executable, "_run_steps", walk)
        monkeypatch.setattr(realize, "allocate_device", alloc)

    def check(self, x: dict[str, np.ndarray], runs: int, devices: int = 2) -> None:
        """`runs` walks, all over one plan (buffers allocated once per device), each with numpy's outputs."""
        assert len(self.walks) == runs
        plans = {id(p) for p, _ in self.walks}
        assert len(plans) == 1 and self.walks[0][0] is not None, "every bench run replays one StepsPlan"
        assert self.allocations == devices
        for _, out in self.walks:
            _check(out, x)


def _figures(doc: dict) -> None:
    """The figures of a bench on LIST sharded as SHARD (their meaning: per device, collectives, program)."""
    assert doc["devices"] == ["CPU:0", "CPU:1"] and doc["identity"]["shard"] == SHARD
    assert [k["device"] for k in doc["kernels"][:2]] == ["CPU:0", "CPU:1"]
    coll = doc["collectives"]
    assert coll["steps"] == ["allreduce"]  # the contraction axis is split: one all-reduce of f32[7, 4]
    assert coll["sent_bytes"] == [2 * 7 * 4 * 4 // 2] * 2  # 2(n-1)/n of the tensor each, n = 2
    assert coll["median_s"] > 0 and doc["program"]["median_s"] > 0
    assert doc["program"]["flops"] == sum(k["flops"] for k in doc["kernels"] if "device" in k)


def test_program_bench_on_a_list_replays_one_plan_with_numpys_outputs(monkeypatch):
    x = _inputs()
    spy = Spy(monkeypatch)
    doc = tgc.loads(SRC).bench(device=LIST, shard=SHARD, inputs=x, repeat=3, warmup=1)
    spy.check(x, runs=4)
    _figures(doc)
    assert doc["program"]["graph"] is True  # each CPU's runs of launches ran as its graph


def test_bench_without_device_graphs_launches_one_by_one_with_the_same_outputs(monkeypatch):
    monkeypatch.setenv("TGC_GRAPH", "0")
    x = _inputs(1)
    spy = Spy(monkeypatch)
    doc = tgc.loads(SRC).bench(device=LIST, shard=SHARD, inputs=x, repeat=2, warmup=0)
    spy.check(x, runs=2)
    assert doc["program"]["graph"] is False


def test_warm_bench_on_a_list_comes_from_the_program_cache_without_lowering(monkeypatch):
    x = _inputs(2)
    cold = tgc.loads(SRC).bench(device=LIST, shard=SHARD, inputs=x, repeat=2)
    assert len(cache.entries("program")) == 1  # the cold bench stored the list's entry
    prog = tgc.loads(SRC)
    assert prog.cached(LIST, DIMS, shard=SHARD)

    def no_lowering(*a, **k):
        raise AssertionError("a warm bench lowered a kernel")

    monkeypatch.setattr(tgc.api, "build_kernel", no_lowering)
    monkeypatch.setattr(tgc.api, "create_schedule", no_lowering)
    monkeypatch.setattr(tgc.Program, "_lower_multi", no_lowering)
    spy = Spy(monkeypatch)
    warm = prog.bench(device=LIST, shard=SHARD, inputs=x, repeat=2, warmup=1)
    spy.check(x, runs=3)
    _figures(warm)
    _figures(cold)
    assert warm["shard"] == cold["shard"] == SHARD
    assert warm["identity"] == cold["identity"]  # (`--baseline` compares a warm timing with a cold one)
    assert [k["name"] for k in warm["kernels"]] == [k["name"] for k in cold["kernels"]]


def test_a_damaged_list_entry_is_a_miss_for_bench_with_one_warning(capsys, monkeypatch):
    x = _inputs()
    tgc.loads(SRC).bench(device=LIST, shard=SHARD, inputs=x, repeat=1)
    names = LIST.split(",")
    k = progcache.list_key(SRC, DIMS, progcache.list_devices(names), names, SHARD)
    cache.put(progcache.TABLE, k, cache.get(progcache.TABLE, k)[:-100], meta="truncated")
    spy = Spy(monkeypatch)
    _figures(tgc.loads(SRC).bench(device=LIST, shard=SHARD, inputs=x, repeat=1, warmup=0))
    spy.check(x, runs=1)  # the right outputs, lowered again
    assert capsys.readouterr().err.count("warning") == 1


def test_a_device_list_packages_bench_replays(tmp_path, monkeypatch):
    pkg = write(tgc.loads(SRC), tmp_path / "m.tgpkg", LIST, DIMS, shard=SHARD)
    x = _inputs(3)
    spy = Spy(monkeypatch)
    doc = pkg.bench(inputs=x, repeat=2, warmup=1)
    spy.check(x, runs=3)
    _figures(doc)


from clikit import WARM_CLI as WARM  # noqa: E402


def test_a_warm_tgc_bench_on_a_list_lowers_nothing(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("TGC_VERIFY_BOUNDS", "DEBUG", "BEAM", "NOOPT",
                                                             "TGC_GRAPH")}
    env["TGC_CACHE_DIR"] = str(tmp_path / "cache")
    prog = tmp_path / "p.tg"
    prog.write_text(SRC)
    args = ["bench", str(prog), "-D", "M=7", "-D", "K=5", "-D", "N=4", "-d", LIST, "--shard", "a=1", "--shard", "b=0",
            "--repeat", "2", "--json"]
    root = Path(__file__).resolve().parent.parent
    runs = [subprocess.run([sys.executable, "-c", WARM, *args], capture_output=True, text=True, env=env, cwd=root,
                           timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert "llvmlite" in runs[0].stderr.split("HEAVY ")[-1]  # (the cold bench compiled)
    assert runs[1].stderr.split("HEAVY ")[-1].strip() == "", runs[1].stderr
    cold, warm = (json.loads(r.stdout) for r in runs)
    _figures(cold)
    _figures(warm)
    assert warm["shard"] == cold["shard"] == SHARD
    assert warm["identity"] == cold["identity"] and warm["program"]["graph"] is True


def test_cli_warm_bench_on_a_list_compares_with_a_cold_baseline_and_refuses_another_devices(tmp_path):
    from clikit import assert_clean, invoke

    prog = tmp_path / "p.tg"
    prog.write_text(SRC)
    dims = ["-D", "M=7", "-D", "K=5", "-D", "N=4"]
    listed = ("bench", str(prog), *dims, "-d", LIST, "--shard", "a=1", "--shard", "b=0", "--repeat", "1")
    r = invoke(*listed, "--json")  # cold: lowered, timed, stored
    assert r.exit_code == 0, r.stderr
    (tmp_path / "list.json").write_text(r.stdout)
    doc = json.loads(r.stdout)
    doc["identity"]["device"] = "CPU"  # a baseline timed on one device (its identity names no list)
    (tmp_path / "one.json").write_text(json.dumps(doc))
    # warm (the entry, said at DEBUG=2) against the cold list's baseline: the same identity, so compared (a timing
    # may regress by chance: exit 0 or 1, never the refusal)
    r = invoke(*listed, "--baseline", str(tmp_path / "list.json"), env={"DEBUG": "2"})
    assert r.exit_code in (0, 1) and "program cache hit" in r.stderr, r.stderr
    assert "another" not in r.stderr and "collectives: allreduce" in r.stdout, r.stdout
    r = invoke(*listed, "--baseline", str(tmp_path / "one.json"))
    assert_clean(r, 2, "another device")
