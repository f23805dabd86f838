"""One line of an agent CLI's JSON-lines stream, as both stream readers take it.

Guarantee: pure; a line is nothing (blank), a JSON object, or ``Noise`` (the
CLI's own text, or JSON that is not an object), never an exception.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Noise:
    line: str


def read_line(line: str) -> dict[str, Any] | Noise | None:
    """``line`` as a JSON object, ``Noise``, or None when it is blank."""
    line = line.strip()
    if not line:
        return None
    try:
        data = json.loads(line)
    except ValueError:
        # The CLI's own warnings and notices.
        return Noise(line=line)
    return data if isinstance(data, dict) else Noise(line=line)


def count(value: Any) -> int:
    """A token count from the stream: an int, or 0 for anything else (a bool included)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
