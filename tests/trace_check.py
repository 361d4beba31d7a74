"""A checker of Chrome trace-event documents (the JSON object form that Perfetto and chrome://tracing open),
written from the format's description, not from tgc's writer: `problems(doc)` lists what is wrong, [] for a
valid trace.

Checked: the top level (`traceEvents` a list, `displayTimeUnit` "ms" or "ns"); per event its phase, a
non-empty name, integer pid/tid, numeric ts >= 0; complete ("X") events a numeric dur >= 0; args an object;
metadata ("M") `process_name` / `thread_name` with a string `args.name`; counters ("C") numeric args; flow
events ("s"/"f") an id, paired, each bound inside a complete event of its thread; every pid and (pid, tid)
that carries X, i, s or f events named by metadata; complete events of one thread nest (each either ends
before the next begins or contains it); the document serializes as strict JSON (no NaN or infinity).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

PHASES = {"X", "B", "E", "i", "I", "C", "M", "s", "t", "f", "b", "e", "n"}
EPS_US = 0.002  # rounding of microsecond floats (the writer keeps nanoseconds as 3 decimals)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def problems(doc: Any) -> list[str]:
    out: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["the document is not an object with a traceEvents list"]
    if doc.get("displayTimeUnit") not in ("ms", "ns"):
        out.append(f"displayTimeUnit is {doc.get('displayTimeUnit')!r}, not 'ms' or 'ns'")
    try:
        json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as e:
        out.append(f"not strict JSON: {e}")
    procs: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    used_pids: set[int] = set()
    used_threads: set[tuple[int, int]] = set()
    spans: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    flows: dict[Any, dict[str, list]] = defaultdict(lambda: {"s": [], "f": []})
    for i, e in enumerate(doc["traceEvents"]):
        where = f"event {i}"
        if not isinstance(e, dict):
            out.append(f"{where} is not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            out.append(f"{where}: unknown phase {ph!r}")
            continue
        if not isinstance(e.get("name"), str) or not e["name"]:
            out.append(f"{where}: no name")
        if not isinstance(e.get("pid"), int) or (ph != "C" and not isinstance(e.get("tid"), int)):
            out.append(f"{where} ({e.get('name')}): pid/tid not integers")
            continue
        if "args" in e and not isinstance(e["args"], dict):
            out.append(f"{where}: args is not an object")
        if ph == "M":
            if e.get("name") in ("process_name", "thread_name"):
                name = e.get("args", {}).get("name")
                if not isinstance(name, str) or not name:
                    out.append(f"{where}: {e.get('name')} without args.name")
                elif e["name"] == "process_name":
                    procs[e["pid"]] = name
                else:
                    threads[(e["pid"], e["tid"])] = name
            continue
        if not _num(e.get("ts")) or e["ts"] < 0:
            out.append(f"{where} ({e.get('name')}): ts {e.get('ts')!r} is not a number >= 0")
            continue
        if ph == "C":
            if not e.get("args") or not all(_num(v) for v in e["args"].values()):
                out.append(f"{where} ({e.get('name')}): a counter needs numeric args")
            used_pids.add(e["pid"])
            continue
        used_pids.add(e["pid"])
        used_threads.add((e["pid"], e["tid"]))
        if ph == "X":
            if not _num(e.get("dur")) or e["dur"] < 0:
                out.append(f"{where} ({e.get('name')}): dur {e.get('dur')!r} is not a number >= 0")
                continue
            spans[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif ph in ("s", "f"):
            if "id" not in e:
                out.append(f"{where}: a flow event without an id")
                continue
            flows[e["id"]][ph].append(e)
    for pid in sorted(used_pids - set(procs)):
        out.append(f"pid {pid} has no process_name")
    for key in sorted(used_threads - set(threads)):
        out.append(f"pid {key[0]} tid {key[1]} has no thread_name")
    for key, items in spans.items():
        stack: list[tuple[float, float, str]] = []
        for start, end, name in sorted(items, key=lambda s: (s[0], -(s[1] - s[0]))):
            while stack and start >= stack[-1][1] - EPS_US:
                stack.pop()
            if stack and end > stack[-1][1] + EPS_US:
                out.append(f"{threads.get(key, key)}: '{name}' [{start}, {end}] overlaps '{stack[-1][2]}' "
                           f"[{stack[-1][0]}, {stack[-1][1]}] without nesting in it")
            stack.append((start, end, name))
    for fid, pair in flows.items():
        if len(pair["s"]) != 1 or len(pair["f"]) != 1:
            out.append(f"flow {fid}: {len(pair['s'])} starts and {len(pair['f'])} ends")
            continue
        for e in (pair["s"][0], pair["f"][0]):
            if not any(s - EPS_US <= e["ts"] <= t + EPS_US for s, t, _ in spans.get((e["pid"], e["tid"]), [])):
                out.append(f"flow {fid}: its '{e['ph']}' event at {e['ts']} lies in no slice of its thread")
    return out


def kernel_spans(doc: dict, device: str | None = None) -> list[dict]:
    """The complete events of category `kernel`, optionally of the process named `device`, in time order."""
    procs = process_names(doc)
    return sorted([e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"
                   and (device is None or procs.get(e["pid"]) == device)], key=lambda e: e["ts"])


def process_names(doc: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
            if e.get("ph") == "M" and e.get("name") == "process_name"}


def thread_names(doc: dict) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
            if e.get("ph") == "M" and e.get("name") == "thread_name"}
