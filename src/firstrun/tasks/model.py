"""The task file model: every field of quickstarted's task format, plus firstrun's own.

Guarantee: a ``TaskSpec`` exists only if the file meant one thing: unknown keys
are refused at every level, every host entry is a pattern the policy layer
accepts (so ``*.com`` never reaches a proxy), and every pattern a check greps
for asserts something. A file quickstarted accepts means the same thing here.
Models are frozen and hold tuples, so a loaded task cannot change under a run;
the same classes generate the JSON Schema, so schema and loader cannot disagree.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    NonNegativeInt,
    PositiveInt,
    Tag,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from firstrun.errors import PolicyError
from firstrun.policy.hosts import HostPattern
from firstrun.policy.images import image_reference_error
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import parse_tcp_rules
from firstrun.policy.permissions import TOOLS, PermissionVerdict, RuleSet, parse_rule
from firstrun.policy.process import DEFAULT_DISK_MB, MAX_COMMAND_TIMEOUT_S, MIN_DISK_MB
from firstrun.tasks.mutation import Mutation

RULE = "task_rule"

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


def rule(detail: str, *, key: str = "") -> PydanticCustomError:
    """A task rule broken; ``key`` names the offending key inside the model, if any.

    The loader reads ``key`` from the error's context to point at that key's
    line rather than its parent's.
    """
    return PydanticCustomError(RULE, "{detail}", {"detail": detail, "key": key})


# quickstarted's reading, kept: a key given as null counts as absent, and so
# does a blank ``script``, ``file`` or ``serve``. Cross-field judgements that
# are not about the file's shape (a ``serve`` nothing checks, a check that
# cannot fail) live in ``firstrun.tasks.lint``, so ``validate`` can report all
# of them at once.
class _Model(BaseModel):
    # Numbers become strings where a string is expected (``name: 2048``),
    # which is what quickstarted's loader did with str().
    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)

    # Keys that must not be null: quickstarted once dropped ``wait_http:``
    # with nothing under it, and the task then asserted less than it said.
    _null_is_error: ClassVar[frozenset[str]] = frozenset()
    # Keys whose blank string means "not given".
    _blank_is_absent: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _absent_values(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        kept = {}
        for key, value in data.items():
            if value is None:
                if key in cls._null_is_error:
                    raise rule("empty; give it something to assert", key=key)
                continue
            if key in cls._blank_is_absent and isinstance(value, str) and not value.strip():
                continue
            kept[key] = value
        return kept


class HostEntry(str):
    """A host entry as the task file holds it, normalised: the text lint, the schema and
    the records read, carrying the pattern it was parsed into at load, which compile
    hands the policy as is."""

    pattern: HostPattern

    def __new__(cls, text: str, pattern: HostPattern) -> HostEntry:
        made = super().__new__(cls, text)
        made.pattern = pattern
        return made

    def __reduce__(self) -> tuple[object, ...]:
        # A task crosses to a Ray node pickled; str's own reduction would drop the pattern.
        return (HostEntry, (str(self), self.pattern))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_host_entry, handler(str))


def host_entry(raw: str) -> HostEntry:
    """One host entry, as quickstarted wrote them: a bare name, or a URL whose host is kept.

    A port written in a URL is kept, because a docs site on a non-default
    port is a different destination. Raises ValueError for anything that is
    not a host pattern the policy layer accepts.
    """
    text = raw.strip()
    if "://" in text:
        text = urlsplit(text).netloc.rsplit("@", 1)[-1]
    text = text.strip("/").lower()
    if not text or "/" in text:
        raise ValueError(f"must be a bare host name, got {raw!r}")
    try:
        return HostEntry(text, HostPattern.parse(text))
    except PolicyError as exc:
        raise ValueError(exc.args[0]) from None


def _host_entry(value: str) -> HostEntry:
    try:
        return host_entry(value)
    except ValueError as exc:
        raise rule(str(exc)) from None


def _tcp_rule(value: str) -> HostEntry:
    try:
        (pattern,) = parse_tcp_rules([value], source="tcp")
    except PolicyError as exc:
        raise rule(exc.args[0].removeprefix("tcp: ")) from None
    return HostEntry(value.strip(), pattern)


TcpRule = Annotated[str, AfterValidator(_tcp_rule),
                    WithJsonSchema({"type": "string", "pattern": r"^[^*\s]+:[0-9]{1,5}$"})]


def _http_url(value: str) -> str:
    url = value.strip()
    if urlsplit(url).scheme not in ("http", "https"):
        raise rule(f"must be an http(s) URL, got {value!r}")
    try:
        host_entry(url)
    except ValueError as exc:
        raise rule(f"{value!r}: {exc}") from None
    return url


def _network_cidr(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError as exc:
        raise rule(str(exc)) from None


def _commands(value: tuple[str, ...]) -> tuple[str, ...]:
    # As quickstarted: surrounding whitespace dropped, blank commands skipped.
    return tuple(c.strip() for c in value if c.strip())


def _one_or_many(value: Any) -> Any:
    return value if isinstance(value, list | tuple) else (value,)


def _pattern(item: str) -> str:
    # A block scalar ends in a newline; that newline is YAML's, not the author's.
    text = item.strip("\n")
    if not text:
        raise rule("an empty pattern matches anything, so it asserts nothing")
    if "\n" in text:
        raise rule(
            "a pattern spans several lines, which grep reads as alternatives; "
            "list each line separately"
        )
    return text


def _json_pairs(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(value.items())
    raise rule("expected a mapping of key: value")


def _name(value: str) -> str:
    if not re.match(NAME_PATTERN, value):
        raise rule(
            "a task name may hold letters, digits, '.', '_' and '-' and starts with a letter "
            f"or digit (it names output directories), got {value!r}"
        )
    return value


def _image(value: str | None) -> str | None:
    if value is not None and (why := image_reference_error(value)) is not None:
        raise rule(why)
    return value


def _non_blank(value: str) -> str:
    if not value.strip():
        raise rule("must not be empty")
    return value


HttpUrl = Annotated[
    str, AfterValidator(_http_url), Field(json_schema_extra={"pattern": "^https?://"})
]
Commands = Annotated[tuple[str, ...], AfterValidator(_commands)]
Patterns = Annotated[
    tuple[Annotated[str, AfterValidator(_pattern)], ...],
    BeforeValidator(_one_or_many),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
]
JsonScalar = str | int | float | bool | None
JsonPairs = Annotated[
    tuple[tuple[str, JsonScalar], ...],
    BeforeValidator(_json_pairs),
    WithJsonSchema(
        {
            "type": "object",
            "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
        }
    ),
]


class Docs(_Model):
    """Where the documentation lives: the route a reader takes, and the hosts it spans."""

    entrypoint: HttpUrl | None = Field(
        None, description="The first page, when the route is one page. Same as a one-item 'path'."
    )
    path: tuple[HttpUrl, ...] | None = Field(
        None, description="The documented route, in the order a reader takes it."
    )
    allow: tuple[HostEntry, ...] = Field(
        (),
        description=(
            "Further documentation hosts; each covers itself and its subdomains. The hosts "
            "of the route are included on their own. Documentation hosts are readable only "
            "through read_docs: the shell is refused them, so every page read is recorded."
        ),
    )

    _blank_is_absent: ClassVar[frozenset[str]] = frozenset({"entrypoint"})

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [{"required": ["path"]}, {"required": ["entrypoint"]}],
            "not": {"required": ["path", "entrypoint"]},
        }
    )

    @model_validator(mode="after")
    def _one_route(self) -> Docs:
        if self.entrypoint is not None and self.path is not None:
            raise rule(
                "'path' and 'entrypoint' are both given; put the entrypoint first in 'path'",
                key="entrypoint",
            )
        if self.path is None and self.entrypoint is None:
            raise rule("docs needs 'path' (or 'entrypoint')")
        if self.path is not None:
            if not self.path:
                raise rule("docs.path is empty", key="path")
            seen: set[str] = set()
            for page in self.path:
                if page in seen:
                    raise rule(f"docs.path lists {page!r} twice", key="path")
                seen.add(page)
        return self

    @property
    def route(self) -> tuple[str, ...]:
        if self.path is not None:
            return self.path
        assert self.entrypoint is not None
        return (self.entrypoint,)


class Network(_Model):
    """Hosts the shell may reach, in quickstarted's terms."""

    allow: tuple[HostEntry, ...] = Field(
        (),
        description=(
            "Added to the default package registries. Each entry covers itself and its subdomains."
        ),
    )
    only: tuple[HostEntry, ...] | None = Field(
        None,
        description=(
            "Replaces the default registries (and then 'allow' is not used). An empty list "
            "means the defaults, as in quickstarted."
        ),
    )


