"""The one tool-use loop every model agent runs, whatever the vendor.

Guarantee: every vendor gets the same system prompt (``PROMPT_VERSION``), the
same two tools, the same result text and the same budgets (turns, wall seconds,
tokens, spend), held the same way: a spent budget, or one that can no longer
be checked, ends the run ``BUDGET_EXHAUSTED`` before any further tool call.
Each reply is recorded before its calls run, and the run's usage (None where
unknown, never zero) comes back in ``AgentResult`` however it ended.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from firstrun.agents.base import (
    AgentResult,
    AgentStop,
    Brief,
    Budget,
    BudgetExhausted,
    CallRefused,
    Toolbelt,
    TurnRecord,
)
from firstrun.agents.prompt import PROMPT_VERSION, SYSTEM_PROMPT, task_message
from firstrun.agents.spend import Pricing
from firstrun.agents.vendor import (
    TokenUsage,
    ToolCall,
    ToolResult,
    ToolSpec,
    Turn,
    TurnStop,
    VendorClient,
    VendorConfigError,
    VendorUnavailable,
)

if TYPE_CHECKING:
    # Type-only, as in agents.base: the toolbelt hands these over as data.
    from firstrun.docs.page import Page
    from firstrun.sandbox.base import ExecResult

BASH = ToolSpec(
    name="bash",
    description=(
        "Run one command with bash in your working directory, inside the sandbox, and get "
        "its exit code, stdout and stderr. The documentation hosts are not reachable from "
        "here; read docs pages with read_docs."
    ),
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command to run."}},
        "required": ["command"],
        "additionalProperties": False,
    },
)
READ_DOCS = ToolSpec(
    name="read_docs",
    description=(
        "Read one documentation page and get it as markdown, with its title and links. "
        "Only the documentation hosts you were given can be read."
    ),
    parameters={
        "type": "object",
        "properties": {"url": {"type": "string", "description": "The page's full URL."}},
        "required": ["url"],
        "additionalProperties": False,
    },
)
TOOLS = (BASH, READ_DOCS)

# Output the model may write in one reply. Small enough that every vendor's
# non-streaming call accepts it, large enough for a file written by heredoc.
MAX_OUTPUT_TOKENS = 8192
# A page is returned whole up to this size (the docs reader already caps the
# body); a command's output is held to the task's max_output_chars instead.
MAX_PAGE_CHARS = 60_000
CUT_OFF = "(Your reply hit the output limit and was cut off. Continue.)"
# A turn's token counts, all None when the server reported no usage.
_COUNTS = ("input_tokens", "output_tokens", "cached_tokens", "cache_write_tokens")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Retries of one model call: ``attempts`` counts the first try."""

    attempts: int = 6
    base_s: float = 1.0
    cap_s: float = 30.0

    def delay(self, attempt: int, rng: random.Random, retry_after: float | None) -> float:
        """Full jitter over an exponential ceiling, never sooner than the vendor asked."""
        ceiling = min(self.cap_s, self.base_s * 2 ** (attempt - 1))
        wait = rng.uniform(0, ceiling)
        return max(wait, retry_after) if retry_after is not None else wait


class _Ended(Exception):
    """Ends the loop with a stop that is not a budget."""

    def __init__(self, stop: AgentStop, detail: str) -> None:
        super().__init__(detail)
        self.stop = stop
        self.detail = detail


class _Ledger:
    """Tokens and spend of one run, turn by turn."""

    def __init__(self, pricing: Pricing | None) -> None:
        self.pricing = pricing
        self.turns: list[dict[str, Any]] = []
        self.tokens: int | None = 0
        self.spend: Decimal | None = Decimal(0) if pricing is not None else None
        self.last_input = 0
        self.last_text = ""
        self.served: list[str] = []

    def add(self, turn: Turn) -> Decimal | None:
        usage = turn.usage
        cost = self.pricing.cost(usage) if self.pricing is not None and usage is not None else None
        # One unpriced (or uncounted) turn makes the run's spend, and one
        # uncounted turn its tokens, unknown from then on.
        self.spend = None if cost is None or self.spend is None else self.spend + cost
        self.tokens = None if usage is None or self.tokens is None else self.tokens + usage.total
        self.last_input = usage.input_tokens if usage is not None else 0
        if turn.text:
            self.last_text = turn.text
        counts = usage.to_data() if usage is not None else dict.fromkeys(_COUNTS)
        self.turns.append({**counts, "spend": None if cost is None else str(cost)})
        if turn.model and turn.model not in self.served:
            self.served.append(turn.model)
        return cost

    def least_next(self) -> Decimal | None:
        """The least the next call can cost: it re-sends at least the last input."""
        if self.pricing is None or not self.last_input:
            return None
        return self.pricing.cost(TokenUsage(input_tokens=self.last_input, output_tokens=0))


