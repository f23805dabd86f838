"""The bundled examples: quickstarts that run offline, each with its own docs site.

Guarantee: every example listed here ships as package data beside this module:
a ``task.yaml`` and a ``docs/`` directory holding the whole documentation site
its task routes through, on one docs host under the reserved ``.example``
top-level domain, so no name in it can reach a real server. ``example_mirrors``
serves each host from its directory, so ``--example NAME`` reads the docs
without a network; package installs still go through the egress proxy.
"""

from __future__ import annotations

import difflib
import os
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from firstrun.docs import Mirror
from firstrun.errors import UsageError
from firstrun.policy.hosts import canonical_host
from firstrun.tasks.load import read_task

FLAG = "--example"

# Every example, in the order they are listed and run: name (its directory
# and its task's name) and a one-line summary for ``firstrun examples``.
_SUMMARIES = (
    ("python-tabulate", "Python: a venv, pip install tabulate from PyPI, print a table"),
    ("node-ms", "Node.js: npm init, npm install ms from the npm registry, convert durations"),
    ("node-fetch", "Node.js: the built-in fetch, which ignores proxy variables, asks the npm "
                   "registry's JSON API for the latest ms"),
)

_ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True, kw_only=True)
class Example:
    """One bundled example: its task file, and the docs site served for ``docs_host``."""

    name: str
    summary: str
    task_path: Path
    docs_dir: Path
    docs_host: str


def list_examples() -> list[Example]:
    """Every bundled example, in a stable order. Raises ``TaskError`` for a broken bundle."""
    return [_example(name, summary) for name, summary in _SUMMARIES]


def find_example(name: str) -> Example:
    """The example called ``name``; a ``UsageError`` naming ``--example`` otherwise."""
    for known, summary in _SUMMARIES:
        if known == name:
            return _example(known, summary)
    names = [known for known, _ in _SUMMARIES]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise UsageError(
        f"{FLAG} {name!r}: no such example{hint} (known: {', '.join(names)}, or 'all')"
    )


def example_mirrors(examples: Iterable[Example]) -> dict[str, Mirror]:
    """Directory mirrors serving each example's docs host from its bundled site."""
    return {
        example.docs_host: Mirror(host=example.docs_host, directory=os.fspath(example.docs_dir))
        for example in examples
    }


# The docs host is read from the task file itself (the host of its first page)
# rather than restated here, so the mirror and the route cannot disagree.
def _example(name: str, summary: str) -> Example:
    task_path = _ROOT / name / "task.yaml"
    task = read_task(task_path)
    host = urllib.parse.urlsplit(task.docs_route[0]).hostname
    assert host is not None, "a loaded task's route holds http(s) URLs"
    return Example(
        name=name,
        summary=summary,
        task_path=task_path,
        docs_dir=_ROOT / name / "docs",
        docs_host=canonical_host(host),
    )
