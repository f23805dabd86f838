"""Judging a task before it runs: the mistakes that give a wrong number rather than a low one.

Guarantee: an error-level finding means the task cannot produce evidence (no
criterion at all, a ``serve`` nothing checks, a check that passes every run),
and ``load_task`` refuses such a task. A warning names a way the result can be
wrong (a forgotten or masked failure, a docs host that shadows the shell's
allow-list, a replay step the task's own permission rules refuse, ...). Every
finding names a file and line: the task file, or the ``success.file``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

import httpx

from firstrun.errors import PolicyError
from firstrun.policy.hosts import HostPattern, canonical_host
from firstrun.policy.network import DEFAULT_ALLOW
from firstrun.policy.permissions import BASH, READ_DOCS, PermissionMode, PermissionVerdict, decide
from firstrun.tasks import shell
from firstrun.tasks.compile import covering
from firstrun.tasks.model import CheckIsolation, HostEntry, KeyPath, Success, Task, host_entry

MAX_REDIRECTS = 10


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    # Says what an entry does, for the author reading validate's output; never a fault.
    NOTE = "note"


class Code(StrEnum):
    """Stable keys for findings; tools filter on these, so never rename one."""

    INVALID_TASK = "invalid_task"
    NO_SUCH_PATH = "no_such_path"
    DUPLICATE_NAME = "duplicate_name"
    NO_CRITERION = "no_criterion"
    SERVE_WITHOUT_CRITERION = "serve_without_criterion"
    CHECK_ALWAYS_PASSES = "check_always_passes"
    FAILURE_IGNORED = "failure_ignored"
    FAILURE_MASKED = "failure_masked"
    UNPREPARED_ENV = "unprepared_env"
    DOCS_ROUTE_OUTSIDE_ALLOW = "docs_route_outside_allow"
    DOCS_HOST_SHADOWS_SHELL = "docs_host_shadows_shell"
    NETWORK_ALLOW_UNUSED = "network_allow_unused"
    DOCS_UNREACHABLE = "docs_unreachable"
    DOCS_REDIRECT_OUTSIDE_ALLOW = "docs_redirect_outside_allow"
    SCAFFOLD_UNEDITED = "scaffold_unedited"
    CHECK_DRAFTED = "check_drafted"
    REPLAY_REFUSED = "replay_refused_by_permissions"
    CHECK_SHARED = "check_shares_agent_processes"
    TCP_RULE = "tcp_rule"
    # Judged against the route's pages (``firstrun.cli.route_check``), when they can be read.
    REPLAY_DRIFT = "replay_drift"
    REPLAY_NEEDS_INPUT = "replay_needs_input"
    REPLAY_NOTHING_TO_RUN = "replay_nothing_to_run"
    REPLAY_NO_SUCH_BLOCK = "replay_no_such_block"
    REPLAY_STEPS = "replay_steps"
    ROUTE_NOT_READ = "route_not_read"


# What ``firstrun init`` writes where the author must put their own words; a
# task still holding it has a placeholder goal or a check that fails every run.
SCAFFOLD_MARKER = "EDIT ME (firstrun init)"

# The line ``firstrun init`` opens a drafted check with, naming the digest of
# the check as drafted: while the check still has that digest, nobody has read
# and edited it, and ``validate`` says so.
DRAFTED = re.compile(r"^# drafted by firstrun init \(([0-9a-f]{16})\)", re.MULTILINE)


def drafted_digest(success: Success) -> str:
    """The digest of a check, its drafted-by line left out (so the line can carry it)."""
    data = success.model_dump(mode="json")
    if data.get("script"):
        data["script"] = DRAFTED.sub("", data["script"])
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class Finding:
    severity: Severity
    code: Code
    message: str
    file: str
    line: int | None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.severity}: {self.message} [{self.code}]"

    def to_data(self) -> dict[str, object]:
        return {"severity": self.severity.value, "code": self.code.value, "message": self.message,
                "file": self.file, "line": self.line}

    def github_annotation(self) -> str:
        """The finding as a GitHub Actions workflow command, which annotates the file's line."""
        level = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "notice"}
        where = [f"file={gh_property(self.file)}"]
        if self.line is not None:
            where.append(f"line={self.line}")
        where.append(f"title={gh_property(str(self.code))}")
        return f"::{level[self.severity]} {','.join(where)}::{gh_data(self.message)}"


# GitHub's escaping for workflow commands: a message may not hold a newline,
# and a property may not hold the separators ':' and ',' either.
def gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def gh_property(text: str) -> str:
    return gh_data(text).replace(":", "%3A").replace(",", "%2C")


