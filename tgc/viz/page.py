"""One self-contained HTML page from `tgc.viz.collect.collect`'s data (`render`).

Contract: the page needs nothing outside itself. Its markup, style and script (page.html, page.css, page.js
beside this module), the vendored graph layout (vendor/dagre.min.js: @dagrejs/dagre 3.1.3, MIT, its license
beside it) and the data are inline: `encode_data` blobs (gzip-compressed JSON in base64, which the script inflates
with the browser's DecompressionStream), one for the summary and one per kernel for its passes and source
(`split_data`: each distinct listing once in the page, referred to by every step that shows it). A
Content-Security-Policy forbids every fetch (a page that tried one would log a violation, which the browser tests
catch). The source-map comment of the vendored file is dropped (a browser with its developer tools open would
fetch it).
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
       "connect-src 'none'; worker-src blob:; base-uri 'none'; form-action 'none'")



def _script_text(text: str) -> str:
    """Text safe inside a <script> element: no `</` that could close it."""
    return text.replace("</", "<\\/")


def vendored_layout() -> str:
    """The vendored dagre, without its sourceMappingURL comment."""
    js = (HERE / "vendor" / "dagre.min.js").read_text(encoding="utf-8")
    return re.sub(r"//[#@] sourceMappingURL=\S*\s*$", "", js.rstrip())


DETAIL = ("passes", "src")  # a kernel's large parts: a blob of their own, inflated when the kernel is chosen


def encode_data(doc: dict[str, Any]) -> str:
    """Data as the page holds it: JSON, gzip-compressed (level 6: a tenth of the text for pass listings), in
    base64."""
    raw = json.dumps(doc, separators=(",", ":"), allow_nan=False, default=str).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, 6, mtime=0)).decode("ascii")


def decode_data(text: str) -> Any:
    """`encode_data` undone."""
    return json.loads(gzip.decompress(base64.b64decode(text)))


def split_data(doc: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The page's summary (everything but the kernels' passes and sources) and each kernel's detail: the page
    inflates only the summary to open, and a kernel's detail when it is chosen (a transformer block's attention
    kernel alone has 6.7 MB of listings). Each distinct listing (a pass step's text, a source) is kept once in the
    whole page: in the detail of the first kernel that has it (`texts`), and referred to as [kernel, index] by
    every step that shows it (a pass that changed nothing, the same kernel in every layer of a model: half the
    listings of a 12-layer GPT). A step's changed lines are kept as ranges [start, end, start, end, ...]."""
    kernels, details = [], []
    where: dict[str, list[int]] = {}

    def ref(text: str, ki: int, texts: list[str]) -> list[int]:
        if text not in where:
            where[text] = [ki, len(texts)]
            texts.append(text)
        return where[text]

    for ki, k in enumerate(doc.get("kernels", [])):
        kernels.append({key: v for key, v in k.items() if key not in DETAIL})
        texts: list[str] = []
        detail: dict[str, Any] = {"texts": texts}
        if "passes" in k:
            detail["passes"] = [{"name": p["name"], "text": ref(p["text"], ki, texts),
                                 "changed": _ranges(p["changed"]), "removed": p["removed"]} for p in k["passes"]]
        if "src" in k:
            detail["src"] = ref(k["src"], ki, texts)
        details.append(detail)
    return {**doc, "kernels": kernels}, details


def _ranges(lines: list[int]) -> list[int]:
    """Sorted line indices as flat [start, end) ranges: [1, 2, 3, 7] -> [1, 4, 7, 8]."""
    out: list[int] = []
    for i in lines:
        if out and out[-1] == i:
            out[-1] = i + 1
        else:
            out.extend([i, i + 1])
    return out


def read_page(page: str) -> dict[str, Any]:
    """The data of a page `render` wrote, whole again (for tests and tools that read a page)."""
    blobs = dict(re.findall(r'<script type="application/octet-stream" id="(tgc-[a-z0-9-]+)">([^<]*)</script>', page))
    doc = decode_data(blobs["tgc-data"])
    details = [decode_data(blobs[f"tgc-kernel-{i}"]) for i in range(len(doc.get("kernels", [])))]

    def text(ref: list[int]) -> str:
        return details[ref[0]]["texts"][ref[1]]

    for k, d in zip(doc.get("kernels", []), details):
        if "passes" in d:
            k["passes"] = [{"name": p["name"], "text": text(p["text"]),
                            "changed": [i for a, b in zip(p["changed"][::2], p["changed"][1::2]) for i in range(a, b)],
                            "removed": p["removed"]} for p in d["passes"]]
        if "src" in d:
            k["src"] = text(d["src"])
    return doc


def render(doc: dict[str, Any]) -> str:
    """The page for `doc` (`tgc.viz.collect.collect`'s result) as one HTML string."""
    summary, details = split_data(doc)
    blobs = [("tgc-data", encode_data(summary))] + [(f"tgc-kernel-{i}", encode_data(d)) for i, d in enumerate(details)]
    data = "".join(f'<script type="application/octet-stream" id="{name}">{text}</script>\n' for name, text in blobs)
    css = (HERE / "page.css").read_text(encoding="utf-8")
    js = (HERE / "page.js").read_text(encoding="utf-8")
    body = (HERE / "page.html").read_text(encoding="utf-8")
    title = html.escape(f"tgc viz: {doc.get('file', '')}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            f"<title>{title}</title>\n<style>\n{css}</style>\n</head><body>\n{body}{data}"
            f'<script id="dagre-src">\n{_script_text(vendored_layout())}\n</script>\n'
            f"<script>\n{_script_text(js)}</script>\n"
            "</body></html>\n")


__all__ = ["decode_data", "encode_data", "read_page", "render", "split_data", "vendored_layout"]
