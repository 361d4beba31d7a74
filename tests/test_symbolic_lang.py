"""The language suite through symbolic sizes (issue 15): every program of tests/test_lang_*.py that has dims,
compiled once per size class without `-D` (`Program.run(symbolic=True)` on the CPU) and run at three size
sets, compared with numpy.

Programs: the suite's test functions are called once, on first use (`suite_programs`; not at import, which
every xdist worker does to collect: ~4 s of CPU), with `Program.run` replaced by a recorder
(tests/langkit.py's `run` and the tests' own `prog.run` calls both end there); the recorder keeps each
program's source and the inputs it was given, and answers with `Program.reference` (numpy, float64) so the
tests go on to their next program. Nothing is compiled while collecting (about 2 s). Modules read: programs,
dims, shapes, ops, functions, nn, pad_conv, types, errors. Not read: properties (hypothesis programs, every
shape a literal: no dims). Every distinct source with dims runs (72 programs). The suite's programs whose
declarations are all literal sizes (about 880) are generalized: each literal size of 2 or more in a
declaration becomes a dim (`x: f32[4, 8]` -> `x: f32[G4, G8]`; equal literals one dim), kept where the
generalized program computes exactly what the suite's does at the suite's sizes (about 840); of those, a
deterministic sample of every third runs (about 280; `TGC_TEST_SYMBOLIC_ALL=1` runs them all), for time.

Sizes: (1) every dim 1, (2) odd sizes 3, 5, 7, ..., (3) larger mixed sizes 33, 64, 17, ... (64: the "32n"
class). A program that rejects a size set (a reshape needing divisibility, `x[:N - 4]` needing N >= 4, a
declaration `10 - C`) runs at the nearest set it accepts (dims moved one at a time along a preference list,
fewest moves first; the set actually used is in the report); where none is found the size set is skipped,
with the program's own error as the reason.

Inputs: each input's values are drawn from the values the suite gave it (positions drawn alike for inputs of
equal size, so that paired values such as a divisor's stay paired), so every program keeps the domain its
test chose (positive logs, nonzero divisors, shift counts in range). Reference: `Program.reference` (the
suite's own numpy expressions are written inline for the suite's one size each, so they cannot be reused at
other sizes). Tolerances: the suite's (tests/langkit.py `RTOL`: ints and bools exact, f32/f64 1e-4, f16/bf16
1e-2), measured against |want| + max(1, max |want|) (`tgc.engine.compare`), the suite's scale for reductions.

Which kernels ran: `prog.last_run` after each run, "symbolic" or "specialized: why". The test asserts that
at least `MIN_SYMBOLIC_SHARE` of the runs used symbolic kernels and that every fallback says why.
Measured (pytest -s prints the report): about 1045 runs, 923 symbolic (88%), 124 fell back, 3 size sets
skipped (the sample's count moves by a few: some suite tests draw their programs at random). The fallbacks'
reasons: sizes that are not products of dims (`N // 2`, `(C + 2) * 3`, `N * M - 1`), programs whose dims
must be equal or small (`x + y` of N and M, conv2d windows, `10 - C`, literal reshapes), and small sizes where
the scheduler cuts other kernels than the size class's. About 45 s cold on two cores (75 s when busy).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import itertools
import os
import pathlib
import re
import tempfile
from collections import Counter
from typing import Any

import numpy as np
import pytest
from langkit import NP, RTOL, bf16_round

import tgc
import tgc.api
from tgc.codegen import sizes
from tgc.engine.compare import compare
from tgc.engine.inputs import random_values

MODULES = ["test_lang_programs", "test_lang_dims", "test_lang_shapes", "test_lang_ops", "test_lang_functions",
           "test_lang_nn", "test_lang_pad_conv", "test_lang_types", "test_lang_errors"]
ODD = [3, 5, 7, 9, 11, 13]
LARGE = [33, 64, 17, 21, 45, 19]
MIN_SYMBOLIC_SHARE = 0.85  # of all runs; measured 0.88 (sampled) and about 0.88 (all)


# --- collecting the suite's programs


class _Collected:
    def __init__(self) -> None:
        self.programs: dict[str, dict[str, Any]] = {}  # source -> the inputs of its first run
        self.without_dims: dict[str, dict[str, Any]] = {}  # the same for programs whose sizes are all literal
        self.calls = 0


def _parameter_sets(fn: Any) -> list[dict[str, Any]]:
    grids = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = [s.strip() for s in mark.args[0].split(",")] if isinstance(mark.args[0], str) else list(mark.args[0])
        rows = []
        for value in mark.args[1]:
            value = value.values if hasattr(value, "marks") and hasattr(value, "values") else value
            rows.append(dict(zip(names, (value,) if len(names) == 1 else value)))
        grids.append(rows)
    out = []
    for combo in itertools.product(*grids):
        kw: dict[str, Any] = {}
        for row in combo:
            kw.update(row)
        out.append(kw)
    return out


def collect() -> _Collected:
    found = _Collected()
    plain = tgc.api.Program.run

    def record(self: tgc.Program, device: Any = None, dims: Any = None, cast: bool = False, inputs: Any = None,
               shard: Any = None, symbolic: bool = False, **kw: Any) -> dict[str, np.ndarray]:
        given = {**(inputs or {}), **kw}
        bound, _ = self.bind(given, dims, cast=cast)
        ref = self.reference(bound, **given)  # raises where the program does (the tests expect it)
        kept = found.programs if self.dim_names else found.without_dims
        kept.setdefault(self.source, {k: np.asarray(v) for k, v in given.items()})
        out = {}
        for (name, dt, _), value in zip(self.output_types(bound), ref.values()):
            with np.errstate(all="ignore"):
                out[name] = np.asarray(value).astype(np.float32 if dt.name == "bf16" else dt.np)
        return out

    tgc.api.Program.run = record  # type: ignore[method-assign]
    try:
        for module in MODULES:
            mod = importlib.import_module(module)
            for name, fn in list(vars(mod).items()):
                if not name.startswith("test_") or not callable(fn):
                    continue
                params = inspect.signature(fn).parameters
                for kw in _parameter_sets(fn):
                    for p in params:
                        if p == "device":
                            kw.setdefault(p, "CPU")
                        elif p == "known_bug":
                            kw.setdefault(p, lambda *a: None)
                        elif p == "tmp_path":
                            kw.setdefault(p, pathlib.Path(tempfile.mkdtemp(prefix="tgc-symlang-")))
                    if any(p not in kw for p in params):
                        continue  # a fixture not provided here
                    found.calls += 1
                    try:
                        fn(**{p: kw[p] for p in params})
                    except (Exception, pytest.skip.Exception, pytest.fail.Exception):  # noqa: BLE001
                        pass  # a test's own checks against the reference stand-in: not what is collected
    finally:
        tgc.api.Program.run = plain  # type: ignore[method-assign]
    return found


DECL = re.compile(r"^(\s*\w+\s*:\s*\w+\s*)\[([^\]]*)\](.*)$")


def generalize(src: str) -> tuple[str, dict[str, int]] | None:
    """A program whose input declarations are all literal sizes, with each literal of 2 or more made a dim
    (`G4` for every 4, so axes of equal size stay equal; sizes 0 and 1 stay literal) and the dims that give
    the suite's sizes back; None where no declaration has such a size."""
    lines, dims = [], {}
    for line in src.split("\n"):
        m = DECL.match(line)
        parts = [p.strip() for p in m.group(2).split(",")] if m else []
        if m and all(p.isdigit() for p in parts):
            named = []
            for p in parts:
                if int(p) >= 2:
                    dims[f"G{p}"] = int(p)
                named.append(f"G{p}" if int(p) >= 2 else p)
            line = f"{m.group(1)}[{', '.join(named)}]{m.group(3)}"
        lines.append(line)
    return ("\n".join(lines), dims) if dims else None


