"""CUDA end to end without a GPU: the real cuda-bindings layer over a CPU stand-in for libcuda.so.1
(tests/cuda_standin.py, tests/standin/). Each test runs a subprocess whose LD_LIBRARY_PATH starts with the
stand-in's directory; the kernels are NVRTC cubins for the driver calls and host builds of the same CUDA C
for the launches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cuda_standin
import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(cuda_standin.why_unavailable() is not None,
                                reason=str(cuda_standin.why_unavailable()))

# A representative part of the language suite (the whole suite takes minutes through the stand-in): every
# dtype family, division semantics, half and bf16 conversions, special floats, reductions (grouped on GPUs),
# argmax, softmax, convolution, layernorm, indexing, gathers and empty reductions.
LANGUAGE_SUBSET = [
    "tests/test_lang_ops.py::test_floor_division_and_modulo_of_negative_ints",
    "tests/test_lang_ops.py::test_unsigned_division_by_zero_gives_zero",
    "tests/test_lang_ops.py::test_float_arithmetic",
    "tests/test_lang_types.py::test_cast_to_bf16_rounds_to_nearest_even",
    "tests/test_lang_types.py::test_bitcast_bf16",
    "tests/test_lang_types.py::test_out_of_range_float_to_int_cast_does_not_crash",
    "tests/test_lang_functions.py::test_special_float_values",
    "tests/test_lang_functions.py::test_softmax_and_log_softmax",
    "tests/test_lang_functions.py::test_argmax_argmin_first_index_of_ties[CUDA-f16]",
    "tests/test_lang_functions.py::test_argmax_argmin_first_index_of_ties[CUDA-u64]",
    "tests/test_lang_functions.py::test_reductions_of_f64_and_half_types",
    "tests/test_lang_nn.py::test_conv2d",
    "tests/test_lang_nn.py::test_layernorm",
    "tests/test_lang_shapes.py::test_basic_indexing_matches_numpy",
    "tests/test_lang_programs.py::test_zero_size_reductions",
    "tests/test_lang_more_ops.py::test_gather_forms_every_dtype[CUDA-f32]",  # data-dependent loads (GATHER)
    # no contraction but the accumulate's own fmaf (the host build: -ffp-contract=off, like NVRTC's --fmad=false)
    "tests/test_lang_numpy_semantics.py::test_softmax_of_large_logits_keeps_its_largest_element",
]


def _env(**extra: str) -> dict[str, str]:
    env = cuda_standin.env(**extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    return env


def run_script(code: str, **extra: str) -> subprocess.CompletedProcess:
    """Run Python code in a subprocess on the stand-in (its NVRTC compiles also build the host copies)."""
    prelude = "import cuda_standin; cuda_standin.install()\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], env=_env(**extra), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def script_json(code: str, **extra: str):
    r = run_script(code, **extra)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_language_subset_runs_on_cuda_through_the_stand_in(tmp_path):
    env = _env(TGC_TEST_DEVICES="CUDA")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                        "-x", *LANGUAGE_SUBSET], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout, r.stdout[-2000:]


# GROUP, LOCAL and UPCAST combinations, each checked against numpy
OPT_CASES = '''
import json
import numpy as np
import tgc
import tgc.codegen.search as S
from tgc.codegen.opt import Opt

orig = S.lookup
rng = np.random.default_rng(0)
results = []

def check(src, opts, want, **inputs):
    S.lookup = lambda ast, device, width=0: cur  # as if BEAM had stored these opts
    cur = [Opt(*o) for o in opts]
    try:
        got = next(iter(tgc.loads(src).run(device="CUDA", **inputs).values()))
    finally:
        S.lookup = orig
    ok = np.isclose(got, want, rtol=1e-4, atol=1e-3)
    results.append([src.splitlines()[-1], opts, int(ok.sum()), int(ok.size)])

x = rng.standard_normal((16, 4096)).astype(np.float32)
check("x: f32[M, N]\\nreturn x.sum(axis=1)", [("GROUP", 1, 256), ("UPCAST", 0, 4)], x.sum(1), x=x)
check("x: f32[M, N]\\nreturn x.sum(axis=1)", [("GROUP", 1, 64), ("UPCAST", 0, 2), ("UPCAST", 0, 4)], x.sum(1), x=x)
check("x: f32[M, N]\\nreturn x.sum(axis=1)", [("GROUP", 1, 32), ("LOCAL", 0, 4), ("UPCAST", 0, 2)], x.sum(1), x=x)
d = rng.standard_normal((8, 1024))
check("x: f64[M, N]\\nreturn x.max(axis=1)", [("UPCAST", 0, 8), ("GROUP", 1, 128)], d.max(1), x=d)
a = rng.standard_normal((32, 64)).astype(np.float32)
b = rng.standard_normal((64, 48)).astype(np.float32)
mm = "a: f32[N, K]\\nb: f32[K, M]\\nreturn a @ b"
check(mm, [("LOCAL", 1, 16), ("UPCAST", 0, 4)], a @ b, a=a, b=b)
check(mm, [("LOCAL", 0, 8), ("LOCAL", 1, 4), ("UPCAST", 1, 4)], a @ b, a=a, b=b)
check(mm, [("GROUP", 2, 16), ("UPCAST", 1, 4), ("LOCAL", 0, 2)], a @ b, a=a, b=b)
check(mm, [("GROUP", 2, 8), ("UNROLL", 2, 4), ("UPCAST", 0, 2), ("UPCAST", 1, 3)], a @ b, a=a, b=b)
s = rng.standard_normal((4, 512)).astype(np.float32)
e = np.exp(s - s.max(1, keepdims=True))
check("x: f32[M, N]\\nreturn softmax(x, 1)", [], e / e.sum(1, keepdims=True), x=s)
p = rng.standard_normal(65537).astype(np.float32)  # a prime: a rounded-up grid, its extra threads gated off
check("x: f32[N]\\nreturn x * 2.0", [], p * 2, x=p)
r = rng.standard_normal((257, 33)).astype(np.float32)
check("x: f32[M, N]\\nreturn x.sum(axis=1)", [], r.sum(1), x=r)
print(json.dumps(results))
'''


def test_group_local_upcast_combinations_match_numpy():
    results = script_json(OPT_CASES)
    wrong = [r for r in results if r[2] != r[3]]
    assert not wrong, f"[expression, opts, right, outputs]: {wrong}"
    assert len(results) == 11


# ---------------------------------------------------------------- symbolic sizes (tgc/codegen/sizes.py)

SYMBOLIC = '''
import dataclasses, json
import numpy as np
import tgc
import tgc.codegen.search as S
from tgc.baselines.numpy_eval import numpy_program
from tgc.codegen import sizes
from tgc.codegen.opt import Opt
from tgc.engine.inputs import random_inputs

def err(prog, got, dims, inputs):
    want = numpy_program(prog, dims)(inputs)
    return max(float(np.max(np.abs(np.asarray(got[n]) - np.asarray(want[n])), initial=0)) for n in prog.output_names)

def plan_of(prog, dims):
    return prog._plans[("CUDA", sizes.size_class(prog.dim_names, dims))]

out = {"runs": [], "classes": {}}
# odd sizes, a size of 1, and sizes whose grid ends in a partial work-group (300 rows, 33 * 65 outputs)
for path, table in (("kernels/softmax.tg", [{"N": 3, "D": 5}, {"N": 1, "D": 7}, {"N": 300, "D": 33}]),
                    ("kernels/matmul.tg", [{"M": 3, "K": 5, "N": 7}, {"M": 1, "K": 3, "N": 1},
                                           {"M": 33, "K": 9, "N": 65}])):
    prog = tgc.load(path)
    for dims in table:
        inputs = random_inputs(prog, dims, seed=1)
        got = prog.run(device="CUDA", symbolic=True, **inputs)
        plan = plan_of(prog, dims)
        out["runs"].append([path, dims, prog.last_run, err(prog, got, dims, inputs),
                            [list(k.global_size) for k in plan.bind(prog, dims)[0].kernels]])
    out["classes"][path] = len([p for p in prog._plans.values() if not isinstance(p, str)])

# the heuristic's GROUP reduction as a fast variant: launched where 256 divides the row, else the general kernel
prog = tgc.loads("x: f32[R, N]\\nreturn x.sum(axis=1), x.max(axis=1)")
for r, n in ((2, 1536), (3, 96)):
    x = np.random.default_rng(n).standard_normal((r, n)).astype(np.float32)
    got = prog.run(device="CUDA", symbolic=True, x=x)
    plan = plan_of(prog, {"R": r, "N": n})
    out["runs"].append(["group", [r, n], prog.last_run, max(float(np.abs(got["out0"] - x.sum(1)).max()),
                        float(np.abs(got["out1"] - x.max(1)).max())), plan.chosen])

# LOCAL and UPCAST (as a BEAM winner for the class would give them) on symbolic output axes
import tgc.api as A
orig = S.lookup
S.lookup = A.lookup = lambda ast, device, width=0: [Opt("LOCAL", 0, 8), Opt("UPCAST", 1, 4)]
try:
    prog = tgc.loads("x: f32[N, D]\\nreturn x * 2.0 + 1.0")
    prog.compile_symbolic("CUDA", (("N", "32n"), ("D", "32n")))
finally:
    S.lookup = A.lookup = orig
for n, d in ((64, 96), (40, 36)):  # 40 = 8 * 5 and 36 = 4 * 9, but not multiples of 32: another class
    x = np.random.default_rng(n).standard_normal((n, d)).astype(np.float32)
    got = prog.run(device="CUDA", symbolic=True, x=x)["out0"]
    plan = plan_of(prog, {"N": n, "D": d})
    out["runs"].append(["local", [n, d], prog.last_run, float(np.abs(got - (x * 2 + 1)).max()), plan.chosen])

# a loop end of N - 2: no output at N = 2 (a grid of 0 work-groups is not launched), 257 outputs at N = 259
prog = tgc.loads("x: f32[N]\\nreturn x[2:] * 2.0")
for n in (2, 259):
    x = np.arange(n, dtype=np.float32)
    got = prog.run(device="CUDA", symbolic=True, x=x)["out0"]
    low, _ = plan_of(prog, {"N": n}).bind(prog, {"N": n})
    out["runs"].append(["tail", [n], prog.last_run, float(np.abs(got - x[2:] * 2).max(initial=0)) + 9 * (
        got.shape != x[2:].shape), [list(k.global_size) for k in low.kernels]])

# more work-groups than the device launches: the plan refuses these sizes (the caller runs specialized kernels)
prog = tgc.load("kernels/softmax.tg")
plan = prog.compile_symbolic("CUDA")
dev = plan.device
real = dev.caps
type(dev).caps = property(lambda self: dataclasses.replace(real, max_grid=3))
low, why = plan.bind(prog, {"N": 300, "D": 7})
out["too_many_groups"] = [low is None, why]
print(json.dumps(out))
'''


def test_symbolic_kernels_run_on_cuda_at_every_size():
    """Kernels compiled once without sizes (int arguments, the grid computed at launch from the dims) give
    numpy's results at odd sizes, sizes of 1 and sizes that end in a partial work-group."""
    res = script_json(SYMBOLIC)
    runs = res["runs"]
    bad = [r for r in runs if r[2] != "symbolic" or r[3] > 1e-4]
    assert not bad, bad
    assert res["classes"] == {"kernels/softmax.tg": 2, "kernels/matmul.tg": 2}  # dims >= 2 share one plan
    softmax_300 = runs[2]
    assert softmax_300[4] == [[2, 1, 1], [2, 1, 1], [39, 1, 1]]  # 300 rows, 9900 elements, by 256
    assert [r[4] for r in runs if r[0] == "group"] == [["fast", "fast"], ["general", "general"]]
    assert [r[4] for r in runs if r[0] == "local"] == [["fast"], ["general"]]
    assert [r[4] for r in runs if r[0] == "tail"] == [[], [[2, 1, 1]]]
    assert res["too_many_groups"][0] and "more than the device's 3" in res["too_many_groups"][1]


