"""More ONNX ops, registered into `OPS`: Compress (a load-time condition), ReverseSequence, Det (up to 4x4),
MaxUnpool, GridSample, Col2Im, TensorScatter, TfIdfVectorizer, DeformConv and the Optional ops on plain tensors.

Contract (ONNX's semantics): Compress keeps the slices whose condition is true along `axis` (the flattened input
without one); its condition decides the output's shape, so it must be a load-time constant (`NeedStatic`).
ReverseSequence reverses the first `sequence_lens[b]` steps of each batch entry along `time_axis`. Det is the
determinant of the last two axes by cofactor expansion (matrices up to 4x4; larger ones are refused). MaxUnpool
scatters each value to its flat index in the output (`output_shape`, else the default unpooled shape; small
tensors only: every output position is compared with every index). GridSample (2-d and 3-d; nearest, linear and
cubic; zeros, border and reflection padding; align_corners) follows ONNX's reference: each tap's index and weight
are tensors computed from the grid, the input gathered once per tap (2^n taps linear, 4^n cubic).
"""

from __future__ import annotations

import itertools

import numpy as np

from tgc.dtype import dtypes
from tgc.onnx.core import shape_text
from tgc.onnx.ops import _axis, _cast, _const, op


@op("Compress")
def _compress(cx, node, ins, at, opset):
    x, cond = ins
    keep = np.nonzero(np.asarray(cx.static(cond, "the condition")).reshape(-1))[0]
    e = cx.tensor(x)
    if "axis" not in at:
        e, ax, n = f"reshape({e}, (-1,))", 0, int(np.prod(x.shape))
    else:
        ax = _axis(int(at["axis"]), x.rank)
        n = x.shape[ax]
    keep = keep[keep < n]
    if len(keep) == 0:
        raise cx.unsupported("a condition that keeps nothing (an empty output)")
    idx = cx.tensor(_const(keep.astype(np.int64), dtypes.i64, "keep"))
    return [f"take({e}, {idx}, axis={ax})"]


@op("ReverseSequence")
def _reverse_sequence(cx, node, ins, at, opset):
    x, lens = ins
    t_ax, b_ax = int(at.get("time_axis", 0)), int(at.get("batch_axis", 1))
    steps, batch = x.shape[t_ax], x.shape[b_ax]
    shape = [1] * x.rank
    shape[t_ax], shape[b_ax] = steps, batch
    t = f"reshape(arange({steps}), {shape_text([steps if i == t_ax else 1 for i in range(x.rank)])})"
    n = f"reshape(cast({cx.tensor(lens)}, i32), {shape_text([batch if i == b_ax else 1 for i in range(x.rank)])})"
    src = cx.let(f"expand(clip(where({t} < {n}, {n} - 1 - {t}, {t}), 0, {steps - 1}), {shape_text(x.shape)})",
                 "src")
    return [f"gather({cx.tensor(x)}, {t_ax}, {src})"]


def _det_terms(m: list[list[str]]) -> str:
    """The determinant of a small matrix of expressions, by cofactor expansion along the first row."""
    n = len(m)
    if n == 1:
        return m[0][0]
    if n == 2:
        return f"({m[0][0]} * {m[1][1]} - {m[0][1]} * {m[1][0]})"
    terms = []
    for j in range(n):
        minor = [row[:j] + row[j + 1:] for row in m[1:]]
        terms.append(f"{'-' if j % 2 else '+'} {m[0][j]} * {_det_terms(minor)}")
    return "(" + " ".join(terms).lstrip("+ ") + ")"


@op("Det")
def _det(cx, node, ins, at, opset):
    x = ins[0]
    n = x.shape[-1]
    if not isinstance(n, int) or n > 4:
        raise cx.unsupported(f"a {n}x{n} determinant (tgc expands up to 4x4)")
    e = cx.tensor(x)
    m = [[cx.let(f"{e}[..., {i}, {j}]", "m") for j in range(n)] for i in range(n)]
    return [_cast(_det_terms(m), x.dtype)]


