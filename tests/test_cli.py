"""The `tgc` command line: exit status, files written, JSON that parses, and one clear message (never a
traceback) for every kind of bad input. Most tests run the command in this process (`tgc_here`: click's runner
on `tgc.cli.main.main`, an exception fails the test); the real executable runs in a subprocess (`tgc`) where the
process is what a test checks: the script starts, imports, a terminal, serving, and the exit status and stderr of
the real process for a user error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
SOFTMAX = str(KERNELS / "softmax.tg")
_SCRIPT = Path(sys.executable).parent / "tgc"
TGC = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tgc.cli.main"]

# small dims for every example program
EXAMPLE_DIMS = {
    "argmax": "N=5 K=7", "attention": "B=2 H=2 T=5 D=8", "batched_matmul": "B=2 M=3 K=5 N=4",
    "conv2d": "N=2 C=3 H=6 W=5 O=4", "elementwise": "N=10", "gelu": "N=10", "layernorm": "N=4 D=8",
    "matmul": "M=3 K=5 N=4", "mixed_dtypes": "N=4 K=5 M=3", "mlp": "B=3 IN=6 HID=7 OUT=4",
    "pooling": "N=2 C=3 H=6 W=5", "reductions": "M=3 N=5", "slicing": "N=9 R=3 C=5", "softmax": "N=4 D=8",
    "variance": "N=6 F=3", "small_kernels": "R=4 N=5", "transformer_block": "B=2 T=5 C=8",
    "mlp_stack": "B=3 C=4 L=3", "tiny_gpt": "B=2 T=5 V=16 C=8 L=2",
}


def tgc(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "TGC_DEVICE", "FORCE_COLOR")}
    full_env.update(NO_COLOR="1", **(env or {}))
    return subprocess.run([*TGC, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=120)


def tgc_here(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`tgc` run in this process (`tgc.cli.main.main([...])` through click's runner): exit status, stdout
    and stderr as from the process, for the tests that check what the command does, not the process."""
    from click.testing import CliRunner

    from tgc.cli.main import main
    overrides: dict = {"DEBUG": None, "TGC_DEVICE": None, "FORCE_COLOR": None, "NO_COLOR": "1", **(env or {})}
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        r = CliRunner().invoke(main, list(args), env=overrides, catch_exceptions=False)
    finally:
        os.chdir(old)
    return subprocess.CompletedProcess(["tgc", *args], r.exit_code, r.stdout, r.stderr)


def dims_args(spec: str) -> list[str]:
    return [a for d in spec.split() for a in ("-D", d)]


# ---------------------------------------------------------------------------------------------------------------
# the main paths


def test_version_and_help():
    r = tgc("--version")
    assert r.returncode == 0, r.stderr
    for word in ("tgc 0.", "Python 3.", "numpy ", "llvmlite ", "CPU"):
        assert word in r.stdout
    r = tgc("--help")
    assert r.returncode == 0 and all(c in r.stdout for c in ("run", "compile", "bench", "beam", "devices", "cache"))


