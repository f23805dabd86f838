"""The statistics agree with scipy's, the definitions they implement.

scipy is the reference here and only here (a test dependency): the Wilson
interval of ``binomtest(k, n).proportion_ci(method="wilson")`` and the
two-sided p of ``fisher_exact``, over every count a sweep of up to 200 runs
can give, at any confidence level. The published values they both must
reproduce are in test_stats.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest, fisher_exact

from firstrun.results.stats import fisher_p, wilson_interval

# Both sides round differently (ndtri against NormalDist, floats against exact
# integers), and by less than 1e-15 on these counts; 1e-12 leaves room for
# that and none for a different definition.
TOLERANCE = 1e-12

COUNTS = st.integers(min_value=1, max_value=200).flatmap(
    lambda n: st.tuples(st.integers(min_value=0, max_value=n), st.just(n)))
LEVELS = st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99, 0.999]) | st.floats(min_value=1e-6, max_value=1 - 1e-9)
CELLS = st.integers(min_value=0, max_value=60)


@settings(max_examples=500)
@given(COUNTS, LEVELS)
def test_wilson_interval_is_scipys(counts: tuple[int, int], confidence: float) -> None:
    k, n = counts
    ours = wilson_interval(k, n, confidence=confidence)
    theirs = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    assert ours is not None
    assert ours.low == pytest.approx(float(theirs.low), rel=0, abs=TOLERANCE)
    assert ours.high == pytest.approx(float(theirs.high), rel=0, abs=TOLERANCE)
    assert 0.0 <= ours.low <= ours.high <= 1.0
    # Where scipy sets an end outright, it is that end exactly.
    assert (ours.low == 0.0) == (k == 0) and (ours.high == 1.0) == (k == n)


@settings(max_examples=500)
@given(CELLS, CELLS, CELLS, CELLS)
def test_fisher_p_is_scipys(a: int, b: int, c: int, d: int) -> None:
    theirs = float(fisher_exact([[a, b], [c, d]], alternative="two-sided").pvalue)
    assert fisher_p(a, b, c, d) == pytest.approx(theirs, rel=TOLERANCE, abs=0)


@settings(max_examples=300)
@given(CELLS, CELLS)
def test_fisher_p_counts_the_mirror_table_as_scipy_does(a: int, b: int) -> None:
    # [[a, b], [b, a]] and [[b, a], [a, b]] are exactly as likely: in exact
    # integers both count without any tolerance, and scipy's floats, which
    # may round them apart, count both through its tolerance; the two agree.
    theirs = float(fisher_exact([[a, b], [b, a]], alternative="two-sided").pvalue)
    assert fisher_p(a, b, b, a) == pytest.approx(theirs, rel=TOLERANCE, abs=0)
    assert fisher_p(a, b, b, a) == fisher_p(b, a, a, b)


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.5, 1.5])
def test_a_confidence_outside_0_1_is_refused(confidence: float) -> None:
    with pytest.raises(ValueError):
        wilson_interval(1, 2, confidence=confidence)


def test_a_negative_count_is_refused_as_scipy_refuses_it() -> None:
    with pytest.raises(ValueError):
        fisher_exact([[1, -1], [2, 3]])
    with pytest.raises(ValueError):
        fisher_p(1, -1, 2, 3)
