"""STAGE's tile copies as `cp.async` on CUDA sm_80+ (issue 26 item 3): the 16-byte copies go from global to shared
memory without registers, a step ahead (three buffers; each thread waits for all its copies but the next step's
before the one barrier); older architectures (and OpenCL, Metal) keep the plain 16-byte loads. NVRTC compiles the
PTX here for real; the CPU stand-in's kernel.h queues a thread's copies until it waits for their group (the latest
a GPU may complete them), so the values are checked against numpy, and kernels that do not wait, or wait for too
few groups, are shown to fail. GROUPTOP's shuffles and a BEAM round of GROUP candidates through the stand-in too."""

from __future__ import annotations

import re

import cuda_standin
import pytest

import tgc
from tgc.backends import cuda, get_device
from tgc.codegen.opt import Opt
from tgc.codegen.pipeline import lower

MATMUL = "a: f32[N, K]\nb: f32[K, M]\nreturn a @ b"
nvrtc_missing = cuda.nvrtc_error()


def _src(device: str, dims: dict, opts: list[tuple] | None = None, src: str = MATMUL) -> str:
    dev = get_device(device)
    (it,) = [s for s in tgc.loads(src).schedule(dims, device=device) if hasattr(s, "ast")]
    return lower(it.ast, dev, it.bufs, "mm", opts=None if opts is None else [Opt(*o) for o in opts]).src


def _body(src: str) -> str:
    return src[src.index("__global__ void"):]


def test_staged_copies_are_async_a_step_ahead_on_sm80_and_plain_loads_before(monkeypatch):
    dev = get_device("CUDA")
    monkeypatch.setattr(dev, "arch", "sm_90")
    assert dev.caps.async_copy
    body = _body(_src("CUDA", {"N": 64, "K": 64, "M": 64}))  # the heuristic: 16 x 16 threads, 4 x 4, STAGE 16
    assert "reinterpret_cast<const float4*>" not in body
    # A's and B's tiles in three buffers; in step s: step 0's own copies (gated to step 0), a group of their own,
    # then step s + 1's (gated off in the last step), then wait for all but those, and the one barrier
    assert "__shared__ __align__(16) float tile0[3072];" in body and "tile1[3072];" in body
    loop = re.search(r"for \(int (ridx\d+) = 0; ridx\d+ < 4; ridx\d+\+\+\) \{(.*?)__syncthreads\(\);", body, re.S)
    step, copies = loop.group(1), loop.group(2)
    calls = re.findall(r"if \((v\d+)\) \{ tgc_cp_async16\((tile\d) \+ v\d+, (data\d) \+ v\d+\); \}", copies)
    assert [(t, d) for _, t, d in calls] == [("tile0", "data1"), ("tile1", "data2")] * 2, copies
    assert re.search(rf"bool {calls[0][0]} = \({step} < 1\);", copies)
    assert re.search(rf"bool {calls[2][0]} = \({step} < 3\);", copies)
    assert copies.index("tgc_cp_async_commit();") < copies.index(f"if ({calls[2][0]})")
    assert copies.rstrip().endswith("tgc_cp_async_commit(); tgc_cp_async_wait_group<1>();")
    assert f"({step} % 3)" in copies and body.count("__syncthreads();") == 1
    for arch in ("sm_75", "sm_70"):
        monkeypatch.setattr(dev, "arch", arch)
        assert not dev.caps.async_copy and not dev.caps.tensor_cores
        old = _src("CUDA", {"N": 64, "K": 64, "M": 64})
        assert "cp_async" not in old and "cp.async" not in old and "reinterpret_cast<const float4*>" in old
        assert "tile0[2048];" in old  # two buffers
    assert "cp_async" not in _src("OPENCL", {"N": 64, "K": 64, "M": 64})


def test_a_kernel_with_a_copy_by_elements_waits_for_its_async_copies_in_their_own_step(monkeypatch):
    monkeypatch.setattr(get_device("CUDA"), "arch", "sm_90")
    # an operand read from an odd offset (a[:, 1:]): its copies go element by element, as plain loads; B's 16-byte
    # copies are cp.async, waited for before the barrier of the step that issued them (two buffers)
    src = "a: f32[N, K]\nb: f32[J, M]\nreturn a[:, 1:] @ b"
    body = _body(_src("CUDA", {"N": 64, "K": 65, "J": 64, "M": 64}, src=src))
    assert body.count("tgc_cp_async16(tile") == 1 and "tgc_cp_async_wait_group<0>();\n    __syncthreads();" in body
    assert "tile0[2048];" in body and "tile1[2048];" in body


@pytest.mark.skipif(nvrtc_missing is not None, reason=f"NVRTC unavailable: {nvrtc_missing}")
def test_nvrtc_compiles_cp_async_for_ampere_and_hopper():
    src = _src("CUDA", {"N": 64, "K": 64, "M": 64})
    for arch in ("sm_80", "sm_90"):
        ptx = cuda.nvrtc_compiler(arch).compile_ptx(src)
        assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group 1" in ptx, ptx[-2000:]
        assert "cp.async.commit_group" in ptx
    assert cuda.nvrtc_compiler("sm_80").compile(src)  # ptxas takes it


