"""`tgc viz`: one self-contained HTML page that shows a program inside: its tensor graph (each node linked to its
source line, coloured by the kernel it was fused into), its kernels (opts, launch sizes, FLOPs, bytes, measured
time, rates, share, recompute factor), each kernel's AST after every named pass of the codegen pipeline (a step
slider, the changed lines highlighted) and its final source, a roofline under the device's measured peaks, and,
for a device list, which device ran what and the collectives' bytes.

Contract: `build_page(prog, ...)` takes a loaded program (a `tgc.api.Program` from any front end, or a compiled
package) and returns the page's HTML; `collect` (tgc/viz/collect.py) gathers the data, `render`
(tgc/viz/page.py) writes it out; `serve` serves a page on 127.0.0.1. The page fetches nothing.
"""

from __future__ import annotations

import http.server
import socket
from typing import Any

from tgc.errors import TgcError
from tgc.viz.collect import collect
from tgc.viz.page import render


def build_page(prog: Any, device: str | list[str] | None = None, dims: dict[str, int] | None = None,
               shard: dict[str, int] | None = None, measure: bool = True, repeat: int = 5,
               filename: str | None = None) -> str:
    """The `tgc viz` page of `prog` on `device` at `dims` (see `collect` for what `measure` and `repeat` do)."""
    return render(collect(prog, device, dims, shard=shard, measure=measure, repeat=repeat, filename=filename))


def serve(page: str, port: int, ready: Any = None) -> None:
    """Serve `page` at http://127.0.0.1:PORT/ until interrupted (every path answers the page); `ready(url)` is
    called once the server listens (port 0: a free port)."""
    body = page.encode("utf-8")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server name)
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as e:
        raise _port_error(port, e) from None
    with server:
        if ready is not None:
            ready(f"http://127.0.0.1:{server.server_address[1]}/")
        server.serve_forever()


def check_port(port: int) -> None:
    """One clear error now, not after the page's work, when `serve` could not listen on 127.0.0.1:PORT."""
    if port:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as `serve`'s HTTPServer binds)
            try:
                s.bind(("127.0.0.1", port))
            except OSError as e:
                raise _port_error(port, e) from None


def _port_error(port: int, e: OSError) -> TgcError:
    return TgcError(f"cannot serve the page on 127.0.0.1:{port}: {e.strerror or e}", kind="runtime",
                    hint="pick a free port (--serve 0 takes any)")


__all__ = ["build_page", "check_port", "collect", "render", "serve"]
