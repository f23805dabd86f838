"""How well a task's check is proven: its mutants, judged from saved runs alone.

Guarantee: ``mutation_scores`` is a pure function of saved ``RunRecord``s. A
mutant is ``killed`` when its run is a docs gap (the check failed, or a step
did), ``survived`` when it passed anyway, and ``not_run`` otherwise, with the
run's own reason: a mutant that produced no evidence never counts either way.
A task's score is killed / (killed + survived), None when nothing was judged;
a task whose unmutated run did not pass has no mutants, and says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from firstrun.results.model import Classification, RunRecord


class Verdict(StrEnum):
    KILLED = "killed"
    SURVIVED = "survived"
    NOT_RUN = "not_run"


@dataclass(frozen=True, kw_only=True)
class MutantOutcome:
    name: str
    mutation: dict[str, Any]
    verdict: Verdict
    reason: str

    def describe(self) -> str:
        """Which change: the step, where the docs show it, and the pin when there is one."""
        m = self.mutation
        change = "removed" if m.get("pin") is None else f"with {m['pin'][0]} made {m['pin'][1]}"
        return f"step {m.get('step')} ({m.get('where')}) {change}"

    def to_data(self) -> dict[str, Any]:
        return {"name": self.name, "verdict": self.verdict.value, "reason": self.reason,
                "mutation": self.mutation}


@dataclass(frozen=True, kw_only=True)
class TaskScore:
    task: str
    baseline: str | None
    mutants: tuple[MutantOutcome, ...]
    why_none: str = ""

    def count(self, verdict: Verdict) -> int:
        return sum(1 for m in self.mutants if m.verdict is verdict)

    @property
    def score(self) -> float | None:
        judged = self.count(Verdict.KILLED) + self.count(Verdict.SURVIVED)
        return self.count(Verdict.KILLED) / judged if judged else None

    def score_text(self) -> str:
        killed, survived = self.count(Verdict.KILLED), self.count(Verdict.SURVIVED)
        if self.score is None:
            return "no score"
        return f"{killed}/{killed + survived} killed ({self.score:.0%})"

    def to_data(self) -> dict[str, Any]:
        return {"task": self.task, "baseline": self.baseline, "score": self.score,
                "killed": self.count(Verdict.KILLED), "survived": self.count(Verdict.SURVIVED),
                "not_run": self.count(Verdict.NOT_RUN), "why_none": self.why_none or None,
                "mutants": [m.to_data() for m in self.mutants]}


def is_mutant(record: RunRecord) -> bool:
    """A ``firstrun mutate`` run: it judges the task's check, never the docs."""
    return "mutation" in record.extra


def verdict(record: RunRecord) -> tuple[Verdict, str]:
    """A mutant's verdict from its run, and the run's own words for it."""
    said = f"{record.classification.value} ({record.reason})" + (f": {record.detail}" if record.detail else "")
    if record.classification is Classification.DOCS_GAP:
        return Verdict.KILLED, said
    if record.classification is Classification.PASSED:
        return Verdict.SURVIVED, "the check passed anyway: the step is not needed, or the check does " \
            "not verify its effect"
    return Verdict.NOT_RUN, said


def mutation_scores(records: Sequence[RunRecord], tasks: Iterable[str] = ()) -> list[TaskScore]:
    """A score for each task mutated in ``records``, and for each of ``tasks`` besides."""
    bases = {r.task: r for r in records if not is_mutant(r) and r.attempt == 1}
    names = list(dict.fromkeys([*tasks, *(str(r.extra["mutation"]["of"]) for r in records
                                          if is_mutant(r))]))
    scores = []
    for name in names:
        base = bases.get(name)
        mutants = tuple(MutantOutcome(name=r.task, mutation=r.extra["mutation"], verdict=v, reason=why)
                        for r in records if r.extra.get("mutation", {}).get("of") == name
                        for v, why in [verdict(r)])
        why_none = ""
        if base is None:
            why_none = "the unmutated task has not run"
        elif base.classification is not Classification.PASSED:
            why_none = (f"the unmutated task did not pass ({base.classification.value}, {base.reason}), "
                        "so no mutant could show anything")
        scores.append(TaskScore(task=name, baseline=None if base is None else base.classification.value,
                                mutants=tuple(sorted(mutants, key=_order)), why_none=why_none))
    return scores


def _order(mutant: MutantOutcome) -> tuple[int, int, str]:
    m = mutant.mutation
    return (int(m.get("step") or 0), 0 if m.get("pin") is None else 1, mutant.name)
