"""Writing a report to a file: replaced atomically, or appended in one write.

Guarantee: a replaced report is either the old file or the new one, never a
torn mix (temporary file in the same directory, fsynced, renamed over). An
appended report (``$GITHUB_STEP_SUMMARY``, which other steps share) goes
out in a single ``write`` on an ``O_APPEND`` descriptor, so it lands after
whatever is already there and is never interleaved with itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from firstrun.results.store import write_atomic


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) so readers see old or new, never a mix."""
    write_atomic(path, text.encode("utf-8"))


def append_text(path: Path, text: str) -> None:
    """Append ``text`` (UTF-8) to ``path``, creating it if needed, in one write."""
    data = text.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        written = os.write(fd, data)
        while written < len(data):
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)
