"""`make gpu-check`: the first thing to run on a lent GPU machine, in one call, with one table at the end.

    python3 tools/gpu_check.py [--quick] [--standin] [--out DIR] [--budget S] [--limit PART=S ...]
                               [--tests GROUP,...] [--rows ROW,...] [--jobs N]

Contract:
- Runs from the working tree with the system Python and no network: tgc is imported through `PYTHONPATH` (the
  repository root), nothing is installed, no venv is made. Needs numpy, click, rich, llvmlite, cuda-bindings with
  NVRTC; pytest for the tests (pytest-xdist and hypothesis are used where present: without xdist the tests run
  serially, without hypothesis its test files are left out, and the report says so). PyTorch and JAX are peers
  when present and see the GPU; a missing peer is a column saying why.
- Parts, in order: `environment`, `devices` (`tgc devices`), `peaks` (an FMA loop and a copy through tgc's own
  CUDA runtime: raw kernels, compiled by NVRTC, timed with CUDA events), `tests:GROUP` (the test suite's CUDA
  part: the backend's own tests with those marked `gpu`, the language suite on `CUDA`, graphs, multi-device runs
  on `CUDA:0,CUDA:1` or `CUDA:0,CPU:1`, symbolic kernels, packages built and run in a fresh process), then
  `bench:PEER` for tgc, torch (eager), jax and torch.compile, in that order (each row: time, TFLOP/s or TB/s,
  share of the measured peak, ratio to each peer; the model corpus of bench/models/ against its JAX twins), and
  issue 26 item 4's targets, each met, not met or unknown with the reason.
- Each part runs in a subprocess (its own process group) with its own time limit, also capped by what is left of
  the whole budget (`--budget`: 450 s, 170 s with `--quick`). Bench rows run in one worker per peer, each row
  with its own limit (at most twice its even share of what its peer has left, so one slow row cannot starve the
  rest): a row that hangs or crashes its worker is recorded (timed out / crashed, with the log's tail) and the
  worker starts again at the next row. Tests report each outcome as it happens
  (tools/gpu_check_pytest.py), so a group that runs out of time still says how many passed and which failed.
- Results are written after every part and row, whole each time (a temporary file renamed into place):
  `gpu_check.json` and `gpu_check.md`, plus `gpu_check_logs.tar.gz` (each part's output, packed after every
  part), under `$OUT` when it is set, else `--out`, else `build/gpu-check/<UTC time>` (printed at the start and
  the end). Three files, nothing else: the GPU machine sends back at most 8 files from `$OUT`. The logs are
  written in a temporary work directory (printed) and packed from there. Progress lines go to stdout; the
  summary table is printed at the end. Exit status 0 when every part that ran passed, 1 otherwise (a missing
  peer is not a failure).
- `--standin` runs the same script on a machine without a GPU, through the CPU stand-in for the CUDA driver
  (tests/cuda_standin.py): a tiny subset of each test group, tiny bench sizes; CI runs it
  (tests/test_gpu_check.py) so the script cannot rot. Stand-in timings mean nothing.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import glob
import importlib.util
import io
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
PEERS = ("tgc", "torch", "torch.compile", "jax")
FULL_BUDGET_S, QUICK_BUDGET_S = 450.0, 170.0
# the bench's share of the budget, kept free of the tests (which run first), and each peer's weight in it
BENCH_RESERVE_S = {"full": 170.0, "quick": 75.0, "standin": 60.0}
PACKAGES_RUN_LIMIT_S = {"full": 20.0, "quick": 10.0, "standin": 60.0}
# the peers run in this order (the table's columns keep PEERS' order): tgc's rows first, torch.compile (tens of
# seconds of compiles a row, and left out of --quick) last, so that the time the others leave rolls over to it
BENCH_ORDER = ("tgc", "torch", "jax", "torch.compile")
PEER_WEIGHT = {"full": {"tgc": 0.35, "torch": 0.15, "jax": 0.2, "torch.compile": 0.3},
               "quick": {"tgc": 0.5, "torch": 0.2, "jax": 0.3, "torch.compile": 0.0},
               "standin": {"tgc": 0.35, "torch": 0.15, "jax": 0.2, "torch.compile": 0.3}}
STARTUP_LIMIT_S = 90.0  # a bench worker's imports (torch, jax) before its first row

# ------------------------------------------------------------------------------------------------ bench rows

# (name, what, bound, share of which peak): sizes per mode below. `bound`: "flops" rows count FLOPs (TFLOP/s),
# "bytes" rows count bytes read plus written once (TB/s). `peak`: the measured peak the share is of.
ROWS = [
    ("matmul-f32", "matmul N^3 f32", "flops", "f32"),
    ("matmul-f16", "matmul N^3 f16", "flops", "f16"),
    ("matmul-bf16", "matmul N^3 bf16", "flops", "bf16"),
    ("softmax", "softmax N x D f32 (rows)", "bytes", "copy"),
    ("layernorm", "layernorm N x D f32", "bytes", "copy"),
    ("attention", "causal attention BxHxTxD f32", "flops", "f32"),
    ("conv2d", "conv2d NxCxHxW 3x3 pad 1 f32", "flops", "f32"),
    ("transformer", "transformer block (kernels/transformer_block.tg) f32", "flops", "f32"),
    ("corpus", "the model corpus", "flops", "f32"),
]
ROW_NAMES = [r[0] for r in ROWS]
LOGS_TAR = "gpu_check_logs.tar.gz"

SIZES = {
    "full": {"matmul": 4096, "softmax": (8192, 8192), "attention": (8, 16, 2048, 64), "conv2d": (32, 128, 128, 56),
             "transformer": (8, 512, 512)},
    "quick": {"matmul": 4096, "softmax": (8192, 8192), "attention": (8, 16, 2048, 64),
              "conv2d": (32, 128, 128, 56), "transformer": (8, 512, 512)},
    "standin": {"matmul": 16, "softmax": (8, 32), "attention": (1, 2, 16, 8), "conv2d": (1, 2, 2, 6),
                "transformer": (1, 8, 16)},
}
REPEAT = {"full": 10, "quick": 5, "standin": 2}
ROW_LIMIT_S = {"full": 60.0, "quick": 40.0, "standin": 60.0}
# a row's limit is also at most twice its even share of what is left of its peer's part (at least MIN_ROW_S), so
# that one slow row cannot take the time of the rows after it (the stand-in's rows keep ROW_LIMIT_S: its
# compiles are slow and its timings mean nothing)
MIN_ROW_S = 10.0

# issue 26 item 4: (row, peer, the least ratio of the peer's time over tgc's, what the peer is)
TARGETS = [
    ("matmul-f16", "torch", 0.7, "cuBLAS"), ("matmul-bf16", "torch", 0.7, "cuBLAS"),
    ("matmul-f32", "torch", 0.5, "cuBLAS"), ("softmax", "torch.compile", 0.8, "torch.compile"),
    ("layernorm", "torch.compile", 0.8, "torch.compile"),
    ("attention", "torch", 0.5, "PyTorch's scaled_dot_product_attention"),
    ("transformer", "torch.compile", 0.5, "torch.compile"),
]


def row_limit(mode: str, part_left: float, rows_left: int) -> float:
    """The limit of the next bench row of a peer with `part_left` seconds and `rows_left` rows (this one too)."""
    if mode == "standin":
        return ROW_LIMIT_S[mode]
    return min(ROW_LIMIT_S[mode], max(MIN_ROW_S, 2 * part_left / max(rows_left, 1)))


def row_spec(name: str, mode: str) -> dict[str, Any]:
    """A bench row at the mode's size: tgc source, dims, input shapes and dtypes, FLOPs or bytes."""
    sz = SIZES[mode]
    if name.startswith("matmul-"):
        dt, n = name.split("-")[1], sz["matmul"]
        return {"src": f"a: {dt}[N, N]\nb: {dt}[N, N]\nreturn a @ b", "dims": {"N": n},
                "inputs": {"a": ((n, n), dt), "b": ((n, n), dt)}, "flops": 2 * n ** 3, "size": f"{n}^3"}
    if name in ("softmax", "layernorm"):
        n, d = sz["softmax"]
        src = "x: f32[N, D]\nreturn softmax(x, axis=1)" if name == "softmax" else "x: f32[N, D]\nreturn layernorm(x)"
        return {"src": src, "dims": {"N": n, "D": d}, "inputs": {"x": ((n, d), "f32")}, "bytes": 2 * 4 * n * d,
                "size": f"{n}x{d}"}
    if name == "attention":
        b, h, t, d = sz["attention"]
        src = ("q: f32[B, H, T, D]\nk: f32[B, H, T, D]\nv: f32[B, H, T, D]\n"
               "s = q @ k.transpose(-2, -1) * rsqrt(cast(D, f32))\n"
               "causal = arange(T)[:, None] >= arange(T)[None, :]\n"
               "return softmax(where(causal, s, -1e30), axis=-1) @ v")
        shape = (b, h, t, d)
        # causal: the FLOPs of the half of the score matrix that counts (as FlashAttention counts them)
        return {"src": src, "dims": {"B": b, "H": h, "T": t, "D": d}, "inputs": {k: (shape, "f32") for k in "qkv"},
                "flops": 2 * b * h * t * t * d, "size": f"{b}x{h}x{t}x{d}"}
    if name == "conv2d":
        n, c, o, hw = sz["conv2d"]
        return {"src": "x: f32[N, C, H, W]\nw: f32[O, C, 3, 3]\nreturn conv2d(x, w, padding=1)",
                "dims": {"N": n, "C": c, "O": o, "H": hw, "W": hw},
                "inputs": {"x": ((n, c, hw, hw), "f32"), "w": ((o, c, 3, 3), "f32")},
                "flops": 2 * n * o * c * 9 * hw * hw, "size": f"{n}x{c}x{hw}^2 -> {o}"}
    if name == "transformer":
        b, t, c = sz["transformer"]
        return {"path": str(ROOT / "kernels" / "transformer_block.tg"), "dims": {"B": b, "T": t, "C": c},
                "flops": 2 * b * t * c * 12 * c + 2 * b * t * t * c, "size": f"B={b} T={t} C={c}"}
    raise KeyError(name)


