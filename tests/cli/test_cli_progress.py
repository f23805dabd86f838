"""The progress board follows the runner's events: step, elapsed time, pages read, blocked egress."""

from __future__ import annotations

from egress_support import egress_record
from firstrun.cli.progress import ProgressBoard
from firstrun.run.events import (
    AgentFinished,
    AgentStop,
    CheckFinished,
    CommandRan,
    DocsRead,
    Egress,
    RunFinished,
    RunStarted,
    SandboxStarted,
    Source,
)


class Clock:
    """A clock the test sets by hand, so elapsed times are exact and nothing is timed."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _started(task: str) -> RunStarted:
    return RunStarted(task=task, attempt=1, agent="replay", model=None, task_file="t.yaml", task_sha256="0")


def test_a_run_walks_through_its_steps() -> None:
    clock = Clock()
    board = ProgressBoard(clock=clock)
    steps = []

    def feed(event: object) -> None:
        board.update("hello", 1, event)  # type: ignore[arg-type]
        steps.append(board.lines()[0].step)

    feed(_started("hello"))
    feed(SandboxStarted(info={}))
    feed(CommandRan(source=Source.SETUP, command="true", exit_code=0, duration_s=0.1))
    feed(DocsRead(page={}, route=True))
    feed(CommandRan(source=Source.AGENT, command="a", exit_code=0, duration_s=0.1))
    feed(Egress(record=egress_record(decision="deny", would_deny=None)))
    feed(Egress(record=egress_record(decision="allow", would_deny=None)))
    feed(Egress(record=egress_record(decision="allow", would_deny="not_allowed")))
    feed(CommandRan(source=Source.AGENT, command="b", exit_code=0, duration_s=0.1))
    feed(AgentFinished(stop=AgentStop.FINISHED))
    feed(CheckFinished(exit_code=0))
    clock.now = 112.0
    feed(RunFinished(classification="passed", reason="check_passed"))
    assert steps == [
        "starting the sandbox", "setup", "setup", "agent step 1", "agent step 2",
        "agent step 2", "agent step 2", "agent step 2", "agent step 3", "check", "check", "passed",
    ]
    clock.now = 500.0  # a finished run's clock stops
    (line,) = board.lines()
    assert (line.pages, line.blocked, line.elapsed_s) == (1, 2, 12.0)
    assert line.text() == "hello #1  00:12  passed  pages 1  blocked egress 2"


def test_runs_are_kept_apart_and_listed_in_start_order() -> None:
    clock = Clock()
    board = ProgressBoard(clock=clock)
    board.update("b", 1, _started("b"))
    clock.now = 130.0
    board.update("a", 1, _started("a"))
    board.update("a", 1, DocsRead(page={}))
    clock.now = 190.0
    lines = board.lines()
    assert [(l.task, l.elapsed_s, l.pages) for l in lines] == [("b", 90.0, 0), ("a", 60.0, 1)]
    assert lines[0].text().startswith("b #1  01:30  starting the sandbox")
