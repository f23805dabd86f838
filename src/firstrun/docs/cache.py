"""An on-disk cache of docs responses, keyed by URL.

Guarantee: an entry is either read back exactly as stored (same URL, same
body, checked against its sha256) or not at all; a torn or tampered file is a
miss, never a wrong page, and a write is atomic, so concurrent readers and an
interrupted run never see half an entry. One entry is one response, a redirect
included, so a cached chain is walked hop by hop under the same allow-list and
robots checks as a live one. An entry expires only for a ``get`` with ``max_age_s``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from firstrun.errors import DocsError

_FORMAT = 1


class CacheMode(StrEnum):
    """How a reader with a cache uses it: ``use`` serves an entry while it is fresh (pages
    forever, robots.txt for a day) and stores what it fetched; ``refresh`` fetches every
    page anew and stores it; ``offline`` serves only what is stored, however old, and
    never fetches: a miss is the harness's failure, not the docs'."""

    USE = "use"
    REFRESH = "refresh"
    OFFLINE = "offline"


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One HTTP response as the reader needs it."""

    url: str
    status: int
    content_type: str | None
    location: str | None
    body: bytes
    stored_at: float


def _optional_str(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"expected a string, got {type(value).__name__}")


class DiskCache:
    """Entries live in ``directory`` as ``<sha256(url)>.entry``: a JSON line, then the body."""

    def __init__(self, directory: str, *, wall_clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self._wall_clock = wall_clock
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise DocsError(f"cannot create docs cache directory {directory}: {exc.strerror}") from exc

    def _path(self, url: str) -> str:
        return os.path.join(self.directory, hashlib.sha256(url.encode()).hexdigest() + ".entry")

    def get(self, url: str, *, max_age_s: float | None = None) -> Entry | None:
        path = self._path(url)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DocsError(f"cannot read docs cache entry {path}: {exc.strerror}") from exc
        header_bytes, sep, body = raw.partition(b"\n")
        if not sep:
            return None
        try:
            header = json.loads(header_bytes)
        except ValueError:
            return None
        if (
            not isinstance(header, dict)
            or header.get("format") != _FORMAT
            or header.get("url") != url
            or header.get("sha256") != hashlib.sha256(body).hexdigest()
        ):
            return None
        try:
            entry = Entry(
                url=url,
                status=int(header["status"]),
                content_type=_optional_str(header.get("content_type")),
                location=_optional_str(header.get("location")),
                body=body,
                stored_at=float(header["stored_at"]),
            )
        except (KeyError, TypeError, ValueError):
            return None
        if max_age_s is not None and self._wall_clock() - entry.stored_at > max_age_s:
            return None
        return entry

    def put(self, entry: Entry) -> None:
        header = {
            "format": _FORMAT,
            "url": entry.url,
            "status": entry.status,
            "content_type": entry.content_type,
            "location": entry.location,
            "sha256": hashlib.sha256(entry.body).hexdigest(),
            "stored_at": entry.stored_at,
        }
        data = json.dumps(header, separators=(",", ":")).encode() + b"\n" + entry.body
        path = self._path(entry.url)
        try:
            # Atomic: a temporary file in the same directory, then ``os.replace``.
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".entry")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            raise DocsError(f"cannot write docs cache entry {path}: {exc.strerror}") from exc

    def now(self) -> float:
        return self._wall_clock()
