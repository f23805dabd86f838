"""bench/run: ratios against same-run baselines, and bars judged in the right direction."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

RUN = Path(__file__).resolve().parents[2] / "bench" / "run"


def load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("bench_run", str(RUN))
    spec = importlib.util.spec_from_loader("bench_run", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_lower_is_better_bar_uses_the_first_baseline() -> None:
    lines, rows, ok = load().report("m", {
        "bare": {"value": 1.0, "unit": "ms", "better": "lower"},
        "bwrap": {"value": 4.0, "unit": "ms", "better": "lower"},
        "ours": {"value": 5.0, "unit": "ms", "better": "lower",
                 "baseline": ["bwrap", "bare"], "bar": 1.5},
    })
    ours = rows[2]
    assert ours["ratios"] == {"bwrap": 1.25, "bare": 5.0}
    assert ours["bar"] == {"ratio": 1.5, "met": True}
    assert ok
    assert "[bar <= 1.50x: met]" in lines[3]


def test_higher_is_better_bar_can_be_missed() -> None:
    lines, rows, ok = load().report("m", {
        "direct": {"value": 100.0, "unit": "MB/s", "better": "higher"},
        "proxied": {"value": 50.0, "unit": "MB/s", "better": "higher",
                    "baseline": "direct", "bar": 0.7},
    })
    assert rows[1]["bar"] == {"ratio": 0.7, "met": False}
    assert not ok
    assert "MISSED" in lines[2]


def test_a_missing_baseline_fails_rather_than_printing_no_ratio() -> None:
    _, _, ok = load().report("m", {"x": {"value": 1.0, "unit": "ms", "baseline": "absent"}})
    assert not ok


def test_an_unknown_module_is_refused_before_any_bench_runs(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    run = load()
    monkeypatch.setattr("sys.argv", ["bench/run", "bench_squid", "bench_nonesuch"])
    monkeypatch.setattr(run, "_load", lambda name: pytest.fail(f"{name} ran"))
    with pytest.raises(SystemExit) as exit_:
        run.main()
    assert exit_.value.code == 2
    assert "unknown module bench_nonesuch" in capsys.readouterr().err


def test_named_modules_run_alone_in_the_usual_order(monkeypatch: pytest.MonkeyPatch) -> None:
    run = load()
    ran: list[str] = []

    def fake(name: str) -> ModuleType:
        ran.append(name)
        module = ModuleType(name)
        module.main = lambda: {"x": {"value": 1.0, "unit": "ms"}}  # type: ignore[attr-defined]
        return module

    monkeypatch.setattr("sys.argv", ["bench/run", "bench_intercept", "bench_proxy"])
    monkeypatch.setattr(run, "_load", fake)
    assert run.main() == 0
    assert ran == ["bench_proxy", "bench_intercept"]
