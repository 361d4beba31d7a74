"""`make bench`'s model-corpus and compile tables (bench/corpus.py, bench/compile_table.py) run at tiny sizes
(`--quick`) for one corpus model: the tables have their columns and one row per program, the programs ran
(no failed run in the compile table). Timings are printed, never checked."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

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
    compile_rows = _table(lines, "Compile table")
    assert compile_rows[0][:5] == ["program", "dims", "kernels", "cold", "warm"]
    names = [r[0] for r in compile_rows[1:]]
    assert names == ["softmax.tg", "corpus gru", "chain of 100 statements"]
    for r in compile_rows[1:]:
        assert len(r) == len(compile_rows[0]) and r[3].endswith(" s") and r[4].endswith(" s")
    assert "the run failed" not in p.stdout