class Budgets(_Model):
    """Limits on the agent phase; running out classifies the run budget_exhausted."""

    max_turns: PositiveInt = Field(20, description="Tool-use rounds.")
    max_seconds: PositiveInt = Field(480, description="Wall clock for the agent phase.")
    max_command_seconds: PositiveInt = Field(
        300, le=int(MAX_COMMAND_TIMEOUT_S), description="Timeout for one command (at most a week)."
    )
    max_output_chars: PositiveInt = Field(
        20_000, description="Output kept per command; head and tail survive."
    )
    max_tokens: NonNegativeInt = Field(0, description="Billable tokens for the run; 0 is no limit.")
    max_disk_mb: NonNegativeInt = Field(
        DEFAULT_DISK_MB,
        description=f"Size of the workspace's own filesystem in MiB (at least {MIN_DISK_MB}); "
                    "past it writes fail with ENOSPC. 0 is no bound.",
    )

    @model_validator(mode="after")
    def _disk(self) -> Budgets:
        if 0 < self.max_disk_mb < MIN_DISK_MB:
            raise rule(f"must be 0 (no bound) or at least {MIN_DISK_MB} MiB, got {self.max_disk_mb}",
                       key="max_disk_mb")
        return self

    @property
    def disk_asked(self) -> bool:
        """Whether the task itself named a disk bound, rather than taking the default."""
        return "max_disk_mb" in self.model_fields_set


