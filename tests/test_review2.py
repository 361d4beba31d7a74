"""Defects a new user met trying tgc end to end (the second review of the integrated branch), each pinned by a test
that fails without its fix: in-process CLI runs (tests/clikit.py), results against numpy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clikit import assert_clean, invoke

import tgc

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = str(ROOT / "kernels" / "softmax.tg")


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_inputs_accepts_an_empty_npz(tmp_path):
    """`numpy.savez` of no arrays (what `tgc import` writes for a model without weights) is an archive of no
    inputs, not 'not an .npz archive'."""
    np.savez(tmp_path / "empty.npz")
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    r = invoke("run", SOFTMAX, "--inputs", str(tmp_path / "empty.npz"), "-i", f"x={tmp_path / 'x.npy'}",
               "-o", str(out))
    assert r.exit_code == 0, r.stderr
    np.testing.assert_allclose(np.load(out)["out0"], _softmax(x), rtol=1e-5, atol=1e-6)
    # a file of other bytes is still refused
    (tmp_path / "junk.npz").write_bytes(b"PK\x07\x08junk")
    assert_clean(invoke("run", SOFTMAX, "--inputs", str(tmp_path / "junk.npz"), "--random", "-D", "N=2", "-D", "D=3"),
                 2, "not an .npz archive")


def test_an_output_onto_an_input_file_is_refused_and_the_input_kept(tmp_path):
    """`-o` naming the file an input is read from (`-i`, `--inputs`) is a user error: the input stays as it was."""
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    xpath = tmp_path / "x.npy"
    np.save(xpath, x)
    before = xpath.read_bytes()
    for out in (str(xpath), f"out0={xpath}"):
        assert_clean(invoke("run", SOFTMAX, "-i", f"x={xpath}", "-o", out), 2, "would overwrite an input file",
                     f"-i x={xpath}")
        assert xpath.read_bytes() == before
    archive = tmp_path / "in.npz"
    np.savez(archive, x=x)
    before = archive.read_bytes()
    assert_clean(invoke("run", SOFTMAX, "--inputs", str(archive), "-o", str(archive)), 2,
                 "would overwrite an input file", f"--inputs {archive}")
    assert archive.read_bytes() == before
    # the same names with the output elsewhere run, and the output is the softmax of the input
    out = tmp_path / "y.npz"
    r = invoke("run", SOFTMAX, "--inputs", str(archive), "-o", str(out))
    assert r.exit_code == 0, r.stderr
    np.testing.assert_allclose(np.load(out)["out0"], _softmax(x), rtol=1e-5, atol=1e-6)


def test_a_given_input_of_the_wrong_rank_is_the_error_with_random_for_the_rest(tmp_path):
    """`-i` of an array with the wrong number of dims, the other inputs `--random`: the message names that input
    and its rank (as without --random), not a dim of another input that it left unknown."""
    prog = tmp_path / "emb.tg"
    prog.write_text("emb: f32[V, D]\nids: i32[B]\nreturn emb[ids]\n")
    np.save(tmp_path / "e.npy", np.zeros((2, 3, 4), np.float32))
    r = invoke("run", str(prog), "-i", f"emb={tmp_path / 'e.npy'}", "--random")
    assert_clean(r, 2, "input 'emb' has 3 dims [2, 3, 4], but is declared f32[V, D] with 2")
    assert "dim B is unknown" not in r.stderr
    assert "emb.tg:1:" in r.stderr  # at its declaration


@pytest.mark.parametrize("call, hint", [
    ("x.sum(axs=1)", "did you mean 'axis='?"),
    ("sum(x, keepdims=True)", "did you mean 'keepdim='?"),  # numpy's spelling
    ("softmax(x, dim=1)", "softmax() takes: x, axis"),  # torch's: nothing close, so the names it takes
])
def test_a_misspelt_keyword_argument_says_the_right_one(call, hint):
    with pytest.raises(tgc.TgcError) as info:
        tgc.loads(f"x: f32[4, 3]\nreturn {call}\n").compile()
    e = info.value
    assert "got an unexpected keyword argument" in e.msg and e.line == 2 and e.exit_code == 2
    assert e.hint == hint


def test_gpu_check_standin_without_tgc_installed_is_one_clear_message(tmp_path):
    """`make gpu-check ARGS=--standin` runs tools/gpu_check.py with a plain Python (tgc from the tree, not installed):
    its in-process import of the stand-in finds tgc in the tree, and a missing dependency (here numpy: `-S` leaves
    out site-packages) is one message naming it, exit 1, not a traceback."""
    r = subprocess.run([sys.executable, "-S", str(ROOT / "tools" / "gpu_check.py"), "--standin", "--out",
                        str(tmp_path), "--rows", "none", "--tests", "none"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "No module named 'tgc'" not in r.stderr, r.stderr
    assert r.stderr.startswith("gpu_check --standin: ") and "cannot import numpy" in r.stderr, r.stderr


def test_one_input_given_twice_from_two_files_is_refused(tmp_path):
    """`-i x=a.npy -i x=b.npy` used to run silently with the last one; like `-D N=4 -D N=5` it is a user error.
    The same file twice is harmless and runs."""
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    np.save(tmp_path / "a.npy", x)
    np.save(tmp_path / "b.npy", -x)
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    assert_clean(invoke("run", SOFTMAX, "-i", f"x={a}", "-i", f"x={b}"), 2, "input 'x' is given twice",
                 f"-i x={a} and -i x={b}")
    out = tmp_path / "o.npz"
    r = invoke("run", SOFTMAX, "-i", f"x={a}", "-i", f"x={a}", "-o", str(out))
    assert r.exit_code == 0, r.stderr
    np.testing.assert_allclose(np.load(out)["out0"], _softmax(x), rtol=1e-5, atol=1e-6)


def _weightless_model(path: Path) -> None:
    """q @ k^T, softmax, @ v: an attention-like ONNX model without initializers."""
    from onnx import TensorProto, helper, save
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["a"], axis=-1),
             helper.make_node("MatMul", ["a", "v"], ["o"])]
    graph = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 4])
                                              for n in "qkv"],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2, 3, 4])])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_import_of_a_weightless_model_runs_and_never_replaces_a_users_program(tmp_path):
    """`tgc import m.onnx` (default output m.tg) leaves a program of the user's named m.tg as it was (exit 2); it
    replaces an earlier translation; the .tg it writes runs with its (empty) .npz and equals `tgc run m.onnx`."""
    model = tmp_path / "m.onnx"
    _weightless_model(model)
    mine = tmp_path / "m.tg"
    mine.write_text("x: f32[N]\nreturn x * 2\n")
    assert_clean(invoke("import", str(model)), 2, "m.tg exists and is not a translation by tgc import")
    assert mine.read_text() == "x: f32[N]\nreturn x * 2\n" and not (tmp_path / "m.npz").exists()
    mine.unlink()
    for _ in range(2):  # the second time over its own translation
        r = invoke("import", str(model))
        assert r.exit_code == 0, r.stderr
        assert "(0 weights)" in r.stdout
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    args = []
    for name, arr in zip("qkv", (q, k, v)):
        np.save(tmp_path / f"{name}.npy", arr)
        args += ["-i", f"{name}={tmp_path / name}.npy"]
    r1 = invoke("run", str(model), *args, "-o", str(tmp_path / "a.npz"))
    r2 = invoke("run", str(mine), "--inputs", str(tmp_path / "m.npz"), *args, "-o", str(tmp_path / "b.npz"))
    assert r1.exit_code == 0 and r2.exit_code == 0, r1.stderr + r2.stderr
    s = q @ k.transpose(0, 2, 1)
    e = np.exp(s - s.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)) @ v
    np.testing.assert_array_equal(np.load(tmp_path / "a.npz")["o"], np.load(tmp_path / "b.npz")["o"])
    np.testing.assert_allclose(np.load(tmp_path / "b.npz")["o"], want, rtol=1e-5, atol=1e-6)


def test_profile_and_viz_never_write_over_the_program_inputs_or_outputs(tmp_path):
    """`--profile OUT` onto the program, an input file or an `-o` target, and `tgc viz FILE -o FILE`, used to
    replace that file (the program lost, even when the run failed); each is a user error, the file as it was."""
    prog = tmp_path / "p.tg"
    text = "x: f32[N]\nreturn x * 2\n"
    prog.write_text(text)
    x = np.arange(3, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    xbytes = (tmp_path / "x.npy").read_bytes()
    xin = f"x={tmp_path / 'x.npy'}"
    cases = [(["run", str(prog), "-i", xin, "--profile", str(prog)], "would overwrite the program"),
             (["bench", str(prog), "-D", "N=3", "--repeat", "1", "--profile", str(prog)], "overwrite the program"),
             (["run", str(prog), "-i", xin, "--profile", str(tmp_path / "x.npy")], "would overwrite an input file"),
             (["run", str(prog), "-i", xin, "-o", str(tmp_path / "o.npz"), "--profile", str(tmp_path / "o.npz")],
              "would overwrite the output file of -o"),
             (["viz", str(prog), "-D", "N=3", "--no-measure", "-o", str(prog)], "-o"),
             (["bench", str(prog), "-D", "N=3", "--baseline", str(tmp_path / "x.npy"), "--profile",
               str(tmp_path / "x.npy")], "would overwrite the baseline")]
    for args, words in cases:
        assert_clean(invoke(*args), 2, words)
        assert prog.read_text() == text and (tmp_path / "x.npy").read_bytes() == xbytes
        assert not (tmp_path / "o.npz").exists()
    # a trace of its own is written, and the run's output is right
    r = invoke("run", str(prog), "-i", xin, "-o", str(tmp_path / "o.npz"), "--profile", str(tmp_path / "t.json"))
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "t.json").read_text().startswith("{")
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["out0"], x * 2)


def test_inspect_names_an_op_a_function_body_needs_and_tgc_lacks(tmp_path):
    """Bernoulli is an ONNX function whose body draws with RandomUniformLike, which tgc lacks: `inspect` said
    "not supported by tgc: none" and `run` then failed on it. It names it now; a function op whose body tgc has
    (Mish) is still supported, and runs."""
    from onnx import TensorProto, helper, save
    for op in ("Bernoulli", "Mish"):
        graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], op,
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
        save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(tmp_path / f"{op}.onnx"))
    r = invoke("inspect", str(tmp_path / "Bernoulli.onnx"))
    assert r.exit_code == 0, r.stderr
    assert "not supported by tgc (1): RandomUniformLike (in Bernoulli)" in r.stdout, r.stdout
    assert_clean(invoke("run", str(tmp_path / "Bernoulli.onnx"), "--random"), 2, "unsupported op 'RandomUniformLike'")
    r = invoke("inspect", str(tmp_path / "Mish.onnx"))
    assert r.exit_code == 0 and "not supported by tgc: none" in r.stdout, r.stdout
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    r = invoke("run", str(tmp_path / "Mish.onnx"), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "y.npz"))
    assert r.exit_code == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["y"], x * np.tanh(np.log1p(np.exp(x))), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("budget", ["nan", "inf"])
def test_beam_budget_must_be_a_finite_number(budget):
    """`tgc beam --budget nan` ran ("0.4 s of a nan s budget"): like --rtol, a budget is a finite number (0 is
    unbounded)."""
    assert_clean(invoke("beam", SOFTMAX, "-D", "N=2", "-D", "D=3", "--budget", budget), 2, "is not a finite number")
