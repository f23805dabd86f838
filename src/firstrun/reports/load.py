"""Saved results as reports read them: a results directory, or its ``results.json``.

Guarantee: a target is accepted only if it is a results document this version
reads and every run in it parses as a ``RunRecord``; anything else is one
``UsageError`` line naming the argument and the file, never a traceback nor a
report from half a file. No trace path leading outside the results directory is
read, so a results file someone else wrote embeds no other file of this machine.
A run whose trace is missing or unreadable is a marked gap (``findings.Gap``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from firstrun.errors import UsageError, one_line
from firstrun.reports.findings import Gap, RunTrace
from firstrun.reports.suggestions import FILE, Key, Suggestion, SuggestionsError, parse_suggestions
from firstrun.results.arms import read_arms
from firstrun.results.model import RunRecord
from firstrun.results.mutation import is_mutant
from firstrun.results.store import RESULTS_FILE, load_results
from firstrun.run.events import read_trace


@dataclass(frozen=True, kw_only=True)
class SavedResults:
    """One sweep's saved runs; ``root`` is the directory its trace paths are relative to."""

    root: Path
    path: Path
    meta: Mapping[str, Any]
    records: tuple[RunRecord, ...]
    # The arm's name when this is one arm of a sweep of several.
    arm: str | None = None

    @property
    def docs_records(self) -> tuple[RunRecord, ...]:
        """The runs that judge the docs: all but a mutant's, which judges the task's check."""
        return tuple(r for r in self.records if not is_mutant(r))

    def trace_path(self, record: RunRecord) -> Path | None:
        """The run's trace inside ``root``; None when it has none or it points outside."""
        if not record.trace:
            return None
        root = self.root.resolve()
        path = (root / record.trace).resolve()
        return path if path.is_relative_to(root) else None


def load_saved(target: str | os.PathLike[str], *, label: str) -> SavedResults:
    """Read a results directory (holding ``results.json``) or a ``results.json`` itself.

    ``label`` names the argument in errors (``BEFORE``, ``RESULTS_DIR``).
    """
    given = Path(target)
    path = given / RESULTS_FILE if given.is_dir() else given
    arms = read_arms(given, label=label) if given.is_dir() and not path.exists() else None
    if arms:
        raise UsageError(f"{label}: {given} holds a sweep of several arms "
                         f"({', '.join(a.name for a in arms)}): give one arm's directory, "
                         f"{given / arms[0].name}")
    if not path.is_file():
        where = f"{given} holds no {RESULTS_FILE}" if given.is_dir() else f"{given}: no such file or directory"
        raise UsageError(f"{label}: {where} (give a results directory or its {RESULTS_FILE})")
    try:
        document = load_results(path)
    except UsageError as exc:
        raise UsageError(f"{label}: {exc.args[0]}") from None
    records = []
    for i, run in enumerate(document["runs"], start=1):
        try:
            records.append(RunRecord.from_data(run))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{label}: {path}: run {i} is not a run record ({type(exc).__name__}: {exc})") from None
    meta = document.get("meta")
    return SavedResults(root=path.parent, path=path, meta=meta if isinstance(meta, dict) else {},
                        records=tuple(records))


def load_sweep(target: str | os.PathLike[str], *, label: str) -> tuple[SavedResults, ...]:
    """A sweep's saved results: each arm's, in the order they ran, when ``target`` holds a
    sweep of several arms; else the one ``load_saved`` reads."""
    given = Path(target)
    arms = read_arms(given, label=label) if given.is_dir() else None
    if not arms:
        return (load_saved(given, label=label),)
    return tuple(replace(load_saved(given / arm.name, label=label), arm=arm.name) for arm in arms)


def read_runs(saved: SavedResults) -> tuple[RunTrace, ...]:
    """Every run with its trace's events, for findings; a trace that cannot be read is a gap.

    A mutant's run is left out: its docs were broken on purpose.
    """
    runs = []
    for record in saved.docs_records:
        path = saved.trace_path(record)
        events, gap = None, None
        if path is None:
            gap = Gap.NO_TRACE if not record.trace else Gap.UNREADABLE
        elif not path.is_file():
            # Checked before opening: a FIFO would block the read forever.
            gap = Gap.UNREADABLE if path.exists() else Gap.NO_TRACE
        else:
            try:
                events = tuple(read_trace(path))
            except (OSError, UnicodeDecodeError):
                gap = Gap.UNREADABLE
        runs.append(RunTrace(record=record, events=events, gap=None if gap is None else gap.value))
    return tuple(runs)


def read_suggestions(saved: SavedResults) -> dict[Key, Suggestion]:
    """The drafts saved beside ``saved`` by ``findings --suggest``; none when there is no file."""
    # A malformed suggestions file is one UsageError line naming it.
    path = saved.root / FILE
    if not path.is_file():
        return {}
    try:
        return parse_suggestions(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        # SuggestionsError and JSONDecodeError are ValueErrors.
        why = exc.args[0] if isinstance(exc, SuggestionsError) else one_line(str(exc), 200)
        raise UsageError(f"RESULTS_DIR: {path}: {why} (delete it to draft again with --suggest)") from None
