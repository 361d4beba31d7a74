"""Defects found reviewing the six branches merged at e65cfa6 (NaN semantics, exact float %, CLI hardening, run
once and the cache cap, one-trace plans, REMOTE inline launches): each test fails without its fix. Expectations
are numpy's own results or exact values, on every device of TGC_TEST_DEVICES where a device is a parameter."""

from __future__ import annotations

import re

import numpy as np
from langkit import assert_exact, run

from tests.test_remote_inline import SOFTMAX, _edit, _proof, _sources
from tests.test_remote_server import needs_cpu


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal values and equal signs of zero (nan where numpy has nan)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got) & ~nan, np.signbit(want) & ~nan)


def test_negative_zero_constant_keeps_its_sign(device):
    # -0.0 == 0.0 and they hash alike: the hash-consing table made them one node, the first one built
    a = np.array([-1.0, 1.0, 2.0], np.float32)
    out = run("a: f32[3]\nreturn where(a < 0, -0.0, 0.0), where(a < 0, -0.0, a)", device, a=a)
    _same_bits(out["out0"], np.where(a < 0, np.float32(-0.0), np.float32(0.0)))
    _same_bits(out["out1"], np.where(a < 0, np.float32(-0.0), a))


def test_float_mod_zero_remainder_takes_divisor_sign(device):
    # numpy: a zero remainder is copysign(0, divisor), so 4 % -2 == -0.0
    a = np.array([4.0, -4.0, 0.0, -0.0, 3.0, 5.0], np.float32)
    b = np.array([-2.0, -2.0, -1.0, -1.0, -1.5, 2.5], np.float32)
    out = run("a: f32[6]\nb: f32[6]\nreturn a % b, 5.0 % b", device, a=a, b=b)
    _same_bits(out["out0"], np.mod(a, b))
    _same_bits(out["out1"], np.mod(np.float32(5.0), b))
    assert_exact(out["out0"], np.mod(a, b), "f32")


@needs_cpu
def test_shortproof_sees_a_loop_counter_whose_name_ends_in_a_dot_used_after_its_loop():
    # LLVM names may end in '.', '-' or '$': the use scan's `\b` cut `%r1.` to `%r1`, so a counter read after its
    # loop (where it is past its interval) was proven in bounds and an inline launch read past the buffer
    (src,) = _sources(SOFTMAX, {"N": 4, "D": 8})
    after = _edit(src, "loop1_exit:\n", "loop1_exit:\n  %w = add i32 %v2, %r1\n"
                  "  %g = getelementptr inbounds float, ptr %data1, i32 %w\n  %u = load float, ptr %g, align 4\n")
    assert _proof(src) is not None and _proof(after) is None
    for end in (".", "-", "$"):
        bad = re.sub(r"%r1(?![\w.$-])", "%r1" + end, after)
        assert bad != after and _proof(bad) is None, end
        # (the name alone is fine; LLVM prints `%r1$` quoted, `%"r1$"`, and the proof, reading LLVM's print,
        # refuses every quoted name)
        assert (_proof(re.sub(r"%r1(?![\w.$-])", "%r1" + end, src)) is None) == (end == "$"), end


def test_one_trace_plan_built_for_a_second_device_still_checks_clamping_sizes():
    # the second device's one-trace build reused the first's kept trace, so no size decision was recorded and the
    # plan trusted every size: y[-100:100] at N = 37 on the second device gave an empty array
    import tgc

    prog = tgc.loads("x: f32[N]\nreturn x[-100:100], x[::-1]\n")
    for device, n in (("CPU", 300), ("PYTHON", 37), ("PYTHON", 150), ("CPU", 37)):
        x = np.arange(n, dtype=np.float32)
        out = prog.run(device=device, symbolic=True, x=x)
        assert_exact(out["out0"], x[-100:100], "f32")
        assert_exact(out["out1"], x[::-1], "f32")


def test_bench_counts_that_are_not_integers_are_one_tgc_error():
    # repeat=1.5 passed the range check and failed in range() with a TypeError deep inside the timing loop
    import pytest

    import tgc

    prog = tgc.loads("x: f32[4]\nreturn x * 2\n")
    x = np.ones(4, np.float32)
    for repeat, warmup in ((1.5, 1), (2.0, 1), (3, 0.5), (True, 1)):
        with pytest.raises(tgc.TgcError, match="cannot time"):
            prog.bench(device="CPU", inputs={"x": x}, repeat=repeat, warmup=warmup)
    from tgc.engine.executable import counts_ok
    assert counts_ok(np.int64(2), 0) and counts_ok(1, np.int32(3))  # (numpy integers are counts)
