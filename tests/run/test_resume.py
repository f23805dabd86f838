"""``--resume``: an interrupted sweep continued runs only what is missing, and only when comparable.

Real sweeps with the replay agent and a fixture docs site (no package
installs, nothing leaves loopback): in process on the fake backend, and
through ``firstrun run`` on the real linux backend. The interrupt is
real: a stop event inside the suite, and SIGINT to a real ``firstrun run``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from run_support import fixture_task

from firstrun.agents import make_agent
from firstrun.cli.main import _run
from firstrun.cli.run import RunRequest, _sweep_identity, _with_project
from firstrun.errors import UsageError
from firstrun.results.model import SweepIdentity, TaskIdentity, incomparability
from firstrun.results.store import RESULTS_FILE, ResultsStore, load_results
from firstrun.run.project import load_project_config
from firstrun.run.runner import RunConfig
from firstrun.run.suite import run_suite
from support.interrupt import StopOnceStored

FIRSTRUN = Path(sys.executable).parent / "firstrun"
CLI_FIXTURES = Path(__file__).resolve().parents[1] / "cli" / "run_fixtures"
MIRROR = ["--docs-mirror", f"greeter.docs.example={CLI_FIXTURES / 'docs'}"]
# The nap task's replay step; the odd duration marks its process in /proc.
NAP_MARK = b"6.2831853"
NAP = f"""name: greet-nap
goal: Following the Greeter guide, write the first greeting into greeting.txt.
docs:
  entrypoint: https://greeter.docs.example/index.html
replay:
  - run: sleep {NAP_MARK.decode()}
    undocumented: a fixture step, not the guide's
  - run: printf 'hello\\n' > greeting.txt
    undocumented: a fixture step, not the guide's
success:
  script: |
    grep -qx hello greeting.txt || qs_fail "greeting.txt does not say hello"
