"""The CUDA stand-in's block execution (tests/standin/kernel.h) on its own: host builds of small hand-written CUDA
C kernels, launched through `tgc_launch` with ctypes (no NVRTC, no driver). A block's GPU threads run as fibers
on the launching thread; these tests pin what the barrier must keep: results exact with barriers, wrong without
them, and a barrier that can never complete ends the process with a message instead of hanging."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA stand-in needs g++")

ROOT = Path(__file__).resolve().parent.parent

REVERSE = """
__global__ void reverse_{tag}(int* out, const int* in) {{
  __shared__ int tile[256];
  tile[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];
  {barrier}
  out[blockIdx.x * 256 + threadIdx.x] = tile[255 - threadIdx.x];
}}
"""

# a tree sum in shared memory, then a warp's shuffle: thread 0 of each block writes its block's sum
TREE_SUM = """
__global__ void tree_sum(float* out, const float* in) {
  __shared__ float part[128];
  part[threadIdx.x] = in[blockIdx.x * 128 + threadIdx.x];
  __syncthreads();
  for (int stride = 64; stride >= 32; stride >>= 1) {
    if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  float v = part[threadIdx.x % 32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}
"""

# thread 5 leaves before the barrier the others wait at (on a GPU: a hang)
EARLY_EXIT = """
__global__ void early_exit(int* out, const int* in) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  out[threadIdx.x] = in[threadIdx.x];
}
"""


def _build(src: str) -> Path:
    import cuda_standin
    src = textwrap.dedent(src)
    return cuda_standin.host_build(src, b"kernel.h test:" + src.encode())


def _launch(so: Path, name: str, grid: int, block: int, *arrays: np.ndarray) -> None:
    lib = ctypes.CDLL(str(so))
    entry = ctypes.cast(getattr(lib, f"tgc_entry_{name}"), ctypes.c_void_p)
    pointers = [ctypes.c_void_p(a.ctypes.data) for a in arrays]
    params = (ctypes.c_void_p * len(arrays))(*[ctypes.addressof(p) for p in pointers])
    dims = ctypes.c_uint * 3
    lib.tgc_launch.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                               ctypes.c_void_p, ctypes.c_uint]
    assert lib.tgc_launch(entry, dims(grid, 1, 1), dims(block, 1, 1), params, 0) == 0


def test_shared_memory_exchange_is_exact_with_a_barrier_and_wrong_without():
    x = np.arange(1, 3 * 256 + 1, dtype=np.int32)
    want = x.reshape(3, 256)[:, ::-1].ravel()
    out = np.full_like(x, -7)
    _launch(_build(REVERSE.format(tag="synced", barrier="__syncthreads();")), "reverse_synced", 3, 256, out, x)
    np.testing.assert_array_equal(out, want)
    out = np.full_like(x, -7)
    _launch(_build(REVERSE.format(tag="racy", barrier="")), "reverse_racy", 3, 256, out, x)
    assert (out != want).sum() >= 256, "a missing barrier went unseen"


def test_tree_sum_and_warp_shuffle_match_numpy():
    x = np.random.default_rng(0).integers(-50, 50, size=5 * 128).astype(np.float32)  # sums exact in f32
    out = np.full(5, np.nan, np.float32)
    _launch(_build(TREE_SUM), "tree_sum", 5, 128, out, x)
    np.testing.assert_array_equal(out, x.reshape(5, 128).sum(axis=1))


def test_a_barrier_that_can_never_complete_ends_the_process_with_a_message():
    so = _build(EARLY_EXIT)
    code = textwrap.dedent(f"""
        import numpy as np, test_cuda_standin_blocks as t
        from pathlib import Path
        x = np.arange(64, dtype=np.int32)
        t._launch(Path({str(so)!r}), "early_exit", 1, 64, np.zeros_like(x), x)
        print("not reached")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not reached" not in r.stdout
    assert "__syncthreads() that can never complete (1 of 64 threads" in r.stderr, r.stderr[-2000:]
