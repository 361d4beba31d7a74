"""Compiled packages (`tgc compile --package`, tgc/package.py), planned memory (tgc/engine/memplan.py) and size
expressions (tgc/sizeexpr.py): a package runs in a fresh process without the source, without compiling and
without llvmlite, with the results of the `.tg` run; a damaged or tampered package is refused with one clear
error (exit 2); the planned peak memory is what a run allocates."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import tgc
from tgc import package, sizeexpr
from tgc.engine.memplan import MemoryPlan, check_plan, lifetimes, plan_memory
from tgc.package import PackageError, content_hash, loads_package

ROOT = pathlib.Path(__file__).resolve().parent.parent
TGC = [sys.executable, "-m", "tgc.cli.main"]
MLP = ROOT / "kernels" / "mlp.tg"
MLP_DIMS = {"B": 4, "IN": 8, "HID": 16, "OUT": 8}


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*TGC, *map(str, args)], capture_output=True, text=True, env=_env(), cwd=cwd, timeout=120)


def _inputs(prog, dims, seed=0) -> dict:
    from tgc.engine.inputs import random_inputs
    return prog.bind(random_inputs(prog, dims, seed), dims)[1]


@pytest.fixture(scope="module")
def mlp_pkg(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("pkg") / "mlp.tgpkg"
    package.write(tgc.load(MLP), path, "CPU", MLP_DIMS)
    return path


def _rezip(data: bytes, edit=None, rehash: bool = True, extra: dict | None = None) -> bytes:
    """The package with its manifest changed by `edit(manifest)` (and its content hash recomputed unless
    `rehash` is false), plus `extra` members."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(members["manifest.json"])
    if edit is not None:
        edit(manifest)
        if rehash:
            manifest["content_hash"] = content_hash(manifest)
    members["manifest.json"] = json.dumps(manifest).encode()
    members.update(extra or {})
    return _zip(members)


