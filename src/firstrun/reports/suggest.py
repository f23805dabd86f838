"""``findings --suggest``: the sweep's own model drafts one docs change per finding, saved beside the results.

Guarantee: the one step of findings that calls a vendor or writes; findings and
figures never read what it saves. One call per shown finding without a current
draft, each reserving its largest cost under ``--max-spend`` first; once one
cannot fit, no call is made and the rest are ``budget_spent``. A vendor error
or refusal is a ``vendor_error`` gap, never raised, never over an earlier draft.
Keys go only to the vendor or ``--base-url``, never to a URL saved in results.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from firstrun.agents.loop import RetryPolicy
from firstrun.agents.spend import Pricing, SpendGovernor
from firstrun.agents.vendor import TurnStop, VendorClient, VendorError, VendorUnavailable
from firstrun.errors import UsageError, one_line
from firstrun.reports.findings import Finding
from firstrun.reports.findings_report import SHOWN, Report
from firstrun.reports.output import write_text_atomic
from firstrun.reports.suggestions import (
    FILE,
    SYSTEM,
    Key,
    Status,
    Suggestion,
    inputs_sha256,
    prompt,
    suggestions_data,
)
from firstrun.tasks.model import Budgets

MAX_OUTPUT_TOKENS = 1024
TIMEOUT_S = 120.0
# A transient vendor error is retried as the agent loop retries; one that lasts
# becomes a vendor_error gap.
# Tries of one call, the first included: a draft is not worth the loop's patience.
RETRY = RetryPolicy(attempts=3)
# Model name prefixes that say which vendor a --model given without --agent is for.
_BY_PREFIX = (("claude", "claude"), ("gpt-", "openai"), ("o1", "openai"), ("o3", "openai"),
              ("o4", "openai"), ("gemini", "gemini"))
MODEL_AGENTS = ("claude", "openai", "gemini")


def save_suggestions(root: Path, suggestions: Mapping[Key, Suggestion]) -> Path:
    path = root / FILE
    write_text_atomic(path, json.dumps(suggestions_data(list(suggestions.values())), indent=2) + "\n")
    return path


def choose_model(meta: Mapping[str, Any], models: Sequence[str | None], *, agent: str | None,
                 model: str | None) -> tuple[str, str | None]:
    """The agent and model that draft: the flags', else the sweep's; None model: the agent's default."""
    sweep = meta.get("sweep") if isinstance(meta.get("sweep"), Mapping) else {}
    ran = meta.get("agent") or sweep.get("agent")
    if agent is None and model is None:
        if ran not in MODEL_AGENTS:
            raise UsageError(f"--suggest: this sweep ran the {ran or 'unknown'} agent, which has no model; "
                             "give --model (and --agent)")
        agent = str(ran)
    elif agent is None:
        assert model is not None
        agent = next((a for prefix, a in _BY_PREFIX if model.startswith(prefix)),
                     str(ran) if ran in MODEL_AGENTS else None)
        if agent is None:
            raise UsageError(f"--model {model}: say which vendor serves it with --agent "
                             f"({', '.join(MODEL_AGENTS)})")
    if agent not in MODEL_AGENTS:
        raise UsageError(f"--agent: {agent!r} cannot draft; choose one of {', '.join(MODEL_AGENTS)}")
    if model is None and agent == ran:
        model = _model_of(meta, sweep, models)
    return agent, model


def _model_of(meta: Mapping[str, Any], sweep: Mapping[str, Any], models: Sequence[str | None]) -> str | None:
    # A sweep left on its agent's default saves no --model; its runs name the model they used.
    return meta.get("model") or sweep.get("model") or next((m for m in models if m), None)


@dataclass(frozen=True, kw_only=True)
class Drafted:
    """What one ``--suggest`` did: every suggestion now saved, the findings shown, this call's part."""

    saved: dict[Key, Suggestion]
    shown: int
    made: tuple[tuple[Finding, Suggestion], ...]
    spent: Decimal | None


def shown(report: Report) -> list[Finding]:
    return [f for t in report.tasks for f in t.findings[:SHOWN]]


