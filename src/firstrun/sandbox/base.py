"""The contract every sandbox backend meets.

Guarantee: a backend never runs an untrusted command it has not first
attested. ``Backend.start`` either returns a ``Session`` whose boundary was
proven from the inside, or raises ``SandboxUnavailable``/``AttestationFailed``
before anything untrusted ran. A ``Session`` kills every process it started
when it closes. Results keep "the command failed" (an ``ExecResult`` with a
non-zero exit) apart from "the sandbox failed" (a ``SandboxError``).
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from firstrun.errors import SandboxError
from firstrun.policy.filesystem import is_under
from firstrun.policy.process import MAX_COMMAND_TIMEOUT_S, RESERVED_VARIABLES
from firstrun.policy.profile import SandboxProfile


class Enforcement(StrEnum):
    ENFORCED = "enforced"
    DOWNGRADED = "downgraded"
    UNENFORCED = "unenforced"


class Stream(StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"


OutputCallback = Callable[[Stream, bytes], None]


@dataclass(frozen=True, kw_only=True)
class CappedOutput:
    """Output that kept its head and tail when it exceeded the cap."""

    data: bytes
    total_bytes: int
    omitted_bytes: int = 0

    @property
    def truncated(self) -> bool:
        return self.omitted_bytes > 0

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True, kw_only=True)
class ExecResult:
    exit_code: int
    stdout: CappedOutput
    stderr: CappedOutput
    duration_s: float
    timed_out: bool = False
    # What the boundary refused while the command ran, one line each
    # ("[sandbox] refused host:port (reason)"); filled by the run, not the session.
    refusals: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Check:
    """One attestation check: what was tried from inside, and what happened."""

    name: str
    passed: bool
    detail: str


@dataclass(frozen=True, kw_only=True)
class LayerStatus:
    """A layer that was asked for, and how it was (or was not) applied."""

    name: str
    applied: bool
    mechanism: str
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class SessionInfo:
    backend: str
    enforcement: Enforcement
    policy_hash: str
    layers: tuple[LayerStatus, ...] = ()
    attestation: tuple[Check, ...] = ()
    exposed: tuple[str, ...] = field(default=())
    downgrades: tuple[str, ...] = ()
    # The container image the commands ran in; None where the host's own root is used.
    image: str | None = None

    def to_data(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "image": self.image,
            "enforcement": self.enforcement.value,
            "policy_hash": self.policy_hash,
            "layers": [
                {"name": l.name, "applied": l.applied, "mechanism": l.mechanism, "detail": l.detail}
                for l in self.layers
            ],
            "attestation": [
                {"name": c.name, "passed": c.passed, "detail": c.detail} for c in self.attestation
            ],
            "exposed": list(self.exposed),
            "downgrades": list(self.downgrades),
        }


class StartPhases:
    """Where one session's start went: each phase's end, in seconds since the start began.

    A backend marks each phase as it ends, in order, so a slower start shows
    which phase grew; ``bench`` prints the phases, and nothing else reads
    them (they are timing, not evidence, and never enter a result).
    """

    def __init__(self) -> None:
        self._began = time.monotonic()
        self.ends: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        self.ends[phase] = time.monotonic() - self._began

    def durations(self) -> dict[str, float]:
        """Each phase's own length, from the end of the one before it."""
        lengths, previous = {}, 0.0
        for phase, end in self.ends.items():
            lengths[phase], previous = end - previous, end
        return lengths


@dataclass(frozen=True, kw_only=True)
class Capability:
    name: str
    available: bool
    detail: str
    fix: str | None = None


@dataclass(frozen=True, kw_only=True)
class ProxyEndpoint:
    """Where a session's shell channel reaches the harness's egress proxy.

    ``socket_path`` is a Unix socket on the host; the backend exposes it
    inside the sandbox as a loopback TCP port. ``nonce`` is what the proxy
    answers for the reserved attestation host, so the sandbox can prove it
    reached this proxy and not something else listening on the port.

    When the proxy inspects TLS, ``trust_bundle`` is a host file (public
    certificates only: the system CAs and the run's CA) that the backend
    shows at ``policy.process.SANDBOX_CA_BUNDLE`` and names in every trust
    variable, and ``placeholders`` are the credential placeholders the
    sandbox's environment carries. A backend that cannot do both refuses.

    ``transparent_path`` and ``dns_path`` (both or neither) ask for
    transparent capture: the proxy's listeners for redirected flows and for
    DNS, which the backend connects every flow and every query to, whether
    or not the program in the sandbox honours the proxy variables.
    """

    socket_path: str
    nonce: str
    trust_bundle: str | None = None
    placeholders: tuple[tuple[str, str], ...] = ()
    transparent_path: str | None = None
    dns_path: str | None = None

    @property
    def captures(self) -> bool:
        return self.transparent_path is not None

    def __post_init__(self) -> None:
        # Refused before any backend launches: a placeholder named PATH or
        # HTTPS_PROXY would quietly replace what the sandbox relies on.
        for name, _ in self.placeholders:
            if name in RESERVED_VARIABLES:
                raise SandboxError(f"credential {name} would shadow the sandbox's ${name}",
                                   who="proxy")
        if self.placeholders and self.trust_bundle is None:
            raise SandboxError("credential placeholders without TLS inspection: the proxy "
                               "could never swap them", who="proxy")
        if (self.transparent_path is None) != (self.dns_path is None):
            raise SandboxError("transparent capture needs both the flow and the DNS listener",
                               who="proxy")


# An egress record as plain data (``EgressRecord.to_data``), from a backend
# that runs the shell channel's proxy itself.
RecordCallback = Callable[[dict[str, object]], None]


