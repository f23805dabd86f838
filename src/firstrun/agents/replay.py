"""The replay agent: the documented commands, run as written, with no model.

Guarantee: a replay run reads the task's documented route page by page, in
order, and runs its steps in the session, stopping at the first step that
exits non-zero. It never retries, edits or reorders a step, so a failure is
the documentation's commands failing, not an agent's choice. A step the task's
copy no longer shares with the docs, or a mutant that changed nothing, stops
the run as ``REPLAY_DRIFT`` before it can prove anything.
"""

from __future__ import annotations

import difflib
import posixpath
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from firstrun.agents.base import (
    AgentResult,
    AgentStop,
    Brief,
    Budget,
    BudgetExhausted,
    CallRefused,
    Origin,
    Toolbelt,
)
from firstrun.docs.page import ReadFailure
from firstrun.tasks.model import DocsReplay, ReplayStep

if TYPE_CHECKING:
    # Type-only: the blocks arrive as data on the pages the toolbelt hands back.
    from firstrun.docs.blocks import Block
    from firstrun.docs.page import Page


_HEREDOC_WRITE = re.compile(
    r"""^cat\s+(?:>\s*(?P<a>\S+)\s+<<-?\s*(?P<qa>['"]?)(?P<da>[\w.-]+)(?P=qa)"""
    r"""|<<-?\s*(?P<qb>['"]?)(?P<db>[\w.-]+)(?P=qb)\s+>\s*(?P<b>\S+))\s*\n(?P<body>.*)\n(?P<end>[\w.-]+)$""",
    re.DOTALL,
)


@dataclass(frozen=True, kw_only=True)
class DocsStep:
    """One step taken from a code block: a command, or a file block's write."""

    origin: Origin
    command: str
    placeholders: tuple[str, ...]

    def where(self) -> str:
        return f"{self.origin.page} block {self.origin.block}"


@dataclass(frozen=True, kw_only=True)
class Drift:
    """A hand-written step that matches no code block on the route, and the nearest one."""

    number: int
    step: str
    nearest: Block | None

    def describe(self) -> str:
        near = (f"; nearest: {self.nearest.page} block {self.nearest.index}: "
                f"{_first_line(self.nearest.text)}" if self.nearest is not None
                else "; the route shows no code block")
        return f"step {self.number} matches no code block on the route: {_first_line(self.step)}{near}"


def _unreachable(page: Page) -> bool:
    """The site, not the page, failed: no answer came, or the server (or the proxy
    for it) answered with a 5xx. A 404 is the docs' own: the route names a page
    they no longer have."""
    return page.error is ReadFailure.UNREACHABLE or (
        page.error is ReadFailure.HTTP_ERROR and page.status is not None and page.status >= 500)


class ReplayAgent:
    name = "replay"
    model: str | None = None

    def run(self, brief: Brief, tools: Toolbelt) -> AgentResult:
        if brief.replay_docs is None and not brief.replay:
            return AgentResult(stop=AgentStop.NO_REPLAY, detail="the task has no replay block")
        run = _Run(brief, tools)
        try:
            if brief.replay_docs is not None:
                return run.from_docs(brief.replay_docs)
            return run.hand_written(brief.replay)
        except _Stopped as stopped:
            return stopped.result
        except BudgetExhausted as exc:
            return AgentResult(stop=AgentStop.BUDGET_EXHAUSTED, turns=run.turns,
                               detail=f"{exc.budget}: {exc.detail}")


class _Stopped(Exception):
    def __init__(self, result: AgentResult) -> None:
        self.result = result