def corpus_dir() -> Path | None:
    """The model corpus (bench/models/*.tg, listed with their numpy/JAX twins in bench/models.py), if any."""
    d = ROOT / "bench" / "models"
    return d if glob.glob(str(d / "*.tg")) else None


# the corpus row: each model at the dims `make bench` runs (CPU scale: small for a GPU), in turn until the row's
# own budget is spent (the models run are named; a peer's ratio is over the models both ran); the stand-in runs
# the first model at its small dims
CORPUS_BUDGET_S = {"full": 40.0, "quick": 20.0, "standin": 60.0}


def corpus_models(mode: str) -> list[tuple[dict[str, Any], dict[str, int]]]:
    """(entry of bench/models.py's CORPUS, dims) for the corpus row."""
    sys.path.insert(0, str(ROOT / "bench"))
    import models
    if mode == "standin":
        return [(models.CORPUS[0], models.CORPUS[0]["small"])]
    return [(e, e["dims"]) for e in models.CORPUS]


def corpus_inputs(prog: Any, dims: dict[str, int]) -> dict[str, Any]:
    """A corpus model's inputs as bench/corpus.py makes them (float32, shaped like a trained model's)."""
    import models

    from tgc.engine.inputs import random_inputs
    shapes = {k: v.shape for k, v in random_inputs(prog, dims, seed=0).items()}
    return models.corpus_inputs(shapes, seed=0)


def _corpus_row(run_one: Any, mode: str) -> dict[str, Any]:
    """Run `run_one(entry, dims) -> (seconds, check text or None, ok)` over the corpus within its budget."""
    if corpus_dir() is None:
        raise _Unavailable("no model corpus in this repository (bench/models/*.tg)")
    st, done, checks, bad = time.perf_counter(), {}, {}, []
    todo = corpus_models(mode)
    for e, dims in todo:
        if time.perf_counter() - st > CORPUS_BUDGET_S[mode]:
            break
        try:
            secs, check, ok = run_one(e, dims)
        except Exception as ex:  # noqa: BLE001 - one model's failure is reported, the others still run
            checks[e["name"]] = f"failed: {type(ex).__name__}: {getattr(ex, 'msg', None) or ex}"[:300]
            bad.append(e["name"])
            continue
        done[e["name"]] = secs
        if check is not None:
            checks[e["name"]] = check
        if not ok:
            bad.append(e["name"])
    doc = {"status": "ok", "seconds": sum(done.values()), "models": done,
           "summary": f"{len(done)} of {len(todo)} models (the row's budget: {CORPUS_BUDGET_S[mode]:.0f} s)"}
    errors = {k: float(v) for k, v in checks.items() if v[:1].isdigit() or v == "nan"}
    if checks:
        doc["model_checks"] = checks
    if errors:
        worst = max(errors, key=lambda k: errors[k] if math.isfinite(errors[k]) else math.inf)
        doc["check"] = (f"{'ok' if not bad else 'WRONG'}: worst error {checks[worst]} of the largest value "
                        f"({worst}; allowed {CHECK_TOL['f32']:g}), against each model's numpy twin")
    if bad:
        why = (f"{k}: {checks[k] if checks[k].startswith(('failed', 'shape')) else 'wrong values, error ' + checks[k]}"
               for k in bad)
        doc.update(status="failed", why="; ".join(why)[:1500])
    return doc


# ------------------------------------------------------------------------------------------------ workers

def _emit(results: str, doc: dict) -> None:
    with open(results, "a", encoding="utf-8") as f:
        f.write(json.dumps(doc) + "\n")


def _inputs_np(spec: dict, seed: int = 0) -> dict[str, Any]:
    import numpy as np
    rng = np.random.default_rng(seed)
    if "path" in spec:  # the transformer block: realistic weights
        sys.path.insert(0, str(ROOT / "bench"))
        import models
        d = spec["dims"]
        return models.transformer_inputs(d["B"], d["T"], d["C"])
    out = {}
    for name, (shape, dt) in spec["inputs"].items():
        a = rng.standard_normal(shape).astype(np.float32)
        out[name] = a.astype(np.float16) if dt == "f16" else a  # bf16: tgc rounds f32 (cast=True); peers convert
    return out


# the largest error allowed in tgc's check, relative to the largest value of the reference, by input dtype
CHECK_TOL = {"f32": 1e-3, "f16": 1e-2, "bf16": 3e-2}


def _bf16_round(a: Any) -> Any:
    """f32 values rounded to bf16 (nearest even), as f32: what tgc computes with after `cast=True`."""
    import numpy as np
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).view(np.float32)


def reference_slice(row: str, spec: dict, arrays: dict[str, Any], out: Any) -> tuple[Any, Any, str]:
    """A cheap slice of the row's output and its numpy reference (float64): 8 rows of a matmul, softmax or
    layernorm, one (batch, head) of attention, one image of conv2d, one batch row of the transformer block."""
    import numpy as np
    sys.path.insert(0, str(ROOT / "bench"))
    import models
    f64 = np.float64
    if row.startswith("matmul-"):
        dt = row.split("-")[1]
        a, b = arrays["a"], arrays["b"]
        if dt == "bf16":
            a, b = _bf16_round(a), _bf16_round(b)
        return out[:8], a[:8].astype(f64) @ b.astype(f64), dt
    if row == "softmax":
        return out[:8], models.softmax(np, arrays["x"][:8].astype(f64), axis=1), "f32"
    if row == "layernorm":
        return out[:8], models.layernorm(np, arrays["x"][:8].astype(f64)), "f32"
    if row == "attention":
        q, k, v = (arrays[n][0, 0].astype(f64) for n in "qkv")
        t = q.shape[0]
        s = q @ k.T / math.sqrt(q.shape[-1])
        s = np.where(np.arange(t)[:, None] >= np.arange(t)[None, :], s, -1e30)
        return out[0, 0], models.softmax(np, s) @ v, "f32"
    if row == "conv2d":
        x, w = arrays["x"][:1].astype(f64), arrays["w"].astype(f64)
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # (1, C, H, W, 3, 3)
        return out[:1], np.einsum("nchwij,ocij->nohw", win, w, optimize=True), "f32"
    if row == "transformer":
        args = [arrays["x"][:1].astype(f64), *(arrays[k].astype(f64) for k in _TRANSFORMER_WEIGHTS)]
        return out[:1], models.transformer_block(np, *args), "f32"
    raise KeyError(row)


