"""Break-it review 25: `--check` against a reference that rounds each float result to its dtype (a narrowing cast,
an overflow to inf, an int computed from a rounded float), and still fails wrong results; `compile --package`
onto a pipe or a device (written in place, never read as a zip: /dev/zero was read forever); an ml_dtypes
bfloat16 array for a bf16 input; a list of ints for a float input; any/all over an empty axis. Expectations are
numpy's (float16/float32 arithmetic) or exact values."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import tgc
from tgc.cli.check import check_outputs
from tgc.engine.compare import compare
from tgc.errors import TgcError
from tgc.package import load_package

_SCRIPT = Path(sys.executable).parent / "tgc"
TGC = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tgc.cli.main"]


def _checked(src: str, **inputs: np.ndarray) -> tuple[dict, dict, list]:
    """(the CPU's outputs, the reference, the --check mismatches)."""
    prog = tgc.loads(src)
    ref, scale = prog.reference_with_scale(**inputs)
    outs = prog.run(device="CPU", **inputs)
    types = {n: d.name for n, d, _ in prog.output_types(_dims(prog, inputs))}
    bad, _ = check_outputs(outs, ref, types, None, scale)
    return outs, ref, bad


def _dims(prog, inputs: dict[str, np.ndarray]) -> dict[str, int]:
    dims, _ = prog.bind(inputs, None, cast=True)
    return dims


# ------------------------------------------------------------------------------------------ --check rounds


def test_narrowing_cast_then_argmax_matches_numpy_f16():
    logits = np.array([[1.0001, 1.0002, 0.5]], np.float32)
    outs, ref, bad = _checked("logits: f32[N, V]\nh = cast(logits, f16)\nreturn argmax(h, axis=1)", logits=logits)
    want = np.argmax(logits.astype(np.float16), axis=1)  # both round to 1.0: the first wins
    assert want[0] == 0
    assert np.array_equal(ref["out0"], want) and np.array_equal(outs["out0"], want) and bad == []


def test_ints_and_comparisons_of_narrowed_floats():
    x = np.array([2049.0, 0.99999, -0.99999, 3.0], np.float32)
    outs, ref, bad = _checked("x: f32[N]\nreturn cast(cast(x, f16), i32), cast(cast(x, bf16), i32), cast(x, f16) == x",
                              x=x)
    assert bad == []
    f16 = x.astype(np.float16)
    assert np.array_equal(ref["out0"], f16.astype(np.int32)) and list(ref["out0"]) == [2048, 1, -1, 3]
    assert list(ref["out1"]) == [2048, 1, -1, 3]  # bf16 (8 bits of mantissa) rounds 2049 and 0.99999 too
    assert np.array_equal(ref["out2"], f16.astype(np.float32) == x)
    outs, ref, bad = _checked("x: f64[N]\nreturn cast(cast(x, f32), i64), cast(x, f32) == x",
                              x=np.array([16777217.0, 1.0]))
    assert bad == [] and list(ref["out0"]) == [16777216, 1] and list(ref["out1"]) == [False, True]


def test_overflow_to_inf_is_the_reference_too():
    with np.errstate(over="ignore"):
        cases = [("x: f32[N]\nreturn x * x", np.array([1e20, 2.0], np.float32), lambda x: x * x),
                 ("x: f16[N]\nreturn exp(x)", np.array([12, 1], np.float16), np.exp),
                 ("x: f32[N]\nreturn cast(x, f16)", np.array([7e4, 1.0], np.float32), lambda x: x.astype(np.float16))]
        for src, x, fn in cases:
            outs, ref, bad = _checked(src, x=x)
            want = fn(x)
            assert np.isinf(want[0]) and np.array_equal(ref["out0"], want.astype(np.float64)), src
            assert bad == [], src


def test_int_of_a_rounded_sum_is_numpys_f32():
    x = np.array([0.99999994, 0.5], np.float32)
    outs, ref, bad = _checked("x: f32[N]\nreturn cast(x + 1.0, i32)", x=x)
    want = (x + np.float32(1.0)).astype(np.int32)  # 1.99999994 rounds to 2.0 in f32 (float64 gives 1)
    assert list(want) == [2, 1]
    assert np.array_equal(ref["out0"], want) and np.array_equal(outs["out0"], want) and bad == []


def test_wrong_results_still_fail():
    x = np.array([2049.0, 0.99999, -0.99999, 3.0], np.float32)
    y = np.array([1.5, 2.0, 3.0, 0.5], np.float32)
    prog = tgc.loads("x: f32[N]\ny: f32[N]\nreturn cast(cast(x, f16), i32), y * y, exp(cast(y, f16) * 0.5)")
    ref, scale = prog.reference_with_scale(x=x, y=y)
    types = {"out0": "i32", "out1": "f32", "out2": "f16"}
    good = prog.run(device="CPU", x=x, y=y)
    assert check_outputs(good, ref, types, None, scale)[0] == []
    assert np.array_equal(good["out1"], y * y)
    wrong = {k: v.copy() for k, v in good.items()}
    wrong["out0"][0] = 2049  # the unrounded value
    wrong["out1"][3] = np.float32(0.25 * 1.01)  # 1% off
    wrong["out2"][3] = np.float16(float(good["out2"][3]) * 1.1)  # 10% off in f16
    bad = check_outputs(wrong, ref, types, None, scale)[0]
    assert sorted(m.name for m in bad) == ["out0", "out1", "out2"]
    prog = tgc.loads("x: f32[N]\nreturn x * x")
    big = np.array([1e20, 1e19], np.float32)
    ref, scale = prog.reference_with_scale(x=big)
    got = prog.run(device="CPU", x=big)["out0"]
    assert np.isinf(got[0]) and compare("s", got, ref["out0"], "f32", scale=scale["out0"])[0] is None
    for finite in (np.float32(3.4e38), np.float32(-np.inf)):  # a finite or the other infinity for +inf fails
        g = got.copy()
        g[0] = finite
        assert compare("s", g, ref["out0"], "f32", scale=scale["out0"])[0] is not None
    # a wrong expected value fails too, and a float64 reference is rounded to the output's dtype before comparing
    assert compare("s", np.float32([2048.0]), np.array([2049.0]), "f16")[0] is None
    assert compare("s", np.float32([2048.0]), np.array([2049.0]), "f32")[0] is not None
    assert compare("s", np.float32([np.inf]), np.array([1e40]), "f32")[0] is None
    assert compare("s", np.float32([np.inf]), np.array([1e30]), "f32")[0] is not None


# ------------------------------------------------------------------------------- --package onto a stream


def _tgc(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "TGC_DEVICE", "FORCE_COLOR")}

    def limit() -> None:  # (the bug read /dev/zero into memory: fail fast here, not by the OOM killer)
        resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))

    return subprocess.run([*TGC, *args], env={**env, "NO_COLOR": "1"}, capture_output=True, text=True,
                          timeout=60, preexec_fn=limit)


