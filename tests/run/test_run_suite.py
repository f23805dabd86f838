"""Suites: concurrency and repeats, results kept as runs finish, a stop that keeps what finished."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from run_support import fixture_task, write_task

from firstrun.agents import make_agent
from firstrun.errors import UsageError
from firstrun.results.model import Classification, RunRecord
from firstrun.results.store import ResultsStore
from firstrun.run.classify import RunReason
from firstrun.run.events import CommandRan, Event, RunFinished, Source
from firstrun.run.runner import RunConfig, run_task
from firstrun.run.suite import run_suite, suite_exit_code
from firstrun.tasks.model import Task
from support.interrupt import StopOnceStored, kill_then_stop, processes_named

pytestmark = pytest.mark.fast


def replay() -> object:
    return make_agent("replay")


def stored(config: RunConfig) -> list[dict]:
    return json.loads((config.out_dir / "results.json").read_text())["runs"]


def test_a_suite_runs_every_task_every_time_and_stores_each_run(config: RunConfig) -> None:
    tasks = [fixture_task(n) for n in ("pass", "check-fails", "expect-output")]
    store = ResultsStore(config.out_dir, meta={"agent": "replay"})
    seen: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    def on_event(task: str, attempt: int, event: Event) -> None:
        if isinstance(event, RunFinished):
            with lock:
                seen.append((task, attempt, event.classification))

    outcome = run_suite(tasks, agent_factory=replay, config=config, store=store, repeat=2,
                        workers=2, on_event=on_event)
    assert not outcome.interrupted
    got = sorted((r.task, r.attempt, r.classification.value) for r in outcome.records)
    assert got == sorted(seen)
    assert got == sorted((t.name, n, c) for t, c in (
        (tasks[0], "passed"), (tasks[1], "docs_gap"), (tasks[2], "passed")) for n in (1, 2))
    runs = stored(config)
    assert sorted((r["task"], r["attempt"]) for r in runs) == [(t, n) for t, n, _ in got]
    assert all((config.out_dir / r["trace"]).is_file() for r in runs)
    assert json.loads(json.dumps(RunRecord.from_data(runs[0]).to_data())) == runs[0]
    assert suite_exit_code(outcome.records) == 1


def test_stop_after_a_run_finishes_keeps_it_and_starts_nothing_more(config: RunConfig) -> None:
    tasks = [fixture_task(n) for n in ("pass", "check-fails", "expect-output")]
    stop = threading.Event()
    store = StopOnceStored(config.out_dir, stop)

    outcome = run_suite(tasks, agent_factory=replay, config=config, store=store, workers=1,
                        stop=stop)
    assert outcome.interrupted
    assert [r.task for r in outcome.records] == ["greeter-pass"]
    assert [r["task"] for r in stored(config)] == ["greeter-pass"]
    assert sorted(p.name for p in (config.out_dir / "runs").iterdir()) == ["greeter-pass"]


def test_stop_mid_run_ends_it_cleanly_and_keeps_the_finished_ones(
    config: RunConfig, tmp_path: Path
) -> None:
    token = f"firstrun-suite-stop-{os.getpid()}"
    slow = write_task(tmp_path, "slow", f"""name: greeter-interrupted
goal: Create greeting.txt holding the greeting the quickstart shows.
docs:
  entrypoint: http://docs.greeter.test/
replay:
  - run: (exec -a {token} sleep 600) >/dev/null 2>&1 &
    undocumented: a fixture step, not the guide's
  - printf 'hello, reader\\n' > greeting.txt
success:
  script: grep -q 'hello, reader' greeting.txt || qs_fail "no greeting"
""")
    store = ResultsStore(config.out_dir, meta={})
    stop = threading.Event()
    alive_at_stop: list[int] = []

    def on_event(task: str, attempt: int, event: Event) -> None:
        if task == "greeter-interrupted" and isinstance(event, CommandRan) \
                and event.source is Source.AGENT:
            # /proc/PID/cmdline reads empty while the background child is
            # inside execve, so look until it shows (bounded), not once.
            for _ in range(300):
                alive_at_stop.extend(processes_named(token))
                if alive_at_stop:
                    break
                time.sleep(0.1)
            stop.set()

    outcome = run_suite([fixture_task("pass"), slow, fixture_task("check-fails")],
                        agent_factory=replay, config=config, store=store, workers=1, stop=stop,
                        on_event=on_event)
    assert outcome.interrupted
    assert [r.task for r in outcome.records] == ["greeter-pass"]
    assert [r["task"] for r in stored(config)] == ["greeter-pass"]
    # The process the interrupted run left behind existed, and the session took it down.
    assert alive_at_stop
    assert processes_named(token) == []
    trace = (config.out_dir / "runs" / "greeter-interrupted" / "1" / "trace.jsonl").read_text()
    assert '"reason": "interrupted"' in trace


@pytest.mark.timeout(120)
def test_stop_during_a_long_command_interrupts_it_instead_of_waiting_out_its_timeout(
    config: RunConfig, tmp_path: Path
) -> None:
    # The command's own timeout is an hour; only the interrupt can end this
    # run before the test's hang guard does.
    token = f"firstrun-long-command-{os.getpid()}"
    slow = write_task(tmp_path, "long", f"""name: greeter-long-command
