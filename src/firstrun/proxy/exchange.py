"""The decision about one exchange, with no sockets: events in, commands out.

Guarantee: what the proxy does with one proxy request, redirected flow,
request decrypted inside an inspected tunnel or refused DNS name, and every
record it leaves, is decided here as a pure function of the policy and of the
events its drivers (``clients``, ``intercept``) report. Only a name that passed
is resolved and only a checked address dialled; a refusal is recorded before
it is answered; every exchange ends in exactly one ``Record`` or ``Release``.
"""

from __future__ import annotations

import http
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

import h11

from firstrun.policy.addresses import IPAddress
from firstrun.policy.decision import Decision, DecisionLayer, Reason, Verdict
from firstrun.policy.hosts import parse_ip_literal
from firstrun.policy.methods import (
    READ_ONLY,
    InnerRequest,
    InspectionPolicy,
    decide_inner,
    inspects,
)
from firstrun.policy.network import (
    ATTESTATION_HOST,
    Channel,
    NetworkPolicy,
    Request,
    channel_for,
    decide_addresses,
    decide_name,
)
from firstrun.proxy.credentials import MaskedCredential, substitute
from firstrun.proxy.errors import Refused, upstream_failure
from firstrun.proxy.flight import FlightKind
from firstrun.proxy.records import Capture, EgressRecord, Scheme, TunnelEnd
from firstrun.proxy.request import (
    Action,
    Headers,
    Target,
    authority_text,
    check_framing,
    classify_request,
    end_to_end,
    parse_authority,
    upstream_headers,
)


class Clock(NamedTuple):
    """Where records get their times and ids: injected, so tables can fix them."""

    monotonic: Callable[[], float]
    iso: Callable[[], str]
    new_id: Callable[[], str]


# -- events: what the driver reports ------------------------------------------
#
# Events, commands and contexts are NamedTuples: immutable as frozen
# dataclasses are, at a tenth of the cost to define (this module is imported
# by every one-shot sandbox's start) and less to build (several per request).
# Built by keyword, dispatched by isinstance, never compared.


class RequestHead(NamedTuple):
    """A request head h11 parsed, the exact bytes it was parsed from, and when it began."""

    event: h11.Request
    raw: bytes
    ts: str
    started: float


class HeadRefused(NamedTuple):
    """The head itself could not be read as one request (malformed, too large, too slow)."""

    refusal: Refused
    ts: str
    started: float


class FlowOpened(NamedTuple):
    """A redirected flow: where the program dialled, and the name that address stands for."""

    kind: str  # "tcp" or "udp"
    host: str
    port: int
    ts: str
    started: float


class NameRefused(NamedTuple):
    """A name the shell's DNS stub refused (``proxy.dns`` answered it NXDOMAIN)."""

    name: str | None
    qtype: str | None
    decision: Decision
    ts: str
    started: float


class Reserved(NamedTuple):
    ok: bool


class Resolved(NamedTuple):
    addresses: tuple[IPAddress, ...]


class Dialled(NamedTuple):
    """The address a connection was made to, or None when none of them answered."""

    address: IPAddress | None


class PageText(NamedTuple):
    """What the run's docs reader made of a page (``ReadPage``): the text the agent sees."""

    text: str


class Done(NamedTuple):
    """How the data plane's part ended: bytes each way, and what it saw.

    ``refusal`` is a refusal the client has not been answered yet (a body over
    the cap, an upstream that failed before its response head): the exchange
    answers it. ``closed`` is a refusal that closed a tunnel after its
    ``200`` (a first flight refused, a TLS client that would not verify):
    recorded, never answered. ``status`` is the response status the client
    got, when it got one. ``ended`` is how a carried tunnel ended.
    """

    bytes_up: int = 0
    bytes_down: int = 0
    status: int | None = None
    refusal: Refused | None = None
    closed: Refused | None = None
    keep_alive: bool = False
    flight: FlightKind | None = None
    # The decision a raw stream went under instead (its tcp rule, or report mode's).
    decision: Decision | None = None
    ended: TunnelEnd | None = None


ExchangeEvent = (RequestHead | HeadRefused | FlowOpened | NameRefused | Reserved | Resolved
                 | Dialled | PageText | Done)


# -- commands: what the driver carries out ------------------------------------


class Reserve(NamedTuple):
    """Hold a place in the record budget; answered by ``Reserved``."""

    channel: Channel


