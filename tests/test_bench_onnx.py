"""bench/bench_onnx.py's table logic, without running a model: the BEAM row says its budget and how many kernels
the search reached, and each target is printed met or not with its limit."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bench_onnx():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_onnx_t", ROOT / "bench" / "bench_onnx.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(median_s: float, **extra) -> dict:
    return {"first_call_s": 1.0, "first_process_s": 2.0, "median_s": median_s, "peak_bytes": 1 << 20, **extra}


def test_the_beam_row_and_the_targets(capsys):
    b = _bench_onnx()
    runs = {"onnxruntime": _run(0.010), "tgc": _run(0.020, data_peak_bytes=10),
            "tgc-beam": _run(0.008, beam_s=61.0, beam_budget_s=60.0, beam_kernels=12, beam_skipped=5)}
    targets = [b._speed(runs, "tgc", b.DEFAULT_TARGET, "default kernels"),
               b._speed(runs, "tgc-beam", b.BEAM_TARGET, "after BEAM")]
    assert [t["met"] for t in targets] == [False, True]  # 0.50x of 0.7x; 1.25x of 1.0x
    assert [t["value"] for t in targets] == ["0.50x", "1.25x"]
    b.print_onnx([{"model": "m", "runs": runs, "targets": targets}])
    out = capsys.readouterr().out
    assert "tgc-beam (search 61 s of a 60 s budget, 7/12 kernels searched)" in out
    assert "default kernels >= 0.7x onnxruntime: 0.50x (NOT met)" in out
    assert "after BEAM >= 1.0x onnxruntime: 1.25x (met)" in out
    assert "limit, default kernels:" in out and "limit, after BEAM" not in out
    runs["tgc-beam"].update(beam_skipped=7, beam_once=4)  # 4 of the 7 skipped run once (weights alone)
    b.print_onnx([{"model": "m", "runs": runs, "targets": targets}])
    assert "5/8 kernels searched, 4 on weights alone run once)" in capsys.readouterr().out


def test_a_missing_beam_run_is_not_measured():
    b = _bench_onnx()
    t = b._speed({"onnxruntime": _run(0.01), "tgc": _run(0.02)}, "tgc-beam", b.BEAM_TARGET, "after BEAM")
    assert t["met"] is None and t["value"] == "--beam not given"


def test_interleaved_runners_in_one_process(tmp_path, capsys):
    """`--interleaved` on a one-node model made here: tgc and onnxruntime timed in one process, the table and
    the targets printed (the memory target not measured that way)."""
    import pytest
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto as TP
    from onnx import helper as h
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", TP.FLOAT, [4, 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [4, 8])])
    path = tmp_path / "relu.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(path))
    b = _bench_onnx()
    rows = b.onnx_rows([str(path)], repeat=3, interleaved=True)
    runs = rows[0]["runs"]
    assert set(runs) == {"onnxruntime", "tgc"} and all(r["median_s"] > 0 for r in runs.values()), runs
    assert len(runs["onnxruntime"]["load"]) == 2
    b.print_onnx(rows)
    out = capsys.readouterr().out
    assert "relu: runners interleaved in one process, load" in out
    assert "not measured (--interleaved)" in out
