"""Recursion without the Python stack: the compiler's walks over a graph of any depth.

A walk over UOps that is simplest written recursively (a node's result needs its sources' results first, and
work may happen between them) is written as a generator instead: where it would call itself it `yield`s the
request and receives the result. `drive` runs such generators on an explicit stack, so a graph 100,000
operations deep needs no deeper Python stack than a graph of one node; requests are served in exactly the
order the recursive version made its calls (a walk that numbers loops as it goes numbers them the same).

Contract: `step(request)` returns a fresh generator for a request; `memo` (optional) maps requests already
answered to their results and is filled as results come in, so each request is computed once (the walk is
linear in the number of distinct requests).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable
from typing import Any, TypeVar

R = TypeVar("R")
Step = Generator[Hashable, Any, R]


def drive(request: Hashable, step: Callable[[Any], Step], memo: dict | None = None) -> Any:
    """The result of `request`, computing it and every request it makes with `step`, without recursion."""
    if memo is not None and request in memo:
        return memo[request]
    stack: list[tuple[Hashable, Step]] = [(request, step(request))]
    result: Any = None
    while stack:
        key, gen = stack[-1]
        try:
            child = gen.send(result)
        except StopIteration as stop:
            stack.pop()
            result = stop.value
            if memo is not None:
                memo[key] = result
            continue
        if memo is not None and child in memo:
            result = memo[child]
            continue
        stack.append((child, step(child)))
        result = None
    return result