# ---------------------------------------------------------------- the runtime's error paths on the stand-in

FAULT = '''
import ctypes, json, os
import numpy as np
import tgc
from tgc.backends import get_device
from tgc.errors import DeviceError

def stats():
    out = (ctypes.c_long * 4)()
    ctypes.CDLL("libcuda.so.1").tgc_standin_stats(out)
    return list(out)

dev = get_device("CUDA")
x = np.arange(1000, dtype=np.float32)
bad = tgc.loads("x: f32[N]\\nreturn x * 2.0")
good = tgc.loads("x: f32[N]\\nreturn x + 1.0")
name = bad.compile(device="CUDA", dims={"N": 1000})[0].name
old = dev.allocator.alloc(64)  # a buffer of the context that the fault will reset
os.environ["TGC_STANDIN_FAULT"] = name
res = {"kernel": name}
try:
    bad.run(device="CUDA", x=x)
except DeviceError as e:
    res["fault"] = e.msg
os.environ.pop("TGC_STANDIN_FAULT")
try:
    dev.allocator.copyout(memoryview(bytearray(64)), old)
except DeviceError as e:
    res["stale"] = e.msg
res["after"] = float(next(iter(good.run(device="CUDA", x=x).values()))[-1])
res["again"] = float(next(iter(bad.run(device="CUDA", x=x).values()))[-1])  # its module is loaded again
res["stats"] = stats()
print(json.dumps(res))
'''


