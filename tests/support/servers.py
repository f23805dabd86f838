"""One way to serve HTTP on loopback in a test: a handler on 127.0.0.1 at a free port."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that keeps the test's output clean of the server's request log."""

    def log_message(self, format: str, *args: object) -> None:
        pass


class LoopbackServer:
    """``handler`` served in a thread of its own while the ``with`` block lasts.

    ``port`` and ``url`` are known from construction, so a test can also keep
    the address of a server it has stopped (a server that is gone). ``host``:
    where it listens, loopback unless the test's proxy reaches the host elsewhere."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, host: str = "127.0.0.1") -> None:
        self._httpd = ThreadingHTTPServer((host, 0), handler)
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