def draft(report: Report, saved: Mapping[Key, Suggestion], *, agent: str, model: str,
          client: VendorClient, pricing: Pricing | None, governor: SpendGovernor | None,
          keep: Callable[[Mapping[Key, Suggestion]], object] = lambda _: None,
          now: Callable[[], datetime] = lambda: datetime.now(UTC),
          sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None) -> Drafted:
    """Ask ``client`` once for each shown finding without a current draft, under ``governor``;
    ``keep`` is given every suggestion after each call, so a paid draft is saved at once."""
    out = dict(saved)
    made: list[tuple[Finding, Suggestion]] = []
    spent: Decimal | None = Decimal(0)
    spent_out = False
    findings = shown(report)
    for finding in findings:
        old = out.get(finding.key)
        if old is not None and old.status is Status.DRAFTED and old.current(finding):
            continue
        user = prompt(finding)
        base: dict[str, Any] = {"finding": finding.key, "agent": agent, "model": model,
                                "inputs_sha256": inputs_sha256(finding, model=model),
                                "price_source": None if pricing is None else pricing.source,
                                "drafted_at": now().isoformat(timespec="seconds")}
        reservation = None
        if governor is not None and not spent_out:
            # A token is at least a byte of its text, so the bytes bound the input tokens.
            most = len(SYSTEM.encode()) + len(user.encode()) + MAX_OUTPUT_TOKENS
            reservation = governor.reserve(Budgets(max_tokens=most))
            spent_out = reservation is None
        if spent_out:
            s = Suggestion(status=Status.BUDGET_SPENT, text=None, error="the --max-spend budget was spent",
                           input_tokens=None, output_tokens=None, spend_usd=Decimal(0), **base)
        else:
            s = _ask(client, user, pricing, base, sleep=sleep, rng=rng or random.Random())
            if governor is not None and reservation is not None:
                governor.settle(reservation, s.spend_usd)
            spent = None if spent is None or s.spend_usd is None else spent + s.spend_usd
        # A draft the evidence has outgrown is still worth more than none: kept over a gap.
        if s.status is Status.DRAFTED or old is None or old.status is not Status.DRAFTED:
            out[finding.key] = s
        made.append((finding, s))
        keep(out)
    return Drafted(saved=out, shown=len(findings), made=tuple(made), spent=spent)


def _ask(client: VendorClient, user: str, pricing: Pricing | None, base: dict[str, Any], *,
         sleep: Callable[[float], None], rng: random.Random) -> Suggestion:
    attempt = 0
    try:
        while True:
            attempt += 1
            try:
                turn = client.send(system=SYSTEM, conversation=[client.user_message(user)], tools=(),
                                   max_output_tokens=MAX_OUTPUT_TOKENS, timeout=TIMEOUT_S)
                break
            except VendorUnavailable as exc:
                if attempt >= RETRY.attempts:
                    raise
                sleep(RETRY.delay(attempt, rng, exc.retry_after))
    except VendorError as exc:
        # A request the API rejected is not billed; one that timed out may have been, so its
        # cost is unknown (and its reservation is kept whole).
        tries = f" (gave up after {attempt} attempts)" if isinstance(exc, VendorUnavailable) else ""
        return Suggestion(status=Status.VENDOR_ERROR, text=None, error=one_line(str(exc), 450) + tries,
                          input_tokens=None, output_tokens=None,
                          spend_usd=None if isinstance(exc, VendorUnavailable) else Decimal(0), **base)
    usage = turn.usage
    cost = pricing.cost(usage) if pricing is not None and usage is not None else None
    tokens = {"input_tokens": None if usage is None else usage.input_tokens,
              "output_tokens": None if usage is None else usage.output_tokens}
    text = turn.text.strip()
    if turn.stop is TurnStop.REFUSAL or not text:
        why = (f"the model refused{': ' + turn.detail if turn.detail else ''}" if turn.stop is TurnStop.REFUSAL
               else f"the model replied with no text (stop: {turn.vendor_stop})")
        return Suggestion(status=Status.VENDOR_ERROR, text=None, error=one_line(why, 500), spend_usd=cost,
                          **tokens, **base)
    return Suggestion(status=Status.DRAFTED, text=text, error=None, spend_usd=cost, **tokens, **base)


def drafted_lines(done: Drafted, *, model: str, cap: Decimal | None, path: Path) -> list[str]:
    """What one ``--suggest`` did, for stderr: drafts and spend, then each finding left without one."""
    if not done.made:
        return [f"every shown finding already has a current draft ({path})" if done.shown
                else "no findings: nothing to draft"]
    drafted = sum(1 for _, s in done.made if s.status is Status.DRAFTED)
    spend = "unknown" if done.spent is None else f"${done.spent:.4f}"
    lines = [f"{drafted} of {len(done.made)} findings drafted by {model}, spend {spend}; saved to {path}"]
    lines += [f"no draft for {f.task}: {f.headline()}: {s.error}"
              for f, s in done.made if s.status is Status.VENDOR_ERROR]
    left = [f for f, s in done.made if s.status is Status.BUDGET_SPENT]
    if left:
        lines.append(f"the --max-spend budget ({cap} USD) was spent; no draft for {len(left)} finding"
                     f"{'s' if len(left) != 1 else ''}:")
        lines += [f"  {f.task}: {f.headline()}" for f in left]
    return lines
