"""Findings a docs team can act on, and the figures the field reports, from saved runs.

Guarantee: pure functions of ``RunRecord``s and their saved trace events (no
I/O, no clock). Only evidential runs count, as in the Wilson rate. A failing
run *breaks* at the first failed agent call it never got past, else at the
check; a command that matches no code block of the pages the run read, and is
not just looking around, is *improvised*. A run whose trace is missing, or whose
pages were saved without their blocks, is a marked gap, never a guess.
"""

from __future__ import annotations

import difflib
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from fractions import Fraction
from typing import Any

from firstrun.results.model import Classification, RunRecord
from firstrun.results.stats import (
    ALPHA,
    PassRate,
    TaskComparison,
    by_task,
    compare,
    pass_rate,
    smallest_sample,
)
from firstrun.tasks.shell import Kind, ParseError, parse

# Two commands of one name match when their token sequences are at least this
# alike (difflib's ratio, 2*matches/total tokens). 0.75 keeps a documented
# step with a flag added or a pin dropped (``pip install tabulate`` against
# ``pip install tabulate==0.9.0`` is 0.75) and parts ``pip install wheel``
# from ``pip install tabulate`` (0.67).
SIMILARITY = 0.75

# Commands that look around rather than do a step: never counted as improvised.
LOOKING_AROUND = frozenset({
    "cd", "ls", "pwd", "cat", "head", "tail", "less", "more", "echo", "printf", "grep", "find",
    "which", "type", "command", "env", "printenv", "true", "false", ":", "sleep", "wc", "sort",
    "uniq", "tree", "file", "stat", "whoami", "id", "uname", "date", "test", "[", "[[",
})

# Lines of a command's output kept as evidence, and their characters at most.
TAIL_LINES = 8
TAIL_CHARS = 1200
# Final reports quoted per finding, and characters of each.
CLAIMS = 3
CLAIM_CHARS = 400
# Runs shown with their command and output, per finding (every run id is kept).
EVIDENCE = 3


# --- error signatures ------------------------------------------------------------

# Made uniform, in this order: directories under temporary roots (a file's
# own name is kept), hashes, versions, then any other number. A package name with a digit in it is a word and stays.
_UNIFORM = (
    (re.compile(r"(?:/tmp|/var/folders|/private/var|/var/tmp)(?:/[^\s'\":/]+)*(?=/[^\s'\":/]+)"), "<tmp>"),
    (re.compile(r"\b(?:0x[0-9a-fA-F]+|(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,64})\b"), "<hash>"),
    (re.compile(r"\bv?\d+(?:\.\d+)+(?:[-+]?(?:a|b|rc|dev|post|alpha|beta)\.?\d*)*\b"), "<version>"),
    (re.compile(r"(?<![\w.<])\d+(?![\w.>])"), "<n>"),
)


def uniform(text: str) -> str:
    """``text`` with temporary paths, hashes, versions and numbers made uniform."""
    for pattern, token in _UNIFORM:
        text = pattern.sub(token, text)
    return " ".join(text.split())


@dataclass(frozen=True, kw_only=True)
class SignatureRule:
    """A line of output that names an error: ``template`` is filled from the match's groups."""

    name: str
    pattern: re.Pattern[str]
    template: str


def _rule(name: str, pattern: str, template: str) -> SignatureRule:
    return SignatureRule(name=name, pattern=re.compile(pattern, re.MULTILINE), template=template)


