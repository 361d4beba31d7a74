"""Symbolic plans for the corpus models that had none (branch symplan, issue 21 item 0): a pooled then upsampled
map concatenated with the input (unet: S narrowed to a multiple of 2), a convolution whose kernel and stride are
a dim (vit: IMG a multiple of P), sizes that are sums of products (vit's tokens `(IMG // P)^2 + 1`), a tensor
past 2^63 elements at the probes (llama_gqa: no decision of the one trace) and a split reduce's remainder
(kv_decode: only divisors at every size of the class). Each plan is checked against numpy at sizes of its class
(least, odd multiples, larger) and refuses sizes outside it."""

from __future__ import annotations

import numpy as np
import pytest
from test_symbolic_multiples import _run

import tgc
from tgc.baselines.numpy_eval import numpy_program
from tgc.codegen import sizes
from tgc.engine.inputs import random_inputs
from tgc.engine.schedule import _split_size
from tgc.ir.symsize import SymSize, checked_at, decided_by_remainder, multiple_at_every_size

POOL_UP = """
x: f32[B, S, S]
p = max_pool2d(x, 2)
u = repeat(repeat(p, 2, axis=1), 2, axis=2)
return cat(u, x, axis=0)
"""

PATCH_CONV = """
x: f32[B, 3, IMG, IMG]
w: f32[C, 3, P, P]
return conv2d(x, w, stride=P)
"""

TOKENS = """
x: f32[B, N * N + 1, C]
w: f32[C, F]
y = x @ w
return softmax(y @ y.transpose(-2, -1), axis=-1) @ y
"""


def test_an_upsampled_pooling_narrows_its_dim_to_a_multiple_of_2():
    prog = tgc.loads(POOL_UP)
    plan = prog.compile_symbolic("CPU")
    assert plan.multiples == [("S", 2, "S_2")]
    tf = plan.trusted_from
    for b, s in [(2, 4), (3, 6), (tf, 2 * tf), (tf + 1, 2 * (tf + 2)), (5, 2 * 45)]:
        assert _run(prog, {"B": b, "S": s}).split(":")[0] in ("symbolic", "specialized") if s < 2 * tf \
            else _run(prog, {"B": b, "S": s}) == "symbolic", (b, s)
    assert plan.bind(prog, {"B": 3, "S": 2 * tf + 1})[1].startswith(f"S = {2 * tf + 1} is not a multiple of 2")
    assert plan.bind(prog, {"B": 3, "S": 64})[1].startswith("S // 2 = 32 is outside")
    with pytest.raises(tgc.TgcError, match="differ outside axis 0"):  # (an odd S: the program's own error)
        prog.run("CPU", dims={"B": 2, "S": 7}, symbolic=True, **random_inputs(prog, {"B": 2, "S": 7}))


def test_a_convolution_whose_kernel_and_stride_are_a_dim():
    prog = tgc.loads(PATCH_CONV)
    plan = prog.compile_symbolic("CPU")
    assert plan.multiples == [("IMG", "P", "IMG_P")]
    tf = plan.trusted_from
    for b, q, p, c in [(2, 2, 2, 2), (tf, tf, tf, tf), (tf + 1, tf + 2, tf, 5), (3, 7, tf + 4, 3)]:
        got = _run(prog, {"B": b, "IMG": q * p, "P": p, "C": c})
        assert got == "symbolic" or (min(b, q, p, c) < tf and got.startswith("specialized")), (b, q, p, c, got)
    assert plan.bind(prog, {"B": 3, "IMG": 50, "P": 8, "C": 3})[1].startswith("IMG = 50 is not a multiple of P")
    assert _run(prog, {"B": 2, "IMG": 9, "P": 9, "C": 3}).startswith("specialized: IMG // P = 1 is outside")


