"""Flags that more than one command takes, and the checks on their values.

Guarantee: a flag named here is declared and checked in one place, so
every command that takes it reads it the same way; a bad value is a
``UsageError`` naming the flag, raised before any run or report starts.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from firstrun.errors import UsageError
from firstrun.run.options import COLOR_HELP, COLORS, GITHUB_SUMMARY_FROM_ENV

GITHUB_ENV = "GITHUB_STEP_SUMMARY"


def github_summary_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--github-summary", nargs="?", const=GITHUB_SUMMARY_FROM_ENV, metavar="FILE",
                        help="append a markdown summary to FILE (default: the file named by "
                        "$GITHUB_STEP_SUMMARY); write --github-summary=FILE when TASK arguments follow")


def color_flag(parser: argparse.ArgumentParser) -> None:
    """``--color`` on a command that styles its output (``run`` declares its own in RUN_OPTIONS)."""
    parser.add_argument("--color", choices=COLORS, default="auto", help=COLOR_HELP)


def summary_target(value: str) -> Path:
    """The file ``--github-summary`` appends to, checked before any run or report starts."""
    if value == GITHUB_SUMMARY_FROM_ENV:
        named = os.environ.get(GITHUB_ENV)
        if not named:
            raise UsageError(f"--github-summary: no FILE given and ${GITHUB_ENV} is not set")
        return writable_file("--github-summary", named)
    if Path(value).suffix.lower() in (".yaml", ".yml"):
        # ``run --github-summary tasks/a.yaml`` reads the task as FILE; appending
        # markdown to a task file would corrupt it.
        raise UsageError(f"--github-summary: {value!r} looks like a task file; to name the summary "
                         "file write --github-summary=FILE, or put TASK arguments before the flag")
    return writable_file("--github-summary", value)


def writable_file(flag: str, value: str) -> Path:
    """``value`` as a file ``flag`` may write: not a directory, in a directory that exists."""
    path = Path(value)
    if path.is_dir():
        raise UsageError(f"{flag}: {value!r} is a directory")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"{flag}: directory {os.fspath(parent)!r} does not exist")
    return path