# The first rule that matches anywhere in the output decides: the specific
# before the general (a pip resolution error before the traceback's last line).
SIGNATURE_RULES = (
    _rule("python_module", r"ModuleNotFoundError: No module named '([^']+)'",
          "ModuleNotFoundError: No module named '{0}'"),
    _rule("python_import", r"ImportError: cannot import name '([^']+)' from '([^']+)'",
          "ImportError: cannot import name '{0}' from '{1}'"),
    _rule("pip_no_distribution", r"No matching distribution found for (\S+)",
          "No matching distribution found for {0}"),
    _rule("pip_externally_managed", r"error: externally-managed-environment",
          "error: externally-managed-environment"),
    _rule("npm_404", r"npm (?:ERR!|error) 404 .*?'?(@?[\w.-]+(?:/[\w.-]+)?)@?[^\s']*'? is not in (?:the|this) "
          r"(?:npm )?registry", "npm ERR! 404 {0}"),
    _rule("npm_404_get", r"npm (?:ERR!|error) 404 Not Found - GET \S*/(@?[\w.-]+(?:%2[fF][\w.-]+)?)\b",
          "npm ERR! 404 {0}"),
    _rule("npm_etarget", r"npm (?:ERR!|error) notarget No matching version found for (@?[\w./-]+?)@",
          "npm ERR! notarget No matching version found for {0}"),
    _rule("npm_code", r"npm (?:ERR!|error) code (E[A-Z0-9]+)", "npm ERR! code {0}"),
    _rule("command_not_found", r"(?:^|: )([\w.+-]+): (?:command )?not found$", "command not found: {0}"),
    _rule("no_such_file", r"can't open file '([^']+)': \[Errno 2\] No such file or directory",
          "can't open file '{0}': No such file or directory"),
    _rule("python_exception", r"^(\w+(?:Error|Exception)): (.+)$", "{0}: {1}"),
    _rule("error_line", r"^(?:ERROR|Error|error|fatal|FATAL)(?:\[[^\]]*\])?: (.+)$", "error: {0}"),
)


def signature(output: str, exit_code: int | None) -> str:
    """The error a command's output names, made uniform; its last line when no rule knows it."""
    for rule in SIGNATURE_RULES:
        found = rule.pattern.search(output)
        if found is not None:
            return rule.template.format(*(uniform(g) for g in found.groups()))
    lines = [line for line in output.splitlines() if line.strip()]
    if lines:
        return uniform(lines[-1])[:200]
    return "no output" if exit_code is None else f"exit {exit_code} with no output"


# --- commands and blocks ---------------------------------------------------------

# Names that run the same program: a reader who types ``python3 -m pip`` ran pip.
_SAME_PROGRAM = {"python3": "python", "pip3": "pip", "py": "python"}
_PROMPT = re.compile(r"^\s*(?:\([^()\s]{1,40}\)\s*)?(?:[\w.-]+@[\w.-]+(?::\S*)?\s?)?[$%#>]\s+")
_TOKENS = re.compile(r"[A-Za-z0-9_.@~/+-]+|[^\sA-Za-z0-9_.@~/+-]+")


def _program(word: str) -> str:
    name = word.rsplit("/", 1)[-1]
    return _SAME_PROGRAM.get(name, name)


def simple_commands(call: str) -> tuple[tuple[str, ...], ...]:
    """The simple commands of one shell call, each as its words, in order.

    ``a && b; c | d`` is four. A compound command (a subshell, a loop) is one
    command of all its words; a call this reader cannot follow is one command
    of its whitespace-split words.
    """
    text = "\n".join(_PROMPT.sub("", line, count=1) for line in call.splitlines())
    try:
        statements = parse(text)
    except ParseError:
        return (tuple(text.split()),) if text.split() else ()
    out = []
    for statement in statements:
        for pipeline in statement.pipelines:
            for command in pipeline.commands:
                words = command.words
                if command.kind is Kind.SIMPLE:
                    # ``VAR=x cmd`` and ``sudo cmd`` run cmd.
                    while words and ("=" in words[0] and words[0].split("=", 1)[0].isidentifier()
                                     or words[0] == "sudo"):
                        words = words[1:]
                if words:
                    out.append(words)
    return tuple(out)


def normal(words: Sequence[str]) -> tuple[str, ...]:
    """A command's words as compared: the program by its name, ``python -m pip`` as ``pip``."""
    if not words:
        return ()
    first = _program(words[0])
    rest = tuple(words[1:])
    if first == "python" and len(rest) >= 2 and rest[0] == "-m":
        first, rest = _program(rest[1]), rest[2:]
    return (first, *rest)