goal: Create greeting.txt holding the greeting the quickstart shows.
docs:
  entrypoint: http://docs.greeter.test/
budgets:
  max_seconds: 3600
  max_command_seconds: 3600
replay:
  - run: exec -a {token} sleep 3600
    undocumented: a fixture step, not the guide's
success:
  script: test -d . || qs_fail "no workspace"
""")
    store = ResultsStore(config.out_dir, meta={})
    stop = threading.Event()
    seen_running: list[int] = []

    def stop_once_running() -> None:
        while not (found := processes_named(token)):
            if stop.wait(0.05):
                return
        seen_running.extend(found)
        stop.set()

    watcher = threading.Thread(target=stop_once_running)
    watcher.start()
    try:
        outcome = run_suite([slow], agent_factory=replay, config=config, store=store,
                            workers=1, stop=stop)
    finally:
        stop.set()
        watcher.join()
    assert seen_running
    assert outcome.interrupted
    assert outcome.records == []
    assert processes_named(token) == []
    trace = (config.out_dir / "runs" / "greeter-long-command" / "1" / "trace.jsonl").read_text()
    assert '"reason": "interrupted"' in trace


def _killed_by_the_interrupt(token: str, tmp_path: Path) -> Task:
    # Its verdict would be docs_gap: the command dies, the check finds no greeting.
    return write_task(tmp_path, "killed", f"""name: greeter-killed
goal: Create greeting.txt holding the greeting the quickstart shows.
docs:
  entrypoint: http://docs.greeter.test/
budgets:
  max_command_seconds: 3600
replay:
  - run: exec -a {token} sleep 3600
    undocumented: a fixture step, not the guide's
success:
  script: grep -q 'hello, reader' greeting.txt || qs_fail "no greeting"
""")


def test_a_run_whose_command_died_before_the_stop_and_finished_after_it_is_not_kept(
    config: RunConfig, tmp_path: Path
) -> None:
    token = f"firstrun-killed-first-{os.getpid()}"
    stop, held = threading.Event(), threading.Event()

    def on_event(task: str, attempt: int, event: Event) -> None:
        # Hold the answer until the stop is set; the stop waits for the command's death.
        if isinstance(event, RunFinished):
            held.set()
            assert stop.wait(120)

    interrupt = kill_then_stop(token, held, stop)
    try:
        outcome = run_suite([_killed_by_the_interrupt(token, tmp_path)], agent_factory=replay,
                            config=config, store=ResultsStore(config.out_dir, meta={}),
                            workers=1, stop=stop, on_event=on_event)
    finally:
        held.set()
        interrupt.join()
    # The run itself, unaware of the stop, concluded a docs gap; the sweep keeps nothing.
    trace = (config.out_dir / "runs" / "greeter-killed" / "1" / "trace.jsonl").read_text()
    assert '"classification": "docs_gap"' in trace
    assert outcome.interrupted and outcome.records == []
    assert not (config.out_dir / "results.json").exists()


def test_a_stop_that_comes_while_the_check_runs_makes_the_run_interrupted(
    config: RunConfig, tmp_path: Path
) -> None:
    token = f"firstrun-killed-in-check-{os.getpid()}"
    stop, held = threading.Event(), threading.Event()

    def on_event(event: Event) -> None:
        # The check has run and failed; hold its verdict until the stop is set.
        if isinstance(event, CommandRan) and event.source is Source.CHECK:
            held.set()
            assert stop.wait(120)

    interrupt = kill_then_stop(token, held, stop)
    try:
        record = run_task(_killed_by_the_interrupt(token, tmp_path), attempt=1, agent=replay(),
                          config=config, on_event=on_event, stop=stop)
    finally:
        held.set()
        interrupt.join()
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR,
                                                      RunReason.INTERRUPTED)
    trace = (config.out_dir / "runs" / "greeter-killed" / "1" / "trace.jsonl").read_text()
    assert '"source": "check"' in trace and "docs_gap" not in trace


def test_bad_counts_are_usage_errors(config: RunConfig) -> None:
    store = ResultsStore(config.out_dir, meta={})
    with pytest.raises(UsageError, match="--repeat"):
        run_suite([], agent_factory=replay, config=config, store=store, repeat=0)
    with pytest.raises(UsageError, match="--workers"):
        run_suite([], agent_factory=replay, config=config, store=store, workers=0)


def _record(classification: Classification) -> RunRecord:
    return RunRecord(task="t", task_file="t.yaml", task_sha256="0", attempt=1, agent="replay",
                     model=None, classification=classification, reason="r", backend=None,
                     enforcement=None, policy_hash=None)


@pytest.mark.parametrize(("classes", "code"), [
    ([Classification.PASSED], 0),
    ([Classification.PASSED, Classification.SKIPPED, Classification.INFRA_ERROR], 0),
    ([Classification.PASSED, Classification.DOCS_GAP], 1),
    ([Classification.DOCS_GAP, Classification.HARNESS_ERROR], 1),
    ([Classification.SKIPPED, Classification.BUDGET_EXHAUSTED, Classification.AGENT_REFUSAL], 2),
    ([], 2),
])
def test_suite_exit_code(classes: list[Classification], code: int) -> None:
    assert suite_exit_code([_record(c) for c in classes]) == code
