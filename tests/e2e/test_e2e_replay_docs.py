"""``replay: docs`` tests the docs themselves: a broken page fails the run, and says where.

One sweep of copies of the bundled python-tabulate example, each served from
its own edited copy of the docs through ``--docs-mirror``, in the real
sandbox with the install going to the real PyPI through the egress proxy;
judged by what the run saved.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from e2e_support import FIRSTRUN, events, runs_by_task, trace_of

from firstrun.examples import find_example

pytestmark = pytest.mark.e2e

EXAMPLE = find_example("python-tabulate")
INSTALL = '    <pre><code class="language-bash">.venv/bin/pip install tabulate</code></pre>\n'
KEYED = """<!doctype html><html><head><title>Say hello</title></head><body><main>
<h1>Say hello</h1>
<p>Write your token where the greeter looks for it:</p>
<pre><code class="language-console">$ printf '%s\\n' "&lt;your-token&gt;" &gt; token.txt</code></pre>
</main></body></html>
"""


def _copy(root: Path, name: str, edit=None) -> tuple[str, str]:
    """A copy of the example as task ``name`` on host ``name.docs.example``; its mirror flag."""
    host = f"{name}.docs.example"
    docs = root / name / "docs"
    shutil.copytree(EXAMPLE.docs_dir, docs)
    if edit is not None:
        edit(docs)
    text = EXAMPLE.task_path.read_text().replace(EXAMPLE.docs_host, host)
    text = text.replace("name: python-tabulate", f"name: {name}")
    (root / name / "task.yaml").write_text(text)
    return str(root / name / "task.yaml"), f"{host}={docs}"


def _typo(docs: Path) -> None:
    page = docs / "install.html"
    page.write_text(page.read_text().replace("pip install tabulate", "pip install tabulat"))


def _no_install(docs: Path) -> None:
    page = docs / "install.html"
    text = page.read_text()
    assert INSTALL in text
    page.write_text(text.replace(INSTALL, ""))


def _hand_written(root: Path, name: str, steps: list[str]) -> tuple[str, str]:
    """A copy whose replay is a hand-written list, as quickstarted's task files have it."""
    task, mirror = _copy(root, name)
    text = Path(task).read_text().replace(
        "replay: docs\n", "replay:\n" + "".join(f"  - {json.dumps(step)}\n" for step in steps))
    Path(task).write_text(text)
    return task, mirror


PLANETS = (EXAMPLE.docs_dir / "first-table.html").read_text().split(
    '<code class="language-python">', 1)[1].split("</code>", 1)[0].replace("&quot;", '"')
TRANSCRIBED = ["python3 -m venv .venv", ".venv/bin/pip install tabulate",
               f"cat > planets.py <<'PY'\n{PLANETS}\nPY", ".venv/bin/python planets.py"]


def _keyed(root: Path, name: str, values: str) -> tuple[str, str]:
    host = f"{name}.docs.example"
    (root / name / "docs").mkdir(parents=True)
    (root / name / "docs" / "index.html").write_text(KEYED)
    (root / name / "task.yaml").write_text(
        f"name: {name}\ngoal: Write the token to token.txt as the guide says.\n"
        f"docs:\n  path: [https://{host}/index.html]\n"
        f"replay:\n  from: docs\n{values}"
        "success:\n  script: grep -qx s3cret token.txt || qs_fail 'no token in token.txt'\n")
    return str(root / name / "task.yaml"), f"{host}={root / name / 'docs'}"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("replay-docs")
    made = [
        _copy(root, "tabulate-docs"),
        _copy(root, "tabulate-typo", _typo),
        _copy(root, "tabulate-no-install", _no_install),
        _copy(root, "tabulate-no-page", lambda docs: (docs / "first-table.html").unlink()),
        # Its task names a docs host no mirror serves and no resolver knows.
        (_copy(root, "tabulate-gone")[0], None),
        _keyed(root, "keyed-given", "  values: {your-token: s3cret}\n"),
        _keyed(root, "keyed-missing", ""),
        _hand_written(root, "tabulate-transcribed", TRANSCRIBED),
        _hand_written(root, "tabulate-drift", ["python3 -m venv .venv",
                                               ".venv/bin/pip install tabulate==0.8.10",
                                               ".venv/bin/python planets.py"]),
    ]
    out = root / "out"
    argv = [str(FIRSTRUN), "run", "--agent", "replay", "--out", str(out)]
    for _, mirror in made:
        if mirror is not None:
            argv += ["--docs-mirror", mirror]
    argv += [task for task, _ in made]
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900)
    assert (out / "results.json").exists(), done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return out


def _agent_commands(out: Path, task: str) -> list[dict]:
    return events(trace_of(out, runs_by_task(out)[task]), "command", source="agent")


