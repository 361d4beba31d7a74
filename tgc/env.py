"""Every environment variable tgc reads, in one place: what it means and how its value is checked.

Code reads settings through `env_int`, `env_float`, `env_flag` and `env_str`; a malformed value is one
`TgcError` (kind "user": exit 2) naming the variable, never a ValueError deep inside a backend.
`check_all()` validates every variable that is set (the CLI calls it before any command runs), and
`ENV_VARS` is the table behind `tgc --help` and the README's environment section.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from tgc.errors import TgcError

REMOTE_DEFAULT_PORT = 6667  # `tgc serve`'s port, and a REMOTE address's when it names none


@dataclass(frozen=True)
class EnvVar:
    name: str
    kind: str  # "int", "float", "flag", "str"
    help: str
    check: Callable[[str], None] | None = None  # extra validation of a "str" value (raises TgcError)


def _cuda_arch(text: str) -> None:

    if not re.fullmatch(r"(?:sm_|compute_)?\d+\.?\d?[af]?", text.strip().lower()):
        raise TgcError(f"TGC_CUDA_ARCH={text!r} is not a CUDA architecture", hint="write it like sm_90 (or 90, 9.0)")


def parse_address(text: str) -> tuple[str, int]:
    """A `TGC_REMOTE` address: `"host:port"`, `"[::1]:port"`, `"http://host:port"` or `"host"` (port 6667)
    -> (host, port); anything else (no host, a bad port, an IPv6 address outside brackets) is a TgcError."""
    t = text.strip()
    for prefix in ("http://", "https://"):
        t = t.removeprefix(prefix)
    t = t.rstrip("/")
    if t.startswith("["):
        host, _, rest = t[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif t.count(":") == 1:
        host, _, port_text = t.partition(":")
    elif ":" in t:  # (an IPv6 address without brackets: where would its port be?)
        raise TgcError(f"bad REMOTE address '{text}'", hint="write an IPv6 address in brackets: [::1]:6667")
    else:
        host, port_text = t, ""
    if not host:
        raise TgcError(f"bad REMOTE address '{text}'", hint="write host:port, e.g. 127.0.0.1:6667")
    if not port_text:
        return host, REMOTE_DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise TgcError(f"bad port in REMOTE address '{text}'", hint="write host:port, e.g. 127.0.0.1:6667")
    return host, int(port_text)


def check_remote(text: str) -> None:
    """A `TGC_REMOTE` (or `--remote`) value: a comma list of addresses (`parse_address`), else a TgcError."""
    for part in text.split(","):
        try:
            parse_address(part)
        except TgcError as e:
            raise TgcError(f"TGC_REMOTE={text!r}: {e.msg}", hint=e.hint) from None


def _zero_or_one(text: str) -> None:
    if text.strip() not in ("0", "1"):
        raise TgcError(f"TGC_VERIFY_BOUNDS must be 0 or 1, got {text!r}")


# name -> (kind, bounds) of the numeric ones; order is the order of `tgc --help` and the README.
ENV_VARS: dict[str, EnvVar] = {v.name: v for v in (
    EnvVar("TGC_DEVICE", "str", "the default device (-d overrides it); CPU when unset"),
    EnvVar("TGC_CACHE_DIR", "str", "where the cache lives (default $XDG_CACHE_HOME/tgc, else ~/.cache/tgc)"),
    EnvVar("TGC_CACHE_MAX_BYTES", "int", "the cap on the cache's compiled binaries and programs, in bytes (default "
           "4 GiB): past it the least recently used are removed"),
    EnvVar("TGC_THREADS", "int", "threads a CPU kernel uses (an integer from 1 to 4096; default: the cores tgc may "
           "run on)"),
    EnvVar("TGC_CUDA_ARCH", "str", "the CUDA architecture to compile for where no GPU says (default sm_90)",
           _cuda_arch),
    EnvVar("TGC_REMOTE", "str", "host:port of the REMOTE server (a comma list: REMOTE:i is the i-th)", check_remote),
    EnvVar("TGC_REMOTE_TOKEN", "str", "the token sent to the REMOTE server"),
    EnvVar("TGC_REMOTE_TOKEN_FILE", "str", "a file holding that token (or lines `HOST:PORT TOKEN`, one per server)"),
    EnvVar("TGC_PACKAGE_KEY", "str", "a file holding a secret key: `compile --package` signs packages with it "
           "(HMAC-SHA256) and every package loaded must carry that signature"),
    EnvVar("TGC_REMOTE_TIMEOUT", "float", "seconds to wait for a REMOTE answer (a finite number > 0; default 120)"),
    EnvVar("TGC_REMOTE_RETRY", "float", "seconds to keep retrying a refused REMOTE connection (>= 0; default 3)"),
    EnvVar("DEBUG", "int", "0..6 (2: a line per kernel run and per graph run, 4: sources, 5: UOps, 6: each codegen "
           "pass; any: "
           "tracebacks of internal errors)"),
    EnvVar("TGC_GRAPH", "int", "0: launch every kernel on its own; 1 (default): a program run again runs as one "
           "device graph where the device has them"),
    EnvVar("TGC_CHUNK", "int", "0: never run a program in chunks; 1 (default): a program separable along a batch "
           "axis whose planned peak memory is over 1.5x its inputs+outputs runs in chunks of that axis"),
    EnvVar("BEAM", "int", "BEAM width for every run and bench (an integer from 0 to 65536; 0: off)"),
    EnvVar("TGC_JOBS", "int", "worker processes that compile a program's kernels (and BEAM's candidates) at once (an "
           "integer from 1 to 4096; 1: compile in this process; default: the cores tgc may run on, at most 8)"),
    EnvVar("TGC_CLUSTER", "str", "a Ray cluster's address ('local': one on this machine) whose tgc workers compile "
           "and BEAM-time for `beam`, `compile` and `run` (as --cluster)"),
    EnvVar("TGC_CLUSTER_TOKEN", "str", "the token of that cluster's tgc workers (`tgc worker --token`)"),
    EnvVar("TGC_CLUSTER_TOKEN_FILE", "str", "a file holding that token"),
    EnvVar("NOOPT", "flag", "any value but empty or 0: no optimizations"),
    EnvVar("DISABLE_COMPILER_CACHE", "flag", "any value but empty or 0: no compile cache"),
    EnvVar("NO_COLOR", "flag", "no colours or syntax highlighting, even on a terminal"),
    EnvVar("TGC_VERIFY_BOUNDS", "str", "1: check every kernel for reads and writes outside its buffers before it "
           "runs (the tests set it)", _zero_or_one),
    EnvVar("TGC_VERIFY_BOUNDS_POINTS", "int", "index points the bounds check enumerates per value (an integer >= 1; "
           "default 4194304)"),
)}

# lower bounds (inclusive unless noted) and upper bounds of the numeric variables
_INT_RANGE: dict[str, tuple[int, int | None]] = {"TGC_THREADS": (1, 4096), "DEBUG": (0, 6), "TGC_GRAPH": (0, 1),
                                                 "TGC_CHUNK": (0, 1), "BEAM": (0, 1 << 16), "TGC_JOBS": (1, 4096),
                                                 "TGC_VERIFY_BOUNDS_POINTS": (1, 1 << 40),
                                                 "TGC_CACHE_MAX_BYTES": (0, 1 << 62)}
_FLOAT_MIN: dict[str, tuple[float, bool]] = {"TGC_REMOTE_TIMEOUT": (0.0, False), "TGC_REMOTE_RETRY": (0.0, True)}


def _raw(name: str) -> str | None:
    text = os.environ.get(name)
    return None if text is None or text.strip() == "" else text


def env_int(name: str, default: int) -> int:
    """The integer in `$name`, or `default` when unset or empty; a bad or out-of-range value is a TgcError."""
    text = _raw(name)
    if text is None:
        return default
    lo, hi = _INT_RANGE.get(name, (None, None))  # type: ignore[assignment]
    want = "an integer" + (f" from {lo} to {hi}" if lo is not None and hi is not None else
                           f" >= {lo}" if lo is not None else "")
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise TgcError(f"{name}={text!r} is not an integer", hint=f"{name} must be {want}") from None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise TgcError(f"{name}={text!r} is out of range", hint=f"{name} must be {want}")
    return value


def debug_level() -> int:
    """`DEBUG` (0 to 6) for the library's own printing: a malformed value reads as 0 here (the CLI refuses it up
    front; the API runs as without it)."""
    try:
        return env_int("DEBUG", 0)
    except TgcError:
        return 0


def env_float(name: str, default: float) -> float:
    """The finite number in `$name`, or `default` when unset or empty; nan, inf, a value below the variable's
    minimum or text that is not a number is a TgcError."""
    text = _raw(name)
    if text is None:
        return default
    lo, inclusive = _FLOAT_MIN.get(name, (None, True))  # type: ignore[assignment]
    want = "a finite number" + ("" if lo is None else f" {'>=' if inclusive else '>'} {lo:g}")
    try:
        value = float(text.strip())
    except ValueError:
        raise TgcError(f"{name}={text!r} is not a number", hint=f"{name} must be {want}") from None
    if not math.isfinite(value) or (lo is not None and (value < lo or (value == lo and not inclusive))):
        raise TgcError(f"{name}={text!r} is out of range", hint=f"{name} must be {want}")
    return value


def env_flag(name: str) -> bool:
    """True when `$name` is set to anything but "" or "0"."""
    return os.environ.get(name, "").strip() not in ("", "0")


def env_str(name: str, default: str | None = None) -> str | None:
    """`$name` (checked by its validator, if any), or `default` when unset or empty."""
    text = _raw(name)
    if text is None:
        return default
    var = ENV_VARS.get(name)
    if var is not None and var.check is not None:
        var.check(text)
    return text


def check_all() -> None:
    """Validate every variable of `ENV_VARS` that is set: the first bad one is a TgcError (exit 2)."""
    for var in ENV_VARS.values():
        if var.kind == "int":
            env_int(var.name, 0)
        elif var.kind == "float":
            env_float(var.name, 0.0)
        elif var.kind == "str":
            env_str(var.name)


def help_text() -> str:
    """The `Environment:` epilog of `tgc --help`: one line per variable."""
    width = max(len(n) for n in ENV_VARS)
    lines = ["Environment:"] + [f"  {v.name:<{width}}  {v.help}" for v in ENV_VARS.values()]
    return "\n".join(lines)
