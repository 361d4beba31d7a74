"""Rewrite tests/data/onnx_node_xfail.txt from a run log of `python tests/onnx_cases.py PYTHON > LOG`:
`python tests/refresh_onnx_xfail.py LOG`. Only for shrinking the list after fixes (the test enforces it)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx

HEAD = [f"# ONNX node conformance cases (onnx {onnx.__version__}) that tgc does not pass, and why.",
        "# tests/test_onnx_nodes.py fails when a listed case passes (remove it) or a case not listed fails:",
        "# this list may only shrink.",
        "# Refresh: python tests/onnx_cases.py PYTHON > LOG; python tests/refresh_onnx_xfail.py LOG"]

if __name__ == "__main__":
    rows = []
    for line in Path(sys.argv[1]).read_text().splitlines():
        if line.startswith("FAIL "):
            parts = line.split(" ", 3)
            rows.append(f"{parts[1]}\t{parts[3] if len(parts) > 3 else ''}")
    out = Path(__file__).parent / "data" / "onnx_node_xfail.txt"
    out.write_text("\n".join(HEAD + rows) + "\n")
    print(f"{len(rows)} expected failures written to {out}")
