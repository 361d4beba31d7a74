"""`make bench`'s model-corpus and compile tables (bench/corpus.py, bench/compile_table.py) run at tiny sizes
(`--quick`) for one corpus model: the tables have their columns and one row per program, the programs ran
(no failed run in the compile table). Timings are printed, never checked."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _table(lines: list[str], title: str) -> list[list[str]]:
    """The rows (cells) of the markdown table after the line starting with `title`, header first."""
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return [r for r in rows if not set("".join(r)) <= {"-"}]


def test_quick_corpus_and_compile_tables():
    env = {**os.environ, "TGC_THREADS": "1"}
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench.py"), "--quick", "--only", "corpus,compile",
                        "--model", "gru", "--no-xla"], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    corpus = _table(lines, "Model corpus")
    assert corpus[0][:3] == ["model", "dims", "XLA"] and len(corpus) == 2  # the header and the GRU
    head, (row,) = corpus[0], corpus[1:]
    assert len(row) == len(head) and row[0] == "gru" and row[2] == "-"  # no XLA asked
    assert row[3].endswith(("us", "ms")) and float(row[7]) > 0  # a default time, a recompute factor
    assert "Load average (1 min) during the timings: " in p.stdout  # (the timings alternate on a shared machine)
    compile_rows = _table(lines, "Compile table")
    assert compile_rows[0][:5] == ["program", "dims", "kernels", "cold", "warm"]
    names = [r[0] for r in compile_rows[1:]]
    assert names == ["softmax.tg", "corpus gru", "chain of 100 statements"]
    for r in compile_rows[1:]:
        assert len(r) == len(compile_rows[0]) and r[3].endswith(" s") and r[4].endswith(" s")
    assert "the run failed" not in p.stdout


def _bench_module(name: str):
    import importlib.util
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_chain_program_and_its_twin_agree():
    import numpy as np

    import tgc
    table = _bench_module("compile_table")
    src = table.chain_source(7)
    assert src.count("\ny = y") == 7
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    want = x.astype(np.float64)
    y = want
    for i in range(7):
        y = y * 0.999 if i % 2 == 0 else y + want
    np.testing.assert_allclose(table.chain_model(7)(np, want), y)
    np.testing.assert_allclose(tgc.loads(src).run(x=x)["y"], y, rtol=1e-6)


def test_corpus_inputs_look_like_a_trained_models():
    import numpy as np
    models = _bench_module("models")
    got = models.corpus_inputs({"pad_mask": (3, 8), "var1": (5,), "w_in": (64, 32), "w1": (4, 8, 3, 3),
                                "cos": (6, 4), "mask": (4, 4)}, seed=1)
    assert got["pad_mask"].tolist()[0] == [1] * 8 and got["pad_mask"][2].sum() == 4  # padded tails
    assert (got["var1"] > 0).all()
    assert 0.08 < got["w_in"].std() < 0.2 and 0.09 < got["w1"].std() < 0.15  # 1/8, 1/sqrt(72)
    np.testing.assert_allclose(got["cos"][0], 1.0)  # position 0: angle 0
    assert got["mask"][0, 1] < -1e8 and got["mask"][1, 0] == 0  # causal, additive


def test_a_beam_miss_says_what_the_search_did_with_its_kernel():
    corpus = _bench_module("corpus")
    say = corpus.search_outcome
    assert "no search in this run" in say(None, None)
    assert "budget (60 s) was spent before it" in say({"skipped": True}, 60.0)
    assert "stopped at its share of the 45 s budget after 29 candidates (best 1.20x" in say(
        {"out_of_budget": True, "tried": 29, "speedup": 1.2}, 45.0)
    assert "kept its default: none of 40 candidates" in say({"tried": 40, "speedup": 1.0}, 60.0)
    assert "winner ran 1.50x faster" in say({"tried": 12, "speedup": 1.5}, 60.0)
    assert say({"same_as": "r_a", "tried": 7, "speedup": 1.5}, 60.0).startswith(
        "searched as r_a (the same kernel): BEAM's winner ran 1.50x faster")
    assert "earlier search" in say({"cached": True, "width": 4}, 60.0)
    assert "1.30x its default alone, after 9 candidates) was dropped by the program check" in say(
        {"tried": 9, "speedup": 1.3, "dropped": True}, 60.0)

    def kern(name, us, flops, opts):
        return {"name": name, "line": 3, "median_s": us * 1e-6, "gflops": flops / us / 1e3, "flops": flops,
                "opts": opts}
    default = {"kernels": [kern("r_a", 600, 10 ** 8, ["UPCAST(1, 16)"]), kern("E_copy", 300, 0, [])]}
    tuned = {"kernels": [kern("r_a", 500, 10 ** 8, ["UPCAST(1, 8)"]), kern("E_copy", 100, 0, [])]}
    assert corpus.copy_share(tuned) == pytest.approx(100 / 600)
    text = corpus.beam_limit(default, tuned, {"r_a": {"tried": 40, "speedup": 1.0}}, 60.0)
    assert text.startswith("kernel r_a (line 3) takes 83% of the kernels' time at 200.0 GFLOP/s")
    assert "600 us with default kernels, 500 us tuned;" in text and "kept its default" in text
    assert "copies (kernels of no FLOPs: packed weights, joins) take 17%" in text
    same = corpus.beam_limit(default, default, {}, None)
    assert "(the default's opts)" in same and "no search in this run" in same


def test_search_rows_are_found_under_the_names_the_kernels_run_as():
    import tgc
    corpus = _bench_module("corpus")
    prog = tgc.loads("x: f32[N, D]\nw: f32[D, D]\nreturn (x @ w) @ w + 1")
    dims = {"N": 16, "D": 32}
    items = [it for it in prog.schedule(dims, "CPU") if it.ast.src]
    ran = [k.name for k in prog.compile("CPU", dims=dims)]
    assert corpus.kernel_names(items) == ran and len(set(ran)) == len(ran) > 1
    rows = [{"name": n, "tried": i} for i, n in enumerate(ran)]  # (`Program.beam`'s rows carry the run names)
    found = corpus.search_rows(prog, dims, {"kernels": rows})
    assert [found[n]["tried"] for n in ran] == list(range(len(items)))
    # a kernel that took another's winner (`same_as`: that kernel's run name) is described by that kernel's search
    names = [it.name for it in items]
    twin = next(i for i in range(1, len(names)) if names[i] in names[:i])
    first = ran[names.index(names[twin])]
    rows[twin] = {"name": ran[twin], "tried": 0, "same_as": first}
    found = corpus.search_rows(prog, dims, {"kernels": rows})
    assert found[ran[twin]]["tried"] == names.index(names[twin]) and found[ran[twin]]["same_as"] == first
    assert corpus.search_rows(prog, dims, {"kernels": [{**r, "name": it.name} for r, it in zip(rows, items)]}) == {}
    assert corpus.search_rows(prog, dims, {"kernels": rows[:-1]}) == {}  # rows that do not match: none
    assert corpus.search_rows(prog, dims, None) == {}


def test_the_beam_column_times_one_executable_where_no_winner_changes_a_kernel(monkeypatch, tmp_path):
    """`same_program`: no winner, or every winner its kernel's default opts, is the default program (timed once for
    both columns); a winner with other opts is another program."""
    import tgc
    from tgc.backends import get_device
    from tgc.codegen import search
    from tgc.codegen.opt import Opt, OptOps
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    corpus = _bench_module("corpus")
    cpu = get_device("CPU")
    src, dims = "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b", {"M": 16, "K": 32, "N": 64}
    assert corpus.same_program(tgc.loads(src), dims)  # nothing stored
    (item,) = [it for it in tgc.loads(src).schedule(dims, "CPU") if it.ast.src]
    (kern,) = tgc.loads(src).compile("CPU", dims=dims, tuned=False)
    own = [o for o in kern.opts if o.op is not OptOps.THREAD]
    search.store(search.search_ast(item, cpu), cpu, own, 1e-5, item.name, width=4)
    assert corpus.same_program(tgc.loads(src), dims)  # its default's opts: the same source
    search.store(search.search_ast(item, cpu), cpu, [Opt(OptOps.UPCAST, 1, 4)], 1e-5, item.name, width=4)
    assert not corpus.same_program(tgc.loads(src), dims)


def test_the_paired_ratio_times_both_programs_or_says_none(monkeypatch, tmp_path):
    """`paired_ratio`: a positive ratio where the default and the winners run in the same chunks; None where a
    winner put the program in other chunks (nothing to pair)."""
    import tgc
    from tgc.backends import get_device
    from tgc.codegen import search
    from tgc.codegen.opt import Opt, OptOps
    from tgc.engine.inputs import random_inputs
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    corpus = _bench_module("corpus")
    cpu = get_device("CPU")
    src, dims = "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b", {"M": 16, "K": 32, "N": 64}
    (item,) = [it for it in tgc.loads(src).schedule(dims, "CPU") if it.ast.src]
    search.store(search.search_ast(item, cpu), cpu, [Opt(OptOps.UPCAST, 1, 4)], 1e-5, item.name, width=4)
    prog = tgc.loads(src)
    inputs = random_inputs(prog, dims, seed=0)
    ratio = corpus.paired_ratio(prog, dims, inputs, rounds=2)
    assert isinstance(ratio, float) and ratio > 0
    calls = []

    def chunking(device, dims, tuned=True):  # (the winners' program in chunks, the default's whole)
        calls.append(tuned)
        return None if not tuned else type("Ch", (), {"dim": "M", "count": 2, "low": None, "sliced": set()})()
    monkeypatch.setattr(prog, "chunking", chunking)
    assert corpus.paired_ratio(prog, dims, inputs, rounds=2) is None and calls == [False, True]
