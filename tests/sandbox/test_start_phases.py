"""A session's start is profiled phase by phase, in order, by the backend that made it."""

from __future__ import annotations

import pytest

from firstrun.sandbox.base import StartPhases
from firstrun.sandbox.linux.backend import LinuxSession


def test_each_phase_lasts_from_the_end_of_the_one_before(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([10.0, 10.5, 10.75, 12.0])
    monkeypatch.setattr("firstrun.sandbox.base.time.monotonic", lambda: next(clock))
    phases = StartPhases()
    for phase in ("staged", "ready", "attested"):
        phases.mark(phase)
    assert phases.ends == {"staged": 0.5, "ready": 0.75, "attested": 2.0}
    assert phases.durations() == {"staged": 0.5, "ready": 0.25, "attested": 1.25}


def test_a_linux_session_says_where_its_start_went(session: LinuxSession) -> None:
    assert session.start_phases is not None
    ends = session.start_phases.ends
    assert list(ends) == ["seccomp_compiled", "staged", "launched", "ready", "attested"]
    assert list(ends.values()) == sorted(ends.values())