def check_values(row: str, spec: dict, arrays: dict[str, Any], out: Any) -> tuple[bool, str]:
    """(ok, text): the worst error of `reference_slice`, relative to the reference's largest value."""
    import numpy as np
    got, want, dt = reference_slice(row, spec, arrays, out)
    if got.shape != want.shape:
        return False, f"WRONG: output shape {got.shape}, the reference's {want.shape}"
    err = float(np.max(np.abs(got.astype(np.float64) - want))) / max(float(np.max(np.abs(want))), 1e-30)
    ok = bool(np.isfinite(err)) and err <= CHECK_TOL[dt]
    return ok, (f"{'ok' if ok else 'WRONG'}: worst error {err:.2g} of the largest value (allowed {CHECK_TOL[dt]:g}), "
                "on a slice against numpy")


def _median_time(fn, sync, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeat):
        st = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - st)
    return statistics.median(times)


def worker(peer: str, mode: str, rows: list[str], results: str) -> None:
    """Run `rows` for one peer, one JSON line per row (`start`, then a result); a Python error is that row's
    failure and the next row runs."""
    if os.environ.get("TGC_STANDIN_DIR"):
        sys.path.insert(0, str(ROOT / "tests"))
        import cuda_standin
        cuda_standin.install()
    try:
        runner = {"tgc": _tgc_runner, "torch": _torch_runner, "torch.compile": _torch_runner,
                  "jax": _jax_runner}[peer](peer, mode)
    except _Unavailable as e:
        _emit(results, {"event": "unavailable", "why": str(e)})
        return
    for row in rows:
        _emit(results, {"event": "start", "row": row, "t": time.time()})
        try:
            doc = runner(row)
        except _Unavailable as e:
            doc = {"status": "unavailable", "why": str(e)}
        except Exception as e:  # noqa: BLE001 - one row's failure is reported, the others still run
            msg = getattr(e, "msg", None) or str(e)
            doc = {"status": "failed", "why": f"{type(e).__name__}: {msg}"[:1500]}
        _emit(results, {"event": "done", "row": row, **doc})


class _Unavailable(Exception):
    """A peer (or a row for a peer) that cannot run here, and why."""


def _tgc_runner(peer: str, mode: str):
    import tgc
    from tgc.backends import get_device
    dev = get_device("CUDA")
    ok, why = type(dev).probe()
    if not ok:
        raise _Unavailable(f"CUDA cannot run here: {why}")

    def corpus_one(e: dict[str, Any], dims: dict[str, int]) -> tuple[float, str, bool]:
        import numpy as np
        prog = tgc.load(ROOT / "bench" / "models" / e["file"])
        arrays = corpus_inputs(prog, dims)
        res = prog.bench(device="CUDA", dims=dims, inputs=arrays, repeat=REPEAT[mode])
        got = next(iter(prog.run(device="CUDA", dims=dims, **arrays).values())).astype(np.float64)
        want = e["model"](np, *(arrays[d.name].astype(np.float64) for d in prog.inputs))
        want = np.asarray(want[0] if isinstance(want, tuple) else want)
        prog.release()
        if got.shape != want.shape:
            return res["program"]["median_s"], f"shape {got.shape} (numpy {want.shape})", False
        err = float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-30)
        return res["program"]["median_s"], f"{err:.2g}", bool(np.isfinite(err)) and err <= CHECK_TOL["f32"]

    def run(row: str) -> dict:
        if row == "corpus":
            return _corpus_row(corpus_one, mode)
        spec = row_spec(row, mode)
        prog = tgc.load(spec["path"]) if "path" in spec else tgc.loads(spec["src"], filename=f"<{row}>")
        arrays = _inputs_np(spec)
        st = time.perf_counter()
        res = prog.bench(device="CUDA", dims=spec["dims"], inputs=arrays, repeat=REPEAT[mode])
        p = res["program"]
        doc = {"status": "ok", "seconds": p["median_s"], "min_s": p["min_s"], "max_s": p["max_s"],
               "kernels": len(res["kernels"]), "graph": p.get("graph"),
               # what the heuristic chose for each kernel (the GPU rules: tiles, STAGE, a work-group per row)
               "opts": [" ".join(k.get("opts") or []) for k in res["kernels"]]}
        # the values too: a fast wrong kernel is no result (tgc's CUDA had never run on a GPU before this check)
        out = next(iter(prog.run(device="CUDA", dims=spec["dims"], cast=True, **arrays).values()))
        ok, doc["check"] = check_values(row, spec, arrays, out)
        if not ok:
            doc.update(status="failed", why=f"wrong values: {doc['check']}")
        doc["wall_s"] = round(time.perf_counter() - st, 2)
        return doc
    return run


def _torch_runner(peer: str, mode: str):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        raise _Unavailable(f"PyTorch is not installed ({e})") from None
    if not torch.cuda.is_available():
        raise _Unavailable(f"PyTorch {torch.__version__} sees no CUDA GPU")
    if peer == "torch.compile" and mode == "quick":
        raise _Unavailable("left out of --quick (its compiles take tens of seconds per row)")
    # like for like: f32 stays f32 (no TF32 in cuBLAS or cuDNN)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

    def block(x, ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj):
        b, t, c = x.shape
        heads, hd = 4, c // 4
        h = F.layer_norm(x, (c,), ln1_g, ln1_b, 1e-5)
        qkv = (h @ w_qkv + b_qkv).reshape(b, t, 3, heads, hd)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = x + att.transpose(1, 2).reshape(b, t, c) @ w_o + b_o
        h2 = F.layer_norm(y, (c,), ln2_g, ln2_b, 1e-5)
        return y + F.gelu(h2 @ w_fc + b_fc) @ w_proj + b_proj

    fns = {"softmax": lambda x: torch.softmax(x, dim=1),
           "layernorm": lambda x: F.layer_norm(x, (x.shape[-1],), eps=1e-5),
           "attention": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
           "conv2d": lambda x, w: F.conv2d(x, w, padding=1), "transformer": block}

    def run(row: str) -> dict:
        if row == "corpus":
            raise _Unavailable("no model corpus in this repository" if corpus_dir() is None else
                               "the corpus has numpy and JAX twins, no PyTorch ones (bench/models.py)")
        spec = row_spec(row, mode)
        arrays = _inputs_np(spec)
        if "path" in spec:
            args = [torch.from_numpy(arrays[k]).cuda() for k in ("x", *_TRANSFORMER_WEIGHTS)]
        else:
            args = [torch.from_numpy(arrays[k]).to(dtypes[dt]).cuda() for k, (_, dt) in spec["inputs"].items()]
        fn = (lambda a, b: a @ b) if row.startswith("matmul") else fns[row]
        with torch.no_grad():
            if peer == "torch.compile":
                fn = torch.compile(fn)
            st = time.perf_counter()
            fn(*args)
            torch.cuda.synchronize()
            first = time.perf_counter() - st
            t = _median_time(lambda: fn(*args), torch.cuda.synchronize, REPEAT[mode])
        return {"status": "ok", "seconds": t, "first_call_s": round(first, 3), "version": torch.__version__}
    return run


_TRANSFORMER_WEIGHTS = ("ln1_g", "ln1_b", "w_qkv", "b_qkv", "w_o", "b_o", "ln2_g", "ln2_b", "w_fc", "b_fc",
                        "w_proj", "b_proj")


