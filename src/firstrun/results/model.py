"""What one finished run says, as saved data.

Guarantee: a ``RunRecord`` is the whole truth a report may use about a run;
reports, statistics and diffs read these records (through ``results.json``)
and never the live run. Classifications are a closed set and only ``passed``
and ``docs_gap`` are evidence about the documentation; everything else says
the run could not judge it, and is counted apart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any


class Classification(StrEnum):
    PASSED = "passed"
    DOCS_GAP = "docs_gap"
    # The check failed after the boundary refused something the shell tried
    # to reach: the task's allow-list, not the docs, may be what is missing.
    BLOCKED = "blocked"
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
    # The Ray node that carried the run out (``HOST (NODE-ID)``); None: this machine.
    node: str | None = None
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
    # ``clean``: nothing from setup or the agent ran beside the check (and
    # ``killed_before_check`` processes were killed first); ``shared``: the check
    # polled a server the agent left running, beside it, so it could be forged.
    check_isolation: str | None = None
    killed_before_check: int | None = None
    # The entries (``{"allow": [...], "tcp": [...]}``, ``tasks.allowlist``) that
    # would let a blocked run's refusals through, or what a report-only run
    # would have been refused; empty when there is nothing to add.
    allow_fix: dict[str, list[str]] = field(default_factory=dict)
    commands: int = 0
    started_at: str = ""
    duration_s: float = 0.0
    trace: str = ""
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def evidential(self) -> bool:
        return self.classification in EVIDENTIAL

    def spent(self) -> Decimal | None:
        """What the run spent in USD; None when unknown, never guessed as zero."""
        usage = self.extra.get("usage")
        if usage is None:
            failure = self.extra.get("failure")
            # No usage: either the agent never started (nothing spent) or it
            # failed mid-conversation, having spent an unknown amount.
            return None if isinstance(failure, dict) and failure.get("phase") == "agent" \
                else Decimal(0)
        if not usage:
            return Decimal(0)  # an agent with no model (replay) spends nothing
        if not isinstance(usage, dict) or usage.get("spend") is None:
            return None
        try:
            return Decimal(str(usage["spend"]))
        except InvalidOperation:
            return None

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


@dataclass(frozen=True, kw_only=True)
class TaskIdentity:
    """One task as a sweep ran it: its name and the bytes that define it."""

    name: str
    sha256: str
    # The check's own text: ``success.file`` lives outside the task file, so
    # the task file's hash alone would miss an edited check.
    check_sha256: str


@dataclass(frozen=True, kw_only=True)
class SweepIdentity:
    """What makes two batches of runs one sample: resuming a sweep requires all of it to match.

    Which options of ``firstrun run`` are part of it, and why each other one
    is left out, is declared with the option (``run.options.RUN_OPTIONS``).
    ``task_defaults_sha256`` covers what of the project config changes the
    tasks themselves (task defaults, permission rules, ``isolation``); the
    rest of that file is left out likewise.

    ``inspect_tls`` is None, and ``image`` is ``NOT_RECORDED``, in a sweep
    saved before firstrun recorded them. Such a sweep may have run with the
    option or without, and nothing saved says which, so it is comparable
    with neither (``incomparability``).
    """

    tasks: tuple[TaskIdentity, ...]
    agent: str
    model: str | None
    base_url: str | None
    backend: str
    repeat: int
    affordances: str
    probe_affordances: bool
    allow_unenforced: bool
    downgrades: tuple[str, ...]
    task_defaults_sha256: str | None
    inspect_tls: bool | None
    image: str | None = None

    def to_data(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> SweepIdentity:
        """Raises ``TypeError``/``KeyError``/``ValueError`` for data that is not an identity."""
        fields = dict(data)
        fields["tasks"] = tuple(TaskIdentity(**t) for t in fields["tasks"])
        fields["downgrades"] = tuple(fields["downgrades"])
        fields.setdefault("inspect_tls", None)
        fields.setdefault("image", NOT_RECORDED)
        return cls(**fields)


# ``image`` of a sweep saved before firstrun recorded --image.
NOT_RECORDED = "(not recorded)"

# How each difference is named to the user: the flag that set it (a test holds
# these to the flags ``run.options`` declares).
IDENTITY_FLAGS = {
    "agent": "--agent",
    "model": "--model",
    "base_url": "--base-url",
    "backend": "--backend",
    "repeat": "--repeat",
    "affordances": "--affordances",
    "probe_affordances": "--probe-affordances",
    "allow_unenforced": "--allow-unenforced",
    "downgrades": "--allow-downgrade",
    "task_defaults_sha256": "the project config's task_defaults, permissions or isolation",
    "inspect_tls": "--inspect-tls",
    "image": "--image",
}


def incomparability(recorded: SweepIdentity, wanted: SweepIdentity) -> str | None:
    """Why runs made as ``wanted`` would not be comparable with ``recorded``; None when they are."""
    old = {t.name: t for t in recorded.tasks}
    new = {t.name: t for t in wanted.tasks}
    if old.keys() != new.keys():
        missing = sorted(old.keys() - new.keys())
        added = sorted(new.keys() - old.keys())
        parts = ([f"not given now: {', '.join(missing)}"] if missing else []) + (
            [f"not in the sweep: {', '.join(added)}"] if added else [])
        return f"the task set differs ({'; '.join(parts)})"
    for name in sorted(old):
        if old[name].sha256 != new[name].sha256:
            return f"task {name}'s file changed since the sweep started"
        if old[name].check_sha256 != new[name].check_sha256:
            return f"task {name}'s success check changed since the sweep started"
    for unknown, flag in ((recorded.inspect_tls is None, "--inspect-tls"),
                          (recorded.image == NOT_RECORDED, "--image")):
        if unknown:
            return (f"the sweep was saved before firstrun recorded {flag}, so nothing shows "
                    "what its runs used; start a new sweep")
    for key, flag in IDENTITY_FLAGS.items():
        before, now = getattr(recorded, key), getattr(wanted, key)
        if before != now:
            return f"{flag} was {_shown(before)} and is now {_shown(now)}"
    return None


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    return "unset" if value is None else repr(value)