"""


def _document(out: Path) -> dict:
    return json.loads((out / RESULTS_FILE).read_text())


def _identity(**changes: object) -> SweepIdentity:
    fields: dict[str, object] = {
        "tasks": (TaskIdentity(name="a", sha256="1", check_sha256="2"),),
        "agent": "replay", "model": None, "base_url": None, "backend": "linux", "repeat": 2,
        "affordances": "all", "probe_affordances": False, "allow_unenforced": False,
        "downgrades": (), "task_defaults_sha256": None, "inspect_tls": False,
    }
    fields.update(changes)
    return SweepIdentity(**fields)  # type: ignore[arg-type]


def _pairs(runs: list[dict]) -> list[tuple[str, int]]:
    return sorted((r["task"], r["attempt"]) for r in runs)


def test_a_stopped_sweep_resumed_ends_with_every_attempt_once_and_keeps_what_finished(
    config: RunConfig,
) -> None:
    tasks = [fixture_task(n) for n in ("pass", "check-fails")]
    stop = threading.Event()
    store = StopOnceStored(config.out_dir, stop, meta={"sweep": _identity().to_data()})

    first = run_suite(tasks, agent_factory=lambda: make_agent("replay"), config=config,
                      store=store, repeat=2, workers=1, stop=stop)
    assert first.interrupted
    kept = _document(config.out_dir)["runs"]
    assert _pairs(kept) == [("greeter-pass", 1)]
    kept_trace = (config.out_dir / kept[0]["trace"]).read_bytes()

    # Reopened from disk, as --resume does: what finished is what is stored.
    resumed_store = ResultsStore.reopen(config.out_dir)
    assert resumed_store.finished() == {("greeter-pass", 1)}
    second = run_suite(tasks, agent_factory=lambda: make_agent("replay"), config=config,
                       store=resumed_store, repeat=2, workers=2, done=resumed_store.finished())
    assert not second.interrupted
    assert _pairs([r.to_data() for r in second.records]) == [
        ("greeter-check-fails", 1), ("greeter-check-fails", 2), ("greeter-pass", 2)]
    runs = _document(config.out_dir)["runs"]
    assert _pairs(runs) == [("greeter-check-fails", 1), ("greeter-check-fails", 2),
                            ("greeter-pass", 1), ("greeter-pass", 2)]
    assert runs[0] == kept[0]
    assert (config.out_dir / kept[0]["trace"]).read_bytes() == kept_trace


def _marked() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if NAP_MARK in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _sweep(tasks: list[str], out: Path, *extra: str) -> list[str]:
    return [str(FIRSTRUN), "run", *tasks, *MIRROR, "--out", str(out), "--backend", "linux",
            "--repeat", "2", *extra]


def test_sigint_then_resume_through_the_real_command(tmp_path: Path) -> None:
    assert _marked() == [], "a nap from an earlier run is still alive"
    nap = tmp_path / "greet-nap.yaml"
    nap.write_text(NAP)
    tasks = [str(CLI_FIXTURES / "tasks" / "greet-pass.yaml"), str(nap)]
    out = tmp_path / "out"
    proc = subprocess.Popen(_sweep(tasks, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not _marked():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the nap never started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stdout + stderr
    before = _document(out)
    assert _pairs(before["runs"]) == [("greet-pass", 1)]
    assert before["meta"]["sweep"]["repeat"] == 2

    resumed = subprocess.run([str(FIRSTRUN), "run", *tasks, *MIRROR, "--resume", str(out),
                              "--backend", "linux", "--repeat", "2", "--workers", "2"],
                             capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = _document(out)
    assert _pairs(after["runs"]) == [("greet-nap", 1), ("greet-nap", 2),
                                     ("greet-pass", 1), ("greet-pass", 2)]
    assert after["runs"][0] == before["runs"][0]
    assert after["meta"]["sweep"] == before["meta"]["sweep"]
    assert after["meta"]["started_at"] == before["meta"]["started_at"]
    assert [r["argv"][-6:] for r in after["meta"]["resumed"]] == [
        ["--backend", "linux", "--repeat", "2", "--workers", "2"]]
    assert _marked() == []
    # Resuming a finished sweep runs nothing and changes no run.
    again = subprocess.run([str(FIRSTRUN), "run", *tasks, *MIRROR, "--resume", str(out),
                            "--backend", "linux", "--repeat", "2"],
                           capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _document(out)["runs"] == after["runs"]


@pytest.mark.parametrize(("change", "named"), [
    ({"repeat": 3}, "--repeat was 2 and is now 3"),
    ({"agent": "claude"}, "--agent was 'replay' and is now 'claude'"),
    ({"model": "m"}, "--model was unset and is now 'm'"),
    ({"backend": "docker"}, "--backend was 'linux' and is now 'docker'"),
    ({"affordances": "none"}, "--affordances was 'all' and is now 'none'"),
    ({"downgrades": ("seccomp",)}, "--allow-downgrade was none and is now seccomp"),
    ({"task_defaults_sha256": "f"},
     "the project config's task_defaults, permissions or isolation was unset"),
    ({"inspect_tls": True}, "--inspect-tls was off and is now on"),
    ({"tasks": (TaskIdentity(name="a", sha256="9", check_sha256="2"),)}, "task a's file changed"),
    ({"tasks": (TaskIdentity(name="a", sha256="1", check_sha256="9"),)}, "task a's success check changed"),
    ({"tasks": ()}, "the task set differs (not given now: a)"),
    ({"tasks": (TaskIdentity(name="a", sha256="1", check_sha256="2"),
                TaskIdentity(name="b", sha256="1", check_sha256="2"))}, "not in the sweep: b"),
])
def test_what_makes_a_sweep_incomparable(change: dict[str, object], named: str) -> None:
    reason = incomparability(_identity(), _identity(**change))
    assert reason is not None and named in reason
    assert incomparability(_identity(), _identity()) is None
    assert SweepIdentity.from_data(json.loads(json.dumps(_identity(**change).to_data()))) \
        == _identity(**change)


def test_a_sweep_saved_before_inspect_tls_was_recorded_loads_and_is_comparable_with_neither() -> None:
    saved = _identity().to_data()
    del saved["inspect_tls"]
    old = SweepIdentity.from_data(saved)
    assert old.inspect_tls is None
    for wanted in (False, True):
        reason = incomparability(old, _identity(inspect_tls=wanted))
        assert reason is not None and "before firstrun recorded --inspect-tls" in reason


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real finished sweep of greet-pass, repeat 2; tests copy it before touching it."""
    root = tmp_path_factory.mktemp("sweep")
    task = root / "greet-pass.yaml"
    shutil.copy(CLI_FIXTURES / "tasks" / "greet-pass.yaml", task)
    done = subprocess.run(_sweep([str(task)], root / "out"), capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def _resume(sweep: Path, tmp_path: Path, *args: str, task: Path | None = None) -> str:
    """Copy the finished sweep, resume it with ``args``; the one-line refusal, which must come."""
    out = tmp_path / "out"
    shutil.copytree(sweep / "out", out)
    before = (out / RESULTS_FILE).read_bytes()
    task = task or sweep / "greet-pass.yaml"
    with pytest.raises(UsageError) as refused:
        _run(["run", str(task), *MIRROR, "--resume", str(out), *args])
    assert (out / RESULTS_FILE).read_bytes() == before
    message = refused.value.args[0]
    assert "\n" not in message
    return message


def test_resume_refuses_another_repeat(finished_sweep: Path, tmp_path: Path) -> None:
    message = _resume(finished_sweep, tmp_path, "--backend", "linux", "--repeat", "3")
    assert message.startswith("--resume:") and "--repeat was 2 and is now 3" in message


def test_resume_refuses_other_affordances(finished_sweep: Path, tmp_path: Path) -> None:
    message = _resume(finished_sweep, tmp_path, "--backend", "linux", "--repeat", "2",
                      "--affordances", "none")
    assert "--affordances was 'all' and is now 'none'" in message


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_resume_refuses_inspect_tls_from_the_flag_or_the_project_config(
    finished_sweep: Path, tmp_path: Path
) -> None:
    message = _resume(finished_sweep, tmp_path, "--backend", "linux", "--repeat", "2",
                      "--inspect-tls")
    assert message.startswith("--resume:") and "--inspect-tls was off and is now on" in message
    # The project config's inspect_tls reaches the identity as the flag does, and the flag wins.
    config = load_project_config(_write(tmp_path / "firstrun.yaml", "inspect_tls: true\n"))
    from_config = _with_project(RunRequest(backend="linux"), config)
    overridden = _with_project(RunRequest(backend="linux", inspect_tls=False), config)
    assert _sweep_identity(from_config, [], "linux", config).inspect_tls is True
    assert _sweep_identity(overridden, [], "linux", config).inspect_tls is False


def test_resume_refuses_a_sweep_that_did_not_record_inspect_tls(
    finished_sweep: Path, tmp_path: Path
) -> None:
    old = tmp_path / "old"
    shutil.copytree(finished_sweep, old)
    document = _document(old / "out")
    del document["meta"]["sweep"]["inspect_tls"]
    (old / "out" / RESULTS_FILE).write_text(json.dumps(document))
    # Still a readable results document for reports.
    assert load_results(old / "out" / RESULTS_FILE) == document
    message = _resume(old, tmp_path, "--backend", "linux", "--repeat", "2")
    assert message.startswith("--resume:")
    assert "saved before firstrun recorded --inspect-tls" in message


def test_resume_refuses_an_edited_task(finished_sweep: Path, tmp_path: Path) -> None:
    edited = tmp_path / "greet-pass.yaml"
    edited.write_text((finished_sweep / "greet-pass.yaml").read_text() + "# edited\n")
    message = _resume(finished_sweep, tmp_path, "--backend", "linux", "--repeat", "2", task=edited)
    assert "task greet-pass's file changed since the sweep started" in message


def test_resume_refuses_a_project_config_whose_task_defaults_differ(
    finished_sweep: Path, tmp_path: Path
) -> None:
    config = tmp_path / "firstrun.yaml"
    config.write_text("task_defaults:\n  budgets:\n    max_turns: 3\n")
    message = _resume(finished_sweep, tmp_path, "--backend", "linux", "--repeat", "2",
                      "--config", str(config))
    assert "task_defaults" in message


def test_resume_refuses_another_out_and_a_directory_without_a_sweep(
    finished_sweep: Path, tmp_path: Path
) -> None:
    message = _resume(finished_sweep, tmp_path, "--repeat", "2", "--out", str(tmp_path / "x"))
    assert message.startswith("--resume:") and "drop --out" in message
    old = tmp_path / "old"
    old.mkdir()
    (old / RESULTS_FILE).write_text(json.dumps({"schema_version": 1, "meta": {}, "runs": []}))
    with pytest.raises(UsageError, match=r"^usage: --resume: .*records no sweep identity"):
        _run(["run", str(finished_sweep / "greet-pass.yaml"), "--resume", str(old)])
    with pytest.raises(UsageError, match=r"^usage: --resume: .*no results file here"):
        _run(["run", str(finished_sweep / "greet-pass.yaml"), "--resume", str(tmp_path / "none")])
