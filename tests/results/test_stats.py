"""Statistics against published values, never against this code's own output.

Sources:
- Wilson score intervals: R. G. Newcombe, "Two-sided confidence intervals for
  the single proportion: comparison of seven methods", Statistics in Medicine
  17:857-872 (1998), Table II, method 3 (score, no continuity correction),
  the four worked examples 81/263, 15/148, 0/20 and 1/29, to 4 decimals.
- Fisher exact test: R's ``?fisher.test`` examples. Agresti's tea drinker
  (TeaTasting = [[3, 1], [1, 3]]): one-sided "greater" p = 0.2429 as printed
  there; its two-sided p is 34/70 (Fisher, The Design of Experiments, 1935:
  of the 70 ways to pick 4 cups of 8, 1 + 16 are at least as extreme on each
  side). Fisher's twin convictions (Convictions = matrix(c(2, 10, 15, 3), 2),
  i.e. [[2, 15], [10, 3]]): R prints p-value = 0.0004652 for "less" and
  p-value = 0.0005367 two-sided.
"""

from __future__ import annotations

import math

import pytest

from firstrun.results.model import Classification, RunRecord
from firstrun.results.stats import (
    ComparisonVerdict,
    compare,
    fisher_p,
    min_p_value,
    pass_rate,
    pass_rates,
    smallest_sample,
    wilson_interval,
)

NEWCOMBE_1998_WILSON = [
    # successes, trials, lower, upper
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0000, 0.1611),
    (1, 29, 0.0061, 0.1718),
]


@pytest.mark.parametrize(("k", "n", "low", "high"), NEWCOMBE_1998_WILSON)
def test_wilson_interval_matches_newcombe_1998(k: int, n: int, low: float, high: float) -> None:
    ci = wilson_interval(k, n)
    assert ci is not None
    assert round(ci.low, 4) == low
    assert round(ci.high, 4) == high
    assert ci.confidence == 0.95


def test_wilson_interval_of_no_trials_is_none_and_bad_counts_are_refused() -> None:
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
    with pytest.raises(ValueError):
        wilson_interval(-1, 2)


def test_fisher_tea_tasting_two_sided_is_34_over_70() -> None:
    assert fisher_p(3, 1, 1, 3) == pytest.approx(34 / 70, rel=1e-12)


def test_fisher_convictions_matches_r() -> None:
    assert round(fisher_p(2, 15, 10, 3), 7) == 0.0005367


def test_smallest_possible_p_is_the_separated_table() -> None:
    # Equal sides: both separated tables count, 2 / C(2n, n) (n=3: 2/20, n=4: 2/70).
    assert min_p_value(3, 3) == pytest.approx(2 / math.comb(6, 3), rel=1e-12)
    assert min_p_value(4, 4) == pytest.approx(2 / math.comb(8, 4), rel=1e-12)
    # Unequal sides: only one table is that extreme, 1 / C(N, n1).
    assert min_p_value(2, 5) == pytest.approx(1 / math.comb(7, 2), rel=1e-12)
    with pytest.raises(ValueError):
        min_p_value(0, 4)


def test_min_p_value_is_no_larger_than_any_tables_p() -> None:
    # Exhaustive over every outcome of small samples: the claim in min_p_value's docstring.
    for n1 in range(1, 7):
        for n2 in range(1, 7):
            floor = min_p_value(n1, n2)
            every = [fisher_p(a, n1 - a, c, n2 - c) for a in range(n1 + 1) for c in range(n2 + 1)]
            assert min(every) == pytest.approx(floor, rel=1e-9)


@pytest.mark.parametrize(("alpha", "n"), [(0.05, 4), (0.01, 5), (0.2, 3)])
def test_smallest_sample_per_side(alpha: float, n: int) -> None:
    # 2/C(2n, n): n=2 gives 1/3, n=3 gives 0.1, n=4 gives 0.0286, n=5 gives 0.0079.
    assert smallest_sample(alpha) == n


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 2.0])
def test_smallest_sample_refuses_an_alpha_outside_0_1(alpha: float) -> None:
    with pytest.raises(ValueError):
        smallest_sample(alpha)