def test_a_faulting_kernel_is_named_and_the_context_recovers():
    res = script_json(FAULT)
    assert f"kernel '{res['kernel']}'" in res["fault"] and "CUDA_ERROR_ILLEGAL_ADDRESS" in res["fault"]
    assert "context was reset" in res["fault"]
    assert "buffer is gone" in res["stale"]
    assert res["after"] == 1000.0 and res["again"] == 1998.0
    assert res["stats"][3] == 1  # one cuDevicePrimaryCtxReset


def test_an_old_driver_is_reported_with_the_version_it_needs():
    code = '''
    import json, numpy as np, tgc
    from tgc.backends.cuda import CUDADevice
    from tgc.errors import DeviceError
    ok, why = CUDADevice.probe()
    try:
        tgc.loads("x: f32[N]\\nreturn x * 2.0").run(device="CUDA", x=np.ones(4, np.float32))
        err = None
    except DeviceError as e:
        err = e.msg
    print(json.dumps([ok, why, err]))
    '''
    ok, why, err = script_json(code, TGC_STANDIN_DRIVER_VERSION="12040")
    assert ok is False
    assert "CUDA 12.4" in why and "R580" in why
    assert err is not None and "CUDA 12.4" in err


def test_modules_are_unloaded_with_the_context_current_and_events_are_per_thread():
    code = '''
    import ctypes, gc, json, threading
    from tgc.backends import get_device
    dev = get_device("CUDA")
    src = 'extern "C" __global__ void k(float* a) { a[threadIdx.x] = 1.0f; }'
    prog = dev.program("k", dev.compiler.compile(src))
    main_events = dev.events()
    other = []
    def work():
        global prog
        other.append(dev.events())
        del prog  # unloaded on a thread that never made the context current
        gc.collect()
    t = threading.Thread(target=work)
    t.start(); t.join()
    out = (ctypes.c_long * 4)()
    ctypes.CDLL("libcuda.so.1").tgc_standin_stats(out)
    print(json.dumps({"stats": list(out), "same_events": other[0] == main_events}))
    '''
    res = script_json(code)
    assert res["stats"][0] == 0 and res["stats"][1] == 0  # no module left, none unloaded without a context
    assert res["same_events"] is False


