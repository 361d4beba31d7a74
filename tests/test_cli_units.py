"""The CLI's helpers and commands over a stand-in Program (no compiler involved): inputs, outputs, --check,
bench/beam reports, atomic writes. The real executable is exercised in test_cli.py."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

import tgc
import tgc.api  # (the `fake` fixture patches tgc.api.load: imported here, not by whichever test ran first)
from tgc.cli import check, inputs, outputs, report
from tgc.cli.main import main
from tgc.dtype import DType, bf16_to_f32, dtypes, f32_to_bf16
from tgc.errors import BindError, TgcError


@dataclass(frozen=True)
class Decl:
    name: str
    dtype: DType
    shape: tuple
    line: int


SOURCE = "# test\nx: f32[N, D]\nw: f32[D]\nn: i32[N]\ny = x * w\nreturn y, x.sum(axis=1)\n"


@dataclass
class FakeProgram:
    """The part of `tgc.api.Program` the CLI uses; `run` computes with numpy, `off` perturbs one output element."""

    path: str = "fake.tg"
    source: str = SOURCE
    inputs: list = field(default_factory=lambda: [Decl("x", dtypes.f32, ("N", "D"), 2),
                                                  Decl("w", dtypes.f32, ("D",), 3), Decl("n", dtypes.i32, ("N",), 4)])
    output_names: list = field(default_factory=lambda: ["y", "out1"])
    off: float = 0.0
    calls: list = field(default_factory=list)

    @property
    def dim_names(self):
        return tgc.loads(self.source, self.path).dim_names

    def resolve_dims(self, dims):
        return tgc.loads(self.source, self.path).resolve_dims(dims)

    def conform(self, name, value, cast=False):  # the real binder's dtype rule, on this program's source
        return tgc.loads(self.source, self.path).conform(name, value, cast)

    def bind(self, arrays, dims=None):  # -> (dims, arrays) like tgc.api.Program.bind
        dims = dict(dims or {})
        for d in self.inputs:
            if d.name not in arrays:
                raise BindError(f"missing input '{d.name}'", need="input", name=d.name, hint="pass an array")
            arr = arrays[d.name]
            if arr.ndim != len(d.shape):
                raise TgcError(f"input '{d.name}' has rank {arr.ndim}, declared {len(d.shape)}")
            for axis, s in enumerate(d.shape):
                size = s if isinstance(s, int) else dims.setdefault(s, arr.shape[axis])
                if size != arr.shape[axis]:
                    raise TgcError(f"input '{d.name}' axis {axis}: {s} is {size} but the array has {arr.shape[axis]}")
        return dims, arrays

    def reference(self, dims=None, **a):
        x, w = a["x"].astype(np.float64), a["w"].astype(np.float64)
        return {"y": x * w, "out1": x.sum(axis=1)}

    def reference_with_scale(self, dims=None, **a):
        ref = self.reference(dims, **a)
        return ref, {k: np.abs(v) for k, v in ref.items()}  # elementwise work: the values' own size

    def run(self, device=None, dims=None, **a):
        self.calls.append(("run", device, dims))
        out = {k: v.astype(np.float32) for k, v in self.reference(dims, **a).items()}
        out["y"].reshape(-1)[-1] += self.off
        return out

    def identity(self, device, dims):
        from tgc.backends import get_device
        from tgc.engine.bench import identity
        return identity(self, get_device(device or "CPU"), dims)

    def bench(self, **kw):
        self.calls.append(("bench", kw))
        k = {"name": "E_4_8", "line": 5, "median_s": 1e-5, "min_s": 0.9e-5, "max_s": 1.2e-5, "gflops": 1.5,
             "gbps": 3.0, "peak_share": 0.01}
        from tgc.backends import get_device
        from tgc.engine.bench import identity
        doc = {"device": "CPU", "dims": kw["dims"], "repeat": kw["repeat"], "kernels": [k],
               "program": {"median_s": 2e-5, "min_s": 1.9e-5, "max_s": 2.5e-5},
               "identity": identity(self, get_device(kw["device"] or "CPU"), kw["dims"])}
        return doc

    def compile(self, device=None, dims=None):
        self.calls.append(("compile", device, dims))
        return [SimpleNamespace(name=f"E_{i}", line=5, src=f"__kernel void E_{i}() {{}}", binary=None,
                                compile_error="no OpenCL compiler here", uops=[]) for i in range(2)]

    def beam(self, device=None, dims=None, width=None, progress=None, force=False, budget_s=None, started=None):
        self.calls.append(("beam", width, force))
        progress({"kernel": "E_4_8", "index": 0, "total": 1, "round": 0, "candidate": 1, "candidates": 2,
                  "best_s": 1e-5, "base_s": 2e-5})
        return {"device": "CPU", "width": width, "kernels": [{"name": "E_4_8", "before_s": 2e-5, "after_s": 1e-5,
                                                              "opts": ["UPCAST(0,4)"]}]}


@pytest.fixture
def fake(monkeypatch, tmp_path):
    prog = FakeProgram(path=str(tmp_path / "fake.tg"))
    (tmp_path / "fake.tg").write_text(SOURCE)
    monkeypatch.setattr(tgc.api, "load", lambda path: prog)
    monkeypatch.chdir(tmp_path)
    return prog


def invoke(*args, env=None):
    return CliRunner(env={"NO_COLOR": "1", "DEBUG": None, "TGC_DEVICE": None, **(env or {})}).invoke(main, list(args))


def save(path, arr):
    np.save(path, arr)
    return str(path)


# ---------------------------------------------------------------------------------------------------------------
# inputs


def test_read_npy_rejects_pickles_text_archives_and_missing_files(tmp_path):
    obj = tmp_path / "obj.npy"
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    text = tmp_path / "t.npy"
    text.write_text("hello")
    npz = tmp_path / "a.npz"
    np.savez(npz, x=np.ones(2))
    cases = {str(obj): "pickled", str(text): "not a .npy file", str(npz): ".npz archive",
             str(tmp_path / "nope.npy"): "no such file", str(tmp_path): "directory"}
    for path, words in cases.items():
        with pytest.raises(TgcError) as e:
            inputs.read_npy("x", path)
        assert "input 'x'" in e.value.msg and words in e.value.msg and e.value.exit_code == 2


def test_read_npy_truncated_and_complex(tmp_path):
    good = save(tmp_path / "g.npy", np.arange(100, dtype=np.float32))
    data = open(good, "rb").read()
    (tmp_path / "cut.npy").write_bytes(data[:-40])
    with pytest.raises(TgcError, match="cannot load"):
        inputs.read_npy("x", str(tmp_path / "cut.npy"))
    with pytest.raises(TgcError, match="complex128"):
        inputs.read_npy("x", save(tmp_path / "c.npy", np.ones(3, np.complex128)))


def test_big_endian_arrays_become_native(tmp_path):
    arr = inputs.read_npy("x", save(tmp_path / "b.npy", np.arange(3, dtype=">f4")))
    assert arr.dtype == np.float32 and arr.dtype.isnative and arr.tolist() == [0, 1, 2]


def test_gather_unknown_names_suggest_the_closest():
    prog = FakeProgram()
    with pytest.raises(TgcError) as e:
        inputs.gather(prog, None, [("xx", "whatever.npy")], cast=False)
    assert "unknown input 'xx'" in e.value.msg and "did you mean 'x'" in e.value.hint


def test_gather_dtype_mismatch_points_at_the_declaration(tmp_path):
    prog = FakeProgram()
    path = save(tmp_path / "x.npy", np.ones((2, 3), np.float64))
    with pytest.raises(TgcError) as e:
        inputs.gather(prog, None, [("x", path)], cast=False)
    assert "input 'x' is f64" in e.value.msg and "--cast" in e.value.hint and e.value.line == 2
    assert "x: f32[N, D]" in e.value.format()
    got = inputs.gather(prog, None, [("x", path)], cast=True)
    assert got["x"].dtype == np.float32


def test_npz_and_overrides(tmp_path):
    prog = FakeProgram()
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.zeros((2, 3), np.float32), w=np.ones(3, np.float32))
    x2 = save(tmp_path / "x2.npy", np.full((2, 3), 7, np.float32))
    got = inputs.gather(prog, str(npz), [("x", x2)], cast=False)
    assert got["x"][0, 0] == 7 and got["w"].tolist() == [1, 1, 1]
    np.savez(tmp_path / "extra.npz", x=np.zeros((2, 3), np.float32), bogus=np.ones(1), blob=np.array(["s"]))
    notes: list[str] = []
    got = inputs.gather(prog, str(tmp_path / "extra.npz"), [], cast=False, notes=notes)
    assert list(got) == ["x"]  # the extra arrays are ignored unread (a string array would be refused)
    assert notes == [f"note: ignored 2 arrays of '{tmp_path / 'extra.npz'}' that the program does not declare: "
                     "bogus, blob"]
    with pytest.raises(TgcError, match="unknown input 'bogus'"):  # -i still names only declared inputs
        inputs.gather(prog, None, [("bogus", x2)], cast=False)


def test_random_is_deterministic_per_input_and_needs_dims():
    prog = FakeProgram()
    a = inputs.fill_random(prog, {}, {"N": 3, "D": 4}, seed=5)
    b = inputs.fill_random(prog, {"x": a["x"] + 1}, {"N": 3, "D": 4}, seed=5)
    c = inputs.fill_random(prog, {}, {"N": 3, "D": 4}, seed=6)
    assert a["x"].shape == (3, 4) and a["x"].dtype == np.float32 and a["n"].dtype == np.int32
    assert np.array_equal(a["w"], b["w"]) and not np.array_equal(a["w"], c["w"])
    assert np.abs(a["n"]).max() <= 8
    # dims come from the given arrays when not on the command line
    d = inputs.fill_random(prog, {"x": np.zeros((5, 2), np.float32)}, {}, seed=0)
    assert d["w"].shape == (2,) and d["n"].shape == (5,)
    with pytest.raises(TgcError, match=r"dim D is unknown: give -D D=INT"):
        inputs.fill_random(prog, {}, {"N": 3}, seed=0)


def test_random_bool_and_bf16():
    b = inputs.random_array(Decl("m", dtypes.bool, (64,), 1), {}, 0, 0)
    assert b.dtype == np.bool_ and 0 < b.sum() < 64
    h = inputs.random_array(Decl("h", dtypes.bf16, (8,), 1), {}, 0, 0)
    assert h.dtype == np.uint16


def test_bf16_rounding_round_trips():
    x = np.array([1.0, -2.5, 3.14159, np.inf, 1e-3], np.float32)
    back = bf16_to_f32(f32_to_bf16(x))
    assert np.allclose(back, x, rtol=1e-2) and np.isinf(back[3])
    assert np.isnan(bf16_to_f32(f32_to_bf16(np.array([np.nan], np.float32))))[0]


def test_check_dims_unknown_and_missing():
    prog = FakeProgram()
    [warning] = inputs.check_dims(prog, {"DD": 3, "N": 2}, require_all=False)
    assert "no dim DD" in warning and "did you mean 'D'" in warning
    with pytest.raises(TgcError, match="dim D is unknown"):
        inputs.check_dims(prog, {"N": 3}, require_all=True)


# ---------------------------------------------------------------------------------------------------------------
# --check


def test_compare_tolerance_and_worst_element():
    ref = np.array([[1.0, 2.0], [3.0, 100.0]])
    ok, ratio = check.compare("y", (ref * (1 + 5e-5)).astype(np.float32), ref, "f32")
    assert ok is None and 0 < ratio < 1
    got = ref.astype(np.float32).copy()
    got[1, 0] = 3.5
    bad, _ = check.compare("y", got, ref, "f32")
    assert bad is not None and bad.index == (1, 0) and bad.bad == 1
    assert "y[1, 0]: got 3.5, expected 3" in bad.describe()
    assert check.compare("y", got, ref, "f16")[0] is None  # 1e-2 * (3 + 100) > 0.5
    got[1, 0] = 5.0
    assert check.compare("y", got, ref, "f16")[0] is not None
    assert check.compare("y", got, ref, "f32", rtol=0.1)[0] is None
    # the output's scale (max |ref|, at least 1) bounds elements near zero
    small = np.array([1e-8, 1.0])
    assert check.compare("y", np.array([5e-5, 1.0], np.float32), small, "f32")[0] is None
    assert check.compare("y", np.array([3e-4, 1.0], np.float32), small, "f32")[0] is not None


def test_compare_nan_inf_ints_and_shapes():
    ref = np.array([np.nan, np.inf, -np.inf, 0.0])
    assert check.compare("y", ref.astype(np.float32), ref, "f32")[0] is None
    assert check.compare("y", np.array([np.nan, -np.inf, -np.inf, 0], np.float32), ref, "f32")[0] is not None
    assert check.compare("i", np.array([1, 2], np.int32), np.array([1, 2]), "i32")[0] is None
    m, _ = check.compare("i", np.array([1, 3], np.int32), np.array([1, 2]), "i32")
    assert m.index == (1,) and m.got == 3
    assert "shape" in check.compare("y", np.zeros(3), np.zeros(4), "f32")[0].describe()


# ---------------------------------------------------------------------------------------------------------------
# outputs


def test_parse_out():
    assert outputs.parse_out("o.npz") == outputs.OutSpec("o.npz")
    assert outputs.parse_out("y=dir/y.npy") == outputs.OutSpec("dir/y.npy", "y")
    for bad in ("y=", "out.txt", "y=o.npz"):
        with pytest.raises(ValueError):
            outputs.parse_out(bad)


def test_write_files_leaves_targets_untouched_on_failure(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"old-a")
    b.write_bytes(b"old-b")

    def boom(f):
        f.write(b"partial")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        outputs.write_files([(str(a), lambda f: f.write(b"new-a")), (str(b), boom)])
    assert a.read_bytes() == b"old-a" and b.read_bytes() == b"old-b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.bin"]
    outputs.write_files([(str(a), lambda f: f.write(b"new-a"))])
    assert a.read_bytes() == b"new-a" and oct(a.stat().st_mode & 0o777) != "0o600"


def test_write_files_onto_a_directory_is_one_error_and_leaves_no_temporary_file(tmp_path):
    """A target that is a directory fails only at the rename: one TgcError (exit 2), no `.NAME.*.tmp` left behind
    (it was a NotADirectoryError with the staged file left in the directory)."""
    from tgc.errors import TgcError

    (tmp_path / "d").mkdir()
    with pytest.raises(TgcError, match="cannot write") as e:
        outputs.write_files([(str(tmp_path / "d"), lambda f: f.write(b"page"))])
    assert e.value.exit_code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_summarize():
    s = outputs.summarize(np.arange(10, dtype=np.int32))
    assert s["min"] == "0" and s["max"] == "9" and s["mean"] == "4.5" and s["values"].endswith(", ...]")
    assert outputs.summarize(np.zeros((0, 3)))["min"] == "-"
    assert outputs.summarize(np.array([True, False]))["mean"] == "0.5"


# ---------------------------------------------------------------------------------------------------------------
# bench/beam reports


def test_baseline_regression_needs_more_than_noise():
    old = {"kernels": [{"name": "k", "median_s": 1.0, "min_s": 0.9, "max_s": 1.1}],
           "program": {"median_s": 2.0, "min_s": 2.0, "max_s": 2.0}}
    new = {"kernels": [{"name": "k", "median_s": 1.15, "min_s": 1.1, "max_s": 1.2}],
           "program": {"median_s": 2.5, "min_s": 2.5, "max_s": 2.5}}
    rows = {r["name"]: r for r in report.compare_baseline(new, old)}
    assert not rows["k"]["regressed"]  # +15% but the spread was 20%
    assert rows["(program)"]["regressed"]
    # the interquartile range, where given, is the noise: one slow outlier does not hide a regression
    new["program"]["max_s"] = 100.0
    new["program"]["iqr_s"] = 0.1
    assert report.compare_baseline(new, old)[-1]["regressed"]
    new["kernels"].append({"name": "other", "median_s": 1.0})
    assert report.compare_baseline(new, old)[1]["change"] is None


def test_progress_bar_takes_beam_events():
    update, close = report.progress_bar(True)
    update({"kernel": "k", "index": 0, "total": 2, "round": 1, "candidate": 3, "candidates": 6, "best_s": 1e-3,
            "base_s": 2e-3})
    update({"kernel": "k2", "index": 1, "total": 2, "cached": True})
    close()


def test_rates_share_of_the_peak_that_applies():
    from tgc.engine.bench import rates
    peak = {"gflops": 100.0, "gbps": 10.0, "source": "measured", "cache_bytes": 1 << 20}
    big = rates(flops=10**9, nbytes=4 * 10**9, seconds=1.0, peak=peak, working_set=64 << 20)
    assert big["gbps"] == 4.0 and big["mem_share"] == pytest.approx(0.4) and big["flop_share"] == pytest.approx(0.01)
    assert big["peak_share"] == pytest.approx(0.4) and big["bound"] == "memory" and not big["in_cache"]
    # data that fits the cache: 30 GB/s "from memory" would be 300% of the peak; no memory share is given
    small = rates(flops=10**9, nbytes=3 * 10**10, seconds=1.0, peak=peak, working_set=512 << 10)
    assert small["in_cache"] and small["mem_share"] is None and small["bound"] == "compute"
    assert small["peak_share"] == pytest.approx(0.01)
    # up to 4 times the cache, part of the data is still served from it
    assert rates(10**9, 3 * 10**10, 1.0, peak, working_set=4 << 20)["in_cache"]
    assert not rates(10**9, 3 * 10**10, 1.0, peak, working_set=(4 << 20) + 1)["in_cache"]
    unknown = rates(flops=10**9, nbytes=10**9, seconds=1.0, peak={"gflops": None, "gbps": None}, working_set=8)
    assert unknown["peak_share"] is None and unknown["bound"] is None and not unknown["in_cache"]


def test_bench_table_marks_cache_and_unknown_peaks():
    kernel = {"name": "k", "median_s": 1e-3, "gflops": 1.0, "gbps": 30.0, "peak_share": None, "in_cache": True}
    doc = {"device": "CPU", "repeat": 3, "kernels": [kernel], "program": dict(kernel, name=None),
           "peak": {"gflops": 100.0, "gbps": 10.0, "source": "measured", "cache_bytes": 32 << 20},
           "working_set_bytes": 3 << 20}
    text = _render(report.bench_table(doc))
    assert "30 (cache)" in text and "in cache" in text and "%" not in text
    note = report.peak_note(doc)
    assert "100 GFLOP/s, 10 GB/s (measured on this machine)" in note and "3 MiB" in note and "32 MiB" in note
    assert "not a share of the memory peak" in note
    doc["kernels"] = [dict(kernel, in_cache=False, peak_share=0.5, bound="memory")]
    assert "50.0% mem" in _render(report.bench_table(doc))
    doc = {"device": "PYTHON", "kernels": [dict(kernel, in_cache=False)], "peak": {"gflops": None, "gbps": None}}
    assert "%" not in _render(report.bench_table(doc))
    assert report.peak_note(doc) == "peak: unknown for PYTHON, so no share of it is shown"


def test_bench_peak_note_names_the_copy_and_the_read():
    """The CPU's memory peak is a copy counted as bytes read + written; the read peak is named beside it."""
    doc = {"device": "CPU", "peak": {"gflops": 100.0, "gbps": 20.0, "copy_gbps": 20.0, "read_gbps": 30.0,
                                     "source": "measured"}}
    assert report.peak_note(doc) == ("peak: 100 GFLOP/s, 20 GB/s (a threaded copy, bytes read + written; a threaded "
                                     "read: 30 GB/s) (measured on this machine)")


