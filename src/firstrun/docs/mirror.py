"""Serving a docs host from a local directory or a local server (``--docs-mirror``).

Guarantee: a mirrored host reads exactly as the real one would, through the
same reader (allow-list, robots, redirects, conversion) and under the same
URLs: a mirror swaps only the transport beneath it. A directory mirror serves
only regular files whose real path lies inside its directory; a path that
leads out is a 403. A server mirror must be on loopback, because mirror
traffic bypasses the egress proxy and must never be a way around it.
"""

from __future__ import annotations

import mimetypes
import os
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import httpx

from firstrun.errors import PolicyError, UsageError
from firstrun.policy.filesystem import is_under
from firstrun.policy.hosts import canonical_host, parse_ip_literal

FLAG = "--docs-mirror"

# Extensions a docs tree is made of; mimetypes alone depends on the machine's
# /etc/mime.types, and a mirror must serve the same types everywhere.
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".md": "text/markdown; charset=utf-8",
    ".markdown": "text/markdown; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".rst": "text/x-rst; charset=utf-8",
    ".json": "application/json",
}


@dataclass(frozen=True, kw_only=True)
class Mirror:
    """Docs host ``host`` (canonical) served from ``directory`` or from ``base_url``."""

    host: str
    directory: str | None = None
    base_url: str | None = None

    def __post_init__(self) -> None:
        if (self.directory is None) == (self.base_url is None):
            raise UsageError(f"a mirror for {self.host} needs exactly one of a directory or a URL")

    @classmethod
    def parse(cls, text: str) -> Mirror:
        """Parse ``HOST=DIR`` or ``HOST=URL``; errors are one line naming the flag."""
        host_text, sep, source = text.partition("=")
        if not sep or not host_text.strip() or not source.strip():
            raise UsageError(f"{FLAG} {text!r}: expected HOST=DIR or HOST=URL")
        try:
            host = canonical_host(host_text)
        except PolicyError as exc:
            raise UsageError(f"{FLAG} {text!r}: {exc.args[0]}") from None
        source = source.strip()
        if "://" in source:
            return cls(host=host, base_url=_parse_local_base(text, source))
        if not os.path.isdir(source):
            raise UsageError(f"{FLAG} {text!r}: {source} is not a directory")
        return cls(host=host, directory=os.path.realpath(source))


def parse_mirrors(texts: Iterable[str]) -> dict[str, Mirror]:
    """Parse repeated ``--docs-mirror`` values into the map ``DocsReader`` takes."""
    mirrors: dict[str, Mirror] = {}
    for text in texts:
        mirror = Mirror.parse(text)
        if mirror.host in mirrors:
            raise UsageError(f"{FLAG} {text!r}: {mirror.host} is already mirrored")
        mirrors[mirror.host] = mirror
    return mirrors


def _parse_local_base(text: str, source: str) -> str:
    try:
        parts = urllib.parse.urlsplit(source)
    except ValueError:  # an unclosed IPv6 bracket, for one
        raise UsageError(f"{FLAG} {text!r}: not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{FLAG} {text!r}: a mirror URL is just http(s)://HOST[:PORT]")
    # Only an origin: the served pages' root-relative links and Locations name
    # paths from "/", so a path prefix would serve a different site.
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise UsageError(f"{FLAG} {text!r}: a mirror URL is just http(s)://HOST[:PORT]")
    ip = parse_ip_literal(parts.hostname)
    if parts.hostname.lower() != "localhost" and (ip is None or not ip.is_loopback):
        raise UsageError(f"{FLAG} {text!r}: a mirror server must be on loopback")
    try:
        _ = parts.port  # urllib validates the port only when it is read
    except ValueError:
        raise UsageError(f"{FLAG} {text!r}: bad port in mirror URL") from None
    return f"{parts.scheme}://{parts.netloc}"