class _Run:
    def __init__(self, brief: Brief, tools: Toolbelt) -> None:
        self.brief = brief
        self.tools = tools
        self.turns = 0
        self.reached = 0

    def read(self, url: str) -> Page:
        try:
            return self.tools.read_docs(url)
        except CallRefused as exc:
            why = exc.decision.explain()
            raise _Stopped(AgentResult(stop=AgentStop.PERMISSION_DENIED, turns=self.turns,
                                       detail=f"route page {url} not read, {why}")) from None

    # One step is one turn; reading a page is not, and ``max_turns`` smaller than
    # the number of steps stops the run ``BUDGET_EXHAUSTED`` before the first step
    # past it. A mutant (``Brief.mutation``, ``firstrun mutate``) runs the same
    # steps with one change at its step, dropped or one version pin replaced;
    # when that step is no longer the command the mutant was made from, or the
    # replay never reaches it (``finished``), the run is ``REPLAY_DRIFT``: a mutant
    # that changed nothing proves nothing. A step or route page the permission
    # rules refuse stops the replay ``PERMISSION_DENIED`` before it runs.
    def step(self, command: str, *, what: str, origin: Origin | None = None) -> None:
        self.reached += 1
        mutation = self.brief.mutation
        if mutation is not None and mutation.step == self.reached:
            if command != mutation.command:
                raise _Stopped(AgentResult(
                    stop=AgentStop.REPLAY_DRIFT, turns=self.turns,
                    detail=f"mutant of {what}: the step is now {_first_line(command)!r}, not the "
                    f"{_first_line(mutation.command)!r} it was made from"))
            if mutation.pin is None:
                return
            command = command.replace(*mutation.pin)
        if self.turns >= self.brief.budgets.max_turns:
            raise BudgetExhausted(Budget.MAX_TURNS,
                                  f"max_turns {self.brief.budgets.max_turns} reached before {what}")
        self.turns += 1
        try:
            result = self.tools.bash(command, origin=origin)
        except CallRefused as exc:
            why = exc.decision.explain()
            raise _Stopped(AgentResult(stop=AgentStop.PERMISSION_DENIED, turns=self.turns,
                                       detail=f"{what} not run, {why}: {command}")) from None
        if result.exit_code != 0:
            how = "timed out" if result.timed_out else f"exited {result.exit_code}"
            raise _Stopped(AgentResult(stop=AgentStop.STEP_FAILED, turns=self.turns,
                                       detail=f"{what} {how}: {_first_line(command)}"))

    # ``replay: docs``: the steps are the route's own code blocks, page by page as
    # each is read (``docs_steps``): a shell block's commands run, a file block is
    # written to its file inside the workspace through the session, each recorded
    # with the page and block it came from (``Origin``). Blocks the page marks to
    # skip, or the task's ``skip`` names, do not run. A step whose placeholder the
    # task gives no value for stops the run before it (``NEEDS_INPUT``); a route
    # with no step at all is ``NO_REPLAY``.
    def from_docs(self, replay: DocsReplay) -> AgentResult:
        taken = 0
        for url in self.brief.docs_route:
            page = self.read(url)
            if not page.ok and _unreachable(page):
                raise _Stopped(AgentResult(
                    stop=AgentStop.INFRA_ERROR, turns=self.turns,
                    detail=f"route page {url} could not be reached ({page.error}: "
                    f"{page.detail}), so this run is no evidence about the docs"))
            if not page.ok:
                raise _Stopped(AgentResult(
                    stop=AgentStop.STEP_FAILED, turns=self.turns,
                    detail=f"route page {url} could not be read ({page.error}: {page.detail}), "
                    "so its steps could not be taken"))
            for step in docs_steps(page.blocks, replay):
                missing = [p for p in step.placeholders if replay.value(p) is None]
                if missing:
                    raise _Stopped(AgentResult(
                        stop=AgentStop.NEEDS_INPUT, turns=self.turns,
                        detail=f"{step.where()} needs a value for {', '.join(missing)}; "
                        "give it under replay.values"))
                taken += 1
                self.step(step.command, what=step.where(), origin=step.origin)
        if not taken:
            return AgentResult(stop=AgentStop.NO_REPLAY, turns=self.turns,
                               detail="the route's pages show no shell or file block to replay")
        return self.finished()

    # Hand-written steps run in order after the whole route is read, and every step
    # not marked ``undocumented`` must match a code block on it (``drift``): one
    # that matches none stops the run before any step, because the task's copy and
    # the docs have parted and the run would judge the copy. Drift is judged only
    # over a route read in full; a page that could not be read is a route finding,
    # and the check decides as before.
    def hand_written(self, steps: Sequence[ReplayStep]) -> AgentResult:
        pages = [self.read(url) for url in self.brief.docs_route]
        if all(page.ok for page in pages):
            drifted = drift(steps, [block for page in pages for block in page.blocks])
            if drifted:
                return AgentResult(stop=AgentStop.REPLAY_DRIFT, turns=self.turns,
                                   detail="; ".join(d.describe() for d in drifted))
        for number, step in enumerate(steps, start=1):
            self.step(step.run, what=f"step {number}")
        return self.finished()

    def finished(self) -> AgentResult:
        mutation = self.brief.mutation
        if mutation is not None and mutation.step > self.reached:
            # The change was never made: this run says nothing about the check.
            return AgentResult(stop=AgentStop.REPLAY_DRIFT, turns=self.turns,
                               detail=f"mutant of step {mutation.step}: the replay now has "
                               f"{self.reached} steps")
        return AgentResult(stop=AgentStop.FINISHED, turns=self.turns)