class WaitHttp(_Model):
    """Poll a server until it answers as the task says it should."""

    path: str | None = Field(None, description="Resolved against http://127.0.0.1:$QS_PORT.")
    url: HttpUrl | None = Field(None, description="A full URL instead; wins over 'path'.")
    status: int = Field(200, ge=100, le=599, description="The status the answer must carry.")
    contains: Patterns = Field((), description="Literal text the body must contain.")
    matches: Patterns = Field((), description="Extended regular expressions the body must match.")
    json_pairs: JsonPairs = Field(
        (),
        alias="json",
        description=(
            "key: value pairs the body must carry, matched as text (tolerant of spacing "
            "and quoting), not parsed."
        ),
    )
    timeout: PositiveInt = Field(40, description="Seconds to keep polling.")

    _blank_is_absent: ClassVar[frozenset[str]] = frozenset({"path", "url"})

    @model_validator(mode="after")
    def _target(self) -> WaitHttp:
        if self.path is None and self.url is None:
            raise rule("wait_http needs 'path' or 'url'")
        return self


class ExpectOutput(_Model):
    """Assert on what the run's successful commands printed."""

    contains: Patterns = Field((), description="Literal text the output must contain.")
    matches: Patterns = Field((), description="Extended regular expressions it must match.")

    @model_validator(mode="after")
    def _something(self) -> ExpectOutput:
        if not (self.contains or self.matches):
            raise rule("expect_output needs 'contains' or 'matches'")
        return self


class CheckIsolation(StrEnum):
    """Whether the success check runs alone or beside what the agent left running."""

    # Every setup and agent process was killed first: nothing can race or read the check.
    CLEAN = "clean"
    # The check polls a local server the agent started (wait_http, no serve), so the
    # agent's processes live on beside it, and could forge what it sees.
    SHARED = "shared"