@op("MaxUnpool")
def _max_unpool(cx, node, ins, at, opset):
    x, idx = ins[0], ins[1]
    shape_in = ins[2] if len(ins) > 2 and ins[2] is not None else None
    if shape_in is not None:
        out = [int(s) for s in cx.static(shape_in, "the output shape").reshape(-1)]
    else:
        k = list(at["kernel_shape"])
        s = list(at.get("strides", [1] * len(k)))
        p = list(at.get("pads", [0] * 2 * len(k)))
        sp = [(d - 1) * st + kk - p[i] - p[i + len(k)] for i, (d, st, kk) in enumerate(zip(x.shape[2:], s, k))]
        out = [x.shape[0], x.shape[1], *sp]
    total = int(np.prod(out))
    if total * int(np.prod(x.shape)) > 1 << 24:
        raise cx.unsupported("an unpooling this large (tgc compares every output position with every index)")
    flat_x = f"reshape({cx.tensor(x)}, (-1,))"
    # each output position: the value whose index points at it (indices count within the whole tensor)
    flat_i = f"reshape(cast({cx.tensor(idx)}, i64), (1, -1))"
    pos = f"reshape(arange({total}), ({total}, 1))"
    hit = cx.let(f"cast({pos}, i64) == {flat_i}", "hit")
    y = f"sum(where({hit}, reshape({flat_x}, (1, -1)), 0), axis=1)"
    return [f"reshape({_cast(y, x.dtype)}, {shape_text(out)})"]



# --- GridSample: every tap's index and weight as tensors, one gather per tap ------------------------------------

def _reflect(v: str, lo: float, hi: float) -> str:
    """ONNX GridSample's reflection of coordinate `v` into [lo, hi] (by the near border, as often as needed)."""
    rng = hi - lo
    below, above = f"({lo} - {v})", f"({v} - {hi})"

    def fold(dx: str, start: float, end: float) -> str:
        """`dx` past the border `start`: an even number of ranges past lands `r` in from `start`, odd from `end`."""
        n = f"trunc({dx} / {rng})"
        r = f"({dx} - {n} * {rng})"
        even = f"(({n} - 2.0 * floor({n} / 2.0)) == 0.0)"
        inward = "+" if start < end else "-"
        outward = "-" if start < end else "+"
        return f"where({even}, {start} {inward} {r}, {end} {outward} {r})"
    return f"where({v} < {lo}, {fold(below, lo, hi)}, where({v} > {hi}, {fold(above, hi, lo)}, {v}))"


def _cubic(t: str) -> list[str]:
    a = -0.75
    x1, x2 = f"({t} + 1.0)", f"(1.0 - {t})"
    x3 = f"(2.0 - {t})"
    return [f"((({a} * {x1} - {5 * a}) * {x1} + {8 * a}) * {x1} - {4 * a})",
            f"(({a + 2} * {t} - {a + 3}) * {t} * {t} + 1.0)",
            f"(({a + 2} * {x2} - {a + 3}) * {x2} * {x2} + 1.0)",
            f"((({a} * {x3} - {5 * a}) * {x3} + {8 * a}) * {x3} - {4 * a})"]