def lint_task(task: Task) -> list[Finding]:
    """Every finding about ``task``, in file order within each kind."""
    return [
        *_criteria(task),
        *_isolation(task),
        *_check_script(task),
        *_environments(task),
        *_hosts(task),
        *_scaffold(task),
        *_drafted(task),
        *_permissions(task),
        *_tcp_rules(task),
    ]


def _at(task: Task, severity: Severity, code: Code, message: str, path: KeyPath) -> Finding:
    return Finding(
        severity=severity,
        code=code,
        message=message,
        file=task.path,
        line=task.locations.line(path),
    )


def _scaffold(task: Task) -> list[Finding]:
    """A placeholder ``firstrun init`` wrote and nobody replaced.

    A warning, not an error: the scaffold must load so its author can try it,
    and its check fails every run until edited, so it cannot pass silently.
    """
    findings = []
    if SCAFFOLD_MARKER in task.spec.goal:
        findings.append(
            _at(
                task,
                Severity.WARNING,
                Code.SCAFFOLD_UNEDITED,
                "the goal is still firstrun init's placeholder; say what a reader ends up with",
                ("goal",),
            )
        )
    at = task.check.find(SCAFFOLD_MARKER)
    if at >= 0:
        file, line = _check_line(task, task.check.count("\n", 0, at))
        findings.append(
            Finding(
                severity=Severity.WARNING,
                code=Code.SCAFFOLD_UNEDITED,
                message="the check is still firstrun init's placeholder, which fails every run; "
                "write the check that proves the quickstart worked",
                file=file,
                line=line,
            )
        )
    return findings


def _drafted(task: Task) -> list[Finding]:
    """A check ``firstrun init`` drafted that nobody has edited since: it runs, but it says
    what the docs showed, not what the goal needs."""
    found = DRAFTED.search(task.check)
    if found is None or found.group(1) != drafted_digest(task.spec.success):
        return []
    file, line = _check_line(task, task.check.count("\n", 0, found.start()))
    return [Finding(severity=Severity.WARNING, code=Code.CHECK_DRAFTED, file=file, line=line,
                    message="the check is as firstrun init drafted it from the docs' output and "
                    "files; read it, make it prove the goal, and this warning goes")]


def _permissions(task: Task) -> list[Finding]:
    """A route page or replay step the task's own permission rules refuse.

    Replay stops there and the run is ``skipped``: the task forbids what its
    docs tell a reader to do, so replay can never say anything about them.
    A warning, because a model agent may still find another way.
    """
    rules = task.permissions
    if not rules.rules:
        return []
    calls = [(READ_DOCS, url, key, f"route page {url}")
             for url, key in zip(task.docs_route, _route_keys(task), strict=True)]
    calls += [(BASH, step.run, ("replay", i), f"replay step {i + 1}")
              for i, step in enumerate(task.spec.replay_steps)]
    findings = []
    for tool, argument, key, what in calls:
        decision = decide([rules], tool=tool, argument=argument, mode=PermissionMode.UNATTENDED)
        if decision.verdict is not PermissionVerdict.ALLOW:
            findings.append(_at(task, Severity.WARNING, Code.REPLAY_REFUSED,
                                f"{what} is not allowed ({decision.explain()}): --agent "
                                "replay stops there and the run is skipped", key))
    return findings


def _declarative(task: Task) -> bool:
    success = task.spec.success
    return success.wait_http is not None or success.expect_output is not None


def _criteria(task: Task) -> list[Finding]:
    success = task.spec.success
    if success.serve is not None and not (_declarative(task) or task.check):
        return [
            _at(
                task,
                Severity.ERROR,
                Code.SERVE_WITHOUT_CRITERION,
                "success.serve starts a server but nothing checks it, so any server that "
                "boots would pass; add wait_http, expect_output or a script",
                ("success", "serve"),
            ),
        ]
    if not (_declarative(task) or task.check):
        return [
            _at(
                task,
                Severity.ERROR,
                Code.NO_CRITERION,
                "success has no criterion; give it a script, a file, wait_http or expect_output",
                ("success",),
            ),
        ]
    return []


def _tcp_rules(task: Task) -> list[Finding]:
    return [
        _at(task, Severity.NOTE, Code.TCP_RULE,
            f"{entry}: a stream that is neither TLS nor HTTP (ssh, git://, a database "
            "protocol) may reach exactly this name and port, from any client, after the address "
            "floor; every other such stream is refused (tcp_not_allowed), and this one is "
            "recorded with its bytes and duration",
            ("firstrun", "network", "tcp", index))
        for index, entry in enumerate(task.spec.firstrun.network.tcp)
    ]