def _tokens(words: Sequence[str]) -> list[str]:
    return [t for word in words for t in _TOKENS.findall(word)]


def similarity(a: Sequence[str], b: Sequence[str]) -> float:
    """How alike two normal commands are: 0 for different programs, else the token ratio."""
    if not a or not b or a[0] != b[0]:
        return 0.0
    return difflib.SequenceMatcher(None, _tokens(a), _tokens(b), autojunk=False).ratio()


@dataclass(frozen=True, kw_only=True)
class BlockRef:
    """A code block a command came from: its page, its index on the page, its text."""

    page: str
    index: int
    text: str
    exact: bool


@dataclass(frozen=True, kw_only=True)
class _Step:
    page: str
    index: int
    text: str
    words: tuple[str, ...]


def _blocks(blocks: Sequence[Any]) -> list[Mapping[str, Any]]:
    """The blocks of a saved page that have the shape ``Block.to_data`` writes; others are left out."""
    return [b for b in blocks if isinstance(b, Mapping) and isinstance(b.get("index"), int)
            and isinstance(b.get("page"), str) and isinstance(b.get("text"), str)]


def _steps(blocks: Sequence[Mapping[str, Any]]) -> list[_Step]:
    steps = []
    for block in blocks:
        if block.get("kind") != "shell" or not isinstance(block.get("steps"), list | tuple):
            continue
        for step in block["steps"]:
            command = step.get("command") if isinstance(step, Mapping) else None
            for words in simple_commands(command if isinstance(command, str) else ""):
                steps.append(_Step(page=block["page"], index=block["index"], text=block["text"],
                                   words=normal(words)))
    return steps


def match(words: tuple[str, ...], steps: Sequence[_Step]) -> BlockRef | None:
    """The block whose step ``words`` (normal) matches: exactly first, then the most alike."""
    for step in steps:
        if step.words == words:
            return BlockRef(page=step.page, index=step.index, text=step.text, exact=True)
    best, score = None, SIMILARITY
    for step in steps:
        s = similarity(words, step.words)
        if s >= score and (best is None or s > score):
            best, score = step, s
    return None if best is None else BlockRef(page=best.page, index=best.index, text=best.text, exact=False)


# --- one run ---------------------------------------------------------------------

class Gap(StrEnum):
    """Why a run's trace could not be read for findings; shown, never guessed past."""

    NO_TRACE = "no_trace"
    UNREADABLE = "unreadable"
    NO_BLOCKS = "no_blocks"


@dataclass(frozen=True, kw_only=True)
class RunTrace:
    """One saved run as findings read it: its record, and its trace's events (None: a gap)."""

    record: RunRecord
    events: tuple[Mapping[str, Any], ...] | None
    gap: str | None = None

    @property
    def id(self) -> str:
        return f"{self.record.task} #{self.record.attempt}"


@dataclass(frozen=True, kw_only=True)
class Call:
    """One agent ``bash`` call: its text, exit, output, and the block each simple command came from."""

    command: str
    exit_code: int | None
    output: str
    commands: tuple[tuple[str, ...], ...]
    blocks: tuple[BlockRef | None, ...]
    origin: BlockRef | None

    def tail(self) -> str:
        lines = self.output.rstrip("\n").splitlines()[-TAIL_LINES:]
        text = "\n".join(lines)
        return text if len(text) <= TAIL_CHARS else "..." + text[-TAIL_CHARS:]


def _origin(event: Mapping[str, Any], blocks: Mapping[tuple[str, int], str]) -> BlockRef | None:
    origin = event.get("origin")
    if not isinstance(origin, Mapping) or not isinstance(origin.get("page"), str):
        return None
    index = origin.get("block", origin.get("index"))
    if not isinstance(index, int):
        return None
    page = origin["page"]
    return BlockRef(page=page, index=index, text=blocks.get((page, index), ""), exact=True)


