"""bench/run's ``limit``: an absolute bound on a figure, judged in the figure's direction."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.fast

RUN = Path(__file__).resolve().parents[2] / "bench" / "run"


def load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("bench_run_limit", str(RUN))
    spec = importlib.util.spec_from_loader("bench_run_limit", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_a_figure_over_its_limit_fails_the_module() -> None:
    lines, rows, ok = load().report("m", {
        "overhead": {"value": 1.4, "unit": "s", "better": "lower", "limit": 1.0}})
    assert not ok
    assert rows[0]["limit"] == {"value": 1.0, "met": False}
    assert "[limit <= 1 s: MISSED]" in lines[1]


def test_a_figure_within_its_limit_passes_and_higher_is_better_flips_it() -> None:
    run = load()
    _, rows, ok = run.report("m", {"overhead": {"value": -0.2, "unit": "s", "limit": 1.0}})
    assert ok and rows[0]["limit"]["met"]
    _, _, ok = run.report("m", {"rate": {"value": 5.0, "unit": "runs/min", "better": "higher",
                                         "limit": 6.0}})
    assert not ok


def test_the_sweep_benchmark_is_wired_in() -> None:
    assert "bench_sweep" in load().MODULES
    assert (RUN.parent / "bench_sweep.py").is_file()
