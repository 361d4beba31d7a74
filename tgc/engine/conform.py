"""One input value as the array a program declares: its dtype (bf16 as its uint16 bits), C-contiguous. Shared
by `Program.bind` (tgc.api) and packages (tgc.package), which must not import the compiler."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from tgc.dtype import DType, bf16_to_f32, dtypes, f32_to_bf16
from tgc.errors import BindError, TgcError, close_match


def names_hint(name: str, declared: list[str]) -> str:
    """The hint for a name that is no input: the closest input's name, else every input's."""
    close = close_match(name, declared)
    return f"did you mean '{close}'?" if close else "inputs: " + (", ".join(declared) or "(none)")


def check_input_names(names: Iterable[str], declared: list[str], file: str | None) -> None:
    """One clear error for the first of `names` that is not a declared input (listed in `declared`' order)."""
    for name in names:
        if name not in declared:
            raise TgcError(f"unknown input '{name}'", file=file, hint=names_hint(name, declared))


def _decl_text(decl: Any) -> str:
    return f"{decl.dtype.name}[{', '.join(map(str, decl.shape))}]"


def _from_array_object(value: Any, name: str) -> np.ndarray:
    """A torch tensor, jax array or any object with `__dlpack__` or `__array__` as a numpy array, converted once:
    through DLPack first (zero-copy for memory the CPU can read), else `__array__`."""
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except Exception as e:  # another device's memory, a tensor that requires grad, an unsupported dtype ...
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if not hasattr(value, "__array__"):
                raise TgcError(f"input '{name}': cannot read the {type(value).__name__} through DLPack: {reason}",
                               hint="copy it to host memory as a numpy array first") from None
    try:
        out = np.asarray(value)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TgcError(f"input '{name}': cannot convert the {type(value).__name__} to an array: {reason}",
                       hint="copy it to host memory as a numpy array first (e.g. t.detach().cpu().numpy())") from None
    if not isinstance(out, np.ndarray):
        raise TgcError(f"input '{name}' must be an array, got {type(value).__name__}")
    return out


def _cast(value: np.ndarray, to: np.dtype, name: str) -> np.ndarray:
    """numpy's `astype`, with one warning line (not numpy's RuntimeWarning and its source line) where the integer
    dtype cannot hold some values (NaN, an infinity, out of range): numpy's cast does not keep those."""
    to = np.dtype(to)
    if to.kind in "iu" and value.dtype.kind in "iuf" and value.size:
        info = np.iinfo(to)
        with np.errstate(invalid="ignore"):
            bad = int(np.count_nonzero(~np.isfinite(value) | (value < info.min) | (value > info.max))
                      if value.dtype.kind == "f" else np.count_nonzero((value < info.min) | (value > info.max)))
        if bad:
            import sys

            known = dtypes.from_numpy(to)
            tgc_name = known.name if known is not None else to.name
            sys.stderr.write(f"tgc: warning: input '{name}': {bad} of {value.size} values are NaN, infinite or outside "
                             f"{tgc_name}'s range; numpy's cast to {tgc_name} does not keep them (NaN and infinities "
                             "become unspecified values, integers wrap around)\n")
    with np.errstate(invalid="ignore", over="ignore"):
        return value.astype(to)


def _ints_exact_in(value: np.ndarray, want: DType, decl: Any) -> bool:
    """True (convert them) where every int of a Python list or scalar is exactly a value of the float dtype `want`;
    else a TgcError naming the first that is not (2**24 + 1 in f32 would silently become 2**24)."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = f32_to_bf16(value.astype(np.float32)) if want == dtypes.bf16 else value.astype(want.np)
        back = bf16_to_f32(f) if want == dtypes.bf16 else f
        ok = np.isfinite(back) & (back.astype(np.float64) == value.astype(np.float64)) & \
            (np.abs(value.astype(np.float64)) < 2.0 ** 63)  # (f64 holds none exactly past 2**53: compare as ints)
        if ok.all():
            ok = back.astype(np.float64).astype(value.dtype) == value
    if ok.all():
        return True
    first = value.reshape(-1)[int(np.argmin(ok.reshape(-1)))]
    raise TgcError(f"input '{decl.name}': the int {int(first)} is not exactly representable in {want.name}, as "
                   f"the program declares it ({_decl_text(decl)})",
                   hint=f"give the values as floats, or a numpy array converted to {want.name} as you mean it")


def _from_ml_bfloat16(value: np.ndarray, want: DType, name: str) -> np.ndarray:
    """An ml_dtypes bfloat16 array: its bits (uint16, how tgc holds bf16) for a bf16 input, else its values as
    float32 (a float input then converts them as from any float array). Read only where ml_dtypes is importable
    (no dependency on it): another 2-byte type named bfloat16 is refused as before."""
    try:
        import ml_dtypes
    except ImportError:
        raise TgcError(f"input '{name}' has dtype {value.dtype}, which tgc cannot use",
                       hint="give bf16 inputs as float32 arrays or uint16 bit patterns") from None
    if value.dtype != np.dtype(ml_dtypes.bfloat16):
        raise TgcError(f"input '{name}' has dtype {value.dtype}, which tgc cannot use")
    return value.view(np.uint16) if want == dtypes.bf16 else value.astype(np.float32)


def as_array(value: Any, decl: Any, cast: bool, at: dict[str, Any]) -> np.ndarray:
    want = decl.dtype
    if not isinstance(value, np.ndarray) and (hasattr(value, "__dlpack__") or hasattr(value, "__array__")) \
            and not isinstance(value, np.generic):
        value = _from_array_object(value, decl.name)
    if isinstance(value, (bool, int, float, np.generic)) or (isinstance(value, (list, tuple))):
        try:
            value = np.asarray(value)
        except (ValueError, TypeError, OverflowError) as e:  # a ragged list, an int past every dtype ...
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TgcError(f"input '{decl.name}': cannot convert the {type(value).__name__} to an array: {reason}",
                           hint=f"give it as a numpy array ({_decl_text(decl)})") from None
        if value.dtype == np.float64 and want.is_float or value.dtype.kind in "iub" and not want.is_float:
            cast = True
        elif value.dtype.kind in "iu" and want.is_float:  # Python ints for a float input: numpy's conversion
            cast = _ints_exact_in(value, want, decl)       # where every one is exact there, else an error
    if not isinstance(value, np.ndarray):
        raise TgcError(f"input '{decl.name}' must be a numpy array, got {type(value).__name__}")
    if value.dtype.kind == "V" and value.dtype.itemsize == 2 and value.dtype.name == "bfloat16":
        value = _from_ml_bfloat16(value, want, decl.name)
    if want == dtypes.bf16:
        if value.dtype == np.uint16:  # bf16 bit patterns (how tgc holds bf16), with or without cast
            return np.require(value, requirements="C")
        if value.dtype.kind == "f" or cast:
            with np.errstate(over="ignore"):  # (f64 past f32's range: inf, as bf16 holds it; no RuntimeWarning)
                return f32_to_bf16(value.astype(np.float32))
    if value.dtype != want.np:
        if value.dtype.kind in "OVSUM" or value.dtype.kind == "c":
            raise TgcError(f"input '{decl.name}' has dtype {value.dtype}, which tgc cannot use")
        if not cast:
            got = dtypes.from_numpy(value.dtype)
            raise BindError(f"input '{decl.name}' is {got.name if got else value.dtype}, but the program declares it "
                            f"{_decl_text(decl)}", need="cast", name=decl.name, dtype=want.name,
                            hint=f"convert the array to {want.name}, or bind with cast=True", **at)
        value = _cast(value, want.np, decl.name)
    return np.require(value, requirements="C")  # (ascontiguousarray would turn a 0-d array into 1-d)