def calls(events: Sequence[Mapping[str, Any]]) -> tuple[tuple[Call, ...], bool]:
    """The run's agent calls, each matched to the blocks of every page the run read (an
    agent may run a step before it reads the page that gives it); and whether every page
    read carried its blocks (False: matches are unknown)."""
    steps: list[_Step] = []
    texts: dict[tuple[str, int], str] = {}
    with_blocks = True
    for event in events:
        if not isinstance(event, Mapping) or event.get("kind") != "docs_read":
            continue
        page = event.get("page") if isinstance(event.get("page"), Mapping) else {}
        saved = page.get("blocks")
        if not isinstance(saved, list | tuple):
            # A page that failed to load has no blocks to have saved.
            with_blocks = with_blocks and page.get("error") is not None
            continue
        blocks = _blocks(saved)
        steps.extend(_steps(blocks))
        texts.update({(b["page"], b["index"]): b["text"] for b in blocks})
    out = []
    for event in events:
        if not isinstance(event, Mapping) or event.get("kind") != "command" or event.get("source") != "agent":
            continue
        command = str(event.get("command", ""))
        words = simple_commands(command)
        named = _origin(event, texts)
        # A step that names its block (replay's, a file block's write too) came from it whole.
        matched = (tuple(named for _ in words) if named is not None
                   else tuple(match(normal(w), steps) for w in words))
        doing = [m for w, m in zip(words, matched, strict=True)
                 if m is not None and normal(w)[0] not in LOOKING_AROUND]
        origin = named or (doing[0] if doing else None)
        exit_code = event.get("exit_code")
        output = "\n".join(str(event.get(k) or "").rstrip("\n") for k in ("stdout", "stderr")).strip("\n")
        out.append(Call(command=command, exit_code=exit_code if isinstance(exit_code, int) else None,
                        output=output, commands=words, blocks=matched, origin=origin))
    return tuple(out), with_blocks


def _failed(call: Call) -> bool:
    return call.exit_code != 0


def breaking_call(run_calls: Sequence[Call]) -> Call | None:
    """The first failed call the run never got past; None when each was overcome."""
    # Overcome: a later call ran the same command, or a step of the same block,
    # and exited 0. With every failed call overcome the run breaks at the check.
    for i, call in enumerate(run_calls):
        if not _failed(call):
            continue
        key = " ".join(call.command.split())
        overcome = any(
            not _failed(later) and (" ".join(later.command.split()) == key
                                    or (call.origin is not None and later.origin is not None
                                        and (later.origin.page, later.origin.index)
                                        == (call.origin.page, call.origin.index)))
            for later in run_calls[i + 1:]
        )
        if not overcome:
            return call
    return None


# --- findings ----------------------------------------------------------------------

class FindingKind(StrEnum):
    BREAK = "break"
    IMPROVISED = "improvised"


@dataclass(frozen=True, kw_only=True)
class Evidence:
    run: str
    trace: str
    command: str
    exit_code: int | None
    output_tail: str


@dataclass(frozen=True, kw_only=True)
class Finding:
    """Runs of one task that broke alike, or ran one step no page gave.

    ``what`` is the error signature (a break) or the normal command (an
    improvised step); ``page``/``block``/``block_text`` the block a break came
    from (None: no saved block gives it); ``at_check``: every failed command
    was overcome and the run broke at the check. ``runs`` of ``of`` evidential runs.
    """

    kind: FindingKind
    task: str
    task_file: str
    what: str
    page: str | None
    block: int | None
    block_text: str | None
    at_check: bool
    runs: tuple[str, ...]
    of: int
    evidence: tuple[Evidence, ...]
    claims: tuple[str, ...]

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        """What makes a finding the same one in two sweeps."""
        return (self.kind.value, self.task, self.what, self.page or "", -1 if self.block is None else self.block)

    def headline(self) -> str:
        if self.kind is FindingKind.IMPROVISED:
            return f"{len(self.runs)} of {self.of} runs ran `{self.what}`, which no page says"
        where = (f"block {self.block} of {self.page}" if self.page is not None
                 else "the success check" if self.at_check else "a command no saved block gives")
        return f"{len(self.runs)} of {self.of} runs broke at {where}: {self.what}"