def test_bench_of_a_device_without_a_peak_shows_no_share():
    """PYTHON has no peak figures: every share is None, never 0%."""
    p = tgc.loads("x: f32[N]\nreturn x[::16] * 2.0")
    doc = p.bench(device="PYTHON", dims={"N": 4096}, repeat=1)
    assert doc["peak"]["gflops"] is None and doc["peak"]["gbps"] is None and doc["peak"]["source"] == "unknown"
    assert all(r["peak_share"] is None for r in (*doc["kernels"], doc["program"]))
    assert doc["kernels"][0]["bytes"] == (256 + 256) * 4 and doc["kernels"][0]["flops"] == 256


def _render(table) -> str:
    from rich.console import Console
    console = Console(width=200, no_color=True)
    with console.capture() as cap:
        console.print(table)
    return cap.get()


def test_fmt_time():
    assert [report.fmt_time(t) for t in (2.0, 0.0123, 4.5e-6, 3e-9, None)] == ["2 s", "12.3 ms", "4.5 us", "3 ns",
                                                                            "-"]


# ---------------------------------------------------------------------------------------------------------------
# commands over the stand-in program


def test_run_prints_a_table(fake):
    r = invoke("run", "fake.tg", "--random", "-D", "N=2", "-D", "D=3")
    assert r.exit_code == 0, r.output
    assert "y" in r.stdout and "out1" in r.stdout and "(2, 3)" in r.stdout and "f32" in r.stdout