def _isolation(task: Task) -> list[Finding]:
    if task.spec.success.isolation() is not CheckIsolation.SHARED:
        return []
    return [
        _at(
            task,
            Severity.WARNING,
            Code.CHECK_SHARED,
            "success.wait_http polls a local server but nothing in success starts one, so it "
            "can only reach a server the agent left running: the check then runs beside the "
            "agent's processes, which could forge what it sees (the run records "
            "check_isolation: shared); start the server with success.serve so the check runs "
            "clean",
            ("success", "wait_http"),
        ),
    ]


def _check_line(task: Task, offset: int) -> tuple[str, int]:
    """File and line of line ``offset`` (0-based) of the check text."""
    if task.check_path is not None:
        return task.check_path, offset + 1
    return task.path, task.locations.content_line(("success", "script"), offset)


_SHELL_CODES = {
    shell.Problem.IGNORED: Code.FAILURE_IGNORED,
    shell.Problem.MASKED: Code.FAILURE_MASKED,
}


# Precise rather than exhaustive: ``firstrun.tasks.shell`` reports only what
# follows from bash's rules, so a warning here is one worth reading.
def _check_script(task: Task) -> list[Finding]:
    if not task.check:
        return []
    findings = []
    for issue in shell.analyse(task.check):
        if issue.problem is shell.Problem.ALWAYS_PASSES:
            # Beside wait_http or expect_output the script is an extra; they decide.
            if _declarative(task):
                continue
            file, line = _check_line(task, 0)
            if task.check_path is None:
                line = task.locations.line(("success", "script"))
            findings.append(
                Finding(
                    severity=Severity.ERROR,
                    code=Code.CHECK_ALWAYS_PASSES,
                    message=issue.message,
                    file=file,
                    line=line,
                )
            )
            continue
        file, line = _check_line(task, issue.line - 1)
        findings.append(
            Finding(
                severity=Severity.WARNING,
                code=_SHELL_CODES[issue.problem],
                message=issue.message,
                file=file,
                line=line,
            )
        )
    return findings


# A relative ``X/bin/`` the check runs from; an absolute one is the system's.
_ENV_BIN = re.compile(r"(?<![\w./$}-])(?:\./)?([\w.-]+)/bin/")
# Tools that create ``.venv`` without the name appearing in the command.
_CREATES_DOT_VENV = re.compile(
    r"\buv\s+(?:venv|sync|init|add|run|pip\s+install)\b|\bpoetry\s+install\b"
)


def _environments(task: Task) -> list[Finding]:
    """A check that needs ``X/bin/`` when nothing the task runs creates ``X``.

    Then an agent that names its environment differently (``venv``, ``env``)
    fails a check it should have passed, and the run is recorded as a gap
    in the docs. Under ``replay: docs`` the commands are the pages' own,
    which this lint does not read, so it has nothing to judge by.
    """
    if not task.check or task.spec.replay_docs is not None:
        return []
    promised = "\n".join((*task.spec.setup, *(step.run for step in task.spec.replay_steps)))
    findings = []
    reported: set[str] = set()
    for match in _ENV_BIN.finditer(task.check):
        directory = match.group(1)
        if directory in (".", "..") or directory in reported:
            continue
        if re.search(rf"(?<![\w.-]){re.escape(directory)}(?![\w.-])", promised):
            continue
        if directory == ".venv" and _CREATES_DOT_VENV.search(promised):
            continue
        reported.add(directory)
        file, line = _check_line(task, task.check.count("\n", 0, match.start()))
        findings.append(
            Finding(
                severity=Severity.WARNING,
                code=Code.UNPREPARED_ENV,
                message=(
                    f"the check runs {directory}/bin/, which neither setup nor replay creates; "
                    f"an agent that names its environment differently fails it"
                ),
                file=file,
                line=line,
            )
        )
    return findings


def _patterns(entries: tuple[HostEntry, ...]) -> list[HostPattern]:
    return [p for e in entries for p in covering(e.pattern)]


def _host_port(url: str) -> tuple[str, int] | None:
    parts = urlsplit(url)
    try:
        host = canonical_host(parts.hostname or "")
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except (PolicyError, ValueError):
        return None
    return host, port


