"""Credential masking: the sandbox holds a placeholder, the proxy holds the value.

Guarantee: a credential's real value is read from the harness's environment
by ``mint`` and lives only in the proxy; the sandbox's environment gets a
per-run random placeholder under the credential's name. A placeholder is
swapped for its value only in the headers of a request the proxy decrypted
that goes to the host the credential names; sent in clear or to any other
host it arrives as the placeholder. Records name the credentials, never a value.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from firstrun.errors import UsageError
from firstrun.policy.hosts import HostPattern
from firstrun.policy.methods import CredentialRule
from firstrun.proxy.request import Headers

_BASIC = b"basic "


@dataclass(frozen=True, kw_only=True)
class MaskedCredential:
    name: str
    pattern: HostPattern
    placeholder: str
    # Not in repr: a record or a traceback that prints this must not show it.
    value: str = field(repr=False)


def mint(rules: Sequence[CredentialRule], env: Mapping[str, str]) -> tuple[MaskedCredential, ...]:
    """A fresh placeholder for each rule, with its value from ``env``; a missing value is refused."""
    minted = []
    for rule in rules:
        value = env.get(rule.from_env)
        if not value:
            raise UsageError(
                f"credential {rule.name}: ${rule.from_env} is not set in firstrun's environment; "
                f"export it (the sandbox only ever sees a placeholder)"
            )
        if not value.isprintable():
            # A line break in a header value would let the value forge headers.
            raise UsageError(
                f"credential {rule.name}: ${rule.from_env} holds a control character; "
                "a header value must be one printable line"
            )
        placeholder = f"firstrun-{rule.name.lower()}-{secrets.token_hex(16)}"
        minted.append(MaskedCredential(name=rule.name, pattern=rule.pattern,
                                       placeholder=placeholder, value=value))
    return tuple(minted)


def sandbox_variables(credentials: Sequence[MaskedCredential]) -> dict[str, str]:
    """What the sandbox's environment holds for the credentials: placeholders only."""
    return {c.name: c.placeholder for c in credentials}


def _swap(value: bytes, wanted: Sequence[MaskedCredential], used: list[str]) -> bytes:
    for cred in wanted:
        placeholder = cred.placeholder.encode("ascii")
        if placeholder in value:
            value = value.replace(placeholder, cred.value.encode("utf-8"))
            if cred.name not in used:
                used.append(cred.name)
    return value


def _swap_basic(value: bytes, wanted: Sequence[MaskedCredential], used: list[str]) -> bytes:
    try:
        decoded = base64.b64decode(value[len(_BASIC):].strip(), validate=True)
    except (binascii.Error, ValueError):
        return value
    swapped = _swap(decoded, wanted, used)
    if swapped == decoded:
        return value
    return value[: len(_BASIC)] + base64.b64encode(swapped)


def substitute(
    headers: Headers, credentials: Sequence[MaskedCredential], *, host: str, port: int
) -> tuple[Headers, tuple[str, ...]]:
    """``headers`` with the placeholders of ``host``'s credentials swapped, and the names swapped."""
    # Called only for a request decrypted under TLS inspection
    # (``exchange.inner_request``), never for plain HTTP. Swapped: header values
    # holding the placeholder verbatim (``Authorization: Bearer <placeholder>``,
    # ``X-Api-Key``), and ``Authorization: Basic`` credentials, which carry it
    # base64 encoded (pip and git put a token in the URL's userinfo and send it
    # that way). Never the request line (paths and queries end up in upstream
    # logs), never a body (it would have to be buffered and rewritten), never a
    # response.
    wanted = [c for c in credentials if c.pattern.matches(host, port)]
    if not wanted:
        return headers, ()
    used: list[str] = []
    out: Headers = []
    for name, value in headers:
        if name == b"authorization" and value[: len(_BASIC)].lower() == _BASIC:
            value = _swap_basic(value, wanted, used)
        else:
            value = _swap(value, wanted, used)
        out.append((name, value))
    return out, tuple(used)