def test_run_missing_input_names_it(fake):
    r = invoke("run", "fake.tg")
    assert r.exit_code == 2
    assert "missing input 'x'" in r.stderr and "--random" in r.stderr and "Traceback" not in r.output


def test_run_check_pass_and_fail(fake):
    r = invoke("run", "fake.tg", "--random", "-D", "N=2", "-D", "D=3", "--check")
    assert r.exit_code == 0 and "check: ok" in r.stderr
    fake.off = 1.0
    r = invoke("run", "fake.tg", "--random", "-D", "N=2", "-D", "D=3", "--check", "-o", "out.npz")
    assert r.exit_code == 1 and "output 'y'" in r.stderr and "y[1, 2]" in r.stderr
    assert not os.path.exists("out.npz")


def test_run_writes_npz_and_npy(fake, tmp_path):
    r = invoke("run", "fake.tg", "--random", "-D", "N=2", "-D", "D=3", "-o", "all.npz", "-o", "y=y.npy")
    assert r.exit_code == 0, r.output
    with np.load(tmp_path / "all.npz") as z:
        assert sorted(z.files) == ["out1", "y"] and z["y"].shape == (2, 3)
    assert np.load(tmp_path / "y.npy").shape == (2, 3)


def test_run_bad_output_name_and_dir(fake):
    r = invoke("run", "fake.tg", "--random", "-D", "N=2", "-D", "D=3", "-o", "yy=y.npy")
    assert r.exit_code == 2 and "unknown output 'yy'" in r.stderr and "did you mean 'y'" in r.stderr
    r = invoke("run", "fake.tg", "--random", "-D", "N=2", "-D", "D=3", "-o", "nodir/o.npz")
    assert r.exit_code == 2 and "does not exist" in r.stderr
    r = invoke("run", "fake.tg", "--random", "-D", "N=2", "-D", "D=3", "-o", "o.npy")
    assert r.exit_code == 2 and "2 outputs" in r.stderr
    assert fake.calls == []  # nothing ran