def generalized(found: _Collected) -> dict[str, dict[str, Any]]:
    """The suite's literal-size programs generalized (`generalize`), where the generalized program computes
    the same as the suite's at the suite's sizes (`Program.reference` of both, exactly equal)."""
    out = {}
    for src, given in found.without_dims.items():
        g = generalize(src)
        if g is None:
            continue
        try:
            same = tgc.loads(src).reference(**given)
            new = tgc.loads(g[0]).reference(g[1], **given)
        except tgc.TgcError:
            continue
        if list(same) == list(new) and all(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
                                           for a, b in zip(same.values(), new.values())):
            out[g[0]] = given
    return out


# every third generalized program (sorted by source), for time (cold: every one takes about 2.5 minutes on two
# busy cores); TGC_TEST_SYMBOLIC_ALL=1 runs them all
SAMPLE = 1 if os.environ.get("TGC_TEST_SYMBOLIC_ALL", "") not in ("", "0") else 3


@functools.cache
def suite_programs() -> tuple[_Collected, dict[str, dict[str, Any]], dict[str, dict[str, Any]], list[str]]:
    """(what `collect` found, the sampled generalized programs, every program's inputs by source, the sources in
    the order they run), collected once per process, when first needed."""
    found = collect()
    general = dict(sorted(generalized(found).items())[::SAMPLE])
    return found, general, {**found.programs, **general}, sorted(found.programs) + sorted(general)


