"""A hostile user's pass over the command line and the API: every bad input is one clear error with the exit
status of CLI.md (usage and input errors: 2), never a traceback, a hang or a wrong result. Each test failed
before its fix (REMOTE addresses and settings, ONNX errors that name the model file and the node, a bench
`--repeat` that would time for ever)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest
from clikit import assert_clean, invoke

import tgc
from tgc.errors import TgcError

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = str(ROOT / "kernels" / "softmax.tg")
RUN_REMOTE = ["run", SOFTMAX, "--random", "-D", "N=4", "-D", "D=8", "-d", "REMOTE"]


# ---------------------------------------------------------------------------------------------------------------
# REMOTE: a missing or malformed address is the user's to fix (exit 2), checked before it reaches the environment


@pytest.fixture
def no_remote(monkeypatch):
    """No TGC_REMOTE, no --remote of an earlier test, no REMOTE device instance kept from one."""
    from tgc import backends
    from tgc.backends.remote.client import RemoteDevice

    monkeypatch.delenv("TGC_REMOTE", raising=False)
    monkeypatch.setattr(RemoteDevice, "_configured", None)
    for key in [k for k in backends._instances if k[0] == "REMOTE"]:
        monkeypatch.delitem(backends._instances, key)
    yield
    for key in [k for k in backends._instances if k[0] == "REMOTE"]:
        backends._instances.pop(key)


def test_remote_without_a_server_is_a_user_error(no_remote):
    assert_clean(invoke(*RUN_REMOTE), 2, "the REMOTE device needs a server", "--remote")


@pytest.mark.parametrize("address, words", [
    ("http://", ["bad REMOTE address 'http://'"]),
    ("::bad", ["bad REMOTE address '::bad'", "brackets"]),
    ("127.0.0.1:99999", ["bad port"]),
    ("127.0.0.1:6667,", ["bad REMOTE address ''"]),
])
def test_bad_remote_option_is_refused_before_it_reaches_the_environment(no_remote, address, words):
    assert_clean(invoke(*RUN_REMOTE, "--remote", address), 2, "--remote", *words)
    assert "TGC_REMOTE" not in os.environ


def test_bad_tgc_remote_is_a_user_error(no_remote):
    assert_clean(invoke(*RUN_REMOTE, env={"TGC_REMOTE": "::bad"}), 2, "TGC_REMOTE='::bad'", "brackets")


def test_parse_address_wants_an_ipv6_address_in_brackets():
    from tgc.env import parse_address

    assert parse_address("[::1]:7002") == ("::1", 7002)
    assert parse_address("notaurl") == ("notaurl", 6667)  # (a name: whether it resolves is known on connecting)
    for bad in ("::bad", "::1", "fe80::1:6667"):
        with pytest.raises(TgcError, match="bad REMOTE address") as e:
            parse_address(bad)
        assert "brackets" in (e.value.hint or "")


def test_a_host_name_that_names_no_host_is_a_user_error_without_retrying(no_remote, monkeypatch):
    from tgc.backends.remote import client

    tries = []

    def no_such_host(address, *a, **kw):
        tries.append(address)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(client.socket, "create_connection", no_such_host)
    r = invoke(*RUN_REMOTE, "--remote", "notaurl", env={"TGC_REMOTE_RETRY": "30"})
    assert_clean(r, 2, "bad REMOTE address notaurl:6667", "no host is called notaurl")
    assert tries == [("notaurl", 6667)]  # tried once, not retried for TGC_REMOTE_RETRY's 30 s


def test_a_refused_connection_stays_a_device_error(no_remote):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    r = invoke(*RUN_REMOTE, "--remote", dead, env={"TGC_REMOTE_RETRY": "0"})
    assert_clean(r, 1, f"cannot reach REMOTE server {dead}")


# ---------------------------------------------------------------------------------------------------------------
# ONNX: every error names the model file, and the node where one node is at fault


def _model(path: Path, nodes: list, ins: list, outs: list, inits: tuple = (), opset: int = 17) -> str:
    import onnx
    from onnx import helper

    m = helper.make_model(helper.make_graph(nodes, "g", ins, outs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return str(path)


def _vi(name: str, shape: list) -> object:
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_onnx_checker_complaint_names_the_node(tmp_path):
    from onnx import helper

    # a node reading a value nothing produced: the checker names the node on its message's second line
    f = _model(tmp_path / "dangling.onnx", [helper.make_node("Relu", ["zz"], ["y"], name="relu7")],
               [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    for cmd in ("run", "compile"):
        assert_clean(invoke(cmd, f, "--random") if cmd == "run" else invoke(cmd, f), 2,
                     "dangling.onnx", "the ONNX checker rejects the model", "relu7")
    assert_clean(invoke("inspect", f), 2, "dangling.onnx", "relu7")


def test_onnx_unsupported_op_names_the_model_file_and_node(tmp_path):
    from onnx import helper

    f = _model(tmp_path / "strings.onnx", [helper.make_node("RandomNormalLike", ["x"], ["y"], name="rnd3")],
               [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    assert_clean(invoke("run", f, "--random"), 2, "strings.onnx:", "unsupported op 'RandomNormalLike'", "rnd3")
    with pytest.raises(TgcError, match=r"^strings\.onnx: unsupported op .*rnd3"):
        tgc.load(f)


def test_onnx_error_in_the_translated_program_names_the_node(tmp_path):
    from onnx import helper

    # a Transpose whose perm names an axis the tensor lacks, and a MatMul of mismatched operands: the checker
    # passes both; the error is found in the translated .tg program, and said of the ONNX node
    f = _model(tmp_path / "perm.onnx", [helper.make_node("Transpose", ["x"], ["y"], name="tr0", perm=[0, 5])],
               [_vi("x", [2, 3])], [_vi("y", [3, 2])])
    assert_clean(invoke("run", f, "--random"), 2, "perm.onnx:", "out of range", "ONNX node Transpose 'tr0'")
    f = _model(tmp_path / "mm.onnx", [helper.make_node("MatMul", ["x", "x"], ["y"], name="mm0")],
               [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    assert_clean(invoke("compile", f), 2, "mm.onnx:", "inner dims differ", "ONNX node MatMul 'mm0'")


def test_onnx_error_at_the_run_dims_names_the_node(tmp_path):
    from onnx import helper

    # x: [N, 3] and z: [M, 3] added: fine where M == N, an error said of the Add node where they differ
    f = _model(tmp_path / "add.onnx", [helper.make_node("Add", ["x", "z"], ["y"], name="add9")],
               [_vi("x", ["N", 3]), _vi("z", ["M", 3])], [_vi("y", ["N", 3])])
    prog = tgc.load(f)
    ok = prog.run(x=np.ones((2, 3), np.float32), z=np.full((2, 3), 2, np.float32))
    np.testing.assert_array_equal(ok["y"], np.full((2, 3), 3, np.float32))
    r = invoke("run", f, "--random", "-D", "N=2", "-D", "M=4")
    assert_clean(r, 2, "add.onnx", "ONNX node Add 'add9'")


# ---------------------------------------------------------------------------------------------------------------
# sizes that loop: a bench count past any sensible one is refused at once


def test_bench_repeat_past_the_bound_is_refused(tmp_path):
    from tgc.engine.executable import MAX_REPEAT

    prog = tmp_path / "p.tg"
    prog.write_text("x: f32[4]\nreturn x + 1\n")
    assert_clean(invoke("bench", str(prog), "--repeat", str(2**63 - 1)), 2, "--repeat", str(MAX_REPEAT))
    with pytest.raises(TgcError, match="cannot time"):
        tgc.loads("x: f32[4]\nreturn x + 1\n").bench(repeat=MAX_REPEAT + 1, inputs={"x": np.ones(4, np.float32)})


# ---------------------------------------------------------------------------------------------------------------
# DEBUG=2: a count that is not known prints `-`, not 0


def test_debug_launch_line_prints_unknown_rates_as_a_dash(tmp_path):
    import re

    from tgc import package

    # a symbolic package's matmul at odd sizes: the package could not save its launches' flops and bytes
    src = tmp_path / "mm.tg"
    src.write_text("a: f32[M, K]\nb: f32[K, N]\nreturn relu(a @ b) + 1.0\n")
    package.write(tgc.load(str(src)), tmp_path / "mm.tgpkg", "CPU")
    r = invoke("run", str(tmp_path / "mm.tgpkg"), "--random", "-D", "M=37", "-D", "K=53", "-D", "N=29",
               env={"DEBUG": "2"})
    assert r.exit_code == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if " launch " in ln]
    assert lines, r.stderr
    for ln in lines:
        assert re.search(r" - GFLOP/s +- GB/s", ln) and "0.00 GFLOP/s" not in ln, ln
    # a kernel whose counts are known still prints its rates
    r = invoke("run", str(src), "--random", "-D", "M=4", "-D", "K=8", "-D", "N=4", env={"DEBUG": "2"})
    lines = [ln for ln in r.stderr.splitlines() if " launch " in ln]
    assert lines and all(re.search(r"\d+\.\d\d GFLOP/s +\d+\.\d\d GB/s", ln) for ln in lines), r.stderr


# ---------------------------------------------------------------------------------------------------------------
# program files that are not: a device that never ends, binary data


def test_a_program_file_that_never_ends_is_refused_not_read_into_memory(monkeypatch):
    import tgc.api

    monkeypatch.setattr(tgc.api, "MAX_SOURCE", 1 << 16)  # (the real bound, 64 Mi characters, the same way)
    for cmd in ("run", "compile"):
        assert_clean(invoke(cmd, "/dev/zero"), 2, "/dev/zero is not a .tg program", "over")


def test_a_binary_file_as_a_program_says_it_is_not_one(tmp_path):
    f = tmp_path / "x.npy"
    np.save(f, np.ones(3, np.float32))
    r = invoke("run", str(f), "--random")
    assert_clean(r, 2, "x.npy is not a .tg program", "not UTF-8 text")
    assert "codec" not in r.stderr


def test_a_program_read_from_a_pipe_runs(tmp_path):
    # `tgc run <(...)`: a pipe is no package, and its text is read once (not taken by a probe before the load)
    r_fd, w_fd = os.pipe()
    os.write(w_fd, b"x: f32[3]\nreturn x * 2.0\n")
    os.close(w_fd)
    try:
        r = invoke("run", f"/dev/fd/{r_fd}", "-i", f"x={_npy(tmp_path, np.arange(3, dtype=np.float32))}",
                   "-o", f"out0={tmp_path / 'o.npy'}")
    finally:
        os.close(r_fd)
    assert r.exit_code == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), np.array([0, 2, 4], np.float32))


def _npy(tmp_path: Path, arr: np.ndarray) -> str:
    path = tmp_path / "in.npy"
    np.save(path, arr)
    return str(path)


# ---------------------------------------------------------------------------------------------------------------
# tgc serve: a --host that is no address of this machine is a bad option


def test_serve_on_an_address_of_another_machine_is_a_user_error(tmp_path):
    tok = tmp_path / "token"
    tok.write_text("0123456789abcdef0123456789abcdef\n")
    tok.chmod(0o600)
    # 192.0.2.1: TEST-NET-1 (RFC 5737), never an address of this machine
    assert_clean(invoke("serve", "--host", "192.0.2.1", "--port", "0", "--token-file", str(tok)), 2,
                 "cannot listen on 192.0.2.1", "--host names an address of this machine")


def test_serve_on_a_port_in_use_stays_a_failure_to_serve():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = invoke("serve", "--host", "127.0.0.1", "--port", str(port))
    assert_clean(r, 1, f"cannot listen on 127.0.0.1:{port}")


# ---------------------------------------------------------------------------------------------------------------
# the Python API's dims: compile and bench check them as run does


def test_compile_refuses_a_dim_that_is_not_an_integer():
    prog = tgc.loads("x: f32[N]\nreturn x * 2.0\n")
    for bad in (2.5, True, "3", -2):
        with pytest.raises(TgcError, match="dim N must be a non-negative integer") as e:
            prog.compile(dims={"N": bad})  # (2.5 built kernels for N=2)
        assert e.value.kind == "user"
    assert [k.name for k in prog.compile(dims={"N": np.int64(8)})] == [k.name for k in prog.compile(dims={"N": 8})]
    out = prog.run(x=np.arange(3, dtype=np.float32), dims={"N": np.int32(3)})
    np.testing.assert_array_equal(out["out0"], np.array([0, 2, 4], np.float32))


# ---------------------------------------------------------------------------------------------------------------
# tgc import: the program and its weights are written together or not at all


def test_import_that_cannot_write_its_weights_leaves_the_earlier_program(tmp_path):
    from onnx import helper

    f = _model(tmp_path / "m.onnx", [helper.make_node("Relu", ["x"], ["y"], name="r0")], [_vi("x", [2, 3])],
               [_vi("y", [2, 3])])
    earlier = "# translated by tgc from ONNX: an earlier model\nx: f32[2]\nreturn x\n"
    (tmp_path / "m.tg").write_text(earlier)
    (tmp_path / "m.npz").mkdir()  # the weights cannot be written there
    assert_clean(invoke("import", f, "-o", str(tmp_path / "m.tg")), 2, "m.npz", "directory")
    assert (tmp_path / "m.tg").read_text() == earlier  # (was replaced, then the weights failed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz", "m.onnx", "m.tg"]  # no temporary left
    # where both can be written, both are, and the program runs with its weights
    (tmp_path / "m.npz").rmdir()
    r = invoke("import", f, "-o", str(tmp_path / "m.tg"))
    assert r.exit_code == 0, r.stderr
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    out = tgc.load(str(tmp_path / "m.tg")).run(x=x, **dict(np.load(tmp_path / "m.npz")))
    np.testing.assert_array_equal(out[next(iter(out))], np.maximum(x, 0))


def test_bench_baseline_that_never_ends_is_refused(tmp_path, monkeypatch):
    from tgc.cli import report

    monkeypatch.setattr(report, "MAX_BASELINE", 1 << 16)  # (the real bound, 64 Mi characters, the same way)
    prog = tmp_path / "p.tg"
    prog.write_text("x: f32[4]\nreturn x + 1\n")
    assert_clean(invoke("bench", str(prog), "--repeat", "1", "--baseline", "/dev/zero"), 2, "--baseline",
                 "'/dev/zero' is over")


def test_onnx_model_whose_external_weights_are_missing_or_short(tmp_path):
    import onnx
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "w")
    m = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm0")], "g",
                                            [_vi("x", [2, 8])], [_vi("y", [2, 8])], [w]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.data", size_threshold=0)
    x = np.ones((2, 8), np.float32)
    np.testing.assert_allclose(tgc.load(str(tmp_path / "ext.onnx")).run(x=x)["y"],
                               x @ np.arange(64, dtype=np.float32).reshape(8, 8))
    data = (tmp_path / "ext.data").read_bytes()
    (tmp_path / "ext.data").write_bytes(data[:100])  # truncated
    assert_clean(invoke("run", str(tmp_path / "ext.onnx"), "--random"), 2, "ext.onnx",
                 "cannot load the model's weights (external data)", "'w'")
    (tmp_path / "ext.data").unlink()  # missing: was 'internal error: ValidationError', exit 1
    for cmd in ("run", "inspect", "compile"):
        assert_clean(invoke(cmd, str(tmp_path / "ext.onnx")), 2, "ext.onnx",
                     "cannot load the model's weights (external data)", "ext.data")


# ---------------------------------------------------------------------------------------------------------------
# an empty path (`--package "$OUT"` with OUT unset) is a usage error, not the option left out


@pytest.mark.parametrize("args", [
    ["compile", "{prog}", "--package", ""],  # was: printed the sources, exit 0, no package written
    ["compile", "{prog}", "-o", ""],
    ["run", "{prog}", "--random", "--inputs", ""],
    ["run", "{prog}", "--random", "--profile", ""],
    ["bench", "{prog}", "--repeat", "1", "--baseline", ""],
    ["viz", "{prog}", "--no-measure", "-o", ""],
    ["run", "{prog}", "--random", "-d", "REMOTE", "--remote", ""],
])
def test_an_empty_path_option_is_a_usage_error(tmp_path, args):
    prog = tmp_path / "p.tg"
    prog.write_text("x: f32[4]\nreturn x + 1\n")
    r = invoke(*[a.format(prog=prog) for a in args])
    assert_clean(r, 2, "invalid value for")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.tg"]  # nothing written anywhere near


def test_import_to_an_empty_path_is_a_usage_error(tmp_path):
    from onnx import helper

    f = _model(tmp_path / "m.onnx", [helper.make_node("Relu", ["x"], ["y"], name="r0")], [_vi("x", [2])],
               [_vi("y", [2])])
    assert_clean(invoke("import", f, "-o", ""), 2, "the path is empty")
    assert not (tmp_path / "m.tg").exists()  # (was: the default m.tg written)


def test_api_device_and_source_of_the_wrong_type_are_one_clear_error():
    prog = tgc.loads("x: f32[N]\nreturn x * 2.0\n")
    x = np.ones(2, np.float32)
    for bad in (0, b"CPU", {"CPU"}):
        for call in (lambda d=bad: prog.run(x=x, device=d), lambda d=bad: prog.compile(device=d, dims={"N": 2}),
                     lambda d=bad: prog.bench(device=d, inputs={"x": x}, repeat=1)):
            with pytest.raises(TgcError, match="device must be a name") as e:
                call()
            assert e.value.kind == "user"
    np.testing.assert_array_equal(prog.run(x=x, device=["CPU"])["out0"], x * 2)
    for bad in (None, b"x: f32[2]\nreturn x\n"):
        with pytest.raises(TgcError, match="takes the program's text"):
            tgc.loads(bad)


def test_bench_repeat_bound_holds_for_a_model_run_in_stages(tmp_path):
    from onnx import TensorProto, helper

    # NonZero: a data-dependent output shape, so the model runs in stages (tgc.staged), timed by its own loop
    f = _model(tmp_path / "nz.onnx", [helper.make_node("NonZero", ["x"], ["y"], name="nz0")], [_vi("x", [2, 3])],
               [helper.make_tensor_value_info("y", TensorProto.INT64, [2, None])])
    assert_clean(invoke("bench", f, "--repeat", str(2**63 - 1)), 2, "1000000")  # (was a loop without end)
    r = invoke("bench", f, "--repeat", "2")
    assert r.exit_code == 0, r.stderr
    from tgc.engine.executable import MAX_REPEAT

    with pytest.raises(TgcError, match="cannot time"):  # the staged runner's own bound, under the CLI's
        tgc.load(f).bench(repeat=MAX_REPEAT + 1, inputs={"x": np.ones((2, 3), np.float32)})


def test_a_loop_past_the_unroll_limit_is_refused_before_unrolling(monkeypatch):
    from tgc.dsl import frontend
    from tgc.dsl.frontend import MAX_UNROLLED

    blocks = []
    run_block = frontend._Evaluator.run_block
    monkeypatch.setattr(frontend._Evaluator, "run_block",
                        lambda self, stmts: (blocks.append(1), run_block(self, stmts)))
    with pytest.raises(TgcError, match=f"more than {MAX_UNROLLED} statements") as e:
        tgc.loads("x: f32[4]\nh = x\nfor i in range(100000000):\n    h = h + 1.0\nreturn h\n")
    assert e.value.line == 4  # (the body's statement, as when found while unrolling)
    assert len(blocks) < 10  # the body never ran (it ran 200000 times, 12 s of CPU, before the error)
    monkeypatch.undo()
    out = tgc.loads("x: f32[4]\nh = x\nfor i in range(3):\n    h = h + 1.0\nreturn h\n").run(x=np.zeros(4, np.float32))
    np.testing.assert_array_equal(next(iter(out.values())), np.full(4, 3, np.float32))