def test_run_usage_errors(fake):
    assert invoke("run", "fake.tg", "-D", "N").exit_code == 2
    assert invoke("run", "fake.tg", "-D", "N=x").exit_code == 2
    assert invoke("run", "fake.tg", "-i", "x.npy").exit_code == 2
    assert invoke("run", "fake.tg", "--seed", "3").exit_code == 2
    assert invoke("run", "missing.tg").exit_code == 2


def test_run_size_mismatch_from_bind(fake, tmp_path):
    x = save(tmp_path / "x.npy", np.zeros((2, 3), np.float32))
    w = save(tmp_path / "w.npy", np.zeros(4, np.float32))
    r = invoke("run", "fake.tg", "-i", f"x={x}", "-i", f"w={w}", "--random")
    assert r.exit_code == 2 and "input 'w'" in r.stderr


def test_internal_errors_are_one_line(fake, monkeypatch):
    def broken(**kw):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(fake, "run", broken)
    r = invoke("run", "fake.tg", "--random", "-D", "N=2", "-D", "D=3")
    assert r.exit_code == 1 and "error: internal error: ZeroDivisionError: boom" in r.stderr
    assert "Traceback" not in r.stderr
    r = invoke("run", "fake.tg", "--random", "-D", "N=2", "-D", "D=3", env={"DEBUG": "1"})
    assert r.exit_code == 1 and "Traceback" in r.stderr


