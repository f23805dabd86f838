"""Whether a command styles what it prints: ``--color``, ``NO_COLOR``, ``FORCE_COLOR``, the terminal.

Guarantee: every command that styles its output (``run``, ``show``, ``diff``,
``doctor``) asks ``color_enabled`` once per stream, and it alone decides.
Unstyled output is the plain text a pipe gets, with no escape codes, so
``--color never`` on a terminal prints exactly what a log would hold.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from firstrun.run.options import COLORS

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["COLORS", "color_enabled", "colors", "rich_console"]


# ``--color always`` and ``never`` win over everything; under ``auto`` a
# non-empty ``NO_COLOR`` turns styling off (https://no-color.org), then a
# non-empty ``FORCE_COLOR`` turns it on (https://force-color.org), then only a
# terminal that is not ``TERM=dumb`` gets it. NO_COLOR wins when both are set,
# as in Python's own and rich's reading of them.
def color_enabled(choice: str, *, env: Mapping[str, str], isatty: bool) -> bool:
    """Whether to style a stream: ``choice`` is ``--color``'s value, ``isatty`` the stream's."""
    if choice not in COLORS:
        raise ValueError(f"--color: {choice!r} is not one of {', '.join(COLORS)}")
    if choice != "auto":
        return choice == "always"
    if env.get("NO_COLOR"):
        return False
    if env.get("FORCE_COLOR"):
        return True
    return isatty and env.get("TERM") != "dumb"


def colors(choice: str, stream: TextIO) -> bool:
    """``color_enabled`` for ``stream`` in this process's environment."""
    try:
        isatty = stream.isatty()
    except (AttributeError, ValueError):
        # A closed or replaced stream is no terminal.
        isatty = False
    return color_enabled(choice, env=os.environ, isatty=isatty)


def rich_console(stream: TextIO, *, color: bool, **kwargs: Any) -> Console:
    """A rich console on ``stream`` that writes terminal codes whatever the stream and the
    environment are, and colour exactly when ``color``: the caller has already decided
    (``colors``), and draws on a terminal only what belongs there (the live board)."""
    from rich.console import Console

    # Explicit, so rich's own reading of NO_COLOR, FORCE_COLOR, TERM and isatty
    # cannot undo the decision; every style firstrun uses is one of the 16 colours.
    return Console(file=stream, force_terminal=True, no_color=not color,
                   color_system="standard" if color else None, **kwargs)
