"""Helpers for the language tests (tests/test_lang_*.py): running `.tg` source and checking results
against numpy computed here, independently of tgc (never against `Program.reference`).

Tolerances are those of DSL.md: ints and bools exact; f32/f64 relative 1e-4 (reductions: relative to the
sum of magnitudes), f16/bf16 relative 1e-2. bf16 inputs are given as float32 arrays and come back as
float32 holding bf16 values.
"""

from __future__ import annotations

import os

import numpy as np

import tgc

INTS = ["i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"]
SIGNED = ["i8", "i16", "i32", "i64"]
UNSIGNED = ["u8", "u16", "u32", "u64"]
FLOATS = ["f16", "bf16", "f32", "f64"]
ALL = ["bool", *INTS, *FLOATS]
BITS = {"bool": 8, "i8": 8, "u8": 8, "i16": 16, "u16": 16, "i32": 32, "u32": 32, "i64": 64, "u64": 64,
        "f16": 16, "bf16": 16, "f32": 32, "f64": 64}
NP = {"bool": np.bool_, "i8": np.int8, "u8": np.uint8, "i16": np.int16, "u16": np.uint16, "i32": np.int32,
      "u32": np.uint32, "i64": np.int64, "u64": np.uint64, "f16": np.float16, "bf16": np.float32,
      "f32": np.float32, "f64": np.float64}
RTOL = {"f16": 1e-2, "bf16": 1e-2, "f32": 1e-4, "f64": 1e-4}


def device_skip_reason(device: str) -> str | None:
    """Why the language suite cannot run on `device` here (the device's own probe, in one line), or None.
    REMOTE is served by a CPU `tgc serve`, so it runs where the CPU does."""
    from tgc.backends import canonical, device_class, get_device
    kind, _ = canonical(device)
    served = "CPU" if kind == "REMOTE" else device
    ok, why = device_class(canonical(served)[0]).probe()
    if ok and canonical(served)[1]:
        try:
            get_device(served).ensure_runnable()
        except Exception as e:  # noqa: BLE001 - any failure to open is a reason to skip, shown as such
            ok, why = False, str(e)
    return None if ok else f"{device} cannot run here: {why}"


def is_float(name: str) -> bool:
    return name in FLOATS


def int_range(name: str) -> tuple[int, int]:
    bits = BITS[name]
    return (0, (1 << bits) - 1) if name[0] == "u" else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)


# TGC_TEST_SYMBOLIC=1 runs every program through the kernels compiled for its size class (symbolic sizes,
# falling back to size-specialized kernels where the launch checks say so): the language suite, once more
SYMBOLIC = os.environ.get("TGC_TEST_SYMBOLIC", "") not in ("", "0")


def run(src: str, device: str, dims: dict[str, int] | None = None, **inputs) -> dict[str, np.ndarray]:
    """Run a program twice: the first run launches kernel by kernel, the second runs the program's launch plan
    as one device graph where the device has them (tgc.engine.realize.LaunchPlan); both must agree exactly.
    Devices without graphs (PYTHON, OPENCL) run once. With TGC_TEST_SYMBOLIC, every device but REMOTE runs once
    through the kernels compiled for the size class."""
    if SYMBOLIC and not device.upper().startswith("REMOTE"):
        return tgc.loads(src).run(device=device, dims=dims, symbolic=True, **inputs)
    from tgc.backends import get_device
    from tgc.backends.base import Device
    prog = tgc.loads(src)
    first = prog.run(device=device, dims=dims, **inputs)
    if "," in device or type(get_device(device)).graph is Device.graph:  # (device lists: no graphs)
        return first
    again = prog.run(device=device, dims=dims, **inputs)
    assert list(again) == list(first)
    for name, value in first.items():
        np.testing.assert_array_equal(again[name], value, err_msg=f"output {name}: graph run != first run")
    return again


def run1(src: str, device: str, dims: dict[str, int] | None = None, **inputs) -> np.ndarray:
    """Run a program with exactly one output and return it."""
    out = run(src, device, dims, **inputs)
    assert len(out) == 1, list(out)
    return next(iter(out.values()))


def kernel_count(src: str, dims: dict[str, int] | None = None, device: str = "CPU") -> int:
    return len(tgc.loads(src).compile(device=device, dims=dims))


# --- bf16 and rounding, written here from the definition (round to nearest, ties to even)