@op("GridSample")
def _grid_sample(cx, node, ins, at, opset):
    x, grid = ins
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(at.get("mode", "linear" if opset >= 20 else "bilinear"),
                                                          at.get("mode", "linear" if opset >= 20 else "bilinear"))
    pad_mode = at.get("padding_mode", "zeros")
    align = bool(at.get("align_corners", 0))
    if mode not in ("nearest", "linear", "cubic") or pad_mode not in ("zeros", "border", "reflection"):
        raise cx.unsupported(f"mode {mode} with padding_mode {pad_mode}")
    nd = x.rank - 2
    n, c = x.shape[0], x.shape[1]
    dims = [int(s) for s in x.shape[2:]]
    out = [int(s) for s in grid.shape[1:-1]]
    q = int(np.prod(out))
    eg = cx.let(f"cast({cx.tensor(grid)}, f32)", "grid")
    coords = []
    for i, length in enumerate(dims):  # the grid's last axis is (x, y[, z]): the spatial axes reversed
        g = f"reshape({eg}[..., {nd - 1 - i}], ({n}, 1, {q}))"
        v = f"(({g} + 1.0) / 2.0 * {length - 1})" if align else f"((({g} + 1.0) * {length} - 1.0) / 2.0)"
        if mode == "nearest":
            v = f"round({v})"
        lo, hi = (0.0, length - 1.0) if align else (-0.5, length - 0.5)
        if pad_mode == "border":
            v = f"where(({v} < {lo}) | ({v} > {hi}), clip({v}, 0.0, {length - 1.0}), {v})"
        elif pad_mode == "reflection":
            v = _reflect(cx.let(v, "gs_v"), lo, hi)
        coords.append((cx.let(v, "gs_coord"), length, lo, hi))
    taps_per_axis = []
    for v, length, lo, hi in coords:
        if mode == "nearest":
            taps = [(f"cast({v}, i32)", "1.0")]
        else:
            base = cx.let(f"floor({v})", "gs_floor")
            t = cx.let(f"({v} - {base})", "gs_t")
            first = f"cast({base}, i32)"
            if mode == "linear":
                taps = [(first, f"(1.0 - {t})"), (f"({first} + 1)", t)]
            else:
                taps = [(f"({first} + {k - 1})", w) for k, w in enumerate(_cubic(t))]
        fixed = []
        for idx, w in taps:
            idx = cx.let(idx, "gs_i")
            if pad_mode == "zeros":
                ok = f"(({idx} >= 0) & ({idx} < {length}))"
                w = f"where({ok}, {w}, 0.0)"
                idx = f"clip({idx}, 0, {length - 1})"
            elif pad_mode == "border":
                idx = f"clip({idx}, 0, {length - 1})"
            else:
                idx = f"clip(cast({_reflect(f'cast({idx}, f32)', lo, hi)}, i32), 0, {length - 1})"
            fixed.append((cx.let(idx, "gs_idx"), cx.let(w, "gs_w")))
        taps_per_axis.append(fixed)
    flat = cx.let(f"reshape(cast({cx.tensor(x)}, f32), ({n}, {c}, {int(np.prod(dims))}))", "gs_x")
    strides = [int(np.prod(dims[i + 1:])) for i in range(nd)]
    terms = []
    for combo in itertools.product(*taps_per_axis):
        index = " + ".join(f"{idx} * {st}" for (idx, _), st in zip(combo, strides))
        weight = " * ".join(w for _, w in combo)
        val = f"gather({flat}, 2, expand({index}, ({n}, {c}, {q})))"
        terms.append(f"{val} * {weight}")
    acc = cx.let(" + ".join(terms), "gs_sum")
    return [_cast(f"reshape({acc}, {shape_text([n, c, *out])})", x.dtype)]