class Release(NamedTuple):
    """Give back a reservation whose exchange showed nothing to record."""


class RecordMode(StrEnum):
    # Into the place ``Reserve`` held.
    RESERVED = "reserved"
    # A refusal that forwarded nothing: written if the budget has room, else counted.
    OFFERED = "offered"
    # Traffic that already went out (an inspected tunnel's inner request): always written.
    WRITTEN = "written"


class Record(NamedTuple):
    record: EgressRecord
    mode: RecordMode


class Resolve(NamedTuple):
    """Resolve a canonical name once; answered by ``Resolved``."""

    host: str
    port: int


class Dial(NamedTuple):
    """Connect to the first of ``addresses`` that answers (all were checked); answered by ``Dialled``."""

    channel: Channel
    host: str
    port: int
    addresses: tuple[IPAddress, ...]
    # A plain request may go over a kept-alive connection to a checked address.
    reuse: bool = False


class Refuse(NamedTuple):
    """Send ``data`` (the refusal's answer; empty when the flow speaks no HTTP), then close.

    ``linger``: drain the client's unread input for a while first, so the
    kernel does not reset the answer away.
    """

    refusal: Refused
    data: bytes
    linger: bool = True


class Answer(NamedTuple):
    """The proxy answers itself (the attestation nonce); answered by ``Done``.

    For a proxy request the driver drains the request body first and sends
    ``status``, ``headers`` and ``body`` through its HTTP connection; for a
    redirected flow it reads the plain request's head and sends ``raw``.
    """

    status: int
    headers: Headers
    body: bytes
    raw: bytes = b""


class Forward(NamedTuple):
    """Send ``request`` (and its body) upstream on the dialled connection and relay the response.

    With ``cap`` set the body is read whole before a byte goes upstream, and
    a body over ``cap`` bytes is ``cap_refusal``; without it the body streams.
    Answered by ``Done``.
    """

    request: h11.Request
    host: str
    cap: int | None = None
    cap_refusal: Refused | None = None


class Carry(NamedTuple):
    """Carry an admitted tunnel: say ``200`` first when ``established`` (a CONNECT),
    then decrypt and judge each request (``inspect``) or judge the first flight
    and move the bytes; its requests are recorded on ``channel``. A ``served``
    tunnel (a docs host under ``serve_docs``) was never dialled: it is decrypted
    and each request answered by the docs reader. Answered by ``Done``."""

    target: Target
    established: bool
    inspect: bool
    channel: Channel
    served: bool = False


class ReadPage(NamedTuple):
    """Have the run's docs reader read ``url`` (a page read, recorded by the run);
    answered by ``PageText``."""

    url: str


Command = Reserve | Release | Record | Resolve | Dial | Refuse | Answer | Forward | Carry | ReadPage
# The commands whose answer is the next event.
_ANSWERED = (Reserve, Resolve, Dial, Answer, Forward, Carry, ReadPage)

Steps = Generator[Command, ExchangeEvent | None, None]


class Abandoned(Exception):
    """The driver stopped the exchange midway (the proxy is stopping, or the connection
    failed under it): settle with what was shown, and with ``progress``, what the data
    plane had carried so far."""

    def __init__(self, progress: Done | None) -> None:
        super().__init__("the exchange was abandoned")
        self.progress = progress


class Handler:
    """Runs one exchange: ``handle(event)`` returns the commands that event caused.

    The first event starts it. The list stops after a command that needs an
    answer (the driver sends the answer as the next event) or when the
    exchange is over (``done``). ``abandon`` ends it early, still with its
    one ``Record`` or ``Release``.
    """

    def __init__(self, steps: Steps) -> None:
        self._steps = steps
        self.done = False
        next(steps)  # to the first ``yield``, which takes the first event

    def handle(self, event: ExchangeEvent) -> list[Command]:
        if self.done:
            raise RuntimeError("the exchange is over")
        commands: list[Command] = []
        sent: ExchangeEvent | None = event
        while True:
            try:
                command = self._steps.send(sent)
            except StopIteration:
                self.done = True
                return commands
            commands.append(command)
            if isinstance(command, _ANSWERED):
                return commands
            sent = None

    def abandon(self, progress: Done | None = None) -> list[Command]:
        """The commands that settle an exchange its driver stopped (records and releases
        only); ``progress`` is what its unanswered command had carried so far."""
        if self.done:
            return []
        self.done = True
        commands: list[Command] = []
        try:
            command = self._steps.throw(Abandoned(progress))
            while True:
                commands.append(command)
                command = self._steps.send(None)
        except (StopIteration, Abandoned):
            pass
        return commands