def _zip(members: dict) -> bytes:
    """A zip of `members` with a valid checksum (the last 64 bytes), so that the checks after it are reached."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for n, blob in members.items():
            z.writestr(n, blob)
        z.comment = b"0" * 64
    data = out.getvalue()
    return data[:-64] + package.file_checksum(data)


# --- running a package


def test_a_package_runs_like_the_program_in_a_fresh_process_without_compiling_or_llvmlite(mlp_pkg, tmp_path):
    prog = tgc.load(MLP)
    arrays = _inputs(prog, MLP_DIMS, seed=3)
    want = prog.run(device="CPU", **arrays)
    np.savez(tmp_path / "in.npz", **arrays)
    script = (f"import sys, json, numpy as np, tgc\n"
              f"pkg = tgc.load_package({str(mlp_pkg)!r})\n"
              f"z = np.load({str(tmp_path / 'in.npz')!r})\n"
              f"out = pkg.run(**{{k: z[k] for k in z.files}})\n"
              f"np.savez({str(tmp_path / 'out.npz')!r}, **out)\n"
              f"print(json.dumps([m for m in sys.modules if m == 'llvmlite' or m.startswith(('tgc.codegen', "
              f"'tgc.api', 'tgc.dsl'))]))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []  # no llvmlite, no compiler, no parser: nothing compiles
    with np.load(tmp_path / "out.npz") as z:
        assert list(z.files) == list(want)
        for name in want:
            np.testing.assert_array_equal(z[name], want[name])


def test_tgc_run_and_bench_of_a_package_with_npy_inputs(mlp_pkg, tmp_path):
    prog = tgc.load(MLP)
    arrays = _inputs(prog, MLP_DIMS, seed=1)
    args = []
    for name, arr in arrays.items():
        np.save(tmp_path / f"{name}.npy", arr)
        args += ["-i", f"{name}={tmp_path / (name + '.npy')}"]
    a = _cli("run", mlp_pkg, *args, "-o", tmp_path / "a.npz")
    b = _cli("run", MLP, *args, "-o", tmp_path / "b.npz")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    with np.load(tmp_path / "a.npz") as za, np.load(tmp_path / "b.npz") as zb:
        assert za.files == zb.files
        for k in za.files:
            np.testing.assert_array_equal(za[k], zb[k])
    d_args = [a for k, v in MLP_DIMS.items() for a in ("-D", f"{k}={v}")]
    a = _cli("run", mlp_pkg, "--random", "--seed", "2", "-o", tmp_path / "ra.npz")
    b = _cli("run", MLP, "--random", "--seed", "2", *d_args, "-o", tmp_path / "rb.npz")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    with np.load(tmp_path / "ra.npz") as za, np.load(tmp_path / "rb.npz") as zb:
        np.testing.assert_array_equal(za["logp"], zb["logp"])  # the same random inputs as for the source
    bench = _cli("bench", mlp_pkg, "--repeat", "2", "--json")
    assert bench.returncode == 0, bench.stderr
    doc = json.loads(bench.stdout)
    assert [r["name"] for r in doc["kernels"]] == [k.name for k in tgc.load_package(mlp_pkg).kernels]


def test_package_run_errors_are_clear(mlp_pkg):
    pkg = tgc.load_package(mlp_pkg)
    with pytest.raises(tgc.TgcError, match="missing input 'x'"):
        pkg.run()
    arrays = _inputs(tgc.load(MLP), MLP_DIMS)
    with pytest.raises(tgc.TgcError, match="axis 0 has size 5"):
        pkg.run(**{**arrays, "x": np.zeros((5, 8), np.float32)})
    with pytest.raises(tgc.TgcError, match="compiled for B = 4"):
        pkg.run(dims={"B": 5}, **arrays)
    with pytest.raises(tgc.TgcError, match="compiled for CPU, not PYTHON"):
        pkg.run(device="PYTHON", **arrays)
    r = _cli("run", mlp_pkg, "--random", "--check")
    assert r.returncode == 2 and "--check needs the program's source" in r.stderr


def test_inspect_json_and_text(mlp_pkg):
    r = _cli("inspect", mlp_pkg, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    pkg = tgc.load_package(mlp_pkg)
    assert doc["format_version"] == package.FORMAT_VERSION and doc["device"]["kind"] == "CPU"
    assert doc["dims"] == MLP_DIMS
    assert [d["name"] for d in doc["inputs"]] == ["x", "w1", "b1", "w2", "b2"]
    assert doc["inputs"][0] == {"name": "x", "dtype": "f32", "shape": [4, 8], "declared": ["B", "IN"]}
    assert [d["shape"] for d in doc["outputs"]] == [[4, 8]]
    assert [k["name"] for k in doc["kernels"]] == [k.name for k in pkg.kernels] and len(doc["kernels"]) >= 2
    assert [b["role"] for b in doc["buffers"]].count("temp") == 2
    temps = [b["slot"] for b in doc["buffers"] if b["role"] in ("temp", "output")]
    assert len(set(temps)) < len(temps)  # an output reuses a dead intermediate's allocation
    mem = doc["memory"]
    assert mem["peak_bytes"] == sum(mem["slots"]) == pkg.peak_bytes
    assert mem["peak_bytes"] < mem["unshared_bytes"]  # the intermediates share memory
    r = _cli("inspect", MLP)
    assert r.returncode == 2 and "is not a package" in r.stderr
    text = _cli("inspect", mlp_pkg)
    assert text.returncode == 0 and "planned peak" in text.stdout and "x            f32[B, IN] = [4, 8]" in text.stdout


def test_compile_package_cli(tmp_path):
    out = tmp_path / "sm.tgpkg"
    r = _cli("compile", ROOT / "kernels" / "softmax.tg", "-D", "N=3", "-D", "D=5", "--package", out)
    assert r.returncode == 0 and "wrote" in r.stderr and out.exists(), r.stderr
    again = tmp_path / "again.tgpkg"
    _cli("compile", ROOT / "kernels" / "softmax.tg", "-D", "N=3", "-D", "D=5", "--package", again)
    assert out.read_bytes() == again.read_bytes()  # deterministic bytes
    r = _cli("compile", ROOT / "kernels" / "softmax.tg", "-D", "N=3", "--package", out)
    assert r.returncode == 2 and "dim D is unknown" in r.stderr
    r = _cli("compile", ROOT / "kernels" / "softmax.tg", "-D", "N=3", "-D", "D=5", "--package", out, "--emit", "uops")
    assert r.returncode == 2


# --- tampering and damage


def _refused(data: bytes, match: str) -> None:
    with pytest.raises(PackageError, match=match) as e:
        loads_package(data, "p.tgpkg")
    assert e.value.exit_code == 2


def test_every_flipped_byte_is_refused(mlp_pkg):
    data = mlp_pkg.read_bytes()
    step = max(1, len(data) // 300)
    for i in range(0, len(data), step):
        bad = bytearray(data)
        bad[i] ^= 0x20
        with pytest.raises(PackageError):
            loads_package(bytes(bad), "p.tgpkg")


def test_truncated_files_are_refused(mlp_pkg):
    data = mlp_pkg.read_bytes()
    for n in (0, 3, 4, 100, len(data) // 2, len(data) - 22, len(data) - 1):
        with pytest.raises(PackageError):
            loads_package(data[:n], "p.tgpkg")


def test_wrong_device_target_and_format_version(mlp_pkg):
    data = mlp_pkg.read_bytes()

    def kind(m):
        m["device"]["kind"] = m["device"]["name"] = "PYTHON"

    with pytest.raises(PackageError, match="compiled for PYTHON, not CPU"):
        loads_package(_rezip(data, kind)).run(device="CPU")

    def target(m):
        m["device"]["target"] = "x86_64-000000000000"

    with pytest.raises(PackageError, match="binaries for x86_64-000000000000"):
        loads_package(_rezip(data, target)).run()

    def version(m):
        m["format_version"] = 6  # (3 is a device list's package: tgc.package.MultiPackage; 2, 4 and 5 symbolic)

    _refused(_rezip(data, version), "package format version 6")
    _refused(_rezip(data, lambda m: m.update(format="zip")), "not a tgc package")


def test_cli_refuses_a_tampered_package_with_exit_2(mlp_pkg, tmp_path):
    bad = tmp_path / "bad.tgpkg"
    bad.write_bytes(mlp_pkg.read_bytes()[:-10])
    for cmd in ("run", "inspect", "bench"):
        r = _cli(cmd, bad)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
        assert "not a usable package" in r.stderr

    def version(m):
        m["format_version"] = 99

    bad.write_bytes(_rezip(mlp_pkg.read_bytes(), version))
    r = _cli("run", bad, "--random")
    assert r.returncode == 2 and "format version 99" in r.stderr
    r = _cli("run", mlp_pkg, "--random", "-d", "PYTHON")
    assert r.returncode == 2 and "compiled for CPU, not PYTHON" in r.stderr


def test_the_content_hash_covers_the_manifest_and_every_member(mlp_pkg):
    data = mlp_pkg.read_bytes()
    _refused(_rezip(data, lambda m: m["dims"].update(B=5), rehash=False), "content hash")
    _refused(_rezip(data, extra={"kernels/0.bin": b"\x7fELF" + b"\0" * 60}), "does not match its hash")
    _refused(_rezip(data, extra={"kernels/9.bin": b"x"}), "kernels/9.bin is not listed")


def test_unsafe_archives_are_refused(mlp_pkg):
    data = mlp_pkg.read_bytes()
    _refused(_rezip(data, extra={"../evil": b"x"}), "unexpected member")
    _refused(_rezip(data, extra={"/etc/passwd": b"x"}), "unexpected member")
    _refused(_rezip(data, extra={"kernels/7.src": b"\0" * (16 << 20)}), "expands more than")  # a zip bomb
    _refused(b"not a zip at all", "not a zip archive")
    _refused(_zip({"manifest.json": b"[1, 2"}), "not valid JSON")
    _refused(_zip({"manifest.json": b'{"format": "tgpkg", "format": "tgpkg"}'}), "a key appears twice")
    _refused(_zip({"manifest.json": b"{}", "manifest.json ": b"{}"}), "unexpected member")
    _refused(data[:-1] + (b"0" if data[-1:] != b"0" else b"1"), "checksum")


@pytest.mark.parametrize("edit, match", [
    (lambda m: m["buffers"][0].update(shape=[1 << 47, 1 << 47]), "more than"),
    (lambda m: m["buffers"][0].update(nbytes=4), "does not match its shape"),
    (lambda m: m["buffers"][0].update(shape=["__import__('os')", 8]), "is not a dim name"),
    (lambda m: m["buffers"][0].update(shape=[["**", 2, 64], 8]), "is not a size expression"),
    (lambda m: m["kernels"][0].update(bufs=[0, 999]), "kernel 0 buffer"),
    (lambda m: m["kernels"][0].update(name="../x"), "not a valid name"),
    (lambda m: m["kernels"][0].update(binary="manifest.json"), "not a member"),
    (lambda m: m["kernels"][0].update(global_size=[1 << 40, 1, 1]), "global size"),
    (lambda m: m["memory"].update(slot_of=[0] * len(m["memory"]["slot_of"])), "memory plan"),
    (lambda m: m["memory"].update(peak_bytes=1), "peak"),
    (lambda m: m["signature"]["inputs"][0].update(dtype="f16"), "does not match its buffer"),
    (lambda m: m.update(kernels="x"), "kernels is not a list"),
])
def test_bad_manifests_are_refused_before_use(mlp_pkg, edit, match):
    _refused(_rezip(mlp_pkg.read_bytes(), edit), match)


def _set_kernel(i: int, **fields):
    return lambda m: m["kernels"][i].update(fields)


@pytest.mark.parametrize("edit, match", [
    (_set_kernel(0, global_size=[4, 1, 1]), r"global size \[4, 1, 1\] is larger than the kernel's \[1, 1, 1\]"),
    (_set_kernel(0, bufs=[5, 0, 1]), "takes 4 buffers .*the plan gives 3"),
    (_set_kernel(0, bufs=[5, 0, 2, 1]), "buffer 2 .* has 64 bytes; the kernel needs 512"),
    (_set_kernel(0, vals=[3]), "takes 0 values .*the plan gives 1"),
    (_set_kernel(0, local_size=[1, 1, 1]), "local size .* is not the kernel's"),
    (_set_kernel(0, binary="runtime/cpu_graph.bin"), "is runtime/cpu_graph.bin, not a kernel binary"),
    (_set_kernel(0, source="runtime/cpu_graph.bin"), "not a kernel source"),
    (_set_kernel(0, binary="kernels/1.bin"), "are not one kernel's"),
    (_set_kernel(0, bufs=[0, 5, 1, 2]), "writes input 'x'"),
    (lambda m: m["memory"].update(inplace=[[7, 4]]), "writes over an input"),
])
def test_launches_that_break_their_kernels_contract_are_refused(mlp_pkg, edit, match):
    """Issue 25: a manifest edited with its hashes fixed (binaries unchanged) launched a kernel with another grid,
    buffer count, buffer sizes or values (segfaults, wrong output with exit 0), wrote into the caller's input
    (read in place), or ran the graph runner as a kernel (a hang). Every launch is checked against the launch
    contract that ends its kernel's source, and no kernel may write an input: refused on load, exit 2."""
    _refused(_rezip(mlp_pkg.read_bytes(), edit), match)


