"""Permission rules over an agent's tool calls: ``allow``, ``deny`` and ``ask``.

Guarantee: ``decide`` is a pure function of the rule sets, the tool, the
argument and the mode. A call that matches a ``deny`` rule in any set is
denied, whatever else matches; unattended (every firstrun run) ``ask`` is
``deny``. A rule that cannot mean one thing is refused when parsed, with a
``PolicyError`` quoting it. Not a boundary: a rule sees the string the agent
asked to run, not what runs; the kernel layers below are what hold.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase

from firstrun.errors import PolicyError

BASH = "bash"
READ_DOCS = "read_docs"
TOOLS = (BASH, READ_DOCS)

# One rule is ``tool`` or ``tool(pattern)``, the tool one of TOOLS. The pattern
# is everything between the first ``(`` and the rule's last character, its
# ``)``, so it may itself hold parentheses. An unknown tool is an error: a typo
# such as ``Bash(...)`` would otherwise never match, and a deny rule that never
# matches fails open. So is an empty pattern: the bare tool covers every call.
_RULE = re.compile(r"(?P<tool>[^()\s]+)(?:\((?P<pattern>.*)\))?", re.DOTALL)


class PermissionVerdict(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


class PermissionMode(StrEnum):
    """Whether someone can be asked. firstrun's runs are all ``UNATTENDED``."""

    ATTENDED = "attended"
    UNATTENDED = "unattended"


class PermissionReason(StrEnum):
    """Why a decision came out as it did; stable keys for the trace and reports."""

    DENY_RULE = "deny_rule"
    ASK_RULE = "ask_rule"
    NOT_ALLOWED = "not_on_allow_list"
    ALLOW_RULE = "allow_rule"
    NO_RULE = "no_rule"


# Strictest first: the combined decision is the first of these any set reached.
_STRICTNESS = (PermissionReason.DENY_RULE, PermissionReason.ASK_RULE, PermissionReason.NOT_ALLOWED, PermissionReason.ALLOW_RULE,
               PermissionReason.NO_RULE)


# In a pattern and in every argument each run of whitespace (spaces, tabs,
# newlines) becomes one space, so ``git   push`` and a command split over lines
# match like ``git push``. Nothing else is rewritten: a URL is matched as
# written, case and all.
def normalize(text: str) -> str:
    """Every run of whitespace as one space, the ends stripped: what a rule is matched against."""
    return " ".join(text.split())


# The weakest layer firstrun has. A rule states a task author's intent, stops
# the obvious case early and puts every decision in the trace, but it sees the
# string the agent asked to run: ``npm test`` runs whatever ``package.json``
# says, ``sh -c 'git push'`` does not start with ``git``, and
# ``bash -c "$(echo Z2l0IHB1c2g= | base64 -d)"`` is a ``git push`` no pattern
# sees. The kernel layers (filesystem scope, namespaces, seccomp, Landlock, the
# egress allow-list) are what actually hold.
@dataclass(frozen=True, kw_only=True)
class Rule:
    """One parsed rule. ``pattern`` None covers every call of ``tool``.

    ``origin`` says where it was written (``tasks/x.yaml:12``), for the trace
    and for people; it never affects a decision.
    """

    verdict: PermissionVerdict
    tool: str
    pattern: str | None
    origin: str = ""

    @property
    def text(self) -> str:
        """The rule in its canonical spelling (whitespace normalised)."""
        return self.tool if self.pattern is None else f"{self.tool}({self.pattern})"

    # An ``fnmatch`` glob, case-sensitive, against the WHOLE argument (the command
    # for bash, the URL for read_docs): ``*`` is any run of characters (spaces and
    # ``/`` included), ``?`` one character, ``[seq]`` and ``[!seq]`` a set, ``[*]``
    # a literal ``*``. So ``bash(git push*)`` matches ``git push origin main`` but
    # not ``cd x && git push``; ``bash(*git push*)`` means "anywhere".
    def matches(self, tool: str, argument: str) -> bool:
        if tool != self.tool:
            return False
        return self.pattern is None or fnmatchcase(normalize(argument), self.pattern)


def parse_rule(text: str, *, verdict: PermissionVerdict, origin: str = "") -> Rule:
    """One rule from its text; a ``PolicyError`` quoting ``text`` if it means nothing definite."""
    where = f"{origin}: " if origin else ""
    stripped = text.strip()
    found = _RULE.fullmatch(stripped)
    if found is None:
        raise PolicyError(
            f"{where}{verdict.value} rule {text!r} is not TOOL or TOOL(PATTERN) "
            f"(a pattern ends with the rule's last character, ')')"
        )
    tool = found["tool"]
    if tool not in TOOLS:
        raise PolicyError(
            f"{where}{verdict.value} rule {text!r} names unknown tool {tool!r}; "
            f"the tools are {' and '.join(TOOLS)}"
        )
    pattern = found["pattern"]
    if pattern is not None:
        pattern = normalize(pattern)
        if not pattern:
            raise PolicyError(
                f"{where}{verdict.value} rule {text!r} has an empty pattern; "
                f"write {tool!r} alone to cover every call"
            )
    return Rule(verdict=verdict, tool=tool, pattern=pattern, origin=origin)