# -- what an exchange has shown so far ----------------------------------------


@dataclass(kw_only=True)
class _Shown:
    """What one exchange has shown so far; becomes its record."""

    channel: Channel
    capture: Capture
    ts: str
    started: float
    scheme: Scheme | None = None
    method: str | None = None
    host: str | None = None
    port: int | None = None
    path: str | None = None
    allowed: Decision | None = None
    override: str | None = None
    name_would_deny: Reason | None = None
    refusal: Refused | None = None
    resolved: str | None = None
    status: int | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    credentials: tuple[str, ...] = field(default_factory=tuple)
    ended: TunnelEnd | None = None
    # Holds a place in the record budget (``Reserve`` answered yes).
    reserved: bool = False

    def record(self, clock: Clock) -> EgressRecord | None:
        if self.refusal is not None:
            verdict, reason, layer = Verdict.DENY, self.refusal.reason, self.refusal.layer
            # A name report mode let through that then did not resolve keeps
            # what the name rules would have said: learning an allow-list needs
            # it. A refusal by the floor itself is no name rule's to report.
            would_deny = self.name_would_deny if reason is Reason.RESOLVE_FAILED else None
            override = None
            host = self.refusal.host or self.host
        elif self.allowed is not None:
            verdict, reason, layer = Verdict.ALLOW, self.allowed.reason, self.allowed.layer
            would_deny, override, host = self.allowed.would_deny, self.override, self.host
        else:
            return None
        return EgressRecord(
            ts=self.ts, id=clock.new_id(), channel=self.channel, method=self.method,
            scheme=self.scheme, host=host, port=self.port, path=self.path, decision=verdict,
            reason=reason, layer=layer, would_deny=would_deny, override=override,
            resolved=self.resolved, status=self.status, bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
            duration_ms=round((clock.monotonic() - self.started) * 1000, 3),
            credentials=self.credentials, capture=self.capture, ended=self.ended,
        )

    def add(self, done: Done) -> None:
        self.bytes_up += done.bytes_up
        self.bytes_down += done.bytes_down
        if done.status is not None:
            self.status = done.status
        if done.ended is not None:
            self.ended = done.ended


def refusal_answer(refusal: Refused, method: str | None) -> bytes:
    """The exact bytes of a refusal's answer: a one-line reason, and ``connection: close``."""
    body = f"firstrun proxy: {refusal.reason.value}: {refusal.detail}\n".encode()
    phrase = http.HTTPStatus(refusal.status).phrase
    head = (f"HTTP/1.1 {refusal.status} {phrase}\r\n"
            "content-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\n"
            f"x-firstrun-reason: {refusal.reason.value}\r\n"
            "connection: close\r\n\r\n").encode()
    return head if method == "HEAD" else head + body


def _budget_spent() -> Refused:
    return Refused(Reason.RECORD_BUDGET_EXHAUSTED,
                   "the proxy's egress record budget is spent; it forwards nothing it "
                   "cannot record")


def _policy_refusal(decision: Decision) -> Refused:
    return Refused(decision.reason, decision.host, layer=decision.layer, host=decision.host)


def _guarded(shown: _Shown, clock: Clock, steps: Steps, *, mode: RecordMode | None = None) -> Steps:
    """``steps``, settled with what ``shown`` holds if the driver abandons them midway."""
    try:
        yield from steps
    except Abandoned as abandoned:
        if abandoned.progress is not None:
            shown.add(abandoned.progress)
        if mode is None:
            yield from _settle(shown, clock, reserved=shown.reserved)
        elif (record := shown.record(clock)) is not None:
            yield Record(record=record, mode=mode)


def _settle(shown: _Shown, clock: Clock, *, reserved: bool) -> Steps:
    """The exchange's one record: into its reservation, else offered; or the reservation back."""
    record = shown.record(clock)
    if record is not None:
        yield Record(record=record, mode=RecordMode.RESERVED if reserved else RecordMode.OFFERED)
    elif reserved:
        yield Release()


def _refuse(shown: _Shown, refusal: Refused, clock: Clock, *, reserved: bool,
            answer: bool = True) -> Steps:
    """Record ``refusal``, then answer it (a proxy request) or just close (a flow)."""
    shown.refusal = refusal
    data = refusal_answer(refusal, shown.method) if answer else b""
    if answer:
        shown.status = refusal.status
        shown.bytes_down += len(data)
    else:
        shown.status = None
    yield from _settle(shown, clock, reserved=reserved)
    yield Refuse(refusal=refusal, data=data, linger=answer)


