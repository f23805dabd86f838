"""``firstrun init URL [URL ...]``: a task drafted from the docs pages, that runs.

Guarantee: the pages are read through a ``DocsReader`` as ``run`` reads them;
a page that cannot be read, or pages with nothing to replay, are refused in one
line before anything is written. The task has ``replay: docs`` and a check
drafted from what the pages show, marked as drafted (``tasks.lint.DRAFTED``) so
``validate`` reports it until a person edits it. The file is checked with
``read_task`` before it takes its name, and never overwrites a file, even in a race.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from firstrun.agents.replay import docs_steps, workspace_path
from firstrun.docs import DocsReader, Mirror, Page, default_user_agent
from firstrun.docs.blocks import BlockKind
from firstrun.errors import PolicyError, TaskError, UsageError
from firstrun.policy.hosts import canonical_host
from firstrun.tasks.compile import covering
from firstrun.tasks.lint import SCAFFOLD_MARKER, drafted_digest
from firstrun.tasks.load import DEFAULT_TASK_DIR, read_task
from firstrun.tasks.model import NAME_PATTERN, DocsReplay, host_entry

_NAME_LIMIT = 64
_PAGE_SUFFIXES = (".html", ".htm", ".md", ".rst", ".txt")


def task_name_for(url: str) -> str:
    """A task name from the URL's host and path: ``docs.example.com/en/start/`` -> ``docs-example-com-en-start``."""
    parts = urlsplit(url)
    host = (parts.hostname or "").removeprefix("www.")
    segments = [s for s in parts.path.split("/") if s]
    if segments:
        last = segments[-1]
        for suffix in _PAGE_SUFFIXES:
            last = last.removesuffix(suffix)
        segments[-1] = last
        if segments[-1] == "index":
            segments.pop()
    words = re.sub(r"[^A-Za-z0-9]+", "-", "-".join([host, *segments])).strip("-").lower()
    name = words[:_NAME_LIMIT].rstrip("-")
    return name or "task"


def _validate_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"init: URL {url!r} is not an http(s) URL with a host")
    try:
        return canonical_host(parts.hostname)
    except PolicyError as exc:
        raise UsageError(f"init: URL {url!r}: {exc.args[0]}") from None


_TIMEOUT_S = 15.0
_HEADING = re.compile(r"^#{1,3}\s+(.+?)\s*#*\s*$", re.MULTILINE)
# What varies between two runs of the same command, and what matches any of it (POSIX ERE).
_VOLATILE = re.compile(r"""
    (?P<path>(?:~|\.{1,2})?/[^\s'"]*|[\w.-]+(?:/[\w.-]+)+/?)
  | (?P<hex>\b[0-9a-f]{7,}\b)
  | (?P<version>\bv?\d+(?:\.\d+)+(?:[-+.]?[A-Za-z0-9]+)*)
  | (?P<number>\d+(?:\.\d+)?[A-Za-z]*)
  | (?P<space>\s+)
""", re.VERBOSE)
_LOOSE = {"path": "[^[:space:]]+", "hex": "[0-9a-f]+", "version": "v?[0-9][0-9A-Za-z.+-]*",
          "number": "[0-9][0-9.]*[[:alpha:]]*", "space": "[[:space:]]+"}
_ERE_SPECIAL = re.compile(r"([.\[\]{}()\\*+?^$|])")
# A line with fewer letters and digits than this left once loosened says nothing.
_MIN_LITERAL = 3


@dataclass(frozen=True, kw_only=True)
class DraftedCheck:
    """What the pages show: output lines (loosened, as ERE) the run must print, files it must make."""

    outputs: tuple[str, ...]
    files: tuple[str, ...]


def loosen(line: str) -> str | None:
    """``line`` of documented output as an extended regex that any run's own version of it
    matches; None when too little of it is the same from run to run to say anything."""
    text = line.strip()
    parts, literal, at = [], 0, 0
    for found in _VOLATILE.finditer(text):
        fixed = text[at:found.start()]
        literal += sum(c.isalnum() for c in fixed)
        parts += [_ERE_SPECIAL.sub(r"\\\1", fixed), _LOOSE[found.lastgroup or "space"]]
        at = found.end()
    literal += sum(c.isalnum() for c in text[at:])
    parts.append(_ERE_SPECIAL.sub(r"\\\1", text[at:]))
    return "".join(parts) if literal >= _MIN_LITERAL else None


# Each console block's documented output, loosened where it varies between
# runs (versions, numbers, times, paths, hashes, spacing), must be in what the
# run printed, and each file block's file must exist. Pages that show neither
# get init's placeholder check, which fails every run.
def drafted_check(pages: Sequence[Page]) -> DraftedCheck:
    outputs: list[str] = []
    files: list[str] = []
    for page in pages:
        for block in page.blocks:
            if block.skip:
                continue
            if block.kind is BlockKind.FILE and block.file is not None:
                files.append(workspace_path(block.file))
            for step in block.steps:
                outputs.extend(p for p in map(loosen, step.output) if p is not None)
    return DraftedCheck(outputs=tuple(dict.fromkeys(outputs)), files=tuple(dict.fromkeys(files)))


