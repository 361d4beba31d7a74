"""GPU launch geometry from the codegen: opts checked against the renderer's launch limits (threads and
shared memory per work-group), and awkward sizes mapped onto full work-groups. No GPU needed: these look at
the optimized kernels; tests/test_cuda_standin.py runs such kernels through the CPU stand-in driver."""

from __future__ import annotations

import pytest

import tgc
from tgc.backends import get_device
from tgc.codegen.kernel import prepare_ast
from tgc.codegen.opt import Opt, OptError, OptKernel, launch_limits, shared_bytes


def _kernel(device: str, src: str, dims: dict[str, int]) -> OptKernel:
    dev = get_device(device)
    item = tgc.loads(src).schedule(dims, device=device)[0]
    return OptKernel(prepare_ast(item.ast, dev), dev)


SUM = "x: f32[M, N]\nreturn x.sum(axis=1)"
SUM64 = "x: f64[M, N]\nreturn x.sum(axis=1)"


def test_renderers_declare_launch_limits():
    assert launch_limits(get_device("CUDA")).threads == 1024
    assert launch_limits(get_device("CUDA")).shared_bytes == 48 * 1024
    assert launch_limits(get_device("OPENCL")).threads == 256


def test_local_after_group_counts_the_group_threads():
    k = _kernel("CUDA", SUM, {"M": 64, "N": 4096})
    k.apply(Opt("GROUP", 1, 256))
    k.apply(Opt("LOCAL", 0, 4))  # 1024 threads: the limit
    with pytest.raises(OptError, match="2048 threads"):
        k.apply(Opt("LOCAL", 0, 2))
    assert [str(o) for o in k.applied] == ["GROUP(1, 256)", "LOCAL(0, 4)"]  # unchanged by the refused opt


def test_group_after_local_counts_the_local_threads_on_opencl():
    k = _kernel("OPENCL", SUM, {"M": 64, "N": 4096})
    k.apply(Opt("LOCAL", 0, 4))
    with pytest.raises(OptError, match="too large"):
        k.apply(Opt("GROUP", 1, 128))


def test_shared_memory_of_group_reductions_is_limited():
    k = _kernel("CUDA", SUM64, {"M": 64, "N": 4096})
    k.apply(Opt("GROUP", 1, 256))
    k.apply(Opt("UPCAST", 0, 16))  # 256 threads x 16 lanes x 8 bytes = 32 KB
    assert shared_bytes(k.ast) == 256 * 16 * 8
    with pytest.raises(OptError, match="65536 bytes of shared memory"):
        k.apply(Opt("UPCAST", 0, 2))
    k2 = _kernel("CUDA", SUM64, {"M": 64, "N": 4096})
    k2.apply(Opt("UPCAST", 0, 32))
    with pytest.raises(OptError, match="shared memory"):
        k2.apply(Opt("GROUP", 1, 256))


def test_beam_candidates_respect_the_limits():
    from tgc.codegen.search import actions
    k = _kernel("CUDA", SUM, {"M": 64, "N": 4096})
    k.apply(Opt("GROUP", 1, 256))
    ok = []
    for opt in actions(k):
        c = k.copy()
        try:
            c.apply(opt)
        except OptError:
            continue
        ok.append(c)
    assert ok
    for c in ok:
        threads = 1
        for r in c.ranges():
            if r.arg[1].name in ("LOCAL", "GROUP"):
                threads *= r.src[0].arg
        assert threads <= 1024


@pytest.mark.parametrize("n, local, groups", [(65537, 256, 257), (1000, 250, 4), (4096, 256, 16), (7, 7, 1),
                                              (2 * 65537, 256, 513)])
def test_awkward_sizes_get_full_work_groups(n, local, groups):
    kernels = tgc.loads("x: f32[N]\nreturn x * 2.0").compile(device="CUDA", dims={"N": n})
    assert kernels[0].local_size[0] == local and kernels[0].global_size[0] == groups
    src = kernels[0].src
    if local * groups != n:  # the threads past the end are gated off: they neither load nor store
        assert f"< {n})" in src and f"{n - 1}" not in src
        assert "if (" in src and "? data1[" in src
    else:
        assert "if (" not in src


def test_beam_times_warm_launches_only():
    """The first launch of a candidate (lazy module loading, cold caches) is not timed."""
    from tgc.backends.base import HostAllocator
    from tgc.codegen.search import Candidate, _Timer

    class Prog:
        calls = 0

        def __call__(self, *bufs, global_size=(1, 1, 1), local_size=None, vals=(), wait=False):
            Prog.calls += 1
            return 1.0 if Prog.calls == 1 else 0.001

    class Dev:
        allocator = HostAllocator()
        caps = type("Caps", (), {"gpu": True})()  # a GPU: its first launch loads the module

        def program(self, name, lib):
            return Prog()

    item = tgc.loads("x: f32[N]\nreturn x * 2.0").schedule({"N": 8}, device="CPU")[0]
    timer = _Timer(Dev(), item.bufs)
    cand = Candidate(opts=[], kernel=None, name="k", launch={}, buf_index=list(range(len(item.bufs))))
    assert timer.run(cand, best=0.002) == 0.001


def test_a_grid_beyond_the_limit_is_a_clear_compile_error():
    from tgc.codegen.opt import map_to_grid
    from tgc.errors import CompileError
    k = _kernel("CUDA", "x: f32[N]\nreturn x * 2.0", {"N": 4096})
    with pytest.raises(CompileError, match="16 work-groups, more than the device's 8"):
        map_to_grid(k.ast, max_local=256, max_grid=8)
    _, launch = map_to_grid(k.ast, max_local=256, max_grid=16)
    assert launch["global_size"] == (16, 1, 1)