def test_cli_refuses_a_launch_that_breaks_its_contract_with_exit_2(mlp_pkg, tmp_path):
    bad = tmp_path / "bad.tgpkg"
    bad.write_bytes(_rezip(mlp_pkg.read_bytes(), _set_kernel(0, global_size=[64, 1, 1])))
    r = _cli("run", str(bad), "--random")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "larger than the kernel's" in r.stderr, r.stderr


def test_a_source_without_its_launch_contract_is_refused(mlp_pkg):
    data = mlp_pkg.read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = {n: z.read(n) for n in z.namelist()}
    src = members["kernels/0.src"].decode()
    body = src[:src.rindex("; tgc-launch:")]
    for text, match in ((body, "states no launch contract"),
                        (body + '; tgc-launch: {"bufs": 5}\n', "contract is malformed")):
        blob = text.encode()
        entry = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        _refused(_rezip(data, lambda m, e=entry: m["files"].update({"kernels/0.src": e}),
                        extra={"kernels/0.src": blob}), match)


# --- planned memory


def test_memory_plan_shares_buffers_whose_lifetimes_do_not_overlap():
    # kernels: k0 reads x writes a; k1 reads a writes b; k2 reads b writes c; k3 reads c writes out
    kb = [["x", "a"], ["a", "b"], ["b", "c"], ["c", "out"]]
    sizes = {"x": 100, "a": 64, "b": 64, "c": 32, "out": 16}
    plan = plan_memory(kb, sizes, inputs=["x"], outputs=["out"])
    assert lifetimes(kb, ["x"], ["out"]) == {"x": (-1, 4), "a": (0, 1), "b": (1, 2), "c": (2, 3), "out": (3, 4)}
    assert plan.slot_of["a"] == plan.slot_of["c"] and plan.slot_of["b"] == plan.slot_of["out"]
    assert plan.slot_of["a"] != plan.slot_of["b"] and plan.slot_of["x"] not in (plan.slot_of[k] for k in "abc")
    assert plan.peak_bytes == 100 + 64 + 64 < plan.unshared_bytes
    assert check_plan(plan) is None
    assert plan_memory(kb, sizes, ["x"], ["out"], share=False).peak_bytes == plan.unshared_bytes
    bad = MemoryPlan(slots=[64], slot_of={"a": 0, "b": 0}, sizes={"a": 64, "b": 64},
                     lifetimes={"a": (0, 1), "b": (1, 2)})
    assert "at the same time" in check_plan(bad)


