"""One random-input generator and one tolerance rule, shared by run, bench, the API and BEAM."""

from __future__ import annotations

import numpy as np

import tgc
from tgc.backends import get_device
from tgc.cli import check
from tgc.cli import inputs as cli_inputs
from tgc.codegen import search
from tgc.dtype import bf16_to_f32, dtypes, f32_to_bf16
from tgc.engine import compare
from tgc.engine.inputs import random_inputs, random_values
from tgc.ir.uop import Ops, UOp

SRC = "a: f32[N]\nb: bf16[N]\nc: i16[N, 2]\nd: bool[N]\ne: u8[3]\nf: f64[N]\nreturn a + b + f"


def test_run_random_bench_and_the_api_draw_the_same_inputs():
    prog = tgc.loads(SRC)
    for seed in (0, 5):
        cli = cli_inputs.fill_random(prog, {}, {"N": 7}, seed)  # tgc run --random and tgc bench
        eng = random_inputs(prog, {"N": 7}, seed)  # the API's bench_program, the examples
        assert list(cli) == list(eng) == ["a", "b", "c", "d", "e", "f"]
        for name in cli:
            assert cli[name].dtype == eng[name].dtype and np.array_equal(cli[name], eng[name]), name
    assert eng["b"].dtype == np.uint16 and eng["d"].dtype == np.bool_ and eng["c"].shape == (7, 2)
    assert not np.array_equal(random_inputs(prog, {"N": 7}, 1)["a"], random_inputs(prog, {"N": 7}, 2)["a"])
    # giving one input does not change the others
    given = cli_inputs.fill_random(prog, {"a": np.zeros(7, np.float32)}, {"N": 7}, 5)
    assert np.array_equal(given["c"], eng["c"])


def test_beam_times_candidates_on_the_same_generator():
    dev = get_device("CPU")
    bufs = [UOp(Ops.BUFFER, d, (), (i, f"b{i}", (5, 3))) for i, d in enumerate([dtypes.f32, dtypes.i32, dtypes.bf16])]
    timer = search._Timer(dev, bufs, seed=3)
    try:
        for i in (1, 2):
            got = np.empty((5, 3), bufs[i].dtype.np)
            dev.allocator.copyout(memoryview(got).cast("B"), timer.handles[i])
            assert np.array_equal(got, random_values(bufs[i].dtype, (5, 3), 3, i))
    finally:
        timer.free()


def test_one_tolerance_rule_for_check_and_beam():
    ref = np.linspace(-3, 3, 50)
    near, far = (ref * (1 + 5e-5)).astype(np.float32), (ref + 3e-3).astype(np.float32)
    assert compare.matches(near, ref, "f32") and check.compare("y", near, ref, "f32")[0] is None
    assert not compare.matches(far, ref, "f32") and check.compare("y", far, ref, "f32")[0] is not None
    # BEAM applies the same rule (it used to accept 1e-3 relative errors in f32)
    assert search._matches(near, ref.astype(np.float32), dtypes.f32)
    assert not search._matches(far, ref.astype(np.float32), dtypes.f32)
    assert search._matches(np.array([1, 2]), np.array([1, 2]), dtypes.i32)
    assert not search._matches(np.array([1, 2]), np.array([1, 3]), dtypes.i32)
    # bf16 is compared as values, at the 16-bit tolerance
    x = np.linspace(-2, 2, 9, dtype=np.float32)
    assert search._matches(f32_to_bf16(x * 1.004), f32_to_bf16(x), dtypes.bf16)
    assert not search._matches(f32_to_bf16(x + 0.1), f32_to_bf16(x), dtypes.bf16)
    assert compare.matches(bf16_to_f32(f32_to_bf16(x)), x, "bf16")


def test_one_uop_printer():
    from tgc.cli.emit import emit_kernels
    from tgc.ir.uop import format_uops, pretty

    a = UOp.const(dtypes.i32, 2)
    b = a.alu(Ops.ADD, UOp.const(dtypes.i32, 3))
    assert format_uops([a, b]).splitlines() == ["   0 CONST          i32    2 ()", "   1 ADD            i32    (%0, ?)"]
    assert repr(b) == pretty(b) == format_uops(b.toposort())
    prog = tgc.loads("x: f32[4]\nreturn x * 2.0")
    kernels = prog.compile(device="CPU", dims={})
    emitted = emit_kernels(kernels, "uops", "CPU", "CPU", "<string>")
    assert [e.body for e in emitted] == [format_uops(k.uops) for k in kernels] == [k.uops_text() for k in kernels]


def test_no_core_module_imports_the_numpy_baseline():
    import ast
    from pathlib import Path

    root = Path(tgc.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).parts
        if rel[0] in ("baselines", "cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.startswith("tgc.baselines") or "numpy_eval" in n for n in names):
                offenders.append(str(path.relative_to(root)))
    assert not offenders
    assert not (root / "engine" / "numpy_eval.py").exists()


def test_the_api_binder_hints_in_neutral_words_and_the_cli_names_its_flags():
    import re

    import pytest

    from tgc.errors import BindError

    prog = tgc.loads("x: f32[N]\nn: i32[N]\nreturn x + n")
    flags = re.compile(r"(^|\s)--?[A-Za-z]")
    cases = [
        (lambda: prog.bind({"x": np.zeros(3, np.float32)}), "input", "n"),
        (lambda: prog.bind({"x": np.zeros(3), "n": np.zeros(3, np.int32)}), "cast", "x"),
        (lambda: prog.bind({"x": np.zeros(3, np.float32), "n": np.zeros(3, np.int32)}, {"N": 4}), None, None),
        (lambda: prog.resolve_dims({}), "dim", "N"),
        (lambda: prog.conform("x", np.zeros(3, np.int64)), "cast", "x"),
        (lambda: prog.run(device="CPU:0,CPU:0", x=np.zeros(3, np.float32), n=np.zeros(3, np.int32)), None, None),
    ]
    for call, need, name in cases:
        with pytest.raises(tgc.TgcError) as info:
            call()
        e = info.value
        assert not flags.search(e.msg) and not flags.search(e.hint or ""), (e.msg, e.hint)
        if need is not None:
            assert isinstance(e, BindError) and (e.need, e.name) == (need, name)
            cli = cli_inputs.flag_hint(e)
            assert {"input": "--random", "cast": "--cast", "dim": "-D N="}[need] in cli.hint
    # the dtype error points at the declaration, for the API and the command line alike
    with pytest.raises(BindError) as info:
        prog.conform("n", np.zeros(3, np.float32))
    assert info.value.line == 2 and "n: i32[N]" in info.value.format() and "f32" in info.value.msg
    assert prog.conform("x", [1.0, 2.0]).dtype == np.float32 and prog.conform("n", [1, 2]).dtype == np.int32
