"""Documentation affordances: ``--affordances none`` hides llms.txt, llms-full.txt and .md
variants from read_docs; ``--probe-affordances`` records which exist without changing
what the agent can read.

The docs site is a real HTTP server on loopback, mirrored as the task's docs
host, that has every affordance. Hiding is judged by what the server saw
(a hidden URL is never requested), by the page error the model was sent,
and by the trace; the probe by its record against the files' real sizes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from firstrun.docs import (
    AffordanceFilter,
    Affordances,
    DocsReader,
    Mirror,
    ReadFailure,
    default_user_agent,
    probe_affordances,
)
from firstrun.docs.affordances import candidates, is_affordance, markdown_variant
from firstrun.policy.hosts import HostPattern
from firstrun.results.model import Classification
from firstrun.run.events import DocsRead, Event, read_trace
from firstrun.run.runner import RunConfig, run_task
from support import openai_wire as wire
from support.agents import DOCS, DOCS_HOST, greeter_task
from support.agents import openai_agent as agent
from support.vendor import VendorServer

pytestmark = pytest.mark.fast

FIRSTRUN = Path(sys.executable).parent / "firstrun"
GREET = "printf 'hello, reader\\n' > greeting.txt"
HTML = "text/html; charset=utf-8"
INDEX = (b"<!doctype html><html><head><title>Greeter quickstart</title></head><body>"
         b"<h1>Greeter quickstart</h1><pre><code>printf 'hello, reader\\n' > greeting.txt"
         b"</code></pre><p><a href='/install.html'>Install</a></p></body></html>")
LLMS = b"# Greeter\n\n> A greeting tool.\n\n- [Quickstart](http://docs.greeter.test/index.html.md)\n"
LLMS_FULL = b"# Greeter\n\n" + b"Write the greeting with printf.\n" * 40
INDEX_MD = b"# Greeter quickstart\n\n```\nprintf 'hello, reader\\n' > greeting.txt\n```\n"


@dataclass
class Site:
    """A docs site on 127.0.0.1: ``routes`` maps a path to (status, content type, body,
    headers); everything else is 404. ``seen`` is every path requested."""

    routes: Mapping[str, tuple[int, str, bytes, dict[str, str]]]
    seen: list[str] = field(default_factory=list)
    url: str = ""


def full_site() -> dict[str, tuple[int, str, bytes, dict[str, str]]]:
    return {
        "/": (200, HTML, INDEX, {}),
        "/robots.txt": (200, "text/plain", b"User-agent: *\nAllow: /\n", {}),
        "/install.html": (200, HTML, b"<html><body><h1>Install</h1></body></html>", {}),
        "/llms.txt": (200, "text/plain; charset=utf-8", LLMS, {}),
        "/llms-full.txt": (200, "text/plain; charset=utf-8", LLMS_FULL, {}),
        "/index.html.md": (200, "text/markdown; charset=utf-8", INDEX_MD, {}),
        "/install.html.md": (200, "text/markdown; charset=utf-8", b"# Install\n", {}),
        # An old page that moved to its markdown variant: the redirect is an affordance too.
        "/old-quickstart": (301, HTML, b"", {"Location": "/index.html.md"}),
    }


@pytest.fixture
def serve() -> Iterator:
    servers: list[ThreadingHTTPServer] = []

    def start(routes: Mapping[str, tuple[int, str, bytes, dict[str, str]]]) -> Site:
        site = Site(routes=routes)
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                with lock:
                    site.seen.append(self.path)
                status, content_type, body, headers = site.routes.get(
                    self.path, (404, "text/plain", b"no such page", {}))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        site.url = f"http://127.0.0.1:{server.server_address[1]}"
        return site

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def reader(site: Site, hidden: AffordanceFilter | None) -> DocsReader:
    return DocsReader(allow=[HostPattern.parse(DOCS_HOST)], proxy=None, cache_dir=None,
                      user_agent=default_user_agent(), min_delay_s=0.0,
                      mirrors={DOCS_HOST: Mirror(host=DOCS_HOST, base_url=site.url)},
                      hidden=hidden)


def run_config(tmp_path: Path, site: Site, **options) -> RunConfig:
    return RunConfig(out_dir=tmp_path / "out", backend="fake", allow_unenforced=True,
                     docs_mirrors={DOCS_HOST: Mirror(host=DOCS_HOST, base_url=site.url)},
                     **options)


def test_affordances_are_known_by_their_path_alone() -> None:
    for path in ("/llms.txt", "/docs/llms-full.txt", "/LLMS.TXT", "/guide/install.md",
                 "/index.html.md"):
        assert is_affordance(path), path
    for path in ("/", "/install.html", "/llms.txt.html", "/docs/llms", "/notes.mdx", "/md"):
        assert not is_affordance(path), path
    assert markdown_variant("http://h.test/docs/") == "http://h.test/docs/index.html.md"
    assert markdown_variant("http://h.test/docs/install#step-2") == "http://h.test/docs/install.md"
    assert markdown_variant("http://h.test/a.html?x=1") == "http://h.test/a.html.md"
    assert markdown_variant("http://h.test/README.md") is None
    assert candidates(["http://h.test/docs/a.html", "http://h.test/docs/b.html"]) == [
        ("llms.txt", "http://h.test/llms.txt", None),
        ("llms-full.txt", "http://h.test/llms-full.txt", None),
        ("llms.txt", "http://h.test/docs/llms.txt", None),
        ("llms-full.txt", "http://h.test/docs/llms-full.txt", None),
        ("md", "http://h.test/docs/a.html.md", "http://h.test/docs/a.html"),
        ("md", "http://h.test/docs/b.html.md", "http://h.test/docs/b.html"),
    ]


def test_hidden_affordances_are_refused_before_any_request(serve) -> None:
    site = serve(full_site())
    route = (DOCS, f"http://{DOCS_HOST}/route-page.md")
    with reader(site, AffordanceFilter.for_route(route)) as docs:
        pages = {path: docs.read(f"http://{DOCS_HOST}{path}")
                 for path in ("/llms.txt", "/llms-full.txt", "/install.html.md", "/install.html")}
        moved = docs.read(f"http://{DOCS_HOST}/old-quickstart")
        on_route = docs.read(route[1])
    for path in ("/llms.txt", "/llms-full.txt", "/install.html.md"):
        page = pages[path]
        assert page.error is ReadFailure.AFFORDANCE_HIDDEN and page.status is None, path
        assert page.to_record()["error"] == "affordance_hidden"
    assert pages["/install.html"].ok
    # A redirect onto a variant is refused at that hop, and the chain is on record.
    assert moved.error is ReadFailure.AFFORDANCE_HIDDEN
    assert moved.hops == (f"http://{DOCS_HOST}/old-quickstart", f"http://{DOCS_HOST}/index.html.md")
    # A .md page the task's route names is the docs under test, never hidden.
    assert on_route.error is ReadFailure.HTTP_ERROR and on_route.status == 404
    # Evidence: the server never saw a hidden URL.
    assert [p for p in site.seen if is_affordance(p)] == ["/route-page.md"]
    assert "/old-quickstart" in site.seen


def test_without_hiding_every_affordance_reads(serve) -> None:
    site = serve(full_site())
    with reader(site, None) as docs:
        llms = docs.read(f"http://{DOCS_HOST}/llms.txt")
        moved = docs.read(f"http://{DOCS_HOST}/old-quickstart")
    assert llms.ok and llms.bytes == len(LLMS) and "A greeting tool." in llms.markdown
    assert moved.ok and moved.url_final == f"http://{DOCS_HOST}/index.html.md"


def test_the_probe_finds_what_exists_and_how_large(serve) -> None:
    site = serve(full_site())
    route = (DOCS, f"http://{DOCS_HOST}/install.html")
    with reader(site, AffordanceFilter.for_route(route)) as docs:
        probe = probe_affordances(docs, route)
        # Probing hid nothing less from the agent's reads.
        assert docs.read(f"http://{DOCS_HOST}/llms.txt").error is ReadFailure.AFFORDANCE_HIDDEN
    summary = probe.summary()
    assert summary["llms.txt"] == {"exists": True, "bytes": len(LLMS),
                                   "urls": [f"http://{DOCS_HOST}/llms.txt"]}
    assert summary["llms-full.txt"]["exists"] and summary["llms-full.txt"]["bytes"] == len(LLMS_FULL)
    assert summary["md"] == {"pages": 2, "exist": 2, "bytes": len(INDEX_MD) + len(b"# Install\n")}
    (index_md,) = [r for r in probe.checked if r.page == DOCS]
    assert (index_md.url, index_md.status, index_md.exists) == (
        f"http://{DOCS_HOST}/index.html.md", 200, True)
    assert sorted(site.seen) == sorted(["/robots.txt", "/llms.txt", "/llms-full.txt",
                                        "/index.html.md", "/install.html.md"])


def test_a_catch_all_html_page_is_not_an_affordance(serve) -> None:
    # A single-page app answers 200 with its HTML shell for every path.
    shell = (200, HTML, b"<html><body><div id='app'></div></body></html>", {})
    site = serve({"/robots.txt": (404, "text/plain", b"", {}), "/": shell,
                  "/llms.txt": shell, "/llms-full.txt": shell, "/index.html.md": shell})
    with reader(site, None) as docs:
        summary = probe_affordances(docs, (DOCS,)).summary()
    assert not summary["llms.txt"]["exists"] and not summary["llms-full.txt"]["exists"]
    assert summary["md"] == {"pages": 1, "exist": 0, "bytes": 0}


def _llms_transcript():
    return wire.script(
        wire.completion(None, wire.read_docs(f"http://{DOCS_HOST}/llms.txt")),
        wire.completion(None, wire.bash(GREET)),
        wire.completion("Done."),
    )


def _docs_reads(events: list[Event]) -> list[dict]:
    return [e.page for e in events if isinstance(e, DocsRead)]


@pytest.mark.parametrize("mode", [Affordances.NONE, Affordances.ALL])
def test_two_runs_differ_only_in_what_read_docs_may_read(serve, tmp_path: Path,
                                                         mode: Affordances) -> None:
    site = serve(full_site())
    events: list[Event] = []
    with VendorServer(_llms_transcript()) as server:
        record = run_task(greeter_task(tmp_path), attempt=1, agent=agent(server.url),
                          config=run_config(tmp_path, site, affordances=mode),
                          on_event=events.append)
    assert record.classification is Classification.PASSED
    (page,) = _docs_reads(events)
    (result,) = wire.tool_results(server.seen()[1])
    if mode is Affordances.NONE:
        assert page["error"] == "affordance_hidden" and record.pages[0].error == "affordance_hidden"
        assert result["content"].startswith(
            "error: the page could not be read (affordance_hidden: /llms.txt is a docs affordance")
        assert "/llms.txt" not in site.seen
    else:
        assert page["error"] is None and page["bytes"] == len(LLMS)
        assert "A greeting tool." in result["content"] and "/llms.txt" in site.seen
    assert "affordances" not in record.extra  # nothing probed


def test_a_probing_run_records_the_affordances_and_hides_them_all_the_same(
        serve, tmp_path: Path) -> None:
    site = serve(full_site())
    events: list[Event] = []
    config = run_config(tmp_path, site, affordances=Affordances.NONE, probe_affordances=True)
    with VendorServer(_llms_transcript()) as server:
        record = run_task(greeter_task(tmp_path), attempt=1, agent=agent(server.url),
                          config=config, on_event=events.append)
    summary = record.extra["affordances"]
    assert summary["llms.txt"]["exists"] and summary["llms.txt"]["bytes"] == len(LLMS)
    assert summary["llms-full.txt"]["bytes"] == len(LLMS_FULL)
    assert summary["md"] == {"pages": 1, "exist": 1, "bytes": len(INDEX_MD)}
    # The probe is in the trace, before the agent's first read, and is not one of its reads.
    trace = read_trace(config.out_dir / record.trace)
    kinds = [line["kind"] for line in trace]
    assert kinds.index("affordance_probe") < kinds.index("model_turn")
    (probe,) = [line for line in trace if line["kind"] == "affordance_probe"]
    assert probe["summary"] == summary and len(probe["checked"]) == 3
    (page,) = _docs_reads(events)
    assert page["error"] == "affordance_hidden" and len(record.pages) == 1
    # The probe read llms.txt once; the agent's read of it never reached the server.
    assert site.seen.count("/llms.txt") == 1


def test_the_cli_takes_the_flags_and_records_the_mode(serve, tmp_path: Path) -> None:
    site = serve(full_site())
    task = greeter_task(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "FIRSTRUN_OPENAI_API_KEY": "sk-openai-test-key"}
    with VendorServer(_llms_transcript()) as server:
        done = subprocess.run(
            [str(FIRSTRUN), "run", str(task.path), "--agent", "openai", "--model", wire.MODEL,
             "--base-url", f"{server.url}/v1", "--backend", "fake", "--allow-unenforced",
             "--out", str(out),
             "--docs-mirror", f"{DOCS_HOST}={site.url}",
             "--affordances", "none", "--probe-affordances"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["meta"]["affordances"] == "none"
    assert results["meta"]["probe_affordances"] is True
    (run,) = results["runs"]
    assert run["extra"]["affordances"]["llms.txt"]["exists"]
    assert run["pages"][0]["error"] == "affordance_hidden"
    bad = subprocess.run([str(FIRSTRUN), "run", str(task.path), "--affordances", "some"],
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert bad.returncode == 3 and "--affordances" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