def _runs(task: str, passed: int, gaps: int, **others: int) -> list[RunRecord]:
    kinds = ([Classification.PASSED] * passed + [Classification.DOCS_GAP] * gaps
             + [Classification(k) for k, n in others.items() for _ in range(n)])
    return [
        RunRecord(task=task, task_file=f"{task}.yaml", task_sha256="a" * 64, attempt=i + 1,
                  agent="replay", model=None, classification=c, reason="r", backend="linux",
                  enforcement="enforced", policy_hash=None)
        for i, c in enumerate(kinds)
    ]


def test_pass_rate_counts_only_evidence_and_shows_the_rest_apart() -> None:
    rate = pass_rate(_runs("t", 81, 182, infra_error=5, budget_exhausted=2), task="t")
    assert (rate.passed, rate.docs_gap, rate.evidential, rate.runs) == (81, 182, 263, 270)
    assert rate.not_evidential == {Classification.INFRA_ERROR: 5, Classification.BUDGET_EXHAUSTED: 2}
    assert rate.rate == pytest.approx(81 / 263)
    assert rate.interval is not None and round(rate.interval.low, 4) == 0.2553
    assert rate.text() == "81/263 passed (31%, 95% CI 26%-37%)"


def test_no_evidence_is_said_never_zero_percent() -> None:
    rate = pass_rate(_runs("t", 0, 0, infra_error=3), task="t")
    assert rate.rate is None and rate.interval is None
    assert rate.text() == "no evidence"
    assert "0%" not in rate.text()
    # Evidence that every run failed is a real 0%, with an interval.
    failed = pass_rate(_runs("t", 0, 20), task="t")
    assert failed.rate == 0.0 and failed.interval is not None and round(failed.interval.high, 4) == 0.1611


def test_pass_rates_per_task_in_first_seen_order() -> None:
    rates = pass_rates([*_runs("b", 1, 0), *_runs("a", 0, 1), *_runs("b", 0, 1)])
    assert [(r.task, r.passed, r.docs_gap) for r in rates] == [("b", 1, 1), ("a", 0, 1)]


def test_compare_reports_a_regression_with_the_fisher_p() -> None:
    # Convictions as a sweep: 10/13 before, 2/17 after.
    result = compare(_runs("t", 10, 3), _runs("t", 2, 15))
    (t,) = result.tasks
    assert t.verdict is ComparisonVerdict.REGRESSED
    assert t.p_value is not None and round(t.p_value, 7) == 0.0005367
    assert result.regressions == (t,)
    improved = compare(_runs("t", 2, 15), _runs("t", 10, 3)).tasks[0]
    assert improved.verdict is ComparisonVerdict.IMPROVED


def test_compare_no_significant_change_keeps_the_p() -> None:
    (t,) = compare(_runs("t", 3, 1), _runs("t", 1, 3)).tasks
    assert t.verdict is ComparisonVerdict.NO_SIGNIFICANT_CHANGE
    assert t.p_value == pytest.approx(34 / 70)


def test_compare_too_small_reports_no_p_and_the_sample_that_could() -> None:
    # 3 runs each, all passed before and all failed after: p = 0.1 at best.
    result = compare(_runs("t", 3, 0), _runs("t", 0, 3))
    (t,) = result.tasks
    assert t.verdict is ComparisonVerdict.TOO_SMALL and t.p_value is None
    assert result.smallest_sample == 4
    # Non-evidential runs do not make a sample bigger.
    (t,) = compare(_runs("t", 3, 0, infra_error=9), _runs("t", 0, 3, skipped=9)).tasks
    assert t.verdict is ComparisonVerdict.TOO_SMALL
    # Four per side can: 4/4 -> 0/4 is significant at 0.05.
    (t,) = compare(_runs("t", 4, 0), _runs("t", 0, 4)).tasks
    assert t.verdict is ComparisonVerdict.REGRESSED and t.p_value == pytest.approx(2 / 70)


def test_compare_one_sided_tasks_and_missing_evidence() -> None:
    result = compare([*_runs("old", 5, 0), *_runs("both", 0, 0, infra_error=2)],
                     [*_runs("both", 5, 0), *_runs("new", 1, 1)])
    verdicts = {t.task: t.verdict for t in result.tasks}
    assert verdicts == {"old": ComparisonVerdict.ONLY_BEFORE, "both": ComparisonVerdict.NO_EVIDENCE, "new": ComparisonVerdict.ONLY_AFTER}
    assert [t.task for t in result.tasks] == ["old", "both", "new"]
    assert result.tested == 0