# -- the paths ------------------------------------------------------------------

# The order is fixed, for every path:
# - a record's place is held before anything is judged (``Reserve``; an
#   inner request of an inspected tunnel reserves nothing, its tunnel did);
# - a request is judged on its head first, then by name (``decide_name``);
#   only a name that passed is resolved (``Resolve``), every address it
#   resolved to is judged (``decide_addresses``), and only a checked address
#   is dialled (``Dial``);
# - a refusal is recorded (``Record``) before it is answered (``Refuse``), so
#   a client that read its 4xx finds the refusal already in the log;
# - every exchange ends in exactly one ``Record``, or, when it held a
#   reservation and showed nothing, one ``Release``.
# Each path is a generator that yields commands, which ``Handler`` runs.


def dns_refusal(channel: Channel, clock: Clock) -> Steps:
    """A refused DNS name's one record, offered: the stub answered it and forwarded nothing."""
    event = yield  # type: ignore[misc]
    assert isinstance(event, NameRefused)
    shown = _Shown(channel=channel, capture=Capture.TRANSPARENT, ts=event.ts,
                   started=event.started, scheme=Scheme.DNS, method=event.qtype,
                   host=event.name, port=53)
    # The name as the query spelt it (lowercased), canonical or not.
    shown.refusal = Refused(event.decision.reason, event.name or "(no name)",
                            layer=event.decision.layer)
    yield from _settle(shown, clock, reserved=False)


class Decisions:
    """``decide_name`` and ``decide_addresses`` over one policy, each answer remembered.

    Both are pure functions of the policy and of their arguments, so a
    remembered answer is the answer: a keep-alive client asking for the same
    host again is judged by the same rules, without running them again. A
    memo lives exactly as long as its policy (a new policy gets a new memo)
    and holds at most ``MAX`` answers of each kind.
    """

    MAX = 4096

    def __init__(self, policy: NetworkPolicy) -> None:
        self.policy = policy
        self._names: dict[Request, Decision] = {}
        self._addresses: dict[tuple[Request, tuple[IPAddress, ...]], Decision] = {}

    def name(self, request: Request) -> Decision:
        decision = self._names.get(request)
        if decision is None:
            if len(self._names) >= self.MAX:
                self._names.clear()
            decision = self._names[request] = decide_name(self.policy, request)
        return decision

    def addresses(self, request: Request, addresses: tuple[IPAddress, ...]) -> Decision:
        key = (request, addresses)
        decision = self._addresses.get(key)
        if decision is None:
            if len(self._addresses) >= self.MAX:
                self._addresses.clear()
            decision = self._addresses[key] = decide_addresses(self.policy, request, addresses)
        return decision


class ProxyContext(NamedTuple):
    """What a proxy request or a redirected flow is judged by."""

    channel: Channel
    decisions: Decisions
    clock: Clock
    nonce: str
    max_head_bytes: int

    @property
    def policy(self) -> NetworkPolicy:
        return self.decisions.policy

    def inspection(self, host: str, port: int) -> InspectionPolicy | None:
        """The method rules for ``host:port`` when the run inspects it; else None.

        Only the sandbox's channels carry untrusted traffic; the docs channel is
        the harness's own reader, which verifies the real server itself. Under
        a scoped inspection (``policy.methods.inspects``) every other host's
        traffic is as it is without inspection: carried, never read.
        """
        inspection = self.policy.inspection
        if self.channel is Channel.DOCS or inspection is None \
                or not inspects(inspection, host, port):
            return None
        return inspection


def proxy_request(ctx: ProxyContext) -> Steps:
    """One request on a proxy listener: plain HTTP in absolute form, CONNECT, or the attestation."""
    event = yield  # type: ignore[misc]
    if isinstance(event, HeadRefused):
        shown = _Shown(channel=ctx.channel, capture=Capture.PROXY, ts=event.ts,
                       started=event.started)
        yield from _refuse(shown, event.refusal, ctx.clock, reserved=False)
        return
    assert isinstance(event, RequestHead)
    shown = _Shown(channel=ctx.channel, capture=Capture.PROXY, ts=event.ts,
                   started=event.started, method=event.event.method.decode("ascii", "replace"))
    yield from _guarded(shown, ctx.clock, _proxy_request(ctx, shown, event))