def _suite_programs() -> list[tuple[str, dict]]:
    return [(str(MLP), MLP_DIMS), (str(ROOT / "kernels" / "softmax.tg"), {"N": 5, "D": 7}),
            (str(ROOT / "kernels" / "layernorm.tg"), None), (str(ROOT / "kernels" / "attention.tg"), None)]


@pytest.mark.parametrize("path, dims", _suite_programs())
def test_the_planned_peak_is_what_a_run_allocates(path, dims, tmp_path):
    prog = tgc.load(path)
    dims = dims or {d: 4 + i for i, d in enumerate(prog.dim_names)}
    arrays = _inputs(prog, dims)
    pkg = package.write(prog, tmp_path / "p.tgpkg", "CPU", dims)
    # the CPU runs aligned inputs in place (zero-copy): their slots of the plan are not allocated
    align = tgc.api._device("CPU").allocator.zero_copy_align
    borrowed = sum(a.nbytes for a in arrays.values() if a.nbytes and a.ctypes.data % align == 0)

    def run_source() -> None:  # (a program keeps its launch plan's buffers for the next run until released)
        prog.run(device="CPU", dims=dims, **arrays)
        prog.release()

    def run_package() -> None:  # (so does a package)
        pkg.run(**arrays)
        pkg.release()

    for runner in (run_source, run_package):
        alloc = tgc.api._device("CPU").allocator
        alloc.reset_peak()
        base = alloc.live_bytes
        runner()
        assert alloc.peak_bytes - base == pkg.peak_bytes - borrowed
        assert alloc.live_bytes == base  # everything freed (outputs handed to the user are no longer the pool's)
    assert prog.lower("CPU", dims).memory_plan().peak_bytes == pkg.peak_bytes


