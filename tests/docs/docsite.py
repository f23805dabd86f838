"""A fixture docs site for the read_docs tests: real ``http.server``s on loopback, in threads.

Each ``Site`` records every request it receives (path, User-Agent, and the
reading of an injected fake clock at arrival), so tests judge by what the
server actually saw.
"""

from __future__ import annotations

import http.server
import threading
from dataclasses import dataclass, field


class FakeClock:
    """A clock that moves only when something sleeps on it."""

    def __init__(self) -> None:
        self._now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


@dataclass
class Route:
    status: int = 200
    body: bytes = b""
    content_type: str | None = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    # Close the connection without answering, as a crashing server does.
    drop: bool = False


@dataclass(frozen=True)
class Seen:
    path: str
    user_agent: str | None
    at: float | None
    request_line: str


class Site:
    def __init__(self, host: str, routes: dict[str, Route], clock: FakeClock | None = None) -> None:
        self.routes = routes
        self.clock = clock
        self.seen: list[Seen] = []
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                site.seen.append(
                    Seen(
                        path=self.path,
                        user_agent=self.headers.get("User-Agent"),
                        at=site.clock() if site.clock is not None else None,
                        request_line=self.requestline,
                    )
                )
                route = site.routes.get(self.path) or site.routes.get(
                    "*", Route(status=404, body=b"no such page", content_type="text/plain")
                )
                if route.drop:
                    self.close_connection = True
                    return
                self.send_response(route.status)
                if route.content_type is not None:
                    self.send_header("Content-Type", route.content_type)
                for key, value in route.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(route.body)))
                self.end_headers()
                self.wfile.write(route.body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.host = host
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def netloc(self) -> str:
        return f"{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return f"http://{self.netloc}{path}"

    def paths(self) -> list[str]:
        return [s.path for s in self.seen]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