def test_beam_on_cuda_launches_every_candidate_and_keeps_results():
    code = '''
    import json, numpy as np, tgc
    p = tgc.loads("x: f32[M, N]\\nreturn x.sum(axis=1)")
    res = p.beam(device="CUDA", dims={"M": 16, "N": 1024}, width=2)
    x = np.random.default_rng(0).standard_normal((16, 1024)).astype(np.float32)
    err = float(np.abs(next(iter(p.run(device="CUDA", x=x).values())) - x.sum(1)).max())
    print(json.dumps([res["kernels"][0]["tried"], res["kernels"][0]["failed"], res["kernels"][0]["rejected"], err]))
    '''
    tried, failed, rejected, err = script_json(code)
    assert tried > 1 and failed == 0 and rejected == 0
    assert err < 1e-3


# ---------------------------------------------------------------- launch plans as CUDA graphs

GRAPHS = '''
import ctypes, json, os
import numpy as np
import tgc
from tgc.errors import DeviceError

lib = ctypes.CDLL("libcuda.so.1")
lib.tgc_standin_graph_launches.restype = ctypes.c_long

def counts():
    out = (ctypes.c_long * 4)()
    lib.tgc_standin_stats(out)
    return {"launches": out[2], "graphs": lib.tgc_standin_graph_launches()}

def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)

rng = np.random.default_rng(3)
res = {"ok": []}
prog = tgc.load("kernels/small_kernels.tg")
sm = tgc.loads("x: f32[N, D]\\nreturn softmax(x, 1), x.sum(0)")
for i in range(3):  # the 2nd and 3rd run are one graph launch each, with new input values each time
    x = rng.standard_normal((16, 64)).astype(np.float32)
    before = counts()
    got = next(iter(prog.run(device="CUDA", x=x).values()))
    y = x
    for _ in range(19):
        y = (y - y.mean(axis=0)) * 1.001
    after = counts()
    res["ok"].append(bool(np.allclose(got, y, rtol=1e-4, atol=1e-4)))
    res.setdefault("per_run", []).append({k: after[k] - before[k] for k in after})
    x = rng.standard_normal((5, 37)).astype(np.float32)
    out = sm.run(device="CUDA", x=x)
    res["ok"].append(bool(np.allclose(out["out0"], softmax(x), rtol=1e-4, atol=1e-6)
                          and np.allclose(out["out1"], x.sum(0), rtol=1e-4, atol=1e-5)))
name = prog.compile(device="CUDA", dims={"R": 16, "N": 64})[5].name
os.environ["TGC_STANDIN_FAULT"] = name
try:
    prog.run(device="CUDA", x=rng.standard_normal((16, 64)).astype(np.float32))
except DeviceError as e:
    res["fault"] = e.msg
os.environ.pop("TGC_STANDIN_FAULT")
x = rng.standard_normal((16, 64)).astype(np.float32)
for _ in range(2):  # a fresh plan (and graph) after the context reset
    got = next(iter(prog.run(device="CUDA", x=x).values()))
y = x
for _ in range(19):
    y = (y - y.mean(axis=0)) * 1.001
res["after_fault"] = bool(np.allclose(got, y, rtol=1e-4, atol=1e-4))
print(json.dumps(res))
'''