def test_tgc_error_gets_the_file_name(fake, monkeypatch):
    def bad_bind(arrays, dims=None):  # a source error without a file name
        raise TgcError("cannot broadcast", line=5, col=5, end_col=10)

    monkeypatch.setattr(fake, "bind", bad_bind)
    r = invoke("run", "fake.tg", "--random", "-D", "N=2", "-D", "D=3")
    assert r.exit_code == 2
    assert "fake.tg:5:5: error: cannot broadcast" in r.stderr and "y = x * w" in r.stderr and "^" in r.stderr


def test_bench_json_and_baseline(fake, tmp_path, monkeypatch):
    from tgc.baselines import numpy_eval

    timed = []
    monkeypatch.setattr(numpy_eval, "time_numpy", lambda prog, dims, inputs, repeat, median: timed.append(
        (dims, inputs, repeat)) or {"median_s": 4e-5, "min_s": 4e-5, "max_s": 5e-5})
    r = invoke("bench", "fake.tg", "-D", "N=2", "-D", "D=3", "--json", "--vs", "numpy", "--repeat", "3")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kernels"][0]["name"] == "E_4_8" and doc["numpy_ratio"] == pytest.approx(2.0)
    kw = fake.calls[-1][1]
    assert kw["repeat"] == 3 and kw["inputs"]["x"].shape == (2, 3)
    assert len(timed) == 1 and timed[0][1] is kw["inputs"] and timed[0][2] == 3
    slow = dict(doc, program={"median_s": 1e-5, "min_s": 1e-5, "max_s": 1e-5})
    (tmp_path / "old.json").write_text(json.dumps(slow))
    r = invoke("bench", "fake.tg", "-D", "N=2", "-D", "D=3", "--baseline", "old.json")
    assert r.exit_code == 1 and "regression" in r.stderr and "(program)" in r.stderr
    r = invoke("bench", "fake.tg", "-D", "N=2", "-D", "D=3")
    assert r.exit_code == 0 and "E_4_8" in r.stdout


@pytest.mark.parametrize("change, words", [
    ({"dims": {"D": 4, "N": 2}}, "other dims (D=4 N=2, not D=3 N=2)"),
    ({"program_sha256": "0" * 64, "file": "other.tg"}, "another program (other.tg, not "),
    ({"program_sha256": "0" * 64}, "another program (the source of "),
    ({"device": "PYTHON"}, "another device (PYTHON, not CPU)"),
    ({"device_model": "Some Other CPU (64 threads)"}, "another device (Some Other CPU (64 threads), not "),
    ({"tgc_version": "0.0.1"}, "another tgc version (0.0.1, not "),
    (None, "does not say which program"),
])
def test_baseline_of_another_run_is_refused(fake, tmp_path, change, words):
    r = invoke("bench", "fake.tg", "-D", "N=2", "-D", "D=3", "--json")
    doc = json.loads(r.stdout)
    assert set(doc["identity"]) == {"program_sha256", "file", "dims", "device", "device_model", "tgc_version"}
    if change is None:
        del doc["identity"]
    else:
        doc["identity"].update(change)
    (tmp_path / "old.json").write_text(json.dumps(doc))
    runs = len(fake.calls)
    r = invoke("bench", "fake.tg", "-D", "N=2", "-D", "D=3", "--baseline", "old.json")
    assert r.exit_code == 2 and words in r.stderr and "cannot be compared" in r.stderr or change is None, r.stderr
    assert r.exit_code == 2 and "--baseline: 'old.json'" in r.stderr and "tgc bench ... --json" in r.stderr
    assert len(fake.calls) == runs  # refused before anything was timed


def test_beam_json(fake):
    r = invoke("beam", "fake.tg", "-D", "N=2", "-D", "D=3", "--json", "--width", "2")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["width"] == 2
    assert fake.calls[-1] == ("beam", 2, False)
    r = invoke("beam", "fake.tg", "-D", "N=2", "-D", "D=3", "--width", "8", "--force")
    assert r.exit_code == 0, r.output
    assert fake.calls[-1] == ("beam", 8, True)
    r = invoke("beam", "fake.tg", "-D", "N=2")
    assert r.exit_code == 2 and "dim D is unknown" in r.stderr


def test_cache_commands(tmp_path, monkeypatch):
    env = {"TGC_CACHE_DIR": str(tmp_path / "c")}
    from tgc import cache as c

    c._reset_for_tests()
    monkeypatch.setenv("TGC_CACHE_DIR", env["TGC_CACHE_DIR"])  # (restored after: the session's cache, conftest.py)
    try:
        c.put("compile", c.make_key("k"), b"abc", meta="kern CPU")
        r = invoke("cache", "stats", "--json", env=env)
        assert r.exit_code == 0 and json.loads(r.stdout)["entries"]["compile"] == 1
        r = invoke("cache", "list", env=env)
        assert r.exit_code == 0 and "kern CPU" in r.stdout
        r = invoke("cache", "clear", "--table", "compile", env=env)
        assert r.exit_code == 0 and "1 entry removed" in r.stdout
        assert json.loads(invoke("cache", "list", "--json", env=env).stdout) == []
    finally:
        c._reset_for_tests()


