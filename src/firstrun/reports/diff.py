"""``firstrun diff``'s output: a per-task comparison of two sweeps, as plain text.

Guarantee: a rendering of ``firstrun.results.stats.Comparison`` and nothing
more. A p-value is shown only where a test was reported; a task whose
samples are too small for any outcome to reach significance says so and
names the sample per side that could, instead of a number that would read
as "no change". Tasks present on one side only are listed, never dropped.
"""

from __future__ import annotations

from firstrun.results.stats import Comparison, ComparisonVerdict, PassRate, TaskComparison

HEADER = ("task", "before", "after", "change", "p (Fisher)", "verdict")


def _side(rate: PassRate | None) -> str:
    if rate is None:
        return "not run"
    if rate.rate is None:
        return f"no evidence ({rate.runs} run{'s' if rate.runs != 1 else ''})"
    return f"{rate.passed}/{rate.evidential} ({rate.rate:.0%})"


def _change(t: TaskComparison) -> str:
    if t.before is None or t.after is None or t.before.rate is None or t.after.rate is None:
        return ""
    points = round((t.after.rate - t.before.rate) * 100)
    return f"{points:+d} pts"


def verdict_text(t: TaskComparison, comparison: Comparison) -> str:
    texts = {
        ComparisonVerdict.REGRESSED: "REGRESSED",
        ComparisonVerdict.IMPROVED: "improved",
        ComparisonVerdict.NO_SIGNIFICANT_CHANGE: "no significant change",
        ComparisonVerdict.TOO_SMALL: f"too small to tell: needs {comparison.smallest_sample}+ evidential runs per side",
        ComparisonVerdict.ONLY_BEFORE: "only in BEFORE",
        ComparisonVerdict.ONLY_AFTER: "only in AFTER",
    }
    if t.verdict is ComparisonVerdict.NO_EVIDENCE:
        sides = [name for name, rate in (("BEFORE", t.before), ("AFTER", t.after))
                 if rate is not None and rate.rate is None]
        text = f"no evidence in {' and '.join(sides)}"
    else:
        text = texts[t.verdict]
    return text + (" (task file changed)" if t.task_changed else "")


def diff_rows(comparison: Comparison) -> list[tuple[str, ...]]:
    return [
        (t.task, _side(t.before), _side(t.after), _change(t),
         "" if t.p_value is None else f"{t.p_value:.4g}", verdict_text(t, comparison))
        for t in comparison.tasks
    ]


def diff_notes(comparison: Comparison) -> list[str]:
    a = f"{comparison.alpha:g}"
    n = comparison.smallest_sample
    tested = comparison.tested
    notes = [
        f"Two-sided Fisher exact test per task on passed vs docs_gap (evidential runs only), "
        f"significant when p < {a}; {tested} task{'s' if tested != 1 else ''} tested"
        + (", each on its own (no correction for testing several)." if tested > 1 else "."),
    ]
    if any(t.verdict is ComparisonVerdict.TOO_SMALL for t in comparison.tasks):
        notes.append(
            f"Too small to tell: with those sample sizes not even the most extreme outcome "
            f"(all passed on one side, all failed on the other) reaches p < {a}. The smallest sample "
            f"that can is {n} evidential runs per side ({n}/{n} against 0/{n})."
        )
    regressions = comparison.regressions
    notes.append(
        f"Significant regressions: {len(regressions)}"
        + (f" ({', '.join(t.task for t in regressions)})" if regressions else "")
    )
    return notes


def diff_lines(comparison: Comparison) -> list[str]:
    """The table as aligned plain-text lines, then the notes."""
    rows = diff_rows(comparison)
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]

    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    table = [fmt(HEADER), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)]
    if not rows:
        table = ["no run on either side"]
    return [*table, "", *diff_notes(comparison)]
