"""Permission rules: the grammar, the decision order, and the properties that make them safe to combine."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstrun.errors import PolicyError
from firstrun.policy.permissions import (
    TOOLS,
    PermissionMode,
    PermissionReason,
    PermissionVerdict,
    Rule,
    RuleSet,
    decide,
    normalize,
    parse_rule,
)

U, A = PermissionMode.UNATTENDED, PermissionMode.ATTENDED


def rules(source: str = "task", **texts: list[str]) -> RuleSet:
    """A set from rule texts by verdict (``deny=[...]``), in the order given."""
    return RuleSet(source=source, rules=tuple(
        parse_rule(text, verdict=PermissionVerdict(verdict)) for verdict, items in texts.items()
        for text in items))


# -- grammar ----------------------------------------------------------------

@pytest.mark.parametrize(("text", "tool", "pattern"), [
    ("bash", "bash", None),
    ("  read_docs  ", "read_docs", None),
    ("bash(git push*)", "bash", "git push*"),
    ("bash(  git \t push*  )", "bash", "git push*"),
    ("bash(echo (hi))", "bash", "echo (hi)"),
    ("read_docs(https://docs.example.com/*)", "read_docs", "https://docs.example.com/*"),
    ("bash(*)", "bash", "*"),
])
def test_a_rule_parses_to_its_tool_and_normalised_pattern(text: str, tool: str,
                                                          pattern: str | None) -> None:
    rule = parse_rule(text, verdict=PermissionVerdict.DENY)
    assert (rule.tool, rule.pattern) == (tool, pattern)


@pytest.mark.parametrize("text", [
    "", "   ", "bash(", "bash)", "bash(git push", "bash(x)y", "bash (git push*)", "bash()",
    "bash(   )", "Bash(git push*)", "shell(ls)", "(ls)", "read-docs",
])
def test_a_rule_that_means_nothing_definite_is_an_error_quoting_it(text: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_rule(text, verdict=PermissionVerdict.DENY, origin="task.yaml:7")
    message = str(info.value)
    assert repr(text) in message and "task.yaml:7" in message


def test_an_unknown_tool_names_the_tools_there_are() -> None:
    with pytest.raises(PolicyError, match="the tools are bash and read_docs"):
        parse_rule("Bash(git push*)", verdict=PermissionVerdict.DENY)


def test_the_pattern_is_a_glob_over_the_whole_argument() -> None:
    push = parse_rule("bash(git push*)", verdict=PermissionVerdict.DENY)
    assert push.matches("bash", "git push origin main")
    assert push.matches("bash", "git push")
    assert not push.matches("bash", "cd repo && git push")  # the whole string: a prefix rule
    assert push.matches("bash", "git pushd")  # a glob, not a word: the * starts mid-word
    assert not push.matches("read_docs", "git push")
    anywhere = parse_rule("bash(*git push*)", verdict=PermissionVerdict.DENY)
    assert anywhere.matches("bash", "cd repo && git push")


def test_the_glob_is_case_sensitive_and_knows_sets_and_single_characters() -> None:
    assert not parse_rule("bash(git push*)", verdict=PermissionVerdict.DENY).matches("bash", "GIT PUSH")
    assert parse_rule("bash(npm [!i]*)", verdict=PermissionVerdict.DENY).matches("bash", "npm test")
    assert not parse_rule("bash(npm [!i]*)", verdict=PermissionVerdict.DENY).matches("bash", "npm install")
    assert parse_rule("bash(l?)", verdict=PermissionVerdict.DENY).matches("bash", "ls")
    assert not parse_rule("bash(l?)", verdict=PermissionVerdict.DENY).matches("bash", "lsx")
    literal = parse_rule("bash(echo [*])", verdict=PermissionVerdict.DENY)
    assert literal.matches("bash", "echo *") and not literal.matches("bash", "echo x")


def test_whitespace_in_the_argument_is_normalised_before_matching() -> None:
    push = parse_rule("bash(git push*)", verdict=PermissionVerdict.DENY)
    assert push.matches("bash", "  git \t  push   origin\n")
    assert push.matches("bash", "git\npush")
    assert normalize(" a \n\t b  ") == "a b"


def test_a_bare_tool_covers_every_call_of_it() -> None:
    bare = parse_rule("read_docs", verdict=PermissionVerdict.DENY)
    assert bare.matches("read_docs", "https://anything/") and bare.matches("read_docs", "")
    assert not bare.matches("bash", "ls")


def test_the_canonical_text_round_trips() -> None:
    rule = parse_rule(" bash( git   push* ) ", verdict=PermissionVerdict.ASK, origin="f:1")
    assert rule.text == "bash(git push*)"
    assert parse_rule(rule.text, verdict=PermissionVerdict.ASK, origin="f:1") == rule


# -- decisions --------------------------------------------------------------

def test_deny_wins_over_ask_and_allow_whatever_their_order() -> None:
    sets = [rules(allow=["bash(git*)"], ask=["bash(git p*)"], deny=["bash(git push*)"])]
    decision = decide(sets, tool="bash", argument="git push", mode=A)
    assert (decision.verdict, decision.reason) == (PermissionVerdict.DENY, PermissionReason.DENY_RULE)
    assert decision.rule is not None and decision.rule.text == "bash(git push*)"
    assert decide(sets, tool="bash", argument="git pull", mode=A).verdict is PermissionVerdict.ASK
    assert decide(sets, tool="bash", argument="git status", mode=A).verdict is PermissionVerdict.ALLOW


def test_ask_is_deny_unattended_and_the_decision_says_so() -> None:
    sets = [rules(ask=["bash(npm publish*)"])]
    attended = decide(sets, tool="bash", argument="npm publish", mode=A)
    unattended = decide(sets, tool="bash", argument="npm publish", mode=U)
    assert (attended.verdict, attended.reason) == (PermissionVerdict.ASK, PermissionReason.ASK_RULE)
    assert (unattended.verdict, unattended.reason, unattended.mode) == (
        PermissionVerdict.DENY, PermissionReason.ASK_RULE, PermissionMode.UNATTENDED)
    assert unattended.explain() == ("the task permission ask rule bash(npm publish*) asks first "
                                    "and runs are unattended, so nobody can say yes")
    assert attended.explain() == "the task permission ask rule bash(npm publish*) asks first"


def test_no_rule_for_the_tool_allows_by_default() -> None:
    sets = [rules(deny=["bash(git push*)"])]
    decision = decide(sets, tool="read_docs", argument="https://x.test/", mode=U)
    assert (decision.verdict, decision.reason, decision.rule, decision.source) == (
        PermissionVerdict.ALLOW, PermissionReason.NO_RULE, None, None)
    assert decide([], tool="bash", argument="rm -rf /", mode=U).verdict is PermissionVerdict.ALLOW


def test_an_allow_rule_makes_its_tool_allow_listed() -> None:
    sets = [rules(allow=["read_docs(https://docs.example.com/*)"])]
    inside = decide(sets, tool="read_docs", argument="https://docs.example.com/start", mode=U)
    outside = decide(sets, tool="read_docs", argument="https://elsewhere.test/", mode=U)
    assert (inside.verdict, inside.reason) == (PermissionVerdict.ALLOW, PermissionReason.ALLOW_RULE)
    assert (outside.verdict, outside.reason, outside.source) == (
        PermissionVerdict.DENY, PermissionReason.NOT_ALLOWED, "task")
    assert decide(sets, tool="read_docs", argument="https://elsewhere.test/",
                  mode=A).verdict is PermissionVerdict.ASK
    # Only that tool: bash has no allow rule, so it stays default-allow.
    assert decide(sets, tool="bash", argument="ls", mode=U).verdict is PermissionVerdict.ALLOW


def test_the_first_matching_rule_of_a_verdict_is_named() -> None:
    sets = [rules(deny=["bash(curl*)", "bash(curl http*)"])]
    decision = decide(sets, tool="bash", argument="curl http://x", mode=U)
    assert decision.rule is not None and decision.rule.text == "bash(curl*)"


def test_sets_combine_strictest_first_so_deny_from_either_wins() -> None:
    project = rules("project", deny=["bash(git push*)"])
    task = rules("task", allow=["bash(git*)"])
    for order in ([project, task], [task, project]):
        decision = decide(order, tool="bash", argument="git push", mode=A)
        assert (decision.verdict, decision.source) == (PermissionVerdict.DENY, "project")
    allowed = decide([project, task], tool="bash", argument="git status", mode=A)
    assert (allowed.verdict, allowed.source) == (PermissionVerdict.ALLOW, "task")


def test_an_allow_list_in_either_set_constrains_the_call() -> None:
    project = rules("project", allow=["read_docs(https://a.test/*)"])
    task = rules("task", allow=["read_docs(https://b.test/*)"])
    for url in ("https://a.test/x", "https://b.test/x"):
        assert decide([project, task], tool="read_docs", argument=url, mode=U).verdict \
            is PermissionVerdict.DENY


def test_deciding_an_unknown_tool_is_an_error() -> None:
    with pytest.raises(PolicyError):
        decide([], tool="python", argument="x", mode=U)


# -- properties -------------------------------------------------------------

_WORDS = st.sampled_from(["git", "push", "npm", "publish", "curl", "ls", "-rf", "http://x",
                          "https://docs.test/a", "*", "?", "[!a]", " ", "\t"])
_ARGS = st.lists(_WORDS, max_size=6).map("".join)
_PATTERNS = st.lists(_WORDS, min_size=1, max_size=4).map("".join).filter(lambda p: p.strip())
_RULE = st.builds(
    lambda verdict, tool, pattern: parse_rule(
        tool if pattern is None else f"{tool}({pattern})", verdict=verdict),
    st.sampled_from(list(PermissionVerdict)), st.sampled_from(TOOLS), st.none() | _PATTERNS)
_SET = st.builds(lambda source, rs: RuleSet(source=source, rules=tuple(rs)),
                 st.sampled_from(["task", "project"]), st.lists(_RULE, max_size=5))
_SETS = st.lists(_SET, max_size=3)
_RANK = {PermissionVerdict.ALLOW: 0, PermissionVerdict.ASK: 1, PermissionVerdict.DENY: 2}


@given(_SETS, st.sampled_from(TOOLS), _ARGS, st.sampled_from(list(PermissionMode)))
def test_property_a_matching_deny_rule_always_wins(sets: list[RuleSet], tool: str, arg: str,
                                                   mode: PermissionMode) -> None:
    denied = any(r.verdict is PermissionVerdict.DENY and r.matches(tool, arg) for s in sets for r in s.rules)
    decision = decide(sets, tool=tool, argument=arg, mode=mode)
    if denied:
        assert (decision.verdict, decision.reason) == (PermissionVerdict.DENY, PermissionReason.DENY_RULE)
        assert decision.rule is not None and decision.rule.matches(tool, arg)
    else:
        assert decision.reason is not PermissionReason.DENY_RULE


@given(_SETS, st.integers(min_value=0, max_value=3), _RULE, st.sampled_from(TOOLS), _ARGS,
       st.sampled_from(list(PermissionMode)))
def test_property_adding_a_deny_rule_never_allows_more(sets: list[RuleSet], where: int,
                                                       extra: Rule, tool: str, arg: str,
                                                       mode: PermissionMode) -> None:
    deny = Rule(verdict=PermissionVerdict.DENY, tool=extra.tool, pattern=extra.pattern)
    before = decide(sets, tool=tool, argument=arg, mode=mode)
    grown = list(sets) or [RuleSet(source="task")]
    target = grown[where % len(grown)]
    grown[where % len(grown)] = RuleSet(source=target.source, rules=(*target.rules, deny))
    after = decide(grown, tool=tool, argument=arg, mode=mode)
    assert _RANK[after.verdict] >= _RANK[before.verdict]


@given(_SETS, _SET, st.sampled_from(TOOLS), _ARGS, st.sampled_from(list(PermissionMode)))
def test_property_adding_a_rule_set_never_allows_more(sets: list[RuleSet], extra: RuleSet,
                                                      tool: str, arg: str, mode: PermissionMode) -> None:
    before = decide(sets, tool=tool, argument=arg, mode=mode)
    after = decide([*sets, extra], tool=tool, argument=arg, mode=mode)
    assert _RANK[after.verdict] >= _RANK[before.verdict]


@given(_SETS, st.sampled_from(TOOLS), _ARGS)
def test_property_ask_is_deny_unattended(sets: list[RuleSet], tool: str, arg: str) -> None:
    attended = decide(sets, tool=tool, argument=arg, mode=PermissionMode.ATTENDED)
    unattended = decide(sets, tool=tool, argument=arg, mode=PermissionMode.UNATTENDED)
    assert unattended.verdict is not PermissionVerdict.ASK
    expected = PermissionVerdict.ALLOW if attended.verdict is PermissionVerdict.ALLOW else PermissionVerdict.DENY
    assert unattended.verdict is expected
    assert (unattended.reason, unattended.rule) == (attended.reason, attended.rule)


@given(_PATTERNS, _ARGS)
def test_property_matching_ignores_how_whitespace_is_spelled(pattern: str, arg: str) -> None:
    rule = parse_rule(f"bash({pattern})", verdict=PermissionVerdict.DENY)
    spread = arg.replace(" ", " \t ").replace("\t", "\n")
    assert rule.matches("bash", arg) == rule.matches("bash", spread)
