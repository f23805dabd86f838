"""``run -q`` prints only the sweep's results line(s); ``run -v`` a line per run as it finishes.

Judged on the printing functions themselves, fed real records and events,
so no sandbox starts.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from cli_records import record

from firstrun.cli.progress import SweepProgress, finished_line
from firstrun.cli.run import RunRequest, _check_paths, _print_summary, sweep_progress
from firstrun.errors import UsageError
from firstrun.reports.summary import total_line
from firstrun.results.model import Classification
from firstrun.run.events import CommandRan, RunFinished, RunStarted, Source


def _records() -> list:
    return [
        record("hello", 1, Classification.PASSED),
        record("hello", 2, Classification.DOCS_GAP),
        record("other", 1, Classification.PASSED),
        record("other", 2, Classification.INFRA_ERROR),
    ]


def test_the_total_line_counts_every_run_and_rates_the_evidential_ones() -> None:
    assert total_line(_records()) == ("4 runs: 2 passed, 1 docs_gap, 1 infra_error; "
                                      "pass rate 2/3 (67%, 95% CI 21-94%)")
    assert total_line([record("a", 1, Classification.SKIPPED)]) == "1 run: 1 skipped; pass rate no evidence"


def test_quiet_prints_the_results_line_and_where_they_are_and_nothing_per_run(
        capsys: pytest.CaptureFixture[str]) -> None:
    _print_summary(_records(), Path("out"), interrupted=False, quiet=True)
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [total_line(_records()), "results: out/results.json"]
    assert captured.err == ""
    # The full summary has a line per run that did not pass; quiet has none.
    _print_summary(_records(), Path("out"), interrupted=False)
    full = capsys.readouterr().out
    assert "hello #2 docs_gap (check_failed)" in full and "firstrun show out/runs/hello/2" in full


def test_quiet_keeps_the_interruption_on_stderr_and_the_warning_that_a_pass_could_be_forged(
        capsys: pytest.CaptureFixture[str]) -> None:
    records = [record("hello", 1, Classification.PASSED, check_isolation="shared")]
    _print_summary(records, Path("out"), interrupted=True, quiet=True)
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert out[:2] == [total_line(records), "results: out/results.json"]
    assert len(out) == 3 and "could be forged" in out[2]
    assert captured.err.startswith("firstrun: interrupted: 1 finished run kept")


def test_quiet_with_nothing_finished_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    _print_summary([], Path("out"), interrupted=False, quiet=True)
    assert capsys.readouterr().out.splitlines() == ["no run finished", "results: out/results.json"]


def _sweep(progress: SweepProgress) -> None:
    """Two runs interleaved as workers send them; the second one to start finishes first."""
    for task in ("a", "b"):
        progress.update(task, 1, RunStarted(task=task, attempt=1, agent="replay", model=None,
                                            task_file=f"{task}.yaml", task_sha256="0"))
    progress.update("a", 1, CommandRan(source=Source.AGENT, command="x", exit_code=0, duration_s=0.1))
    progress.update("b", 1, RunFinished(classification="docs_gap", reason="check_failed"))
    progress.update("a", 1, RunFinished(classification="passed", reason="check_passed"))


def test_verbose_says_each_run_as_it_finishes_in_the_order_they_finish() -> None:
    stream = io.StringIO()
    progress = SweepProgress(draw=False, verbose=True, color=False, stream=stream)
    with progress.shown():
        _sweep(progress)
    assert stream.getvalue().splitlines() == ["b #1 docs_gap (check_failed)", "a #1 passed (check_passed)"]
    # The board followed every event all the same.
    assert [line.step for line in progress.board.lines()] == ["passed", "docs_gap"]


def test_without_verbose_nothing_is_said_per_run() -> None:
    stream = io.StringIO()
    progress = SweepProgress(draw=False, verbose=False, color=False, stream=stream)
    with progress.shown():
        _sweep(progress)
    assert stream.getvalue() == ""


def test_a_verbose_line_is_coloured_only_when_colour_is_on() -> None:
    stream = io.StringIO()
    progress = SweepProgress(draw=False, verbose=True, color=True, stream=stream)
    progress.update("b", 1, RunFinished(classification="docs_gap", reason="check_failed"))
    assert stream.getvalue() == "\x1b[31mb #1 docs_gap (check_failed)\x1b[0m\n"
    assert finished_line("b", 1, RunFinished(classification="docs_gap", reason="check_failed")) \
        == "b #1 docs_gap (check_failed)"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_board_is_drawn_on_a_terminal_unless_quiet() -> None:
    assert sweep_progress(RunRequest(), _Terminal()).draw is True
    assert sweep_progress(RunRequest(quiet=True), _Terminal()).draw is False
    assert sweep_progress(RunRequest(), io.StringIO()).draw is False
    # --color always colours what is said, but draws no board off a terminal.
    assert sweep_progress(RunRequest(color="always"), io.StringIO()).draw is False


def test_a_drawn_board_takes_the_verbose_lines_above_it() -> None:
    terminal = _Terminal()
    progress = SweepProgress(draw=True, verbose=True, color=False, stream=terminal)
    with progress.shown():
        _sweep(progress)
    text = terminal.getvalue()
    assert "b #1 docs_gap (check_failed)\n" in text and "a #1 passed (check_passed)\n" in text
    assert "a #1  00:" in text  # the board itself, drawn on the same stream


def test_quiet_and_verbose_together_are_refused_before_anything_runs() -> None:
    with pytest.raises(UsageError, match="-q/--quiet and -v/--verbose"):
        _check_paths(RunRequest(quiet=True, verbose=True, out="results"))
