"""Statistics over saved runs: pass rates with Wilson intervals, and Fisher comparisons.

Guarantee: a pass rate is taken over evidential runs only (``passed`` and
``docs_gap``), with a Wilson score interval; with no evidential run the rate and
its interval are ``None``, never 0%, which would claim every documented route
failed. Two sweeps compare by a two-sided Fisher exact test per task, refused
when the samples are too small for any outcome to reach significance, naming
the smallest sample per side that could. The numbers are scipy's definitions.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from statistics import NormalDist

from firstrun.results.model import EVIDENTIAL, Classification, RunRecord

# Standard-library implementations of scipy's definitions, the interval of
# ``binomtest(...).proportion_ci(method="wilson")`` and the two-sided p of
# ``fisher_exact``, checked in the tests against scipy and against published
# values; the Fisher p is summed in exact integer arithmetic and rounded once.
CONFIDENCE = 0.95
ALPHA = 0.05
ALL_TASKS = "all tasks"

# fisher_exact's relative tolerance, the very float scipy multiplies by: a
# table within it of the observed one's probability counts as no more likely.
# In exact integers a true tie needs none; it is kept so that a table scipy
# counts through it is counted here too (none was found among tables of up to
# 40 per cell, where the two agree to 1e-15).
_FISHER_GAMMA = Fraction(1 + 1e-14)


@dataclass(frozen=True, kw_only=True)
class Interval:
    """A confidence interval for a proportion, both ends in [0, 1]."""

    low: float
    high: float
    confidence: float = CONFIDENCE


def wilson_interval(successes: int, trials: int, *, confidence: float = CONFIDENCE) -> Interval | None:
    """The Wilson score interval for ``successes`` of ``trials``; None for no trials."""
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be within 0..trials, got {successes} of {trials}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    if trials == 0:
        return None
    # Newcombe's method 3 (no continuity correction) in scipy's terms and
    # order, so both round alike; an end is set to exactly 0 (or 1) when no
    # trial passed (or every one did), where the formula lands only near it.
    z = NormalDist().inv_cdf(0.5 + 0.5 * confidence)
    p = successes / trials
    q = 1 - p
    denom = 2 * (trials + z**2)
    center = (2 * trials * p + z**2) / denom
    delta = z / denom * math.sqrt(4 * trials * p * q + z**2)
    low = 0.0 if successes == 0 else center - delta
    high = 1.0 if successes == trials else center + delta
    return Interval(low=low, high=high, confidence=confidence)


@dataclass(frozen=True, kw_only=True)
class PassRate:
    """The runs of one task (or of all tasks): evidence, its rate, and what could not judge."""

    task: str
    passed: int
    docs_gap: int
    not_evidential: Mapping[Classification, int]
    interval: Interval | None

    @property
    def evidential(self) -> int:
        return self.passed + self.docs_gap

    @property
    def not_evidential_runs(self) -> int:
        return sum(self.not_evidential.values())

    @property
    def runs(self) -> int:
        return self.evidential + self.not_evidential_runs

    @property
    def rate(self) -> float | None:
        """Passed over evidential runs; None when no run produced evidence."""
        return self.passed / self.evidential if self.evidential else None

    def text(self) -> str:
        """``3/4 passed (75%, 95% CI 30-95%)``, or ``no evidence`` in words."""
        if self.rate is None or self.interval is None:
            return "no evidence"
        ci = self.interval
        return (f"{self.passed}/{self.evidential} passed ({self.rate:.0%}, "
                f"{ci.confidence:.0%} CI {ci.low:.0%}-{ci.high:.0%})")


def pass_rate(records: Iterable[RunRecord], *, task: str = ALL_TASKS,
              confidence: float = CONFIDENCE) -> PassRate:
    """The pass rate of ``records`` taken together."""
    counts: Counter[Classification] = Counter(r.classification for r in records)
    passed = counts.pop(Classification.PASSED, 0)
    docs_gap = counts.pop(Classification.DOCS_GAP, 0)
    return PassRate(
        task=task,
        passed=passed,
        docs_gap=docs_gap,
        not_evidential={c: n for c, n in counts.items() if n and c not in EVIDENTIAL},
        interval=wilson_interval(passed, passed + docs_gap, confidence=confidence),
    )


def by_task(records: Iterable[RunRecord]) -> dict[str, list[RunRecord]]:
    """Records grouped by task, tasks in the order they first appear."""
    grouped: dict[str, list[RunRecord]] = {}
    for record in records:
        grouped.setdefault(record.task, []).append(record)
    return grouped


def pass_rates(records: Sequence[RunRecord], *, confidence: float = CONFIDENCE) -> list[PassRate]:
    """One pass rate per task, in the order tasks first appear."""
    return [pass_rate(runs, task=task, confidence=confidence) for task, runs in by_task(records).items()]


def fisher_p(before_passed: int, before_failed: int, after_passed: int, after_failed: int) -> float:
    """The two-sided Fisher exact p-value of the 2x2 table (rows: before, after).

    With the margins fixed, the top-left cell x has the hypergeometric
    weight C(n1, x) * C(n2, m - x) (n1, n2 the row totals, m the first
    column's); p is the summed weight of every table no more likely than the
    observed one, over the sum of all, C(n1 + n2, m).
    """
    if min(before_passed, before_failed, after_passed, after_failed) < 0:
        raise ValueError("a table's counts must be nonnegative, got "
                         f"{[before_passed, before_failed, after_passed, after_failed]}")
    n1, n2 = before_passed + before_failed, after_passed + after_failed
    m = before_passed + after_passed
    lowest = max(0, m - n2)
    weights = [math.comb(n1, lowest) * math.comb(n2, m - lowest)]
    # Each weight from the one before by the ratio of neighbouring binomials:
    # the division is exact, and it keeps long tables fast where a fresh
    # C(n1, x) per cell costs seconds at a few thousand runs a side.
    for x in range(lowest, min(n1, m)):
        weights.append(weights[-1] * (n1 - x) * (m - x) // ((x + 1) * (n2 - m + x + 1)))
    bound = weights[before_passed - lowest] * _FISHER_GAMMA
    return float(Fraction(sum(w for w in weights if w <= bound), math.comb(n1 + n2, m)))


def min_p_value(n_before: int, n_after: int) -> float:
    """The smallest two-sided Fisher p any outcome of these sample sizes can reach.

    With the rows fixed at ``n_before`` and ``n_after``, a table's point
    probability is C(m, a) * C(N - m, b) times that of the perfectly
    separated table (all of one side passed, all of the other failed), where
    m is its column total and a, b its top row. That factor is an integer of
    at least 1, so no table is less likely than the separated one, and no
    two-sided p is smaller than the separated table's.
    """
    if n_before < 1 or n_after < 1:
        raise ValueError(f"both samples need at least one run, got {n_before} and {n_after}")
    return fisher_p(n_before, 0, 0, n_after)


def smallest_sample(alpha: float) -> int:
    """The smallest n such that n evidential runs per side can reach p < ``alpha``."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be within (0, 1), got {alpha}")
    n = 1
    while not min_p_value(n, n) < alpha:
        n += 1
    return n