class MirrorTransport(httpx.BaseTransport):
    """Routes requests for mirrored hosts locally and everything else upstream."""

    def __init__(
        self,
        mirrors: Mapping[str, Mirror],
        *,
        upstream: httpx.BaseTransport,
        local: httpx.BaseTransport,
    ) -> None:
        self._mirrors = dict(mirrors)
        self._upstream = upstream
        self._local = local

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            mirror = self._mirrors.get(canonical_host(request.url.raw_host.decode("ascii")))
        except PolicyError:
            mirror = None
        if mirror is None:
            return self._upstream.handle_request(request)
        if mirror.directory is not None:
            return serve_directory(mirror.directory, request.url.raw_path)
        assert mirror.base_url is not None
        return self._forward(mirror.base_url, request)

    def _forward(self, base_url: str, request: httpx.Request) -> httpx.Response:
        target = httpx.URL(base_url + request.url.raw_path.decode("ascii"))
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"host"]
        response = self._local.handle_request(
            httpx.Request(request.method, target, headers=headers, extensions=request.extensions)
        )
        location = response.headers.get("location")
        if location is not None:
            response.headers["location"] = _unmirror_location(location, base_url, request.url)
        return response

    def close(self) -> None:
        self._upstream.close()
        self._local.close()


def _unmirror_location(location: str, base_url: str, original: httpx.URL) -> str:
    """A Location pointing into the mirror server, rewritten to the mirrored host.

    Relative Locations need nothing: they resolve against the original URL.
    """
    loc = urllib.parse.urlsplit(location)
    base = urllib.parse.urlsplit(base_url)
    if loc.scheme != base.scheme or loc.netloc.lower() != base.netloc.lower():
        return location
    netloc = original.netloc.decode("ascii")
    return urllib.parse.urlunsplit((original.scheme, netloc, loc.path or "/", loc.query, loc.fragment))


# ``..`` segments, encoded slashes and symlinks that lead out are all refused (403).
def serve_directory(root: str, raw_path: bytes) -> httpx.Response:
    """Answer a GET for ``raw_path`` (path and query, still percent-encoded) from ``root``.

    ``/`` serves index.html, ``/a/`` serves a/index.html, ``/a`` serves the
    file a, else a.html, else redirects to ``/a/`` when a/index.html exists,
    as a static web server does, so relative links in it resolve the same.
    """
    path = raw_path.split(b"?", 1)[0].decode("ascii", "replace")
    segments: list[str] = []
    for raw_segment in path.split("/"):
        segment = urllib.parse.unquote(raw_segment)
        if segment in ("", "."):
            continue
        if segment == ".." or "/" in segment or "\\" in segment or "\x00" in segment:
            return _status(403)
        segments.append(segment)
    real_root = os.path.realpath(root)
    here = os.path.join(real_root, *segments)
    if not segments or path.endswith("/"):
        candidates = [os.path.join(here, "index.html")]
    else:
        candidates = [here, here + ".html"]
    for candidate in candidates:
        if os.path.lexists(candidate):
            real = os.path.realpath(candidate)
            if not _inside(real, real_root):
                return _status(403)
            if os.path.isfile(real):
                return _file(real)
    if segments and not path.endswith("/") and os.path.isfile(os.path.join(here, "index.html")):
        if not _inside(os.path.realpath(here), real_root):
            return _status(403)
        return httpx.Response(301, headers={"location": path + "/"})
    return _status(404)


def _inside(real: str, real_root: str) -> bool:
    # A mirror of / holds only / itself: it would otherwise lend the docs
    # reader, and so the agent, every file the harness may read.
    return is_under(real, real_root) and (real_root != "/" or real == real_root)


def _file(path: str) -> httpx.Response:
    ext = os.path.splitext(path)[1].lower()
    content_type = _TYPES.get(ext) or mimetypes.guess_type(path)[0] or "application/octet-stream"
    try:
        with open(path, "rb") as f:
            body = f.read()
    except OSError:
        # What a static server answers for a file it may not read.
        return _status(403)
    return httpx.Response(200, headers={"content-type": content_type}, content=body)


def _status(code: int) -> httpx.Response:
    reason = {403: "forbidden", 404: "not found"}[code]
    return httpx.Response(code, headers={"content-type": "text/plain; charset=utf-8"}, content=reason)
