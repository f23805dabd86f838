"""One exception tree for firstrun.

Guarantee: every error that crosses a module boundary is a ``FirstrunError``
whose ``who`` names the component that failed, so a caller can tell "the
command failed" (not an error at all: an exit code) from "the sandbox failed"
(``SandboxError``) from "the input was wrong" (``UsageError``/``PolicyError``)
without ever matching message text. Foreign exceptions (OSError from a
syscall, h11's ProtocolError, ...) are converted once, where they enter.
"""

from __future__ import annotations


def one_line(text: str, cap: int | None = None) -> str:
    """``text`` as one printable line: each run of whitespace or unprintable characters one
    space, then at most ``cap`` characters. For messages shown on a terminal or in a record,
    some of which come from a file, a subprocess or a peer that runs beside untrusted code."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if cap is None else flat[:cap]


class FirstrunError(Exception):
    """Base of every error firstrun raises on purpose."""

    who = "firstrun"

    def __init__(self, message: str, *, who: str | None = None) -> None:
        super().__init__(message)
        if who is not None:
            self.who = who

    def __str__(self) -> str:
        return f"{self.who}: {self.args[0]}"


class UsageError(FirstrunError):
    """The user asked for something malformed (a flag, a file, a value)."""

    who = "usage"


class PolicyError(FirstrunError):
    """A policy could not be built: an invalid host pattern, a contradiction."""

    who = "policy"


class SandboxError(FirstrunError):
    """The sandbox itself failed, as opposed to a command inside it."""

    who = "sandbox"


class SandboxUnavailable(SandboxError):
    """A layer that was asked for cannot be applied on this machine.

    Raised before anything untrusted runs; the run is refused (fail closed).
    ``fix`` is the exact remedy when one is known.
    """

    def __init__(self, message: str, *, who: str | None = None, fix: str | None = None) -> None:
        super().__init__(message, who=who)
        self.fix = fix


class AttestationFailed(SandboxError):
    """A boundary check run from inside the sandbox did not hold."""

    who = "attestation"


class ProxyError(FirstrunError):
    """The egress proxy could not start or serve."""

    who = "proxy"


class DocsError(FirstrunError):
    """The docs reader itself failed (its configuration, its cache, the proxy).

    A page that cannot be read is never this: it is a ``Page`` with ``error``
    set, because an unreadable page is a finding about the docs.
    """

    who = "docs"


class TaskError(UsageError):
    """A task file is unreadable or invalid, located to one line of one file.

    ``path`` and ``line`` are data, so a caller (validate's findings, an
    editor integration) never has to parse them back out of the message.
    ``line`` is None only when no line exists (a file that cannot be read).
    """

    who = "task"

    def __init__(self, detail: str, *, path: str, line: int | None) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {detail}")
        self.path = path
        self.line = line
        self.detail = detail
