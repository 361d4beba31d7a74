"""f16/bf16 matmuls on tensor cores (issue 26 item 3): the TC opt renders `mma.sync.aligned.m16n8k16.row.col.f32`
with an f32 accumulate on CUDA sm_80+; NVRTC compiles it here for real, and the CPU stand-in's kernel.h emulates
the instruction per warp (the fragments by the PTX ISA's layout), so the values are checked against numpy here.
"""

from __future__ import annotations

import cuda_standin
import pytest

import tgc
import tgc.codegen.search as search
from tgc.backends import cuda, get_device
from tgc.codegen.opt import Opt, OptError, OptKernel, OptOps
from tgc.codegen.pipeline import lower, prepare

nvrtc_missing = cuda.nvrtc_error()


def _mm(dtype: str) -> str:
    return f"a: {dtype}[N, K]\nb: {dtype}[K, M]\nreturn a @ b"


def _lower(src: str, device: str, dims: dict):
    """The program's one kernel lowered and rendered for `device` by the heuristic (not compiled)."""
    (item,) = [s for s in tgc.loads(src).schedule(dims, device=device) if hasattr(s, "ast")]
    return lower(item.ast, get_device(device), item.bufs, item.name or "k")


def _kernel(src: str, dims: dict, device: str) -> OptKernel:
    (item,) = [s for s in tgc.loads(src).schedule(dims, device=device) if hasattr(s, "ast")]
    dev = get_device(device)
    return OptKernel(prepare(item.ast, dev), dev)


def test_f16_and_bf16_matmuls_take_tensor_cores_on_cuda_only():
    for dtype in ("f16", "bf16"):
        k = _lower(_mm(dtype), "CUDA", {"N": 64, "K": 64, "M": 64})
        assert [str(o) for o in k.applied] == ["TC(0, 0)", "UPCAST(1, 4)"], k.applied
        assert f"tgc_mma_{dtype}(" in k.src and "mma.sync.aligned.m16n8k16.row.col.f32" in k.src
        assert tuple(k.launch["local_size"]) == (32, 1, 1)  # a warp a work-group
    k = _lower(_mm("f16"), "OPENCL", {"N": 64, "K": 64, "M": 64})
    assert "TC(0, 0)" not in [str(o) for o in k.applied]
    k = _lower(_mm("f32"), "CUDA", {"N": 64, "K": 64, "M": 64})
    assert "TC(0, 0)" not in [str(o) for o in k.applied]


def test_tensor_cores_need_sm_80(monkeypatch):
    dev = get_device("CUDA")
    assert dev.caps.tensor_cores == (int(dev.arch[3:5]) >= 80)
    monkeypatch.setattr(dev, "arch", "sm_75")
    assert not dev.caps.tensor_cores


@pytest.mark.parametrize("src,dims,opts,why", [
    (_mm("f32"), {"N": 32, "K": 32, "M": 16}, ["TC"], "f16"),
    (_mm("f16"), {"N": 20, "K": 32, "M": 16}, ["TC"], "rows in 16s"),
    (_mm("f16"), {"N": 32, "K": 24, "M": 16}, ["TC"], "in 16s"),
    ("a: f16[N, K]\nreturn (a * a).sum(axis=1)", {"N": 32, "K": 32}, ["TC"], "one row axis"),
    (_mm("f16"), {"N": 32, "K": 32, "M": 16}, ["UPCAST", "TC"], "first opt"),
    (_mm("f16"), {"N": 32, "K": 32, "M": 16}, ["TC", "LOCAL"], "after TC"),
])
def test_tc_is_refused_where_it_does_not_apply(src, dims, opts, why):
    k = _kernel(src, dims, "CUDA")
    with pytest.raises(OptError, match=why):
        for name in opts:
            k.apply(Opt(OptOps.TC, 0, 0) if name == "TC" else Opt(OptOps[name], 0, 2))
    k = _kernel(_mm("f16"), {"N": 32, "K": 32, "M": 16}, "OPENCL")
    with pytest.raises(OptError, match="tensor cores"):
        k.apply(Opt(OptOps.TC, 0, 0))


