"""Messages shown on a terminal or in a record are one printable line, capped where asked."""

from __future__ import annotations

import pytest

from firstrun.errors import one_line


@pytest.mark.parametrize(("text", "cap", "shown"), [
    ("plain", None, "plain"),
    ("two\nlines\r\n  and\ttabs", None, "two lines and tabs"),
    ("\x1b[31mred\x1b[0m bell\x07", None, "[31mred [0m bell"),
    ("x" * 10, 4, "xxxx"),
    ("  \n ", None, ""),
])
def test_each_run_of_whitespace_or_control_is_one_space(text: str, cap: int | None,
                                                         shown: str) -> None:
    assert one_line(text, cap) == shown
