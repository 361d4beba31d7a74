"""ONNX's recurrent ops RNN, LSTM and GRU, registered into `OPS`: unrolled over the (static) sequence length.

Contract (ONNX's semantics): gate orders RNN `i`, LSTM `iofc` (peepholes `iof`), GRU `zrh`; directions forward,
reverse and bidirectional; `layout` 0 (sequence first) or 1 (batch first); `sequence_lens` (a batch's steps past
its length leave its state as it was and its outputs zero; a reverse pass starts at its last valid step);
`clip` bounds every activation's input; `activations` with their alpha/beta consumed in order; LSTM's
`input_forget` couples the forget gate to the input gate; GRU's `linear_before_reset`. The input projection
of every step is one matrix product before the loop; each step is one product with R and the gate math.
"""

from __future__ import annotations

from typing import Any

from tgc.onnx.core import Ctx, Value, shape_text
from tgc.onnx.ops import _SOFTPLUS, _num, op

# activation -> (format, uses alpha, uses beta, default alpha, default beta)
_ACTS = {"Sigmoid": ("sigmoid({x})", 0), "Tanh": ("tanh({x})", 0), "Relu": ("relu({x})", 0),
         "Softsign": ("({x} / (1 + abs({x})))", 0), "Softplus": (_SOFTPLUS.format("{x}"), 0),
         "Affine": ("({a} * {x} + {b})", 2), "LeakyRelu": ("where({x} < 0, {a} * {x}, {x})", 1),
         "ThresholdedRelu": ("where({x} > {a}, {x}, 0)", 1), "ScaledTanh": ("({a} * tanh({b} * {x}))", 2),
         "HardSigmoid": ("maximum(0, minimum(1, {a} * {x} + {b}))", 2),
         "Elu": ("where({x} < 0, {a} * (exp({x}) - 1), {x})", 1)}
_DEFAULT_AB = {"Affine": (1.0, 0.0), "LeakyRelu": (0.01, 0.0), "ThresholdedRelu": (1.0, 0.0),
               "ScaledTanh": (1.0, 1.0), "HardSigmoid": (0.2, 0.5), "Elu": (1.0, 0.0)}
_DEFAULTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _activations(cx: Ctx, kind: str, at: dict, dirs: int, dt: Any) -> list[list]:
    """Per direction, the activation functions as callables of one expression."""
    names = [n.decode() if isinstance(n, bytes) else n for n in at.get("activations", [])]
    per = len(_DEFAULTS[kind])
    if not names:
        names = _DEFAULTS[kind] * dirs
    if len(names) != per * dirs:
        raise cx.unsupported(f"{len(names)} activations for {dirs} direction(s)")
    alphas, betas = list(at.get("activation_alpha", [])), list(at.get("activation_beta", []))
    out = []
    for name in names:
        key = next((k for k in _ACTS if k.lower() == name.lower()), None)
        if key is None:
            raise cx.unsupported(f"activation {name}")
        fmt, params = _ACTS[key]
        a, b = _DEFAULT_AB.get(key, (0.0, 0.0))
        if params >= 1 and alphas:
            a = alphas.pop(0)
        if params >= 2 and betas:
            b = betas.pop(0)

        def fn(x: str, fmt: str = fmt, a: float = a, b: float = b) -> str:
            return fmt.format(x=x, a=_num(float(a), dt), b=_num(float(b), dt))
        out.append(fn)
    return [out[d * per:(d + 1) * per] for d in range(dirs)]


