"""Draw a profile trace (`tgc run|bench ... --profile out.json`) as a timeline page laid out as Perfetto's UI lays
one out: a row per process and thread track, each complete ("X") event a bar at its time and depth (nested spans
stacked below their parent), instant events as ticks, a time axis; hovering a bar shows its name, times and args.
For a picture of a trace where Perfetto's UI cannot be loaded (this machine is offline); the README's trace image
is this page in headless Chromium (`python3 tools/viz_timing.py OUT.html --screenshot OUT.png --repeat 1`).

    python3 tools/trace_timeline.py TRACE.json OUT.html [--width PX] [--from MS] [--to MS]

Exit 2 for a file that is not a trace.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from collections import defaultdict
from typing import Any

from tgc.profile import read_trace

ROW = 18  # px per depth level of a track
LABEL = 230  # px of the track names column


def _color(name: str) -> str:
    h = 0
    for ch in name:
        h = (h * 31 + ord(ch)) % 360
    return f"hsl({h},55%,62%)"


def timeline(doc: dict[str, Any], width: int = 1500, t0: float | None = None, t1: float | None = None) -> str:
    """The page (an HTML string with one inline SVG) of `doc`'s events between t0 and t1 (ms; default all)."""
    events = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    order = {(e["pid"], e.get("tid")): e["args"].get("sort_index", 0) for e in events
             if e.get("ph") == "M" and e.get("name") in ("process_sort_index", "thread_sort_index")}
    spans = [e for e in events if e.get("ph") in ("X", "i", "I")]
    lo = min((e["ts"] for e in spans), default=0.0) if t0 is None else t0 * 1e3
    hi = max((e["ts"] + e.get("dur", 0) for e in spans), default=1.0) if t1 is None else t1 * 1e3
    hi = max(hi, lo + 1)
    scale = (width - LABEL - 10) / (hi - lo)
    tracks: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for e in spans:
        if e["ts"] + e.get("dur", 0) >= lo and e["ts"] <= hi:
            tracks[(e["pid"], e["tid"])].append(e)
    keys = sorted(tracks, key=lambda k: (order.get((k[0], None), 0), procs.get(k[0], ""), order.get(k, 0), k[1]))
    rows, y, last_pid = [], 24, None
    for key in keys:
        if key[0] != last_pid:  # a process header
            rows.append(f'<rect x="0" y="{y}" width="{width}" height="20" fill="#eceff1"/>'
                        f'<text x="6" y="{y + 14}" font-weight="bold">{html.escape(procs.get(key[0], str(key[0])))}'
                        "</text>")
            y += 22
            last_pid = key[0]
        stack: list[float] = []  # end times of the open spans
        bars = []
        depth_max = 0
        for e in sorted(tracks[key], key=lambda e: (e["ts"], -e.get("dur", 0))):
            while stack and e["ts"] >= stack[-1] - 1e-3:
                stack.pop()
            depth = len(stack)
            depth_max = max(depth_max, depth)
            x = LABEL + (max(e["ts"], lo) - lo) * scale
            title = html.escape(f"{e['name']}: {e.get('dur', 0) / 1e3:.3f} ms at {e['ts'] / 1e3:.3f} ms\n"
                                + json.dumps(e.get("args", {}), default=str)[:400])
            if e["ph"] == "X":
                stack.append(e["ts"] + e["dur"])
                w = max((min(e["ts"] + e["dur"], hi) - max(e["ts"], lo)) * scale, 1.0)
                label = html.escape(e["name"]) if w > 40 else ""
                bars.append(f'<g class="span"><rect x="{x:.1f}" y="{y + depth * ROW}" width="{w:.1f}" '
                            f'height="{ROW - 2}" fill="{_color(e["name"])}"/><title>{title}</title>'
                            f'<svg x="{x:.1f}" y="{y + depth * ROW}" width="{w:.1f}" height="{ROW - 2}">'
                            f'<text x="3" y="12">{label}</text></svg></g>')
            else:
                bars.append(f'<g class="instant"><path d="M{x:.1f},{y + depth * ROW} l4,8 l-4,8 l-4,-8 z" '
                            f'fill="#455a64"/><title>{title}</title></g>')
        h = (depth_max + 1) * ROW
        rows.append(f'<text x="18" y="{y + 12}">{html.escape(threads.get(key, str(key[1])))}</text>')
        rows.extend(bars)
        rows.append(f'<line x1="0" x2="{width}" y1="{y + h + 1}" y2="{y + h + 1}" stroke="#e0e0e0"/>')
        y += h + 4
    ticks = []
    step = 10 ** len(str(int((hi - lo) / 8 or 1))) / 10
    while (hi - lo) / step > 12:
        step *= 2
    t = (lo // step + 1) * step
    while t < hi:
        x = LABEL + (t - lo) * scale
        ticks.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="18" y2="{y}" stroke="#f0f0f0"/>'
                     f'<text x="{x + 2:.1f}" y="14" fill="#555">{t / 1e3:g} ms</text>')
        t += step
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 10}" font-family="system-ui, '
           f'sans-serif" font-size="11">{"".join(ticks)}{"".join(rows)}</svg>')
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>trace timeline</title>"
            "<style>body{margin:0;background:#fff} .span:hover rect{stroke:#000}</style></head><body>"
            f"{svg}</body></html>\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--width", type=int, default=1500)
    ap.add_argument("--from", dest="t0", type=float, help="start (ms since the trace began)")
    ap.add_argument("--to", dest="t1", type=float, help="end (ms)")
    args = ap.parse_args(argv)
    try:
        doc = read_trace(args.trace)
    except (OSError, ValueError) as e:
        print(f"error: {args.trace} is not a readable trace: {e}", file=sys.stderr)
        return 2
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(timeline(doc, args.width, args.t0, args.t1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