def bf16_round(x) -> np.ndarray:
    """float32 values rounded to the nearest bf16 (ties to even), as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def to_dtype(values, name: str) -> np.ndarray:
    """Input values as an array for a `name` input (bf16: float32 already rounded to bf16)."""
    if name == "bf16":
        return bf16_round(np.asarray(values, np.float32))
    return np.asarray(values).astype(NP[name])


def wrap(values, name: str) -> np.ndarray:
    """Python ints (any size) reduced two's-complement style into an int dtype."""
    bits = BITS[name]
    flat = []
    for v in np.asarray(values, dtype=object).reshape(-1):
        v = int(v) & ((1 << bits) - 1)
        if name[0] == "i" and v >= 1 << (bits - 1):
            v -= 1 << bits
        flat.append(v)
    return np.array(flat, dtype=NP[name]).reshape(np.shape(values))


def rand(rng: np.random.Generator, shape, name: str, lo: float = -4, hi: float = 4) -> np.ndarray:
    """Random inputs of a dtype: floats in [lo, hi), ints over their small range clipped to [lo, hi]."""
    if name == "bool":
        return rng.random(shape) < 0.5
    if is_float(name):
        return to_dtype(rng.uniform(lo, hi, shape), name)
    tlo, thi = int_range(name)
    return rng.integers(max(tlo, int(lo)), min(thi, int(hi)) + 1, shape, dtype=NP[name])


# --- checks


def assert_dtype(got: np.ndarray, name: str) -> None:
    """The output's numpy dtype is the one of the DSL dtype `name` (bf16: float32 holding bf16 values)."""
    assert got.dtype == np.dtype(NP[name]), f"dtype {got.dtype}, expected {name}"
    if name == "bf16":
        low = np.asarray(got, np.float32).view(np.uint32) & 0xFFFF
        finite = np.isfinite(got)
        assert not np.any(low[finite]), f"values are not bf16: {got}"


def assert_exact(got: np.ndarray, want, name: str) -> None:
    assert_dtype(got, name)
    want = np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    np.testing.assert_array_equal(got, want.astype(NP[name]))


def assert_close(got: np.ndarray, want, name: str, scale=1.0) -> None:
    """Floats: |got - want| <= rtol * (|want| + scale), nan where want is nan, infs equal.

    `scale` is the magnitude the error is measured against besides |want|: 1 for elementwise results of
    order-one inputs, the sum of magnitudes for a reduction (an array broadcasting to the output).
    """
    assert_dtype(got, name)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    g = np.asarray(got, np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(want), err_msg=f"nan positions differ: {got} vs {want}")
    inf = np.isinf(want)
    np.testing.assert_array_equal(g[inf], want[inf], err_msg="infinities differ")
    ok = ~np.isnan(want) & ~inf
    tol = RTOL[name] * (np.abs(want) + np.broadcast_to(np.asarray(scale, np.float64), want.shape))
    with np.errstate(invalid="ignore"):
        bad = ok & ~(np.abs(g - want) <= tol)
    assert not np.any(bad), f"mismatch at {np.argwhere(bad)[:5].tolist()}: got {g[bad][:5]}, want {want[bad][:5]}"


def assert_result(got: np.ndarray, want, name: str, scale=1.0) -> None:
    """Exact for ints and bools, close for floats."""
    if is_float(name):
        assert_close(got, want, name, scale)
    else:
        assert_exact(got, want, name)


def promote(a: str, b: str) -> str:
    """The promotion lattice, written from DSL.md's text."""
    if a == b:
        return a
    if a == "bool" or b == "bool":
        return b if a == "bool" else a
    if is_float(a) and is_float(b):
        if {a, b} == {"f16", "bf16"}:
            return "f32"
        return a if BITS[a] > BITS[b] else b
    if is_float(a) or is_float(b):
        return a if is_float(a) else b
    if (a[0] == "u") == (b[0] == "u"):
        return a if BITS[a] > BITS[b] else b
    signed, unsigned = (a, b) if a[0] == "i" else (b, a)
    if BITS[signed] > BITS[unsigned]:
        return signed
    if BITS[unsigned] == 64:
        raise ValueError("no type")
    return f"i{2 * BITS[unsigned]}"


def source_error(src: str, dims: dict[str, int] | None = None) -> tgc.TgcError:
    """The TgcError that loading `src` raises, or else compiling it (shape errors may wait for the dims)."""
    try:
        tgc.loads(src).compile(dims=dims or {})
    except tgc.TgcError as e:
        return e
    raise AssertionError("no error raised for:\n" + src)