def _loopback_host(host: str | None) -> bool:
    if host is None:
        return False
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback or name in ("0.0.0.0", "::")
    except ValueError:
        return False


class Success(_Model):
    """What decides the verdict: the harness owns the mechanism, the task every criterion."""

    script: str | None = Field(None, description="Shell run after the agent stops; exit 0 passes.")
    file: str | None = Field(
        None,
        description=(
            "A shell file to run instead of 'script', relative to the task file. Read when "
            "the task loads and never written into the workspace, so the agent cannot read it."
        ),
    )
    serve: str | None = Field(
        None,
        description=(
            "A long-running command the harness backgrounds before checking; $QS_PORT is "
            "the task's port. Needs a criterion beside it."
        ),
    )
    wait_http: WaitHttp | None = None
    expect_output: ExpectOutput | None = None

    _null_is_error: ClassVar[frozenset[str]] = frozenset({"wait_http", "expect_output"})
    _blank_is_absent: ClassVar[frozenset[str]] = frozenset({"script", "file", "serve"})

    model_config = ConfigDict(json_schema_extra={"not": {"required": ["script", "file"]}})

    def isolation(self) -> CheckIsolation:
        """``SHARED`` only for a local ``wait_http`` with no ``serve``: that server can only be
        one the agent left running (quickstarted allows such checks); every other check
        runs ``CLEAN``."""
        wait = self.wait_http
        if wait is None or self.serve is not None:
            return CheckIsolation.CLEAN
        local = wait.url is None or _loopback_host(urlsplit(str(wait.url)).hostname)
        return CheckIsolation.SHARED if local else CheckIsolation.CLEAN

    @model_validator(mode="after")
    def _script_or_file(self) -> Success:
        if self.script is not None and self.file is not None:
            raise rule("'script' and 'file' are both given; use one", key="file")
        if self.file is not None and self.file.startswith("/"):
            raise rule(
                f"success.file must be relative to the task file, got {self.file!r}", key="file"
            )
        return self


class Override(_Model):
    """An explicit exception: this host may reach these address ranges despite the floor."""

    host: HostEntry = Field(description="firstrun syntax: exact, or *.suffix, optional :port.")
    networks: tuple[Annotated[str, AfterValidator(_network_cidr)], ...] = Field(
        (), description="CIDR ranges the host may resolve to even though they are private."
    )


class FirstrunNetwork(_Model):
    deny: tuple[HostEntry, ...] = Field(
        (), description="firstrun syntax. Refused on the shell even when an allow entry covers it."
    )
    overrides: tuple[Override, ...] = Field(
        (), description="Recorded exceptions to the address floor."
    )
    tcp: tuple[TcpRule, ...] = Field(
        (),
        description=(
            "name:port pairs a raw TCP stream (neither TLS nor HTTP: ssh, git://, a database "
            "protocol) may reach, after the address floor; without one such a stream is "
            "refused (tcp_not_allowed). One exact name and one port each, e.g. github.com:22."
        ),
    )


def _permission_rules(verdict: PermissionVerdict) -> Any:
    """A list of ``verdict`` rules, each parsed at load so a bad one names its line."""

    def check(value: str) -> str:
        try:
            parse_rule(value, verdict=verdict)
        except PolicyError as exc:
            raise rule(exc.args[0]) from None
        return value

    schema = {"type": "string", "pattern": rf"^\s*({'|'.join(TOOLS)})(\(.*\S.*\))?\s*$"}
    return tuple[Annotated[str, AfterValidator(check), WithJsonSchema(schema)], ...]


AllowRules = _permission_rules(PermissionVerdict.ALLOW)
DenyRules = _permission_rules(PermissionVerdict.DENY)
AskRules = _permission_rules(PermissionVerdict.ASK)