def test_sizes_that_are_sums_of_products_divide_and_index():
    b, n, c, f = (SymSize.dim(k, v) for k, v in (("B", 211), ("N", 223), ("C", 227), ("F", 229)))
    t = n * n + 1
    with checked_at(({"B": 211, "N": 223, "C": 227, "F": 229}, {"B": 233, "N": 239, "C": 241, "F": 251})):
        assert (6 * b * c * f * t) // (6 * b * c * t) == f and (b * t * t) // (b * t) == t and (b * f * t) % t == 0
        assert (f * c * t - 1) // (c * t) == f - 1 and (f * c * t - 1) % (c * t) == c * t - 1
        assert (f * c * t + 3) // (c * t) == f and (f * c * t + 3) % (c * t) == 3
        with pytest.raises(tgc.ir.symsize.NotTraceable):  # (not a multiple plus a constant: refused)
            _ = (f * c * t + c) // (c * t)
    prog = tgc.loads(TOKENS)
    plan = prog.compile_symbolic("CPU")
    tf = plan.trusted_from
    for dims in [{"B": 2, "N": 2, "C": 3, "F": 2}, {"B": tf, "N": tf, "C": tf + 1, "F": tf + 2},
                 {"B": 3, "N": tf + 3, "C": 5, "F": 37}]:
        got = _run(prog, dims)
        assert got == "symbolic" or (min(dims.values()) < tf and got.startswith("specialized")), (dims, got)


def test_a_split_reduce_takes_only_divisors_at_every_size_of_the_class():
    q, d = SymSize.dim("Q", 227), SymSize.dim("D", 251)
    assert multiple_at_every_size(2 * q * d, 2) and not multiple_at_every_size(2 * q * d, 251)
    assert multiple_at_every_size(65536 * 3, 256) and not multiple_at_every_size(65537, 2)
    assert _split_size(5 * q * d) == 5  # (251 divides it at the traced sizes, not at every size of the class)
    assert _split_size(1 << 20) == 256  # (a plain int: as before)


def test_an_index_width_check_is_still_worded_as_one():
    m, n, hm, hn = ("M",), ("N",), ("(1*M+0)//2",), ("(1*N+0)//2",)
    t = {tuple(sorted(hm + hn)): 1, tuple(sorted(n + hm)): -1, tuple(sorted(m + hn)): -1, ("M", "N"): 1,
         (): -(2 ** 63 - 1)}
    assert decided_by_remainder([(t, 1)]).startswith("an index width check (whether (M//2)(N//2)")


def _check_f64(prog: tgc.Program, dims: dict[str, int]) -> str:
    """Run symbolically at `dims` against numpy in float64 (these models' outputs reach 1e3-1e4 at random inputs,
    where an f32 reference is itself off by more than its tolerance, and so is the size-specialized run: by
    hand, the symbolic run's error was within 0.3x-4x of it), to 1e-3 of the output's largest magnitude (a
    wrong index is off by about the values themselves)."""
    inputs = random_inputs(prog, dims, seed=sum(dims.values()))
    got = prog.run("CPU", dims=dims, symbolic=True, **inputs)
    want = numpy_program(prog, dims)({k: np.asarray(v, np.float64) for k, v in inputs.items()})
    for name in prog.output_names:
        w = np.asarray(want[name], np.float64)
        err = float(np.abs(np.asarray(got[name], np.float64) - w).max())
        assert got[name].shape == w.shape and err < 1e-3 * max(1.0, float(np.abs(w).max())), (dims, name, err)
    return prog.last_run


@pytest.mark.slow
@pytest.mark.parametrize("model, least, sizes, outside", [
    ("unet_block", 12, [{"B": 12, "CI": 12, "S": 24, "C": 12}],
     ({"B": 2, "CI": 3, "S": 24, "C": 4}, {"S": 25}, "S = 25 is not a multiple of 2")),
    ("vit_block", 12, [{"B": 2, "IMG": 28, "C": 30, "P": 4, "F": 9}, {"B": 12, "IMG": 156, "C": 78, "P": 12, "F": 12}],
     ({"B": 2, "IMG": 28, "C": 30, "P": 4, "F": 9}, {"C": 32}, "C = 32 is not a multiple of 6")),
    ("kv_decode", 8, [{"B": 8, "C": 1024, "KH": 8, "D": 16, "P": 8}, {"B": 9, "C": 1458, "KH": 9, "D": 18, "P": 13}],
     ({"B": 8, "C": 1024, "KH": 8, "D": 16, "P": 8}, {"KH": 7}, "C // D = 64 is not a multiple of KH = 7")),
    ("llama_gqa_block", 8, [{"B": 9, "T": 11, "C": 1458, "KH": 9, "D": 18, "F": 13}],
     ({"B": 8, "T": 8, "C": 1024, "KH": 8, "D": 16, "F": 8}, {"D": 15}, "C = 1024 is not a multiple of D = 15")),
])
def test_corpus_models_have_a_plan_that_matches_numpy(model, least, sizes, outside):
    prog = tgc.load(f"bench/models/{model}.tg")
    plan = prog.compile_symbolic("CPU")
    assert plan.trusted_from == least and plan.multiples
    for dims in sizes:
        assert _check_f64(prog, dims) == "symbolic", dims
    base, change, why = outside
    assert plan.bind(prog, {**base, **change})[1].startswith(why)