class LoopAgent:
    """A model agent: ``name`` is the ``--agent`` value, the client its vendor's adapter.

    ``make_client`` is called once per run, so each run has its own
    connection; ``sleep``, ``clock`` and ``rng`` are injected so tests of the
    retry path never wait.
    """

    def __init__(
        self,
        *,
        name: str,
        model: str,
        make_client: Callable[[], VendorClient],
        pricing: Pricing | None,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.model: str | None = model
        self.pricing = pricing
        self._make_client = make_client
        self._retry = retry
        self._sleep = sleep
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()

    def new_client(self) -> VendorClient:
        """A fresh connection to this agent's model, for a call outside any run; the caller closes it."""
        return self._make_client()

    def run(self, brief: Brief, tools: Toolbelt) -> AgentResult:
        client = self.new_client()
        ledger = _Ledger(self.pricing)
        try:
            stop, detail = self._converse(client, brief, tools, ledger)
        except BudgetExhausted as exc:
            stop, detail = AgentStop.BUDGET_EXHAUSTED, f"{exc.budget}: {exc.detail}"
        except _Ended as exc:
            stop, detail = exc.stop, exc.detail
        finally:
            client.close()
        # The claim is the model's last words, however the run ended; it is
        # recorded, never trusted: the check decides.
        return AgentResult(stop=stop, turns=len(ledger.turns), claim=ledger.last_text,
                           detail=detail, usage=self._usage(client, brief, ledger))

    # The budgets: one model reply is one turn, and no call starts past
    # ``max_turns``; the toolbelt holds every tool call to the wall seconds, and
    # ``_send`` holds every model call (its timeout and its retries) to the same
    # clock; tokens are input plus output summed over the run, against
    # ``max_tokens`` (0: no limit), checked after each reply; spend is checked
    # against ``Brief.max_spend`` after each reply and, before the next, against
    # the least the next can cost (it re-sends at least the input just sent). A
    # reply without usage, or without a price under a spend limit, ends a run that
    # has that limit, because the limit can no longer be held.
    def _converse(self, client: VendorClient, brief: Brief, tools: Toolbelt,
                  ledger: _Ledger) -> tuple[AgentStop, str]:
        budgets = brief.budgets
        deadline = self._clock() + budgets.max_seconds
        conversation: list[Any] = [client.user_message(task_message(brief))]
        while True:
            if len(ledger.turns) >= budgets.max_turns:
                raise BudgetExhausted(Budget.MAX_TURNS,
                                      f"max_turns {budgets.max_turns} reached")
            least = ledger.least_next()
            if (brief.max_spend is not None and least is not None and ledger.spend is not None
                    and ledger.spend + least > brief.max_spend):
                raise BudgetExhausted(Budget.MAX_SPEND,
                                      f"the next turn would pass the run's {brief.max_spend} USD")
            turn, retries = self._send(client, conversation, deadline)
            cost = ledger.add(turn)
            calls = [(call, _refusal(call)) for call in turn.tool_calls]
            tools.record_turn(TurnRecord(
                turn=len(ledger.turns), text=turn.text,
                tool_calls=tuple({"id": c.id, "name": c.name, "arguments": c.arguments,
                                  **({"error": why} if why else {})} for c, why in calls),
                stop=turn.stop.value, vendor_stop=turn.vendor_stop,
                usage=turn.usage.to_data() if turn.usage is not None else dict.fromkeys(_COUNTS),
                spend=None if cost is None else str(cost), retries=retries))
            conversation.append(turn.message)
            if turn.stop is TurnStop.REFUSAL:
                return AgentStop.REFUSED, turn.detail or "the model refused"
            if turn.stop is TurnStop.CONTEXT_FULL:
                raise BudgetExhausted(Budget.CONTEXT_WINDOW, "the conversation outgrew the model")
            if budgets.max_tokens and ledger.tokens is None:
                raise BudgetExhausted(Budget.MAX_TOKENS, f"turn {len(ledger.turns)} reported no "
                                      f"token usage, so max_tokens {budgets.max_tokens} "
                                      "cannot be held")
            if budgets.max_tokens and ledger.tokens >= budgets.max_tokens:
                raise BudgetExhausted(Budget.MAX_TOKENS,
                                      f"{ledger.tokens} tokens used of max_tokens {budgets.max_tokens}")
            if brief.max_spend is not None and ledger.spend is None:
                # A limit that can no longer be checked is treated as reached.
                raise BudgetExhausted(Budget.MAX_SPEND, f"turn {len(ledger.turns)} has no price, "
                                      f"so the run's {brief.max_spend} USD cannot be held")
            if brief.max_spend is not None and ledger.spend is not None \
                    and ledger.spend >= brief.max_spend:
                raise BudgetExhausted(Budget.MAX_SPEND,
                                      f"{ledger.spend} USD spent of the run's {brief.max_spend}")
            if not calls:
                if turn.stop is TurnStop.MAX_OUTPUT:
                    conversation.append(client.user_message(CUT_OFF))
                    continue
                if turn.stop is TurnStop.PAUSED:
                    continue
                return AgentStop.FINISHED, ""
            results = [self._call(tools, call, why, brief) for call, why in calls]
            conversation.extend(client.tool_results(results))

    # A transient failure is retried with exponential backoff and full jitter while
    # the retries and the wall budget last, then ends the run ``INFRA_ERROR``; a
    # configuration failure ends it ``HARNESS_ERROR`` at once.
    def _send(self, client: VendorClient, conversation: list[Any],
              deadline: float) -> tuple[Turn, int]:
        attempt = 0
        while True:
            attempt += 1
            left = deadline - self._clock()
            if left <= 0:
                raise BudgetExhausted(Budget.MAX_SECONDS, "the agent phase ran out of time "
                                      "waiting for the model")
            try:
                return client.send(system=SYSTEM_PROMPT, conversation=conversation, tools=TOOLS,
                                   max_output_tokens=MAX_OUTPUT_TOKENS, timeout=left), attempt - 1
            except VendorConfigError as exc:
                raise _Ended(AgentStop.HARNESS_ERROR, str(exc)) from None
            except VendorUnavailable as exc:
                if deadline - self._clock() <= 0:
                    raise BudgetExhausted(Budget.MAX_SECONDS, "the agent phase ran out of time "
                                          "waiting for the model") from None
                wait = self._retry.delay(attempt, self._rng, exc.retry_after)
                if attempt >= self._retry.attempts or self._clock() + wait >= deadline:
                    raise _Ended(AgentStop.INFRA_ERROR,
                                 f"{exc} (gave up after {attempt} attempts)") from None
                self._sleep(wait)

    def _call(self, tools: Toolbelt, call: ToolCall, refusal: str | None,
              brief: Brief) -> ToolResult:
        if refusal is not None:
            return ToolResult(call_id=call.id, name=call.name, text=f"error: {refusal}",
                              is_error=True)
        assert call.arguments is not None
        try:
            if call.name == BASH.name:
                result = tools.bash(call.arguments["command"])
                return ToolResult(call_id=call.id, name=call.name,
                                  text=bash_text(result, brief.budgets.max_output_chars),
                                  is_error=result.exit_code != 0)
            page = tools.read_docs(call.arguments["url"])
        except CallRefused as exc:
            # The model is told, as the call's result, and may try another way.
            return ToolResult(call_id=call.id, name=call.name, text=f"error: {exc.message}",
                              is_error=True)
        return ToolResult(call_id=call.id, name=call.name, text=page_text(page),
                          is_error=not page.ok)

    def _usage(self, client: VendorClient, brief: Brief, ledger: _Ledger) -> dict[str, Any]:
        return {
            "vendor": client.vendor,
            "model": client.model,
            "served_models": list(ledger.served),
            "prompt_version": PROMPT_VERSION,
            "turns": len(ledger.turns),
            "per_turn": list(ledger.turns),
            "input_tokens": _total(ledger.turns, "input_tokens"),
            "output_tokens": _total(ledger.turns, "output_tokens"),
            "cached_tokens": _total(ledger.turns, "cached_tokens"),
            "spend": None if ledger.spend is None else str(ledger.spend),
            "currency": "USD",
            "price_source": None if self.pricing is None else self.pricing.source,
            "max_spend": None if brief.max_spend is None else str(brief.max_spend),
        }


def _total(turns: list[dict[str, Any]], key: str) -> int | None:
    """A count summed over the turns, or None when any turn's is unknown."""
    counts = [t[key] for t in turns]
    return None if None in counts else sum(counts)


def _refusal(call: ToolCall) -> str | None:
    """Why the loop will not run ``call``, or None when it will."""
    spec = next((t for t in TOOLS if t.name == call.name), None)
    if spec is None:
        return f"unknown tool {call.name!r}; the tools are bash and read_docs"
    (key,) = spec.parameters["required"]
    if (call.arguments is None or set(call.arguments) != {key}
            or not isinstance(call.arguments[key], str)):
        return f"{call.name} takes exactly one argument, {key!r}, a string"
    return None


def clip(text: str, limit: int) -> str:
    """``text`` whole, or its head and tail around a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def bash_text(result: ExecResult, limit: int) -> str:
    """A command's result as the model reads it: exit code, then stdout and stderr, then one
    line per refusal the boundary made while it ran (never clipped: it is how a model tells
    "blocked by policy" from "the network is down")."""
    head = f"exit code: {result.exit_code}"
    if result.timed_out:
        head += f" (timed out after {result.duration_s:.0f}s; the command was killed)"
    body = f"stdout:\n{result.stdout.text()}\nstderr:\n{result.stderr.text()}"
    if result.stdout.truncated or result.stderr.truncated:
        body += "\n[the sandbox kept only the head and tail of the output]"
    tail = "".join(f"\n{line}" for line in result.refusals)
    return f"{head}\n{clip(body, limit)}{tail}"


def page_text(page: Page) -> str:
    """A docs page as the model reads it: where it ended up, its title, markdown and links."""
    if not page.ok:
        detail = f": {page.detail}" if page.detail else ""
        assert page.error is not None
        return f"error: the page could not be read ({page.error.value}{detail})"
    lines = [f"url: {page.url_final}"]
    if page.title:
        lines.append(f"title: {page.title}")
    lines += ["", clip(page.markdown, MAX_PAGE_CHARS)]
    if page.links:
        lines += ["", "links:", *(f"- {link}" for link in page.links)]
    return "\n".join(lines)
