"""One self-contained HTML page from `tgc.viz.collect.collect`'s data (`render`).

Contract: the page needs nothing outside itself. Its markup, style and script (page.html, page.css, page.js
beside this module), the vendored graph layout (vendor/dagre.min.js: @dagrejs/dagre 3.1.3, MIT, its license
beside it) and the data (`encode_data`: gzip-compressed JSON in base64, which the script inflates with the
browser's DecompressionStream) are inline, and a Content-Security-Policy
forbids every fetch (a page that tried one would log a violation, which the browser tests catch). The source-map
comment of the vendored file is dropped (a browser with its developer tools open would fetch it).
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
       "connect-src 'none'; base-uri 'none'; form-action 'none'")



def _script_text(text: str) -> str:
    """Text safe inside a <script> element: no `</` that could close it."""
    return text.replace("</", "<\\/")


def vendored_layout() -> str:
    """The vendored dagre, without its sourceMappingURL comment."""
    js = (HERE / "vendor" / "dagre.min.js").read_text(encoding="utf-8")
    return re.sub(r"//[#@] sourceMappingURL=\S*\s*$", "", js.rstrip())


def encode_data(doc: dict[str, Any]) -> str:
    """The page's data: JSON, gzip-compressed (level 6: a tenth of the text for pass listings), in base64."""
    raw = json.dumps(doc, separators=(",", ":"), allow_nan=False, default=str).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, 6, mtime=0)).decode("ascii")


def decode_data(text: str) -> dict[str, Any]:
    """`encode_data` undone (for tests and tools that read a page)."""
    return json.loads(gzip.decompress(base64.b64decode(text)))


def render(doc: dict[str, Any]) -> str:
    """The page for `doc` (`tgc.viz.collect.collect`'s result) as one HTML string."""
    data = encode_data(doc)
    css = (HERE / "page.css").read_text(encoding="utf-8")
    js = (HERE / "page.js").read_text(encoding="utf-8")
    body = (HERE / "page.html").read_text(encoding="utf-8")
    title = html.escape(f"tgc viz: {doc.get('file', '')}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            f"<title>{title}</title>\n<style>\n{css}</style>\n</head><body>\n{body}"
            f'<script type="application/octet-stream" id="tgc-data">{data}</script>\n'
            f"<script>\n{_script_text(vendored_layout())}\n</script>\n<script>\n{_script_text(js)}</script>\n"
            "</body></html>\n")


__all__ = ["decode_data", "encode_data", "render", "vendored_layout"]
