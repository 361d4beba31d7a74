"""argmax/argmin as one symbolic plan: no constant of the formula raises the sizes the plan trusts.

Its score for an element that is neither a nan nor a maximum is the index type's minimum (-2^31): counted as a
size constant, it raised the plan's `trusted_from` (every dim must exceed every constant of the graph) to
2^31 + 5, so every symbolic run checked the source, a package of `kernels/argmax.tg` refused every size, and the
package builder's scan of the sizes below it (`_class_minimum`) ran for hours (CI stalled on it). Constants at
the i32 limit or past it are no sizes (`sizes.signature_max_constant`).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

import tgc
from tgc import package
from tgc.backends import get_device

ARGMAX = Path(__file__).resolve().parent.parent / "kernels" / "argmax.tg"


def test_argmax_symbolic_plan_trusts_small_sizes_and_matches_numpy():
    prog = tgc.load(ARGMAX)
    plan = prog._symbolic(get_device("CPU"), (("N", "n"), ("K", "n")))
    assert not isinstance(plan, str), plan
    assert plan.trusted_from < 300, plan.trusted_from
    rng = np.random.default_rng(0)
    for n, k in ((2, 3), (5, 17), (33, 1000)):
        x = rng.standard_normal((n, k)).astype(np.float32)
        x[0, k - 1] = np.nan  # the first nan wins (numpy)
        x[1, :] = -np.inf  # all equal: the first index
        if n > 2:
            x[2, 1] = x[2, k - 1] = x[2].max() + 1  # ties: the first
        got = prog.run("CPU", logits=x, symbolic=True)["cls"]
        np.testing.assert_array_equal(got, np.argmax(x, axis=1))
        got = tgc.loads("x: f32[N, K]\nreturn argmin(x, axis=1)").run("CPU", x=x, symbolic=True)["out0"]
        np.testing.assert_array_equal(got, np.argmin(x, axis=1))


def test_argmax_packages_symbolically(tmp_path):
    package.write(tgc.load(ARGMAX), tmp_path / "a.tgpkg", "CPU", {})
    pkg = tgc.load_package(tmp_path / "a.tgpkg")
    x = np.random.default_rng(1).standard_normal((7, 29)).astype(np.float32)
    np.testing.assert_array_equal(pkg.run(logits=x)["cls"], np.argmax(x, axis=1))


def test_class_minimum_does_not_scan_past_its_limit():
    plan = SimpleNamespace(symbolic=["N"], trusted_from=2 ** 31 + 5)
    # a plan whose trusted sizes start past the scan's limit: none below is taken, and no size is checked
    assert package._class_minimum(None, plan, (("N", "n"),)) == {"N": 2 ** 31 + 5}
