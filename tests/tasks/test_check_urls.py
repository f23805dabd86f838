"""--check-urls against real HTTP servers on loopback; a canary proves no off-list hop is taken."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from firstrun.tasks.cli_support import EXIT_INVALID, EXIT_OK, validate_paths
from firstrun.tasks.lint import Code, Severity, check_urls
from firstrun.tasks.load import read_task
from support.servers import LoopbackServer, QuietHandler


class _Server(LoopbackServer):
    def __init__(self, routes: dict[tuple[str, str], tuple[int, dict[str, str]]]) -> None:
        self.routes = routes
        self.seen: list[tuple[str, str]] = []
        server = self

        class Handler(QuietHandler):
            def _answer(self) -> None:
                server.seen.append((self.command, self.path))
                status, headers = server.routes.get((self.command, self.path), (404, {}))
                body = b"" if self.command == "HEAD" else b"page"
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(b"page")))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_HEAD = _answer

        super().__init__(Handler)


@pytest.fixture
def servers() -> Iterator[tuple[_Server, _Server]]:
    canary = _Server({})
    docs = _Server({})
    docs.routes.update(
        {
            ("HEAD", "/ok"): (200, {}),
            ("HEAD", "/moved"): (301, {"Location": "/ok"}),
            ("HEAD", "/nohead"): (405, {}),
            ("GET", "/nohead"): (200, {}),
            ("HEAD", "/away"): (302, {"Location": f"http://127.0.0.1:{canary.port}/"}),
            ("HEAD", "/loop"): (302, {"Location": "/loop"}),
        }
    )
    with canary, docs:
        yield docs, canary


def _closed_port() -> int:
    # A port that was just free: nothing listens there, so a connection is refused.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10, trust_env=False) as c:
        yield c


def _task(write_task, pages: list[str]):
    body = "name: t\ngoal: g\ndocs:\n  path:\n" + "".join(f"    - {p}\n" for p in pages)
    return read_task(write_task(body + "success: {script: test -f a}\n"))


def test_route_pages_are_checked(write_task, servers, client) -> None:
    docs, canary = servers
    base = f"http://127.0.0.1:{docs.port}"
    dead = f"http://127.0.0.1:{_closed_port()}/"
    pages = [
        f"{base}/ok",
        f"{base}/moved",
        f"{base}/nohead",
        f"{base}/gone",
        f"{base}/away",
        f"{base}/loop",
        dead,
    ]
    task = _task(write_task, pages)
    found = {(f.line, f.code): f.message for f in check_urls(task, client)}
    assert set(found) == {
        (8, Code.DOCS_UNREACHABLE),
        (9, Code.DOCS_REDIRECT_OUTSIDE_ALLOW),
        (10, Code.DOCS_UNREACHABLE),
        (11, Code.DOCS_UNREACHABLE),
    }
    assert found[(8, Code.DOCS_UNREACHABLE)] == f"{base}/gone: answered HTTP 404"
    assert "more than 10 redirects" in found[(10, Code.DOCS_UNREACHABLE)]
    assert found[(11, Code.DOCS_UNREACHABLE)].startswith(f"{dead}: unreachable (ConnectError")
    # The off-list hop was reported, never taken.
    assert canary.seen == []
    # HEAD refused, GET asked before judging.
    assert ("GET", "/nohead") in docs.seen


def test_validate_with_check_urls(write_task, servers, client) -> None:
    docs, _ = servers
    good = _task(write_task, [f"http://127.0.0.1:{docs.port}/ok"]).path
    findings, code = validate_paths([good], check_urls=True, client=client)
    assert (findings, code) == ([], EXIT_OK)
    bad = write_task(
        f"name: b\ngoal: g\ndocs: {{entrypoint: 'http://127.0.0.1:{docs.port}/gone'}}\n"
        "success: {script: test -f a}\n",
        name="bad.yaml",
    )
    findings, code = validate_paths([good, bad], check_urls=True, client=client)
    assert code == EXIT_INVALID
    assert [(f.severity, f.code, f.file, f.line) for f in findings] == [
        (Severity.ERROR, Code.DOCS_UNREACHABLE, str(bad), 3)
    ]
