"""tools/gpu_check.py (`make gpu-check`) through the CPU stand-in for the CUDA driver, so the script the lent GPU
machine runs first cannot rot: a tiny run, with one bench row made to fault, one test group made to run out of
time and a peer that is missing, must still write every other part's and row's result; and the table's
arithmetic (rates, shares, ratios) against hand-computed figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import cuda_standin
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402


@pytest.mark.skipif(cuda_standin.why_unavailable() is not None, reason=str(cuda_standin.why_unavailable()))
def test_make_gpu_check_through_the_standin_keeps_every_result(tmp_path):
    import tgc
    spec = gpu_check.row_spec("matmul-f32", "standin")
    (kernel,) = tgc.loads(spec["src"]).compile(device="CUDA", dims=spec["dims"])
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "MAKEFLAGS")}
    env["TGC_STANDIN_FAULT"] = kernel.name  # the stand-in driver reports an illegal address for this kernel
    args = (f"--standin --out {out} --tests language,graphs --limit tests:graphs=0.3 "
            "--rows matmul-f32,softmax,corpus --peers tgc,torch")
    r = subprocess.run(["make", "-s", "gpu-check", f"PY={sys.executable}", f"ARGS={args}"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]  # the script's exit 1, as make reports it
    assert "gpu-check (standin): FAILED" in r.stdout
    doc = json.loads((out / "gpu_check.json").read_text())
    parts = {p["name"]: p for p in doc["parts"]}
    assert parts["environment"]["status"] == "ok"
    assert parts["devices"]["status"] == "ok" and "CUDA: 1 GPU" in parts["devices"]["summary"]
    assert parts["peaks"]["status"] == "ok" and doc["peaks"]["f32_tflops"] > 0 and doc["peaks"]["copy_tbps"] > 0
    assert parts["tests:language"]["status"] == "ok" and parts["tests:language"]["counts"] == {"passed": 1}
    assert parts["tests:graphs"]["status"] == "timed out" and parts["tests:graphs"]["limit_s"] == 0
    assert parts["bench:tgc"]["status"] == "failed"  # the faulting row
    assert parts["bench:torch"]["status"] == "unavailable"
    rows = {row["row"]: row for row in doc["rows"]}
    assert set(rows) == {"matmul-f32", "softmax", "corpus"}
    assert rows["matmul-f32"]["tgc_status"] == "failed" and "faulted" in rows["matmul-f32"]["tgc_why"]
    soft = rows["softmax"]  # ran after the faulting row, on the same device: the context was reset
    n, d = gpu_check.SIZES["standin"]["softmax"]
    assert soft["tgc_status"] == "ok" and soft["tgc_s"] > 0 and soft["check"].startswith("ok: worst error")
    assert soft["rate"] == pytest.approx(2 * 4 * n * d / soft["tgc_s"] / 1e12)
    assert soft["share"] == pytest.approx(soft["rate"] / doc["peaks"]["copy_tbps"])
    assert soft["torch_s"] is None and "PyTorch" in soft["torch_why"]  # not installed here, or sees no GPU
    corpus = rows["corpus"]  # bench/models' first program at its small dims, checked against its numpy twin
    assert corpus["tgc_status"] == "ok" and corpus["size"] == "1 model, small dims", corpus
    assert corpus["check"].startswith("ok: worst error") and "(llama;" in corpus["check"], corpus
    assert list(doc["bench"]["corpus"]["tgc"]["models"]) == ["llama"]
    md = (out / "gpu_check.md").read_text()
    assert "Stand-in run" in md and "| tests:graphs | timed out |" in md and "| softmax |" in md
    assert "| matmul-f32 |" in md and "faulted" in md
    # three files: the GPU machine sends back at most 8 from $OUT; the logs travel packed
    assert sorted(f.name for f in out.iterdir()) == ["gpu_check.json", "gpu_check.md", "gpu_check_logs.tar.gz"]
    with tarfile.open(out / "gpu_check_logs.tar.gz") as tar:
        names = tar.getnames()
        assert "logs/tests-language.log" in names and "logs/bench-tgc.jsonl" in names
        assert b"1 passed" in tar.extractfile("logs/tests-language.log").read()
    assert md in r.stdout  # the summary table is printed at the end


def test_the_table_computes_rates_shares_and_ratios(tmp_path):
    report = gpu_check.Report(tmp_path, {"sizes": {"matmul-f16": "4096^3", "softmax": "8192x8192"},
                                         "amounts": {"matmul-f16": 2 * 4096 ** 3, "softmax": 8 * 8192 ** 2}})
    report.doc["peaks"].update(f16_tflops=700.0, copy_tbps=3.0, f32_tflops=60.0)
    report.cell("matmul-f16", "tgc", {"status": "ok", "seconds": 0.002})
    report.cell("matmul-f16", "torch", {"status": "ok", "seconds": 0.0005})
    report.cell("matmul-f16", "jax", {"status": "unavailable", "why": "JAX sees no GPU"})
    report.cell("softmax", "tgc", {"status": "timed out", "why": "timed out after 60 s"})
    report.cell("softmax", "torch", {"status": "ok", "seconds": 0.001})
    mm, soft = report.table()
    assert mm["rate"] == pytest.approx(2 * 4096 ** 3 / 0.002 / 1e12)  # 68.7 TFLOP/s
    assert mm["share"] == pytest.approx(mm["rate"] / 700.0) and mm["peak_of"] == "f16"
    assert mm["torch_ratio"] == pytest.approx(0.25)  # torch 4x faster
    assert mm["jax_s"] is None and mm["jax_why"] == "JAX sees no GPU"
    assert mm["torch.compile_why"] == "not run"
    assert soft["tgc_s"] is None and soft["rate"] is None and soft["torch_ratio"] is None
    md = (tmp_path / "gpu_check.md").read_text()
    assert ("| matmul-f16 | 4096^3 | 2 ms | 68.7 TFLOP/s | 10% f16 | - | 500 us (0.25x) | not run | JAX sees no GPU |"
            in md)
    assert "| softmax | 8192x8192 | timed out: timed out after 60 s | - | - | - | 1 ms | not run | not run |" in md
    assert json.loads((tmp_path / "gpu_check.json").read_text())["rows"][0]["torch_ratio"] == pytest.approx(0.25)


@pytest.mark.skipif(cuda_standin.why_unavailable() is not None, reason=str(cuda_standin.why_unavailable()))
def test_cuda_lists_its_gpus_and_refuses_an_index_past_them():
    """What gpu_check reads to choose CUDA:0,CUDA:1 or CUDA:0,CPU:1: the driver's device count (stand-in: 2)."""
    env = cuda_standin.env(TGC_STANDIN_DEVICES="2")
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-m", "tgc.cli.main", "devices", "--json"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    (cuda,) = [d for d in json.loads(r.stdout) if d["device"] == "CUDA"]
    assert cuda["available"] and cuda["info"]["device_count"] == 2
    assert cuda["info"]["device_list"].startswith("CUDA:0 .. CUDA:1 (2 GPUs)")
    r = subprocess.run([sys.executable, "-m", "tgc.cli.main", "run", "kernels/softmax.tg", "--random", "-D", "N=4",
                        "-D", "D=8", "-d", "CUDA:2"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no device 'CUDA:2': this machine has 2 CUDA devices" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("row", ["matmul-bf16", "softmax", "layernorm", "attention", "conv2d", "transformer"])
def test_the_value_check_passes_the_reference_and_catches_a_wrong_output(row):
    """gpu_check's check of tgc's values on a GPU: the reference itself (as numpy computes the whole program) passes,
    the same output with one element off by a tenth of the largest value, or of another shape, fails."""
    import numpy as np

    import tgc
    spec = gpu_check.row_spec(row, "standin")
    arrays = gpu_check._inputs_np(spec)
    prog = tgc.load(spec["path"]) if "path" in spec else tgc.loads(spec["src"])
    want = next(iter(prog.reference(dims=spec["dims"], **arrays).values())).astype(np.float32)
    ok, text = gpu_check.check_values(row, spec, arrays, want)
    assert ok, text
    wrong = want.copy()
    wrong.reshape(-1)[3] += 0.1 * np.abs(want).max()
    ok, text = gpu_check.check_values(row, spec, arrays, wrong)
    assert not ok and text.startswith("WRONG: worst error 0.1"), text  # (of the slice's largest value: 0.1 or more)
    ok, text = gpu_check.check_values(row, spec, arrays, want[..., :-1])
    assert not ok and "shape" in text


@pytest.mark.skipif(cuda_standin.why_unavailable() is not None, reason=str(cuda_standin.why_unavailable()))
def test_a_gpu_that_cannot_run_fails_the_check_with_the_reason_and_skips_the_rest(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["TGC_STANDIN_DRIVER_VERSION"] = "12040"  # a driver too old for NVRTC 13's cubins
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--standin", "--out", str(tmp_path),
                        "--rows", "softmax"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    parts = {p["name"]: p for p in doc["parts"]}
    assert parts["devices"]["status"] == "failed"
    assert "CUDA 12.4 only" in parts["devices"]["summary"] and "--standin" in parts["devices"]["summary"]
    assert {p["status"] for n, p in parts.items() if n.startswith("tests:")} == {"skipped"}
    assert len([n for n in parts if n.startswith("tests:")]) == 6 and "peaks" not in parts
    (row,) = doc["rows"]
    assert row["tgc_status"] == "skipped" and row["tgc_why"] == "CUDA is not available"


def test_targets_are_met_not_met_or_unknown_with_the_reason(tmp_path):
    report = gpu_check.Report(tmp_path, {"sizes": {}, "amounts": {}})
    report.cell("matmul-f16", "tgc", {"status": "ok", "seconds": 0.002})
    report.cell("matmul-f16", "torch", {"status": "ok", "seconds": 0.0015})  # 0.75x cuBLAS: met (0.7)
    report.cell("matmul-f32", "tgc", {"status": "ok", "seconds": 0.004})
    report.cell("matmul-f32", "torch", {"status": "ok", "seconds": 0.0016})  # 0.4x: not met (0.5)
    report.cell("softmax", "tgc", {"status": "ok", "seconds": 0.001})
    report.cell("softmax", "torch.compile", {"status": "unavailable", "why": "left out of --quick"})
    report.cell("attention", "tgc", {"status": "timed out", "why": "timed out after 40 s"})
    targets = {t["row"]: t for t in json.loads((tmp_path / "gpu_check.json").read_text())["targets"]}
    assert targets["matmul-f16"]["status"] == "met" and targets["matmul-f16"]["ratio"] == pytest.approx(0.75)
    assert targets["matmul-f32"]["status"] == "not met" and targets["matmul-f32"]["ratio"] == pytest.approx(0.4)
    soft = targets["softmax"]
    assert (soft["status"], soft["why"]) == ("unknown", "torch.compile: left out of --quick")
    assert targets["attention"]["status"] == "unknown" and targets["attention"]["why"] == "tgc: timed out"
    assert targets["transformer"]["why"] == "row not run"
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| matmul-f16 | >= 0.7x cuBLAS (torch) | 0.75x | met |" in md
    assert "| matmul-f32 | >= 0.5x cuBLAS (torch) | 0.40x | not met |" in md


def test_the_corpus_ratio_is_over_the_models_both_ran(tmp_path):
    report = gpu_check.Report(tmp_path, {"sizes": {}, "amounts": {}})
    report.cell("corpus", "tgc", {"status": "ok", "seconds": 0.006, "models": {"a": 0.001, "b": 0.002, "c": 0.003}})
    report.cell("corpus", "jax", {"status": "ok", "seconds": 0.003, "models": {"a": 0.002, "b": 0.001}})
    (row,) = report.table()
    assert row["jax_ratio"] == pytest.approx(3 / 3) and row["rate"] is None  # (a + b) over (a + b), not 3 / 6


def test_a_slow_row_cannot_take_the_time_of_the_rows_after_it():
    assert gpu_check.row_limit("quick", 60.0, 6) == 20.0  # twice its even share
    assert gpu_check.row_limit("quick", 60.0, 1) == gpu_check.ROW_LIMIT_S["quick"]  # capped
    assert gpu_check.row_limit("full", 10.0, 9) == gpu_check.MIN_ROW_S  # a floor
    assert gpu_check.row_limit("standin", 1.0, 9) == gpu_check.ROW_LIMIT_S["standin"]


def test_the_corpus_row_names_a_wrong_or_failing_model_and_runs_the_others():
    def one(e, dims):
        if e["name"] == "gpt2":
            raise RuntimeError("boom")
        return 0.001, "0.5" if e["name"] == "llama" else "1e-07", e["name"] != "llama"

    doc = gpu_check._corpus_row(one, "full")
    assert doc["status"] == "failed"
    assert doc["why"] == "llama: wrong values, error 0.5; gpt2: failed: RuntimeError: boom"
    assert len(doc["models"]) == len(gpu_check.corpus_models("full")) - 1  # every model but gpt2 timed
    assert doc["check"].startswith("WRONG: worst error 0.5 of the largest value (llama;")