@op("Col2Im")
def _col2im(cx, node, ins, at, opset):
    """Each block offset's column values spread by the strides and shifted by the offset into the padded image,
    summed; the pads cropped."""
    x = ins[0]
    image = [int(v) for v in np.asarray(cx.static(ins[1], "the image shape")).reshape(-1)]
    block = [int(v) for v in np.asarray(cx.static(ins[2], "the block shape")).reshape(-1)]
    nd = len(image)
    dil = list(at.get("dilations", [1] * nd))
    st = list(at.get("strides", [1] * nd))
    pads = list(at.get("pads", [0] * 2 * nd))
    n, ck = x.shape[0], x.shape[1]
    kprod = int(np.prod(block))
    c = ck // kprod
    padded = [image[i] + pads[i] + pads[i + nd] for i in range(nd)]
    outs = [(padded[i] - (dil[i] * (block[i] - 1) + 1)) // st[i] + 1 for i in range(nd)]
    cols = cx.let(f"reshape({cx.tensor(x)}, {shape_text([n, c, kprod, *outs])})", "cols")
    terms = []
    for flat, offs in enumerate(itertools.product(*[range(k) for k in block])):
        v = f"{cols}[:, :, {flat}]"  # (N, C, *outs)
        for a in range(nd):
            ax = 2 + a
            if st[a] > 1:  # spread along the axis: each value followed by stride - 1 zeros
                shape = [n, c, *[outs[i] * st[i] if i < a else outs[i] for i in range(nd)]]
                grown = shape[:ax + 1] + [1] + shape[ax + 1:]
                spread = shape[:ax] + [outs[a] * st[a]] + shape[ax + 1:]
                pad_spec = ", ".join(["(0, 0)"] * (ax + 1) + [f"(0, {st[a] - 1})"] + ["(0, 0)"] * (nd - a - 1))
                v = f"reshape(pad(reshape({v}, {shape_text(grown)}), ({pad_spec},)), {shape_text(spread)})"
        span = [(outs[i] - 1) * st[i] + 1 for i in range(nd)]
        crop = ", ".join([":", ":"] + [f"0:{s}" for s in span])
        before = [offs[i] * dil[i] for i in range(nd)]
        pad_spec = ", ".join(["(0, 0)", "(0, 0)"] + [f"({before[i]}, {padded[i] - before[i] - span[i]})"
                                                      for i in range(nd)])
        terms.append(cx.let(f"pad({v}[{crop}], ({pad_spec},))", "col2im_tap"))
    acc = cx.let(" + ".join(terms), "col2im")
    crop = ", ".join([":", ":"] + [f"{pads[i]}:{pads[i] + image[i]}" for i in range(nd)])
    return [_cast(f"{acc}[{crop}]", x.dtype)]


@op("TensorScatter")
def _tensor_scatter(cx, node, ins, at, opset):
    """The cache with each batch entry's update written along `axis` from its write index (`circular`: wrapping
    around the cache's length)."""
    cache, update = ins[0], ins[1]
    where_to = ins[2] if len(ins) > 2 and ins[2] is not None else None
    ax = _axis(int(at.get("axis", -2)), cache.rank)
    mode = at.get("mode", "linear")
    if mode not in ("linear", "circular"):
        raise cx.unsupported(f"mode {mode}")
    size, seq, batch = cache.shape[ax], update.shape[ax], cache.shape[0]
    j = f"reshape(arange({size}), {shape_text([size if i == ax else 1 for i in range(cache.rank)])})"
    start = "0"
    if where_to is not None:
        start = f"reshape(cast({cx.tensor(where_to)}, i32), {shape_text([batch] + [1] * (cache.rank - 1))})"
    off = f"({j} - {start})"
    if mode == "circular":
        off = f"(({off} % {size} + {size}) % {size})"
    off = cx.let(off, "ts_off")
    inside = cx.let(f"({off} >= 0) & ({off} < {seq})", "ts_in")
    idx = f"expand(clip({off}, 0, {seq - 1}), {shape_text(cache.shape)})"
    return [f"where({inside}, gather({cx.tensor(update)}, {ax}, {idx}), {cx.tensor(cache)})"]


@op("TfIdfVectorizer")
def _tfidf(cx, node, ins, at, opset):
    """Each n-gram of the pool (integer pools) counted in each row, for every skip distance up to max_skip_count
    (unigrams once), then weighted (TF, IDF or TFIDF) into its column `ngram_indexes` names."""
    x = ins[0]
    if "pool_strings" in at:
        raise cx.unsupported("string pools")
    lo, hi, skip = int(at["min_gram_length"]), int(at["max_gram_length"]), int(at["max_skip_count"])
    mode = at["mode"]
    counts, indexes, pool = list(at["ngram_counts"]), list(at["ngram_indexes"]), list(at["pool_int64s"])
    weights = list(at.get("weights", []))
    rows = cx.tensor(x) if x.rank == 2 else f"reshape({cx.tensor(x)}, (1, {x.shape[0]}))"
    t = x.shape[-1]
    grams = []
    for size, start in enumerate(counts, start=1):
        end = counts[size] if size < len(counts) else len(pool)
        grams += [tuple(pool[i:i + size]) for i in range(start, end, size)]
    width = max(indexes) + 1
    cols: list[str | None] = [None] * width
    for g, col in zip(grams, indexes):
        n = len(g)
        if not lo <= n <= hi:
            continue
        terms = []
        for step in ([1] if n == 1 else range(1, skip + 2)):
            span = (n - 1) * step + 1
            if span > t:
                continue
            hits = " & ".join(f"({rows}[:, {j * step}:{j * step + t - span + 1}] == {tok})" for j, tok in enumerate(g))
            terms.append(f"sum(cast({hits}, f32), axis=1)")
        if terms:
            cols[col] = " + ".join(terms)
    b = x.shape[0] if x.rank == 2 else 1
    zero = f"full(({b},), 0.0, dtype=f32)"
    out = []
    for i, e in enumerate(cols):
        e = e or zero
        w = float(weights[i]) if i < len(weights) else 1.0
        if mode == "IDF":
            e = f"where(({e}) > 0, {w}, 0.0)"
        elif mode == "TFIDF" and weights:
            e = f"(({e}) * {w})"
        elif mode not in ("TF", "TFIDF", "IDF"):
            raise cx.unsupported(f"mode {mode}")
        out.append(e)
    y = cx.let(f"stack({', '.join(out)}, axis=1)", "tfidf")
    return [y if x.rank == 2 else f"reshape({y}, ({width},))"]


@op("DeformConv")
def _deform_conv(cx, node, ins, at, opset):
    """A 2-d deformable convolution: each kernel tap samples the input bilinearly (zeros outside) at its place
    moved by the offsets (per offset group), times the mask; the samples are then contracted with the weights
    per group as one batched matrix product."""
    x, w, offset = ins[0], ins[1], ins[2]
    bias = ins[3] if len(ins) > 3 and ins[3] is not None else None
    mask = ins[4] if len(ins) > 4 and ins[4] is not None else None
    if x.rank != 4:
        raise cx.unsupported(f"a {x.rank - 2}-d deformable convolution (2-d only)")
    n, c, h, wd = (int(s) for s in x.shape)
    oc, kh, kw = int(w.shape[0]), int(w.shape[2]), int(w.shape[3])
    sh, sw = at.get("strides", [1, 1])
    dh, dw = at.get("dilations", [1, 1])
    pt, pl = at.get("pads", [0, 0, 0, 0])[:2]
    groups, og = int(at.get("group", 1)), int(at.get("offset_group", 1))
    oh, ow = int(offset.shape[2]), int(offset.shape[3])
    k, q, cg = kh * kw, oh * ow, c // og
    ex = cx.let(f"cast({cx.tensor(x)}, f32)", "dc_x")
    eo = cx.let(f"reshape(cast({cx.tensor(offset)}, f32), ({n}, {og}, {k}, 2, {q}))", "dc_off")
    em = cx.let(f"reshape(cast({cx.tensor(mask)}, f32), ({n}, {og}, {k}, {q}))", "dc_mask") if mask else None
    rows = f"reshape(cast(arange({oh}), f32), (1, {oh}, 1))"
    cols = f"reshape(cast(arange({ow}), f32), (1, 1, {ow}))"
    per_group = []
    for g in range(og):
        flat = cx.let(f"reshape({ex}[:, {g * cg}:{(g + 1) * cg}], ({n}, {cg}, {h * wd}))", "dc_xg")
        taps = []
        for t, (i, j) in enumerate(itertools.product(range(kh), range(kw))):
            base_y = f"reshape({rows} * {sh} + {i * dh - pt}, (1, {oh}, 1))"
            base_x = f"reshape({cols} * {sw} + {j * dw - pl}, (1, 1, {ow}))"
            y = cx.let(f"reshape(expand({base_y}, (1, {oh}, {ow})), (1, {q})) + {eo}[:, {g}, {t}, 0]", "dc_y")
            xx = cx.let(f"reshape(expand({base_x}, (1, {oh}, {ow})), (1, {q})) + {eo}[:, {g}, {t}, 1]", "dc_xx")
            y0, x0 = cx.let(f"floor({y})", "dc_y0"), cx.let(f"floor({xx})", "dc_x0")
            ty, tx = cx.let(f"({y} - {y0})", "dc_ty"), cx.let(f"({xx} - {x0})", "dc_tx")
            acc = []
            for yy, wy in ((y0, f"(1.0 - {ty})"), (f"({y0} + 1.0)", ty)):
                for xc, wx in ((x0, f"(1.0 - {tx})"), (f"({x0} + 1.0)", tx)):
                    ok = f"(({yy} >= 0.0) & ({yy} < {h}.0) & ({xc} >= 0.0) & ({xc} < {wd}.0))"
                    idx = (f"reshape(cast(clip({yy}, 0.0, {h - 1}.0) * {wd} + clip({xc}, 0.0, {wd - 1}.0), i32), "
                           f"({n}, 1, {q}))")
                    val = f"gather({flat}, 2, expand({idx}, ({n}, {cg}, {q})))"
                    acc.append(f"{val} * reshape(where({ok}, {wy} * {wx}, 0.0), ({n}, 1, {q}))")
            s = " + ".join(acc)
            if em:
                s = f"({s}) * reshape({em}[:, {g}, {t}], ({n}, 1, {q}))"
            taps.append(cx.let(s, "dc_tap"))
        per_group.append(f"stack({', '.join(taps)}, axis=2)")  # (N, Cg, K, Q)
    samples = cx.let(f"cat({', '.join(per_group)}, axis=1)" if og > 1 else per_group[0], "dc_samples")
    ck = (c // groups) * k
    s4 = f"reshape({samples}, ({n}, {groups}, {ck}, {q}))"
    w4 = f"reshape(cast({cx.tensor(w)}, f32), (1, {groups}, {oc // groups}, {ck}))"
    y = f"reshape({w4} @ {s4}, ({n}, {oc}, {oh}, {ow}))"
    if bias is not None:
        y = f"({y} + reshape(cast({cx.tensor(bias)}, f32), (1, {oc}, 1, 1)))"
    return [_cast(y, x.dtype)]


@op("OptionalHasElement")
def _optional_has_element(cx, node, ins, at, opset):
    """Tensors only (tgc has no optional or sequence values): an input is present or it is not, at load time."""
    present = bool(ins) and ins[0] is not None
    return [_const(np.array(present), dtypes.bool, node.output[0])]


@op("OptionalGetElement")
def _optional_get_element(cx, node, ins, at, opset):
    if not ins or ins[0] is None:
        raise cx.unsupported("an empty optional")
    v = ins[0]
    return [v if v.expr is None else cx.tensor(v)]


@op("DFT")
def _dft(cx, node, ins, at, opset):
    """The DFT along one axis as products with cos/sin matrices computed at load (the length is static): forward,
    inverse (divided by the length), one-sided, and the inverse of a one-sided spectrum (irfft: real output)."""
    x = ins[0]
    length = ins[1] if len(ins) > 1 and ins[1] is not None else None
    if opset >= 20:
        axis = int(np.asarray(cx.static(ins[2], "the axis")).reshape(-1)[0]) if len(ins) > 2 and ins[2] else -2
    else:
        axis = int(at.get("axis", 1))
    inverse, onesided = bool(at.get("inverse", 0)), bool(at.get("onesided", 0))
    rank = x.rank
    ax = axis % rank
    if ax == rank - 1:
        raise cx.unsupported("a DFT along the real/imaginary axis")
    size = int(x.shape[ax])
    if length is not None:
        n_fft = int(np.asarray(cx.static(length, "the DFT length")).reshape(-1)[0])
    else:
        n_fft = 2 * (size - 1) if inverse and onesided else size
    work = "f64"  # (the reference's FFT is exact to f64: products with f32 matrices miss small outputs' atol)
    e = cx.tensor(x)
    last = rank - 2  # the signal's last axis (before the real/imaginary one)
    order = [i for i in range(rank - 1) if i != ax] + [ax]
    back = [order.index(i) for i in range(rank - 1)]

    def part(i: int) -> str:
        p = f"cast({e}[..., {i}], {work})"
        return p if ax == last else f"permute({p}, {shape_text(order)})"
    xr = cx.let(part(0), "dft_re")
    xi = cx.let(part(1), "dft_im") if x.shape[-1] == 2 else None
    npdt = np.float64 if work == "f64" else np.float32

    def mat(a: np.ndarray, name: str) -> str:
        return cx.tensor(_const(a.astype(npdt), dtypes.f64 if work == "f64" else dtypes.f32, name))
    if inverse and onesided:  # irfft: the first n_fft // 2 + 1 frequencies, Hermitian symmetry, a real signal
        k = np.arange(min(size, n_fft // 2 + 1))[:, None]
        n = np.arange(n_fft)[None, :]
        weight = np.where((k == 0) | ((n_fft % 2 == 0) & (k == n_fft // 2)), 1.0, 2.0) / n_fft
        theta = 2 * np.pi * k * n / n_fft
        rows = f"{xr}[..., 0:{k.shape[0]}]"
        y = f"({rows} @ {mat(weight * np.cos(theta), 'irfft_cos')})"
        if xi is not None:
            y = f"({y} - {xi}[..., 0:{k.shape[0]}] @ {mat(weight * np.sin(theta), 'irfft_sin')})"
        y = cx.let(y, "dft_out")
        if ax != last:
            y = f"permute({y}, {shape_text(back)})"
        return [f"cast(unsqueeze({y}, -1), {x.dtype.name})"]
    used = min(size, n_fft)
    k_out = n_fft // 2 + 1 if onesided else n_fft
    n = np.arange(used)[:, None]
    k = np.arange(k_out)[None, :]
    theta = 2 * np.pi * n * k / n_fft
    scale = 1.0 / n_fft if inverse else 1.0
    c, s = mat(np.cos(theta) * scale, "dft_cos"), mat(np.sin(theta) * scale, "dft_sin")
    sign = "+" if inverse else "-"
    re_in = f"{xr}[..., 0:{used}]"
    yr = f"({re_in} @ {c})"
    yi = f"({sign}({re_in} @ {s}))"
    if xi is not None:
        im_in = f"{xi}[..., 0:{used}]"
        yr = f"({yr} {'-' if inverse else '+'} {im_in} @ {s})"
        yi = f"({im_in} @ {c} {sign} {re_in} @ {s})"
    yr, yi = cx.let(yr, "dft_yr"), cx.let(yi, "dft_yi")
    if ax != last:
        yr, yi = f"permute({yr}, {shape_text(back)})", f"permute({yi}, {shape_text(back)})"
    return [f"cast(stack({yr}, {yi}, axis=-1), {x.dtype.name})"]