# --- size expressions


def test_size_expressions_are_data():
    assert sizeexpr.evaluate(["*", 3, "C"], {"C": 4}) == 12
    assert sizeexpr.evaluate(["//", ["+", "N", 3], 4], {"N": 5}) == 2
    assert sizeexpr.evaluate(["max", "N", 1], {"N": 0}) == 1
    assert sizeexpr.text(["*", 3, ["+", "C", 1]]) == "3 * (C + 1)"
    for bad, match in [("__import__('os').system('x')", "not a dim name"), (True, "not a size"),
                       (["pow", 2, 3], "not a size expression"), (1 << 70, "out of range"),
                       (["//", 1, 0], "division by zero"), ("M", "dim M is unknown"),
                       (["*", 1 << 40, 1 << 40], "out of range")]:
        with pytest.raises(sizeexpr.ExprError, match=match):
            sizeexpr.evaluate(bad, {"N": 1})
    deep: list | int = 1
    for _ in range(100):
        deep = ["+", deep, 1]
    with pytest.raises(sizeexpr.ExprError, match="too large"):
        sizeexpr.evaluate(deep, {})


# --- the language suite, packaged


@pytest.mark.slow
def test_every_language_suite_program_runs_from_its_package():
    """Every program the language suite runs on the CPU is packaged (tests/package_suite.py, in the session's one
    run of the suite: tests/suite_runs.py), then every package runs in one fresh process: same outputs, bit for
    bit, without llvmlite and without the compiler."""
    from suite_runs import language_suite_all

    runs = language_suite_all()
    for out, result in runs:
        assert result["returncode"] == 0 and (out / "index.jsonl").exists(), result["out"]
    check = subprocess.run([sys.executable, str(ROOT / "tests" / "package_suite.py"), *(str(out) for out, _ in runs)],
                           env=_env(), capture_output=True, text=True, timeout=1200)
    assert check.returncode == 0, check.stderr[-3000:]
    summary = json.loads(check.stdout)
    assert summary["packages"] > 300
    assert not summary["bad"], f"{len(summary['bad'])} packages differ:\n" + "\n".join(summary["bad"][:10])
    assert not summary["llvmlite"] and not summary["codegen"] and not summary["api"]