@pytest.fixture
def program(tmp_path: Path) -> Path:
    p = tmp_path / "m.tg"
    p.write_text("x: f32[N]\nreturn x * 2\n")
    return p


def test_package_onto_a_fifo_is_written_in_place(program: Path, tmp_path: Path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    r = _tgc("compile", str(program), "-D", "N=8", "--package", str(fifo))
    reader.join(30)
    assert r.returncode == 0, r.stderr
    assert f"wrote {fifo}" in r.stderr
    assert fifo.is_fifo()  # the pipe itself was not replaced by a file
    (tmp_path / "back.tgpkg").write_bytes(got[0])
    out = load_package(tmp_path / "back.tgpkg").run(x=np.arange(8, dtype=np.float32))
    assert np.array_equal(out["out0"], np.arange(8, dtype=np.float32) * 2)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_package_onto_dev_full_and_dev_zero(program: Path):
    r = _tgc("compile", str(program), "-D", "N=8", "--package", "/dev/full")
    assert r.returncode == 1 and "No space left on device" in r.stderr and "Traceback" not in r.stderr
    assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")
    r = _tgc("compile", str(program), "-D", "N=8", "--package", "/dev/zero")  # (read forever before)
    assert r.returncode == 0 and "wrote /dev/zero" in r.stderr, r.stderr
    assert not os.path.isfile("/dev/zero")


# ------------------------------------------------------------------------------------------------- inputs


def test_ml_dtypes_bfloat16_for_a_bf16_input():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    v = np.array([1.00390625, 3.0, -0.5, 1e-3], np.float32)
    b = v.astype(ml_dtypes.bfloat16)
    out = tgc.loads("x: bf16[N]\nreturn cast(x, f32) * 2").run(x=b)["out0"]
    assert np.array_equal(out, b.astype(np.float32) * 2)
    out = tgc.loads("x: f32[N]\nreturn x * 2").run(x=b)["out0"]  # widened exactly for a float32 input
    assert np.array_equal(out, b.astype(np.float32) * 2)


def test_a_list_of_ints_for_a_float_input():
    prog = tgc.loads("x: f32[N]\nreturn x * 2")
    out = prog.run(x=[1, 2])["out0"]
    assert out.dtype == np.float32 and list(out) == [2.0, 4.0]
    with pytest.raises(TgcError, match=r"16777217 is not exactly representable in f32"):
        prog.run(x=[1, 2 ** 24 + 1])
    with pytest.raises(TgcError, match=r"70000 is not exactly representable in f16"):
        tgc.loads("x: f16[N]\nreturn x").run(x=[70000])
    with pytest.raises(TgcError, match=r"257 is not exactly representable in bf16"):
        tgc.loads("x: bf16[N]\nreturn x").run(x=[257])
    assert list(tgc.loads("x: bf16[N]\nreturn cast(x, f32)").run(x=[256, 3])["out0"]) == [256.0, 3.0]
    with pytest.raises(TgcError, match="is i64"):  # an int array (not a list) still needs cast=True
        prog.run(x=np.array([1, 2]))


def test_any_all_over_an_empty_axis_are_numpys():
    prog = tgc.loads("x: bool[N, M]\ny: f32[N, M]\nreturn any(x, axis=1), all(x, axis=1), any(x), all(y), "
                     "any(y, axis=1, keepdim=True), all(x, axis=0)")
    x, y = np.zeros((3, 0), bool), np.zeros((3, 0), np.float32)
    outs = list(prog.run(x=x, y=y).values())
    want = [np.any(x, 1), np.all(x, 1), np.any(x), np.all(y), np.any(y, 1, keepdims=True), np.all(x, 0)]
    for got, w in zip(outs, want):
        assert got.shape == w.shape and np.array_equal(got, w)
    with pytest.raises(TgcError, match="max/min over an axis of size 0"):
        tgc.loads("y: f32[N, M]\nreturn y.max(axis=1)").run(y=y)
