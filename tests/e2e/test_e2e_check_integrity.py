"""Nothing the agent leaves behind can forge, read or race the success check.

Each task here is an attack a quickstart page could ask for, run through the
real console script on a real backend. The runs are judged by what they
saved and by canary files the test controls, kept with ``--keep-sandbox``:
a process left by the agent that saw the check, read its environment,
signalled it or wrote into the workspace while it ran leaves its mark there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e_support import events, runs_by_task, trace_of

from firstrun.images.build import image_present
from firstrun.run.check import TRUSTED_PATH, check_port

pytestmark = pytest.mark.e2e

DOCS_HOST = "docs.integrity.test"
DOCKER_IMAGE = "firstrun/python:3.11"


def _backends() -> list[Any]:
    docker = pytest.param("docker", marks=pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("docker") is None,
        reason="the docker backend needs root and a dockerd (scripts/test provides both)"))
    return ["linux", docker]


@pytest.fixture
def run_task(tmp_path: Path, firstrun) -> Callable[..., tuple[dict[str, Any], Path, list]]:  # type: ignore[no-untyped-def]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.html").write_text("<html><body><h1>Install</h1><pre>pip install tool</pre>"
                                     "</body></html>")

    def run(name: str, body: str, backend: str, *extra: str,
            env: dict[str, str] | None = None) -> tuple[dict[str, Any], Path, list]:
        if backend == "docker" and not image_present(DOCKER_IMAGE):
            pytest.skip(f"{DOCKER_IMAGE} is not built (firstrun images build)")
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\ngoal: Install the tool the docs describe.\n"
                        f"docs:\n  path: [https://{DOCS_HOST}/]\n  allow: [{DOCS_HOST}]\n"
                        + textwrap.dedent(body))
        out = tmp_path / f"out-{name}"
        done = firstrun("run", str(path), "--agent", "replay", "--backend", backend,
                        "--docs-mirror", f"{DOCS_HOST}={docs}", "--out", str(out),
                        "--keep-sandbox", *extra, env=env)
        assert done.returncode in (0, 1), done.stderr
        record = runs_by_task(out)[name]
        return record, out / "runs" / name / "1" / "workspace", trace_of(out, record)

    return run


@pytest.mark.parametrize("backend", _backends())
def test_a_process_left_to_plant_the_checks_file_finds_no_check(run_task, backend: str) -> None:  # type: ignore[no-untyped-def]
    # The issue's own task: a watcher waits for qs_fail to show in the process
    # table, then creates the file the check looks for. The install failed.
    record, workspace, trace = run_task("forge-check", r"""
        replay:
          - run: (for i in $(seq 200); do if ps -eo args | grep -q '[q]s_fail'; then touch installed; fi; sleep 0.05; done) >/dev/null 2>&1 &
            undocumented: a test step, not the guide's
          - run: echo "the installer failed"; false
            undocumented: a test step, not the guide's
        success:
          script: |
            sleep 1
            test -f installed || qs_fail "not installed"
        """, backend)
    assert record["classification"] == "docs_gap", record["detail"]
    assert not (workspace / "installed").exists()
    assert record["check_isolation"] == "clean"
    # The watcher's subshell, and whatever it was running at that moment.
    assert record["killed_before_check"] >= 1
    [isolated] = events(trace, "check_isolated")
    assert isolated["killed"] == record["killed_before_check"]
    kinds = [e["kind"] for e in trace]
    assert kinds.index("check_isolated") < kinds.index("check_finished")


@pytest.mark.parametrize("backend", _backends())
def test_a_spy_left_by_the_agent_never_sees_signals_or_touches_the_check(
        run_task, backend: str) -> None:  # type: ignore[no-untyped-def]
    # The spy looks for the check by its script (cmdline) and its environment
    # (QS_SESSION_LOG is set for the check alone), each name spelled at run
    # time so the spy's own command line never matches. On finding it, it
    # writes what it read to a canary, signals the check and writes the file
    # the check would trust. The check passes only if none of that happened.
    record, workspace, _ = run_task("spy", r"""
        budgets:
          max_command_seconds: 120
        replay:
          - undocumented: a test step, not the guide's
            run: |
              (
                a=CHECK; secret="$a-SECRET"; b=QS_SESSION; envname="${b}_LOG"
                end=$((SECONDS + 100))
                while [ "$SECONDS" -lt "$end" ]; do
                  for p in /proc/[0-9]*; do
                    [ "$p" = "/proc/$BASHPID" ] && continue
                    if grep -qa -- "$secret" "$p/cmdline" 2>/dev/null; then
                      echo "cmdline of ${p#/proc/}" >> spy-leak
                      kill -TERM "${p#/proc/}" 2>/dev/null && echo "signalled ${p#/proc/}" >> spy-leak
                      echo forged > verdict
                    fi
                    if grep -qa -- "$envname" "$p/environ" 2>/dev/null; then
                      echo "environ of ${p#/proc/}" >> spy-leak
                    fi
                  done
                  sleep 0.02
                done
              ) >/dev/null 2>&1 &
          - run: echo "spy started"
            undocumented: a test step, not the guide's
        success:
          script: |
            : CHECK-SECRET
            sleep 3
            test ! -e spy-leak || qs_fail "the spy saw the check: $(cat spy-leak)"
            test ! -e verdict || qs_fail "the spy wrote into the workspace during the check"
        """, backend)
    assert record["classification"] == "passed", record["detail"]
    assert not (workspace / "spy-leak").exists()
    assert not (workspace / "verdict").exists()
    assert record["killed_before_check"] >= 1


@pytest.mark.parametrize("backend", _backends())
def test_a_harness_started_server_is_the_one_process_beside_the_check(
        run_task, backend: str) -> None:  # type: ignore[no-untyped-def]
    record, _, _ = run_task("serve-alone", r"""
        replay:
          - run: (exec -a agent-leftover sleep 1000) >/dev/null 2>&1 &
            undocumented: a test step, not the guide's
          - run: echo started
            undocumented: a test step, not the guide's
        success:
          serve: python3 -m http.server "$QS_PORT" --bind 127.0.0.1
          wait_http:
            path: /
          script: |
            ps -eo args > processes
            ! grep -q '[a]gent-leftover' processes || qs_fail "the agent's process is still here"
            grep -q '[h]ttp.server' processes || qs_fail "the served server is not here"
        """, backend)
    assert record["classification"] == "passed", record["detail"]
    assert (record["check_isolation"], record["killed_before_check"]) == ("clean", 1)


@pytest.mark.parametrize("backend", _backends())
def test_wait_http_with_no_serve_checks_the_agents_server_and_says_shared(
        run_task, backend: str, firstrun, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # quickstarted allows it, so it keeps working; the run says it could be forged.
    port = check_port("agent-server")
    record, _, trace = run_task("agent-server", f"""
        replay:
          - run: nohup python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &
            undocumented: a test step, not the guide's
          - run: sleep 1
            undocumented: a test step, not the guide's
        success:
          wait_http:
            path: /
        """, backend)
    assert record["classification"] == "passed", record["detail"]
    assert (record["check_isolation"], record["killed_before_check"]) == ("shared", None)
    [isolated] = events(trace, "check_isolated")
    assert (isolated["isolation"], isolated["killed"]) == ("shared", None)
    report = firstrun("report", str(tmp_path / "out-agent-server" / "results.json"),
                      "--markdown", str(tmp_path / "summary.md"))
    assert report.returncode == 0, report.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "**Shared checks:** 1 run (agent-server \\#1)" in summary


def test_a_program_planted_on_path_does_not_answer_for_the_check(
        run_task, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Where PATH holds a directory commands may write (the local backend runs
    # with the host's PATH, here one naming the workspace and a /tmp
    # directory), a planted python3 would answer the check's "python3".
    out = tmp_path / "out-planted"
    workspace = out / "runs" / "planted" / "1" / "workspace"
    planted_tmp = Path(f"/tmp/firstrun-test-planted-{os.getpid()}")
    env = {**os.environ, "PATH": f"{workspace}/bin:{planted_tmp}:{os.environ['PATH']}"}
    fake = "#!/bin/sh\\necho forged; exit 0\\n"
    try:
        record, workspace, _ = run_task("planted", f"""
            replay:
              - run: mkdir -p bin {planted_tmp} && printf '{fake}' > bin/python3 && cp bin/python3 {planted_tmp}/python3 && chmod +x bin/python3 {planted_tmp}/python3
                undocumented: a test step, not the guide's
              - run: python3 -c 'print("which?")'
                undocumented: a test step, not the guide's
            success:
              script: |
                test "$(python3 -c 'print(1 + 1)')" = 2 || qs_fail "python3 answered: $(python3 -c 'print(1 + 1)')"
                test "$(command -v python3)" != "$PWD/bin/python3" || qs_fail "the workspace's python3 is on PATH"
            """, "local", "--allow-unenforced", env=env)
        assert (workspace / "bin" / "python3").exists() and (planted_tmp / "python3").exists()
        assert record["classification"] == "passed", record["detail"]
    finally:
        shutil.rmtree(planted_tmp, ignore_errors=True)


def test_the_checks_path_leaves_out_every_place_commands_may_write(tmp_path: Path) -> None:
    # The script's own first lines, run by a real bash over a PATH naming each
    # writable place (and a relative entry) around two system directories.
    home, work, tmp = tmp_path / "home", tmp_path / "work", tmp_path / "tmp"
    for d in (home, work, tmp):
        d.mkdir()
    path = ":".join([f"{work}/node_modules/.bin", "/usr/bin", f"{home}/.local/bin", "bin",
                     f"{tmp}/x", "/tmp/y", "/dev/shm", "/var/tmp/z", f"{work}", "/bin", ""])
    done = subprocess.run(["/bin/bash", "-c", TRUSTED_PATH + '\nprintf %s "$PATH"'], cwd=work,
                          env={"PATH": path, "HOME": str(home), "TMPDIR": str(tmp)},
                          capture_output=True, text=True, check=True)
    assert done.stdout == "/usr/bin:/bin"
