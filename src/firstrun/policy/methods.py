"""Method, path and body rules for requests the proxy decrypted, and which credentials a host gets.

Guarantee: with TLS inspection on, every shell request the proxy can read (inside
an intercepted tunnel, and plain HTTP) is decided by ``decide_inner`` alone, in
report mode too. ``GET`` and ``HEAD`` pass; any other method is refused
(``method_not_allowed``) unless a task rule names that host, that method and a
path prefix covering the path; a body over ``max_body_bytes`` is refused
(``body_too_large``) whatever its method. Pure: stdlib only, no I/O.
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

    @classmethod
    def build(
        cls,
        *,
        rules: Sequence[tuple[str | HostPattern, Sequence[str], str]] = (),
        credentials: Sequence[tuple[str, str | HostPattern, str]] = (),
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        source: str = "policy",
    ) -> InspectionPolicy:
        """Parse ``(host, methods, path_prefix)`` rules and ``(name, host, from_env)`` credentials;
        a host parsed already is taken as it is."""
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
        return cls(rules=tuple(parsed), credentials=tuple(creds), max_body_bytes=max_body_bytes)

    def to_data(self) -> dict[str, object]:
        return {
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
