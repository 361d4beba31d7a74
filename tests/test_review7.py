"""Defects a new user meets first (review of the CLI and the README's quick start at 4d1e156): each test fails
without its fix. Bad input must be one clear error with CLI.md's exit status, never a traceback or an internal
error."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from clikit import assert_clean, invoke

import tgc

KERNELS = Path(__file__).resolve().parent.parent / "kernels"
SOFTMAX = str(KERNELS / "softmax.tg")


def _baseline(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    return str(path)


GOOD_RECORD = {"name": "r_4_8_8_8", "median_s": 1e-6, "min_s": 9e-7, "max_s": 2e-6, "iqr_s": 1e-7}


@pytest.mark.parametrize("doc, words", [
    ({"kernels": [{**GOOD_RECORD, "median_s": "fast"}]}, ["kernels[0].median_s is \"fast\""]),
    ({"kernels": [7]}, ["kernels[0] is 7, not an object"]),
    ({"kernels": [GOOD_RECORD], "program": "x"}, ["'program' is \"x\", not an object"]),
    ({"kernels": None}, ["'kernels' is null, not a list"]),
    ({"kernels": [{**GOOD_RECORD, "iqr_s": -1}]}, ["kernels[0].iqr_s is -1"]),
    ({"kernels": [GOOD_RECORD], "program": {**GOOD_RECORD, "max_s": True}}, ["program.max_s is true"]),
    ({"kernels": [{**GOOD_RECORD, "name": 3}]}, ["kernels[0].name is 3, not a string"]),
])
def test_an_edited_bench_baseline_is_one_clear_error(tmp_path, doc, words):
    # a hand-edited --baseline (a time as a string, a record that is not an object) was an internal error (exit 1)
    # from compare_baseline's arithmetic after the whole bench ran
    r = invoke("bench", SOFTMAX, "-D", "N=4", "-D", "D=8", "--repeat", "1", "--baseline", _baseline(tmp_path, doc))
    assert_clean(r, 2, "--baseline", "is not the output of tgc bench --json", *words)


def test_a_well_formed_baseline_is_still_compared(tmp_path):
    # the validation must not refuse what `tgc bench --json` writes: null times (not measured) included
    r = invoke("bench", SOFTMAX, "-D", "N=4", "-D", "D=8", "--repeat", "1", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    doc["kernels"][0]["iqr_s"] = None
    r = invoke("bench", SOFTMAX, "-D", "N=4", "-D", "D=8", "--repeat", "1", "--json", "--baseline",
               _baseline(tmp_path, doc))
    assert r.exit_code in (0, 1), (r.exit_code, r.stderr)  # (1: a timing regression on a loaded machine)
    assert "internal error" not in r.stderr and "is not the output" not in r.stderr, r.stderr
    rows = json.loads(r.stdout)["baseline"]["rows"]
    assert [row["name"] for row in rows] == [k["name"] for k in doc["kernels"]] + ["(program)"]
    assert all(row["old_s"] is not None for row in rows)


def test_a_ragged_list_input_is_a_tgc_error():
    # README: an input may be a Python list; a ragged one raised numpy's ValueError, not tgc.TgcError
    prog = tgc.load(SOFTMAX)
    with pytest.raises(tgc.TgcError, match=r"input 'x': cannot convert the list to an array"):
        prog.run(x=[[1.0, 2.0], [3.0]])
    rows = [[float(i * 8 + j) for j in range(8)] for i in range(4)]  # a rectangular list still runs
    x = np.array(rows, np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(prog.run(x=rows)["out0"], e / e.sum(axis=1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("target", ["out0=pipe.npy", "pipe.npz"])
def test_an_output_named_pipe_is_written_not_replaced(tmp_path, target):
    # `-o` onto an existing FIFO (or a device such as /dev/stdout) staged a temporary file and renamed it over the
    # target: the pipe was replaced by a regular file and its reader got nothing (as root, `-o out0=/dev/full`
    # replaced the device node)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    pipe = tmp_path / target.split("=")[-1]
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # (the output is far smaller than the pipe's buffer)
    try:
        out = target.replace("pipe", str(tmp_path / "pipe"))
        r = invoke("run", SOFTMAX, "-i", f"x={tmp_path / 'x.npy'}", "-o", out)
        assert r.exit_code == 0, r.stderr
        data = b""
        while chunk := os.read(reader, 1 << 16):
            data += chunk
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    got = np.load(io.BytesIO(data))
    got = got if target.endswith(".npy") else got["out0"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_a_file_named_as_a_directory_is_named_so(tmp_path):
    # `-o x.npy/out.npz` said "directory 'x.npy' does not exist" and `compile -o x.npy` "cannot create the
    # directory: File exists", though x.npy exists: a file where a directory is needed
    f = tmp_path / "x.npy"
    np.save(f, np.ones((4, 8), np.float32))
    before = f.read_bytes()
    r = invoke("run", SOFTMAX, "-i", f"x={f}", "-o", f"{f}/out.npz")
    assert_clean(r, 2, f"cannot write '{f}/out.npz': '{f}' is not a directory")
    r = invoke("run", SOFTMAX, "-i", f"x={f}", "-o", f"{tmp_path}/nodir/out.npz")
    assert_clean(r, 2, f"directory '{tmp_path}/nodir' does not exist")
    r = invoke("compile", SOFTMAX, "-D", "N=4", "-D", "D=8", "-o", str(f))
    assert_clean(r, 2, f"-o {f}: it is a file, not a directory")
    assert f.read_bytes() == before


@pytest.mark.parametrize("dims", [[4, 8], "N=4", 5])
def test_dims_that_are_no_mapping_are_a_tgc_error(dims):
    # Program.run/compile(dims=[4, 8]) or dims="N=4" raised dict()'s TypeError/ValueError, not tgc.TgcError
    prog = tgc.load(SOFTMAX)
    x = np.ones((4, 8), np.float32)
    with pytest.raises(tgc.TgcError, match=r"dims must be a dict of dim name to size"):
        prog.run(x=x, dims=dims)
    with pytest.raises(tgc.TgcError, match=r"dims must be a dict of dim name to size"):
        prog.compile(device="CPU", dims=dims)
    np.testing.assert_array_equal(prog.run(x=x, dims=(("N", 4), ("D", 8)))["out0"], np.full((4, 8), 0.125, np.float32))


def test_cast_of_values_an_int_cannot_hold_is_one_warning_line(tmp_path):
    # `--cast` of NaN, an infinity or a float past i32's range printed numpy's RuntimeWarning with tgc's source
    # line (conform.py:83 `value = value.astype(want.np)`); now one `tgc: warning:` line naming the input
    prog = tmp_path / "ints.tg"
    prog.write_text("a: i32[N]\nreturn a * 2\n")
    bad, good = np.array([1.5, np.nan, 1e20, -np.inf]), np.array([1.5, 2.0, 3.0, -4.0])
    np.save(tmp_path / "bad.npy", bad)
    np.save(tmp_path / "good.npy", good)
    r = invoke("run", str(prog), "-i", f"a={tmp_path / 'bad.npy'}", "--cast", "-o", str(tmp_path / "o.npz"))
    assert r.exit_code == 0, r.stderr
    assert "tgc: warning: input 'a': 3 of 4 values are NaN, infinite or outside i32's range" in r.stderr, r.stderr
    assert "RuntimeWarning" not in r.stderr and "astype" not in r.stderr
    assert np.load(tmp_path / "o.npz")["out0"][0] == 2  # the value i32 holds is numpy's astype's
    r = invoke("run", str(prog), "-i", f"a={tmp_path / 'good.npy'}", "--cast", "-o", str(tmp_path / "o.npz"))
    assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["out0"], good.astype(np.int32) * 2)


def test_the_output_table_shows_nan_and_inf_values(tmp_path):
    # rich read the values cell `[nan, 2, inf, 4]` as a markup tag and printed an empty cell for any output whose
    # first value was nan or inf
    prog = tmp_path / "f.tg"
    prog.write_text("b: f32[N]\nreturn b + 1\n")
    for vals, shown in (([np.nan, 1, np.inf, 3], "[nan, 2, inf, 4]"), ([np.inf, 0], "[inf, 1]"), ([1, 2], "[2, 3]")):
        np.save(tmp_path / "b.npy", np.array(vals, np.float32))
        r = invoke("run", str(prog), "-i", f"b={tmp_path / 'b.npy'}", env={"COLUMNS": "200"})  # (one line a row)
        assert r.exit_code == 0, r.stderr
        assert shown in r.stdout, r.stdout


def test_cast_of_f64_past_f32_range_to_bf16_is_inf_without_a_numpy_warning():
    # the bf16 path's astype(np.float32) printed numpy's "RuntimeWarning: overflow encountered in cast" and tgc's
    # source line; the value (inf, as numpy casts it) is unchanged
    import warnings

    prog = tgc.loads("b: bf16[N]\nreturn b * 1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = prog.run(b=np.array([1e300, -1e300, 2.0]), cast=True)["out0"]
    np.testing.assert_array_equal(out, np.array([np.inf, -np.inf, 2.0], np.float32))  # (bf16 outputs come as f32)


def test_cache_list_shows_a_program_name_with_brackets(tmp_path):
    # the `what` cell went to rich as markup: a program named `[draft]sm.tg` was listed as `sm.tg`
    prog = tmp_path / "[draft]sm.tg"
    prog.write_text((KERNELS / "softmax.tg").read_text())
    env = {"TGC_CACHE_DIR": str(tmp_path / "cache"), "TGC_VERIFY_BOUNDS": None}  # (a bounds-checked run is not cached)
    r = invoke("run", str(prog), "--random", "-D", "N=2", "-D", "D=2", env=env)
    assert r.exit_code == 0, r.stderr
    r = invoke("cache", "list", "--table", "program", env={**env, "COLUMNS": "200"})  # (one line a row)
    assert r.exit_code == 0, r.stderr
    assert "[draft]sm.tg CPU D=2 N=2" in r.stdout, r.stdout


def test_an_npz_given_as_the_program_is_named_no_package(tmp_path):
    # `tgc run in.npz` (inputs given as FILE) and a .zip renamed .tgpkg said "its checksum does not match its bytes
    # (damaged, truncated or changed)": an archive without a checksum is no package at all, not a damaged one
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.ones((4, 8), np.float32))
    for cmd in (["run", str(npz), "--random"], ["inspect", str(npz)], ["bench", str(npz), "--repeat", "1"]):
        r = invoke(*cmd)
        assert_clean(r, 2, "not a tgc package: a zip archive without a package's checksum", "--inputs")
    with pytest.raises(tgc.TgcError, match="not a tgc package"):
        tgc.load_package(npz)
    r = invoke("compile", SOFTMAX, "-D", "N=4", "-D", "D=8", "--package", str(tmp_path / "p.tgpkg"))
    assert r.exit_code == 0, r.stderr
    data = (tmp_path / "p.tgpkg").read_bytes()
    (tmp_path / "cut.tgpkg").write_bytes(data[:-100])  # a truncated package is still damaged
    assert_clean(invoke("inspect", str(tmp_path / "cut.tgpkg")), 2, "checksum does not match")
    x = np.ones((4, 8), np.float32)
    np.testing.assert_array_equal(tgc.load_package(tmp_path / "p.tgpkg").run(x=x)["out0"], np.full((4, 8), 0.125))


@pytest.mark.parametrize("cmd", ["run", "bench"])
def test_inputs_given_twice_is_refused(tmp_path, cmd):
    # `--inputs a.npz --inputs b.npz`: click kept b.npz and dropped a.npz without a word, so a.npz's arrays were
    # reported missing (or, where both hold them, silently not a.npz's)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    np.savez(tmp_path / "a.npz", x=x)
    np.savez(tmp_path / "b.npz", x=np.zeros((4, 8), np.float32))
    r = invoke(cmd, SOFTMAX, "--inputs", str(tmp_path / "a.npz"), "--inputs", str(tmp_path / "b.npz"))
    assert_clean(r, 2, "--inputs", "given 2 times", "a.npz", "b.npz")
    if cmd == "run":  # one archive still runs, with its own values
        r = invoke("run", SOFTMAX, "--inputs", str(tmp_path / "a.npz"), "-o", str(tmp_path / "o.npz"))
        assert r.exit_code == 0, r.stderr
        e = np.exp(x - x.max(axis=1, keepdims=True))
        np.testing.assert_allclose(np.load(tmp_path / "o.npz")["out0"], e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_rtol_without_check_is_a_usage_error():
    # `--rtol` without `--check` was ignored: the run exited 0 as if checked (as --seed needs --random, exit 2)
    r = invoke("run", SOFTMAX, "--random", "-D", "N=4", "-D", "D=8", "--rtol", "0.1")
    assert_clean(r, 2, "--rtol needs --check")
    r = invoke("run", SOFTMAX, "--random", "-D", "N=4", "-D", "D=8", "--rtol", "0.1", "--check")
    assert r.exit_code == 0 and "check: ok" in r.stderr, r.stderr


def test_an_unknown_dim_is_warned_about_and_kept_out_of_the_program_cache(tmp_path):
    # `-D Q=3` on a program without Q: a warning, then the run and the cache are those of the run without it (it
    # made a second program-cache entry keyed with Q=3, compiled again)
    env = {"TGC_CACHE_DIR": str(tmp_path / "cache"), "TGC_VERIFY_BOUNDS": None, "COLUMNS": "200"}
    for extra in ([], ["-D", "Q=3"]):
        r = invoke("run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2", *extra, env=env)
        assert r.exit_code == 0, r.stderr
    assert "the program has no dim Q" in r.stderr
    r = invoke("cache", "list", "--table", "program", env=env)
    assert r.exit_code == 0 and "D=2 N=2" in r.stdout, r.stdout
    assert "Q=3" not in r.stdout and r.stdout.count("D=2 N=2") == 1, r.stdout


def test_viz_does_not_overwrite_a_file_that_is_not_a_page(tmp_path):
    # `tgc viz FILE -o x.npy` replaced the user's data file with the HTML page (exit 0)
    data = tmp_path / "x.npy"
    np.save(data, np.arange(3.0))
    before = data.read_bytes()
    r = invoke("viz", SOFTMAX, "-D", "N=4", "-D", "D=8", "--no-measure", "-o", str(data))
    assert_clean(r, 2, "the file exists and is not an HTML page")
    assert data.read_bytes() == before
    page = tmp_path / "page.out"  # an earlier page under any name is replaced, as is a new file
    for _ in range(2):
        r = invoke("viz", SOFTMAX, "-D", "N=4", "-D", "D=8", "--no-measure", "-o", str(page))
        assert r.exit_code == 0, r.stderr
        assert page.read_bytes().lstrip().lower().startswith(b"<!doctype html")


@pytest.mark.parametrize("value", ["1_000", "\u0664", "--4", "4.0", "0x10"])
def test_a_dim_is_written_in_ascii_digits(value):
    # int() read 1_000 and the Arabic-Indic digit four; the README says a -D value is written in digits
    r = invoke("run", SOFTMAX, "--random", "-D", f"N={value}", "-D", "D=2")
    assert_clean(r, 2, "is not an integer (write it in digits)")
    assert invoke("run", SOFTMAX, "--random", "-D", "N=+4", "-D", "D= 2").exit_code == 0


def test_cache_list_and_stats_of_a_new_cache_directory_create_nothing(tmp_path):
    # both made the directory tree and an empty cache.db: a command that only reads writes nothing
    where = tmp_path / "new" / "cache"
    for cmd in (["cache", "list"], ["cache", "stats"], ["cache", "stats", "--json"]):
        r = invoke(*cmd, env={"TGC_CACHE_DIR": str(where)})
        assert r.exit_code == 0, r.stderr
    assert "the cache is empty" in invoke("cache", "list", env={"TGC_CACHE_DIR": str(where)}).stdout
    assert not (tmp_path / "new").exists()
    r = invoke("run", SOFTMAX, "--random", "-D", "N=2", "-D", "D=2", env={"TGC_CACHE_DIR": str(where)})
    assert r.exit_code == 0 and (where / "cache.db").exists()  # a run still creates it
    assert "compile:" in invoke("cache", "stats", env={"TGC_CACHE_DIR": str(where)}).stdout


def test_import_of_a_corrupt_model_reports_the_model_before_an_existing_weights_file(tmp_path):
    # with the user's bad.npz beside it, `tgc import bad.onnx` reported the .npz conflict, not the corrupt model
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage, not a model" * 10)
    np.savez(tmp_path / "bad.npz", a=np.ones(2))
    before = (tmp_path / "bad.npz").read_bytes()
    r = invoke("import", str(bad))
    assert r.exit_code == 2 and "bad.onnx" in r.stderr and "bad.npz" not in r.stderr, r.stderr
    assert (tmp_path / "bad.npz").read_bytes() == before and not (tmp_path / "bad.tg").exists()
