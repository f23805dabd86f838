"""A scripted model server on loopback, for driving a vendor's official SDK in tests.

Vendor-neutral: ``VendorServer`` serves whatever ``Reply`` a responder picks
for each request (JSON bodies, any status and headers) and records every
request it saw. ``Script`` answers one conversation turn by turn, keyed by
how many model turns the request already holds (the vendor module says how
to count them), and ``Router`` sends each conversation to its own script, so
parallel runs each follow their own transcript. A step may be a list of
replies, consumed in order on retries of that same turn (a 429, then the
answer). Each vendor's wire shapes live beside this in their own module
(``anthropic_wire``).
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from support.servers import LoopbackServer, QuietHandler


@dataclass(frozen=True, kw_only=True)
class Reply:
    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    # Server-sent events (name, data) served instead of ``body``: a streamed reply
    # (an empty name: a data line alone).
    events: Sequence[tuple[str, Any]] | None = None


@dataclass(frozen=True, kw_only=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]  # names lower-cased
    body: Any  # the decoded JSON body, or None


Responder = Callable[[Request], Reply]


class VendorServer(LoopbackServer):
    """A threaded HTTP server on ``host`` (loopback) that answers with ``responder``; over
    TLS with ``tls`` (a server context), as a vendor's API is."""

    def __init__(self, responder: Responder, *, tls: ssl.SSLContext | None = None,
                 host: str = "127.0.0.1") -> None:
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        server = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                request = Request(method="POST", path=self.path,
                                  headers={k.lower(): v for k, v in self.headers.items()},
                                  body=json.loads(raw) if raw else None)
                with server._lock:
                    server.requests.append(request)
                try:
                    reply = responder(request)
                except Exception as exc:  # a script error shows as a 599 the test will see
                    reply = Reply(status=599, body={"script_error": repr(exc)})
                if reply.events is not None:
                    kind = "text/event-stream"
                    # An event with no name is its data line alone, as Gemini streams.
                    data = "".join((f"event: {name}\n" if name else "")
                                   + f"data: {json.dumps(value)}\n\n"
                                   for name, value in reply.events).encode()
                else:
                    kind = "application/json"
                    data = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        super().__init__(Handler, host=host)
        self._httpd.daemon_threads = True
        if tls is not None:
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True)
            self.url = f"https://{host}:{self.port}"

    def seen(self) -> list[Request]:
        with self._lock:
            return list(self.requests)


Step = Reply | Sequence[Reply]


class Script:
    """One conversation's replies: step n answers a request holding n model turns."""

    def __init__(self, steps: Sequence[Step], *, turn_of: Callable[[Request], int]) -> None:
        self._steps = [list(s) if not isinstance(s, Reply) else [s] for s in steps]
        self._turn_of = turn_of
        self._lock = threading.Lock()
        self._used = [0] * len(self._steps)

    def __call__(self, request: Request) -> Reply:
        turn = self._turn_of(request)
        with self._lock:
            replies = self._steps[turn]
            # The last reply of a step repeats: "500 until the retries run out".
            reply = replies[min(self._used[turn], len(replies) - 1)]
            self._used[turn] += 1
        return reply


class Router:
    """Sends each conversation to its own responder, by a key read off the request."""

    def __init__(self, key_of: Callable[[Request], str], routes: Mapping[str, Responder]) -> None:
        self._key_of = key_of
        self._routes = dict(routes)

    def __call__(self, request: Request) -> Reply:
        key = self._key_of(request)
        for fragment, responder in self._routes.items():
            if fragment in key:
                return responder(request)
        raise LookupError(f"no script for a conversation starting {key[:80]!r}")