def test_compile_renders_without_a_compiler(fake, tmp_path):
    r = invoke("compile", "fake.tg", "-d", "OPENCL", "-D", "N=2", "-D", "D=3")
    assert r.exit_code == 0, r.output
    assert "note: could not compile for OPENCL: no OpenCL compiler here" in r.stderr
    assert "// kernel E_0 (fake.tg:5)" in r.stdout and "__kernel void E_1" in r.stdout
    r = invoke("compile", "fake.tg", "-d", "OPENCL", "-D", "N=2", "-D", "D=3", "-o", "out")
    assert r.exit_code == 0 and sorted(os.listdir(tmp_path / "out")) == [".tgc-compile.json", ".tgc-compile.lock",
                                                                          "00_E_0.cl", "01_E_1.cl"]
    for emit in ("bin", "asm"):
        r = invoke("compile", "fake.tg", "-d", "OPENCL", "-D", "N=2", "-D", "D=3", "--emit", emit)
        assert r.exit_code == 1 and f"--emit {emit}: could not compile for OPENCL" in r.stderr
    r = invoke("compile", "fake.tg", "-d", "OPENCL", "-D", "N=2", "-D", "D=3", "--emit", "ir")
    assert r.exit_code == 2 and "LLVM IR" in r.stderr


@pytest.mark.parametrize("threads", ["1", "3"])
def test_read_bandwidth_kernel_reads_every_element(monkeypatch, threads):
    """The CPU's memory peak includes a threaded read; it checks its own sum (every element read once)."""
    from tgc.backends import get_device
    from tgc.backends.cpu_peak import measure_read_bandwidth
    monkeypatch.setenv("TGC_THREADS", threads)
    gbps = measure_read_bandwidth(get_device("CPU"), nbytes=3 << 20)
    assert 0 < gbps < float("inf")


@pytest.mark.parametrize("threads", ["1", "3"])
def test_copy_bandwidth_kernel_copies_every_element(monkeypatch, threads):
    """The CPU's memory peak includes a hand-written threaded copy; it checks that every element arrived."""
    from tgc.backends import get_device
    from tgc.backends.cpu_peak import measure_copy_bandwidth
    monkeypatch.setenv("TGC_THREADS", threads)
    gbps = measure_copy_bandwidth(get_device("CPU"), nbytes=3 << 20)
    assert 0 < gbps < float("inf")


class _TimedCopy:
    """A stand-in CPU device whose `copy_peak` copies with numpy and reports one second per launch."""

    cores = 2

    def __init__(self, copy: bool = True):
        self.copy, self.launches = copy, []
        self.compiler = type("C", (), {"compile": staticmethod(lambda src: src.encode())})()

    def program(self, name, lib):
        assert name == "copy_peak" and b"store <16 x float>" in lib

        def run(dst, src, global_size, vals, wait):
            self.launches.append((global_size, vals, src.nbytes))
            if self.copy:
                dst[:] = src
            return 1.0
        return run


def test_copy_bandwidth_counts_bytes_read_plus_bytes_written():
    """Every float of the buffer counts 8 bytes (4 read, 4 written): one second for 2 x 4 MiB is 8.39 GB/s."""
    from tgc.backends.cpu_peak import copy_bytes_counted, measure_copy_bandwidth, peak_buffer_bytes
    dev = _TimedCopy()
    assert measure_copy_bandwidth(dev, nbytes=4 << 20) == 2 * (4 << 20) / 1e9
    (grid, (chunk,), nbytes), *_ = dev.launches
    assert grid == (2, 1, 1) and chunk * 2 * 64 == nbytes == 4 << 20 and len(dev.launches) == 5
    assert copy_bytes_counted(3) == 6
    assert peak_buffer_bytes() >= 64 << 20


def test_copy_bandwidth_refuses_a_copy_that_did_not_arrive():
    from tgc.backends.cpu_peak import measure_copy_bandwidth
    with pytest.raises(RuntimeError, match="did not copy every element"):
        measure_copy_bandwidth(_TimedCopy(copy=False), nbytes=1 << 20)


def test_the_memory_peak_is_the_copy_bandwidth(monkeypatch):
    """`gbps` (what `tgc bench` and bench/bench.py take shares of) is the copy's, with the read's beside it."""
    from tgc.backends import cpu_peak, get_device
    monkeypatch.setattr(cpu_peak, "measure_copy_bandwidth", lambda dev: 20.0)
    monkeypatch.setattr(cpu_peak, "measure_read_bandwidth", lambda dev: 30.0)
    peak = cpu_peak.measure_peak(get_device("CPU"))
    assert (peak["gbps"], peak["copy_gbps"], peak["read_gbps"]) == (20.0, 20.0, 30.0) and peak["gflops"] > 0


def test_fma_peak_timed_like_a_workload_scales_its_runs_and_takes_their_median(monkeypatch):
    """bench/bench.py compares a kernel's median time with FMA runs about as long as its own (`seconds`): the
    loop count is a launch value scaled from two short calibration runs, and the median of 5 runs counts."""
    from tgc.backends import cpu_peak, get_device
    dev = get_device("CPU")
    calls, times = [], iter([0.001, 0.002] + [0.004, 0.005, 0.0045, 0.006, 0.0041] + [0.002, 0.001, 0.003, 0.004,
                                                                                    0.005])

    class Prog:
        def __call__(self, out, global_size, vals, wait):
            calls.append(vals)
            return next(times)
    monkeypatch.setattr(dev, "program", lambda name, binary: Prog())
    got = cpu_peak.measure_fma_peak(dev, seconds=0.004)
    assert calls == [(2_000_000,)] * 2 + [(8_000_000,)] * 5  # 2e6 iterations took 1 ms: 4 ms is 8e6
    assert got == pytest.approx(dev.cores * 8_000_000 * 12 * 32 / 0.0045 / 1e9)
    calls.clear()
    assert cpu_peak.measure_fma_peak(dev) == pytest.approx(dev.cores * 2_000_000 * 12 * 32 / 0.001 / 1e9)
    assert calls == [(2_000_000,)] * 5  # without `seconds`: the best of 5 short runs