@dataclass(frozen=True, kw_only=True)
class RuleSet:
    """The rules one place wrote (``source``: ``task``, ``project``), in their order."""

    source: str
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PermissionDecision:
    """What to do with one call, and why.

    ``verdict`` is final for ``mode``: never ``ASK`` when unattended.
    ``rule`` is the rule that decided (None for ``no_rule`` and
    ``not_on_allow_list``); ``source`` is the rule set that decided, None
    when no set had a rule for the tool.
    """

    verdict: PermissionVerdict
    reason: PermissionReason
    rule: Rule | None
    mode: PermissionMode
    source: str | None

    def explain(self) -> str:
        """One sentence for the agent: the rule, not where it is written (the trace has that)."""
        rule = f" {self.rule.verdict.value} rule {self.rule.text}" if self.rule else ""
        nobody = " and runs are unattended, so nobody can say yes" \
            if self.verdict is PermissionVerdict.DENY and self.mode is PermissionMode.UNATTENDED else ""
        match self.reason:
            case PermissionReason.DENY_RULE:
                return f"refused by the {self.source} permission{rule}"
            case PermissionReason.ASK_RULE:
                return f"the {self.source} permission{rule} asks first{nobody}"
            case PermissionReason.NOT_ALLOWED:
                return f"not on the {self.source} permission rules' allow list{nobody}"
            case PermissionReason.ALLOW_RULE:
                return f"allowed by the {self.source} permission{rule}"
            case PermissionReason.NO_RULE:
                return "no permission rule covers it (allowed by default)"


# Within one set the first match decides: a deny rule, then an ask rule, then
# an allow rule. With none matching, a set that has allow rules for the tool has
# made it allow-listed (``read_docs(https://docs.example.com/*)`` means other
# URLs are not allowed: ``not_on_allow_list``, a deny when unattended), and a
# set with no rule for the tool allows. That default is deliberate: a set that
# only denies is a deny-list, and an empty one changes nothing, because the
# kernel layers carry the weight. A task that wants the stricter shape writes
# an allow rule.
def _decide_one(rules: RuleSet, tool: str, argument: str) -> tuple[PermissionReason, Rule | None]:
    matching = [r for r in rules.rules if r.matches(tool, argument)]
    for verdict, reason in ((PermissionVerdict.DENY, PermissionReason.DENY_RULE), (PermissionVerdict.ASK, PermissionReason.ASK_RULE),
                            (PermissionVerdict.ALLOW, PermissionReason.ALLOW_RULE)):
        first = next((r for r in matching if r.verdict is verdict), None)
        if first is not None:
            return reason, first
    if any(r.tool == tool and r.verdict is PermissionVerdict.ALLOW for r in rules.rules):
        return PermissionReason.NOT_ALLOWED, None
    return PermissionReason.NO_RULE, None


# Several sets (the task's and the project's) combine by the strictest of their
# decisions (``_STRICTNESS``), the earlier set on a tie: a deny in either wins,
# an ask in either asks, and an allow-list in either constrains, so a call must
# pass both.
def decide(sets: Sequence[RuleSet], *, tool: str, argument: str, mode: PermissionMode) -> PermissionDecision:
    """The decision on ``tool(argument)`` under every set in ``sets``: the strictest wins."""
    if tool not in TOOLS:
        raise PolicyError(f"no permission rules exist for unknown tool {tool!r}")
    reason, rule, source = PermissionReason.NO_RULE, None, None
    for rules in sets:
        found, matched = _decide_one(rules, tool, argument)
        if _STRICTNESS.index(found) < _STRICTNESS.index(reason):
            reason, rule, source = found, matched, rules.source
    if reason is PermissionReason.DENY_RULE:
        verdict = PermissionVerdict.DENY
    elif reason in (PermissionReason.ASK_RULE, PermissionReason.NOT_ALLOWED):
        verdict = PermissionVerdict.ASK if mode is PermissionMode.ATTENDED else PermissionVerdict.DENY
    else:
        verdict = PermissionVerdict.ALLOW
    return PermissionDecision(verdict=verdict, reason=reason, rule=rule, mode=mode, source=source)