# --- sizes and inputs


def _preferences(table: str, i: int) -> list[int]:
    if table == "ones":
        return [1, 2, 3, 4, 5, 6, 8]
    if table == "odd":
        return [ODD[i % len(ODD)], ODD[i % len(ODD)] + 1, 2 * ODD[i % len(ODD)], 4, 8, 12]
    return [LARGE[i % len(LARGE)], LARGE[i % len(LARGE)] + 1, 2 * LARGE[i % len(LARGE)], 32, 48, 9]


def _accepts(prog: tgc.Program, dims: dict[str, int]) -> str | None:
    """None where the program runs at these dims, else its error."""
    try:
        prog.resolve_dims(dims)
        prog.output_types(dims)
    except tgc.TgcError as e:
        return e.msg
    return None


def choose_dims(prog: tgc.Program, table: str) -> tuple[dict[str, int] | None, str]:
    """The table's dims where the program accepts them, else the nearest accepted; (None, why) where none is."""
    names = prog.dim_names
    prefs = [_preferences(table, i) for i in range(len(names))]
    combos = sorted(itertools.product(*[range(len(p)) for p in prefs]), key=lambda c: (sum(1 for x in c if x), sum(c)))
    first_error = ""
    for combo in combos[:400]:
        dims = {n: prefs[i][c] for i, (n, c) in enumerate(zip(names, combo))}
        why = _accepts(prog, dims)
        if why is None:
            return dims, ""
        first_error = first_error or why
    return None, first_error


def make_inputs(prog: tgc.Program, dims: dict[str, int], given: dict[str, np.ndarray], seed: int
                ) -> dict[str, np.ndarray]:
    from tgc.dsl.frontend import concrete_shape
    out = {}
    for index, decl in enumerate(prog.inputs):
        shape = concrete_shape(decl, dims)
        src = given[decl.name]
        if src.size == 0:
            out[decl.name] = random_values(decl.dtype, shape, seed, index)
            if decl.dtype.name == "bf16":
                out[decl.name] = np.zeros(shape, np.float32) + 0.5
            continue
        n = int(np.prod(shape, dtype=np.int64))
        # the same positions for inputs of the same size: pairs the suite chose stay pairs
        pos = np.random.default_rng([seed, src.size, n]).integers(0, src.size, n)
        out[decl.name] = src.reshape(-1)[pos].reshape(shape).astype(src.dtype)
    return out


# --- running


RESULTS: dict[tuple[str, str], str] = {}  # (source, table) -> last_run, or "skipped: why"
SIZES: dict[tuple[str, str], dict[str, int]] = {}
TABLES = ["ones", "odd", "large"]


def in_dtype(value: Any, dt: str) -> np.ndarray:
    """The float64 reference rounded to the output's dtype, as the suite's numpy computes it (overflow: inf)."""
    value = np.asarray(value)
    if dt not in RTOL:
        return value
    with np.errstate(all="ignore"):
        return bf16_round(value) if dt == "bf16" else value.astype(NP[dt])


def check_program(src: str) -> None:
    prog = tgc.loads(src)
    given = suite_programs()[2][src]
    for seed, table in enumerate(TABLES):
        dims, why = choose_dims(prog, table)
        if dims is None:
            RESULTS[(src, table)] = f"skipped: {why}"
            continue
        SIZES[(src, table)] = dims
        inputs = make_inputs(prog, dims, given, seed)
        got = prog.run(device="CPU", dims=dims, symbolic=True, **inputs)
        RESULTS[(src, table)] = prog.last_run
        want = prog.reference(dims, **inputs)
        types = {name: dt for name, dt, _ in prog.output_types(dims)}
        for name in prog.output_names:
            dt = types[name].name
            rtol = RTOL.get(dt)
            bad, _ = compare(name, np.asarray(got[name]), in_dtype(want[name], dt), dt, rtol=rtol)
            assert bad is None, (f"{table} sizes {dims} ({prog.last_run}): {bad.describe()}\nprogram:\n{src}\n"
                                 f"inputs: {inputs}")


