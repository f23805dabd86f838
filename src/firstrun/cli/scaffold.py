"""``firstrun init URL``: a task file to start from, for one documentation page.

Guarantee: a scaffold loads (it is checked with ``read_task`` before it
takes its final name) and can never pass silently: its check fails every
run and its goal is a placeholder, both marked with ``SCAFFOLD_MARKER``,
which ``firstrun validate`` reports until they are replaced. It never
overwrites a file: the finished scaffold is hard-linked into place, which
fails if the name exists, so even a race cannot replace someone's task.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from firstrun.errors import PolicyError, TaskError, UsageError
from firstrun.policy.hosts import canonical_host
from firstrun.tasks.lint import SCAFFOLD_MARKER
from firstrun.tasks.load import DEFAULT_TASK_DIR, read_task
from firstrun.tasks.model import NAME_PATTERN

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


def scaffold_text(url: str, name: str, host: str) -> str:
    """The task file ``init`` writes. JSON strings are valid YAML scalars, so any URL is quoted safely."""
    q = json.dumps
    return f"""\
# Scaffolded by `firstrun init` from {url}
# Replace every "{SCAFFOLD_MARKER}"; `firstrun validate` lists the ones left.
# Until then the check fails every run: a scaffold never passes by accident.
# The whole format: `firstrun schema`.
name: {q(name)}
goal: >
  {SCAFFOLD_MARKER}: what a reader following these docs ends up with, said so an
  agent knows when it is done, e.g. "install the package and write the first
  program the quickstart shows into hello.py".
docs:
  # The page a reader starts from. For a route of several pages, replace it with
  # path: [first page, second page, ...] in reading order.
  entrypoint: {q(url)}
  # Documentation hosts are read through read_docs only (recorded); the shell is refused them.
  allow:
    - {q(host)}
# Hosts the shell may reach besides the package registries (pypi.org, registry.npmjs.org, ...):
# network:
#   allow:
#     - github.com
# Commands run before the agent starts (not part of what the docs are judged on):
# setup:
#   - python3 -m venv .venv
# The commands the docs tell a reader to run, in order; `--agent replay` runs them and stops
# at the first failure. Without this block, a replay run is recorded as skipped.
# replay:
#   - python3 -m venv .venv
#   - .venv/bin/pip install PACKAGE
success:
  # Runs in the workspace after the agent stops: exit 0 passes, anything else fails.
  # Helpers: qs_fail MESSAGE, qs_serve CMD..., qs_wait_http PATH [--contains S],
  # qs_expect_output, and $QS_PORT.
  script: |
    qs_fail "{SCAFFOLD_MARKER}: write the check that proves the quickstart worked"
"""


def init_task(url: str, *, name: str | None = None, out: str | None = None) -> Path:
    """Write a scaffold for ``url`` and return its path. Errors name the flag or the URL."""
    host = _validate_url(url)
    if name is not None and not re.match(NAME_PATTERN, name):
        raise UsageError(
            f"--name {name!r}: a task name holds letters, digits, '.', '_' and '-' and starts "
            "with a letter or digit"
        )
    name = name or task_name_for(url)
    if out is None:
        target = Path(DEFAULT_TASK_DIR) / f"{name}.yaml"
        target.parent.mkdir(exist_ok=True)
        flag = "init"
    else:
        target = Path(out)
        flag = "--out"
        if not target.parent.is_dir():
            raise UsageError(f"--out: directory {str(target.parent)!r} does not exist")
    if target.exists() or target.is_symlink():
        raise UsageError(f"{flag}: {target} already exists; init never overwrites a task file")
    # Not named *.yaml, so a leftover after a crash is never taken for a task.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(scaffold_text(url, name, host))
        try:
            read_task(tmp)
        except TaskError as exc:
            raise UsageError(f"init: URL {url!r} does not make a valid task: {exc.detail}") from None
        try:
            os.link(tmp, target)
        except FileExistsError:
            raise UsageError(
                f"{flag}: {target} already exists; init never overwrites a task file"
            ) from None
    finally:
        os.unlink(tmp)
    return target
