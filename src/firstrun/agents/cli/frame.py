"""What an agent CLI needs from the run beyond a model agent's toolbelt.

Guarantee: an agent CLI says before the session starts what it needs lent
(``Needs.lend``: host directories, read-only) and routed (``Needs.routes``: a
name the proxy sends to a harness address, as a recorded override; the run says
which host address its proxy reaches, ``ProcessAgent.needs``), and the run
grants exactly that, its vendor's API host allowed and its key held by the proxy
(``Needs.credentials``). It runs as one sandboxed process whose commands it
reports (``ProcessToolbelt``), never a process of the harness.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from firstrun.agents.base import Toolbelt

if TYPE_CHECKING:
    from firstrun.sandbox.base import ExecResult


# Where harness services listen when the run's proxy is the harness's own.
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class Route:
    """``host:port`` inside the sandbox's egress reaches ``address`` (an IP of the host)."""

    host: str
    port: int
    address: str


@dataclass(frozen=True, kw_only=True)
class Needs:
    """``allow``: hosts the agent's own traffic goes to (its vendor's API).
    ``credentials``: ``(name, host, from_env)``, a credential the proxy puts
    into requests to ``host`` in place of the placeholder the sandbox holds
    under ``name`` (``firstrun.proxy.credentials``; needs TLS inspection).
    ``methods``: ``(host, methods, path_prefix)``, the requests the agent's
    own traffic makes that an inspecting proxy refuses by default (its
    API calls are POSTs).
    ``pages``: the CLI's own web fetch reaches the docs hosts: the proxy
    answers a fetch of one with this (a URL in, ``read_docs``'s text out),
    so each page it fetched is a page read."""

    lend: tuple[str, ...] = ()
    routes: tuple[Route, ...] = ()
    allow: tuple[str, ...] = ()
    credentials: tuple[tuple[str, str, str], ...] = ()
    methods: tuple[tuple[str, tuple[str, ...], str], ...] = ()
    pages: Callable[[str], str] | None = None


@runtime_checkable
class ProcessAgent(Protocol):
    name: str
    model: str | None
    # Its key is put into its requests by the proxy, so the run must inspect TLS.
    key_held: bool

    def needs(self, serve_at: str = LOOPBACK) -> Needs:
        """What the CLI needs, its harness services listening on ``serve_at``."""
        ...


class ProcessToolbelt(Toolbelt, Protocol):
    def run_process(self, argv: Sequence[str], *, env: dict[str, str],
                    on_output: Callable[[bytes], None]) -> ExecResult:
        """Run the agent's own process in the session until it ends or the wall budget does.

        Not recorded as a command: the process reports its commands itself
        (``record_command``). ``on_output`` gets its stdout as it comes.
        """
        ...

    def permit(self, tool: str, argument: str) -> None:
        """Decide one call by the permission rules and record it; ``CallRefused`` if refused."""
        ...

    def record_command(self, *, command: str, exit_code: int, stdout: str, stderr: str,
                       timed_out: bool = False) -> None:
        """Record a command the agent's process ran, as an agent ``command`` event."""
        ...
