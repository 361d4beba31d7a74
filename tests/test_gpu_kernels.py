"""GPU kernels as the GPU builds them (issue 26, item 3): floating-point contraction only where tgc writes an fma,
in every C dialect. NVRTC's PTX is read here (no GPU needed); the values run on OpenCL (PoCL) and, for CUDA,
through the CPU stand-in driver (tests/test_cuda_standin.py's language subset holds the same softmax test).

Contraction: a product fused into an fma by the compiler is rounded once, while the same product elsewhere (in
the max reduction's kernel) is rounded twice, so `x * s - max(x * s)` at the largest element was the rounding
error (~1e3 at 3e10), not 0, and a softmax of large logits was nan. Only a sum reduction's multiply-accumulate
is an fma, written out (`fmaf`, `fma`), as on the CPU (tgc/backends/llvmir.py).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tgc
from tgc.backends import cuda, get_device

nvrtc_missing = cuda.nvrtc_error()
needs_nvrtc = pytest.mark.skipif(nvrtc_missing is not None, reason=f"NVRTC unavailable: {nvrtc_missing}")

LARGE_LOGITS = "x: f32[2, 1000]\nreturn exp(x * 3e9 - max(x * 3e9, axis=1, keepdim=True))"
MATMUL = "a: f32[N, K]\nb: f32[K, M]\nreturn a @ b"


def _f32_arithmetic(ptx: str) -> list[str]:
    """The PTX f32 add/sub/mul/fma instructions."""
    return [ln.split()[0] for ln in ptx.splitlines() if re.match(r"\s*(add|sub|mul|fma)\.[\w.]*f32\b", ln)]


@needs_nvrtc
def test_nvrtc_never_contracts_an_elementwise_product():
    """With NVRTC's default `--fmad=true` the PTX says `mul.f32` / `sub.f32`, which ptxas may fuse into an fma;
    `--fmad=false` makes every one `.rn` (never fused), and no fma appears."""
    (elementwise,) = [k for k in tgc.loads(LARGE_LOGITS).compile("CUDA") if k.name.startswith("E_")]
    ops = _f32_arithmetic(cuda.nvrtc_compiler("sm_90").compile_ptx(elementwise.src))
    assert "mul.rn.f32" in ops and "sub.rn.f32" in ops, ops
    assert all(".rn." in op and not op.startswith("fma") for op in ops), ops


@needs_nvrtc
def test_a_sum_reduction_accumulates_with_an_explicit_fma_on_cuda():
    (k,) = tgc.loads(MATMUL).compile("CUDA", dims={"N": 8, "K": 16, "M": 8})
    assert re.search(r"acc\d+ = fmaf\(v\d+, v\d+, acc\d+\);", k.src), k.src
    ops = _f32_arithmetic(cuda.nvrtc_compiler("sm_90").compile_ptx(k.src))
    assert "fma.rn.f32" in ops and "mul.rn.f32" not in ops, ops  # the product is in the fma, not apart


def test_only_a_sum_of_products_becomes_an_fma():
    """A product used elsewhere too, or summed into a max, stays a product; f64 uses fma, not fmaf."""
    src = tgc.loads("a: f32[8, 16]\nb: f32[8, 16]\nreturn (a * b).max(axis=1), (a * b).sum(axis=1), a * b").compile(
        "CUDA")
    (max_kernel,) = [k for k in src if re.search(r"\|\| \((acc\d+)\) != \(\1\)\) \?", k.src)]  # the nan-keeping max
    assert "fmaf(" not in max_kernel.src, max_kernel.src
    (k,) = tgc.loads("a: f64[8, 16]\nb: f64[16, 4]\nreturn a @ b").compile("CUDA")
    assert re.search(r"= fma\(v\d+, v\d+, acc\d+\);", k.src), k.src
    (k,) = tgc.loads(MATMUL).compile("OPENCL", dims={"N": 8, "K": 16, "M": 8})
    assert re.search(r"= fma\(v\d+, v\d+, acc\d+\);", k.src) and "#pragma OPENCL FP_CONTRACT OFF" in k.src, k.src


def test_opencl_kernels_turn_contraction_off():
    """OpenCL C contracts by default (FP_CONTRACT ON); every rendered kernel turns it off."""
    for k in tgc.loads(LARGE_LOGITS).compile("OPENCL"):
        assert k.src.splitlines()[0] == "#pragma OPENCL FP_CONTRACT OFF", k.src[:200]


def test_softmax_of_large_logits_and_a_matmul_on_opencl():
    ok, why = get_device("OPENCL").available
    if not ok:
        pytest.skip(why)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 1000)) * 10).astype(np.float32)
    got = tgc.loads(LARGE_LOGITS).run("OPENCL", x=x)["out0"]
    t = x * np.float32(3e9)
    np.testing.assert_allclose(got, np.exp((t - t.max(axis=1, keepdims=True)).astype(np.float64)), rtol=1e-5)
    assert (got == 1).sum() == 2  # each row's largest element: exp(0), exactly
    a, b = rng.standard_normal((24, 40)).astype(np.float32), rng.standard_normal((40, 8)).astype(np.float32)
    got = tgc.loads(MATMUL).run("OPENCL", a=a, b=b)["out0"]
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- built for the GPU at hand

def test_f32_lanes_per_sm_count_64_lane_gpus_once():
    """The clock-based peak (`tgc devices`): P100 (6.0), V100 (7.0), T4 (7.5) and A100 (8.0) have 64 FP32 lanes
    an SM; a flat 128 counted them twice. Kepler has 192, Maxwell, GP10x, GA10x, Ada and Hopper 128."""
    lanes = {cc: cuda.f32_lanes_per_sm(cc) for cc in [(3, 5), (5, 2), (6, 0), (6, 1), (7, 0), (7, 5), (8, 0),
                                                      (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]}
    assert lanes == {(3, 5): 192, (5, 2): 128, (6, 0): 64, (6, 1): 128, (7, 0): 64, (7, 5): 64, (8, 0): 64,
                     (8, 6): 128, (8, 9): 128, (9, 0): 128, (10, 0): 128, (12, 0): 128}


GROUP_OVER_48K = '''
import ctypes, json, re
import numpy as np
import tgc
import tgc.codegen.search as S
from tgc.backends import get_device
from tgc.codegen.opt import Opt
dev = get_device("CUDA")
res = {"arch": dev.arch, "caps": dev.caps.max_shared_bytes, "peak": dev.info().get("peak_gflops")}
x = np.random.default_rng(0).standard_normal((32, 2560)).astype(np.float32)
# as if BEAM had chosen them: 640 threads a row group, 32 rows each, a partial a thread and row in shared memory
# (640 is no power of two: neither shuffles nor a tree, every thread adds up the partials after one barrier)
S.lookup = lambda ast, device, width=0: [Opt("GROUP", 1, 640), Opt("UPCAST", 0, 32)]
p = tgc.loads("x: f32[M, N]\\nreturn x.sum(axis=1)")
(kern,) = p.compile("CUDA", dims={"M": 32, "N": 2560})
m = re.search(r"__constant__ unsigned int tgc_dynamic_shared_\\w+ = (\\d+)u;", kern.src)
res["dynamic"] = int(m.group(1)) if m else 0
res["bounds"] = re.findall(r"__launch_bounds__\\((\\d+)\\)", kern.src)
res["err"] = float(np.abs(p.run("CUDA", x=x)["out0"] - x.astype(np.float64).sum(1)).max())
res["set"] = ctypes.CDLL("libcuda.so.1").tgc_standin_dynamic_shared_set()
# the same cubin without the attribute raised: the launch is refused, as on a GPU
from tgc.backends import cuda
from tgc.errors import DeviceError
drv = cuda._driver()
drv.cuFuncSetAttribute = lambda *args: (drv.CUresult.CUDA_SUCCESS,)
prog = dev.program(kern.name, kern.binary)
out, inp = dev.allocator.alloc(128), dev.allocator.alloc(x.nbytes)
try:
    prog(out, inp, global_size=(1, 1, 1), local_size=(640, 1, 1), wait=True)
    res["unraised"] = "ran"
except DeviceError as e:
    res["unraised"] = e.msg
print(json.dumps(res))
'''


def test_shared_memory_past_48k_is_dynamic_and_raised_through_the_driver():
    """A GPU of compute capability 8.6 that opts in to 100000 bytes of shared memory a block, through the
    stand-in (whose launch fails, as a GPU's does, when a kernel asks for more than 48 KiB of dynamic shared memory
    without cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)): kernels are built for sm_86 with launch bounds, a
    GROUP reduction's 80 KiB of partials are dynamic shared memory, and its sums match numpy."""
    import cuda_standin
    if cuda_standin.why_unavailable():
        pytest.skip(cuda_standin.why_unavailable())
    from test_cuda_standin import script_json
    res = script_json(GROUP_OVER_48K, TGC_STANDIN_SHARED_OPTIN_BYTES="100000", TGC_STANDIN_CC="8.6")
    assert res["arch"] == "sm_86" and res["caps"] == 100000
    assert res["peak"] == 2 * 128 * 2 * 1.0  # GFLOP/s: 2 SMs of 128 lanes, an FMA each, at 1 GHz (the stand-in)
    assert res["dynamic"] == 640 * 32 * 4 and res["set"] == res["dynamic"], res
    assert res["bounds"] == ["640"] and res["err"] < 1e-3, res
    assert "CUDA_ERROR_INVALID_VALUE" in res["unraised"], res
