"""Flags that more than one command takes, and the checks on their values.

Guarantee: a flag named here is declared and checked in one place, so
every command that takes it reads it the same way; a bad value is a
``UsageError`` naming the flag, raised before any run or report starts.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import NamedTuple

from firstrun.errors import UsageError
from firstrun.run.options import COLOR_HELP, COLORS, GITHUB_SUMMARY_FILE_HELP, GITHUB_SUMMARY_HELP

GITHUB_ENV = "GITHUB_STEP_SUMMARY"


def github_summary_flags(parser: argparse.ArgumentParser) -> None:
    """The summary's two flags on a command that writes it (``run`` declares its own in RUN_OPTIONS).

    ``--github-summary`` takes no value, so a TASK after it is never read as
    the summary's file; a file of one's own is named by ``--github-summary-file``.
    """
    parser.add_argument("--github-summary", action="store_true", help=GITHUB_SUMMARY_HELP)
    parser.add_argument("--github-summary-file", metavar="FILE", help=GITHUB_SUMMARY_FILE_HELP)


def color_flag(parser: argparse.ArgumentParser) -> None:
    """``--color`` on a command that styles its output (``run`` declares its own in RUN_OPTIONS)."""
    parser.add_argument("--color", choices=COLORS, default="auto", help=COLOR_HELP)


class SummaryFile(NamedTuple):
    """The file the summary is appended to, and the flag that named it (for refusals)."""

    flag: str
    path: Path


def summary_target(to_env: bool, file: str | None) -> SummaryFile | None:
    """Where ``--github-summary`` or ``--github-summary-file`` appends the summary; None for neither.

    Both flags together are refused rather than one ignored: each names a
    different file, and a summary silently missing from either is a surprise.
    """
    if to_env and file is not None:
        raise UsageError("--github-summary and --github-summary-file: each names the file the summary "
                         f"goes to (${GITHUB_ENV}'s, or FILE); give one")
    if file is not None:
        return SummaryFile("--github-summary-file", writable_file("--github-summary-file", file))
    if not to_env:
        return None
    named = os.environ.get(GITHUB_ENV)
    if not named:
        raise UsageError(f"--github-summary: ${GITHUB_ENV} is not set (it is in GitHub Actions); "
                         "to name the file, use --github-summary-file FILE")
    return SummaryFile("--github-summary", writable_file("--github-summary", named))


def writable_file(flag: str, value: str) -> Path:
    """``value`` as a file ``flag`` may write: not a directory, in a directory that exists."""
    path = Path(value)
    if path.is_dir():
        raise UsageError(f"{flag}: {value!r} is a directory")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"{flag}: directory {os.fspath(parent)!r} does not exist")
    return path
