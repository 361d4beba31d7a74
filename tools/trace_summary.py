"""Summarize a profile trace (`tgc run|bench ... --profile out.json`): the kernels by total time.

    python3 tools/trace_summary.py out.json [--top N] [--json]

Prints a Markdown table (kernel, device, launches, total and mean time, share of all kernel time, GFLOP/s and
GB/s over the total), or with `--json` the rows as JSON (`tgc.profile.summarize`). Exit 2 for a file that is not
a trace.
"""

from __future__ import annotations

import argparse
import json
import sys

from tgc.profile import read_trace, summarize, summary_markdown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a trace written by --profile")
    ap.add_argument("--top", type=int, default=10, help="rows to print (default 10; 0: all)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    try:
        doc = read_trace(args.trace)
    except (OSError, ValueError) as e:
        print(f"error: {args.trace} is not a readable trace: {e}", file=sys.stderr)
        return 2
    rows = summarize(doc, top=args.top or None)
    print(json.dumps(rows, indent=1) if args.json else summary_markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
