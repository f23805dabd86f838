"""Which hosts the proxy decrypts, what their requests may do, and which credentials they get.

Guarantee: ``inspects`` alone says whether a host's traffic is inspected (every
host under ``--inspect-tls``, else only the ``scope`` an agent's API host set).
Each request the proxy reads there (inside an intercepted tunnel, or plain
HTTP) is decided by ``decide_inner`` alone, in report mode too: ``GET`` and
``HEAD`` pass, another method only where a rule names host, method and path
prefix, and a body over ``max_body_bytes`` never. Pure: stdlib only, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from firstrun.errors import PolicyError
from firstrun.policy.decision import Decision, DecisionLayer, Reason, Verdict
from firstrun.policy.hosts import HostPattern, parse_patterns
from firstrun.policy.process import RESERVED_VARIABLES

READ_ONLY = frozenset({"GET", "HEAD"})
# Methods a rule may open; CONNECT and TRACE have no business inside a tunnel.
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Metadata and package downloads need no request body; a megabyte leaves
# room for a search query or a lockfile resolution while an upload does not fit.
DEFAULT_MAX_BODY_BYTES = 1 << 20

# An environment variable name a shell can export.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, kw_only=True)
class MethodRule:
    """``methods`` are allowed on ``pattern`` for paths starting with ``path_prefix``."""

    pattern: HostPattern
    methods: frozenset[str]
    path_prefix: str = "/"

    def covers(self, host: str, port: int, method: str, path: str) -> bool:
        return (
            method in self.methods
            and self.pattern.matches(host, port)
            and path.startswith(self.path_prefix)
        )


# A credential is policy data: a name, the host it belongs to and the harness
# variable that holds its value. Values and placeholders are runtime secrets
# and never part of a policy (so never part of its hash or record).
@dataclass(frozen=True, kw_only=True)
class CredentialRule:
    """The credential ``name`` belongs to ``pattern``; its value is in harness variable ``from_env``."""

    name: str
    pattern: HostPattern
    from_env: str


@dataclass(frozen=True, kw_only=True)
class InspectionPolicy:
    rules: tuple[MethodRule, ...] = ()
    credentials: tuple[CredentialRule, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # None: every host (``--inspect-tls``). Else the only hosts inspected: an
    # agent CLI's API host, so the proxy can put its key in, while every other
    # tunnel of the run stays as opaque as without inspection.
    scope: tuple[HostPattern, ...] | None = None

    @classmethod
    def build(
        cls,
        *,
        rules: Sequence[tuple[str | HostPattern, Sequence[str], str]] = (),
        credentials: Sequence[tuple[str, str | HostPattern, str]] = (),
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        scope: Sequence[str | HostPattern] | None = None,
        source: str = "policy",
    ) -> InspectionPolicy:
        """Parse ``(host, methods, path_prefix)`` rules, ``(name, host, from_env)`` credentials
        and the ``scope`` hosts (None: every host); a host parsed already is taken as it is."""
        parsed: list[MethodRule] = []
        for entry, methods, prefix in rules:
            (pattern,) = parse_patterns([entry], source=f"{source} methods")
            host = str(entry)
            wanted = frozenset(m.upper() for m in methods)
            unknown = wanted - WRITE_METHODS - READ_ONLY
            if not wanted or unknown:
                raise PolicyError(
                    f"{source}: methods for {host!r}: {sorted(unknown) or 'none given'}; "
                    f"choose from {', '.join(sorted(WRITE_METHODS | READ_ONLY))}"
                )
            if not prefix.startswith("/"):
                raise PolicyError(f"{source}: path prefix {prefix!r} for {host!r} must start with /")
            parsed.append(MethodRule(pattern=pattern, methods=wanted, path_prefix=prefix))
        creds: list[CredentialRule] = []
        for name, host, from_env in credentials:
            for what, value in (("name", name), ("from_env", from_env)):
                if not _ENV_NAME.fullmatch(value):
                    raise PolicyError(
                        f"{source}: credential {what} {value!r} is not an environment variable name"
                    )
            if name in RESERVED_VARIABLES:
                raise PolicyError(f"{source}: credential {name!r} would shadow the sandbox's ${name}")
            if any(c.name == name for c in creds):
                raise PolicyError(f"{source}: credential {name!r} declared twice")
            (pattern,) = parse_patterns([host], source=f"{source} credentials")
            creds.append(CredentialRule(name=name, pattern=pattern, from_env=from_env))
        if max_body_bytes < 0:
            raise PolicyError(f"{source}: max_body_bytes must be >= 0, got {max_body_bytes}")
        hosts = None if scope is None else parse_patterns(list(scope), source=f"{source} scope")
        return cls(rules=tuple(parsed), credentials=tuple(creds), max_body_bytes=max_body_bytes,
                   scope=hosts)

    def to_data(self) -> dict[str, object]:
        """Plain data; ``scope`` appears only when set, so ``--inspect-tls`` hashes as before."""
        data: dict[str, object] = {
            "rules": [
                {"host": str(r.pattern), "methods": sorted(r.methods), "path_prefix": r.path_prefix}
                for r in self.rules
            ],
            "credentials": [
                {"name": c.name, "host": str(c.pattern), "from_env": c.from_env}
                for c in self.credentials
            ],
            "max_body_bytes": self.max_body_bytes,
        }
        if self.scope is not None:
            data["scope"] = [str(p) for p in self.scope]
        return data


def inspects(policy: InspectionPolicy, host: str, port: int) -> bool:
    """Whether the proxy decrypts (and judges by ``decide_inner``) traffic to ``host:port``."""
    return policy.scope is None or any(p.matches(host, port) for p in policy.scope)


@dataclass(frozen=True, kw_only=True)
class InnerRequest:
    """One request read from inside an intercepted tunnel.

    ``body_bytes`` is the declared Content-Length, or the bytes read so far
    of a chunked body; a body is judged again each time it grows.
    """

    host: str
    port: int
    method: str
    path: str
    body_bytes: int = 0


# The allow-list decides where a request may go; these rules decide what it may
# do there, the residual an allow-list leaves open (an allowed registry accepts
# writes). Report mode does not reach here: it lifts the name rules so an
# allow-list can be learnt, and a run that asked for inspection asked for its
# uploads to be stopped.
def decide_inner(policy: InspectionPolicy, request: InnerRequest) -> Decision:
    """Allow or refuse one decrypted request; the first rule with an opinion decides."""
    host = request.host
    if request.body_bytes > policy.max_body_bytes:
        return Decision(verdict=Verdict.DENY, reason=Reason.BODY_TOO_LARGE, layer=DecisionLayer.METHODS,
                        host=host)
    if request.method in READ_ONLY:
        return Decision(verdict=Verdict.ALLOW, reason=Reason.ALLOWED_READ_ONLY,
                        layer=DecisionLayer.METHODS, host=host)
    for rule in policy.rules:
        if rule.covers(host, request.port, request.method, request.path):
            return Decision(verdict=Verdict.ALLOW, reason=Reason.ALLOWED_BY_METHOD_RULE,
                            layer=DecisionLayer.METHODS, host=host, override=str(rule.pattern))
    return Decision(verdict=Verdict.DENY, reason=Reason.METHOD_NOT_ALLOWED, layer=DecisionLayer.METHODS,
                    host=host)


def credentials_for(policy: InspectionPolicy, host: str, port: int) -> tuple[str, ...]:
    """Names of the credentials a request to ``host:port`` may have substituted."""
    return tuple(c.name for c in policy.credentials if c.pattern.matches(host, port))