def test_a_multiple_of_32_less_a_constant_over_32_and_sums_in_units():
    """`(2 * Q * D - 1) // 32` with D of class 32n is `Q * (D // 32) * 2 - 1` at every size (llama_gqa's D // 2
    of 32n); kernels of a 32n class index with sums of products, each in units (conv2d's padded stride)."""
    q, d = SymSize.dim("Q", 227), SymSize.dim("D", 32 * 229)
    with checked_at(({"Q": 227, "D": 32 * 229}, {"Q": 233, "D": 32 * 239})):
        got = (2 * q * d - 1) // 32
        for qv, dv in [(2, 32), (3, 96), (227, 32 * 229)]:
            assert tgc.ir.symsize._eval(dict(got.terms), {"Q": qv, "D": dv}) == (2 * qv * dv - 1) // 32
        assert (2 * q * d - 1) % 32 == 31


def test_the_bound_is_cut_by_how_far_the_index_passed_64_bits():
    from tgc.api import _smaller_exponent
    assert _smaller_exponent(12, "an index of this kernel ranges over [0, 18889465931341141901312], past 64 "
                                 "bits") == 10  # (kv_decode: 2^74 at 2^12 each; was 2^8)
    assert _smaller_exponent(15, "ranges over [-65536, 9223372036854775808], past 64 bits") == 14
    assert _smaller_exponent(12, "past 64 bits") == 8  # (no range: two thirds, as before)


def test_vit_at_its_width_a_multiple_of_32_runs_the_narrowed_variant():
    """C = 96 of 6 heads (C // 6 = 16) and F = 64: the 32n class narrowed with IMG // P and C // 6 of class n and
    F of 32n, its kernels indexing with sums of products in units."""
    prog = tgc.load("bench/models/vit_block.tg")
    assert _check_f64(prog, {"B": 2, "IMG": 64, "C": 96, "P": 16, "F": 64}) == "symbolic"


