"""The memory plan (tgc/engine/memplan.py): slots placed largest first, and elementwise kernels that write their
output over an intermediate input that dies there (in place), end to end on CPU and PYTHON and in packages."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tests.test_package import _rezip
from tgc import package
from tgc.dsl.tensor import Tensor
from tgc.engine.memplan import MemoryPlan, check_plan, plan_memory
from tgc.engine.realize import inplace_pairs
from tgc.package import PackageError, loads_package

N = 1000
DIMS = {"N": N}


def test_the_largest_buffer_is_placed_first_so_a_small_one_does_not_take_its_slot():
    # q [0,1] 12 bytes, t [2,4] 4, h [3,4] 16, out [4,5] 4: the most live at once is t + h + out = 24 bytes.
    # Placed in order of first use, t took q's freed 12-byte slot and h needed a new one (32 bytes in all).
    kb = [["q"], ["q"], ["t"], ["t", "h"], ["out", "t", "h"]]
    sizes = {"q": 12, "t": 4, "h": 16, "out": 4}
    plan = plan_memory(kb, sizes, outputs=["out"])
    assert plan.peak_bytes == 24
    assert plan.slot_of["q"] == plan.slot_of["h"] and len(plan.slots) == 3
    assert check_plan(plan) is None


def test_an_inplace_chain_is_one_slot_and_only_declared_pairs_may_overlap():
    # x -> a -> b -> c -> out, each an elementwise kernel reading the buffer before it at its own index
    kb = [["a", "x"], ["b", "a"], ["c", "b"], ["out", "c"]]
    sizes = {"x": 64, "a": 64, "b": 64, "c": 64, "out": 64}
    pairs = [("a", "x"), ("b", "a"), ("c", "b"), ("out", "c")]
    plan = plan_memory(kb, sizes, inputs=["x"], outputs=["out"], inplace=pairs)
    assert plan.peak_bytes == 128 and len(plan.slots) == 2  # the input, and one slot for the whole chain
    assert plan.inplace == pairs[1:]  # never over the plan's input
    assert len({plan.slot_of[k] for k in "abc"} | {plan.slot_of["out"]}) == 1
    assert check_plan(plan) is None
    assert plan_memory(kb, sizes, inputs=["x"], outputs=["out"]).peak_bytes == 192  # without: two slots alternate
    # a pair whose sizes differ, or whose input lives on past the kernel, is not kept
    assert plan_memory(kb, {**sizes, "b": 32}, ["x"], ["out"], inplace=[("b", "a")]).inplace == []
    assert plan_memory(kb + [["a"]], sizes, ["x"], ["out"], inplace=[("b", "a")]).inplace == []
    # check_plan: overlapping buffers in one slot are refused unless declared, and a declared pair must touch
    base = dict(slots=[64], sizes={"a": 64, "b": 64}, slot_of={"a": 0, "b": 0})
    assert "at the same time" in check_plan(MemoryPlan(**base, lifetimes={"a": (0, 1), "b": (1, 2)}))
    assert check_plan(MemoryPlan(**base, lifetimes={"a": (0, 1), "b": (1, 2)}, inplace=[("b", "a")])) is None
    assert "in-place pair" in check_plan(MemoryPlan(**base, lifetimes={"a": (0, 2), "b": (1, 3)},
                                                    inplace=[("b", "a")]))


def _chain(steps: int, flip: bool = False) -> tgc.Program:
    """A program of `steps` elementwise kernels each realizing exp(t / 2) / 2 - 1/4 of the one before (a DSL program
    fuses them into one kernel; here each gets a buffer, as the scheduler does for values it will not
    recompute), then out = 3 t. `flip`: each step reads its input reversed (not at the index it writes)."""
    prog = tgc.loads("a: f32[N]\nreturn a * 2.0\n")
    outs, bufs = prog._trace(DIMS)
    t = Tensor(bufs[0])
    for _ in range(steps):
        if flip:
            t = t.flip(0)
        t = ((t * 0.5).exp() * 0.5 - 0.25).contiguous()
    prog._traces[tuple(sorted(DIMS.items()))] = ([(t * 3.0).uop], bufs)
    return prog


def _want(a: np.ndarray, steps: int, flip: bool = False) -> np.ndarray:
    t = a.astype(np.float64)
    for _ in range(steps):
        t = np.exp((t[::-1] if flip else t) * 0.5) * 0.5 - 0.25
    return t * 3.0


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_a_chain_of_elementwise_kernels_runs_in_place_in_one_slot(device):
    prog = _chain(4)
    low = prog.lower(device, DIMS)
    assert len(low.kernels) == 5
    plan = low.memory_plan()
    # the input's slot and one more: every intermediate and the output write over the one before
    assert len(plan.slots) == 2 and plan.peak_bytes == 2 * 4 * N
    assert len(plan.inplace) == 4 and check_plan(plan) is None
    rng = np.random.default_rng(0)
    for _ in range(3):  # the first run, the launch plan's first run, and its graph
        a = rng.standard_normal(N).astype(np.float32)
        before = a.copy()
        got = prog.run(device=device, dims=DIMS, a=a)[prog.output_names[0]]
        np.testing.assert_allclose(got, _want(before, 4), rtol=1e-5)
        np.testing.assert_array_equal(a, before)  # the user's input is never written
    prog.release()


def test_the_planned_peak_of_an_inplace_chain_is_what_a_run_allocates():
    prog = _chain(4)
    a = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    alloc = tgc.api._device("CPU").allocator
    borrowed = a.nbytes if a.ctypes.data % alloc.zero_copy_align == 0 else 0
    alloc.reset_peak()
    base = alloc.live_bytes
    prog.run(device="CPU", dims=DIMS, a=a)
    prog.release()
    assert alloc.peak_bytes - base == prog.lower("CPU", DIMS).memory_plan().peak_bytes - borrowed == 4 * N


def test_a_kernel_reading_its_input_at_another_index_is_not_in_place():
    prog = _chain(3, flip=True)
    low = prog.lower("CPU", DIMS)
    assert all(inplace_pairs(k) == [] for k in low.kernels[:-1])  # each reads the buffer before it reversed
    assert len(inplace_pairs(low.kernels[-1])) == 1  # out = 3 t reads t where it writes
    plan = low.memory_plan()
    assert len(plan.inplace) == 1 and plan.peak_bytes == 3 * 4 * N  # the input and two alternating slots
    a = np.random.default_rng(2).standard_normal(N).astype(np.float32)
    got = prog.run(device="CPU", dims=DIMS, a=a)[prog.output_names[0]]
    np.testing.assert_allclose(got, _want(a, 3, flip=True), rtol=1e-5)


def test_a_package_keeps_its_inplace_pairs_and_refuses_bad_ones(tmp_path):
    prog = _chain(4)
    path = tmp_path / "chain.tgpkg"
    package.write(prog, path, "CPU", DIMS)
    pkg = package.load_package(path)
    assert len(pkg.memory.inplace) == 4 and pkg.peak_bytes == 2 * 4 * N
    a = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    before = a.copy()
    for _ in range(2):
        np.testing.assert_allclose(pkg.run(a=a)[pkg.output_names[0]], _want(before, 4), rtol=1e-5)
    np.testing.assert_array_equal(a, before)
    pkg.release()
    data = path.read_bytes()

    def refused(edit, match: str) -> None:
        with pytest.raises(PackageError, match=match) as e:
            loads_package(_rezip(data, edit), "p.tgpkg")
        assert e.value.exit_code == 2

    refused(lambda m: m["memory"].update(inplace=[]), "at the same time")  # the plan needs its pairs
    refused(lambda m: m["memory"].update(inplace=[[1]]), "pair")
    refused(lambda m: m["memory"].update(inplace=[[0, 999]]), "memory.inplace buffer")
    refused(lambda m: m["memory"].update(inplace="x"), "memory.inplace is not a list")
    # a pair of buffers whose lives do not meet at one kernel
    refused(lambda m: m["memory"]["inplace"].append(m["memory"]["inplace"][0][::-1]), "in-place pair")


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_a_matmul_adds_a_dying_residual_in_place(device):
    """out = a @ w + r, r an intermediate read only where out is written, after the reduction: out takes r's
    memory."""
    n = 48
    dims = {"N": n}
    prog = tgc.loads("a: f32[N, N]\nw: f32[N, N]\nreturn a @ w\n")
    outs, bufs = prog._trace(dims)
    a, w = Tensor(bufs[0]), Tensor(bufs[1])
    r = ((a * 0.5).exp() - 1.0).contiguous()
    prog._traces[tuple(sorted(dims.items()))] = [(a @ w + r).uop], bufs
    low = prog.lower(device, dims)
    plan = low.memory_plan()
    assert [len(inplace_pairs(k)) for k in low.kernels][-1] == 1 and len(plan.inplace) == 1
    assert plan.peak_bytes == 3 * 4 * n * n  # a, w, and one slot for r and then the output
    rng = np.random.default_rng(4)
    for _ in range(3):
        x, y = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        before = x.copy(), y.copy()
        got = prog.run(device=device, dims=dims, a=x, w=y)[prog.output_names[0]]
        want = before[0].astype(np.float64) @ before[1] + np.exp(before[0] * 0.5) - 1.0
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(x, before[0])
        np.testing.assert_array_equal(y, before[1])
    prog.release()


def test_a_plan_of_many_buffers_places_them_in_first_use_order_and_is_safe():
    """Above LARGEST_FIRST_UNITS buffers only the first-use placement runs (largest first is quadratic)."""
    from tgc.engine.memplan import LARGEST_FIRST_UNITS
    n = LARGEST_FIRST_UNITS + 50
    # kernel i writes m_i from x and the m before it; the last reads them all (every m lives to the end)
    kb = [[f"m{i}", "x"] + [f"m{j}" for j in range(i)][-1:] for i in range(n)] + [["out"] + [f"m{i}" for i in range(n)]]
    sizes = {f"m{i}": 256 for i in range(n)} | {"x": 4096, "out": 4096}
    plan = plan_memory(kb, sizes, ["x"], ["out"])
    assert check_plan(plan) is None and plan.peak_bytes == plan.unshared_bytes == 2 * 4096 + 256 * n


# One image of the U-Net block (bench/models/unet_block.tg, CI=32, C=64, S=64), its intermediates as the plan sees
# them: (bytes, first kernel, last kernel). The padded copies P of `up` and of `cat(up, skip)` (128 x 66 x 66 f32),
# the concatenation K (128 x 64 x 64), `bottom` (128 x 32 x 32), the packed weights (64 x 128 x 3 x 3 and less),
# the pooled image's padded copy (64 x 34 x 34), the hidden layers (64 x 64 x 64) and their padded copies.
_UNET_IMAGE = [(2230272, 11, 13), (2230272, 14, 16), (2097152, 7, 14), (1115136, 3, 5), (1115136, 17, 19),
               (1048576, 2, 3), (1048576, 5, 7), (1048576, 16, 17), (557568, 0, 2), (524288, 10, 11),
               (295936, 8, 10), (294912, 9, 10), (294912, 12, 13), (294912, 15, 16), (262144, 6, 8),
               (147456, 4, 5), (147456, 18, 19), (73728, 1, 2)]
# By hand: kernel 11 holds a P, K and `bottom` at once (three slots of at least 2230272, 2097152 and 524288 bytes)
# and kernel 10 four buffers (K, `bottom`, the pooled copy, a packed weight: a fourth slot of >= 294912), so no
# plan is below their sum; and one is at it (each other buffer fits a slot free for its whole life).
_UNET_IMAGE_FLOOR = 2230272 + 2097152 + 524288 + 294912


def _kernel_bufs(spans: list[tuple[int, int, int]]) -> tuple[list[list[str]], dict[str, int]]:
    kb: list[list[str]] = [[] for _ in range(1 + max(e for _, _, e in spans))]
    for i, (_size, start, end) in enumerate(spans):
        kb[start].append(f"b{i}")
        kb[end].append(f"b{i}")
    return kb, {f"b{i}": size for i, (size, _, _) in enumerate(spans)}


def test_the_searched_plan_reaches_the_floor_where_both_greedy_placements_waste_a_slot(monkeypatch):
    import tgc.engine.memplan as memplan
    kb, sizes = _kernel_bufs(_UNET_IMAGE)
    plan = plan_memory(kb, sizes)
    assert check_plan(plan) is None and plan.peak_bytes == _UNET_IMAGE_FLOOR
    # without the search: the hidden layer after the concatenation (1 MiB, kernels 16-17) finds no free slot (its
    # padded copy took the one the concatenation freed) and gets one of its own
    monkeypatch.setattr(memplan, "SEARCH_STEPS", 0)
    greedy = plan_memory(kb, sizes)
    assert check_plan(greedy) is None and greedy.peak_bytes == _UNET_IMAGE_FLOOR - 524288 + 1048576
    # the search keeps the greedy plan where that is at the floor already, and stops within its steps
    monkeypatch.setattr(memplan, "SEARCH_STEPS", 8000)
    kb2, sizes2 = _kernel_bufs([(64, 0, 1), (32, 1, 2), (64, 2, 3)])
    assert plan_memory(kb2, sizes2).peak_bytes == 96
    monkeypatch.setattr(memplan, "SEARCH_STEPS", 1)
    assert check_plan(plan_memory(kb, sizes)) is None


def test_a_unet_images_planned_intermediates_are_at_most_the_hand_computed_floor():
    """The U-Net block's chunk of one image (what `Program.run` runs for B=2: chunks along B), planned as a chunk
    is (outputs in their own slots): its intermediates' slots sum to at most `_UNET_IMAGE_FLOOR`."""
    from tgc.engine.realize import plan_for
    prog = tgc.load("bench/models/unet_block.tg")
    exe = prog.lower("CPU", dims={"B": 1, "CI": 32, "C": 64, "S": 64}, defer=True)
    plan = plan_for(exe.device, exe.kernels, exe.inputs, exe.outputs, fixed_outputs=True)
    assert check_plan(plan) is None
    io_slots = {plan.slot_of[k] for k, _ in exe.inputs} | {plan.slot_of[k] for _, k in exe.outputs}
    assert sum(size for s, size in enumerate(plan.slots) if s not in io_slots) <= _UNET_IMAGE_FLOOR


