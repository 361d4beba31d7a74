"""Launch contracts: what a launch of a served kernel must provide, read from the `tgc-launch:` comment that
ends its source (and, for LLVM IR, its parameters), and the check of a launch against them (`breach`)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tgc.backends.remote import protocol as P
from tgc.backends.remote.limits import Refusal
from tgc.codegen.pipeline import _COMMENT, CONTRACT_TAG


@dataclass(frozen=True)
class Contract:
    """What a launch of a kernel must provide, from the `tgc-launch:` comment that ends its source (see
    `tgc.codegen.pipeline.launch_contract`): the least bytes of each buffer, the most work-items per
    dimension, the local size and the number of `vals`."""

    bufs: tuple[int, ...]
    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int] | None
    vals: int
    # for LLVM IR, the functions of the source this contract came with: (name, pointers, integers) each. Sources
    # of different arity can compile to one binary (a kernel that ignores a buffer is the code of one without
    # it), so which contract a launch of a name may meet is decided per source, not per binary
    functions: tuple[tuple[str, int, int], ...] = ()
    # proven (`shortproof.prove_short`) to end soon and stay inside its buffers for every launch meeting this
    # contract: a CPU server may run such a launch inline, without a launch worker
    inline: bool = False


@dataclass(frozen=True)
class Known:
    """What the server knows of a binary it compiled: its contract and, for LLVM IR, the parameters of each
    function (pointers, integers) as the source defines them. Different sources (declared sizes) can compile
    to the same binary, so the server keeps every contract a binary was compiled under (`contracts`, the
    newest last, at most MAX_CONTRACTS): each was enough for the same code, so a launch meeting any is safe."""

    contract: Contract | None
    params: dict[str, tuple[int, int]] | None
    contracts: tuple[Contract, ...] = ()

    def all_contracts(self) -> tuple[Contract, ...]:
        return self.contracts or ((self.contract,) if self.contract is not None else ())


MAX_CONTRACTS = 16


MAX_CONTRACT_BUFS = 1024
_DEFINE = re.compile(r"^define\s[^@\n]*@\"?([\w.$-]+)\"?\(", re.M)


def _dims(value: Any, what: str) -> tuple[int, int, int]:
    if not isinstance(value, list) or not 1 <= len(value) <= 3 or any(
            type(v) is not int or not 1 <= v <= 2**31 - 1 for v in value):
        raise ValueError(f"the launch contract's {what} must be 1 to 3 sizes in [1, 2**31)")
    return tuple([*value, 1, 1][:3])  # type: ignore[return-value]


def parse_contract(src: str, language: str | None) -> Known:
    """The launch contract at the end of a kernel's source, and for LLVM IR the parameters (pointers, others)
    of each function it defines. Raises ValueError for a malformed contract."""
    prefix = _COMMENT.get(language or "")
    contract = None
    if prefix is not None:
        marker = f"{prefix} {CONTRACT_TAG}"
        for line in reversed(src[-65536:].splitlines()[-8:]):
            if line.startswith(marker):
                contract = _contract(line[len(marker):])
                break
    params = None
    if language == "llvm":
        params = {}
        for m in _DEFINE.finditer(src):
            args = _top_level_args(src, m.end())
            if args is not None:
                params[m.group(1)] = (sum(a.startswith("ptr") for a in args),
                                      sum(not a.startswith("ptr") for a in args))
        if contract is not None:
            contract = dataclasses.replace(contract, functions=tuple(sorted((n, p, i) for n, (p, i) in params.items())))
    return Known(contract, params)


def _top_level_args(src: str, start: int) -> list[str] | None:
    """The comma-separated parameters from `src[start]` (just after a function's `(`) to its matching `)`."""
    depth, args, cur = 0, [], start
    for i in range(start, min(len(src), start + 65536)):
        c = src[i]
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            if depth == 0:
                if c != ")":
                    return None
                last = src[cur:i].strip()
                return [*args, last] if last or args else args
            depth -= 1
        elif c == "," and depth == 0:
            args.append(src[cur:i].strip())
            cur = i + 1
    return None


def _contract(text: str) -> Contract:
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError("the launch contract is not JSON") from None
    if not isinstance(raw, dict):
        raise ValueError("the launch contract is not a JSON object")
    bufs, vals, local = raw.get("bufs"), raw.get("vals"), raw.get("local_size")
    if not isinstance(bufs, list) or len(bufs) > MAX_CONTRACT_BUFS or any(
            type(b) is not int or not 0 <= b <= 2**63 - 1 for b in bufs):
        raise ValueError(f"the launch contract's bufs must be at most {MAX_CONTRACT_BUFS} byte counts")
    if type(vals) is not int or not 0 <= vals <= 64:
        raise ValueError("the launch contract's vals must be a count from 0 to 64")
    return Contract(tuple(bufs), _dims(raw.get("global_size"), "global_size"),
                    None if local is None else _dims(local, "local_size"), vals)


def breach(k: P.ProgramExec | P.GraphKernel, bufs: list, glob: tuple[int, int, int],
            contract: Contract) -> Refusal | None:
    """Why launch `k` does not meet `contract` (a Refusal to raise), or None when it does."""
    if len(bufs) != len(contract.bufs):
        return Refusal(400, "protocol", f"the kernel takes {len(contract.bufs)} buffers, the launch gave {len(bufs)}")
    for i, (b, need) in enumerate(zip(bufs, contract.bufs)):
        if b.size < need:
            return Refusal(400, "protocol", f"buffer {k.bufs[i]} has {b.size} bytes; the kernel's parameter {i} "
                                            f"needs {need}")
    if any(g > c for g, c in zip(glob, contract.global_size)):
        return Refusal(400, "protocol", f"global_size {glob} is larger than the kernel's {contract.global_size}")
    local = None if k.local_size is None else tuple([*k.local_size, 1, 1][:3])
    if local != contract.local_size:
        return Refusal(400, "protocol", f"local_size {local} is not the kernel's {contract.local_size}")
    if len(k.vals) != contract.vals:
        return Refusal(400, "protocol", f"the kernel takes {contract.vals} vals, the launch gave {len(k.vals)}")
    return None


def remember(table: OrderedDict[str, Known], key: str, value: Known, cap: int, replace: bool) -> None:
    """Record `value` under `key` in a table of at most `cap` entries (the least recently set go first). A
    binary already known keeps its contracts and gains the new one (see `Known`)."""
    old = table.get(key)
    if old is not None:
        merged = tuple(dict.fromkeys([*old.all_contracts(), *value.all_contracts()]))[-MAX_CONTRACTS:]
        value = Known(value.contract if replace or old.contract is None else old.contract,
                      old.params if old.params is not None else value.params, merged)
    table[key] = value
    table.move_to_end(key)
    while len(table) > cap:
        table.popitem(last=False)