def docs_steps(blocks: Sequence[Block], replay: DocsReplay) -> list[DocsStep]:
    """The steps of one page's blocks, in order, with the task's values filled in."""
    steps = []
    for block in blocks:
        if block.skip or replay.skips(block.page, block.index):
            continue
        origin = Origin(page=block.page, block=block.index)
        if block.kind == "shell":
            for step in block.steps:
                missing = tuple(p for p in step.placeholders if replay.value(p) is None)
                steps.append(DocsStep(origin=origin, command=_filled(step.command, replay),
                                      placeholders=missing))
        elif block.kind == "file" and block.file is not None:
            missing = tuple(p for p in block.placeholders if replay.value(p) is None)
            steps.append(DocsStep(origin=origin, placeholders=missing,
                                  command=write_command(block.file, _filled(block.content, replay))))
    return steps


def write_command(file: str, content: str) -> str:
    """A command that writes ``content`` to ``file`` in the working directory, and nowhere else.

    A name that leaves the workspace (absolute, ``~``, a ``..`` part) is
    written as its last part, so the page's file still exists for the next
    step that names it by that part, and nothing outside is touched.
    """
    path = workspace_path(file)
    folder = posixpath.dirname(path)
    make = f"mkdir -p -- {shlex.quote(folder)} && " if folder else ""
    return f"{make}printf '%s' {shlex.quote(content)} > {shlex.quote(path)}"


def workspace_path(file: str) -> str:
    """Where a file block named ``file`` is written, relative to the workspace."""
    parts = [p for p in file.removeprefix("~/").split("/") if p not in ("", ".")]
    if file.startswith(("/", "~")) or ".." in parts:
        parts = parts[-1:]
    return posixpath.join(*parts) if parts else "file"


def _filled(text: str, replay: DocsReplay) -> str:
    for name, value in replay.values:
        for form in (f"<{name}>", f"${{{name}}}", f"${name}"):
            text = text.replace(form, value)
        if re.fullmatch(r"(?:YOUR|MY)_\w+|your[-_][\w-]+", name):
            text = re.sub(rf"(?<![\w$<-]){re.escape(name)}(?![\w>-])", lambda _m, v=value: v, text)
    return text


def drift(steps: Sequence[ReplayStep], blocks: Sequence[Block]) -> list[Drift]:
    """The hand-written steps, not marked undocumented, that match no block in ``blocks``.

    A step matches a block when it is one of the block's commands, when its
    text is in the block's text (whitespace aside), or when it writes by a
    heredoc exactly the block's text.
    """
    found = []
    for number, step in enumerate(steps, start=1):
        if step.undocumented is None and not any(matches(step.run, b) for b in blocks):
            found.append(Drift(number=number, step=step.run, nearest=nearest(step.run, blocks)))
    return found


def matches(step: str, block: Block) -> bool:
    text = _squeeze(step)
    if any(_squeeze(s.command) == text for s in block.steps):
        return True
    if text and text in _squeeze(block.text):
        return True
    heredoc = _HEREDOC_WRITE.match(step.strip())
    if heredoc is not None and heredoc.group("end") == (heredoc.group("da") or heredoc.group("db")):
        return _squeeze(heredoc.group("body")) == _squeeze(block.text)
    return False


def nearest(step: str, blocks: Sequence[Block]) -> Block | None:
    """The block whose text is most like ``step``'s, or None when there are none."""
    if not blocks:
        return None
    text = _squeeze(step)
    return max(blocks, key=lambda b: difflib.SequenceMatcher(None, text, _squeeze(b.text)).ratio())


def _squeeze(text: str) -> str:
    return "\n".join(" ".join(line.split()) for line in text.strip().split("\n") if line.strip())


def _first_line(text: str) -> str:
    lines = text.strip().split("\n")
    return lines[0] + (" ..." if len(lines) > 1 else "")