class ComparisonVerdict(StrEnum):
    """What a comparison of one task can say; a closed set, keyed on by CI."""

    REGRESSED = "regressed"
    IMPROVED = "improved"
    NO_SIGNIFICANT_CHANGE = "no_significant_change"
    TOO_SMALL = "too_small"
    NO_EVIDENCE = "no_evidence"
    ONLY_BEFORE = "only_before"
    ONLY_AFTER = "only_after"


@dataclass(frozen=True, kw_only=True)
class TaskComparison:
    """One task, before and after. ``p_value`` is set only when a test was reported."""

    task: str
    before: PassRate | None
    after: PassRate | None
    verdict: ComparisonVerdict
    p_value: float | None = None
    task_changed: bool = False


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Every task of two sweeps, compared at ``alpha``."""

    alpha: float
    smallest_sample: int
    tasks: tuple[TaskComparison, ...]

    @property
    def regressions(self) -> tuple[TaskComparison, ...]:
        return tuple(t for t in self.tasks if t.verdict is ComparisonVerdict.REGRESSED)

    @property
    def tested(self) -> int:
        """Tasks for which a test result was reported (significant or not)."""
        return sum(1 for t in self.tasks if t.p_value is not None)


def compare(before: Sequence[RunRecord], after: Sequence[RunRecord], *, alpha: float = ALPHA,
            confidence: float = CONFIDENCE) -> Comparison:
    """Compare two sweeps task by task (tasks in BEFORE's order, then AFTER-only ones)."""
    needed = smallest_sample(alpha)
    old, new = by_task(before), by_task(after)
    tasks = []
    for task in [*old, *(t for t in new if t not in old)]:
        b = pass_rate(old[task], task=task, confidence=confidence) if task in old else None
        a = pass_rate(new[task], task=task, confidence=confidence) if task in new else None
        changed = (b is not None and a is not None
                   and {r.task_sha256 for r in old[task]} != {r.task_sha256 for r in new[task]})
        tasks.append(_compare_task(task, b, a, alpha=alpha, changed=changed))
    return Comparison(alpha=alpha, smallest_sample=needed, tasks=tuple(tasks))


def _compare_task(task: str, before: PassRate | None, after: PassRate | None, *,
                  alpha: float, changed: bool) -> TaskComparison:
    def verdict(v: ComparisonVerdict, p: float | None = None) -> TaskComparison:
        return TaskComparison(task=task, before=before, after=after, verdict=v, p_value=p,
                              task_changed=changed)

    if after is None:
        return verdict(ComparisonVerdict.ONLY_BEFORE)
    if before is None:
        return verdict(ComparisonVerdict.ONLY_AFTER)
    if not before.evidential or not after.evidential:
        return verdict(ComparisonVerdict.NO_EVIDENCE)
    if not min_p_value(before.evidential, after.evidential) < alpha:
        return verdict(ComparisonVerdict.TOO_SMALL)
    p = fisher_p(before.passed, before.docs_gap, after.passed, after.docs_gap)
    if not p < alpha:
        return verdict(ComparisonVerdict.NO_SIGNIFICANT_CHANGE, p)
    # Cross-multiplied, so the direction is decided on whole numbers.
    dropped = after.passed * before.evidential < before.passed * after.evidential
    return verdict(ComparisonVerdict.REGRESSED if dropped else ComparisonVerdict.IMPROVED, p)