def goal_from(pages: Sequence[Page]) -> str:
    """The goal: the pages' titles, in order, and their headings."""
    titles = list(dict.fromkeys(" ".join(p.title.split()) for p in pages if p.title and p.title.strip()))
    headings = [h for h in dict.fromkeys(" ".join(m.group(1).split()) for p in pages
                                         for m in _HEADING.finditer(p.markdown)) if h not in titles]
    named = ", then ".join(json.dumps(t) for t in titles) if titles else "these pages"
    goal = f"Following the docs {named}, do what they show, in order"
    return goal + (": " + "; ".join(headings[:8]) if headings else "") + "."


def _check_script(check: DraftedCheck) -> str:
    lines = [f"qs_expect_output --matches {shlex.quote(p)}" for p in check.outputs]
    lines += [f"test -e {shlex.quote(f)} || qs_fail {shlex.quote(f'no {f}, the file the docs write')}"
              for f in check.files]
    if not lines:
        return f"qs_fail {shlex.quote(f'{SCAFFOLD_MARKER}: the pages show no output and no file; write the check that proves the quickstart worked')}\n"
    return "\n".join(lines) + "\n"


def draft_text(urls: Sequence[str], name: str, pages: Sequence[Page], *, digest: str) -> str:
    """The task file ``init`` writes. JSON strings are valid YAML scalars, so any text is quoted safely."""
    q = json.dumps
    hosts = list(dict.fromkeys(host_entry(u) for u in urls))
    script = _check_script(drafted_check(pages))
    marker = (f"# drafted by firstrun init ({digest}): read it, make it prove the goal; "
              "'firstrun validate' says so until it is edited\n")
    indented = "".join(f"    {line}\n" if line else "\n" for line in (marker + script).splitlines())
    route = "".join(f"    - {q(u)}\n" for u in urls)
    allow = "".join(f"    - {q(h)}\n" for h in hosts)
    return (
        f"# Drafted by `firstrun init` from {' '.join(urls)}\n"
        "# The replay runs the pages' own code blocks; the check was drafted from the output and\n"
        "# files they show. The whole format: `firstrun schema`.\n"
        f"name: {q(name)}\n"
        f"goal: {q(goal_from(pages))}\n"
        "docs:\n  path:\n" + route + "  allow:\n" + allow +
        "replay: docs\n"
        "success:\n  script: |\n" + indented
    )


# Their own hosts only, robots honoured, ``--docs-mirror`` first, the cache as usual.
def read_pages(urls: Sequence[str], *, mirrors: Mapping[str, Mirror], cache_dir: str | None) -> list[Page]:
    """Each page through the docs reader, as ``run`` reads it; one that cannot be read is refused."""
    allow = [p for u in urls for p in covering(host_entry(u).pattern)]
    with DocsReader(allow=allow, proxy=None, cache_dir=cache_dir, user_agent=default_user_agent(),
                    min_delay_s=0.0, mirrors=mirrors, timeout_s=_TIMEOUT_S) as reader:
        pages = []
        for url in urls:
            page = reader.read(url)
            if not page.ok:
                raise UsageError(f"init: URL {url!r} could not be read ({page.error}: {page.detail})")
            pages.append(page)
    if not any(docs_steps(page.blocks, DocsReplay(source="docs")) for page in pages):
        shown = sum(len(page.blocks) for page in pages)
        raise UsageError(f"init: {' '.join(urls)} show{'s' if len(urls) == 1 else ''} no shell or "
                         f"file block to replay ({shown} code block{'s' if shown != 1 else ''} in all), "
                         "so there is nothing to draft a task from")
    return pages