def test_cli_module_imports_nothing_heavy():
    """Start-up: `tgc --help` must not pay for numpy, rich or the compiler."""
    code = ("import sys, tgc.cli.main; heavy = ('numpy', 'rich', 'tgc.api', 'llvmlite', 'tgc.backends.cpu'); "
            "print([m for m in heavy if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_run_random_prints_a_table():
    r = tgc_here("run", SOFTMAX, "--random", "-D", "N=4", "-D", "D=8")
    assert r.returncode == 0, r.stderr
    assert "out0" in r.stdout and "f32" in r.stdout and "(4, 8)" in r.stdout
    assert "\x1b[" not in r.stdout  # NO_COLOR and a pipe: plain text


def test_run_check_and_outputs(tmp_path):
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = tgc_here("run", SOFTMAX, "-i", "x=x.npy", "--check", "-o", "all.npz", "-o", "out0=p.npy", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "check: ok" in r.stderr and r.stdout == ""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    with np.load(tmp_path / "all.npz") as z:
        assert z.files == ["out0"] and np.allclose(z["out0"], want, rtol=1e-5)
    assert np.allclose(np.load(tmp_path / "p.npy"), want, rtol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.npz", "p.npy", "x.npy"]  # no temp files left


def test_run_check_with_bf16_inputs(tmp_path):
    """bf16 inputs are uint16 bits on the numpy side: the reference must read them as bf16, not as ints."""
    (tmp_path / "b.tg").write_text("x: bf16[N]\ny: f32[N]\nreturn x * 1, x + y\n")
    r = tgc_here("run", "b.tg", "--random", "-D", "N=4", "--check", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "check: ok" in r.stderr
    bits = np.array([0x3F80, 0xC000, 0x4049, 0x0000], np.uint16)  # 1.0, -2.0, 3.140625, 0.0
    np.save(tmp_path / "x.npy", bits)
    np.save(tmp_path / "y.npy", np.ones(4, np.float32))
    for extra in ((), ("--cast",)):
        r = tgc_here("run", "b.tg", "-i", "x=x.npy", "-i", "y=y.npy", "--check", "-o", "o.npz", *extra, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        with np.load(tmp_path / "o.npz") as z:
            assert z["out0"].tolist() == [1.0, -2.0, 3.140625, 0.0]
            assert z["out1"].tolist() == [2.0, -1.0, 4.140625, 1.0]


def test_run_inputs_npz_and_seed(tmp_path):
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 4), np.float32))
    r = tgc_here("run", SOFTMAX, "--inputs", "in.npz", "-o", "o.npz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "o.npz") as z:
        assert np.allclose(z["out0"], 0.25)
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        assert tgc_here("run", SOFTMAX, "--random", "--seed", seed, "-D", "N=3", "-D", "D=3", "-o", f"{name}.npz",
                   cwd=tmp_path).returncode == 0
    a, b, c = (np.load(tmp_path / f"{n}.npz")["out0"] for n in "abc")
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize("name", sorted(EXAMPLE_DIMS))
def test_example_programs_check(name):
    r = tgc_here("run", str(KERNELS / f"{name}.tg"), "--random", "--check", *dims_args(EXAMPLE_DIMS[name]))
    assert r.returncode == 0, r.stderr
    assert "check: ok" in r.stderr


def test_examples_are_documented():
    files = sorted(KERNELS.glob("*.tg"))
    assert len(files) >= 12 and {f.stem for f in files} == set(EXAMPLE_DIMS)
    for f in files:
        first = f.read_text().splitlines()[0]
        assert first.startswith(f"# {f.name}: "), f


# ---------------------------------------------------------------------------------------------------------------
# bad input: one message naming the problem, exit 2, no traceback


def _write_inputs(d: Path) -> None:
    np.save(d / "x.npy", np.ones((2, 3), np.float32))
    np.save(d / "x64.npy", np.ones((2, 3), np.float64))
    np.save(d / "x1d.npy", np.ones(6, np.float32))
    np.save(d / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (d / "text.npy").write_text("1 2 3\n")
    (d / "bad.tg").write_text("x: f32[N]\ny = x +* 2\nreturn y\n")
    (d / "shape.tg").write_text("x: f32[N]\nw: f32[M]\nreturn x + w\n")


BAD_INPUTS = [
    (["run", SOFTMAX], ["missing input 'x'", "--random"]),
    (["run", SOFTMAX, "-i", "x=x.npy", "-i", "xs=x.npy"], ["unknown input 'xs'", "did you mean 'x'"]),
    (["run", SOFTMAX, "-i", "x=x64.npy"], ["input 'x' is f64", "f32", "--cast"]),
    (["run", SOFTMAX, "-i", "x=x1d.npy"], ["input 'x'", "1 dims"]),
    (["run", SOFTMAX, "-i", "x=x.npy", "-D", "N=5"], ["input 'x'", "axis 0", "5"]),
    (["run", SOFTMAX, "-i", "x=text.npy"], ["input 'x'", "not a .npy file"]),
    (["run", SOFTMAX, "-i", "x=obj.npy"], ["input 'x'", "pickled"]),
    (["run", SOFTMAX, "-i", "x=nope.npy"], ["input 'x'", "no such file 'nope.npy'"]),
    (["run", SOFTMAX, "--inputs", "x.npy"], ["--inputs", "not an .npz"]),
    (["run", SOFTMAX, "--random", "-D", "N=4"], ["dim D is unknown: give -D D=INT"]),
    (["run", "bad.tg", "--random", "-D", "N=3"], ["bad.tg:2:", "error:", "^"]),
    (["run", "shape.tg", "--random", "-D", "N=3", "-D", "M=4"], ["shape.tg:3:", "error:", "broadcast"]),
    (["run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2", "-d", "CPUU"], ["unknown device 'CPUU'", "did you mean"]),
    (["run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2", "-o", "nodir/o.npz"], ["nodir", "does not exist"]),
    (["run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2", "-o", "outt=o.npy"], ["unknown output 'outt'"]),
    (["run", SOFTMAX, "-D", "N"], ["NAME=INT"]),  # click usage errors exit 2 as well
    (["run", SOFTMAX, "-i", "x.npy"], ["NAME=PATH.npy"]),
    (["run", "missing.tg"], ["missing.tg"]),
    (["compile", SOFTMAX, "-D", "N=4"], ["dim D is unknown"]),
    # every missing dim in one error, with every flag to give
    (["run", str(KERNELS / "attention.tg"), "--random", "-D", "T=3"],
     ["dims B, H and D are unknown: give -D B=INT -D H=INT -D D=INT", "random inputs: 'q' f32[B, H, T, D]"]),
    (["bench", str(KERNELS / "mlp.tg")], ["dims B, IN, HID and OUT are unknown"]),
    (["compile", str(KERNELS / "attention.tg"), "-D", "B=2"], ["dims H, T and D are unknown",
                                                                "give them with -D H=INT -D T=INT -D D=INT"]),
]


@pytest.mark.parametrize("args,words", BAD_INPUTS, ids=[" ".join(a[2:]) or a[0] for a, _ in BAD_INPUTS])
def test_bad_input(tmp_path, args, words):
    _write_inputs(tmp_path)
    r = tgc_here(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_cast_fixes_the_dtype(tmp_path):
    _write_inputs(tmp_path)
    r = tgc_here("run", SOFTMAX, "-i", "x=x64.npy", "--cast", "--check", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_failed_run_leaves_existing_outputs_alone(tmp_path):
    _write_inputs(tmp_path)
    np.savez(tmp_path / "out.npz", out0=np.arange(3))
    before = (tmp_path / "out.npz").read_bytes()
    for args in (["-i", "x=text.npy"], ["-i", "x=x1d.npy"], ["-i", "x=x.npy", "-d", "NOPE"]):
        r = tgc_here("run", SOFTMAX, *args, "-o", "out.npz", "-o", "out0=new.npy", cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert (tmp_path / "out.npz").read_bytes() == before
        assert not (tmp_path / "new.npy").exists()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_debug_env_does_not_change_user_errors(tmp_path):
    r = tgc("run", SOFTMAX, cwd=tmp_path, env={"DEBUG": "1"})
    assert r.returncode == 2 and "missing input 'x'" in r.stderr


# ---------------------------------------------------------------------------------------------------------------
# compile


REDUCTIONS = [str(KERNELS / "reductions.tg"), "-D", "M=3", "-D", "N=5"]  # four outputs: several kernels


def test_compile_prints_sources_with_headers():
    r = tgc_here("compile", *REDUCTIONS)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("; kernel ") and "reductions.tg" in r.stdout
    assert r.stdout.count("; kernel ") == r.stdout.count("\ndefine ") >= 2
    assert "\x1b[" not in r.stdout


def _kernel_files(directory: Path) -> list[Path]:
    """The kernel files `compile -o` wrote (besides its manifest of them, `emit.MANIFEST`, and its lock)."""
    files = sorted(directory.iterdir())
    assert [f.name for f in files[:2]] == [".tgc-compile.json", ".tgc-compile.lock"], files
    return files[2:]


def test_compile_writes_one_file_per_kernel(tmp_path):
    printed = tgc_here("compile", *REDUCTIONS).stdout.count("; kernel ")
    out = tmp_path / "k"
    r = tgc_here("compile", *REDUCTIONS, "-o", str(out))
    assert r.returncode == 0 and r.stdout == "", r.stderr
    files = _kernel_files(out)
    assert len(files) == printed and all(f.suffix == ".ll" for f in files)
    assert files[0].name.startswith("00_") and all(f.read_text().startswith("; kernel ") for f in files)
    r = tgc_here("compile", *REDUCTIONS, "--emit", "uops", "-o", str(tmp_path / "u"))
    assert r.returncode == 0 and all(f.suffix == ".txt" for f in _kernel_files(tmp_path / "u"))


@pytest.mark.skipif(sys.platform == "darwin", reason="METAL compiles on macOS")
def test_compile_renders_where_it_cannot_compile(tmp_path):
    r = tgc_here("compile", SOFTMAX, "-D", "N=4", "-D", "D=8", "-d", "METAL")
    assert r.returncode == 0, r.stderr
    assert "note: could not compile for METAL" in r.stderr and "kernel void" in r.stdout
    r = tgc_here("compile", SOFTMAX, "-D", "N=4", "-D", "D=8", "-d", "METAL", "-o", str(tmp_path / "m"))
    assert r.returncode == 0 and {f.suffix for f in _kernel_files(tmp_path / "m")} == {".metal"}
    r = tgc_here("compile", SOFTMAX, "-D", "N=4", "-D", "D=8", "-d", "METAL", "--emit", "bin")
    assert r.returncode == 1 and "--emit bin: could not compile for METAL" in r.stderr and r.stdout == ""


def test_emit_ir_is_the_optimized_ir_not_the_source():
    src = tgc_here("compile", SOFTMAX, "-D", "N=4", "-D", "D=8", "-d", "CPU", "--emit", "src")
    ir = tgc_here("compile", SOFTMAX, "-D", "N=4", "-D", "D=8", "-d", "CPU", "--emit", "ir")
    assert src.returncode == ir.returncode == 0, ir.stderr
    assert ir.stdout != src.stdout and "define" in ir.stdout
    # the IR LLVM hands back carries the function attributes its optimizer inferred; tgc never writes them
    assert "; Function Attrs:" in ir.stdout and "; Function Attrs:" not in src.stdout


def test_compile_python_device_writes_json(tmp_path):
    r = tgc_here("compile", SOFTMAX, "-D", "N=4", "-D", "D=8", "-d", "PYTHON", "-o", str(tmp_path / "p"))
    assert r.returncode == 0, r.stderr
    files = _kernel_files(tmp_path / "p")
    assert files and all(f.suffix == ".json" and json.loads(f.read_text()) for f in files)


@pytest.mark.parametrize("emit", ["uops", "schedule", "ir"])
def test_compile_emits(emit):
    r = tgc_here("compile", SOFTMAX, "-D", "N=4", "-D", "D=8", "--emit", emit)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_compile_highlights_on_a_terminal():
    import pty

    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "DEBUG")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen([*TGC, "compile", SOFTMAX, "-D", "N=4", "-D", "D=8"], stdout=follower,
                            stderr=subprocess.DEVNULL, env=env)
    os.close(follower)
    data = b""
    while True:  # read while it writes: a pty holds only a few KiB
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO once the child has closed its end
            break
        if not chunk:
            break
        data += chunk
    os.close(leader)
    proc.wait(timeout=120)
    assert proc.returncode == 0
    assert b"\x1b[" in data and b"define" in data


# ---------------------------------------------------------------------------------------------------------------
# devices, cache, json


def test_devices_json():
    r = tgc_here("devices", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    cpu = next(row for row in rows if row["device"] == "CPU")
    assert cpu["available"] is True and {"why_not", "renderer", "compiler", "version"} <= set(cpu)
    r = tgc_here("devices")
    assert r.returncode == 0 and "CPU" in r.stdout


def test_cache_after_a_run(tmp_path):
    env = {"TGC_CACHE_DIR": str(tmp_path / "c")}
    assert tgc_here("run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2", env=env).returncode == 0
    stats = json.loads(tgc_here("cache", "stats", "--json", env=env).stdout)
    assert stats["entries"]["compile"] >= 1 and stats["cache_dir"] == str(tmp_path / "c")
    assert "compile" in tgc_here("cache", "list", env=env).stdout
    assert tgc_here("cache", "clear", env=env).returncode == 0
    assert json.loads(tgc_here("cache", "list", "--json", env=env).stdout) == []


# ---------------------------------------------------------------------------------------------------------------
# bench


def test_bench_json_and_baseline(tmp_path):
    r = tgc_here("bench", SOFTMAX, "-D", "N=8", "-D", "D=16", "--repeat", "3", "--json", "--vs", "numpy")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # stdout is one JSON document and nothing else
    assert doc["kernels"] and all(k["median_s"] > 0 and k["name"] for k in doc["kernels"])
    assert doc["program"]["median_s"] > 0 and doc["numpy"]["median_s"] > 0
    # a baseline a thousand times faster than anything real: every row is a regression, exit 1
    fast = dict(doc, kernels=[dict(k, median_s=k["median_s"] / 1000, iqr_s=0.0) for k in doc["kernels"]],
                program=dict(doc["program"], median_s=doc["program"]["median_s"] / 1000, iqr_s=0.0))
    (tmp_path / "old.json").write_text(json.dumps(fast))
    r = tgc_here("bench", SOFTMAX, "-D", "N=8", "-D", "D=16", "--repeat", "3", "--baseline", "old.json", cwd=tmp_path)
    assert r.returncode == 1 and "regression" in r.stderr and "slower" in r.stdout
    (tmp_path / "junk.json").write_text("{not json")
    r = tgc_here("bench", SOFTMAX, "-D", "N=8", "-D", "D=16", "--baseline", "junk.json", cwd=tmp_path)
    assert r.returncode == 2 and "not JSON" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------------------------------------------
# serve


def test_serve_starts_and_stops():
    import signal

    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "TGC_REMOTE_TOKEN", "TGC_REMOTE_TOKEN_FILE")}
    proc = subprocess.Popen([*TGC, "serve", "--port", "0", "-d", "CPU"], stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        for line in proc.stderr:  # a warning may come first; EOF ends the loop if it dies
            lines.append(line)
            if line.startswith("serving"):
                break
        assert "serving CPU on http://127.0.0.1:" in lines[-1], lines
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) == 0, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_serve_refuses_an_open_address_without_a_token():
    r = tgc("serve", "--host", "0.0.0.0", "--port", "0", env={"TGC_REMOTE_TOKEN": "", "TGC_REMOTE_TOKEN_FILE": ""})
    assert r.returncode == 2 and "token" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------------------------------------------
# beam


def test_beam_json_stores_winners(tmp_path):
    env = {"TGC_CACHE_DIR": str(tmp_path / "c")}
    r = tgc_here("beam", SOFTMAX, "-D", "N=8", "-D", "D=8", "--width", "1", "--json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["width"] == 1 and doc["kernels"] and not any(k["cached"] for k in doc["kernels"])
    again = json.loads(tgc_here("beam", SOFTMAX, "-D", "N=8", "-D", "D=8", "--width", "1", "--json", env=env).stdout)
    assert all(k["cached"] for k in again["kernels"])
    # one winner per kernel, and the same winner for its symbolic form (the size class of N=8, D=8)
    stats = json.loads(tgc_here("cache", "stats", "--json", env=env).stdout)
    assert stats["entries"]["beam"] == 2 * len(doc["kernels"])
    r = tgc_here("beam", SOFTMAX, "-D", "N=8", env=env)
    assert r.returncode == 2 and "dim D is unknown" in r.stderr


def test_run_random_draws_the_inputs_bench_and_the_api_draw(tmp_path):
    import tgc as api
    from tgc.engine.inputs import random_inputs

    r = tgc_here("run", SOFTMAX, "-D", "N=3", "-D", "D=5", "--random", "--seed", "11", "-o", str(tmp_path / "o.npz"))
    assert r.returncode == 0, r.stderr
    prog = api.load(SOFTMAX)
    want = prog.run(**random_inputs(prog, {"N": 3, "D": 5}, seed=11))
    with np.load(tmp_path / "o.npz") as z:
        assert set(z.files) == set(want) and all(np.array_equal(z[k], want[k]) for k in want)


def test_compile_into_a_directory_of_an_earlier_compile_leaves_only_this_ones_files(tmp_path):
    """`compile -o DIR` into a directory an earlier compile wrote: the directory held the old program's kernels
    beside the new one's (no longer one program). Now it holds exactly this compile's files: the earlier
    compile's files (its manifest, `.tgc-compile.json`, name and sha256) that this one does not write are
    removed where they are unchanged; a file the user changed since, or one tgc never wrote, is kept."""
    import hashlib
    out = tmp_path / "k"
    softmax = ["compile", SOFTMAX, "-D", "N=4", "-D", "D=8", "-d", "CPU", "-o", str(out)]
    elementwise = ["compile", str(KERNELS / "elementwise.tg"), "-D", "N=10", "-d", "CPU", "-o", str(out)]
    assert tgc_here(*softmax).returncode == 0
    first = [f.name for f in _kernel_files(out)]
    (out / "notes.txt").write_text("mine")  # the user's own files, one named like a kernel's
    (out / "07_r_mine.ll").write_text("mine")
    r = tgc_here(*elementwise)
    assert r.returncode == 0 and f"(removed {len(first)} file" in r.stderr, r.stderr
    printed = tgc_here(*elementwise[:-2]).stdout.count("; kernel ")
    kernels = [f.name for f in _kernel_files(out) if f.name not in ("notes.txt", "07_r_mine.ll")]
    assert len(kernels) == printed and not set(kernels) & set(first), (kernels, first)
    assert (out / "notes.txt").read_text() == (out / "07_r_mine.ll").read_text() == "mine"
    manifest = json.loads((out / ".tgc-compile.json").read_text())["files"]
    assert manifest == {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in kernels}
    # a kernel file the user changed since tgc wrote it is theirs now: kept, and said
    edited = out / kernels[0]
    edited.write_text(edited.read_text() + "; my note\n")
    r = tgc_here(*softmax)
    assert r.returncode == 0 and f"note: kept {edited}: an earlier compile wrote it" in r.stderr, r.stderr
    assert edited.exists() and {f.name for f in _kernel_files(out)} == {*first, edited.name, "notes.txt",
                                                                        "07_r_mine.ll"}
    # a manifest names only files of its own directory, regular ones: no path, no link is followed or removed
    outside = tmp_path / "outside.ll"
    outside.write_text("x")
    (out / "link.ll").symlink_to(outside)
    digest = hashlib.sha256(b"x").hexdigest()
    (out / ".tgc-compile.json").write_text(json.dumps({"files": {"../outside.ll": digest, "link.ll": digest,
                                                                 str(outside): digest}}))
    assert tgc_here(*elementwise).returncode == 0
    assert outside.read_text() == "x" and (out / "link.ll").is_symlink()
    # a directory of a compile without a manifest (an older tgc): nothing of it is known to be tgc's, none removed
    (out / ".tgc-compile.json").unlink()
    before = {f.name for f in out.iterdir()}
    assert tgc_here(*softmax).returncode == 0 and before <= {f.name for f in out.iterdir()}
