"""Helpers for end-to-end runs: the real ``firstrun`` console script, real docs servers on loopback.

Results are judged by reading what the run saved (``results.json`` and each
run's ``trace.jsonl``) and by what the servers saw, never by the CLI's
terminal output alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.servers import LoopbackServer, QuietHandler

FIRSTRUN = Path(sys.executable).parent / "firstrun"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TASKS = FIXTURES / "tasks"
DOCS = FIXTURES / "docs"
# The fixture tasks' docs host, served from DOCS unless a test serves it otherwise.
DOCS_HOST = "fixture.docs.example"


def task(name: str) -> str:
    return str(TASKS / f"{name}.yaml")


def runs_by_task(out: Path) -> dict[str, dict[str, Any]]:
    """The saved runs of ``out/results.json``, by task name (one attempt each)."""
    document = json.loads((out / "results.json").read_text())
    runs: dict[str, dict[str, Any]] = {}
    for run in document["runs"]:
        assert run["task"] not in runs, f"{run['task']} ran twice"
        runs[run["task"]] = run
    return runs


def trace_of(out: Path, run: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of one run's trace, in order, as written."""
    path = out / run["trace"]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def events(trace: list[dict[str, Any]], kind: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in trace if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


Run = Callable[..., subprocess.CompletedProcess[str]]


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    path: str
    user_agent: str | None


class DocsServer(LoopbackServer):
    """An HTTP server on 127.0.0.1 that answers from ``answers`` and records every request."""

    def __init__(self, answers: dict[str, Answer]) -> None:
        self.answers = answers
        self.seen: list[Request] = []
        server = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                server.seen.append(Request(self.path, self.headers.get("User-Agent")))
                answer = server.answers.get(self.path, Answer(status=404, body=b"not found"))
                self.send_response(answer.status)
                headers = {"Content-Type": "text/html; charset=utf-8", **answer.headers}
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

        super().__init__(Handler)
        self.origin = self.url


def site_answers() -> dict[str, Answer]:
    """The fixture docs site, page for page, as a server's answers."""
    return {f"/{p.name}": Answer(body=p.read_bytes()) for p in DOCS.glob("*.html")}