def init_task(urls: Sequence[str], *, name: str | None = None, out: str | None = None,
              mirrors: Mapping[str, Mirror] | None = None, cache_dir: str | None = None) -> Path:
    """Draft a task from ``urls`` and return its path. Errors name the flag or the URL."""
    for url in urls:
        _validate_url(url)
    if name is not None and not re.match(NAME_PATTERN, name):
        raise UsageError(
            f"--name {name!r}: a task name holds letters, digits, '.', '_' and '-' and starts "
            "with a letter or digit"
        )
    name = name or task_name_for(urls[0])
    if out is None:
        target = Path(DEFAULT_TASK_DIR) / f"{name}.yaml"
        flag = "init"
    else:
        target = Path(out)
        flag = "--out"
        if not target.parent.is_dir():
            raise UsageError(f"--out: directory {str(target.parent)!r} does not exist")
    if target.exists() or target.is_symlink():
        raise UsageError(f"{flag}: {target} already exists; init never overwrites a task file")
    pages = read_pages(urls, mirrors=mirrors or {}, cache_dir=cache_dir)
    target.parent.mkdir(exist_ok=True)
    # Not named *.yaml, so a leftover after a crash is never taken for a task.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(draft_text(urls, name, pages, digest="0" * 16))
        try:
            # The digest is of the check as loaded, without its own line.
            digest = drafted_digest(read_task(tmp).spec.success)
            Path(tmp).write_text(draft_text(urls, name, pages, digest=digest), encoding="utf-8")
            read_task(tmp)
        except TaskError as exc:
            raise UsageError(f"init: {' '.join(urls)} does not make a valid task: {exc.detail}") from None
        try:
            # A hard link fails on an existing name, where a rename would replace it.
            os.link(tmp, target)
        except FileExistsError:
            raise UsageError(
                f"{flag}: {target} already exists; init never overwrites a task file"
            ) from None
    finally:
        os.unlink(tmp)
    return target


def results_dir(given: str | None, name: str) -> Path:
    """Where the draft's one run is saved: a directory that holds no results yet."""
    where = Path(given) if given is not None else Path("results") / "init" / name
    if where.exists() and (not where.is_dir() or any(where.iterdir())):
        raise UsageError(f"--results: {os.fspath(where)!r} exists and is not an empty directory; "
                         "init never writes over results")
    return where


def try_draft(path: Path, *, out: Path, mirrors: Mapping[str, Mirror], cache_dir: str | None,
              backend: str, allow_unenforced: bool) -> int:
    """Run the drafted task once with replay in the sandbox; say what passed and what did not."""
    import sys

    from firstrun.agents.replay import ReplayAgent
    from firstrun.cli.interrupt import signals_unwind
    from firstrun.cli.run import _resolve
    from firstrun.results.model import Classification
    from firstrun.results.store import ResultsStore
    from firstrun.run.config import RunConfig
    from firstrun.run.events import Source, read_trace
    from firstrun.run.suite import run_suite, suite_exit_code
    from firstrun.tasks.load import load_tasks

    [task] = load_tasks([os.fspath(path)])
    resolution = _resolve(backend, allow_unenforced, [task.spec.image], None)
    if isinstance(resolution, str):
        print(resolution, file=sys.stderr)
        return 2
    config = RunConfig(out_dir=out, backend=resolution.backend, allow_unenforced=allow_unenforced,
                       docs_mirrors=dict(mirrors),
                       cache_dir=Path(cache_dir) if cache_dir is not None else None)
    store = ResultsStore(out, meta={"agent": "replay", "init": os.fspath(path)})
    with signals_unwind():
        # A signal stops the run with its session closed, then ends init as it ends run.
        outcome = run_suite([task], agent_factory=ReplayAgent, config=config, store=store,
                            resolution=resolution)
    if not outcome.records:
        print("init: the draft's run did not finish", file=sys.stderr)
        return 2
    record = outcome.records[0]
    printed = []
    for event in read_trace(out / record.trace):
        if event.get("kind") != "command" or event.get("source") != Source.AGENT.value:
            continue
        origin = event.get("origin") or {}
        mark = "ok  " if event["exit_code"] == 0 else "FAIL"
        print(f"  {mark} step {origin.get('page')} block {origin.get('block')}: "
              f"{event['command'].splitlines()[0] if event['command'] else ''}"
              + ("" if event["exit_code"] == 0 else f" (exit {event['exit_code']})"))
        if event["exit_code"] == 0:
            printed.append(event.get("stdout", "") + event.get("stderr", ""))
    for pattern in drafted_check_patterns(task.check):
        seen = any(re.search(_python_regex(pattern), line) for text in printed for line in text.splitlines())
        print(f"  {'ok  ' if seen else 'FAIL'} output matches {pattern}")
    verdict = "passed" if record.classification is Classification.PASSED else record.classification.value
    print(f"draft run: {verdict} ({record.reason})" + (f": {record.detail}" if record.detail else ""))
    print(f"trace: {out / record.trace} (firstrun show {(out / record.trace).parent})")
    return suite_exit_code([record])


def drafted_check_patterns(check: str) -> list[str]:
    """The output patterns a drafted check asks for, as written in it."""
    return [shlex.split(line)[2] for line in check.splitlines()
            if line.startswith("qs_expect_output --matches ")]


def _python_regex(ere: str) -> str:
    """The few POSIX classes ``loosen`` writes, as Python's ``re`` spells them."""
    return (ere.replace("[^[:space:]]", r"[^\s]").replace("[[:space:]]", r"\s")
            .replace("[[:alpha:]]", "[^\\W\\d_]"))