STANDIN = '''
import json
import numpy as np
import tgc
import tgc.codegen.search as search
from tgc.backends import get_device
from tgc.codegen.pipeline import lower

rng = np.random.default_rng(0)
out = {"checks": []}
MM = "a: f32[N, K]\\nb: f32[K, M]\\nreturn a @ b"

def check(src, opts, want, **inputs):
    got, srcs = cuda_standin.run_with_opts(src, opts, inputs)
    err = float(np.max(np.abs(got - want) / (1 + np.abs(want))))
    out["checks"].append([src.splitlines()[-1], opts, err, srcs.count("tgc_cp_async16(tile"),
                          srcs.count("__shfl_xor_sync(")])

for n, k, m, opts in ((64, 64, 64, []), (32, 96, 64, [("LOCAL", 0, 8), ("LOCAL", 1, 8), ("UPCAST", 1, 4),
                                                      ("STAGE", 2, 32)]),
                      (48, 48, 32, [("LOCAL", 1, 8), ("LOCAL", 0, 8), ("UPCAST", 0, 2), ("STAGE", 2, 16)])):
    a, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
    check(MM, opts, a.astype(np.float64) @ b, a=a, b=b)
x = rng.standard_normal((8, 2048)).astype(np.float32)
check("x: f32[M, N]\\nreturn x.sum(axis=1)", [("GROUPTOP", 1, 256)], x.sum(1, dtype=np.float64), x=x)
check("x: f32[M, N]\\nreturn x.max(axis=1)", [("LOCAL", 0, 2), ("GROUPTOP", 1, 64)], x.max(1), x=x)

# the same staged matmul launched by hand: as rendered, without its waits, and waiting for too few groups (all but
# the last 2: step s's copies may still be in flight): kernel.h lands a copy only when its thread waits for its
# group, so the last two read shared memory no copy has reached yet
dev = get_device("CUDA")
(it,) = [s for s in tgc.loads(MM).schedule({"N": 64, "K": 64, "M": 64}, device="CUDA") if hasattr(s, "ast")]
kern = lower(it.ast, dev, it.bufs, "mm")
a, b = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
want = a.astype(np.float64) @ b
wait = "tgc_cp_async_wait_group<1>();"
for key, src in (("as_rendered", kern.src), ("no_wait", kern.src.replace(wait, "")),
                 ("too_few", kern.src.replace(wait, "tgc_cp_async_wait_group<2>();"))):
    bufs = [dev.allocator.alloc(64 * 64 * 4) for _ in range(3)]
    dev.allocator.copyin(bufs[1], memoryview(a).cast("B"))
    dev.allocator.copyin(bufs[2], memoryview(b).cast("B"))
    dev.program("mm", dev.compiler.compile(src))(*bufs, global_size=kern.launch["global_size"],
                                                   local_size=kern.launch["local_size"], wait=True)
    got = np.empty((64, 64), np.float32)
    dev.allocator.copyout(memoryview(got).cast("B"), bufs[0])
    out[key] = [src.count(wait), float(np.nan_to_num(np.max(np.abs(got - want)), nan=1e30))]

# a BEAM round on CUDA through the stand-in, its actions cut to GROUP and GROUPTOP (each candidate is a g++ build
# here): every one compiles with NVRTC, runs, is timed and checked like any other
from tgc.codegen.kernel import prepare_ast
from tgc.codegen.opt import OptOps
timed = []
orig_time, orig_actions = search._time_candidate, search.actions
def spy(timer, c, best_s, result):
    ok = orig_time(timer, c, best_s, result)
    timed.append([" ".join(str(o) for o in c.opts), ok])
    return ok
search._time_candidate = spy
search.actions = lambda k: [o for o in orig_actions(k) if o.op in (OptOps.GROUP, OptOps.GROUPTOP)]
(it,) = [s for s in tgc.loads("x: f32[M, N]\\nreturn x.sum(axis=1)").schedule({"M": 64, "N": 32}, device="CUDA")
         if hasattr(s, "ast")]
r = search.beam_search(prepare_ast(it.ast, dev), dev, it.bufs, width=1, rounds=1, name="rowsum")
out["beam"] = {"timed": timed, "failed": r.failed, "rejected": r.rejected}
print(json.dumps(out))
'''


@pytest.mark.skipif(cuda_standin.why_unavailable() is not None, reason=str(cuda_standin.why_unavailable()))
def test_async_copies_grouptop_and_beams_group_candidates_through_the_stand_in():
    rows = cuda_standin.run_json(STANDIN)
    checks = rows["checks"]
    assert all(row[2] < 1e-5 for row in checks), checks
    # cp.async a step ahead (each 16-byte copy twice: step 0's own, gated to step 0, and the next step's); the last
    # one's B tile (8 columns x 16 steps, 64 threads) by plain loads, so A's cp.async waited for in its own step
    assert [row[3] for row in checks] == [4, 10, 1, 0, 0], checks
    assert [row[4] > 0 for row in checks] == [False, False, False, True, True], checks  # GROUPTOP by shuffles
    assert rows["as_rendered"][0] == 1 and rows["as_rendered"][1] < 1e-3, rows
    # the emulation catches a missing wait and a wait for too few groups
    assert rows["no_wait"][0] == rows["too_few"][0] == 0, rows
    assert rows["no_wait"][1] > 1e-1 and rows["too_few"][1] > 1e-1, rows
    beam = rows["beam"]  # BEAM's GROUP candidates on CUDA: compiled, run and timed (none failed or was wrong)
    assert sorted(name for name, ok in beam["timed"] if ok) == ["GROUP(1, 16)", "GROUP(1, 32)", "GROUPTOP(1, 16)",
                                                               "GROUPTOP(1, 32)"], beam
    assert beam["failed"] == beam["rejected"] == 0, beam
