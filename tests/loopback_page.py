"""A web page on loopback that stands in for a live website in tests (local desktops reach
no internet here)."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def serve_page(title: str) -> Iterator[str]:
    """Serve one HTML page titled ``title`` at every path of ``http://127.0.0.1:PORT``;
    yields that base URL and stops the server on exit."""
    body = f"<html><head><title>{title}</title></head><body>{title}</body></html>".encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
