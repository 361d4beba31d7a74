"""The `--check` tolerance accounts for the conditioning of long reductions (issue 22, item 5): a correct float32
result (tgc's or numpy's own float32 evaluation) passes where the output-scale rule alone failed it, and a wrong
index, a lost term or swapped rows still fail. Expectations are exact values or numpy's float32 results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tgc
from tgc.baselines.numpy_eval import numpy_program
from tgc.cli.check import check_outputs
from tgc.cli.inputs import fill_random
from tgc.engine.compare import compare

BLOCK = Path(__file__).resolve().parent.parent / "kernels" / "transformer_block.tg"


def _cancelling_sum_inputs(n: int = 8192) -> np.ndarray:
    """Terms of about +1000 then about -1000: partial sums reach 4e6, the total is ~100 (an ill-conditioned
    sum, as the inner products of a large layer are)."""
    rng = np.random.default_rng(0)
    half = (1000 + rng.standard_normal(n // 2)).astype(np.float32)
    return np.concatenate([half, -(1000 + rng.standard_normal(n // 2)).astype(np.float32)])


def test_long_reduction_correct_float32_passes_and_wrong_index_fails():
    x = _cancelling_sum_inputs()
    prog = tgc.loads("x: f32[N]\nreturn sum(x)")
    ref, scale = prog.reference_with_scale(x=x)
    exact = float(np.sum(x.astype(np.float64)))
    assert ref["out0"] == pytest.approx(exact, abs=1e-9)
    sequential = np.cumsum(x, dtype=np.float32)[-1]  # numpy's float32, one term after the other
    assert abs(sequential - exact) > 1e-4 * 2 * max(1.0, abs(exact))  # the output-scale rule alone fails it
    assert compare("s", sequential, ref["out0"], "f32")[0] is not None
    assert compare("s", sequential, ref["out0"], "f32", scale=scale["out0"])[0] is None
    assert compare("s", np.float32(np.sum(x)), ref["out0"], "f32", scale=scale["out0"])[0] is None  # pairwise
    got = prog.run(device="CPU", x=x)["out0"]
    assert compare("s", got, ref["out0"], "f32", scale=scale["out0"])[0] is None
    wrong = x.copy()
    wrong[len(x) // 2] = x[len(x) // 2 - 1]  # one term read from the neighbouring index
    bad = np.cumsum(wrong, dtype=np.float32)[-1]
    m = compare("s", bad, ref["out0"], "f32", scale=scale["out0"])[0]
    assert m is not None and m.bad == 1
    lost = np.cumsum(x[:-1], dtype=np.float32)[-1]  # the last term lost
    assert compare("s", lost, ref["out0"], "f32", scale=scale["out0"])[0] is not None


def test_scale_of_well_conditioned_values_keeps_the_old_bound():
    # elementwise work and sums of positive terms: the error scale is about the values' size, so the rule is the
    # output-scale one (a relative error of 1e-3 still fails)
    prog = tgc.loads("x: f32[N]\nreturn exp(x) * 2 + 1, sum(x * x)")
    x = np.linspace(-2, 2, 64).astype(np.float32)
    ref, scale = prog.reference_with_scale(x=x)
    r0 = ref["out0"]
    assert np.all(scale["out0"] <= 8 * np.abs(r0))
    assert compare("a", (r0 * (1 + 1e-3)).astype(np.float32), r0, "f32", scale=scale["out0"])[0] is not None
    assert scale["out1"] <= 2 * np.sqrt(64) * ref["out1"]
    assert compare("b", np.float32(ref["out1"] * (1 + 1e-3)), ref["out1"], "f32", scale=scale["out1"])[0] is not None


def _block(dims: dict[str, int]):
    prog = tgc.load(str(BLOCK))
    arrays = fill_random(prog, {}, dims, 0)  # what --random gives
    ref, scale = prog.reference_with_scale(dims=dims, **arrays)
    return prog, arrays, ref, scale


def _mismatches(outs, ref, scale):
    bad, _ = check_outputs({"out0": outs["out0"]}, ref, {"out0": "f32"}, None, scale)
    return bad


WRONG = {  # deliberate wrong indices in the block: (what the program says, what a wrong kernel would do)
    "k read from q's slot": ("k = permute(heads[:, :, 1]", "k = permute(heads[:, :, 0]"),
    "causal mask off by one": ("arange(T)[:, None] >= arange(T)[None, :]", "arange(T)[:, None] > arange(T)[None, :]"),
    "residual read backwards along T": ("y = x + attn", "y = flip(x, 1) + attn"),
}


def test_transformer_block_small_correct_results_pass_and_wrong_indices_fail():
    dims = {"B": 2, "T": 16, "C": 64}
    prog, arrays, ref, scale = _block(dims)
    assert not _mismatches(prog.run(device="CPU", dims=dims, inputs=arrays), ref, scale)
    assert not _mismatches(numpy_program(prog, dims)(arrays), ref, scale)  # numpy's own float32
    src = BLOCK.read_text()
    for what, (right, wrong) in WRONG.items():  # computed in float32 by numpy, as a wrong kernel would
        assert right in src, what
        bad = numpy_program(tgc.loads(src.replace(right, wrong)), dims)(arrays)
        assert _mismatches(bad, ref, scale), f"{what} passed the check"
    swapped = prog.run(device="CPU", dims=dims, inputs=arrays)["out0"].copy()
    swapped[:, [3, 4]] = swapped[:, [4, 3]]  # rows stored at each other's index
    assert _mismatches({"out0": swapped}, ref, scale)


@pytest.fixture(scope="module")
def full_block():
    """The block at the issue's size, its inputs as `--random` makes them, and the float64 reference with its
    error scale: computed once for the two tests below (the reference is the costly part)."""
    return _block({"B": 8, "T": 256, "C": 512})


@pytest.mark.slow
def test_transformer_block_b8_t256_c512_tgc_result_passes_the_check(full_block, monkeypatch):
    # the false failure (`tgc run ... --check`: worst error 0.79 against a tolerance of 0.67): tgc's own
    # kernels, checked by the rule `--check` uses (check_outputs); the command line's --check path is covered at
    # small sizes (tests/test_cli.py). The whole batch at once (TGC_CHUNK=0): a chunked run would lower and
    # compile the block twice (the whole batch for its memory plan, then a chunk), and chunking, covered by
    # tests/test_chunk.py, is not what this test checks
    monkeypatch.setenv("TGC_CHUNK", "0")
    prog, arrays, ref, scale = full_block
    assert not _mismatches(prog.run(device="CPU", dims={"B": 8, "T": 256, "C": 512}, inputs=arrays), ref, scale)


@pytest.mark.slow
def test_transformer_block_b8_t256_c512_wrong_index_still_fails(full_block):
    dims = {"B": 8, "T": 256, "C": 512}
    prog, arrays, ref, scale = full_block
    assert not _mismatches(numpy_program(prog, dims)(arrays), ref, scale)  # numpy's float32 block passes
    # in float32 by numpy, as a wrong kernel would compute them. (At this size a residual read at the wrong
    # position, an error of about one input element in outputs of thousands, is inside the float32 error scale:
    # docs/DESIGN.md, "The language")
    for what in ("k read from q's slot", "causal mask off by one"):
        right, wrong = WRONG[what]
        bad = numpy_program(tgc.loads(BLOCK.read_text().replace(right, wrong)), dims)(arrays)
        assert _mismatches(bad, ref, scale), f"{what} passed the check"


def test_error_scale_of_a_matmul_stays_near_the_inputs_size():
    import tracemalloc

    n = 384
    prog = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b\n")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    tracemalloc.start()
    try:
        ref, scale = prog.reference_with_scale(a=a, b=b)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2 * n * n * 8, peak  # no M x K x N product, for the values or their scale
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    # each product and each of the K partial sums rounds: (K + 1) * sum of squared products, root of it
    np.testing.assert_allclose(scale["out0"], np.sqrt((n + 1) * ((a64 * a64) @ (b64 * b64))), rtol=1e-9)
    # the exact sum, rounded once to the output's f32 (`_round_to`): within one f32 rounding of float64's
    assert np.array_equal(ref["out0"], ref["out0"].astype(np.float32))
    np.testing.assert_allclose(ref["out0"], a64 @ b64, rtol=2.0 ** -24, atol=1e-12)


def test_a_masked_softmax_keeps_its_rounding_scale():
    """A causal mask's `-inf` constant: its square (inf) times exp's derivative at -inf (0) made the scale nan,
    read as 0, so every element after the mask was checked with no rounding allowance at all."""
    prog = tgc.loads("q: f32[T, D]\nk: f32[T, D]\n"
                     "return softmax(where(tril(ones(T, T, dtype=bool)), q @ k.T, -inf), axis=-1) @ k")
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((8, 4)).astype(np.float32) for _ in range(2))
    ref, scale = prog.reference_with_scale(q=q, k=k)
    s = scale["out0"]
    assert np.all(np.isfinite(s)) and np.all(s > 0)
    qd, kd = q.astype(np.float64), k.astype(np.float64)
    logits = np.where(np.tril(np.ones((8, 8), dtype=bool)), qd @ kd.T, -np.inf)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    want = (p / p.sum(axis=-1, keepdims=True)) @ kd
    # (the reference rounds each f32 result to f32, `_round_to`: a few f32 roundings from float64's)
    np.testing.assert_allclose(ref["out0"], want, rtol=1e-5, atol=1e-7)
    assert np.all(s <= 8 * np.abs(kd).max())  # about the size of the values averaged, not inflated
    got = prog.run(device="CPU", q=q, k=k)["out0"]
    assert compare("o", got, ref["out0"], "f32", scale=s)[0] is None
    wrong = got.copy()
    wrong[5, 2] += 1e-2 * max(1.0, abs(wrong[5, 2]))  # a 1% error in one element still fails
    m = compare("o", wrong, ref["out0"], "f32", scale=s)[0]
    assert m is not None and m.bad == 1