def test_a_device_whose_copies_move_whole_buffers_gets_one_slot_per_buffer():
    """REMOTE copies a whole buffer out (`shared_slots = False`): its plan shares nothing."""
    from types import SimpleNamespace

    from tgc.backends.remote.client import RemoteAllocator
    from tgc.engine.realize import plan_for

    prog = tgc.load(MLP)
    low = prog.lower("CPU", MLP_DIMS)
    shared = plan_for(low.device, low.kernels, low.inputs, low.outputs)
    assert RemoteAllocator.features.shared_slots is False
    alone = plan_for(SimpleNamespace(allocator=RemoteAllocator.__new__(RemoteAllocator)), low.kernels, low.inputs,
                     low.outputs)
    assert shared.peak_bytes < alone.peak_bytes == alone.unshared_bytes == shared.unshared_bytes


def test_a_cuda_package_runs_through_the_standin_driver(tmp_path):
    """CUDA without a GPU (tests/cuda_standin.py): a package of cubins for `cubin-sm_XX` runs with the CUDA
    allocator and gives the program's own CUDA results (the stand-in builds its host copies when NVRTC compiles,
    so the package is written and run in one process)."""
    import cuda_standin

    why = cuda_standin.why_unavailable()
    if why is not None:
        pytest.skip(str(why))
    code = f"""
import cuda_standin; cuda_standin.install()
import json, numpy as np, tgc
from tgc import package
from tgc.engine.inputs import random_inputs
prog = tgc.load({str(MLP)!r})
dims = {MLP_DIMS!r}
arrays = prog.bind(random_inputs(prog, dims), dims)[1]
want = prog.run(device="CUDA", dims=dims, **arrays)
package.write(prog, {str(tmp_path / "standin.tgpkg")!r}, "CUDA", dims)
pkg = tgc.load_package({str(tmp_path / "standin.tgpkg")!r})
got = pkg.run(**arrays)
print(json.dumps({{"same": all(np.array_equal(want[k], got[k]) for k in want), "target": pkg.target}}))
"""
    env = cuda_standin.env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["same"] and doc["target"].startswith("cubin-sm_")


def test_declared_shapes_keep_dim_names_and_fall_back_to_sizes():
    assert package._decl_shape(["N", 3, "3 * C", ["*", 3, "C"], object()], [4, 3, 12, 12, 7]) == \
        ["N", 3, 12, ["*", 3, "C"], 7]


# --- launch plans of packages run as device graphs


_GRAPH_SCRIPT = """
import sys, json, numpy as np, tgc
pkg = tgc.load_package(sys.argv[1])
z = np.load(sys.argv[2])
outs = [pkg.run(**{k: z[k] for k in z.files}) for _ in range(3)]
np.savez(sys.argv[3], **outs[-1])
same = all(np.array_equal(o[k], outs[0][k]) for o in outs for k in o)
print(json.dumps({"llvmlite": "llvmlite" in sys.modules, "same": same,
                  "compiled": [m for m in sys.modules if m.startswith(("tgc.codegen", "tgc.api", "tgc.dsl"))]}))
"""


