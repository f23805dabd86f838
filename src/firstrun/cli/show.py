"""``firstrun show``: print a saved trace's narration, styled on a terminal, plain otherwise.

Guarantee: what is printed is exactly ``firstrun.reports.narrate`` of the
saved trace; styling (colour for blocked egress and failures) is added only
when ``--color`` decides so (by default, when stdout is a terminal; see
``cli.color``), so unstyled output is the same text without escapes.
"""

from __future__ import annotations

import sys

from firstrun.cli.color import colors, rich_console
from firstrun.reports.narrate import Line, Style, narrate_file, trace_paths

_COLOURS = {Style.HEADING: "bold", Style.OK: "green", Style.BAD: "bold red", Style.DIM: "dim"}


def show(target: str, *, color: str = "auto") -> int:
    paths = trace_paths(target)
    narrations = [(path, narrate_file(path)) for path in paths]
    if colors(color, sys.stdout):
        from rich.text import Text

        console = rich_console(sys.stdout, color=True, highlight=False)

        def emit(line: Line) -> None:
            console.print(Text(line.text, style=_COLOURS.get(line.style, "")), soft_wrap=True)
    else:

        def emit(line: Line) -> None:
            print(line.text)

    for i, (path, lines) in enumerate(narrations):
        if len(narrations) > 1:
            if i:
                print()
            emit(Line(text=f"== {path}", style=Style.HEADING))
        for line in lines:
            emit(line)
    return 0
