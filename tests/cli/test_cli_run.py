"""``firstrun run``, ``check`` and ``show`` end to end: the real script, a real sandbox, a fixture docs site.

The docs site is a directory served by ``--docs-mirror``; the runs use the
replay agent, the real proxy and the real linux backend, and no package is
installed, so nothing leaves loopback. Exit statuses 0, 1, 2 and 130 are all
reached for real, and an interrupt is judged by the evidence: results.json
keeps the finished run, and no process the suite started is left in /proc.
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from firstrun.sandbox.select import own_kernel_backend

Run = Callable[..., subprocess.CompletedProcess[str]]

# Not imported from conftest: every test directory has one, and a bare
# ``import conftest`` gets whichever was imported last.
FIRSTRUN = Path(sys.executable).parent / "firstrun"
HERE = Path(__file__).resolve().parent / "run_fixtures"
TASKS = HERE / "tasks"
MIRROR = ["--docs-mirror", f"greeter.docs.example={HERE / 'docs'}"]
# The interrupted run's replay step; the odd number marks its process in /proc.
SLOW_MARK = b"987654.321"


def _runs(out: Path) -> list[dict[str, object]]:
    return json.loads((out / "results.json").read_text())["runs"]


@pytest.mark.parametrize(
    ("task", "code", "classification"),
    [("greet-pass", 0, "passed"), ("greet-gap", 1, "docs_gap"), ("greet-skip", 2, "skipped"),
     ("greet-blocked", 2, "blocked"), ("greet-refused-earlier", 1, "docs_gap")],
)
def test_exit_status_follows_the_evidence(firstrun: Run, tmp_path: Path, task: str, code: int,
                                          classification: str) -> None:
    out = tmp_path / "out"
    proc = firstrun("run", str(TASKS / f"{task}.yaml"), *MIRROR, "--out", str(out))
    assert proc.returncode == code, proc.stdout + proc.stderr
    (run,) = _runs(out)
    assert (run["task"], run["classification"], run["agent"]) == (task, classification, "replay")
    assert (out / str(run["trace"])).is_file()
    # Not a terminal: no progress is drawn, only the summary. All stderr may hold is
    # auto's one-line notice that it passed a better backend over, naming the one used.
    notices = proc.stderr.splitlines()
    assert len(notices) <= 1, proc.stderr
    for line in notices:
        assert re.fullmatch(rf"firstrun: backend {run['backend']} \(auto; not .+\)", line), line
    assert f"results: {out / 'results.json'}" in proc.stdout


def test_a_mixed_suite_writes_junit_and_an_honest_summary(firstrun: Run, tmp_path: Path) -> None:
    out, junit = tmp_path / "out", tmp_path / "junit.xml"
    proc = firstrun("run", str(TASKS / "greet-pass.yaml"), str(TASKS / "greet-gap.yaml"),
                    str(TASKS / "greet-skip.yaml"), str(TASKS / "greet-blocked.yaml"), *MIRROR,
                    "--out", str(out), "--junit", str(junit))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert sorted(str(r["classification"]) for r in _runs(out)) == [
        "blocked", "docs_gap", "passed", "skipped"]
    root = ET.parse(junit).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == (
        "4", "1", "1", "1")
    gap = root.find("testsuite[@name='greet-gap']/testcase/failure")
    assert gap is not None and "greeting.txt does not say hello" in (gap.text or "")
    # Blocked is JUnit's error, not a failure of the docs, and it says what would allow it.
    blocked = root.find("testsuite[@name='greet-blocked']/testcase/error")
    assert blocked is not None and blocked.get("type") == "blocked"
    assert "network:\n  allow: [not-allowed.example]" in (blocked.text or "")
    assert "the task lines that would allow it" in proc.stdout
    assert "allow: [not-allowed.example]" in proc.stdout
    assert root.find("testsuite[@name='greet-skip']/testcase/skipped") is not None
    assert root.find("testsuite[@name='greet-pass']/testcase") is not None
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith(("greet-", "all tasks"))}
    assert rows["greet-skip"].endswith("no evidence")
    assert rows["greet-gap"].endswith("0/1 (0%, 95% CI 0-79%)")
    assert rows["greet-blocked"].endswith("no evidence")
    assert rows["all"].endswith("1/2 (50%, 95% CI 9-91%)")
    assert f"firstrun show {out / 'runs' / 'greet-gap' / '1'}" in proc.stdout
    assert "greet-gap #1 route page not read: https://greeter.docs.example/missing.html (http_error, HTTP 404)" \
        in proc.stdout


def test_repeat_records_every_attempt(firstrun: Run, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = firstrun("run", str(TASKS / "greet-pass.yaml"), *MIRROR, "--out", str(out),
                    "--repeat", "2", "--workers", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(int(r["attempt"]) for r in _runs(out)) == [1, 2]  # type: ignore[call-overload]


def test_show_narrates_a_real_trace(firstrun: Run, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert firstrun("run", str(TASKS / "greet-blocked.yaml"), *MIRROR, "--out", str(out),
                    "--backend", "linux").returncode == 2
    proc = firstrun("show", str(out / "runs" / "greet-blocked" / "1"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()

    def at(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    order = [
        at("run started: task greet-blocked attempt 1"),
        at("sandbox started: backend linux"),
        at("docs read (documented route): https://greeter.docs.example/index.html"),
        at("docs read (documented route): https://greeter.docs.example/first-greeting.html"),
        at("docs read (documented route): https://greeter.docs.example/missing.html: NOT READ, http_error"),
        at("[agent] $ printf 'goodbye\\n' > greeting.txt  -> exit 0"),
        at("egress BLOCKED (shell): GET not-allowed.example:80/greeting: not_allowed"),
        # The agent was told under the command that asked for it.
        at("[sandbox] refused not-allowed.example:80 (not_allowed)"),
        at("check: exit 1"),
        at("classification: blocked (egress_refused)"),
    ]
    assert order == sorted(order), proc.stdout
    # The same through the results directory and through the trace file itself.
    assert firstrun("show", str(out)).stdout == proc.stdout
    assert firstrun("show", str(out / "runs" / "greet-blocked" / "1" / "trace.jsonl")).stdout == \
        proc.stdout


def test_check_reruns_only_the_check_against_a_kept_workspace(firstrun: Run, tmp_path: Path) -> None:
    out = tmp_path / "out"
    task = str(TASKS / "greet-pass.yaml")
    assert firstrun("run", task, *MIRROR, "--out", str(out), "--keep-sandbox").returncode == 0
    workspace = out / "runs" / "greet-pass" / "1" / "workspace"
    passed = firstrun("check", task, "--sandbox", str(workspace), "--out", str(out))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert passed.stdout.startswith("check: passed")
    (workspace / "greeting.txt").write_text("bye\n")
    failed = firstrun("check", task, "--sandbox", str(workspace), "--out", str(out))
    assert failed.returncode == 1
    assert "greeting.txt does not say hello" in failed.stdout
    # 'local' is refused for a check exactly as for a run: once, before anything runs, no evidence.
    local = firstrun("check", task, "--sandbox", str(workspace), "--out", str(out), "--backend", "local")
    ran = firstrun("run", task, *MIRROR, "--out", str(tmp_path / "local"), "--backend", "local")
    assert local.returncode == ran.returncode == 2
    for refused in (local, ran):
        assert refused.stderr.startswith("firstrun: refused (local):")
        assert "--allow-unenforced" in refused.stderr
        assert len(refused.stderr.splitlines()) == 1
    assert not (tmp_path / "local" / "runs").exists()


def test_check_takes_the_project_config_and_a_flag_wins_over_it(firstrun: Run, tmp_path: Path) -> None:
    out = tmp_path / "out"
    task = str(TASKS / "greet-pass.yaml")
    assert firstrun("run", task, *MIRROR, "--out", str(out), "--keep-sandbox").returncode == 0
    workspace = str(out / "runs" / "greet-pass" / "1" / "workspace")
    project = tmp_path / "project"
    project.mkdir()
    (project / "firstrun.yaml").write_text("backend: local\nout: checks\n")
    # The config's backend applies: 'local' is refused as if --backend local were given.
    refused = firstrun("check", task, "--sandbox", workspace, cwd=str(project))
    assert refused.returncode == 2
    assert refused.stderr.startswith("firstrun: refused (local):"), refused.stderr
    # A flag wins over it; the config's out still says where the trace goes.
    passed = firstrun("check", task, "--sandbox", workspace, "--backend", "linux", cwd=str(project))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert f"trace: {project / 'checks'}" in passed.stdout
    # isolation: vm holds for a check as for a run, said once before anything runs.
    vm = tmp_path / "vm.yaml"
    vm.write_text("isolation: vm\n")
    isolated = firstrun("check", task, "--sandbox", workspace, "--backend", "linux",
                        "--config", str(vm), "--out", str(tmp_path / "vm-out"))
    assert isolated.returncode == 2
    here = own_kernel_backend() or "gvisor or microvm"
    assert isolated.stderr.startswith(f"firstrun: refused ({here}): the project config {vm} "
                                      "requires isolation: vm"), isolated.stderr
    assert not (tmp_path / "vm-out").exists()


def _marked_processes() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if SLOW_MARK in cmdline:
                found.append(int(entry))
    return found


def _in_session(sid: int) -> list[int]:
    """Processes whose session is ``sid`` (field 6 of /proc/PID/stat, after the command name)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                found.append(int(entry))
    return found