def _route_keys(task: Task) -> list[KeyPath]:
    docs = task.spec.docs
    if docs.path is not None:
        return [("docs", "path", i) for i in range(len(docs.path))]
    return [("docs", "entrypoint")]


def _hosts(task: Task) -> list[Finding]:
    findings = []
    docs = task.spec.docs
    if docs.allow:
        allowed = _patterns(docs.allow)
        for key, page in zip(_route_keys(task), docs.route, strict=True):
            target = _host_port(page)
            if target is not None and not any(p.matches(*target) for p in allowed):
                findings.append(
                    _at(
                        task,
                        Severity.WARNING,
                        Code.DOCS_ROUTE_OUTSIDE_ALLOW,
                        f"{host_entry(page)} is on the documented route but not under "
                        "docs.allow; it is a docs host all the same (check for a typo)",
                        key,
                    )
                )
    network = task.spec.network
    shell_entries = [(e, ("network", "only", i)) for i, e in enumerate(network.only or ())] or [
        *((e, None) for e in DEFAULT_ALLOW),
        *((e, ("network", "allow", i)) for i, e in enumerate(network.allow)),
    ]
    docs_entries = [
        (host_entry(p), k) for k, p in zip(_route_keys(task), docs.route, strict=True)
    ]
    docs_entries += [(e, ("docs", "allow", i)) for i, e in enumerate(docs.allow)]
    shadowed: set[str] = set()
    for entry, key in docs_entries:
        covered = _patterns((entry,))
        for shell_entry, shell_key in shell_entries:
            shell_host = HostPattern.parse(shell_entry).host
            if shell_host in shadowed or not any(p.matches_host(shell_host) for p in covered):
                continue
            shadowed.add(shell_host)
            if shell_key is None:
                message = (f"docs host {entry} covers {shell_host}, a default registry; docs hosts "
                           "are refused on the shell, so commands cannot reach it")
            else:
                message = (f"docs host {entry} covers {shell_host}, named under network; the shell "
                           "may reach it, so pages read that way are missing from the record "
                           "(each request is recorded as allowed_docs_host_on_shell)")
            findings.append(_at(task, Severity.WARNING, Code.DOCS_HOST_SHADOWS_SHELL, message, key))
    if network.only and network.allow:
        findings.append(
            _at(
                task,
                Severity.WARNING,
                Code.NETWORK_ALLOW_UNUSED,
                "network.allow is not used because network.only replaces the whole list; "
                "move its hosts into network.only",
                ("network", "allow"),
            )
        )
    return findings


def check_urls(task: Task, client: httpx.Client) -> list[Finding]:
    """A finding for each page of the documented route that does not answer 2xx."""
    docs_patterns = _patterns(task.docs_hosts)
    findings = []
    for key, page in zip(_route_keys(task), task.docs_route, strict=True):
        problem, code = _probe(page, client, docs_patterns)
        if problem is not None:
            findings.append(_at(task, Severity.ERROR, code, f"{page}: {problem}", key))
    return findings


# Redirects are followed one hop at a time and the walk stops before any hop
# that leaves the documentation hosts, exactly as ``read_docs`` would refuse it.
def _probe(url: str, client: httpx.Client, allowed: list[HostPattern]) -> tuple[str | None, Code]:
    for _ in range(MAX_REDIRECTS + 1):
        try:
            response = _fetch(client, url)
        except httpx.HTTPError as exc:
            return f"unreachable ({type(exc).__name__}: {exc})", Code.DOCS_UNREACHABLE
        if response.is_redirect:
            location = response.headers.get("location", "")
            nxt = str(response.url.join(location))
            target = _host_port(nxt)
            if target is None or not any(p.matches(*target) for p in allowed):
                return (
                    f"redirects to {nxt}, outside the docs hosts, which read_docs refuses",
                    Code.DOCS_REDIRECT_OUTSIDE_ALLOW,
                )
            url = nxt
            continue
        if response.is_success:
            return None, Code.DOCS_UNREACHABLE
        return f"answered HTTP {response.status_code}", Code.DOCS_UNREACHABLE
    return f"more than {MAX_REDIRECTS} redirects", Code.DOCS_UNREACHABLE


def _fetch(client: httpx.Client, url: str) -> httpx.Response:
    # HEAD first, to spare the site a page; some servers refuse HEAD, so a
    # refusal is asked again with GET before it counts.
    response = client.request("HEAD", url, follow_redirects=False)
    if response.status_code < 400:
        return response
    with client.stream("GET", url, follow_redirects=False) as streamed:
        return streamed
