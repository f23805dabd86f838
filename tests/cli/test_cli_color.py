"""``--color``, NO_COLOR and FORCE_COLOR: one decision, and every styled command obeys it.

The decision is a table of (flag, NO_COLOR, FORCE_COLOR, terminal) to on or
off; the commands are then checked to print rich's escapes exactly when it
says on, and otherwise the plain text a pipe gets, whatever rich itself
would make of the environment.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from firstrun.cli.color import COLORS, color_enabled, colors, rich_console
from firstrun.cli.main import build_parser
from firstrun.run.events import CommandRan, RunFinished, RunStarted, Source, Trace

ESC = "\x1b["

# (--color, NO_COLOR, FORCE_COLOR, stream is a terminal) -> styled
TABLE = [
    ("auto", None, None, True, True),
    ("auto", None, None, False, False),
    ("auto", "1", None, True, False),
    ("auto", "", None, True, True),  # set but empty: as if unset
    ("auto", None, "1", False, True),
    ("auto", None, "0", False, True),  # any non-empty value, 0 included
    ("auto", None, "", False, False),
    ("auto", "1", "1", True, False),  # both: NO_COLOR wins
    ("auto", "1", "1", False, False),
    ("always", None, None, False, True),
    ("always", "1", None, False, True),
    ("always", "1", None, True, True),
    ("never", None, None, True, False),
    ("never", None, "1", True, False),
    ("never", None, "1", False, False),
]


@pytest.mark.parametrize(("flag", "no_color", "force_color", "isatty", "styled"), TABLE)
def test_the_decision(flag: str, no_color: str | None, force_color: str | None, isatty: bool,
                      styled: bool) -> None:
    env = {name: value for name, value in (("NO_COLOR", no_color), ("FORCE_COLOR", force_color))
           if value is not None}
    assert color_enabled(flag, env=env, isatty=isatty) is styled


def test_a_dumb_terminal_gets_no_colour_unless_forced() -> None:
    assert color_enabled("auto", env={"TERM": "dumb"}, isatty=True) is False
    assert color_enabled("auto", env={"TERM": "dumb", "FORCE_COLOR": "1"}, isatty=True) is True
    assert color_enabled("always", env={"TERM": "dumb"}, isatty=True) is True


def test_an_unknown_choice_is_refused_and_the_parser_offers_the_same_ones() -> None:
    with pytest.raises(ValueError, match="--color"):
        color_enabled("sometimes", env={}, isatty=True)
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for command in ("run", "show", "diff", "doctor"):
        (action,) = [a for a in sub.choices[command]._actions if "--color" in a.option_strings]
        assert tuple(action.choices) == COLORS and action.default == "auto", command


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_stream_that_cannot_say_is_no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    closed = io.StringIO()
    closed.close()
    assert colors("auto", closed) is False
    assert colors("auto", io.StringIO()) is False
    assert colors("auto", _Terminal()) is True


@pytest.mark.parametrize("env", [{"NO_COLOR": "1"}, {"TERM": "dumb"}, {"TTY_COMPATIBLE": "0"}, {}])
def test_the_console_colours_as_told_whatever_rich_reads_in_the_environment(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = io.StringIO()
    rich_console(out, color=True).print("[red]x[/]")
    assert f"{ESC}31m" in out.getvalue()
    monkeypatch.setenv("FORCE_COLOR", "1")
    out = io.StringIO()
    rich_console(out, color=False).print("[red]x[/]")
    assert out.getvalue() == "x\n"


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    trace = Trace(path)
    trace.emit(RunStarted(task="hello", attempt=1, agent="replay", model=None, task_file="t.yaml",
                          task_sha256="f" * 64))
    trace.emit(CommandRan(source=Source.AGENT, command="false", exit_code=1, duration_s=0.1))
    trace.emit(RunFinished(classification="docs_gap", reason="check_failed"))
    trace.close()
    return path


@pytest.mark.parametrize(("flag", "env", "styled"), [
    ("auto", {}, False),  # capsys's stdout is no terminal
    ("auto", {"FORCE_COLOR": "1"}, True),
    ("always", {"NO_COLOR": "1"}, True),
    ("never", {"FORCE_COLOR": "1"}, False),
])
def test_show_styles_exactly_when_the_decision_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        flag: str, env: dict[str, str], styled: bool) -> None:
    from firstrun.cli.show import show

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    trace = _trace(tmp_path)
    show(str(trace), color="never")
    plain = capsys.readouterr().out
    assert ESC not in plain and "hello" in plain
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    show(str(trace), color=flag)
    out = capsys.readouterr().out
    assert (ESC in out) is styled
    if not styled:
        assert out == plain


def test_run_summary_is_a_styled_table_only_when_told(capsys: pytest.CaptureFixture[str]) -> None:
    from cli_records import record

    from firstrun.cli.run import _print_summary
    from firstrun.reports.summary import table_lines
    from firstrun.results.model import Classification

    records = [record("hello", 1, Classification.PASSED)]
    _print_summary(records, Path("out"), interrupted=False, color=False)
    plain = capsys.readouterr().out
    assert plain.startswith("\n".join(table_lines(records)) + "\n") and ESC not in plain
    _print_summary(records, Path("out"), interrupted=False, color=True)
    styled = capsys.readouterr().out
    assert ESC in styled and "firstrun run" in styled
    assert "results: out/results.json\n" in plain and "results: out/results.json\n" in styled