def test_interrupt_keeps_finished_runs_and_leaves_nothing_running(tmp_path: Path) -> None:
    assert _marked_processes() == [], "a marked process from an earlier run is still alive"
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [str(FIRSTRUN), "run", str(TASKS / "greet-pass.yaml"), str(TASKS / "greet-slow.yaml"),
         *MIRROR, "--out", str(out), "--junit", str(tmp_path / "junit.xml")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )
    try:
        # The second run is in its replay step once its sleep exists.
        deadline = time.monotonic() + 120
        while not _marked_processes():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the slow step never started"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stdout + stderr
    assert [(r["task"], r["classification"]) for r in _runs(out)] == [("greet-pass", "passed")]
    assert "interrupted: 1 finished run kept" in stderr
    assert _marked_processes() == []
    assert _in_session(proc.pid) == []
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert root.get("tests") == "1"


def test_progress_is_drawn_on_a_terminal(tmp_path: Path) -> None:
    """stderr on a pseudo-terminal gets the live board; stdout (a pipe) still gets only the summary."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [str(FIRSTRUN), "run", str(TASKS / "greet-pass.yaml"), *MIRROR, "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "200", "TERM": "xterm"},
    )
    os.close(slave)
    drawn = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal has closed it
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    text = drawn.decode("utf-8", "replace")
    assert re.search(r"greet-pass #1  \d\d:\d\d  passed  pages 2  blocked egress 0", text), text
    assert b"greet-pass #1" not in stdout and b"1/1 (100%, 95% CI 21-100%)" in stdout


@pytest.mark.parametrize(("backend", "warned"), [
    ("microvm", True), ("seatbelt", True), ("linux", False), ("docker", False), ("gvisor", False),
    ("local", False)])
def test_a_sweep_says_first_when_its_backend_cannot_capture(backend: str, warned: bool) -> None:
    from firstrun.cli.run import capture_warning

    warning = capture_warning(backend)
    assert (warning is not None) == warned
    if warning is not None:
        assert warning.startswith(f"firstrun: the {backend} backend does not capture")
        # Every backend it points to does capture.
        assert warning.endswith("such tasks belong on docker, linux or gvisor")