def _jax_runner(peer: str, mode: str):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to the others
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        raise _Unavailable(f"JAX is not installed ({e})") from None
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        raise _Unavailable(f"JAX {jax.__version__} sees no GPU ({str(e).splitlines()[0][:90]})") from None
    jax.config.update("jax_default_matmul_precision", "highest")  # like for like: f32 matmuls without TF32
    sys.path.insert(0, str(ROOT / "bench"))
    import models
    dtypes = {"f32": jnp.float32, "f16": jnp.float16, "bf16": jnp.bfloat16}

    def attention(q, k, v):
        t = q.shape[-2]
        s = q @ jnp.swapaxes(k, -1, -2) * (1.0 / math.sqrt(q.shape[-1]))
        causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
        return models.softmax(jnp, jnp.where(causal, s, -1e30)) @ v

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)))

    fns = {"softmax": lambda x: jax.nn.softmax(x, axis=1), "layernorm": lambda x: models.layernorm(jnp, x),
           "attention": attention, "conv2d": conv,
           "transformer": lambda *a: models.transformer_block(jnp, *a)}

    def corpus_one(e: dict[str, Any], dims: dict[str, int]) -> tuple[float, None, bool]:
        import tgc
        prog = tgc.load(ROOT / "bench" / "models" / e["file"])
        arrays = corpus_inputs(prog, dims)
        args = [jax.device_put(arrays[d.name], gpus[0]) for d in prog.inputs]
        fn = jax.jit(lambda *a, model=e["model"]: model(jnp, *a))
        jax.block_until_ready(fn(*args))
        out: list[Any] = [None]

        def call() -> None:
            out[0] = fn(*args)
        return _median_time(call, lambda: jax.block_until_ready(out[0]), REPEAT[mode]), None, True

    def run(row: str) -> dict:
        if row == "corpus":
            return _corpus_row(corpus_one, mode)
        spec = row_spec(row, mode)
        arrays = _inputs_np(spec)
        if "path" in spec:
            args = [jax.device_put(arrays[k], gpus[0]) for k in ("x", *_TRANSFORMER_WEIGHTS)]
        else:
            args = [jax.device_put(jnp.asarray(arrays[k], dtype=dtypes[dt]), gpus[0])
                    for k, (_, dt) in spec["inputs"].items()]
        fn = jax.jit((lambda a, b: a @ b) if row.startswith("matmul") else fns[row])
        st = time.perf_counter()
        fn(*args).block_until_ready()
        first = time.perf_counter() - st
        out: list[Any] = [None]

        def call() -> None:
            out[0] = fn(*args)
        t = _median_time(call, lambda: out[0].block_until_ready(), REPEAT[mode])
        return {"status": "ok", "seconds": t, "first_call_s": round(first, 3), "version": jax.__version__}
    return run


# ------------------------------------------------------------------------------------------------ peaks

FMA_SRC = r"""
extern "C" __global__ void __launch_bounds__(256) tgc_peak_fma(float* __restrict__ out, int iters) {
  float x0 = threadIdx.x * 1e-9f, x1 = x0 + 1e-9f, x2 = x0 + 2e-9f, x3 = x0 + 3e-9f;
  float x4 = x0 + 4e-9f, x5 = x0 + 5e-9f, x6 = x0 + 6e-9f, x7 = x0 + 7e-9f;
  const float a = 0.9999999f, b = 1e-9f;
  for (int i = 0; i < iters; i++) {
#pragma unroll
    for (int j = 0; j < 16; j++) {
      x0 = fmaf(x0, a, b); x1 = fmaf(x1, a, b); x2 = fmaf(x2, a, b); x3 = fmaf(x3, a, b);
      x4 = fmaf(x4, a, b); x5 = fmaf(x5, a, b); x6 = fmaf(x6, a, b); x7 = fmaf(x7, a, b);
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}
"""
FMA_FLOPS_PER_ITER = 16 * 8 * 2  # per thread: 16 unrolled steps of 8 chains, 2 FLOPs per FMA

COPY_SRC = r"""
struct alignas(16) tgc_v4 { float x, y, z, w; };
extern "C" __global__ void __launch_bounds__(256) tgc_peak_copy(tgc_v4* __restrict__ dst,
                                                                const tgc_v4* __restrict__ src, int n) {
  int stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}
"""