def test_a_plan_run_again_is_one_cuda_graph_launch():
    res = script_json(GRAPHS)
    assert all(res["ok"]), res["ok"]
    assert res["per_run"][0] == {"launches": 20, "graphs": 0}  # the first run: kernel by kernel
    assert res["per_run"][1] == {"launches": 20, "graphs": 1}  # then: one graph launch running the 20 kernels
    assert res["per_run"][2] == {"launches": 20, "graphs": 1}
    # the stand-in reports the fault from the launch of the graph holding the faulting kernel
    assert "reported by cuGraphLaunch(graph of 20 kernels (r_64_16, ..., E_16_64))" in res["fault"], res["fault"]
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in res["fault"] and "context was reset" in res["fault"]
    assert res["after_fault"]


def test_debug_2_names_the_cuda_graph():
    r = run_script('''
    import numpy as np, tgc
    p = tgc.loads("x: f32[N]\\nreturn (x * 2.0).sum(), x + 1.0")
    for _ in range(2):
        p.run(device="CUDA", x=np.ones(100, np.float32))
    ''', DEBUG="2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "CUDA     graph of 2 kernels" in r.stderr and "ran in one launch" in r.stderr, r.stderr[-3000:]


# ---------------------------------------------------------------- hardened memory; GPU defects (issue 26)

HARDENED = '''
import json
import numpy as np
import tgc
from tgc.backends import get_device
from tgc.dtype import dtypes
from tgc.ir.uop import Ops, UOp

dev = get_device("CUDA")
res = {}
h = dev.allocator.alloc(12)  # fresh memory: 0xFF bytes, never zeros
view = bytearray(12)
dev.allocator.copyout(memoryview(view), h)
res["fresh"] = view.hex()

def read_at(i):
    """out[0] = inp[i], inp of 3 floats"""
    out, inp = UOp(Ops.DEFINE_GLOBAL, dtypes.f32.as_ptr(), (), 0), UOp(Ops.DEFINE_GLOBAL, dtypes.f32.as_ptr(), (), 1)
    ld = UOp(Ops.LOAD, dtypes.f32, (inp, UOp.const(dtypes.i32, i)))
    uops = [out, inp, ld, UOp(Ops.STORE, None, (out, UOp.const(dtypes.i32, 0), ld))]
    name = f"read_{i}"
    return dev.program(name, dev.compiler.compile(dev.renderer.render(name, uops)))

inp, out = dev.allocator.alloc(12), dev.allocator.alloc(4)
dev.allocator.copyin(inp, memoryview(np.array([1, 2, 3], np.float32).tobytes()))
read_at(2)(out, inp, wait=True)
got = bytearray(4)
dev.allocator.copyout(memoryview(got), out)
res["last"] = float(np.frombuffer(got, np.float32)[0])
print(json.dumps(res), flush=True)
read_at(3)(out, inp, wait=True)  # one past the end: the guard page
print("not reached", flush=True)
'''


def test_stand_in_memory_is_0xff_filled_and_guarded():
    """Fresh device memory reads 0xFF, and a kernel reading one element past its buffer faults (named)."""
    r = run_script(HARDENED)
    lines = r.stdout.strip().splitlines()
    res = json.loads(lines[0])
    assert res == {"fresh": "ff" * 12, "last": 3.0}
    assert r.returncode != 0 and "not reached" not in r.stdout
    assert "kernel 'read_3' faulted" in r.stderr, r.stderr[-3000:]


GPU_DEFECTS = '''
import json
import numpy as np
import tgc
from tgc.backends import get_device
from tgc.errors import CompileError

dev = get_device("CUDA")
res = {"queried": dev.max_shared_bytes, "caps": dev.caps.max_shared_bytes}
rng = np.random.default_rng(0)
# a grid of 2 x 256 threads for 375 outputs, the variance written over the mean (an in-place pair)
p = tgc.loads("x: f32[15, 25, 35]\\nreturn x.var(axis=2)")
x = rng.standard_normal((15, 25, 35)).astype(np.float32)
res["var"] = float(np.abs(p.run("CUDA", x=x)["out0"] - x.astype(np.float64).var(axis=2)).max())
res["inplace"] = len(p.lower("CUDA").memory_plan().inplace)
# the symbolic argmax's probabilities (the grid an expression of N), 33 rows
p = tgc.load("kernels/argmax.tg")
x = rng.standard_normal((33, 1000)).astype(np.float32)
out = p.run("CUDA", symbolic=True, logits=x)
e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
res["argmax"] = [p.last_run, float(np.abs(out[p.output_names[1]] - (e / e.sum(1, keepdims=True)).max(1)).max())]
# a negative constant's power (rendered (--5.5f) before: NVRTC refused it)
x = np.arange(-3, 5, dtype=np.float32)
p = tgc.loads("x: f32[N]\\nreturn (-5.5) ** x")
try:
    res["pow"] = float(np.max(np.abs(p.run("CUDA", x=x)["out0"] / (-5.5) ** x.astype(np.float64) - 1)))
except CompileError as e:  # each defect reports on its own
    res["pow"] = e.msg
# fused attention at a head dim of 1024, within the queried shared memory
p = tgc.loads("q: f32[T, D]\\nk: f32[T, D]\\nv: f32[T, E]\\nreturn softmax(q @ k.transpose(-2, -1) * 0.05, -1) @ v")
dims = {"T": 20, "D": 1024, "E": 64}
q, k = (rng.standard_normal((20, 1024)).astype(np.float32) for _ in range(2))
v = rng.standard_normal((20, 64)).astype(np.float32)
s = q.astype(np.float64) @ k.T.astype(np.float64) * 0.05
e = np.exp(s - s.max(-1, keepdims=True))
try:
    (kern,) = p.compile("CUDA", dims=dims)
except CompileError as e:
    print(json.dumps({**res, "attn": e.msg}))
    raise SystemExit
import re
shared = sum(4 * int(n) for n in re.findall(r"__shared__ float \\w+\\[(\\d+)\\]", kern.src))
err = float(np.abs(p.run("CUDA", dims=dims, q=q, k=k, v=v)["out0"] - e / e.sum(-1, keepdims=True) @ v).max())
res["attn"] = [kern.name, kern.src.count("__shared__"), shared, err]
print(json.dumps(res))
'''


def test_gpu_defects_fixed_through_the_hardened_stand_in():
    """The three defects of issue 26 on CUDA (the stand-in reports less shared memory than CUDA C declares, so
    the queried limit is the one that holds): the last element of a rounded-up grid with an in-place pair, the
    symbolic argmax, a negative constant's power, and fused attention at a head dim of 1024."""
    res = script_json(GPU_DEFECTS, TGC_STANDIN_SHARED_BYTES="20000")
    assert res["var"] < 1e-5 and res["inplace"] >= 1
    assert res["argmax"][0] == "symbolic" and res["argmax"][1] < 1e-6
    assert isinstance(res["pow"], float) and res["pow"] < 1e-5, res["pow"]
    assert isinstance(res["attn"], list), res["attn"]
    name, shared_arrays, shared, err = res["attn"]
    assert name.startswith("attn_") and shared_arrays == 2 and 0 < shared <= 20000 and err < 1e-4
    assert res["queried"] == 20000 and res["caps"] == 20000
