"""Live progress of a suite: one line per run, from the runner's events as they happen.

Guarantee: the board only reads the typed events the runner emits (the same
ones written to the trace), so what it shows is what is being recorded. It is
drawn on stderr only when stderr is a terminal and ``run -q`` was not given;
on a pipe or a file nothing is drawn. With ``run -v`` each finished run also
gets one line on stderr. Events may arrive from any worker thread.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from firstrun.cli.color import rich_console
from firstrun.run.events import (
    AgentFinished,
    CheckFinished,
    CommandRan,
    DocsRead,
    Egress,
    Event,
    RunFinished,
    SandboxStarted,
    Source,
)

if TYPE_CHECKING:
    from rich.console import Console

    from firstrun.proxy.records import EgressRecord


# The run's elapsed time, its current step (starting the sandbox, setup, agent
# step n, check, then the classification), pages read and blocked egress.
@dataclass(frozen=True, kw_only=True)
class RunLine:
    """What the board says about one run at one instant."""

    task: str
    attempt: int
    elapsed_s: float
    step: str
    pages: int
    blocked: int
    classification: str | None

    def text(self) -> str:
        return (
            f"{self.task} #{self.attempt}  {_clock(self.elapsed_s)}  {self.step}"
            f"  pages {self.pages}  blocked egress {self.blocked}"
        )


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"


def _blocked(record: EgressRecord) -> bool:
    return record.denied or record.would_deny is not None


class _Run:
    def __init__(self, started: float) -> None:
        self.started = started
        self.ended: float | None = None
        self.phase = "starting the sandbox"
        self.agent_steps = 0
        self.pages = 0
        self.blocked = 0
        self.classification: str | None = None


class ProgressBoard:
    """Per-run state, updated by ``update`` from any thread and read as ``lines()``."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, int], _Run] = {}

    def update(self, task: str, attempt: int, event: Event) -> None:
        with self._lock:
            run = self._runs.get((task, attempt))
            if run is None:
                run = self._runs[(task, attempt)] = _Run(self._clock())
            if isinstance(event, SandboxStarted):
                run.phase = "setup"
            elif isinstance(event, CommandRan):
                if event.source is Source.AGENT:
                    run.agent_steps += 1
                    run.phase = "agent"
                elif event.source is Source.CHECK:
                    run.phase = "check"
            elif isinstance(event, DocsRead):
                run.pages += 1
                if run.phase == "setup":
                    run.phase = "agent"
            elif isinstance(event, Egress):
                run.blocked += _blocked(event.record)
            elif isinstance(event, AgentFinished | CheckFinished):
                run.phase = "check"
            elif isinstance(event, RunFinished):
                run.classification = event.classification
                run.ended = self._clock()

    def lines(self) -> list[RunLine]:
        now = self._clock()
        with self._lock:
            return [
                RunLine(
                    task=task,
                    attempt=attempt,
                    elapsed_s=(run.ended if run.ended is not None else now) - run.started,
                    step=_step(run),
                    pages=run.pages,
                    blocked=run.blocked,
                    classification=run.classification,
                )
                for (task, attempt), run in self._runs.items()
            ]


def _step(run: _Run) -> str:
    if run.classification is not None:
        return run.classification
    if run.phase == "agent":
        # The command being worked on is the one after those already recorded.
        return f"agent step {run.agent_steps + 1}"
    return run.phase


_STYLES = {"passed": "green", "docs_gap": "red"}


def _style(classification: str | None) -> str:
    """Green for a pass, red for a docs gap, yellow for any run that could not judge."""
    return _STYLES.get(classification or "", "yellow" if classification else "")


def finished_line(task: str, attempt: int, event: RunFinished) -> str:
    """``run -v``'s line for one finished run."""
    return f"{task} #{attempt} {event.classification} ({event.reason})"


@contextmanager
def live_board(board: ProgressBoard, *, enabled: bool, color: bool = True,
               stream: TextIO | None = None) -> Iterator[Console | None]:
    """Draw ``board`` on ``stream`` (stderr) while the block runs, when ``enabled`` (a terminal),
    coloured when ``color``; yields the console drawing it, or None when nothing is drawn."""
    if not enabled:
        yield None
        return
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    def render() -> Group:
        return Group(*(Text(line.text(), style=_style(line.classification)) for line in board.lines()))

    console = rich_console(stream or sys.stderr, color=color)
    with Live(get_renderable=render, console=console, refresh_per_second=4, transient=False):
        yield console


# A finished run's line (task, attempt, classification, reason) goes above the
# board when one is drawn, in the order the runs finished; colour follows
# ``--color`` (``cli.color``). The board takes a lock, and so does each line.
class SweepProgress:
    """What ``run`` shows on stderr while a sweep runs: the board, and with ``verbose`` a line
    per run as it finishes. ``update`` takes the runner's events, from any thread."""

    def __init__(self, *, draw: bool, verbose: bool, color: bool, stream: TextIO | None = None,
                 board: ProgressBoard | None = None) -> None:
        self.board = board or ProgressBoard()
        self.draw = draw
        self._verbose = verbose
        self._color = color
        self._stream = stream
        self._lock = threading.Lock()
        self._console: Console | None = None

    def update(self, task: str, attempt: int, event: Event) -> None:
        self.board.update(task, attempt, event)
        if self._verbose and isinstance(event, RunFinished):
            self._say(finished_line(task, attempt, event), _style(event.classification))

    def _say(self, text: str, style: str) -> None:
        stream = self._stream or sys.stderr
        with self._lock:
            if self._console is None and self._color:
                self._console = rich_console(stream, color=True, highlight=False)
            if self._console is None:
                print(text, file=stream, flush=True)
                return
            from rich.text import Text

            # Through the board's own console, the line goes above the board.
            self._console.print(Text(text, style=style if self._color else ""), soft_wrap=True)

    @contextmanager
    def shown(self) -> Iterator[None]:
        """The board drawn while the block runs (when ``draw``)."""
        with live_board(self.board, enabled=self.draw, color=self._color, stream=self._stream) as console:
            with self._lock:
                self._console = console
            try:
                yield
            finally:
                with self._lock:
                    self._console = None
