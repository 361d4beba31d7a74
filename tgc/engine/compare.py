"""The one tolerance rule: how a device's output is compared with a reference (`tgc run --check`, BEAM's
check of every candidate against the unoptimized kernel, the API).

Floats are compared per element with

    |got - ref| <= max(rtol * (|ref| + S), ERROR_FACTOR * u * s),    S = max(1, largest finite |ref| of the output)

with rtol 1e-4 for f32, 1e-2 for f16/bf16 and 1e-7 for f64 (`RTOL`), u the dtype's unit roundoff and s the
element's error scale where the caller has it (`tgc.engine.reference.evaluate_with_scale`: the error rounding
gives each element, to first order, in units of u; a sum is measured against the magnitudes it adds up, as
DSL.md asks, and so is everything computed from it). Without s (BEAM compares kernels of one shape, both
float32) the first term alone applies: S, the output's own scale, stands in for the conditioning. ERROR_FACTOR
(32) is the headroom over the estimate: the worst element of every example program on CPU and OpenCL came
within a factor 10 of u * s, and a wrong index, a lost term or a swapped row still moves elements past it.
`--rtol` scales both terms. NaN matches NaN, an infinity matches the same infinity. Ints and bools must be
equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tgc.dtype import bf16_to_f32, f32_to_bf16

RTOL = {"f16": 1e-2, "bf16": 1e-2, "f32": 1e-4, "f64": 1e-7}
# the unit roundoff of each float dtype, and how many times the error scale's estimate a result may be off
UNIT_ROUNDOFF = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8, "f32": 2.0 ** -24, "f64": 2.0 ** -53}
ERROR_FACTOR = 32


@dataclass
class Mismatch:
    """Why one output failed: the count of bad elements and the worst one."""

    name: str
    bad: int
    size: int
    index: tuple[int, ...] | None = None
    got: Any = None
    expected: Any = None
    tolerance: float | None = None
    reason: str | None = None

    def describe(self) -> str:
        if self.reason:
            return f"output '{self.name}': {self.reason}"
        where = "[" + ", ".join(str(i) for i in self.index) + "]" if self.index else "[]"
        tol = f" (tolerance {self.tolerance:.3g})" if self.tolerance is not None else ""
        return (f"output '{self.name}': {self.bad} of {self.size} elements differ from the reference; worst at "
                f"{self.name}{where}: got {_fmt(self.got)}, expected {_fmt(self.expected)}{tol}")


def _fmt(v: Any) -> str:
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return f"{float(v):.9g}"


def compare(name: str, got: np.ndarray, ref: np.ndarray, dtype_name: str, rtol: float | None = None,
            scale: np.ndarray | None = None) -> tuple[Mismatch | None, float]:
    """(None, worst error relative to its tolerance) when `got` matches `ref`, else (Mismatch, that ratio).
    `scale`, where given, is the error scale of every element (`tgc.engine.reference.evaluate_with_scale`)."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return Mismatch(name, got.size, got.size, reason=f"shape {got.shape} but the reference has {ref.shape}"), 0.0
    if got.size == 0:
        return None, 0.0
    if dtype_name not in RTOL:  # ints and bools: exact
        bad = ~np.equal(got, ref) if ref.dtype.kind != "f" else ~(got.astype(np.float64) == ref)
        nbad = int(bad.sum())
        if not nbad:
            return None, 0.0
        idx = np.unravel_index(int(np.argmax(bad)), got.shape)
        return Mismatch(name, nbad, got.size, tuple(int(i) for i in idx), got[idx], ref[idx]), float("inf")
    stat = ERROR_FACTOR * UNIT_ROUNDOFF[dtype_name] * (1.0 if rtol is None else rtol / RTOL[dtype_name])
    rtol = RTOL[dtype_name] if rtol is None else rtol
    with np.errstate(all="ignore"):
        g, r = got.astype(np.float64), _rounded(ref, dtype_name)
        finite = np.abs(r[np.isfinite(r)])
        top = max(1.0, float(finite.max()) if finite.size else 0.0)
        tol = rtol * (np.abs(r) + top)
        if scale is not None:
            tol = np.maximum(tol, stat * np.asarray(scale, dtype=np.float64))
        err = np.abs(g - r)
        same = (np.isnan(g) & np.isnan(r)) | (np.isinf(r) & (g == r))
        comparable = np.isfinite(r) & np.isfinite(g)
        ok = same | (comparable & (err <= tol))
        scaled = np.where(tol > 0, err / np.where(tol > 0, tol, 1.0), np.where(err == 0, 0.0, np.inf))
        ratio = np.where(same, 0.0, np.where(comparable, scaled, np.inf))
    worst = int(np.argmax(ratio))
    idx = np.unravel_index(worst, got.shape)
    nbad = int((~ok).sum())
    if not nbad:
        return None, float(ratio.reshape(-1)[worst])
    return (Mismatch(name, nbad, got.size, tuple(int(i) for i in idx), g[idx], r[idx], float(tol[idx])),
            float(ratio.reshape(-1)[worst]))




def _rounded(ref: np.ndarray, dtype_name: str) -> np.ndarray:
    """A wider reference rounded to the output's dtype (as float64): 1e40 for an f32 output is inf, as the
    device's is. bf16 by round to nearest even from f32, as the kernels convert."""
    r = ref.astype(np.float64)
    if ref.dtype.kind != "f" or dtype_name == "f64":
        return r
    if dtype_name == "bf16":
        return bf16_to_f32(f32_to_bf16(r.astype(np.float32))).astype(np.float64)
    nd = np.dtype(np.float16 if dtype_name == "f16" else np.float32)
    return r if ref.dtype.itemsize <= nd.itemsize else r.astype(nd).astype(np.float64)


def matches(got: np.ndarray, ref: np.ndarray, dtype_name: str, rtol: float | None = None,
            scale: np.ndarray | None = None) -> bool:
    """Whether `got` matches `ref` under the rule above (bf16 values as floats, not bits)."""
    return compare("", got, ref, dtype_name, rtol, scale)[0] is None