@op("RNN", "GRU", "LSTM")
def _recurrent(cx, node, ins, at, opset):
    kind = node.op_type
    ins = list(ins) + [None] * 8
    x, w, r, bias, seq_lens, h0 = ins[:6]
    c0, peep = (ins[6], ins[7]) if kind == "LSTM" else (None, None)
    direction = at.get("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    layout = int(at.get("layout", 0))
    hid = int(at.get("hidden_size", w.shape[1] // _GATES[kind]))
    dt = x.dtype
    clip = at.get("clip")
    acts = _activations(cx, kind, at, dirs, dt)
    ex = cx.tensor(x)
    if layout:
        ex = cx.let(f"permute({ex}, (1, 0, 2))", "x_seq")
    steps, batch = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
    if not isinstance(steps, int):
        raise cx.need_dims("its sequence length (the loop is unrolled)")
    g = _GATES[kind]
    ew, er = cx.tensor(w), cx.tensor(r)
    eb = cx.tensor(bias) if bias is not None else None
    lens = cx.tensor(seq_lens) if seq_lens is not None else None

    def init(v: Value | None, d: int) -> str:
        if v is None:
            return cx.let(f"full({shape_text((batch, hid))}, 0, dtype={dt.name})", "h0")
        e = cx.tensor(v)
        return f"permute({e}, (1, 0, 2))[{d}]" if layout else f"{e}[{d}]"

    def clipped(e: str) -> str:
        if clip is None:
            return e
        c = _num(float(clip), dt)
        return f"clip({e}, -{c}, {c})"

    outs_per_dir: list[list[str]] = []
    last_h, last_c = [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        f = acts[d]
        xw = cx.let(f"({ex} @ permute({ew}[{d}], (1, 0)))", "xw")  # (T, B, g*H)
        if eb is not None:
            xw = cx.let(f"({xw} + {eb}[{d}][0:{g * hid}])", "xwb")
        rb = f"{eb}[{d}][{g * hid}:{2 * g * hid}]" if eb is not None else None
        rt = cx.let(f"permute({er}[{d}], (1, 0))", "rt")  # (H, g*H)
        h = cx.let(init(h0, d), "h")
        c = cx.let(init(c0, d), "c") if kind == "LSTM" else None
        ys: list[str | None] = [None] * steps
        order = range(steps - 1, -1, -1) if reverse else range(steps)
        for t in order:
            xt = f"{xw}[{t}]"
            if kind == "RNN":
                hr = f"({h} @ {rt})" + (f" + {rb}" if rb else "")
                h_new = cx.let(f[0](clipped(f"({xt} + {hr})")), "h")
            elif kind == "GRU":
                def part(e: str, k: int) -> str:
                    return f"{e}[:, {k * hid}:{(k + 1) * hid}]"
                hr = cx.let(f"({h} @ {rt})" + (f" + {rb}" if rb else ""), "hr")
                z = cx.let(f[0](clipped(f"({part(xt, 0)} + {part(hr, 0)})")), "z")
                rg = cx.let(f[0](clipped(f"({part(xt, 1)} + {part(hr, 1)})")), "r")
                if at.get("linear_before_reset", 0):
                    cand = f"({part(xt, 2)} + {rg} * {part(hr, 2)})"
                else:
                    rh = f"(({rg} * {h}) @ {rt}[:, {2 * hid}:{3 * hid}])"
                    cand = f"({part(xt, 2)} + {rh}" + (f" + {rb}[{2 * hid}:{3 * hid}])" if rb else ")")
                hh = cx.let(f[1](clipped(cand)), "hh")
                h_new = cx.let(f"((1 - {z}) * {hh} + {z} * {h})", "h")
            else:
                gates = cx.let(f"({xt} + {h} @ {rt}" + (f" + {rb})" if rb else ")"), "gates")

                def gate(k: int, gates: str = gates) -> str:
                    return f"{gates}[:, {k * hid}:{(k + 1) * hid}]"
                ep = cx.tensor(peep) if peep is not None else None

                def pe(k: int, cell: str, ep: str | None = ep, d: int = d) -> str:
                    return f" + {ep}[{d}][{k * hid}:{(k + 1) * hid}] * {cell}" if ep is not None else ""
                i = cx.let(f[0](clipped(f"({gate(0)}{pe(0, c)})")), "i")
                if at.get("input_forget", 0):
                    fg = f"(1 - {i})"
                else:
                    fg = cx.let(f[0](clipped(f"({gate(2)}{pe(2, c)})")), "f")
                cc = cx.let(f[1](clipped(gate(3))), "cc")
                c_new = cx.let(f"({fg} * {c} + {i} * {cc})", "c")
                o = cx.let(f[0](clipped(f"({gate(1)}{pe(1, c_new)})")), "o")
                h_new = cx.let(f"({o} * {f[2](c_new)})", "h")
            if lens is not None:
                keep = cx.let(f"reshape({lens} > {t}, {shape_text((batch, 1))})", "live")
                ys[t] = cx.let(f"where({keep}, {h_new}, 0)", "y")
                h = cx.let(f"where({keep}, {h_new}, {h})", "h")
                if kind == "LSTM":
                    c = cx.let(f"where({keep}, {c_new}, {c})", "c")
            else:
                ys[t] = h = h_new
                if kind == "LSTM":
                    c = c_new
        outs_per_dir.append([y for y in ys if y is not None])
        last_h.append(h)
        if c is not None:
            last_c.append(c)
    per_t = [f"stack({', '.join(outs_per_dir[d][t] for d in range(dirs))}, axis=0)" for t in range(steps)]
    y = cx.let(f"stack({', '.join(per_t)}, axis=0)", "y_all")  # (T, D, B, H)
    yh = f"stack({', '.join(last_h)}, axis=0)"
    yc = f"stack({', '.join(last_c)}, axis=0)" if last_c else None
    if layout:
        y = f"permute({y}, (2, 0, 1, 3))"
        yh = f"permute({yh}, (1, 0, 2))"
        yc = f"permute({yc}, (1, 0, 2))" if yc else None
    return [y, yh] + ([yc] if kind == "LSTM" else [])