class Permissions(_Model):
    """Rules over the agent's tool calls (``firstrun.policy.permissions``): a first,
    weak layer that sees only the call's text; the kernel layers carry the weight."""

    allow: AllowRules = Field(
        (),
        description=(
            "TOOL or TOOL(GLOB), e.g. read_docs(https://docs.example.com/*). An allow rule "
            "allow-lists its tool: that tool's other calls are refused."
        ),
    )
    deny: DenyRules = Field(
        (),
        description="Refused whatever else matches, e.g. bash(git push*).",
    )
    ask: AskRules = Field(
        (),
        description="Needs a yes from a person; runs are unattended, so refused.",
    )

    def rule_set(self, source: str, *, origin: Callable[[PermissionVerdict, int], str]) -> RuleSet:
        """The rules, deny then ask then allow; ``origin(verdict, index)`` says where each is."""
        return RuleSet(source=source, rules=tuple(
            parse_rule(text, verdict=verdict, origin=origin(verdict, index))
            for verdict, texts in ((PermissionVerdict.DENY, self.deny), (PermissionVerdict.ASK, self.ask),
                                   (PermissionVerdict.ALLOW, self.allow))
            for index, text in enumerate(texts)))


_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class MethodRule(_Model):
    """Opens methods beyond GET and HEAD at one host under TLS inspection (``--inspect-tls``)."""

    host: HostEntry = Field(description="firstrun syntax: exact, or *.suffix, optional :port.")
    methods: tuple[str, ...] = Field(description="e.g. [POST]; GET and HEAD are always allowed.")
    path: str = Field("/", description="Only paths starting with this prefix.")

    @model_validator(mode="after")
    def _parse(self) -> MethodRule:
        try:
            InspectionPolicy.build(rules=[(self.host.pattern, self.methods, self.path)])
        except PolicyError as exc:
            raise rule(exc.args[0]) from None
        return self


class Credential(_Model):
    """A secret the sandbox sees only as a placeholder; needs ``--inspect-tls``."""

    name: str = Field(description="The variable the sandbox gets (holding a placeholder).",
                      pattern=_ENV_NAME)
    host: HostEntry = Field(description="The only host the real value is sent to.")
    from_env: str = Field(description="firstrun's own variable holding the real value.",
                          pattern=_ENV_NAME)

    @model_validator(mode="after")
    def _parse(self) -> Credential:
        try:
            InspectionPolicy.build(credentials=[(self.name, self.host.pattern, self.from_env)])
        except PolicyError as exc:
            raise rule(exc.args[0], key="name") from None
        return self



def _isolation(value: object) -> object:
    # ``kernel`` names what is asked for, a kernel of the run's own; ``vm`` is
    # its first name, kept: both are the one requirement, saved as ``vm``.
    return "vm" if value == "kernel" else value


Isolation = Annotated[Literal["vm"], BeforeValidator(_isolation),
                      WithJsonSchema({"type": "string", "enum": ["kernel", "vm"]})]

# firstrun's own settings live under this one top-level key and use firstrun's
# host syntax (exact, or ``*.suffix``, optional ``:port``), so nothing in the
# shared fields changes meaning.
class Extensions(_Model):
    """Settings only firstrun understands; quickstarted has no such key."""

    network: FirstrunNetwork = FirstrunNetwork()
    permissions: Permissions = Field(
        Permissions(),
        description="Permission rules over the agent's bash and read_docs calls.",
    )
    methods: tuple[MethodRule, ...] = Field(
        (), description="With --inspect-tls every host is GET/HEAD only; these open more."
    )
    credentials: tuple[Credential, ...] = Field(
        (), description="Secrets swapped in by the proxy for their host only; need --inspect-tls."
    )
    isolation: Isolation | None = Field(
        None,
        description="kernel (or vm): run only where commands get a kernel of their own "
        "(--backend gvisor, or --backend microvm with KVM); any other backend is refused.",
    )


class ReplayStep(_Model):
    """One hand-written replay step; ``undocumented`` marks it as shown by no page, on purpose."""

    run: Annotated[str, AfterValidator(_non_blank)] = Field(description="The command, run under bash.")
    undocumented: Annotated[str, AfterValidator(_non_blank)] | None = Field(
        None,
        description="Why no page of the route shows this step. A step without it that matches "
        "no code block on the route is drift: 'validate' warns, and a replay run that meets it "
        "is not evidence about the docs.",
    )