def _proxy_request(ctx: ProxyContext, shown: _Shown, event: RequestHead) -> Steps:
    reserved = (yield Reserve(channel=ctx.channel))
    assert isinstance(reserved, Reserved)
    if not reserved.ok:
        yield from _refuse(shown, _budget_spent(), ctx.clock, reserved=False)
        return
    shown.reserved = True
    try:
        target = classify_request(event.event, event.raw, max_head_bytes=ctx.max_head_bytes)
        shown.method, shown.host, shown.port, shown.path = \
            target.method or None, target.host, target.port, target.path
        shown.scheme = Scheme.HTTPS_TUNNEL if target.action is Action.TUNNEL else Scheme.HTTP
        if target.action is Action.ATTEST:
            yield from _attest(ctx, shown, target, raw=False)
            return
        if target.action is Action.FORWARD:
            _judge_method(ctx, target, event.event)
        yield from _admit(ctx, shown, target)
    except Refused as refusal:
        yield from _refuse(shown, refusal, ctx.clock, reserved=True)
        return
    if target.action is Action.TUNNEL:
        yield from _carry(ctx, shown, target, established=True)
        return
    if _served(shown):
        url = f"http://{authority_text(target.host, target.port, default_port=80)}{target.path}"
        yield from _serve_page(shown, ctx.clock, url, inner=False)
        return
    inspection = ctx.inspection(target.host, target.port)
    request = h11.Request(method=event.event.method, target=target.path or "/",
                          headers=upstream_headers(list(event.event.headers), target))
    cap_refusal = None if inspection is None else Refused(
        Reason.BODY_TOO_LARGE, f"body over {inspection.max_body_bytes} bytes",
        layer=DecisionLayer.METHODS, host=target.host)
    done = yield Forward(request=request, host=target.host,
                         cap=inspection.max_body_bytes if inspection else None,
                         cap_refusal=cap_refusal)
    assert isinstance(done, Done)
    shown.add(done)
    if done.refusal is not None:
        yield from _refuse(shown, done.refusal, ctx.clock, reserved=True)
        return
    yield from _settle(shown, ctx.clock, reserved=True)


def flow(ctx: ProxyContext) -> Steps:
    """One flow the sandbox's relay redirected: decided by the name its address stands for,
    exactly as a CONNECT to that name, and carried without the CONNECT handshake."""
    opened = yield  # type: ignore[misc]
    assert isinstance(opened, FlowOpened)
    target = Target(action=Action.TUNNEL, method="", host=opened.host, port=opened.port, path=None)
    shown = _Shown(channel=ctx.channel, capture=Capture.TRANSPARENT, ts=opened.ts,
                   started=opened.started, host=opened.host, port=opened.port)
    yield from _guarded(shown, ctx.clock, _flow(ctx, shown, opened, target))


def _flow(ctx: ProxyContext, shown: _Shown, opened: FlowOpened, target: Target) -> Steps:
    if opened.kind == "udp":
        shown.scheme = Scheme.UDP
        refusal = Refused(Reason.UDP_NOT_ALLOWED, f"a datagram to {opened.host}:{opened.port}: "
                          "only DNS leaves the sandbox over UDP", layer=DecisionLayer.PROTOCOL,
                          host=opened.host)
        yield from _refuse(shown, refusal, ctx.clock, reserved=False, answer=False)
        return
    # Until its first flight shows more, a redirected flow is a stream.
    shown.scheme = Scheme.TCP
    reserved = yield Reserve(channel=ctx.channel)
    assert isinstance(reserved, Reserved)
    if not reserved.ok:
        yield from _refuse(shown, _budget_spent(), ctx.clock, reserved=False, answer=False)
        return
    shown.reserved = True
    if opened.host == ATTESTATION_HOST:
        shown.scheme = Scheme.HTTP_TUNNEL
        yield from _attest(ctx, shown, target, raw=True)
        return
    try:
        yield from _admit(ctx, shown, target)
    except Refused as refusal:
        yield from _refuse(shown, refusal, ctx.clock, reserved=True, answer=False)
        return
    shown.status = 200
    yield from _carry(ctx, shown, target, established=False)


