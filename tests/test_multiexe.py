"""Device lists as one saved executable (issue 21 item 0, branch multiexe): device-list packages (format version 3,
tgc/package.py: MultiPackage) round trip against numpy, the program cache serves device lists (a warm run lowers
nothing), repeated runs replay (each device's launches as its graph), clear errors for a package whose devices
are missing, unique kernel names per executable, and profile tracks named with each device's index."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clikit import assert_clean, invoke

import tgc
from tgc import cache, progcache
from tgc.engine.executable import StepsPlan
from tgc.package import FORMAT_VERSION, MultiPackage, PackageError, load_package, loads_package, write

# a sharded matmul (all-reduce when the contraction is split), a sum over it, a slice: launches, copies, collectives
SRC = "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b, sum(a @ b), a[0:3] * 2\n"
DIMS = {"M": 7, "K": 5, "N": 4}


def _inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((7, 5)).astype(np.float32), "b": rng.standard_normal((5, 4)).astype(np.float32)}


def _check(out: dict[str, np.ndarray], x: dict[str, np.ndarray]) -> None:
    want = x["a"].astype(np.float64) @ x["b"]
    np.testing.assert_allclose(out["out0"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["out1"], want.sum(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["out2"], x["a"][0:3] * 2)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("TGC_VERIFY_BOUNDS", "DISABLE_COMPILER_CACHE", "BEAM", "NOOPT", "DEBUG", "TGC_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    cache._reset_for_tests()
    yield
    cache._reset_for_tests()


def _opencl_or_skip() -> None:
    from langkit import device_skip_reason

    why = device_skip_reason("OPENCL")
    if why:
        pytest.skip(why)


@pytest.mark.parametrize("device,shard", [("CPU:0,CPU:1", {"a": 1, "b": 0}), ("CPU:0,CPU:1", {"a": 0}),
                                          ("OPENCL:0,CPU:1", {"b": 1})])
def test_device_list_package_round_trip_matches_numpy_and_replays(tmp_path, device, shard):
    if "OPENCL" in device:
        _opencl_or_skip()
    path = tmp_path / "m.tgpkg"
    written = write(tgc.loads(SRC), path, device, DIMS, shard=shard)
    assert isinstance(written, MultiPackage)
    pkg = load_package(path)
    assert isinstance(pkg, MultiPackage) and pkg.device_names == device.split(",") and pkg.shard == shard
    assert json.loads(__import__("zipfile").ZipFile(path).read("manifest.json"))["format_version"] == 3
    kinds = {type(s).__name__ for s in pkg.steps}
    assert "Launch" in kinds and (kinds & {"Copy", "Collective"})  # (launches and the list's own steps)
    for seed in range(3):  # 1st: a walk; 2nd: the plan is made (buffers kept, graphs captured); 3rd: replayed
        x = _inputs(seed)
        _check(pkg.run(**x), x)
    (plan,) = pkg._launch_plans.plans.values()
    assert isinstance(plan, StepsPlan) and plan.runs == 2
    cpu = [d for d, dev in enumerate(plan.exe.devices) if dev.kind == "CPU"]
    assert any(g is not None for (seg, d), g in plan.graphs.items() if d in cpu)  # CPU launches ran as graphs
    pkg.release()
    assert not pkg._launch_plans.plans


def test_single_device_packages_keep_format_version_1(tmp_path):
    pkg = write(tgc.loads(SRC), tmp_path / "one.tgpkg", "CPU", DIMS)
    assert FORMAT_VERSION == 1 and pkg.manifest["format_version"] == 1 and not isinstance(pkg, MultiPackage)
    x = _inputs()
    _check(pkg.run(**x), x)


def test_program_run_on_a_list_replays_with_the_same_results():
    prog = tgc.loads(SRC)
    for seed in (0, 1, 1, 2):
        x = _inputs(seed)
        _check(prog.run(device="CPU:0,CPU:1", shard={"a": 0}, **x), x)
    plans = [p for p in prog._launch_plans.plans.values() if isinstance(p, StepsPlan)]
    assert len(plans) == 1 and plans[0].runs == 3


def test_warm_run_on_a_list_comes_from_the_program_cache_without_lowering(monkeypatch):
    x = _inputs()
    _check(tgc.loads(SRC).run(device="CPU:0,CPU:1", shard={"a": 1, "b": 0}, **x), x)
    assert len(cache.entries("program")) == 1
    prog = tgc.loads(SRC)
    assert prog.cached("CPU:0,CPU:1", DIMS, shard={"a": 1, "b": 0})
    # the key holds the shard spec and the device list: another of either misses
    assert not prog.cached("CPU:0,CPU:1", DIMS, shard={"a": 0})
    assert not prog.cached("CPU:0,CPU:1,CPU:2", DIMS, shard={"a": 1, "b": 0})
    assert not prog.cached("CPU:1,CPU:0", DIMS, shard={"a": 1, "b": 0})

    def no_lowering(*a, **k):
        raise AssertionError("a warm run lowered a kernel")

    monkeypatch.setattr(tgc.api, "build_kernel", no_lowering)
    monkeypatch.setattr(tgc.api, "create_schedule", no_lowering)
    monkeypatch.setattr(tgc.Program, "_lower_multi", no_lowering)
    for seed in range(3):  # and again: the entry's package replays
        x = _inputs(seed)
        _check(prog.run(device="CPU:0,CPU:1", shard={"a": 1, "b": 0}, **x), x)


def test_a_damaged_list_entry_is_a_miss_with_a_warning_and_is_rebuilt(capsys):
    x = _inputs()
    _check(tgc.loads(SRC).run(device="CPU:0,CPU:1", shard={"a": 0}, **x), x)
    names = ["CPU:0", "CPU:1"]
    k = progcache.list_key(SRC, DIMS, progcache.list_devices(names), names, {"a": 0})
    value = cache.get(progcache.TABLE, k)
    cache.put(progcache.TABLE, k, value[:-200] + bytes(200), meta="damaged")
    _check(tgc.loads(SRC).run(device="CPU:0,CPU:1", shard={"a": 0}, **x), x)  # the right answer, rebuilt
    assert "warning" in capsys.readouterr().err
    assert progcache.lookup_list(SRC, DIMS, progcache.list_devices(names), names, {"a": 0}) is not None


def test_cli_compile_package_run_and_warm_run_on_a_list(tmp_path):
    prog = tmp_path / "p.tg"
    prog.write_text(SRC)
    pkg = tmp_path / "p.tgpkg"
    dims = ["-D", "M=7", "-D", "K=5", "-D", "N=4"]
    r = invoke("compile", str(prog), *dims, "-d", "CPU:0,CPU:1", "--shard", "a=0", "--package", str(pkg))
    assert r.exit_code == 0 and "CPU:0,CPU:1" in r.stderr, r.stderr
    x = _inputs()
    np.savez(tmp_path / "in.npz", **x)
    r = invoke("run", str(pkg), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"))
    assert r.exit_code == 0, r.stderr
    _check(dict(np.load(tmp_path / "out.npz")), x)
    r = invoke("inspect", str(pkg))
    assert r.exit_code == 0 and "CPU:1" in r.stdout and "a along axis 0" in r.stdout, r.stdout
    # a warm tgc run on the list: the program cache's entry, said at DEBUG=2
    run = ("run", str(prog), *dims, "-d", "CPU:0,CPU:1", "--shard", "a=0", "--random")
    assert invoke(*run).exit_code == 0
    r = invoke(*run, env={"DEBUG": "2"})
    assert r.exit_code == 0 and "program cache hit" in r.stderr, r.stderr


def test_a_package_for_devices_this_machine_lacks_is_one_clear_error(tmp_path):
    path = tmp_path / "m.tgpkg"
    write(tgc.loads(SRC), path, "CPU:0,CPU:1", DIMS, shard={"a": 0})
    pkg = load_package(path)
    x = _inputs()
    with pytest.raises(PackageError, match="compiled for the device list CPU:0,CPU:1"):
        pkg.run(device="CPU:0", **x)
    # the same package as if written for a device list with a METAL device (none on Linux)
    import zipfile

    from tgc.package import MANIFEST, file_checksum

    z = zipfile.ZipFile(path)
    manifest = json.loads(z.read(MANIFEST))
    manifest["devices"][1].update(kind="METAL", name="METAL:0")
    manifest["content_hash"] = __import__("tgc.package", fromlist=["content_hash"]).content_hash(manifest)
    members = {n: z.read(n) for n in z.namelist() if n != MANIFEST}
    import io

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as w:
        w.writestr(MANIFEST, json.dumps(manifest))
        for n, data in members.items():
            w.writestr(n, data)
        w.comment = b"0" * 64
    data = out.getvalue()
    data = data[:-64] + file_checksum(data)
    moved = tmp_path / "metal.tgpkg"
    moved.write_bytes(data)
    other = loads_package(data, str(moved))
    from tgc.backends import device_class

    if device_class("METAL").probe()[0]:
        pytest.skip("this machine has a METAL device")
    with pytest.raises(PackageError, match="METAL:0 is not available here"):
        other.run(**x)
    np.savez(tmp_path / "in.npz", **x)
    r = invoke("run", str(moved), "--inputs", str(tmp_path / "in.npz"))
    assert_clean(r, 2, "METAL:0 is not available here")
    assert_clean(invoke("run", str(path), "--inputs", str(tmp_path / "in.npz"), "-d", "CPU:0"), 2,
                 "compiled for the device list CPU:0,CPU:1")
    assert_clean(invoke("run", str(path), "--inputs", str(tmp_path / "in.npz"), "--shard", "a=1"), 2,
                 "holds its shard spec")


def test_a_tampered_step_is_refused_on_load(tmp_path):


    path = tmp_path / "m.tgpkg"
    write(tgc.loads(SRC), path, "CPU:0,CPU:1", DIMS, shard={"a": 1, "b": 0})

    def copy_into_an_input(manifest: dict) -> None:
        copy = next(s for s in manifest["steps"] if s[0] == "copy")
        copy[4] = next(i for i, b in enumerate(manifest["parts"][copy[3]]["buffers"]) if b["role"] == "input")

    with pytest.raises(PackageError, match="step"):
        loads_package(_rewrite(path, copy_into_an_input))


def test_kernel_names_are_unique_per_executable():
    # two different kernels of one shape on one device (a row sum and a row max of 6x4): once r_6_4 and r_6_4
    prog = tgc.loads("x: f32[6, 4]\nreturn sum(x, axis=1), x.max(axis=1)\n")
    launches = prog.device_kernels("CPU:0,CPU:1", {}, shard={"x": 0})
    by_name: dict[str, set] = {}
    for _dev, k in launches:
        by_name.setdefault(k.name, set()).add(k.src.replace(k.name, "NAME"))
    assert all(len(srcs) == 1 for srcs in by_name.values()), by_name  # one name: one kernel's code
    assert len(by_name) >= 2
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    out = prog.run(device="CPU:0,CPU:1", shard={"x": 0}, x=x)
    np.testing.assert_allclose(out["out0"], x.sum(axis=1))
    np.testing.assert_allclose(out["out1"], x.max(axis=1))


def test_profile_of_a_list_names_every_device_track_with_its_index(tmp_path):
    _opencl_or_skip()
    x = _inputs()
    trace = tmp_path / "t.json"
    with tgc.profiling(str(trace)):
        _check(tgc.loads(SRC).run(device="CPU:0,OPENCL:0", shard={"a": 0}, **x), x)
    doc = json.loads(trace.read_text())
    procs = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert {"CPU:0", "OPENCL:0"} <= procs and "OPENCL" not in procs, procs


from clikit import WARM_CLI as WARM  # noqa: E402


def test_a_warm_tgc_run_on_a_list_imports_neither_llvmlite_nor_the_front_end(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("TGC_VERIFY_BOUNDS", "DEBUG", "BEAM", "NOOPT")}
    env["TGC_CACHE_DIR"] = str(tmp_path / "cache")
    prog = tmp_path / "p.tg"
    prog.write_text(SRC)
    args = ["run", str(prog), "--random", "-D", "M=7", "-D", "K=5", "-D", "N=4", "-d", "CPU:0,CPU:1",
            "--shard", "a=1", "--shard", "b=0", "-o", str(tmp_path / "out.npz")]
    root = Path(__file__).resolve().parent.parent
    runs = [subprocess.run([sys.executable, "-c", WARM, *args], capture_output=True, text=True, env=env, cwd=root,
                           timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert "llvmlite" in runs[0].stderr.split("HEAVY ")[-1]  # (the cold run compiled)
    assert runs[1].stderr.split("HEAVY ")[-1].strip() == "", runs[1].stderr
    out = dict(np.load(tmp_path / "out.npz"))
    from tgc.engine.inputs import random_values

    x = {"a": random_values(tgc.dtype.dtypes.f32, [7, 5], 0, 0), "b": random_values(tgc.dtype.dtypes.f32, [5, 4], 0, 1)}
    _check(out, x)


def _rewrite(path, edit) -> bytes:
    """The package at `path` with `edit(manifest)` applied, its content hash and checksum recomputed."""
    import io
    import zipfile

    from tgc.package import MANIFEST, content_hash, file_checksum

    z = zipfile.ZipFile(path)
    manifest = json.loads(z.read(MANIFEST))
    edit(manifest)
    manifest["content_hash"] = content_hash(manifest)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as w:
        w.writestr(MANIFEST, json.dumps(manifest))
        for n in z.namelist():
            if n != MANIFEST:
                w.writestr(n, z.read(n))
        w.comment = b"0" * 64
    data = out.getvalue()
    return data[:-64] + file_checksum(data)


def test_edited_dims_of_a_device_list_package_are_refused(tmp_path):
    path = tmp_path / "m.tgpkg"
    write(tgc.loads(SRC), path, "CPU:0,CPU:1", {**DIMS, "UNUSED": 3}, shard={"a": 0})
    assert load_package(path).dims == DIMS  # (a -D the program lacks is not one of its dims)
    edits = {"M": lambda m: m["dims"].update(M=8), "extra": lambda m: m["dims"].update(Z=2),
             "dropped": lambda m: m["dims"].pop("N"),
             "declared": lambda m: m["signature"]["inputs"][0].pop("declared")}
    for why, edit in edits.items():
        bad = tmp_path / f"{why}.tgpkg"
        bad.write_bytes(_rewrite(path, edit))
        with pytest.raises(PackageError):
            load_package(bad)
        r = invoke("inspect", str(bad))
        assert_clean(r, 2, str(bad))
        assert r.stderr.count("error:") == 1, r.stderr
    r = invoke("inspect", str(tmp_path / "M.tgpkg"))
    assert "M=8" in r.stderr and "[7, 5]" in r.stderr, r.stderr
    assert "dim Z" in invoke("inspect", str(tmp_path / "extra.tgpkg")).stderr


def test_a_negative_shard_axis_is_a_warm_program_cache_hit(tmp_path):
    from tgc.cli import shardaxes
    from tgc.cli.main import _warm_entry

    assert shardaxes.declared_ranks("s: f32\nv: i32[N]\nm: f32[3, K]\nreturn m * s\n") == {"s": 0, "v": 1, "m": 2}
    assert shardaxes.normalize(SRC, {"a": -1, "b": 0}) == {"a": 1, "b": 0}
    assert shardaxes.normalize(SRC, {"a": -3}) is None and shardaxes.normalize(SRC, {"c": -1}) is None
    prog = tmp_path / "p.tg"
    prog.write_text(SRC)
    run = ("run", str(prog), "-D", "M=7", "-D", "K=5", "-D", "N=4", "-d", "CPU:0,CPU:1", "--random")
    assert invoke(*run, "--shard", "a=0").exit_code == 0  # cold: stores the entry of a along axis 0

    def warm(axis: int):  # (the command line's lookup before it reads the program with the front end)
        return _warm_entry(str(prog), "CPU:0,CPU:1", DIMS, {"a": axis}, lists=True)

    assert warm(0) is not None and warm(-2) is not None  # the same axis, counted from the end
    assert warm(-1) is None and warm(1) is None  # axis 1: another entry, not yet stored
    assert invoke(*run, "--shard", "a=-1").exit_code == 0
    assert warm(-1) is not None and warm(1) is not None
    assert_clean(invoke(*run, "--shard", "a=-3"), 2, "axis -3")
