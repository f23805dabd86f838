"""``firstrun validate`` against the route's pages: drift, replay: docs, and pages it cannot read.

Driven through the real console script; the pages are files served by a
``--docs-mirror`` directory, or a real HTTP server on loopback.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.servers import LoopbackServer, QuietHandler

Run = Callable[..., subprocess.CompletedProcess[str]]

HOST = "guide.docs.example"
INSTALL = """<!doctype html><html><head><title>Install</title></head><body><main>
<h1>Install</h1>
<pre><code class="language-bash">python3 -m venv .venv
.venv/bin/pip install greeter</code></pre>
<p>Save this as <code>hello.py</code>:</p>
<pre><code class="language-python">import greeter
greeter.hello()</code></pre>
<pre><code class="language-console">$ greeter login --token &lt;your-token&gt;</code></pre>
</main></body></html>
"""
PROSE = "<!doctype html><html><body><main><h1>About</h1><p>No code here.</p></main></body></html>"
HEAD = f"""name: guide
goal: Install greeter as the guide says.
docs:
  path:
    - https://{HOST}/install.html
success:
  script: test -f hello.py || qs_fail "no hello.py"
"""


def site(tmp_path: Path, pages: dict[str, str]) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, html in pages.items():
        (docs / name).write_text(html)
    return docs


def task(tmp_path: Path, replay: str, head: str = HEAD) -> Path:
    path = tmp_path / "guide.yaml"
    path.write_text(head + replay)
    return path


def lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in proc.stderr
    return proc.stdout.splitlines()


def test_a_hand_written_step_no_page_shows_is_drift_at_its_line(firstrun: Run, tmp_path: Path) -> None:
    docs = site(tmp_path, {"install.html": INSTALL})
    path = task(tmp_path, (
        "replay:\n"
        "  - python3 -m venv .venv\n"                   # line 9: on the page
        "  - .venv/bin/pip install greeter==0.9\n"      # line 10: no longer on the page
        "  - run: touch .ready\n"                       # line 11: marked, not drift
        "    undocumented: the guide assumes a marker\n"
        "  - |\n"                                       # line 13: the page's file, by heredoc
        "    cat > hello.py <<'PY'\n"
        "    import greeter\n"
        "    greeter.hello()\n"
        "    PY\n"))
    proc = firstrun("validate", str(path), "--docs-mirror", f"{HOST}={docs}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert lines(proc) == [
        f"{path}:10: warning: replay step 2 matches no code block on the route: "
        f".venv/bin/pip install greeter==0.9; nearest: https://{HOST}/install.html block 0: "
        "python3 -m venv .venv ...; if no page is meant to show it, mark it "
        "{run: ..., undocumented: WHY} [replay_drift]"]


def test_pages_not_readable_offline_are_said_in_one_line(firstrun: Run, tmp_path: Path) -> None:
    path = task(tmp_path, "replay:\n  - python3 -m venv .venv\n")
    proc = firstrun("validate", str(path))
    assert proc.returncode == 0
    assert lines(proc) == [
        f"{path}:8: note: replay not compared with the docs: {HOST} not read offline "
        "(--check-urls reads the route; --docs-mirror HOST=DIR serves it from a directory) "
        "[route_not_read]"]


def test_a_route_page_that_cannot_be_read_names_its_line(firstrun: Run, tmp_path: Path) -> None:
    docs = site(tmp_path, {"index.html": PROSE})
    path = task(tmp_path, "replay: docs\n")
    proc = firstrun("validate", str(path), "--docs-mirror", f"{HOST}={docs}")
    (line,) = lines(proc)
    assert line.startswith(f"{path}:5: warning: route page https://{HOST}/install.html could "
                           "not be read (http_error: HTTP 404); replay not compared with the docs")


def test_replay_docs_says_what_it_will_run_and_what_it_needs(firstrun: Run, tmp_path: Path) -> None:
    docs = site(tmp_path, {"install.html": INSTALL})
    path = task(tmp_path, "replay: docs\n")
    proc = firstrun("validate", str(path), "--docs-mirror", f"{HOST}={docs}")
    assert proc.returncode == 0
    assert lines(proc) == [
        f"{path}:8: warning: https://{HOST}/install.html block 2 needs a value for <your-token>; "
        "without one under replay.values the run stops there (needs_input) [replay_needs_input]",
        f"{path}:8: note: replay: docs takes 4 steps from https://{HOST}/install.html "
        "blocks 0, 1, 2 [replay_steps]"]
    given = task(tmp_path, "replay:\n  from: docs\n  values: {your-token: t0k}\n")
    assert [line.rsplit("[", 1)[1] for line in lines(
        firstrun("validate", str(given), "--docs-mirror", f"{HOST}={docs}"))] == ["replay_steps]"]


def test_a_route_with_no_code_block_is_an_error(firstrun: Run, tmp_path: Path) -> None:
    docs = site(tmp_path, {"install.html": PROSE})
    path = task(tmp_path, "replay: docs\n")
    proc = firstrun("validate", str(path), "--docs-mirror", f"{HOST}={docs}")
    assert proc.returncode == 1
    assert lines(proc) == [
        f"{path}:8: error: replay: docs has nothing to run: the route's pages show no code block, "
        "none of them a shell or file block [replay_nothing_to_run]"]


def test_a_skip_naming_no_block_is_an_error_at_its_line(firstrun: Run, tmp_path: Path) -> None:
    docs = site(tmp_path, {"install.html": INSTALL})
    path = task(tmp_path, (
        "replay:\n  from: docs\n  values: {your-token: t0k}\n  skip:\n"
        f"    - page: https://{HOST}/install.html\n      block: 7\n"))
    proc = firstrun("validate", str(path), "--docs-mirror", f"{HOST}={docs}")
    assert proc.returncode == 1
    assert lines(proc)[0] == (
        f"{path}:12: error: replay.skip names block 7 of https://{HOST}/install.html, which has "
        "3 code blocks [replay_no_such_block]")


@pytest.fixture
def loopback() -> Iterator[str]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            body = INSTALL.encode() if self.path == "/install.html" else b"not found"
            self.send_response(200 if self.path == "/install.html" else 404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with LoopbackServer(Handler) as server:
        yield server.url


def test_check_urls_reads_the_route_over_the_network(firstrun: Run, tmp_path: Path, loopback: str) -> None:
    head = HEAD.replace(f"https://{HOST}", loopback)
    path = task(tmp_path, "replay:\n  - .venv/bin/pip install greeter==0.9\n", head=head)
    proc = firstrun("validate", str(path), "--check-urls")
    assert [line.rsplit("[", 1)[1] for line in lines(proc)] == ["replay_drift]"]


def test_a_bad_mirror_flag_is_one_line_naming_it(firstrun: Run, tmp_path: Path) -> None:
    path = task(tmp_path, "replay: docs\n")
    proc = firstrun("validate", str(path), "--docs-mirror", "no-equals-sign")
    assert proc.returncode == 3
    (line,) = proc.stderr.splitlines()
    assert "--docs-mirror" in line and "Traceback" not in proc.stderr
