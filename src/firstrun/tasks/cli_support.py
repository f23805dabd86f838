"""What ``firstrun validate`` and ``firstrun schema`` need, as functions the CLI calls.

Guarantee: validating never raises for a problem with a task; every problem
becomes a ``Finding`` with a file and (where one exists) a line, so one bad
file never hides the findings of the next. The exit code follows the
project's convention: 0 when no finding is an error, 1 when one is, and 3
(usage) when no task file was found at all, so a CI job pointed at the wrong
directory stops reporting success.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Callable, Sequence

import httpx

from firstrun import __version__
from firstrun.errors import TaskError
from firstrun.tasks.lint import Code, Finding, Severity, lint_task
from firstrun.tasks.lint import check_urls as check_docs_urls
from firstrun.tasks.load import duplicate_names, expand_task_paths, read_task
from firstrun.tasks.model import Task
from firstrun.tasks.schema import task_json_schema

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 3

USER_AGENT = f"firstrun/{__version__} (validate --check-urls)"


def validate_paths(
    paths: Sequence[str | os.PathLike[str]],
    *,
    check_urls: bool = False,
    client: httpx.Client | None = None,
    also: Callable[[Task], list[Finding]] | None = None,
) -> tuple[list[Finding], int]:
    """Lint every task named by ``paths`` (files, directories, globs; none means ``tasks/``).

    ``check_urls`` also fetches each documented page, with ``client`` when
    given (the caller keeps it open and closes it) or else with
    ``url_check_client()``, opened and closed here. ``also`` gives each
    loaded task's further findings (the CLI's comparison with the docs).
    """
    if check_urls and client is None:
        with url_check_client() as owned:
            return validate_paths(paths, check_urls=True, client=owned, also=also)
    files, unmatched = expand_task_paths(paths)
    findings = [
        Finding(
            severity=Severity.ERROR,
            code=Code.NO_SUCH_PATH,
            message="no task files here",
            file=arg,
            line=None,
        )
        for arg in unmatched
    ]
    tasks: list[Task] = []
    for file in files:
        try:
            task = read_task(file)
        except TaskError as exc:
            findings.append(
                Finding(
                    severity=Severity.ERROR,
                    code=Code.INVALID_TASK,
                    message=exc.detail,
                    file=exc.path,
                    line=exc.line,
                )
            )
            continue
        tasks.append(task)
        findings.extend(lint_task(task))
        if check_urls and client is not None:
            findings.extend(check_docs_urls(task, client))
        if also is not None:
            findings.extend(also(task))
    findings.extend(
        Finding(
            severity=Severity.ERROR,
            code=Code.DUPLICATE_NAME,
            message=e.detail,
            file=e.path,
            line=e.line,
        )
        for e in duplicate_names(tasks)
    )
    if not files:
        return findings, EXIT_USAGE
    if any(f.severity is Severity.ERROR for f in findings):
        return findings, EXIT_INVALID
    return findings, EXIT_OK


def url_check_client(timeout_s: float = 15.0) -> httpx.Client:
    """The client ``validate --check-urls`` uses: system trust store, a truthful User-Agent."""
    return httpx.Client(
        timeout=timeout_s,
        headers={"User-Agent": USER_AGENT},
        verify=ssl.create_default_context(),
    )


def schema_text() -> str:
    """``firstrun schema``'s output: the task JSON Schema, stable key order, newline-terminated."""
    return json.dumps(task_json_schema(), indent=2, sort_keys=True) + "\n"
