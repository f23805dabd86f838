"""What one finished run says, as saved data.

Guarantee: a ``RunRecord`` is the whole truth a report may use about a run;
reports, statistics and diffs read these records (through ``results.json``)
and never the live run. Classifications are a closed set and only ``passed``
and ``docs_gap`` are evidence about the documentation; everything else says
the run could not judge it, and is counted apart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Classification(StrEnum):
    PASSED = "passed"
    DOCS_GAP = "docs_gap"
    BUDGET_EXHAUSTED = "budget_exhausted"
    INFRA_ERROR = "infra_error"
    HARNESS_ERROR = "harness_error"
    AGENT_REFUSAL = "agent_refusal"
    SKIPPED = "skipped"


EVIDENTIAL = frozenset({Classification.PASSED, Classification.DOCS_GAP})


@dataclass(frozen=True, kw_only=True)
class PageRead:
    """One ``read_docs`` call as the run saw it (see ``firstrun.docs.Page.to_record``)."""

    url_requested: str
    url_final: str | None
    status: int | None
    error: str | None
    bytes: int
    sha256: str | None
    from_cache: bool = False


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One attempt at one task. ``reason`` is a stable snake_case key, like egress reasons."""

    task: str
    task_file: str
    task_sha256: str
    attempt: int
    agent: str
    model: str | None
    classification: Classification
    reason: str
    backend: str | None
    enforcement: str | None
    policy_hash: str | None
    attestation: tuple[dict[str, Any], ...] = ()
    layers: tuple[dict[str, Any], ...] = ()
    pages: tuple[PageRead, ...] = ()
    # The task's documented route as it was when the run started, so a report
    # can set the pages read against it from saved data alone.
    docs_route: tuple[str, ...] = ()
    last_page_before_failure: str | None = None
    route_findings: tuple[dict[str, Any], ...] = ()
    blocked_egress: tuple[dict[str, Any], ...] = ()
    check_exit: int | None = None
    check_output: str = ""
    commands: int = 0
    started_at: str = ""
    duration_s: float = 0.0
    trace: str = ""
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def evidential(self) -> bool:
        return self.classification in EVIDENTIAL

    def to_data(self) -> dict[str, Any]:
        data = asdict(self)
        data["classification"] = self.classification.value
        return data

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> RunRecord:
        fields = dict(data)
        fields["classification"] = Classification(fields["classification"])
        fields["pages"] = tuple(PageRead(**p) for p in fields.get("pages", ()))
        for name in ("attestation", "layers", "route_findings", "blocked_egress", "docs_route"):
            fields[name] = tuple(fields.get(name, ()))
        return cls(**fields)