@dataclass(frozen=True, kw_only=True)
class TaskFindings:
    task: str
    evidential: int
    findings: tuple[Finding, ...]
    gaps: tuple[tuple[str, str], ...]


def _claims(runs: Sequence[RunTrace]) -> tuple[str, ...]:
    seen: dict[str, str] = {}
    for run in runs:
        claim = run.record.extra.get("claim") if isinstance(run.record.extra, Mapping) else None
        if not isinstance(claim, str) or not claim.strip():
            continue
        text = " ".join(claim.split())
        text = text if len(text) <= CLAIM_CHARS else text[: CLAIM_CHARS - 3] + "..."
        seen.setdefault(text.casefold(), text)
    return tuple(seen.values())[:CLAIMS]


def _check_call(record: RunRecord) -> Call:
    return Call(command="(the success check)", exit_code=record.check_exit, output=record.check_output,
                commands=(), blocks=(), origin=None)


def task_findings(task: str, runs: Sequence[RunTrace]) -> TaskFindings:
    """One task's findings from its runs, the most runs first (breaks before steps on a tie)."""
    evidential = [r for r in runs if r.record.evidential]
    gaps: list[tuple[str, str]] = []
    breaks: dict[tuple[str | None, int | None, str, bool], list[tuple[RunTrace, Call]]] = {}
    improvised: dict[str, list[tuple[RunTrace, Call]]] = {}
    block_text: dict[tuple[str | None, int | None], str] = {}
    for run in evidential:
        if run.events is None:
            gaps.append((run.id, run.gap or Gap.NO_TRACE.value))
            continue
        run_calls, with_blocks = calls(run.events)
        if not with_blocks:
            gaps.append((run.id, Gap.NO_BLOCKS.value))
        if run.record.classification is Classification.DOCS_GAP:
            stuck = breaking_call(run_calls)
            broke = stuck or _check_call(run.record)
            origin = broke.origin
            where = (origin.page, origin.index) if origin is not None else (None, None)
            if origin is not None:
                block_text[where] = origin.text
            breaks.setdefault((*where, signature(broke.output, broke.exit_code), stuck is None),
                              []).append((run, broke))
        if not with_blocks:
            continue
        seen: set[str] = set()
        for call in run_calls:
            for words, block in zip(call.commands, call.blocks, strict=True):
                key = " ".join(normal(words))
                if block is None and normal(words)[0] not in LOOKING_AROUND and key not in seen:
                    seen.add(key)
                    improvised.setdefault(key, []).append((run, call))
    n = len(evidential)
    found = [_finding(FindingKind.BREAK, task, what, page, index, block_text.get((page, index)), hits, n,
                      at_check=at_check)
             for (page, index, what, at_check), hits in breaks.items()]
    found += [_finding(FindingKind.IMPROVISED, task, what, None, None, None, hits, n)
              for what, hits in improvised.items()]
    found.sort(key=lambda f: (-len(f.runs), f.kind is not FindingKind.BREAK, f.what))
    return TaskFindings(task=task, evidential=n, findings=tuple(found), gaps=tuple(gaps))


def _finding(kind: FindingKind, task: str, what: str, page: str | None, index: int | None,
             text: str | None, hits: Sequence[tuple[RunTrace, Call]], of: int, *,
             at_check: bool = False) -> Finding:
    return Finding(
        kind=kind, task=task, task_file=hits[0][0].record.task_file, what=what, page=page, block=index,
        at_check=at_check,
        block_text=text, runs=tuple(run.id for run, _ in hits), of=of,
        evidence=tuple(Evidence(run=run.id, trace=run.record.trace, command=call.command,
                                exit_code=call.exit_code, output_tail=call.tail())
                       for run, call in hits[:EVIDENCE]),
        claims=_claims([run for run, _ in hits]),
    )