def _attest(ctx: ProxyContext, shown: _Shown, target: Target, *, raw: bool) -> Steps:
    """Answer the attestation host with this proxy's nonce, resolving and dialling nothing.

    Allowed (and recorded) once the request was read whole, the answer's ``200``
    then under way; a client gone before that leaves no record.
    """
    body = ctx.nonce.encode("ascii")
    headers: Headers = [(b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()),
                        (b"cache-control", b"no-store")]
    reply = b""
    if raw:
        reply = (b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\n"
                 b"cache-control: no-store\r\nconnection: close\r\n"
                 b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:
        done = yield Answer(status=200, headers=headers,
                            body=b"" if shown.method == "HEAD" else body, raw=reply)
    except Abandoned as abandoned:
        done = abandoned.progress or Done()
    assert isinstance(done, Done)
    shown.add(done)
    if done.refusal is not None:
        # The request's body was malformed: the answer is the refusal's.
        yield from _refuse(shown, done.refusal, ctx.clock, reserved=True)
        return
    if done.status is not None:
        shown.allowed = Decision(verdict=Verdict.ALLOW, reason=Reason.ATTESTATION,
                                 layer=DecisionLayer.PROTOCOL, host=target.host)
    yield from _settle(shown, ctx.clock, reserved=True)


def _judge_method(ctx: ProxyContext, target: Target, event: h11.Request) -> None:
    """Under inspection plain HTTP is judged like decrypted HTTPS, before anything is dialled."""
    inspection = ctx.inspection(target.host, target.port)
    if inspection is None:
        return
    declared = next((int(v) for n, v in event.headers if n == b"content-length"), 0)
    decision = decide_inner(inspection, InnerRequest(
        host=target.host, port=target.port, method=target.method, path=target.path or "/",
        body_bytes=declared,
    ))
    if not decision.allowed:
        raise Refused(decision.reason, f"{target.method} {target.host}{target.path}",
                      layer=decision.layer, host=target.host)


def _admit(ctx: ProxyContext, shown: _Shown,
           target: Target) -> Generator[Command, ExchangeEvent | None, IPAddress | None]:
    """Decide by name, resolve once, decide by every address, and dial a checked one.

    Decided, dialled and recorded on the channel ``channel_for`` gives the target:
    an agent CLI's API host is on the agent channel though the shell's listener took it.
    A docs host served as a page read is neither resolved nor dialled (None).
    """
    shown.channel = channel_for(ctx.policy, ctx.channel, target.host, target.port)
    request = Request(channel=shown.channel, host=target.host, port=target.port)
    by_name = ctx.decisions.name(request)
    if not by_name.allowed:
        raise _policy_refusal(by_name)
    shown.name_would_deny = by_name.would_deny
    if by_name.reason is Reason.ALLOWED_AS_PAGE_READ:
        # The docs reader reads the page through its own channel: nothing is dialled here.
        shown.allowed = by_name
        return None
    literal = parse_ip_literal(target.host)
    if literal is not None:
        addresses: tuple[IPAddress, ...] = (literal,)
    else:
        resolved = yield Resolve(host=target.host, port=target.port)
        assert isinstance(resolved, Resolved)
        addresses = resolved.addresses
    by_address = ctx.decisions.addresses(request, addresses)
    if not by_address.allowed:
        raise _policy_refusal(by_address)
    if not addresses:
        # Report mode let an unresolvable name through: there is nothing to dial.
        raise Refused(Reason.RESOLVE_FAILED, target.host, layer=DecisionLayer.FLOOR,
                      host=target.host)
    shown.allowed = by_name if by_name.would_deny is not None else by_address
    shown.override = by_address.override or by_name.override
    dialled = yield Dial(channel=shown.channel, host=target.host, port=target.port,
                         addresses=addresses, reuse=target.action is Action.FORWARD)
    assert isinstance(dialled, Dialled)
    if dialled.address is None:
        raise upstream_failure(target.host, connected=False)
    shown.resolved = str(dialled.address)
    return dialled.address


# A redirected flow's record names what it carried, once its first flight
# showed it (a CONNECT tunnel's stays https-tunnel, as it always was).
_TRANSPARENT_SCHEMES = {FlightKind.TLS: Scheme.HTTPS_TUNNEL, FlightKind.HTTP: Scheme.HTTP_TUNNEL}


def _carry(ctx: ProxyContext, shown: _Shown, target: Target, *, established: bool) -> Steps:
    """An admitted tunnel: decrypted under inspection, else carried as it is.

    A stream a ``tcp`` rule names (ssh, a database) is carried as it is even
    under inspection: there is no TLS in it to open.
    """
    by_rule = any(p.matches(target.host, target.port) for p in ctx.policy.tcp)
    served = _served(shown)
    done = yield Carry(target=target, established=established, channel=shown.channel,
                       inspect=served or (ctx.inspection(target.host, target.port) is not None
                                          and not by_rule),
                       served=served)
    assert isinstance(done, Done)
    shown.add(done)
    if shown.capture is Capture.TRANSPARENT:
        shown.scheme = _TRANSPARENT_SCHEMES.get(done.flight, Scheme.TCP)
    if done.decision is not None:
        shown.allowed = done.decision
    if done.refusal is not None:
        # Refused before its 200 (a CONNECT that turned out to carry a body).
        yield from _refuse(shown, done.refusal, ctx.clock, reserved=True)
        return
    if done.closed is not None:
        shown.refusal, shown.status = done.closed, None
    yield from _settle(shown, ctx.clock, reserved=True)


def _served(shown: _Shown) -> bool:
    return shown.allowed is not None and shown.allowed.reason is Reason.ALLOWED_AS_PAGE_READ


def _page_answer(text: str, method: str | None) -> Answer:
    """A page the docs reader read, as the answer to a GET (its body) or a HEAD."""
    body = text.encode("utf-8")
    headers: Headers = [(b"content-type", b"text/markdown; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()),
                        (b"cache-control", b"no-store")]
    return Answer(status=200, headers=headers, body=b"" if method == "HEAD" else body)


def _serve_page(shown: _Shown, clock: Clock, url: str, *, inner: bool) -> Steps:
    """Answer a read of a docs host with the page the docs reader read (never dialled).

    Only a read is served: the reader only reads. ``inner``: a request inside
    a served tunnel, its record written; else a proxy request, its record
    into the reservation.
    """
    def refuse(refusal: Refused) -> Steps:
        if inner:
            yield from _refuse_inner(shown, refusal, clock)
        else:
            yield from _refuse(shown, refusal, clock, reserved=True)

    if shown.method not in READ_ONLY:
        yield from refuse(Refused(Reason.METHOD_NOT_ALLOWED, f"{shown.method} {url}: a docs "
                                  "host is only read here", layer=DecisionLayer.METHODS,
                                  host=shown.host))
        return
    page = yield ReadPage(url=url)
    assert isinstance(page, PageText)
    done = yield _page_answer(page.text, shown.method)
    assert isinstance(done, Done)
    shown.add(done)
    if done.refusal is not None:
        yield from refuse(done.refusal)
    elif inner:
        record = shown.record(clock)
        assert record is not None
        yield Record(record=record, mode=RecordMode.WRITTEN)
    else:
        yield from _settle(shown, clock, reserved=True)


class InnerContext(NamedTuple):
    """What a request decrypted inside one admitted CONNECT is judged by."""

    channel: Channel
    policy: InspectionPolicy
    host: str
    port: int
    resolved: str | None
    credentials: tuple[MaskedCredential, ...]
    clock: Clock
    max_head_bytes: int
    # Set when the real server failed verification: every request is refused with it.
    upstream_refusal: Refused | None = None
    # A docs host under ``serve_docs``: each request is answered by the docs reader.
    served: bool = False


def inner_request(ctx: InnerContext) -> Steps:
    """One request decrypted inside an inspected tunnel: judged whole before a byte goes up."""
    event = yield  # type: ignore[misc]
    shown = _Shown(channel=ctx.channel, capture=Capture.PROXY, ts=event.ts,  # type: ignore[union-attr]
                   started=event.started, scheme=Scheme.HTTPS, host=ctx.host,  # type: ignore[union-attr]
                   port=ctx.port, resolved=ctx.resolved)
    if isinstance(event, HeadRefused):
        yield from _refuse_inner(shown, event.refusal, ctx.clock)
        return
    assert isinstance(event, RequestHead)
    yield from _guarded(shown, ctx.clock, _inner_request(ctx, shown, event),
                        mode=RecordMode.WRITTEN)


def _inner_request(ctx: InnerContext, shown: _Shown, event: RequestHead) -> Steps:
    try:
        declared = _check_inner(ctx, shown, event)
        if ctx.upstream_refusal is not None:
            raise ctx.upstream_refusal
        shown.allowed = _decide_inner(ctx, shown, declared or 0)
        shown.override = shown.allowed.override
    except Refused as refusal:
        yield from _refuse_inner(shown, refusal, ctx.clock)
        return
    assert shown.method is not None and shown.path is not None
    if ctx.served:
        shown.allowed = Decision(verdict=Verdict.ALLOW, reason=Reason.ALLOWED_AS_PAGE_READ,
                                 layer=DecisionLayer.ATTRIBUTION, host=ctx.host)
        url = f"https://{authority_text(ctx.host, ctx.port, default_port=443)}{shown.path}"
        yield from _serve_page(shown, ctx.clock, url, inner=True)
        return
    headers, shown.credentials = substitute(end_to_end(list(event.event.headers)),
                                            ctx.credentials, host=ctx.host, port=ctx.port)
    host = authority_text(ctx.host, ctx.port, default_port=443).encode("ascii")
    request = h11.Request(method=event.event.method, target=event.event.target,
                          headers=[(b"host", host), *headers])
    over = Refused(Reason.BODY_TOO_LARGE, f"{shown.method} {ctx.host}{shown.path}",
                   layer=DecisionLayer.METHODS, host=ctx.host)
    done = yield Forward(request=request, host=ctx.host, cap=ctx.policy.max_body_bytes,
                         cap_refusal=over)
    assert isinstance(done, Done)
    shown.add(done)
    if done.refusal is not None:
        yield from _refuse_inner(shown, done.refusal, ctx.clock)
        return
    record = shown.record(ctx.clock)
    assert record is not None
    yield Record(record=record, mode=RecordMode.WRITTEN)


def _refuse_inner(shown: _Shown, refusal: Refused, clock: Clock) -> Steps:
    shown.refusal, shown.allowed = refusal, None
    data = refusal_answer(refusal, shown.method)
    shown.status = refusal.status
    shown.bytes_down += len(data)
    record = shown.record(clock)
    assert record is not None
    yield Record(record=record, mode=RecordMode.WRITTEN)
    yield Refuse(refusal=refusal, data=data)


def _check_inner(ctx: InnerContext, shown: _Shown, head: RequestHead) -> int | None:
    """Judge a decrypted head; returns the declared body length (None when chunked)."""
    headers = list(head.event.headers)
    check_framing(headers, head.raw, max_head_bytes=ctx.max_head_bytes)
    try:
        shown.method = head.event.method.decode("ascii")
        shown.path = head.event.target.decode("ascii")
    except UnicodeDecodeError:
        raise Refused(Reason.MALFORMED_REQUEST, "non-ASCII request line") from None
    if not shown.path.startswith("/"):
        raise Refused(Reason.MALFORMED_REQUEST,
                      "request target inside a tunnel must be origin-form", host=ctx.host)
    hosts = [value for name, value in headers if name == b"host"]
    # HTTP/1.0 may omit Host, and two could name two hosts: exactly one is judged.
    if len(hosts) != 1:
        raise Refused(Reason.HOST_MISMATCH,
                      f"{len(hosts)} Host headers inside the tunnel; exactly one is needed",
                      host=ctx.host)
    text = hosts[0].decode("ascii", "replace")
    try:
        named = parse_authority(text, default_port=443)
    except Refused:
        named = None
    if named != (ctx.host, ctx.port):
        raise Refused(Reason.HOST_MISMATCH,
                      f"Host {text!r} is not the CONNECT target {ctx.host}:{ctx.port}",
                      host=ctx.host)
    length = next((v for n, v in headers if n == b"content-length"), None)
    if length is not None:
        return int(length)
    return None if any(n == b"transfer-encoding" for n, _ in headers) else 0


def _decide_inner(ctx: InnerContext, shown: _Shown, body_bytes: int) -> Decision:
    assert shown.method is not None and shown.path is not None
    decision = decide_inner(ctx.policy, InnerRequest(
        host=ctx.host, port=ctx.port, method=shown.method, path=shown.path,
        body_bytes=body_bytes,
    ))
    if not decision.allowed:
        raise Refused(decision.reason, f"{shown.method} {ctx.host}{shown.path}",
                      layer=decision.layer, host=ctx.host)
    return decision


def run_table(steps: Steps, events: Sequence[ExchangeEvent]) -> list[list[Command]]:
    """The commands each of ``events`` caused, in order: a table's right-hand column."""
    # Tests drive the paths with tables of events and the commands they must
    # cause (``tests/proxy/test_exchange_tables.py``).
    handler = Handler(steps)
    return [handler.handle(event) for event in events]