def test_the_bound_comes_from_the_products_of_dims_the_kernels_form():
    """Issue 21 (branch symbound): the bound was 2^(62 // k) for k dims, so six dims served sizes up to 1024 although
    no index multiplies more than two of them. Now `sizes.fitted_bound` sets it from the index values the kernels
    form (2^15 here, the first bound tried where 2^(62 // k) is less), and the dims run at sizes above the old
    bound, right."""
    prog = tgc.loads("x: f32[A, B]\ny: f32[C, D]\nz: f32[E, F]\nreturn x * 2.0, y + 1.0, z.sum(axis=1)")
    plan = prog.compile_symbolic("CPU")
    assert plan.bound == 2 ** 15 > sizes.var_bound(6), plan.bound
    rng = np.random.default_rng(3)
    dims = {"A": 1500, "B": 3, "C": 2, "D": 1111, "E": 1025, "F": 7}
    x, y, z = (rng.standard_normal(s).astype(np.float32) for s in [(1500, 3), (2, 1111), (1025, 7)])
    out = prog.run("CPU", dims=dims, symbolic=True, x=x, y=y, z=z)
    assert prog.last_run == "symbolic", prog.last_run
    np.testing.assert_array_equal(out["out0"], x * 2)
    np.testing.assert_array_equal(out["out1"], y + 1)
    np.testing.assert_allclose(out["out2"], z.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_a_product_of_many_dims_keeps_a_small_bound_and_other_dims_are_raised():
    """An index over x: [A, B, C, D, E, F] multiplies six dims: the common bound stays 2^10 (2^60 elements), and a
    size above a dim's bound falls back to size-specialized kernels, saying why, with the right result. Raised
    one bit at a time in name order while x's index stays within 2^62: A and B to 2^11, the others not; G, which
    forms no product with them, to 2^15 (`SymbolicPlan.dim_bounds`), and runs symbolically above 2^10."""
    prog = tgc.loads("x: f32[A, B, C, D, E, F]\nw: f32[G]\nreturn x.sum(axis=0) * 2.0, w * 3.0")
    plan = prog.compile_symbolic("CPU")
    assert plan.bound == 2 ** 10 and plan.dim_bounds == {"A": 2 ** 11, "B": 2 ** 11, "G": 2 ** 15}, \
        (plan.bound, plan.dim_bounds)
    small = dict.fromkeys("ABCDEFG", 2)
    for n, v, hi in (("A", 2049, 2048), ("C", 1025, 1024), ("F", 1025, 1024), ("G", 32769, 32768)):
        assert plan.bind(prog, {**small, n: v})[1] == f"dim {n} = {v} is outside the symbolic kernels' range 2..{hi}"
    rng = np.random.default_rng(4)
    for dims, how in (({"A": 3, "B": 2, "C": 5, "D": 2, "E": 3, "F": 2, "G": 5000}, "symbolic"),
                      ({"A": 1100, "B": 2, "C": 3, "D": 2, "E": 2, "F": 2, "G": 9}, "symbolic"),
                      ({"A": 2, "B": 3, "C": 1100, "D": 2, "E": 2, "F": 2, "G": 9},
                       "specialized: dim C = 1100 is outside the symbolic kernels' range 2..1024")):
        x = rng.standard_normal([dims[n] for n in "ABCDEF"]).astype(np.float32)
        w = rng.standard_normal(dims["G"]).astype(np.float32)
        out = prog.run("CPU", dims=dims, symbolic=True, x=x, w=w)
        assert prog.last_run == how, prog.last_run
        np.testing.assert_allclose(out["out0"], x.astype(np.float64).sum(axis=0) * 2, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out["out1"], w * 3)


@pytest.mark.slow
def test_a_class_whose_probes_pass_a_package_is_left_out_not_a_crash():
    # the stride-P convolution's narrowed 32n variant is built at probes (IMG_P, P ~ 7000 each) where the input's
    # size passes 2^62: `tgc compile --package` stopped with "size: the size is out of range" and wrote nothing.
    # Now that class is listed as not packaged and the others run, right against numpy
    from tgc import package

    data = package.build_symbolic(tgc.loads(PATCH_CONV), tgc.api._device("CPU"))
    pkg = package.loads_package(data, "patch.tgpkg")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    want = np.einsum("bchpwq,kcpq->bkhw", x.astype(np.float64).reshape(2, 3, 4, 3, 4, 3), w.astype(np.float64))
    np.testing.assert_allclose(pkg.run(x=x, w=w)["out0"], want, rtol=1e-4, atol=1e-4)


def test_a_raised_dim_bound_is_capped_by_a_slice_at_a_constant():
    # six dims hold the common bound at 2^10 and G alone is raised (only `w` has it); `w[:2000]` is all of w only
    # up to G = 2000, a decision that caps the bounds: the raised G kept 2^15 and G = 2001 ran the class's
    # kernels, summing all of w (and `w[-3000:]` gave G elements) with no error
    prog = tgc.loads("x: f32[A, B, C, D, E, F]\nw: f32[G]\nreturn x.sum(axis=0) * 2.0, w[:2000].sum(), "
                     "w[-3000:] * 3.0\n")
    plan = prog.compile_symbolic("CPU")
    assert plan.bound < 2000 and all(b < 2000 for b in plan.dim_bounds.values()), plan.dim_bounds
    rng = np.random.default_rng(0)
    for g in (1500, 2001, 3001):
        dims = dict.fromkeys("ABCDEF", 6) | {"G": g}
        x = rng.standard_normal([6] * 6).astype(np.float32)
        w = rng.standard_normal(g).astype(np.float32)
        out = prog.run("CPU", dims=dims, symbolic=True, x=x, w=w)
        np.testing.assert_allclose(out["out1"], w[:2000].astype(np.float64).sum(), rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(out["out2"], w[-3000:] * 3.0, rtol=1e-6)
        assert g == 1500 and prog.last_run == "symbolic" or "outside the symbolic kernels' range" in prog.last_run