def findings(runs: Sequence[RunTrace]) -> tuple[TaskFindings, ...]:
    """Findings per task, tasks in the order they first appear."""
    grouped: dict[str, list[RunTrace]] = {}
    for run in runs:
        grouped.setdefault(run.record.task, []).append(run)
    return tuple(task_findings(task, task_runs) for task, task_runs in grouped.items())


# --- the field's figures ------------------------------------------------------------

def pass_hat_k(n: int, c: int, k: int) -> Fraction:
    """pass^k: the chance that k tries drawn from n (c passed) all pass, C(c,k)/C(n,k) (tau-bench)."""
    _check(n, c, k)
    return Fraction(math.comb(c, k), math.comb(n, k))


def pass_at_k(n: int, c: int, k: int) -> Fraction:
    """pass@k: the chance that at least one of k tries drawn from n passes, 1 - C(n-c,k)/C(n,k)."""
    _check(n, c, k)
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def _check(n: int, c: int, k: int) -> None:
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile by linear interpolation between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def agent_seconds(events: Sequence[Mapping[str, Any]]) -> float | None:
    """The agent phase's wall time: from the end of setup to ``agent_finished``; None if unseen."""
    start = end = None
    for event in events:
        if not isinstance(event, Mapping) or not isinstance(event.get("mono"), int | float):
            continue
        kind = event.get("kind")
        if kind in ("sandbox_started", "affordance_probe") or (kind == "command" and event.get("source") == "setup"):
            start = event["mono"]
        elif kind == "agent_finished":
            end = event["mono"]
            break
    return None if start is None or end is None else max(0.0, end - start)


@dataclass(frozen=True, kw_only=True)
class Spread:
    median: float | None
    p90: float | None


def spread(values: Sequence[float]) -> Spread:
    return Spread(median=statistics.median(values) if values else None, p90=quantile(values, 0.9))


@dataclass(frozen=True, kw_only=True)
class Figures:
    """One task's (or the sweep's) figures over its evidential runs; None means unknown."""

    task: str
    evidential: int
    passed: int
    pass_hat: tuple[tuple[int, float], ...]
    pass_at: tuple[tuple[int, float], ...]
    wall_s: Spread
    agent_s: Spread
    tokens_per_success: float | None
    spend_per_success: Decimal | None
    commands_per_run: float | None
    failed_command_share: float | None


KS = (1, 2, 4, 8)


def _usage(record: RunRecord, key: str) -> Any:
    usage = record.extra.get("usage") if isinstance(record.extra, Mapping) else None
    return usage.get(key) if isinstance(usage, Mapping) else None


def _tokens_of(record: RunRecord) -> int | None:
    usage = record.extra.get("usage")
    if not usage and record.spent() == 0:
        return 0  # as ``spent``: no model (replay), or no agent call was made
    ins, outs = _usage(record, "input_tokens"), _usage(record, "output_tokens")
    return ins + outs if isinstance(ins, int) and isinstance(outs, int) else None


def figures(task: str, runs: Sequence[RunTrace]) -> Figures:
    """The figures of ``runs`` taken together (one task, or a whole sweep's runs)."""
    ev = [r for r in runs if r.record.evidential]
    n, c = len(ev), sum(1 for r in ev if r.record.classification is Classification.PASSED)
    passing = [r for r in ev if r.record.classification is Classification.PASSED]
    agent = [agent_seconds(r.events) for r in passing if r.events is not None]
    tokens = [_tokens_of(r.record) for r in ev]
    spends = [r.record.spent() for r in ev]
    traced = [calls(r.events)[0] for r in ev if r.events is not None]
    ran = [call for run_calls in traced for call in run_calls]
    return Figures(
        task=task, evidential=n, passed=c,
        pass_hat=tuple((k, float(pass_hat_k(n, c, k))) for k in KS if k <= n),
        pass_at=tuple((k, float(pass_at_k(n, c, k))) for k in KS if k <= n),
        wall_s=spread([r.record.duration_s for r in passing]),
        # A passing run whose trace is missing leaves the agent phase unknown, not shorter.
        agent_s=spread([a for a in agent if a is not None]) if len(agent) == len(passing) and None not in agent
        else Spread(median=None, p90=None),
        tokens_per_success=sum(t for t in tokens if t is not None) / c if c and None not in tokens else None,
        spend_per_success=(sum((s for s in spends if s is not None), Decimal(0)) / c
                           if c and None not in spends else None),
        commands_per_run=sum(r.record.commands for r in ev) / n if n else None,
        failed_command_share=(sum(1 for call in ran if _failed(call)) / len(ran)
                              if ran and len(traced) == n else None),
    )