@pytest.mark.skipif(nvrtc_missing is not None, reason=f"NVRTC unavailable: {nvrtc_missing}")
def test_nvrtc_compiles_the_mma_for_ampere_and_hopper():
    k = _lower(_mm("bf16"), "CUDA", {"N": 32, "K": 32, "M": 16})
    for arch in ("sm_80", "sm_90"):
        ptx = cuda.nvrtc_compiler(arch).compile_ptx(k.src)
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx, ptx[-2000:]


STANDIN = '''
import json
import numpy as np
import tgc
import tgc.api as api
import tgc.codegen.search as search
from tgc.codegen.opt import Opt

rng = np.random.default_rng(0)
orig = search.lookup
out = []

def bf16(x):  # numpy float32 -> the bf16 value it rounds to (nearest even), as float64
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32).astype(np.float64)

def check(dtype, shape, opts=None):
    *batch, n, k, m = shape
    a = rng.standard_normal((*batch, n, k)).astype(np.float32)
    b = rng.standard_normal((*batch, k, m)).astype(np.float32)
    names = ("B", "N", "K", "M")[-len(shape):]
    src = f"a: {dtype}[{', '.join(names[:-1])}]\\nb: {dtype}[{', '.join(names[:-3] + names[-2:])}]\\nreturn a @ b"
    if opts is not None:
        search.lookup = api.lookup = lambda ast, device, width=0: [Opt(*o) for o in opts]
    try:
        prog = tgc.loads(src)
        (kern,) = prog.compile("CUDA", dims=dict(zip(names, shape)))
        got = prog.run(device="CUDA", cast=True, a=a, b=b)["out0"].astype(np.float64)
    finally:
        search.lookup = api.lookup = orig
    if dtype == "f16":
        want = a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)
    else:
        want = bf16(a) @ bf16(b)
    # the output is rounded to the half type once: within half an ulp of it (2^-11 relative for f16, 2^-8 bf16)
    rel = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-3)))
    out.append([dtype, shape, [str(o) for o in kern.opts], rel])

check("f16", (32, 32, 16))  # the heuristic: TC, then 2 column tiles a warp
check("bf16", (48, 64, 40))  # TC alone (5 column tiles)
check("f16", (16, 48, 24), [("TC", 0, 0), ("UPCAST", 1, 3)])
check("f16", (2, 32, 16, 24))  # batched: the batch axis on the grid
print(json.dumps(out))
'''


@pytest.mark.skipif(cuda_standin.why_unavailable() is not None, reason=str(cuda_standin.why_unavailable()))
def test_tensor_core_matmuls_match_numpy_through_the_stand_in():
    rows = cuda_standin.run_json(STANDIN)
    assert [row[2][0] for row in rows] == ["TC(0, 0)"] * 4, rows
    bound = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8}
    assert all(row[3] <= bound[row[0]] * 1.01 for row in rows), rows


def test_tc_kernels_are_searched_by_beam_on_cuda_only():
    k = _kernel(_mm("f16"), {"N": 32, "K": 32, "M": 16}, "CUDA")
    assert Opt(OptOps.TC, 0, 0) in search.actions(k)
    k.apply(Opt(OptOps.TC, 0, 0))
    assert Opt(OptOps.TC, 0, 0) not in search.actions(k)
    assert Opt(OptOps.TC, 0, 0) not in search.actions(_kernel(_mm("f16"), {"N": 32, "K": 32, "M": 16}, "OPENCL"))


def test_tc_kernels_count_2mnk_flops():
    """Each `mma.sync` is 16 x 8 x 16 multiply-adds of a warp; adding its result to the accumulator is part of it."""
    from tgc.codegen.kernel import kernel_flops
    k = _lower(_mm("f16"), "CUDA", {"N": 64, "K": 48, "M": 32})
    assert [str(o) for o in k.applied][0] == "TC(0, 0)"
    assert kernel_flops(k.uops, get_device("CUDA"), k.launch) == 2 * 64 * 48 * 32