def _graph_run(pkg_path, tmp_path, cache: str) -> tuple[dict, str]:
    prog = tgc.load(MLP)
    arrays = _inputs(prog, MLP_DIMS, seed=5)
    want = prog.run(device="CPU", **arrays)
    np.savez(tmp_path / "gin.npz", **arrays)
    env = {**_env(), "DEBUG": "2", "TGC_CACHE_DIR": str(tmp_path / cache)}  # an empty cache: no runner there
    proc = subprocess.run([sys.executable, "-c", _GRAPH_SCRIPT, str(pkg_path), str(tmp_path / "gin.npz"),
                           str(tmp_path / "gout.npz")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with np.load(tmp_path / "gout.npz") as z:
        for name in want:
            np.testing.assert_array_equal(z[name], want[name])
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_package_run_repeatedly_runs_as_one_cpu_graph_without_llvmlite(mlp_pkg, tmp_path):
    pkg = tgc.load_package(mlp_pkg)
    assert pkg.graph_runner is not None and pkg.describe()["graph_runner"] is True
    doc, err = _graph_run(mlp_pkg, tmp_path, "empty-cache")
    assert doc == {"llvmlite": False, "same": True, "compiled": []}
    n = len(pkg.kernels)
    assert f"graph of {n} kernels" in err and "ran in one launch" in err, err  # from the second run on
    assert err.count("ran in one launch") == 2


def test_a_package_without_a_usable_runner_launches_kernel_by_kernel(mlp_pkg, tmp_path):
    """A runner built for another table layout is not used; with no runner in the cache the package launches
    its kernels one by one (never compiling one): same results, no llvmlite."""
    def other_layout(m):
        m["graph_runner"]["ir_version"] = -1

    path = tmp_path / "old.tgpkg"
    path.write_bytes(_rezip(mlp_pkg.read_bytes(), other_layout))
    assert tgc.load_package(path).graph_runner is None
    doc, err = _graph_run(path, tmp_path, "empty-cache-2")
    assert doc == {"llvmlite": False, "same": True, "compiled": []}
    assert "ran in one launch" not in err and "no graph for" in err and "does not compile" in err, err


def test_tgc_bench_of_a_package_times_the_graph_without_llvmlite(mlp_pkg, tmp_path):
    code = ("import sys, atexit\n"
            "atexit.register(lambda: sys.stderr.write('LLVMLITE=%s\\n' % ('llvmlite' in sys.modules)))\n"
            "from tgc.cli.main import main\n"
            f"main([\"bench\", {str(mlp_pkg)!r}, \"--repeat\", \"2\", \"--json\"])\n")
    env = {**_env(), "TGC_CACHE_DIR": str(tmp_path / "empty-cache")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["program"]["graph"] is True
    assert "LLVMLITE=False" in proc.stderr


def test_a_tampered_graph_runner_is_refused(mlp_pkg):
    data = mlp_pkg.read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = {n: z.read(n) for n in z.namelist()}
    obj = members[package.RUNNER_MEMBER]
    members[package.RUNNER_MEMBER] = obj[:-1] + bytes([obj[-1] ^ 1])
    _refused(_zip(members), "does not match its hash")
    del members[package.RUNNER_MEMBER]
    _refused(_zip(members), "missing")


def test_compile_package_never_overwrites_the_program_or_a_file_that_is_not_a_package(tmp_path):
    src = tmp_path / "sm.tg"
    text = (ROOT / "kernels" / "softmax.tg").read_text()
    src.write_text(text)
    r = _cli("compile", str(src), "-D", "N=2", "-D", "D=3", "--package", str(src))
    assert r.returncode == 2 and "would overwrite the program" in r.stderr and "Traceback" not in r.stderr
    assert src.read_text() == text
    data = tmp_path / "x.npy"
    np.save(data, np.arange(6, dtype=np.float32))
    before = data.read_bytes()
    r = _cli("compile", str(src), "-D", "N=2", "-D", "D=3", "--package", str(data))
    assert r.returncode == 2 and "is not a tgc package; not overwriting it" in r.stderr
    assert data.read_bytes() == before
    pkg = tmp_path / "sm.tgpkg"  # an older package is replaced, as before, and a damaged one
    pkg.write_bytes(b"PK\x03\x04 truncated")
    for _ in range(2):
        r = _cli("compile", str(src), "-D", "N=2", "-D", "D=3", "--package", str(pkg))
        assert r.returncode == 0, r.stderr
    assert tgc.load_package(pkg).run(x=np.zeros((2, 3), np.float32))["out0"].shape == (2, 3)


def test_compile_package_writes_any_name_the_file_system_allows(tmp_path):
    """A package name of NAME_MAX bytes is legal (`check_writable` accepts it): it is written (staged under a
    shortened name, `tgc.files.stage`, as every output file is; the package writer's `NAME.tmpPID` was up to 11
    bytes longer and failed after the whole compile: "File name too long"), nothing else is left in the
    directory, a package written over keeps the file's mode, and it runs (softmax, against numpy)."""
    src = tmp_path / "sm.tg"
    src.write_text((ROOT / "kernels" / "softmax.tg").read_text())
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    pkg = tmp_path / ("p" * (limit - len(".tgpkg")) + ".tgpkg")
    assert len(os.fsencode(pkg.name)) == limit
    for _ in range(2):  # (the second writes over the first)
        r = _cli("compile", str(src), "-D", "N=2", "-D", "D=3", "--package", str(pkg))
        assert r.returncode == 0, r.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([src.name, pkg.name])
        pkg.chmod(0o640)
    assert pkg.stat().st_mode & 0o777 == 0o640
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    want = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(tgc.load_package(pkg).run(x=x)["out0"], want / want.sum(axis=1, keepdims=True),
                               rtol=1e-5, atol=1e-7)


def test_compile_package_warns_once_about_a_dim_the_program_lacks(tmp_path):
    r = _cli("compile", str(ROOT / "kernels" / "softmax.tg"), "-D", "N=2", "-D", "D=3", "-D", "Q=3",
             "--package", str(tmp_path / "p.tgpkg"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("the program has no dim Q") == 1, r.stderr  # was printed twice


def test_run_never_writes_an_output_over_the_program_or_package(tmp_path):
    src = tmp_path / "sm.tg"
    text = (ROOT / "kernels" / "softmax.tg").read_text()
    src.write_text(text)
    r = _cli("run", str(src), "--random", "-D", "N=2", "-D", "D=3", "-o", f"out0={src}")
    assert r.returncode == 2 and "would overwrite the program" in r.stderr, r.stderr  # was "wrote sm.tg"
    assert src.read_text() == text
    pkg = tmp_path / "sm.tgpkg"
    assert _cli("compile", str(src), "-D", "N=2", "-D", "D=3", "--package", str(pkg)).returncode == 0
    before = pkg.read_bytes()
    r = _cli("run", str(pkg), "--random", "-o", f"out0={pkg}")
    assert r.returncode == 2 and "would overwrite the program" in r.stderr, r.stderr
    assert pkg.read_bytes() == before


def test_packages_signed_with_a_users_key(tmp_path, monkeypatch):
    """With TGC_PACKAGE_KEY, packages are written with an HMAC of their content hash and every package loaded must
    carry that key's: an unsigned one, one signed with another key, and one edited with its hashes fixed (the
    signature no longer matches) are refused (exit 2). Without it the signature is not needed."""
    key, other = tmp_path / "key", tmp_path / "other"
    key.write_text("a secret of my own\n")
    other.write_text("someone else's\n")
    prog = tgc.loads("x: f32[N]\nreturn x * 2\n")
    plain = package.build(prog, "CPU", {"N": 4})
    monkeypatch.setenv("TGC_PACKAGE_KEY", str(key))
    signed = package.build(prog, "CPU", {"N": 4})
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(loads_package(signed, "s.tgpkg").run(x=x)["out0"], x * 2)
    _refused(plain, "carries no signature")
    _refused(_rezip(signed, lambda m: m["kernels"][0].update(name="edited")), "is not signed with that key")
    monkeypatch.setenv("TGC_PACKAGE_KEY", str(other))
    _refused(signed, "is not signed with that key")
    path = tmp_path / "s.tgpkg"
    path.write_bytes(signed)
    r = subprocess.run([*TGC, "inspect", str(path)], capture_output=True, text=True, timeout=120,
                       env={**_env(), "TGC_PACKAGE_KEY": str(other)})
    assert r.returncode == 2 and "TGC_PACKAGE_KEY" in r.stderr and "Traceback" not in r.stderr, r.stderr
    monkeypatch.delenv("TGC_PACKAGE_KEY")
    assert loads_package(plain, "p.tgpkg") and loads_package(signed, "s.tgpkg")
    monkeypatch.setenv("TGC_PACKAGE_KEY", str(tmp_path / "missing"))
    with pytest.raises(tgc.TgcError, match="cannot read the package key file") as e:
        loads_package(signed, "s.tgpkg")
    assert e.value.exit_code == 2
