"""``firstrun init`` drafts a task from a fixture site, runs it once, and the draft holds.

The site is served through ``--docs-mirror`` from a directory; the draft runs
in the real sandbox with replay. Judged by the task file written, what init
printed, ``validate``'s findings and a later ``run`` of the draft.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from e2e_support import FIRSTRUN, runs_by_task

from firstrun.tasks.load import load_tasks

pytestmark = pytest.mark.e2e

HOST = "greeter.docs.example"
URL = f"https://{HOST}/index.html"
PAGE = """<!doctype html><html><head><title>Greeter quickstart</title></head><body><main>
<h1>Greeter quickstart</h1>
<h2>Write the greeter</h2>
<p>Save this as <code>greet.py</code>:</p>
<pre><code class="language-python">import sys
print("Hello from Python", sys.version.split()[0])
print("Greeted 3 people in 0.01s")</code></pre>
<h2>Run it</h2>
<pre><code class="language-console">$ python3 greet.py
Hello from Python 3.12.1
Greeted 3 people in 0.02s</code></pre>
</main></body></html>
"""


def firstrun(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FIRSTRUN), *args], capture_output=True, text=True, cwd=cwd,
                          stdin=subprocess.DEVNULL, timeout=600)


def site(root: Path, page: str = PAGE) -> str:
    (root / "site").mkdir(exist_ok=True)
    (root / "site" / "index.html").write_text(page)
    return f"{HOST}={root / 'site'}"


def codes(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line.rsplit("[", 1)[-1].rstrip("]") for line in proc.stdout.splitlines()]


def test_a_draft_passes_as_drafted_and_validate_says_it_is_drafted(tmp_path: Path) -> None:
    mirror = site(tmp_path)
    task_file = tmp_path / "greet.yaml"
    done = firstrun("init", URL, "--docs-mirror", mirror, "--out", str(task_file),
                    "--results", str(tmp_path / "first"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "draft run: passed (passed)" in done.stdout
    assert f"  ok   step {URL} block 1: python3 greet.py" in done.stdout
    # The page's Python is 3.12.1 and its timing 0.02s; the sandbox's differ, and still match.
    assert "  ok   output matches Hello[[:space:]]+from[[:space:]]+Python[[:space:]]+v?[0-9]" in done.stdout
    (task,) = load_tasks([task_file])
    assert task.spec.replay_docs is not None and task.docs_route == (URL,)
    assert task.spec.goal == ('Following the docs "Greeter quickstart", do what they show, in order: '
                              "Write the greeter; Run it.")
    assert "test -e greet.py || qs_fail 'no greet.py, the file the docs write'" in task.check
    lint = firstrun("validate", str(task_file), "--docs-mirror", mirror)
    assert "check_drafted" in codes(lint), lint.stdout
    edited = task_file.read_text().replace("test -e greet.py", "test -s greet.py")
    task_file.write_text(edited)
    assert "check_drafted" not in codes(firstrun("validate", str(task_file), "--docs-mirror", mirror))
    again = firstrun("init", URL, "--docs-mirror", mirror, "--out", str(task_file),
                     "--results", str(tmp_path / "second"))
    assert again.returncode == 3 and "already exists" in again.stderr
    assert task_file.read_text() == edited
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "greet.yaml", "site"]


def test_the_drafted_check_fails_when_the_documented_output_changes(tmp_path: Path) -> None:
    mirror = site(tmp_path)
    task_file = tmp_path / "greet.yaml"
    done = firstrun("init", URL, "--docs-mirror", mirror, "--out", str(task_file),
                    "--results", str(tmp_path / "draft"))
    assert done.returncode == 0, done.stdout + done.stderr
    site(tmp_path, PAGE.replace('print("Hello from Python"', 'print("Goodbye from Python"'))
    out = tmp_path / "later"
    run = firstrun("run", str(task_file), "--docs-mirror", mirror, "--out", str(out))
    assert run.returncode == 1, run.stdout + run.stderr
    record = runs_by_task(out)["greeter-docs-example"]
    assert (record["classification"], record["reason"]) == ("docs_gap", "check_failed")
    assert "nothing the run printed matches matches 'Hello" in record["detail"]


def test_pages_showing_no_output_and_no_file_get_a_check_that_fails_until_written(tmp_path: Path) -> None:
    mirror = site(tmp_path, '<html><head><title>T</title></head><body><h1>T</h1>'
                            '<pre><code class="language-bash">echo hi</code></pre></body></html>')
    done = firstrun("init", URL, "--docs-mirror", mirror, "--out", str(tmp_path / "t.yaml"),
                    "--results", str(tmp_path / "r"))
    assert done.returncode == 1 and "draft run: docs_gap (check_failed)" in done.stdout
    assert "EDIT ME (firstrun init)" in (tmp_path / "t.yaml").read_text()


@pytest.mark.parametrize(("page", "argv", "says"), [
    ("<html><body><p>No code here.</p></body></html>", [],
     f"firstrun: error: init: {URL} shows no shell or file block to replay (0 code blocks in all), "
     "so there is nothing to draft a task from"),
    (PAGE, [f"https://{HOST}/missing.html"],
     f"firstrun: error: init: URL 'https://{HOST}/missing.html' could not be read (http_error"),
    (PAGE, ["ftp://greeter.docs.example/"], "firstrun: error: init: URL 'ftp://greeter.docs.example/' is not"),
], ids=["no-code-blocks", "unreadable-page", "not-http"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, page: str, argv: list[str], says: str) -> None:
    mirror = site(tmp_path, page)
    done = firstrun("init", URL, *argv, "--docs-mirror", mirror, "--out", str(tmp_path / "t.yaml"),
                    "--results", str(tmp_path / "r"))
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith(says), done.stderr
    assert not (tmp_path / "t.yaml").exists() and not (tmp_path / "r").exists()