def test_fma_peak_kernel_runs_on_real_threads(monkeypatch):
    from tgc.backends import get_device
    from tgc.backends.cpu_peak import measure_fma_peak
    monkeypatch.setenv("TGC_THREADS", "3")
    assert 0 < measure_fma_peak(get_device("CPU"), seconds=0.001) < float("inf")


def test_bench_paired_share_uses_the_better_peak_beside_each_timing(monkeypatch):
    """bench/bench.py: a compute-bound share compares each timing with the better of the FMA peaks measured just
    before and after it, the median per kernel (default, BEAM), the better kernel's."""
    import importlib.util
    monkeypatch.setenv("TGC_BENCH_UNFORCED", "test")  # the module re-executes itself without forced BLAS cores
    bench_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    monkeypatch.syspath_prepend(bench_dir)
    spec = importlib.util.spec_from_file_location("tgc_bench_script", os.path.join(bench_dir, "bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # [tuned, seconds, GFLOP/s of the FMA peak right after]; 1 GFLOP of work
    pairs = [[False, 0.1, 100.0], [True, 0.1, 200.0], [False, 0.05, 150.0], [True, 0.2, 50.0], [False, 0.1, 10.0]]
    # default: 10/100, 20/max(150, 200), 10/max(10, 150): median 0.1; BEAM: 10/200, 5/150
    assert mod.paired_share(1e9, pairs) == pytest.approx(0.1)
    assert mod.paired_share(1e9, [[True, 0.5, 4.0]]) == pytest.approx(0.5)


def test_a_file_name_near_the_limit_is_written_and_one_over_it_refused_before_the_work(tmp_path):
    # a name of 250 bytes is legal (255 on common file systems): its staged twin must fit too; one of 300 is
    # refused by check_writable (before a run), exit 2, naming its length. Nothing is left behind either way.
    from tgc.errors import TgcError

    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    ok = tmp_path / ("a" * (limit - 5) + ".npz")
    outputs.check_writable(str(ok))
    outputs.write_files([(str(ok), lambda f: f.write(b"data"))])
    assert ok.read_bytes() == b"data"
    long = tmp_path / ("\u00e9" * limit + ".npz")  # (2 bytes a character: the limit is in bytes)
    with pytest.raises(TgcError, match="file name too long") as e:
        outputs.check_writable(str(long))
    assert e.value.exit_code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [ok.name]


def test_compile_o_a_directory_that_cannot_be_made_is_refused_before_the_work(fake, monkeypatch, tmp_path):
    # `compile -o DIR` with a name over NAME_MAX failed only after the compile ("cannot create the directory: File
    # name too long"), and `-o missing_parent/<256 bytes>` left missing_parent/ behind (os.makedirs made it first):
    # now refused before the program is even loaded, exit 2, in check_writable's words, nothing made
    from tgc.cli import emit

    real_load = tgc.api.load

    def no_work(path):
        raise AssertionError("the program was loaded: the -o check came after the work")
    monkeypatch.setattr(tgc.api, "load", no_work)
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    (tmp_path / "f.txt").write_text("x")
    before = sorted(os.listdir(tmp_path))
    long, longer = "d" * (limit + 1), "\u00e9" * (limit // 2 + 3)  # (2 bytes a character: the limit is in bytes)
    cases = [(long, f"file name too long ({limit + 1} bytes; at most {limit} here)"),
             ("missing_parent/" + long, f"file name too long ({limit + 1} bytes; at most {limit} here)"),
             (f"mp/{longer}/x", f"file name too long ('{longer[:40]}...': {2 * len(longer)} bytes; at most {limit}"),
             ("f.txt/x", "'f.txt' is not a directory"),
             ("f.txt", "it is a file, not a directory")]
    for out, words in cases:
        r = invoke("compile", "fake.tg", "-D", "N=2", "-D", "D=3", "-o", out)
        assert r.exit_code == 2 and r.stderr.startswith("error: -o ") and words in r.stderr, (out, r.stderr)
        assert "Traceback" not in r.stderr and "File name" not in r.stderr
        assert sorted(os.listdir(tmp_path)) == before, out
    assert "use a shorter directory name" in invoke("compile", "fake.tg", "-o", long).stderr
    real_access = os.access  # an ancestor that cannot be written (a plain user's read-only directory)
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if (mode & os.W_OK and str(p) == str(tmp_path))
                        else real_access(p, mode, **k))
    with pytest.raises(TgcError, match="permission denied") as e:
        emit.check_outdir(str(tmp_path / "new" / "sub"))
    assert e.value.exit_code == 2 and sorted(os.listdir(tmp_path)) == before
    monkeypatch.setattr(os, "access", real_access)
    monkeypatch.setattr(tgc.api, "load", real_load)  # (the fake program) a name within the limits is made
    r = invoke("compile", "fake.tg", "-d", "OPENCL", "-D", "N=2", "-D", "D=3", "-o", "new/" + "s" * limit)
    assert r.exit_code == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "new" / ("s" * limit))) == [".tgc-compile.json", ".tgc-compile.lock",
                                                                     "00_E_0.cl", "01_E_1.cl"]