class BlockRef(_Model):
    """One code block of the route: its page and its index among the page's blocks."""

    page: HttpUrl = Field(description="A page of docs.path (or docs.entrypoint).")
    block: NonNegativeInt = Field(description="The block's index on that page, counted from 0.")


def _string_pairs(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((str(k), v if isinstance(v, str) else str(v)) for k, v in value.items())
    raise rule("expected a mapping of NAME: value")


class DocsReplay(_Model):
    """``replay: docs``: the steps are the route's own code blocks, in route order."""

    source: Literal["docs"] = Field(alias="from", description="Where the steps come from.")
    values: Annotated[
        tuple[tuple[str, str], ...],
        BeforeValidator(_string_pairs),
        WithJsonSchema({"type": "object", "additionalProperties": {"type": "string"}}),
    ] = Field(
        (),
        description="A value for each placeholder the docs leave to the reader, by its name "
        "without <>, $ or braces (<your-api-key>: your-api-key; $OPENAI_API_KEY: "
        "OPENAI_API_KEY). A step with a placeholder given no value stops the run before it "
        "(needs_input).",
    )
    skip: tuple[BlockRef, ...] = Field((), description="Blocks of the route not to run.")

    model_config = ConfigDict(populate_by_name=True)

    def value(self, placeholder: str) -> str | None:
        """The value given for ``placeholder`` as a page writes it, or None."""
        name = placeholder_name(placeholder)
        return next((v for k, v in self.values if k == name), None)

    def skips(self, page: str, block: int) -> bool:
        return any(ref.page == page and ref.block == block for ref in self.skip)


def placeholder_name(placeholder: str) -> str:
    """A placeholder's name as ``replay.values`` keys it: without <>, $ or braces."""
    return placeholder.strip("<>").lstrip("$").strip("{}")


def _replay(value: Any) -> Any:
    if isinstance(value, str):
        return DocsReplay(source="docs")
    if isinstance(value, DocsReplay):
        return value
    # As quickstarted: surrounding whitespace dropped, blank commands skipped.
    return tuple(ReplayStep(run=step.strip()) if isinstance(step, str) else step
                 for step in value if not isinstance(step, str) or step.strip())


def _replay_form(value: Any) -> str:
    """Which form of ``replay`` this is, so an error speaks of that form alone."""
    if isinstance(value, str):
        return "replay-word"
    return "replay-docs" if isinstance(value, dict) else "replay-steps"


def _step_form(value: Any) -> str:
    return "replay-step" if isinstance(value, dict) else "replay-command"


def _docs_word(value: str) -> str:
    if value.strip() != "docs":
        raise rule(f"expected 'docs', a mapping {{from: docs, values, skip}} or a list of steps, "
                   f"got {value!r}")
    return value


# Union tags never shown: the loader drops them from an error's location.
UNION_TAGS = frozenset({"replay-word", "replay-docs", "replay-steps", "replay-step", "replay-command"})

Replay = Annotated[
    Annotated[str, AfterValidator(_docs_word), Tag("replay-word"),
              WithJsonSchema({"const": "docs", "type": "string"})]
    | Annotated[DocsReplay, Tag("replay-docs")]
    | Annotated[tuple[Annotated[Annotated[str, Tag("replay-command")]
                                | Annotated[ReplayStep, Tag("replay-step")],
                                Discriminator(_step_form)], ...], Tag("replay-steps")],
    Discriminator(_replay_form),
    AfterValidator(_replay),
]


class TaskSpec(_Model):
    """A task file: a goal reached from the documentation alone, and a check that decides."""

    name: Annotated[str, AfterValidator(_name)] = Field(
        json_schema_extra={"pattern": NAME_PATTERN},
        description="Identifier used in output paths and reports.",
    )
    goal: Annotated[str, AfterValidator(_non_blank)] = Field(
        description="The only instruction the agent receives."
    )
    docs: Docs
    success: Success
    setup: Commands = Field((), description="Commands run before the agent starts.")
    replay: Replay = Field(
        (),
        description=(
            "What --agent replay runs, in order; the first failure stops. 'docs' (or "
            "{from: docs, values, skip}): the route's own shell and file blocks. A list: "
            "hand-written commands, each a string or {run, undocumented}."
        ),
    )
    network: Network = Network()
    budgets: Budgets = Budgets()
    image: Annotated[str | None, AfterValidator(_image)] = Field(
        None, description="Container image for container backends, e.g. node:22-slim."
    )
    firstrun: Extensions = Field(
        Extensions(), description="firstrun's own settings, which quickstarted does not read."
    )

    _blank_is_absent: ClassVar[frozenset[str]] = frozenset({"image"})

    @model_validator(mode="after")
    def _skips_on_route(self) -> TaskSpec:
        if isinstance(self.replay, DocsReplay):
            route = self.docs.route
            for ref in self.replay.skip:
                if ref.page not in route:
                    raise rule(f"replay.skip names {ref.page}, which is not a page of docs.path",
                               key="replay")
        return self

    @property
    def replay_steps(self) -> tuple[ReplayStep, ...]:
        """The hand-written replay steps; none under ``replay: docs``."""
        return () if isinstance(self.replay, DocsReplay) else tuple(
            step for step in self.replay if isinstance(step, ReplayStep))

    @property
    def replay_docs(self) -> DocsReplay | None:
        """``replay: docs`` and its values and skips, or None for a hand-written replay."""
        return self.replay if isinstance(self.replay, DocsReplay) else None


KeyPath = tuple[str | int, ...]


@dataclass(frozen=True, kw_only=True)
class Locations:
    """Where each key of a task file sits, for errors and findings that name a line.

    ``keys`` maps a key path (``("success", "wait_http", "status")``, list
    items by index) to the 1-based line of that key. ``blocks`` maps the path
    of a literal block scalar (``|``) or a one-line scalar to the line of its
    first content line, so a finding inside a script can name its own line.
    """

    keys: Mapping[KeyPath, int]
    blocks: Mapping[KeyPath, int]

    def line(self, path: KeyPath) -> int:
        """The line of ``path``, or of its nearest ancestor that the file spells out."""
        for end in range(len(path), 0, -1):
            found = self.keys.get(path[:end])
            if found is not None:
                return found
        return 1

    def content_line(self, path: KeyPath, offset: int) -> int:
        """Line ``offset`` (0-based) inside the scalar at ``path``, or the key's line."""
        start = self.blocks.get(path)
        return start + offset if start is not None else self.line(path)


@dataclass(frozen=True, kw_only=True)
class Task:
    """A loaded task: the validated file plus what loading it established.

    ``check`` is the author's own check text, from ``success.script`` or the
    content of ``success.file`` (empty when the task has only declarative
    criteria). It lives here, in memory, and never in the workspace.
    """

    spec: TaskSpec
    path: str
    sha256: str
    check: str
    check_path: str | None
    locations: Locations
    # ``firstrun mutate``: this run is a mutant of the task (its name says which).
    mutation: Mutation | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def docs_route(self) -> tuple[str, ...]:
        return self.spec.docs.route

    @property
    def permissions(self) -> RuleSet:
        """The task's permission rules, each labelled with the file:line it is written on."""
        return self.spec.firstrun.permissions.rule_set("task", origin=lambda verdict, index: (
            f"{self.path}:"
            f"{self.locations.line(('firstrun', 'permissions', verdict.value, index))}"))

    @functools.cached_property
    def docs_hosts(self) -> tuple[HostEntry, ...]:
        """Host entries of the docs channel: the route's hosts first, then ``docs.allow``."""
        hosts: list[HostEntry] = []
        for page in self.spec.docs.route:
            entry = host_entry(page)
            if entry not in hosts:
                hosts.append(entry)
        for entry in self.spec.docs.allow:
            if entry not in hosts:
                hosts.append(entry)
        return tuple(hosts)
