"""Fixes from a new user's review of the integrated branch: each test failed before its fix.

- A device-list package on REMOTE servers: a server that is down (or refuses the token) is the same device
  error (exit 1) as on a `.tg` device list and a one-device REMOTE package, whichever server of the list it is,
  not "not available here" (exit 2) for REMOTE:0 only.
- A device-list package whose `shard` field disagrees with its input parts (an edited manifest with its hashes
  recomputed) is refused, so `tgc inspect` never shows a shard spec the package does not run."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from tgc.backends.remote.process import ServerProcess

SOFTMAX = "x: f32[N, D]\nm = x.max(axis=1, keepdim=True)\ne = exp(x - m)\nreturn e / e.sum(axis=1, keepdim=True)\n"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tgc.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def _dead_address() -> str:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def remote_list_package(tmp_path_factory):
    d = tmp_path_factory.mktemp("rpkg")
    (d / "s.tg").write_text(SOFTMAX)
    x = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    np.save(d / "x.npy", x)
    with ServerProcess("CPU") as server:
        env = {"TGC_REMOTE": server.address}  # one server: REMOTE:0 and REMOTE:1 are two sessions there
        r = _cli("compile", str(d / "s.tg"), "-D", "N=6", "-D", "D=8", "-d", "REMOTE:0,REMOTE:1", "--shard", "x=0",
                 "--package", str(d / "r.tgpkg"), env=env)
        assert r.returncode == 0, r.stderr
        yield d, server, x


@pytest.mark.parametrize("dead_index", [0, 1])
def test_a_remote_list_package_with_a_server_down_is_a_device_error(remote_list_package, dead_index):
    d, server, x = remote_list_package
    addrs = [server.address, server.address]
    addrs[dead_index] = dead = _dead_address()
    r = _cli("run", str(d / "r.tgpkg"), "-i", f"x={d / 'x.npy'}", env={"TGC_REMOTE": ",".join(addrs)})
    assert r.returncode == 1, r.stderr
    assert f"cannot reach REMOTE server {dead}" in r.stderr and "Traceback" not in r.stderr


def test_a_remote_list_package_still_runs_right(remote_list_package):
    d, server, x = remote_list_package
    r = _cli("run", str(d / "r.tgpkg"), "-i", f"x={d / 'x.npy'}", "-o", str(d / "o.npy"),
             env={"TGC_REMOTE": server.address})
    assert r.returncode == 0, r.stderr
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(np.load(d / "o.npy"), e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def _rewrite(data: bytes, edit) -> bytes:
    """The package with its manifest edited by `edit` and every hash recomputed (not a signature)."""
    from tgc import package as P

    z = zipfile.ZipFile(io.BytesIO(data))
    members = {n: z.read(n) for n in z.namelist()}
    m = json.loads(members.pop(P.MANIFEST))
    edit(m)
    for n, b in members.items():
        m["files"][n] = {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
    m["content_hash"] = P.content_hash(m)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as w:
        for n, b in [(P.MANIFEST, json.dumps(m).encode()), *members.items()]:
            w.writestr(n, b)
        w.comment = b"0" * P.CHECKSUM_LEN
    data = out.getvalue()
    return data[:-P.CHECKSUM_LEN] + P.file_checksum(data)


@pytest.mark.parametrize("shard", [{"x": 1}, {}])
def test_a_shard_spec_that_disagrees_with_the_input_parts_is_refused(tmp_path, shard):
    import tgc
    from tgc.package import PackageError, loads_package, write

    prog = tgc.loads(SOFTMAX)
    path = tmp_path / "m.tgpkg"
    write(prog, path, "CPU:0,CPU:1", {"N": 4, "D": 8}, shard={"x": 0})
    data = path.read_bytes()
    assert loads_package(_rewrite(data, lambda m: None)).shard == {"x": 0}  # the rewrite alone is accepted
    with pytest.raises(PackageError, match="shard"):
        loads_package(_rewrite(data, lambda m: m.__setitem__("shard", shard)))


@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (2, 0)])
def test_the_check_reference_of_a_sum_of_products_over_an_empty_axis(shape):
    # `x[:, 1:] * 2` summed is a contraction; at D=1 its axis is empty: `--check` crashed (IndexError) there
    import tgc

    prog = tgc.loads("x: f32[N, D]\nreturn (x[:, 1:] * 2).sum(axis=1) + x[:, :1].sum(axis=1)\n"
                     if shape[1] else "x: f32[N, D]\nw: f32[D]\nreturn (x * w).sum(axis=1)\n")
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    arrays = {"x": x} if shape[1] else {"x": x, "w": np.ones(shape[1], np.float32)}
    values, scales = prog.reference_with_scale(dims={"N": shape[0], "D": shape[1]}, **arrays)
    want = (x[:, 1:] * 2).sum(axis=1) + x[:, :1].sum(axis=1) if shape[1] else np.zeros(shape[0])
    np.testing.assert_allclose(np.asarray(values["out0"]).reshape(-1), want, rtol=1e-6)
    assert np.all(np.isfinite(np.asarray(scales["out0"])))


def test_a_symbolic_package_whose_buffer_can_be_empty_loads_and_runs(tmp_path):
    # x[2:] has N-2 elements: its byte size, an expression of N, is 0 at N=2; the package failed its own check
    # on load ("buffer 0 bytes is not an integer in [1, ...]"), so `tgc compile --package` wrote an unusable file
    import tgc
    from tgc.package import write

    prog = tgc.loads("x: f32[N]\nreturn x[2:] + x[:-2]\n")
    path = tmp_path / "s.tgpkg"
    write(prog, path, "CPU", None)
    pkg = tgc.load_package(path)
    for n in (7, 4, 33, 1):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        np.testing.assert_allclose(pkg.run(x=x)["out0"], x[2:] + x[:-2], rtol=1e-6)


def test_a_package_that_fails_its_own_load_checks_is_not_written(tmp_path, monkeypatch):
    # such a package (the empty-buffer bug above) was written, then refused as "damaged ... compile it again",
    # exit 2: now nothing is written and the error says it is tgc's fault (exit 1)
    import tgc
    from tgc import package

    def build_damaged(*args, **kwargs) -> bytes:
        data = bytearray(real_build(*args, **kwargs))
        data[-1] ^= 1  # (its checksum no longer matches)
        return bytes(data)

    real_build = package.build
    monkeypatch.setattr(package, "build", build_damaged)
    path = tmp_path / "p.tgpkg"
    with pytest.raises(tgc.TgcError, match="internal error: the package built for .* fails the checks") as e:
        package.write(tgc.loads("x: f32[N]\nreturn x + 1\n"), path, "CPU", {"N": 4})
    assert e.value.exit_code == 1 and not path.exists() and not list(tmp_path.iterdir())


def test_a_device_list_package_bench_names_the_list_it_ran_on(tmp_path):
    # the bench document said "CPU,CPU:1" (no index) and its identity the packaged list, whatever -d named
    import tgc
    from tgc.package import write

    path = tmp_path / "m.tgpkg"
    write(tgc.loads(SOFTMAX), path, "CPU:0,CPU:1", {"N": 4, "D": 8}, shard={"x": 0})
    pkg = tgc.load_package(path)
    doc = pkg.bench(repeat=1)
    assert doc["device"] == doc["identity"]["device"] == "CPU:0,CPU:1" and doc["identity"]["shard"] == {"x": 0}
    doc = pkg.bench(device="CPU:0,CPU:3", repeat=1)
    assert doc["device"] == doc["identity"]["device"] == "CPU:0,CPU:3"


def test_cache_list_names_a_device_list_entry_s_shard_spec(tmp_path):
    # two entries of one list and dims, sharded along different axes, were listed alike
    (tmp_path / "s.tg").write_text(SOFTMAX)
    env = {"TGC_CACHE_DIR": str(tmp_path / "cache"), "TGC_VERIFY_BOUNDS": "0"}  # (bounds checks: not cached)
    for axis in ("0", "1"):
        r = _cli("run", str(tmp_path / "s.tg"), "--random", "-D", "N=4", "-D", "D=6", "-d", "CPU:0,CPU:1",
                 "--shard", f"x={axis}", env=env)
        assert r.returncode == 0, r.stderr
    listed = _cli("cache", "list", "--table", "program", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "shard x=0" in listed.stdout and "shard x=1" in listed.stdout, listed.stdout