def test_a_host_slot_is_its_own_size_and_holds_only_smaller_buffers_that_die_before_it():
    # big [0,1] 64 bytes, a [1,2] 32, b [2,3] 16, host out [4,5] 32 (a chunk's output): b and a may use out's
    # memory (they die before kernel 4) but not big (larger: the slot would outgrow the output's part)
    kb = [["big"], ["big", "a"], ["a", "b"], ["b"], ["out"]]
    sizes = {"big": 64, "a": 32, "b": 16, "out": 32}
    plan = plan_memory(kb, sizes, outputs=["out"], hosts=["out"])
    assert check_plan(plan) is None
    host = plan.slot_of["out"]
    assert plan.slots[host] == 32 and plan.slot_of["big"] != host
    assert plan.slot_of["a"] == host or plan.slot_of["b"] == host
    assert plan.peak_bytes == 64 + 32  # big's slot takes what out's does not
    # a buffer live beside the output never shares its slot; nor does an in-place pair with the host in it
    kb2 = [["t"], ["out", "t"], ["out"]]
    plan2 = plan_memory(kb2, {"t": 32, "out": 32}, outputs=["out"], hosts=["out"], inplace=[("out", "t")])
    assert plan2.slot_of["t"] != plan2.slot_of["out"] and plan2.inplace == [] and check_plan(plan2) is None
    # an input named as a host stays an input (a slot of its own, shared with nothing)
    plan3 = plan_memory([["x", "t"], ["t"]], {"x": 32, "t": 16}, inputs=["x"], hosts=["x"])
    assert plan3.slot_of["t"] != plan3.slot_of["x"]


def test_in_place_chains_never_put_two_live_buffers_in_one_slot_and_check_plan_reads_pairs_either_way():
    """Review 17: z -> a -> b in place, `a` written and read by one kernel, kept both pairs and put z beside b
    (both live at kernel 1); check_plan refused a valid pair of one-kernel lives listed the other way round."""
    from tgc.engine.memplan import check_plan
    sizes = {k: 64 for k in "zab"}
    for pairs in ([("a", "z"), ("b", "a")], [("b", "a"), ("a", "z")]):
        plan = plan_memory([["z"], ["z", "a", "b"], ["b"]], sizes, inplace=pairs)
        assert check_plan(plan) is None and len(plan.inplace) == 1
        plan = plan_memory([["z"], ["z", "a"], ["a", "b"], ["b"]], sizes, inplace=pairs)  # a chain that is fine
        assert check_plan(plan) is None and len(plan.inplace) == 2 and len(plan.slots) == 1
    for kernels in ([["b", "a"]], [["a", "b"]]):
        plan = plan_memory(kernels, {"a": 64, "b": 64}, inplace=[("b", "a")])
        assert plan.inplace == [("b", "a")] and check_plan(plan) is None