def test_a_directory_path_over_path_max_is_said_too_long_not_missing(tmp_path):
    # an existing directory whose path is longer than PATH_MAX: os.path.isdir says False for it as for a missing
    # one; the message must give the real reason (the path is too long), exit 2, nothing written
    from tgc.errors import TgcError

    deep, depth = str(tmp_path), 0
    fd = os.open(deep, os.O_RDONLY)
    try:
        while len(deep) <= os.pathconf(tmp_path, "PC_PATH_MAX"):  # (made relative to a descriptor: no long path)
            os.mkdir("d" * 200, dir_fd=fd)
            nxt = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd, deep, depth = nxt, deep + "/" + "d" * 200, depth + 1
    finally:
        os.close(fd)
    with pytest.raises(TgcError, match="cannot be reached .file name too long") as e:
        outputs.check_writable(deep + "/out.npz")
    assert e.value.exit_code == 2 and "does not exist" not in str(e.value)
    with pytest.raises(TgcError, match="does not exist"):  # a missing directory is still said so
        outputs.check_writable(str(tmp_path / "missing" / "out.npz"))


def test_check_outdir_with_the_working_directory_gone_refuses_and_ends(tmp_path, monkeypatch):
    # (the CLI refuses a removed working directory at its start; the check itself must end too, not climb '.')
    from tgc.cli.emit import check_outdir
    from tgc.errors import TgcError

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(TgcError, match="working directory cannot be reached"):
        check_outdir("a/b")


def _wait_for_interrupt(seconds: float = 10.0) -> None:
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.001)


def test_ctrl_c_inside_a_weakref_callback_or_del_is_raised_after_it_returns(monkeypatch):
    # Python drops an exception raised inside a weakref callback or __del__ ("Exception ignored"): the CLI's
    # handler raises the signal again there, so KeyboardInterrupt reaches the code around it (a review saw Ctrl-C
    # swallowed in the node table's callback and `tgc beam` run on to exit 0)
    import signal
    import weakref

    from tgc.cli import main as cli_main
    from tgc.ir import uop

    assert uop._forget in uop.WEAKREF_CALLBACKS
    old = signal.signal(signal.SIGINT, cli_main._on_sigint)
    try:
        class Dying:
            def __del__(self):
                cli_main._on_sigint(signal.SIGINT, sys._getframe())  # (as if Ctrl-C came here)

        after_del = []
        with pytest.raises(KeyboardInterrupt):
            d = Dying()
            del d
            after_del.append(True)  # (reached: the interrupt is raised after __del__ returned)
            _wait_for_interrupt()
        assert after_del == [True]

        class Node:
            pass

        def callback(ref):  # a weakref callback registered as the node table's are
            cli_main._on_sigint(signal.SIGINT, sys._getframe())
        monkeypatch.setattr(uop, "WEAKREF_CALLBACKS", (callback,))
        with pytest.raises(KeyboardInterrupt):
            n = Node()
            r = weakref.ref(n, callback)
            del n
            _wait_for_interrupt()
        assert r() is None
        with pytest.raises(KeyboardInterrupt):  # elsewhere: at once, as Python's own handler
            cli_main._on_sigint(signal.SIGINT, sys._getframe())
    finally:
        signal.signal(signal.SIGINT, old)


def test_compile_o_through_a_dangling_symlink_is_refused_before_the_work(tmp_path):
    # `-o link` and `-o link/sub` where link points nowhere: os.stat says ENOENT as for a missing name, and
    # os.makedirs failed only after the compile (exit 1 for `-o link`); refused first, exit 2, nothing made
    from tgc.cli.emit import check_outdir

    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere" / "x")
    for target in (link, link / "sub"):
        with pytest.raises(TgcError, match="symbolic link to .*which does not exist") as e:
            check_outdir(str(target))
        assert e.value.exit_code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling"]


def test_the_output_checks_share_one_directory_check_and_keep_their_messages(tmp_path, monkeypatch):
    """`check_writable` (a file), `emit.check_outdir` on an existing directory and on one to create share
    `outputs.check_dir_writable` (os.access, then a probe file) and `name_too_long`: each keeps its own words,
    a refused access is a user error (exit 2), a full disk met by the probe a runtime one (exit 1)."""
    import errno

    from tgc.cli import emit, outputs

    out, new = str(tmp_path / "o.npz"), str(tmp_path / "new")
    real_access, real_open = os.access, os.open
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if mode & os.W_OK else real_access(p, mode, **k))
    for refuse, arg, words in ((outputs.check_writable, out, f"cannot write '{out}': permission denied"),
                              (emit.check_outdir, str(tmp_path), f"-o {tmp_path}: cannot write into the directory: "
                                                                 "permission denied"),
                              (emit.check_outdir, new, f"-o {new}: cannot create the directory: '{tmp_path}': "
                                                       "permission denied")):
        with pytest.raises(TgcError) as e:
            refuse(arg)
        assert e.value.msg == words and e.value.exit_code == 2
    monkeypatch.setattr(os, "access", real_access)

    def full(path, *a, **k):
        if ".tgc-check-" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, *a, **k)

    monkeypatch.setattr(outputs.os, "open", full)
    for refuse, arg, words in ((outputs.check_writable, out, f"cannot write '{out}': no file can be made in "
                                                           f"'{tmp_path}' (no space left on device)"),
                              (emit.check_outdir, str(tmp_path), f"-o {tmp_path}: cannot write into the directory: "
                                                                 "no space left on device"),
                              (emit.check_outdir, new, f"-o {new}: cannot create the directory in '{tmp_path}': no "
                                                       "space left on device")):
        with pytest.raises(TgcError) as e:
            refuse(arg)
        assert e.value.msg == words and e.value.kind == "runtime"
    monkeypatch.setattr(outputs.os, "open", real_open)
    limit = outputs._name_max(str(tmp_path))
    assert outputs.name_too_long("a" * limit, str(tmp_path)) is None
    assert outputs.name_too_long("é" * limit, str(tmp_path)) == (2 * limit, limit)  # (bytes, not characters)
    assert os.listdir(tmp_path) == []