def sweep_figures(runs: Sequence[RunTrace], *, label: str = "all tasks") -> Figures:
    """The sweep's figures: times, tokens, spend and commands over all its evidential runs;
    pass^k and pass@k the mean over its tasks, as tau-bench averages, for each k that every
    task with evidence has at least k evidential runs for."""
    pooled = figures(label, runs)
    per_task: dict[str, list[RunTrace]] = {}
    for run in runs:
        per_task.setdefault(run.record.task, []).append(run)
    tasks = [figures(task, task_runs) for task, task_runs in per_task.items()]

    def mean(which: str, k: int) -> float | None:
        values = [dict(getattr(t, which))[k] for t in tasks if t.evidential >= k]
        return sum(values) / len(values) if values else None

    # Only a k every task with evidence reaches: a mean over fewer tasks for a
    # larger k would compare different tasks, and could exceed pass^1.
    judged = [t for t in tasks if t.evidential]
    ks = [k for k in KS if judged and all(t.evidential >= k for t in judged)]
    return Figures(
        task=label, evidential=pooled.evidential, passed=pooled.passed,
        pass_hat=tuple((k, v) for k in ks if (v := mean("pass_hat", k)) is not None),
        pass_at=tuple((k, v) for k in ks if (v := mean("pass_at", k)) is not None),
        wall_s=pooled.wall_s, agent_s=pooled.agent_s, tokens_per_success=pooled.tokens_per_success,
        spend_per_success=pooled.spend_per_success, commands_per_run=pooled.commands_per_run,
        failed_command_share=pooled.failed_command_share,
    )


# --- arms ---------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ArmPair:
    """Two arms on one task: Fisher's test as ``diff`` runs it, ``first`` as BEFORE."""

    first: str
    second: str
    comparison: TaskComparison


@dataclass(frozen=True, kw_only=True)
class ArmsMatrix:
    """Each arm's pass rate on each task (None: the arm did not run it), and every pair compared."""

    arms: tuple[str, ...]
    tasks: tuple[str, ...]
    rates: tuple[tuple[PassRate | None, ...], ...]
    totals: tuple[PassRate, ...]
    pairs: tuple[ArmPair, ...]
    smallest_sample: int


def arms_matrix(arms: Sequence[tuple[str, Sequence[RunRecord]]], *, alpha: float = ALPHA) -> ArmsMatrix:
    """The arm x task matrix of pass rates with Wilson intervals, and Fisher's test per task
    between each pair of arms (in the order given); tasks in the order they first appear."""
    tasks = list(dict.fromkeys(r.task for _, records in arms for r in records))
    grouped = [by_task(records) for _, records in arms]
    pairs = []
    for i, (first, before) in enumerate(arms):
        for second, after in arms[i + 1:]:
            pairs += [ArmPair(first=first, second=second, comparison=c)
                      for c in compare(before, after, alpha=alpha).tasks
                      if c.before is not None and c.after is not None]
    return ArmsMatrix(
        arms=tuple(name for name, _ in arms), tasks=tuple(tasks),
        rates=tuple(tuple(pass_rate(g[t], task=t) if t in g else None for t in tasks) for g in grouped),
        totals=tuple(pass_rate(records) for _, records in arms),
        pairs=tuple(pairs), smallest_sample=smallest_sample(alpha),
    )
