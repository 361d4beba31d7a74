"""`tgc beam`'s rows carry the names the program's kernels run by (`kernel_names`: a repeated name gets n1, n2,
...), as bench, viz and profiles print them, and a copied row's `same_as` names another row (a new user found
one name three times in the table, and "(same kernel as r_...)" naming its own row)."""

from __future__ import annotations

import numpy as np

import tgc
from tgc.ir.kernel import kernel_names

# two kernels of one shape doing the same work (one searched, the other takes its winner) and a third of that
# shape doing other work: three items whose schedule names repeat
SRC = "x: f32[N, D]\ny: f32[N, D]\nreturn exp(x).sum(axis=1), exp(y).sum(axis=1), (x * y).sum(axis=1)\n"


def test_beam_rows_are_named_as_the_kernels_run(monkeypatch, tmp_path):
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    prog = tgc.loads(SRC)
    dims = {"N": 16, "D": 64}
    items = [it for it in prog.run_schedule(dims, "CPU") if it.ast.src]
    assert len({it.name for it in items}) < len(items)  # (what is checked: the schedule repeats a name)
    result = prog.beam("CPU", dims=dims, width=1, budget_s=None)
    names = [r["name"] for r in result["kernels"]]
    assert names == kernel_names(items) and len(set(names)) == len(names)
    assert names == [k.name for k in prog.compile("CPU", dims=dims)]
    copies = [r for r in result["kernels"] if r.get("same_as")]
    assert copies and all(r["same_as"] in names and r["same_as"] != r["name"] for r in copies)
    x, y = (np.random.default_rng(i).standard_normal((16, 64)).astype(np.float32) for i in range(2))
    out = prog.run(x=x, y=y)
    np.testing.assert_allclose(out["out0"], np.exp(x.astype(np.float64)).sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(out["out2"], (x.astype(np.float64) * y).sum(axis=1), rtol=1e-4, atol=1e-5)


def test_kernel_names_number_repeats():
    class Item:
        def __init__(self, name: str) -> None:
            self.name = name

    assert kernel_names([Item("r_a"), Item("E_b"), Item("r_a"), Item("r_a")]) == ["r_a", "E_b", "r_an1", "r_an2"]
