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
    (max_kernel,) = [k for k in src if "fmaxf(" in k.src]
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