@dataclass(frozen=True)
class OwnProxy:
    """The shell channel's egress goes through the backend's own proxy (docker's sidecar).

    The backend runs it from the profile's policy and reports its records
    itself; there is no harness socket to name, so it carries nothing.
    """


# What a session's shell channel is given: the harness's proxy, the backend's own, or none.
ShellProxy = ProxyEndpoint | OwnProxy



def _os_string(value: object) -> bool:
    """A str the kernel can take as it is: no NUL (it would truncate there), and
    nothing but text and the undecodable bytes a str can carry (a lone surrogate
    has no bytes, and a supervisor handed one dies encoding it)."""
    if not isinstance(value, str) or "\0" in value:
        return False
    try:
        value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def command_argv(command: str | Sequence[str], *, who: str) -> list[str]:
    """The argv every backend runs: a ``str`` under ``bash -c``, a sequence as given.

    Refused here, once for every backend: an empty argv, non-strings, NUL
    bytes, which the kernel would silently truncate at, and lone surrogates.
    """
    argv = ["/bin/bash", "-c", command] if isinstance(command, str) else list(command)
    if not argv or not all(_os_string(a) for a in argv):
        raise SandboxError("command must be a non-empty string or argv of strings without NUL "
                           "bytes or lone surrogates", who=who)
    return argv


def command_environment(
    built: dict[str, str], extra: Mapping[str, str] | None, *, who: str
) -> dict[str, str]:
    """``built`` plus ``extra``; extra names add, never replace (PATH, HOME, proxies stay)."""
    merged = dict(built)
    if extra is not None and not isinstance(extra, Mapping):
        raise SandboxError(f"env must be a mapping of names to values, not "
                           f"{type(extra).__name__}", who=who)
    for name, value in (extra or {}).items():
        if not _os_string(name) or not name or "=" in name or not _os_string(value):
            raise SandboxError(f"invalid environment variable {name!r}", who=who)
        merged.setdefault(name, value)
    return merged


def command_timeout(timeout: object, *, who: str) -> float:
    """``timeout`` as seconds, refused unless it is a number in (0, ``MAX_COMMAND_TIMEOUT_S``]."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) \
            or not 0 < timeout <= MAX_COMMAND_TIMEOUT_S:
        raise SandboxError(f"timeout {timeout!r} is not a number of seconds above 0 and at most "
                           f"{MAX_COMMAND_TIMEOUT_S:g}", who=who)
    return float(timeout)


@dataclass(frozen=True, kw_only=True)
class PreparedCommand:
    """One command as a backend runs it, checked once for every backend."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    timeout: float


def prepare_command(
    command: str | Sequence[str], *, cwd: str | None, timeout: float | None,
    env: dict[str, str] | None, session_env: dict[str, str], workspace: str,
    default_timeout: float, who: str,
) -> PreparedCommand:
    """``command`` with its argv, environment and limit, and ``cwd`` beneath ``workspace``.

    ``workspace`` is the workspace as the command sees it; a ``cwd`` that
    leaves it (``..``, an absolute path elsewhere) is refused rather than
    run somewhere the caller did not mean.
    """
    if cwd is not None and not _os_string(cwd):
        raise SandboxError(f"cwd {cwd!r} is not a path (a string without NUL bytes or lone "
                           "surrogates)", who=who)
    resolved = posixpath.normpath(posixpath.join(workspace, cwd)) if cwd else workspace
    if not is_under(resolved, workspace):
        raise SandboxError(f"cwd {cwd!r} is outside the workspace {workspace}", who=who)
    return PreparedCommand(argv=command_argv(command, who=who), cwd=resolved,
                           env=command_environment(session_env, env, who=who),
                           timeout=command_timeout(default_timeout if timeout is None else timeout,
                                                   who=who))


class Session(Protocol):
    info: SessionInfo

    def exec(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        """Run one command; a ``str`` runs under ``bash -c``.

        ``cwd`` is a path inside the sandbox, relative paths are relative to
        the workspace. ``env`` adds to (never replaces) the built environment.
        """
        ...

    def kill_all(self) -> int:
        """Kill every process the session's commands started, wait until none is left,
        and return how many were killed.

        For the success check: what runs after this shares the sandbox with
        nothing a command left behind (a background process racing the check,
        a daemon reading its ``/proc``). The session stays usable.
        """
        ...

    def interrupt(self) -> None:
        """End whatever runs now; callable from any thread while ``exec`` blocks.

        For Ctrl-C: a sweep must not wait out a command's timeout. The
        running ``exec`` then raises ``SandboxError``, the session is
        unusable, and ``close`` still cleans up.
        """
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Session: ...

    def __exit__(self, *exc: object) -> None: ...


class Backend(Protocol):
    """A sandbox mechanism, to the harness: a probe, and a start that attests.

    ``prepare`` is not part of the protocol, though linux, docker and
    microvm each have one (``prepare(profile, proxy, facts) -> plan`` in
    their pure module, golden-tested). No one signature fits them all: each
    backend's facts are its own (fds and a stage directory, a trust bundle
    file and credential values, descriptors QEMU inherits), gathered inside
    ``start`` while the resources they name are acquired, so no caller
    could build them; seatbelt's pure step is its profile
    (``build_seatbelt_spec``) and local has nothing to plan. The protocol
    keeps ``start``, the one step a caller can take.
    """

    name: str

    def probe(self) -> tuple[Capability, ...]:
        """What this machine can enforce for this backend, with fixes for what it can't."""
        ...

    def start(self, profile: SandboxProfile, *, proxy: ShellProxy | None) -> Session:
        """Launch, attest, and return a session; refuse (raise) rather than downgrade."""
        ...
