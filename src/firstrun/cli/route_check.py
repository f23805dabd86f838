"""What ``firstrun validate`` says of a task's replay once it has read the route's pages.

Guarantee: the route is read through a ``DocsReader`` as ``run`` reads it (the
task's docs hosts only, robots honoured, mirrors first), and only where that is
safe offline: every route host mirrored, or the network allowed
(``--check-urls``). Otherwise, or when a page cannot be read, one finding says
so and nothing is compared. Read pages give drift findings for hand-written
steps, and for ``replay: docs`` the steps it will take and what would stop it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from firstrun.agents.replay import DocsStep, docs_steps, drift
from firstrun.docs import DocsReader, Mirror, Page, default_user_agent
from firstrun.docs.blocks import Block
from firstrun.errors import PolicyError
from firstrun.examples import example_mirrors, list_examples
from firstrun.policy.hosts import canonical_host
from firstrun.tasks.compile import covering
from firstrun.tasks.lint import Code, Finding, Severity
from firstrun.tasks.model import KeyPath, Task

_TIMEOUT_S = 15.0


def route_findings(task: Task, *, mirrors: Mapping[str, Mirror], online: bool) -> list[Finding]:
    """The findings about ``task``'s replay that need its pages (none without a replay)."""
    if task.spec.replay_docs is None and not task.spec.replay_steps:
        return []
    mirrors = {**_own_example(task), **mirrors}
    unmirrored = sorted({_host(url) for url in task.docs_route} - set(mirrors))
    if unmirrored and not online:
        return [_at(task, Severity.NOTE, Code.ROUTE_NOT_READ, ("replay",),
                    f"replay not compared with the docs: {', '.join(unmirrored)} not read offline "
                    "(--check-urls reads the route; --docs-mirror HOST=DIR serves it from a directory)")]
    allow = [p for entry in task.docs_hosts for p in covering(entry.pattern)]
    with DocsReader(allow=allow, proxy=None, cache_dir=None, user_agent=default_user_agent(),
                    min_delay_s=0.0, mirrors=mirrors, timeout_s=_TIMEOUT_S) as reader:
        pages = []
        for key, url in zip(_route_keys(task), task.docs_route, strict=True):
            page = reader.read(url)
            if not page.ok:
                return [_at(task, Severity.WARNING, Code.ROUTE_NOT_READ, key,
                            f"route page {url} could not be read ({page.error}: {page.detail}); "
                            "replay not compared with the docs")]
            pages.append(page)
    if task.spec.replay_docs is None:
        return _drift(task, [block for page in pages for block in page.blocks])
    return _docs(task, pages)


# A hand-written step no code block on the route shows, not marked
# ``undocumented``: a warning at the step's line naming the nearest block.
def _drift(task: Task, blocks: Sequence[Block]) -> list[Finding]:
    return [_at(task, Severity.WARNING, Code.REPLAY_DRIFT, ("replay", found.number - 1),
                f"replay {found.describe()}; if no page is meant to show it, mark it "
                "{run: ..., undocumented: WHY}")
            for found in drift(task.spec.replay_steps, blocks)]


# Under ``replay: docs``: a skip naming no block, a route with nothing to run,
# each value the docs leave to the reader that the task does not give, and the
# steps it will take.
def _docs(task: Task, pages: Sequence[Page]) -> list[Finding]:
    replay = task.spec.replay_docs
    assert replay is not None
    findings = []
    for index, ref in enumerate(replay.skip):
        page = next(p for p in pages if p.url_requested == ref.page)
        if ref.block >= len(page.blocks):
            findings.append(_at(task, Severity.ERROR, Code.REPLAY_NO_SUCH_BLOCK, ("replay", "skip", index),
                                f"replay.skip names block {ref.block} of {ref.page}, which has "
                                f"{_count(len(page.blocks))}"))
    taken = [(page, docs_steps(page.blocks, replay)) for page in pages]
    if not any(steps for _, steps in taken):
        shown = sum(len(page.blocks) for page in pages)
        findings.append(_at(task, Severity.ERROR, Code.REPLAY_NOTHING_TO_RUN, ("replay",),
                            f"replay: docs has nothing to run: the route's pages show "
                            f"{_count(shown)}, none of them a shell or file block"))
        return findings
    for _, steps in taken:
        for step in steps:
            if step.placeholders:
                findings.append(_at(task, Severity.WARNING, Code.REPLAY_NEEDS_INPUT, ("replay",),
                                    f"{step.where()} needs a value for {', '.join(step.placeholders)}; "
                                    "without one under replay.values the run stops there (needs_input)"))
    summary = "; ".join(f"{page.url_requested} blocks {', '.join(_blocks(steps))}"
                        for page, steps in taken if steps)
    total = sum(len(steps) for _, steps in taken)
    findings.append(_at(task, Severity.NOTE, Code.REPLAY_STEPS, ("replay",),
                        f"replay: docs takes {total} step{'s' * (total != 1)} from {summary}"))
    return findings


def _blocks(steps: Sequence[DocsStep]) -> list[str]:
    return [str(b) for b in dict.fromkeys(step.origin.block for step in steps)]


def _count(n: int) -> str:
    return "no code block" if n == 0 else f"{n} code block{'s' * (n != 1)}"


def _own_example(task: Task) -> dict[str, Mirror]:
    """A bundled example's own docs mirror, when ``task`` is that example's task file."""
    here = Path(task.path).resolve()
    return example_mirrors([e for e in list_examples() if e.task_path == here])


def _host(url: str) -> str:
    try:
        return canonical_host(urlsplit(url).hostname or "")
    except PolicyError:
        return url


def _route_keys(task: Task) -> list[KeyPath]:
    docs = task.spec.docs
    if docs.path is not None:
        return [("docs", "path", i) for i in range(len(docs.path))]
    return [("docs", "entrypoint")]


def _at(task: Task, severity: Severity, code: Code, path: KeyPath, message: str) -> Finding:
    return Finding(severity=severity, code=code, message=message, file=task.path,
                   line=task.locations.line(path))