def test_suite_programs_at_three_sizes():
    """Every program's runs against numpy, and the share that used symbolic kernels; every fallback to
    size-specialized kernels says why. One test, not one per program: some suite tests draw their programs at
    random, so a per-program parametrization would differ between pytest-xdist workers."""
    FOUND, GENERALIZED, _, SOURCES = suite_programs()
    for src in SOURCES:
        if any((src, t) not in RESULTS for t in TABLES):
            check_program(src)
    runs = {k: v for k, v in RESULTS.items() if not v.startswith("skipped")}
    skipped = {k: v for k, v in RESULTS.items() if v.startswith("skipped")}
    symbolic = sum(1 for v in runs.values() if v == "symbolic")
    fallbacks = {k: v for k, v in runs.items() if v != "symbolic"}
    not_ones = [s for s in SOURCES if (s, "ones") in SIZES and set(SIZES[(s, "ones")].values()) != {1}]
    report = [f"{len(FOUND.programs)} programs with dims, {len(GENERALIZED)} generalized of "
              f"{len(FOUND.without_dims)} with literal sizes; "
              f"{FOUND.calls} test calls read; {len(runs)} runs, {symbolic} symbolic, {len(fallbacks)} fell back, "
              f"{len(skipped)} size sets skipped; {len(not_ones)} programs ran their 'ones' set above 1"]
    for why, n in Counter(v for v in fallbacks.values()).most_common():
        report.append(f"  fallback x{n}: {why}")
    for (src, table), why in skipped.items():
        report.append(f"  skipped {table}: {why} :: {src!r}")
    print("\n".join(report))
    # the collection still finds the suite's programs
    assert len(FOUND.programs) >= 60 and len(GENERALIZED) * SAMPLE >= 700, report[0]
    for v in fallbacks.values():
        assert v.startswith("specialized: ") and len(v) > len("specialized: ") + 5, v
    assert symbolic >= MIN_SYMBOLIC_SHARE * len(runs), "\n".join(report)
    assert len(runs) >= 0.9 * 3 * len(SOURCES), "\n".join(report)


def test_reference_bitcasts_a_bf16_input_to_its_own_bits():
    """Found here: `Program.reference` held a bf16 input as float64 and bitcast those 8 bytes (4 u16 per
    element); the bits are the bf16 value's own 2 bytes."""
    prog = tgc.loads("x: bf16[N]\nreturn bitcast(x, u16), x.bitcast(i16)")
    x = np.array([3.0, -1.5, 2.0 ** -130], np.float32)
    bits = bf16_round(x).view(np.uint32) >> 16
    ref = prog.reference(x=x)
    np.testing.assert_array_equal(ref["out0"], bits.astype(np.uint16))
    np.testing.assert_array_equal(ref["out1"], bits.astype(np.uint16).view(np.int16))
    np.testing.assert_array_equal(prog.run(device="CPU", x=x)["out0"], ref["out0"])


def test_a_dim_multiplied_by_itself_gets_a_smaller_bound_not_specialized_kernels():
    """Found here: `w: f32[C, 3 * C]` indexes about 3 * C**2 * N, past 64 bits at the bound of two dims (2**31
    each), so the program had no symbolic kernels at all ("could not be built"); its plan is now built with a
    smaller bound, and sizes beyond it fall back at launch, saying why."""
    prog = tgc.loads("x: f32[N, C]\nw: f32[C, 3 * C]\nb: f32[3 * C]\nreturn x @ w + b")
    rng = np.random.default_rng(5)
    for n, c in [(3, 5), (2, 7), (1, 33)]:
        x, w, b = (rng.standard_normal(s).astype(np.float32) for s in [(n, c), (c, 3 * c), (3 * c,)])
        got = prog.run(device="CPU", symbolic=True, x=x, w=w, b=b)["out0"]
        assert prog.last_run == "symbolic", prog.last_run
        bad, _ = compare("out0", got, x.astype(np.float64) @ w + b, "f32")
        assert bad is None, bad.describe()
    plan = prog.compile_symbolic("CPU")
    assert 2 ** 8 <= plan.bound < sizes.var_bound(2)
    low, why = plan.bind(prog, {"N": 2, "C": plan.bound + 1})
    assert low is None and "outside the symbolic kernels' range" in why