def measure_peaks(mode: str) -> dict[str, Any]:
    """The GPU's f32 FMA rate and copy bandwidth, through tgc's CUDA runtime (raw kernels, CUDA events)."""
    if os.environ.get("TGC_STANDIN_DIR"):
        sys.path.insert(0, str(ROOT / "tests"))
        import cuda_standin
        cuda_standin.install()
    from tgc.backends import get_device
    dev = get_device("CUDA")
    ok, why = type(dev).probe()
    if not ok:
        raise SystemExit(f"CUDA cannot run here: {why}")
    info = dev.info()
    standin = mode == "standin"
    sms = int(info.get("sm_count") or 1)
    blocks, threads = (1, 32) if standin else (sms * 8, 256)
    fma = dev.program("tgc_peak_fma", dev.compiler.compile(FMA_SRC))
    out = dev.allocator.alloc(blocks * threads * 4)
    iters, target = (4, 0.0) if standin else (256, 0.02)
    while True:  # grow the loop until a launch takes `target` seconds
        t = statistics.median(fma(out, global_size=(blocks,), local_size=(threads,), vals=(iters,), wait=True)
                              for _ in range(3))
        if t >= target or iters >= 1 << 24:
            break
        iters *= 2
    fma_times = [fma(out, global_size=(blocks,), local_size=(threads,), vals=(iters,), wait=True)
                 for _ in range(2 if standin else 7)]
    flops = blocks * threads * iters * FMA_FLOPS_PER_ITER
    dev.allocator.free(out, blocks * threads * 4)
    nbytes = (1 << 16) if standin else (1 << 29)  # 512 MiB each way: far past any L2
    copy = dev.program("tgc_peak_copy", dev.compiler.compile(COPY_SRC))
    src, dst = dev.allocator.alloc(nbytes), dev.allocator.alloc(nbytes)
    cblocks = 1 if standin else sms * 8
    copy_times = [copy(dst, src, global_size=(cblocks,), local_size=(threads,), vals=(nbytes // 16,), wait=True)
                  for _ in range(3 if standin else 12)][1:]
    dev.allocator.free(src, nbytes)
    dev.allocator.free(dst, nbytes)
    return {"f32_tflops": flops / statistics.median(fma_times) / 1e12,
            "copy_tbps": 2 * nbytes / statistics.median(copy_times) / 1e12,
            "how": "measured through tgc's CUDA runtime: an FMA loop (8 chains a thread, "
                   f"{blocks}x{threads} threads) and a 16-byte copy of {nbytes >> 10} KiB (bytes read + written), "
                   "timed with CUDA events, medians",
            "spec_tflops": (info.get("peak_gflops") or 0) / 1e3 or None,
            "spec_tbps": (info.get("peak_gbps") or 0) / 1e3 or None,
            "gpu": info.get("name"), "device_count": info.get("device_count")}


def torch_tensor_peaks(mode: str) -> dict[str, Any]:
    """cuBLAS's f16/bf16 matmul rate at 8192^3 through PyTorch: the tensor cores' measured peak."""
    import torch
    if not torch.cuda.is_available():
        raise SystemExit(f"PyTorch {torch.__version__} sees no CUDA GPU")
    n = 8192
    out = {}
    for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        a, b = torch.randn(n, n, device="cuda", dtype=dt), torch.randn(n, n, device="cuda", dtype=dt)
        t = _median_time(lambda a=a, b=b: a @ b, torch.cuda.synchronize, 10 if mode == "full" else 5)
        out[f"{name}_tflops"] = 2 * n ** 3 / t / 1e12
    out["how"] = f"measured through PyTorch {torch.__version__}: cuBLAS matmul {n}^3 in f16 and bf16, medians"
    return out


# ------------------------------------------------------------------------------------------------ the report

def _fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"


class Report:
    """gpu_check.json and gpu_check.md under `out`, both rewritten whole after every change."""

    def __init__(self, out: Path, meta: dict[str, Any], logs: Path | None = None):
        self.out, self.logs = out, logs
        self.doc: dict[str, Any] = {"meta": meta, "parts": [], "peaks": {}, "bench": {}}

    def part(self, rec: dict[str, Any]) -> None:
        parts = [p for p in self.doc["parts"] if p["name"] != rec["name"]]
        self.doc["parts"] = [*parts, rec]
        self.save()
        self.pack_logs()

    def pack_logs(self) -> None:
        """The work directory's logs/ as gpu_check_logs.tar.gz (each file's last 4 MiB)."""
        if self.logs is None or not self.logs.is_dir():
            return
        tmp = self.out / ".gpu_check_logs.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            for f in sorted(self.logs.iterdir()):
                if not f.is_file():
                    continue
                data = f.read_bytes()[-(4 << 20):]
                info = tarfile.TarInfo(f"logs/{f.name}")
                info.size, info.mtime = len(data), int(f.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, self.out / LOGS_TAR)

    def cell(self, row: str, peer: str, doc: dict[str, Any]) -> None:
        self.doc["bench"].setdefault(row, {})[peer] = doc
        self.save()

    def save(self) -> None:
        self.doc["meta"]["updated"] = _now()
        self.doc["rows"] = self.table()
        self.doc["targets"] = self.targets(self.doc["rows"])
        for name, text in (("gpu_check.json", json.dumps(self.doc, indent=2, default=str)),
                           ("gpu_check.md", self.markdown())):
            tmp = self.out / f".{name}.tmp"
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self.out / name)

    def table(self) -> list[dict[str, Any]]:
        """One row per bench row: tgc's time and rate, share of the measured peak, each peer's time and ratio."""
        peaks, rows = self.doc["peaks"], []
        for name, what, bound, peak_of in ROWS:
            cells = self.doc["bench"].get(name)
            if not cells:
                continue
            size = self.doc["meta"].get("sizes", {}).get(name, "")
            r: dict[str, Any] = {"row": name, "what": what, "size": size, "bound": bound}
            t = cells.get("tgc", {})
            secs = t.get("seconds") if t.get("status") == "ok" else None
            r["tgc_s"] = secs
            r["tgc_status"] = t.get("status", "not run")
            r["tgc_why"] = t.get("why")
            r["check"] = t.get("check")
            amount = self.doc["meta"].get("amounts", {}).get(name)
            rate = amount / secs / 1e12 if secs and amount else None
            r["rate"] = rate
            r["unit"] = "TFLOP/s" if bound == "flops" else "TB/s"
            peak = peaks.get({"f32": "f32_tflops", "f16": "f16_tflops", "bf16": "bf16_tflops",
                              "copy": "copy_tbps"}[peak_of])
            r["peak_of"] = peak_of
            r["share"] = rate / peak if rate and peak else None
            for peer in PEERS[1:]:
                c = cells.get(peer, {})
                ps = c.get("seconds") if c.get("status") == "ok" else None
                r[f"{peer}_s"] = ps
                r[f"{peer}_ratio"] = ps / secs if ps and secs else None  # >1: tgc is faster
                common = sorted(set(t.get("models") or {}) & set(c.get("models") or {}))
                if ps and secs and common:  # the corpus: over the models both ran
                    r[f"{peer}_ratio"] = (sum(c["models"][m] for m in common) /
                                          max(sum(t["models"][m] for m in common), 1e-30))
                r[f"{peer}_why"] = None if ps else (c.get("why") or c.get("status") or "not run")
            rows.append(r)
        return rows

    def targets(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Issue 26 item 4's targets, each met, not met or unknown (and why) from the table's ratios."""
        by_row = {r["row"]: r for r in rows}
        out = []
        for row, peer, want, what in TARGETS:
            r = by_row.get(row)
            t: dict[str, Any] = {"row": row, "peer": peer, "want": want, "what": what, "ratio": None}
            if r is None:
                t.update(status="unknown", why="row not run")
            elif r["tgc_s"] is None:
                t.update(status="unknown", why=f"tgc: {r['tgc_status']}")
            elif r[f"{peer}_ratio"] is None:
                t.update(status="unknown", why=f"{peer}: {r[f'{peer}_why']}")
            else:
                t.update(ratio=r[f"{peer}_ratio"], status="met" if r[f"{peer}_ratio"] >= want else "not met")
            out.append(t)
        return out

    def markdown(self) -> str:
        m = self.doc["meta"]
        lines = [f"# gpu-check {m.get('mode')} ({m.get('started')})", "",
                 f"- machine: {m.get('gpu') or 'GPU unknown'}; commit {m.get('commit')}; python {m.get('python')}",
                 f"- updated {m.get('updated')}; budget {m.get('budget_s')} s", ""]
        if m.get("standin"):
            lines += ["**Stand-in run (no GPU): CUDA through the CPU stand-in driver; timings mean nothing.**", ""]
        lines += ["## Parts", "", "| part | status | time | summary |", "|---|---|---|---|"]
        for p in self.doc["parts"]:
            lines.append(f"| {p['name']} | {p['status']} | {p.get('seconds', 0):.1f} s"
                         f"{' / ' + format(p['limit_s'], '.0f') + ' s' if p.get('limit_s') else ''} | "
                         f"{_md(p.get('summary', ''))} |")
        pk = self.doc["peaks"]
        if pk:
            lines += ["", "## Measured peaks", ""]
            for k, label in (("f32_tflops", "f32 FMA"), ("copy_tbps", "copy bandwidth"), ("f16_tflops", "f16"),
                             ("bf16_tflops", "bf16")):
                if pk.get(k) is not None:
                    unit = "TB/s" if k.endswith("tbps") else "TFLOP/s"
                    lines.append(f"- {label}: {pk[k]:.4g} {unit}")
            for k in ("how", "torch_how"):
                if pk.get(k):
                    lines.append(f"- {pk[k]}")
            if pk.get("spec_tflops") or pk.get("spec_tbps"):
                lines.append(f"- from the clocks (`tgc devices`): {pk.get('spec_tflops') or '-'} TFLOP/s f32, "
                             f"{pk.get('spec_tbps') or '-'} TB/s")
        rows = self.doc.get("rows") or []
        if rows:
            lines += ["", "## Bench", "", "Ratios are the peer's time over tgc's: above 1, tgc is faster. Values: "
                      "tgc's worst error on a slice of the output against numpy, relative to the largest value.", "",
                      "| row | size | tgc | rate | of peak | values | " + " | ".join(PEERS[1:]) + " |",
                      "|---|---|---|---|---|---|" + "---|" * len(PEERS[1:])]
            for r in rows:
                tg = _fmt_time(r["tgc_s"]) if r["tgc_s"] else f"{r['tgc_status']}: {_md(r['tgc_why'] or '')}"
                rate = f"{r['rate']:.3g} {r['unit']}" if r["rate"] else "-"
                share = (f"{100 * r['share']:.0f}% {r['peak_of']}" if r["share"] else
                         f"- (no {r['peak_of']} peak)" if r["rate"] else "-")
                peers = []
                for peer in PEERS[1:]:
                    if r[f"{peer}_s"]:
                        ratio = f" ({r[f'{peer}_ratio']:.2f}x)" if r[f"{peer}_ratio"] else ""
                        peers.append(_fmt_time(r[f"{peer}_s"]) + ratio)
                    else:
                        peers.append(_md(r[f"{peer}_why"]))
                check = r["check"].split(" of ")[0].replace(": worst error", "") if r["check"] else "-"
                lines.append(f"| {r['row']} | {r['size']} | {tg} | {rate} | {share} | {check} | " + " | ".join(peers)
                             + " |")
        targets = self.doc.get("targets") or []
        if rows and targets:
            lines += ["", "## Targets (issue 26 item 4)", "", "| row | target | ratio | status |", "|---|---|---|---|"]
            for t in targets:
                ratio = f"{t['ratio']:.2f}x" if t["ratio"] is not None else "-"
                status = t["status"] if t["status"] != "unknown" else f"unknown: {_md(t['why'])}"
                lines.append(f"| {t['row']} | >= {t['want']}x {t['what']} ({t['peer']}) | {ratio} | {status} |")
        return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")[:300]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------------------ running parts

class Runner:
    """Runs parts as subprocesses under time limits, within the whole budget, recording each in the report."""

    def __init__(self, report: Report, env: dict[str, str], budget: float, limits: dict[str, float]):
        self.report, self.env, self.limits = report, env, limits
        self.deadline = time.monotonic() + budget
        self.reserve = 0.0  # seconds at the end kept for later parts (the bench) while the tests run
        self.logs = report.logs or report.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.failed = False

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def limit(self, name: str, default: float) -> float:
        return min(self.limits.get(name, default), max(self.left() - self.reserve, 0.0))

    def spawn(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        f = open(log, "ab")
        try:
            return subprocess.Popen(cmd, cwd=ROOT, env=env or self.env, stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            f.close()

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the part's own process group (pytest's xdist workers too)
        except ProcessLookupError:
            pass
        proc.wait()

    def run(self, name: str, cmd: list[str], default_limit: float, env: dict[str, str] | None = None,
            progress: Any = None) -> tuple[str, int | None, float, float]:
        """Run one part: (status, exit code, seconds, limit). Status: ok, failed, timed out, skipped."""
        limit = self.limit(name, default_limit)
        log = self.logs / (name.replace(":", "-").replace(".", "-") + ".log")
        if self.left() - self.reserve < 1 or limit <= 0:
            return "skipped", None, 0.0, limit
        print(f"[{_clock()}] {name}: started (limit {limit:.0f} s)", flush=True)
        st = time.monotonic()
        proc = self.spawn(cmd, log, env)
        next_note = st + 15
        while True:
            try:  # (never past the limit: a part that ends after it, before a later poll, still timed out)
                rc = proc.wait(timeout=max(0.0, min(1.0, st + limit - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if now - st >= limit:
                    self.kill(proc)
                    return "timed out", None, now - st, limit
                if progress is not None and now >= next_note:
                    print(f"[{_clock()}] {name}: {now - st:.0f} s, {progress()}", flush=True)
                    next_note = now + 15
        return ("ok" if rc == 0 else "failed"), rc, time.monotonic() - st, limit


def _clock() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%H:%M:%S")


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-n:]
    except OSError:
        return ""


def _git_commit() -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                           timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return r.stdout.strip() + (" (with local changes)" if dirty else "") if r.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"


def environment() -> dict[str, Any]:
    """What the check can use here: required modules, optional ones, and what is missing."""
    need = ("numpy", "click", "rich", "llvmlite", "cuda.bindings")
    optional = ("pytest", "xdist", "hypothesis", "torch", "jax")
    have = {}
    for m in (*need, *optional):
        try:
            have[m] = importlib.util.find_spec(m) is not None
        except (ImportError, ValueError):
            have[m] = False
    return {"python": sys.version.split()[0], "executable": sys.executable, "modules": have,
            "missing_required": [m for m in need if not have[m]], "cpus": os.cpu_count()}


# --- test groups

def test_groups(mode: str, gpus: int, workdir: Path) -> list[dict[str, Any]]:
    """The test suite's CUDA part, as groups: name, pytest arguments, extra environment, time limit."""
    lang = sorted(os.path.relpath(p, ROOT) for p in glob.glob(str(ROOT / "tests" / "test_lang_*.py")))
    lists = "CUDA:0,CUDA:1" if gpus >= 2 else "CUDA:0,CPU:1"
    pkg_dir = workdir / "packages"
    if mode == "standin":  # one small test each: the machinery, not the coverage
        one = "tests/test_lang_ops.py::test_float_arithmetic[CUDA-f32]"
        sel = {"backend": ["tests/test_cuda_backend.py::test_gpu_add_matches_numpy"], "language": [one],
               "graphs": ["tests/test_graphs.py::test_graph_runs_match_numpy_and_per_kernel_launches"
                          "[CUDA-return exp(a * b + 1.0) * 0.5 ]"],
               "multi": [f"tests/test_multi_lang.py::test_float_arithmetic[{lists}-f32]"],
               "symbolic": ["tests/test_lang_dims.py::test_dims_are_integer_values_in_expressions[CUDA]"],
               "packages": [one]}
        sample = {}
        limits = dict.fromkeys(sel, 120.0)
    else:
        sel = {"backend": ["tests/test_cuda_backend.py"], "language": lang, "graphs": ["tests/test_graphs.py"],
               "multi": ["tests/test_multi_lang.py"],
               "symbolic": ["tests/test_lang_programs.py", "tests/test_lang_dims.py", "tests/test_lang_nn.py"],
               "packages": ["tests/test_lang_programs.py", "tests/test_lang_nn.py"]}
        sample = ({"language": 4, "multi": 8, "symbolic": 4, "packages": 4} if mode == "quick" else
                  {"multi": 2})
        # what the budget leaves the tests (full: 450 s - 170 s for the bench - ~35 s for devices and peaks)
        limits = ({"backend": 10, "language": 20, "graphs": 8, "multi": 8, "symbolic": 10, "packages": 10}
                  if mode == "quick" else
                  {"backend": 15, "language": 100, "graphs": 15, "multi": 35, "symbolic": 30, "packages": 30})
    env = {"backend": {}, "language": {"TGC_TEST_DEVICES": "CUDA"}, "graphs": {"TGC_TEST_DEVICES": "CUDA"},
           "multi": {"TGC_TEST_DEVICE_LISTS": lists},
           "symbolic": {"TGC_TEST_DEVICES": "CUDA", "TGC_TEST_SYMBOLIC": "1"},
           "packages": {"TGC_TEST_DEVICES": "CUDA", "TGC_PACKAGE_SUITE": str(pkg_dir), "TGC_PACKAGE_DEVICE": "CUDA"}}
    return [{"name": g, "args": sel[g], "env": {**env[g], "TGC_GPU_CHECK_SAMPLE": str(sample.get(g, 1))},
             "limit": float(limits[g]), "plugins": ["package_suite"] if g == "packages" else [],
             "packages_run_limit": PACKAGES_RUN_LIMIT_S[mode]} for g in sel]


def _needs_hypothesis(path: str) -> bool:
    try:
        text = (ROOT / path.split("::")[0]).read_text(encoding="utf-8")
    except OSError:
        return False
    return "from hypothesis" in text or "import hypothesis" in text


def _test_summary(results: Path) -> dict[str, Any]:
    rows = []
    if results.exists():  # whole lines only: pytest may be writing the last one
        rows = [json.loads(line) for line in results.read_text(encoding="utf-8").split("\n")[:-1] if line.strip()]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    bad = [{"test": r["test"], "outcome": r["outcome"], "message": r.get("message", "")[-800:]}
           for r in rows if r["outcome"] in ("failed", "error", "xpassed")]
    skip = next((r.get("message", "") for r in rows if r["outcome"] == "skipped"), "")
    return {"counts": counts, "failures": bad[:30], "more_failures": max(0, len(bad) - 30), "first_skip": skip}


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no test finished"


def run_tests(runner: Runner, group: dict[str, Any], env_info: dict[str, Any], jobs: int) -> None:
    name = f"tests:{group['name']}"
    mods = env_info["modules"]
    if not mods.get("pytest"):
        runner.report.part({"name": name, "status": "skipped", "summary": "pytest is not installed"})
        return
    notes = []
    args = list(group["args"])
    if not mods.get("hypothesis"):
        dropped = [a for a in args if _needs_hypothesis(a)]
        args = [a for a in args if a not in dropped]
        if dropped:
            notes.append(f"hypothesis missing: left out {', '.join(os.path.basename(d) for d in dropped)}")
    results = runner.logs / f"{name.replace(':', '-')}.jsonl"
    results.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpu_check_pytest"]
    for p in group["plugins"]:
        cmd += ["-p", p]
    if jobs > 1 and mods.get("xdist"):
        cmd += ["-n", str(jobs)]
    else:
        cmd += ["-p", "no:xdist"]
        if jobs > 1:
            notes.append("pytest-xdist missing: serial")
    if group["env"].get("TGC_PACKAGE_SUITE"):
        shutil.rmtree(group["env"]["TGC_PACKAGE_SUITE"], ignore_errors=True)
        os.makedirs(group["env"]["TGC_PACKAGE_SUITE"], exist_ok=True)
    env = {**runner.env, **group["env"], "TGC_GPU_CHECK_RESULTS": str(results)}
    status, rc, secs, limit = runner.run(name, cmd + args, group["limit"], env,
                                         progress=lambda: _counts_text(_test_summary(results)["counts"]))
    summ = _test_summary(results)
    text = _counts_text(summ["counts"])
    if status == "failed" and rc == 5:
        text = "no tests collected"
    elif status == "failed" and not summ["failures"]:
        text += f"; pytest exit {rc}: {_md(_tail(runner.logs / (name.replace(':', '-') + '.log'), 400))}"
    elif status == "skipped":
        text = "no time left"
    if status == "ok" and not summ["counts"].get("passed"):  # e.g. every test skipped: CUDA did not work there
        status = "failed"
        text += f"; no test passed (a skip's reason: {_md(summ['first_skip'])[:200] or '-'})"
    rec = {"name": name, "status": status, "exit": rc, "seconds": round(secs, 1), "limit_s": round(limit),
           "summary": "; ".join([text, *notes]), **summ, "command": " ".join(cmd + args),
           "env": group["env"], "log": f"{LOGS_TAR}: logs/{name.replace(':', '-')}.log"}
    runner.report.part(rec)
    runner.failed |= status != "ok"
    print(f"[{_clock()}] {name}: {status}: {rec['summary']}", flush=True)
    if group["env"].get("TGC_PACKAGE_SUITE") and status != "skipped":
        pkg = group["env"]["TGC_PACKAGE_SUITE"]
        if not os.path.exists(os.path.join(pkg, "index.jsonl")):
            runner.report.part({"name": "tests:packages-run", "status": "skipped",
                                "summary": "no package was written (see tests:packages)"})
            return
        out = runner.logs / "packages-run.json"
        cmd = [sys.executable, "-c", "import json, sys, package_suite; "
               f"json.dump(package_suite.check_all({pkg!r}), open({str(out)!r}, 'w'))"]
        status, rc, secs, limit = runner.run("tests:packages-run", cmd, group["packages_run_limit"], runner.env)
        doc = json.loads(out.read_text()) if out.exists() else {}
        if status == "ok" and doc.get("bad"):
            status = "failed"
        summary = (f"{doc.get('packages', 0)} packages run in a fresh process, {len(doc.get('bad', []))} differ"
                   if doc else _md(_tail(runner.logs / "tests-packages-run.log", 400)))
        runner.report.part({"name": "tests:packages-run", "status": status, "seconds": round(secs, 1),
                            "limit_s": round(limit), "summary": summary, "bad": doc.get("bad", [])[:30]})
        runner.failed |= status != "ok"
        print(f"[{_clock()}] tests:packages-run: {status}: {summary}", flush=True)


# --- bench

def run_bench_peer(runner: Runner, peer: str, mode: str, rows: list[str], part_limit: float) -> None:
    """One worker per peer; a row past its limit, or one that kills its worker, is recorded and the next runs."""
    name = f"bench:{peer}"
    part_end = time.monotonic() + runner.limit(name, part_limit)
    limit_now = ROW_LIMIT_S[mode]
    log = runner.logs / f"bench-{peer.replace('.', '-')}.log"
    results = runner.logs / f"bench-{peer.replace('.', '-')}.jsonl"
    results.unlink(missing_ok=True)
    st = time.monotonic()
    todo = list(rows)
    seen = 0
    done_rows: dict[str, str] = {}
    print(f"[{_clock()}] {name}: started ({len(todo)} rows, {part_end - st:.0f} s)", flush=True)
    while todo:
        if part_end - time.monotonic() < 1:
            for row in todo:
                runner.report.cell(row, peer, {"status": "skipped", "why": "no time left"})
                done_rows[row] = "skipped"
            break
        cmd = [sys.executable, str(TOOLS / "gpu_check.py"), "--worker", peer, "--mode", mode,
               "--rows", ",".join(todo), "--results", str(results)]
        proc = runner.spawn(cmd, log)
        current, started, worker_start = None, None, time.monotonic()
        unavailable = None
        while True:
            try:
                rc = proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                rc = None
            # whole lines only: the worker may be writing the last one
            lines = results.read_text(encoding="utf-8").split("\n")[:-1] if results.exists() else []
            for line in lines[seen:]:
                ev = json.loads(line)
                seen += 1
                if ev["event"] == "unavailable":
                    unavailable = ev["why"]
                elif ev["event"] == "start":
                    current, started = ev["row"], time.monotonic()
                    limit_now = row_limit(mode, part_end - started, len([r for r in todo if r not in done_rows]))
                    print(f"[{_clock()}] {name}: {current} (limit {limit_now:.0f} s)", flush=True)
                elif ev["event"] == "done":
                    doc = {k: v for k, v in ev.items() if k not in ("event", "row")}
                    runner.report.cell(ev["row"], peer, doc)
                    done_rows[ev["row"]] = doc["status"]
                    if doc["status"] == "failed":
                        print(f"[{_clock()}] {name}: {ev['row']} failed: {doc.get('why', '')[:300]}", flush=True)
                    current = None
            now = time.monotonic()
            over = None
            if rc is None and current is not None and now - started > limit_now:
                over = f"timed out after {limit_now:.0f} s"
            elif rc is None and current is None and now - worker_start > STARTUP_LIMIT_S and not done_rows:
                over = f"the worker did not start within {STARTUP_LIMIT_S:.0f} s"
            elif rc is None and now > part_end:
                over = "timed out: the part's time ran out"
            if over is not None:
                runner.kill(proc)
                rc = -9
            if rc is None:
                continue
            if unavailable is not None:
                for row in todo:
                    runner.report.cell(row, peer, {"status": "unavailable", "why": unavailable})
                    done_rows[row] = "unavailable"
                todo = []
                print(f"[{_clock()}] {name}: unavailable: {unavailable}", flush=True)
                break
            if current is not None:
                why = over or f"the worker died (exit {rc}): {_md(_tail(log, 600))}"
                runner.report.cell(current, peer, {"status": "timed out" if over else "crashed", "why": why})
                done_rows[current] = "timed out" if over else "crashed"
                print(f"[{_clock()}] {name}: {current}: {why[:300]}", flush=True)
            else:  # the worker ended (or was stopped) between rows: what it did not run fails with its reason
                why = over or (f"the worker failed (exit {rc}): {_md(_tail(log, 600))}" if rc else
                               "the worker ended without running it")
                for row in todo:
                    if row not in done_rows:
                        runner.report.cell(row, peer, {"status": "failed", "why": why})
                        done_rows[row] = "failed"
            todo = [r for r in todo if r not in done_rows]
            break
    statuses = list(done_rows.values())
    ok = sum(s == "ok" for s in statuses)
    bad = [s for s in statuses if s in ("failed", "crashed", "timed out")]
    status = "ok" if not bad else "failed"
    if statuses and all(s == "unavailable" for s in statuses):
        status = "unavailable"
    summary = f"{ok} of {len(rows)} rows ran" + (f"; {len(bad)} failed, crashed or timed out" if bad else "")
    if status == "unavailable":
        summary = next((runner.report.doc["bench"].get(r, {}).get(peer, {}).get("why") for r in rows), "")
    runner.report.part({"name": name, "status": status, "seconds": round(time.monotonic() - st, 1),
                        "limit_s": round(part_end - st), "summary": summary, "log": f"{LOGS_TAR}: logs/{log.name}"})
    if peer == "tgc":  # a peer missing or failing is the peer's business; tgc's rows are the check's
        runner.failed |= status != "ok"


# --- main

def _limits(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, _, secs = item.partition("=")
        try:
            out[name.strip()] = float(secs)
        except ValueError:
            raise SystemExit(f"gpu_check: bad --limit {item!r}: want PART=SECONDS, e.g. tests:language=120") from None
    return out


def _out_dir(arg: str | None) -> Path:
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    if arg:
        return Path(arg)
    return ROOT / "build" / "gpu-check" / _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a sample of the tests, no torch.compile (about 3 min)")
    ap.add_argument("--standin", action="store_true", help="no GPU: CUDA through the CPU stand-in driver (CI)")
    ap.add_argument("--out", help="where the results go ($OUT wins when set)")
    ap.add_argument("--budget", type=float, help="seconds for the whole check (default 450, --quick 170)")
    ap.add_argument("--limit", action="append", default=[], metavar="PART=S", help="a part's own time limit")
    ap.add_argument("--tests", help="test groups to run (comma list; 'none' for none)")
    ap.add_argument("--rows", help="bench rows to run (comma list; 'none' for none)")
    ap.add_argument("--peers", help="bench peers (comma list of tgc, torch, torch.compile, jax)")
    ap.add_argument("--jobs", type=int, help="pytest-xdist workers (default: the CPU count, at most 16)")
    # internal: one process of the check
    ap.add_argument("--worker", choices=PEERS, help=argparse.SUPPRESS)
    ap.add_argument("--peaks", choices=("tgc", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="full", help=argparse.SUPPRESS)
    ap.add_argument("--results", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.worker:
        worker(a.worker, a.mode, [r for r in a.rows.split(",") if r], a.results)
        return 0
    if a.peaks:
        doc = measure_peaks(a.mode) if a.peaks == "tgc" else torch_tensor_peaks(a.mode)
        Path(a.results).write_text(json.dumps(doc))
        return 0

    mode = "standin" if a.standin else "quick" if a.quick else "full"
    out = _out_dir(a.out)
    out.mkdir(parents=True, exist_ok=True)
    limits = _limits(a.limit)
    budget = a.budget or (QUICK_BUDGET_S if mode == "quick" else FULL_BUDGET_S)
    rows = ROW_NAMES if not a.rows else [] if a.rows == "none" else a.rows.split(",")
    peers = list(PEERS) if not a.peers else a.peers.split(",")
    for r in rows:
        if r not in ROW_NAMES:
            raise SystemExit(f"gpu_check: unknown bench row {r!r}; rows: {', '.join(ROW_NAMES)}")
    for p in peers:
        if p not in PEERS:
            raise SystemExit(f"gpu_check: unknown peer {p!r}; peers: {', '.join(PEERS)}")

    # the parts set their own test devices, package and sampling knobs: none leaks in from the caller's shell
    env = {k: v for k, v in os.environ.items()
           if k not in ("OUT", "TGC_DEVICE") and not k.startswith(("TGC_TEST_", "TGC_PACKAGE_", "TGC_GPU_CHECK_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(TOOLS),
                                         *filter(None, [os.environ.get("PYTHONPATH")])])
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env["PYTHONUNBUFFERED"] = "1"  # a part killed at its limit leaves its whole output in its log
    work = Path(tempfile.mkdtemp(prefix="tgc-gpu-check-"))  # logs, packages, a cold and private tgc cache
    env["TGC_CACHE_DIR"] = str(work / "tgc")
    if mode == "standin":
        # in this process too, tgc from this tree (the parts get it through PYTHONPATH above)
        sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
        try:
            import cuda_standin
            why = cuda_standin.why_unavailable()
        except ImportError as e:
            raise SystemExit(f"gpu_check --standin: {sys.executable} cannot import {e.name or e}: run it with a "
                             "Python that has tgc's dependencies (make gpu-check PY=.venv/bin/python "
                             "ARGS=--standin)") from None
        if why:
            raise SystemExit(f"gpu_check --standin: {why}")
        env = cuda_standin.env(env)
    sizes, amounts = {}, {}
    for r in rows:
        if r != "corpus":
            spec = row_spec(r, mode)
            sizes[r], amounts[r] = spec["size"], spec.get("flops") or spec.get("bytes")
        elif corpus_dir() is not None:
            n = len(glob.glob(str(corpus_dir() / "*.tg")))
            sizes[r] = ("1 model, small dims" if mode == "standin" else
                        f"bench/models ({n} programs) at `make bench` dims, up to {CORPUS_BUDGET_S[mode]:.0f} s")
    meta = {"mode": mode, "standin": mode == "standin", "started": _now(), "commit": _git_commit(),
            "python": sys.version.split()[0], "budget_s": budget, "out": str(out), "sizes": sizes,
            "amounts": amounts, "argv": sys.argv[1:]}
    meta["workdir"] = str(work)
    report = Report(out, meta, work / "logs")
    runner = Runner(report, env, budget, limits)
    print(f"gpu-check ({mode}): results in {out}; logs in {work / 'logs'}", flush=True)

    # environment
    env_info = environment()
    report.doc["environment"] = env_info
    missing = env_info["missing_required"]
    opt = [m for m in ("pytest", "xdist", "hypothesis", "torch", "jax") if not env_info["modules"][m]]
    report.part({"name": "environment", "status": "failed" if missing else "ok", "seconds": 0.0,
                 "summary": (f"missing: {', '.join(missing)}; " if missing else "") +
                            (f"optional, missing: {', '.join(opt)}" if opt else "every optional module is here")})
    runner.failed |= bool(missing)

    # devices
    devjson = runner.logs / "devices.json"
    # one process: the rows as JSON for this script, then the table `tgc devices` prints (into the part's log)
    status, rc, secs, limit = runner.run("devices", [sys.executable, "-c",
                                         "import json, sys; from tgc.api import devices; "
                                         f"json.dump(devices(info=True), open({str(devjson)!r}, 'w'), default=str); "
                                         "from tgc.cli.main import main; main(['devices'])"],
                                         60.0, {**env, "COLUMNS": "160"})
    rows_dev = json.loads(devjson.read_text()) if devjson.exists() else []
    cuda = next((r for r in rows_dev if r["device"] == "CUDA"), {})
    gpus = int((cuda.get("info") or {}).get("device_count") or 0)
    meta["gpu"] = (cuda.get("info") or {}).get("name")
    meta["gpus"] = gpus
    report.doc["devices"] = rows_dev
    print(_tail(runner.logs / "devices.log", 20000), flush=True)
    cuda_ok = bool(cuda.get("available"))
    report.part({"name": "devices", "status": status if cuda_ok or status != "ok" else "failed",
                 "seconds": round(secs, 1), "limit_s": round(limit),
                 "summary": (f"CUDA: {gpus} GPU{'s' if gpus != 1 else ''} ({meta['gpu']})" if cuda_ok else
                             f"CUDA not available: {cuda.get('why_not') or _md(_tail(runner.logs / 'devices.log'))}"
                             " (without a GPU, --standin runs the check through the CPU stand-in)")})
    runner.failed |= not cuda_ok

    # peaks
    if rows and cuda_ok:
        pk_out = runner.logs / "peaks.json"
        status, rc, secs, limit = runner.run("peaks", [sys.executable, str(TOOLS / "gpu_check.py"), "--peaks", "tgc",
                                                       "--mode", mode, "--results", str(pk_out)], 60.0)
        if status == "ok":
            report.doc["peaks"].update(json.loads(pk_out.read_text()))
            pk = report.doc["peaks"]
            summary = f"f32 FMA {pk['f32_tflops']:.4g} TFLOP/s, copy {pk['copy_tbps']:.4g} TB/s (through tgc)"
        else:
            summary = f"{status}: {_md(_tail(runner.logs / 'peaks.log', 600))}"
        report.part({"name": "peaks", "status": status, "seconds": round(secs, 1), "limit_s": round(limit),
                     "summary": summary})
        runner.failed |= status != "ok"
        print(f"[{_clock()}] peaks: {status}: {summary}", flush=True)
        if "torch" in peers and env_info["modules"].get("torch") and mode != "standin":
            tp = runner.logs / "peaks-torch.json"
            status, rc, secs, limit = runner.run("peaks:torch", [sys.executable, str(TOOLS / "gpu_check.py"),
                                                 "--peaks", "torch", "--mode", mode, "--results", str(tp)], 60.0)
            if status == "ok":
                doc = json.loads(tp.read_text())
                report.doc["peaks"].update({k: v for k, v in doc.items() if k != "how"}, torch_how=doc["how"])
            report.part({"name": "peaks:torch", "status": status, "seconds": round(secs, 1), "limit_s": round(limit),
                         "summary": report.doc["peaks"].get("torch_how") or _md(_tail(runner.logs /
                                                                                      "peaks-torch.log", 600))})

    # tests
    jobs = a.jobs or (1 if mode == "standin" else min(16, os.cpu_count() or 1))
    groups = test_groups(mode, gpus, work)
    if a.tests:
        wanted = [] if a.tests == "none" else a.tests.split(",")
        unknown = [g for g in wanted if g not in {x["name"] for x in groups}]
        if unknown:
            raise SystemExit(f"gpu_check: unknown test group {unknown[0]!r}; groups: "
                             f"{', '.join(x['name'] for x in groups)}")
        groups = [g for g in groups if g["name"] in wanted]
    runner.reserve = BENCH_RESERVE_S[mode] if rows and cuda_ok else 0.0
    for g in groups:
        if not cuda_ok:
            report.part({"name": f"tests:{g['name']}", "status": "skipped", "summary": "CUDA is not available"})
            continue
        run_tests(runner, g, env_info, jobs)

    # bench: what is left of the budget, shared by the peers still to run (by weight; time one leaves rolls over)
    runner.reserve = 0.0
    bench_peers = [p for p in BENCH_ORDER if p in peers]
    for peer in (p for p in PEERS if p not in peers):
        for r in rows:
            report.cell(r, peer, {"status": "skipped", "why": "not in --peers"})
    for i, peer in enumerate(bench_peers):
        if not rows:
            break
        if not cuda_ok:
            for r in rows:
                report.cell(r, peer, {"status": "skipped", "why": "CUDA is not available"})
            continue
        weights = PEER_WEIGHT[mode]
        share = max(runner.left(), 0) * (weights[peer] / sum(weights[p] for p in bench_peers[i:])
                                         if sum(weights[p] for p in bench_peers[i:]) > 0 else 1.0)
        run_bench_peer(runner, peer, mode, rows, share)

    report.doc["meta"]["finished"] = _now()
    report.doc["failed"] = runner.failed
    report.save()
    report.pack_logs()
    print("\n" + report.markdown(), flush=True)
    print(f"gpu-check ({mode}): {'FAILED' if runner.failed else 'ok'}; results in {out}", flush=True)
    return 1 if runner.failed else 0


if __name__ == "__main__":
    sys.exit(main())
