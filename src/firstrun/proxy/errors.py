"""Where the proxy's foreign errors become firstrun's, in one place.

Guarantee: every refusal the proxy sends is a ``Refused`` carrying a
``Reason`` and an HTTP status chosen by ``status_for``, and every foreign
exception (h11's ``ProtocolError``, ``OSError`` from a socket or the
resolver) is mapped here by its type or h11's status hint, never by its
message text. The rest of the proxy raises and catches only these types.
"""

from __future__ import annotations

import h11

from firstrun.errors import ProxyError
from firstrun.policy.decision import DecisionLayer, Reason

_STATUS = {
    Reason.MALFORMED_REQUEST: 400,
    Reason.SMUGGLING_SUSPECTED: 400,
    Reason.INVALID_HOST: 400,
    Reason.REQUEST_TIMEOUT: 408,
    Reason.UNSUPPORTED_METHOD: 405,
    Reason.HEADERS_TOO_LARGE: 431,
    Reason.RESOLVE_FAILED: 502,
    Reason.UPSTREAM_FAILED: 502,
    Reason.METHOD_NOT_ALLOWED: 405,
    Reason.BODY_TOO_LARGE: 413,
    Reason.UPSTREAM_CERTIFICATE_INVALID: 502,
    # The proxy's own limit, not a judgement of the request: a client that
    # retries on 503 is right to, with the next run.
    Reason.RECORD_BUDGET_EXHAUSTED: 503,
}


def status_for(reason: Reason) -> int:
    """The status a refusal for ``reason`` gets; any policy denial is 403."""
    return _STATUS.get(reason, 403)


class Refused(ProxyError):
    """The proxy answers this request with an error status and records a denial.

    ``host`` is the canonical host when one was known; the response body is
    one line naming the reason and the host.
    """

    def __init__(
        self,
        reason: Reason,
        detail: str,
        *,
        layer: DecisionLayer = DecisionLayer.PROTOCOL,
        host: str | None = None,
    ) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.layer = layer
        self.host = host
        self.detail = detail

    @property
    def status(self) -> int:
        return status_for(self.reason)


class PeerGone(ProxyError):
    """The client closed, reset or stalled its connection mid-exchange."""


class UpstreamGone(ProxyError):
    """The upstream closed, reset, stalled or spoke broken HTTP mid-exchange."""


class UpstreamStalled(UpstreamGone):
    """The upstream sent nothing for the whole upstream timeout: it may still be working."""


def refusal_for_protocol_error(exc: h11.RemoteProtocolError) -> Refused:
    """A client's malformed HTTP, classified by h11's own status hint."""
    if exc.error_status_hint == 431:
        return Refused(Reason.HEADERS_TOO_LARGE, "request head too large")
    return Refused(Reason.MALFORMED_REQUEST, f"malformed request ({exc.error_status_hint})")


def upstream_failure(host: str, *, connected: bool) -> Refused:
    """The upstream could not be dialled, or failed before its response head."""
    kind = "upstream failed before responding" if connected else "cannot connect upstream"
    return Refused(Reason.UPSTREAM_FAILED, f"{kind}: {host}", host=host)


def listen_failed(exc: OSError, where: str) -> ProxyError:
    return ProxyError(f"cannot listen on {where}: {exc.strerror or exc}")