def test_the_docs_as_written_pass_and_every_step_names_its_page_and_block(out: Path) -> None:
    run = runs_by_task(out)["tabulate-docs"]
    assert (run["classification"], run["reason"]) == ("passed", "passed")
    site = "https://tabulate-docs.docs.example"
    assert [(c["origin"]["page"], c["origin"]["block"]) for c in _agent_commands(out, "tabulate-docs")] == [
        (f"{site}/install.html", 0), (f"{site}/install.html", 1), (f"{site}/install.html", 3),
        (f"{site}/first-table.html", 0), (f"{site}/first-table.html", 1)]


def test_a_typo_on_the_page_is_a_docs_gap_naming_that_page_and_block(out: Path) -> None:
    run = runs_by_task(out)["tabulate-typo"]
    assert (run["classification"], run["reason"]) == ("docs_gap", "replay_step_failed")
    assert run["detail"] == ("https://tabulate-typo.docs.example/install.html block 1 exited 1: "
                             ".venv/bin/pip install tabulat")
    failed = _agent_commands(out, "tabulate-typo")[-1]
    assert failed["command"] == ".venv/bin/pip install tabulat" and failed["exit_code"] == 1
    assert failed["origin"] == {"page": "https://tabulate-typo.docs.example/install.html", "block": 1}


def test_a_deleted_install_block_is_a_docs_gap_at_the_step_that_needed_it(out: Path) -> None:
    run = runs_by_task(out)["tabulate-no-install"]
    assert (run["classification"], run["reason"]) == ("docs_gap", "replay_step_failed")
    # The page's blocks are counted anew: the version check is now block 2.
    assert run["detail"].startswith(
        "https://tabulate-no-install.docs.example/install.html block 2 exited 1: "
        ".venv/bin/python -c")
    assert not any("pip install" in c["command"] for c in _agent_commands(out, "tabulate-no-install"))


def test_a_route_page_that_cannot_be_read_is_a_docs_gap_naming_it(out: Path) -> None:
    run = runs_by_task(out)["tabulate-no-page"]
    assert run["classification"] == "docs_gap"
    assert run["detail"].startswith(
        "route page https://tabulate-no-page.docs.example/first-table.html could not be read "
        "(http_error: HTTP 404)")


def test_a_docs_site_that_cannot_be_reached_is_an_infra_error_not_a_gap(out: Path) -> None:
    run = runs_by_task(out)["tabulate-gone"]
    assert (run["classification"], run["reason"]) == ("infra_error", "agent_infra_error")
    assert run["detail"].startswith(
        "route page https://tabulate-gone.docs.example/index.html could not be reached (")
    assert run["detail"].endswith("so this run is no evidence about the docs")
    assert _agent_commands(out, "tabulate-gone") == []


def test_a_value_the_task_gives_fills_the_placeholder(out: Path) -> None:
    run = runs_by_task(out)["keyed-given"]
    assert (run["classification"], run["reason"]) == ("passed", "passed")
    assert [c["command"] for c in _agent_commands(out, "keyed-given")] == [
        "printf '%s\\n' \"s3cret\" > token.txt"]


def test_a_value_the_task_does_not_give_stops_the_run_before_its_step(out: Path) -> None:
    run = runs_by_task(out)["keyed-missing"]
    assert (run["classification"], run["reason"]) == ("skipped", "needs_input")
    assert run["detail"] == ("https://keyed-missing.docs.example/index.html block 0 needs a value "
                             "for <your-token>; give it under replay.values")
    assert _agent_commands(out, "keyed-missing") == []
    assert run["check_exit"] is None


def test_a_hand_written_transcription_of_the_docs_still_runs_unchanged(out: Path) -> None:
    run = runs_by_task(out)["tabulate-transcribed"]
    assert (run["classification"], run["reason"]) == ("passed", "passed")
    commands = _agent_commands(out, "tabulate-transcribed")
    assert [c["command"] for c in commands] == TRANSCRIBED
    assert all(c["origin"] is None for c in commands)


def test_a_hand_written_step_no_longer_in_the_docs_is_drift_and_no_evidence(out: Path) -> None:
    run = runs_by_task(out)["tabulate-drift"]
    assert (run["classification"], run["reason"]) == ("skipped", "replay_drift")
    assert run["detail"] == (
        "step 2 matches no code block on the route: .venv/bin/pip install tabulate==0.8.10; "
        "nearest: https://tabulate-drift.docs.example/install.html block 1: "
        ".venv/bin/pip install tabulate")
    trace = trace_of(out, run)
    assert _agent_commands(out, "tabulate-drift") == []
    assert [e["stop"] for e in events(trace, "agent_finished")] == ["replay_drift"]
    # The route's blocks are in the trace, so the drift can be judged from it alone.
    blocks = {(b["page"], b["index"]): b for r in events(trace, "docs_read") for b in r["page"]["blocks"]}
    nearest = blocks[("https://tabulate-drift.docs.example/install.html", 1)]
    assert [step["command"] for step in nearest["steps"]] == [".venv/bin/pip install tabulate"]
    assert run["check_exit"] is None
