"""``read_docs``: the agent's only way to read documentation, run on the harness side.

Guarantee: every page an agent reads comes through ``DocsReader.read`` and
yields one ``Page``, so the page record is complete. Every hop, redirects
included, is checked against the docs allow-list (and, with ``hidden`` set, the
affordance filter) before it is requested; robots.txt and per-host spacing are
honoured. A page problem is a ``Page`` with ``error`` set; only a harness
failure raises (``DocsError``, ``ProxyError``, ``UsageError``).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from firstrun import __version__
from firstrun.errors import DocsError, PolicyError, ProxyError, UsageError
from firstrun.policy.hosts import HostPattern, canonical_host

from .affordances import AffordanceFilter
from .blocks import Block, extract, extract_markdown
from .cache import CacheMode, DiskCache, Entry
from .convert import HTML_TYPES, charset_of, convert, decode_text, media_type
from .mirror import Mirror, MirrorTransport
from .page import Page, ReadFailure
from .politeness import Politeness
from .robots import RobotsRules, rules_from_response, unavailable

MAX_REDIRECTS = 5
MAX_BYTES = 5 * 1024 * 1024
MAX_MARKDOWN_CHARS = 200_000
# RFC 9309 §2.4: a cached robots.txt should not be used for more than 24 hours.
ROBOTS_MAX_AGE_S = 24 * 3600.0
# "Disallowed for now" must end: ask again after this long.
ROBOTS_RETRY_S = 60.0

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_ACCEPT = "text/html, application/xhtml+xml, text/markdown;q=0.9, text/plain;q=0.8, */*;q=0.1"


def default_user_agent() -> str:
    return f"firstrun/{__version__} (+docs reading for quickstart tests)"


@dataclass(frozen=True, kw_only=True)
class _Target:
    url: httpx.URL
    host: str
    port: int

    @property
    def origin(self) -> str:
        return f"{self.url.scheme}://{self.host}:{self.port}"


@dataclass(frozen=True, kw_only=True)
class _Failed:
    error: ReadFailure
    detail: str
    bytes: int = 0


@dataclass(frozen=True, kw_only=True)
class _Fetched:
    entry: Entry
    from_cache: bool


@dataclass(frozen=True, kw_only=True)
class _Walk:
    """Where following one URL ended: the hops taken and the last response, if any."""

    hops: tuple[str, ...]
    url_final: str
    last: Entry | None
    failure: _Failed | None
    from_cache: bool


def _page_cacheable(status: int) -> bool:
    return 200 <= status < 300 or status in _REDIRECTS


def _robots_cacheable(status: int) -> bool:
    # A 4xx robots.txt is a definite answer ("no rules"); a 5xx is not.
    return _page_cacheable(status) or (400 <= status < 500 and status != 429)


class DocsReader:
    """Reads docs pages for one run (or many, sharing ``politeness`` and ``cache_dir``)."""

    def __init__(
        self,
        *,
        allow: Sequence[HostPattern],
        proxy: tuple[str, int] | None,
        cache_dir: str | None,
        user_agent: str,
        min_delay_s: float,
        mirrors: Mapping[str, Mirror],
        transport: httpx.BaseTransport | None = None,
        politeness: Politeness | None = None,
        timeout_s: float = 20.0,
        max_bytes: int = MAX_BYTES,
        max_markdown_chars: int = MAX_MARKDOWN_CHARS,
        max_redirects: int = MAX_REDIRECTS,
        hidden: AffordanceFilter | None = None,
        cache_mode: CacheMode = CacheMode.USE,
    ) -> None:
        if min_delay_s < 0 or timeout_s <= 0 or max_bytes <= 0 or max_markdown_chars <= 0:
            raise UsageError("docs reader: delays, timeouts and limits must be positive")
        if not 0 <= max_redirects <= 20:
            raise UsageError("docs reader: max_redirects must be between 0 and 20")
        if cache_mode is not CacheMode.USE and cache_dir is None:
            raise UsageError(f"docs reader: cache mode {cache_mode.value} needs a cache directory")
        if transport is not None and proxy is not None:
            raise UsageError("docs reader: give a proxy or a transport, not both")
        if not user_agent.strip():
            raise UsageError("docs reader: the User-Agent must say who is asking")
        for key, mirror in mirrors.items():
            if canonical_host(key) != mirror.host:
                raise UsageError(f"docs reader: mirror for {mirror.host} is filed under {key!r}")
        self.allow = tuple(allow)
        self.hidden = hidden
        self.user_agent = user_agent
        self.min_delay_s = min_delay_s
        self.politeness = politeness if politeness is not None else Politeness()
        self._proxy = proxy
        self._mirrors = {m.host: m for m in mirrors.values()}
        self._cache = DiskCache(cache_dir) if cache_dir is not None else None
        self._cache_mode = cache_mode
        self._max_bytes = max_bytes
        self._max_chars = max_markdown_chars
        self._max_redirects = max_redirects
        self._robots: dict[str, tuple[RobotsRules, float]] = {}
        self._robots_locks: dict[str, threading.Lock] = {}
        self._robots_guard = threading.Lock()

        # With ``proxy`` set every request to a docs host goes through the egress
        # proxy's docs channel, so its records see it too.
        upstream = transport if transport is not None else httpx.HTTPTransport(
            proxy=httpx.Proxy(_proxy_url(proxy)) if proxy is not None else None
        )
        # Mirrors are on loopback by construction and must not go through the
        # egress proxy, whose floor refuses loopback.
        routed = MirrorTransport(self._mirrors, upstream=upstream, local=httpx.HTTPTransport())
        self._client = httpx.Client(
            transport=routed,
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(timeout_s),
            headers={"User-Agent": user_agent, "Accept": _ACCEPT},
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> DocsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, url: str) -> Page:
        return self._read(url, self.hidden)

    def probe(self, url: str) -> Page:
        """Read ``url`` with no affordance hidden: for the harness, never the agent."""
        return self._read(url, None)

    def _read(self, url: str, hidden: AffordanceFilter | None) -> Page:
        started = time.perf_counter()
        walk = self._walk(url, hidden)
        last = walk.last
        body = last.body if last is not None else b""
        content_type = last.content_type if last is not None else None
        failure = walk.failure
        if failure is None and last is not None and not 200 <= last.status < 300:
            failure = _Failed(error=ReadFailure.HTTP_ERROR, detail=f"HTTP {last.status}")
        media = media_type(content_type, body)
        if failure is None and media is None:
            failure = _Failed(error=ReadFailure.NOT_TEXT, detail=f"content type {content_type or 'unknown'}")
        converted = None
        blocks: tuple[Block, ...] = ()
        if failure is None and media is not None:
            converted = convert(
                body, media=media, charset=charset_of(content_type), url=walk.url_final,
                max_chars=self._max_chars,
            )
            blocks = _blocks(body, media=media, charset=charset_of(content_type), url=url)
        return Page(
            url_requested=url,
            url_final=walk.url_final,
            status=last.status if last is not None else None,
            content_type=content_type,
            bytes=len(body) if last is not None else (failure.bytes if failure else 0),
            sha256=hashlib.sha256(body).hexdigest() if last is not None else None,
            markdown=converted.markdown if converted else "",
            title=converted.title if converted else None,
            links=converted.links if converted else (),
            blocks=blocks,
            from_cache=walk.from_cache,
            error=failure.error if failure else None,
            detail=failure.detail if failure else None,
            hops=walk.hops,
            truncated=converted.truncated if converted else False,
            duration_ms=round((time.perf_counter() - started) * 1000),
        )

    def _walk(self, url: str, hidden: AffordanceFilter | None) -> _Walk:
        """Follow ``url`` hop by hop, checking each hop before it is requested."""
        hops = [url]
        cached: list[bool] = []
        last: Entry | None = None
        url_final = url
        while True:
            current = hops[-1]
            target = self._target(current)
            if isinstance(target, str):
                refused = ReadFailure.NOT_ALLOWED if len(hops) == 1 else ReadFailure.REDIRECT_NOT_ALLOWED
                failure = _Failed(error=refused, detail=target)
                break
            if hidden is not None and hidden.hides(target.url):
                failure = _Failed(error=ReadFailure.AFFORDANCE_HIDDEN,
                                  detail=f"{target.url.path} is a docs affordance "
                                  "(llms.txt, llms-full.txt or a .md variant), hidden in this run")
                break
            rules = self._rules(target)
            if not rules.allows(str(target.url), self.user_agent):
                refused = ReadFailure.UNREACHABLE if rules.unreachable else ReadFailure.ROBOTS_DISALLOWED
                failure = _Failed(error=refused, detail=f"{target.origin} {rules.detail}")
                break
            # Pages never expire: a cached page is served until the cache is
            # refreshed (``CacheMode.REFRESH``) or deleted.
            result = self._fetch(
                target, cacheable=_page_cacheable, max_age_s=None, delay_s=self._delay(target, rules)
            )
            url_final = str(target.url)
            if isinstance(result, _Failed):
                last, failure = None, result
                break
            cached.append(result.from_cache)
            last = result.entry
            if last.status not in _REDIRECTS or not last.location:
                failure = None
                break
            hops.append(_join(target.url, last.location))
            if len(hops) > self._max_redirects + 1:
                failure = _Failed(
                    error=ReadFailure.TOO_MANY_REDIRECTS, detail=f"more than {self._max_redirects} redirects"
                )
                break
        return _Walk(
            hops=tuple(hops),
            url_final=url_final,
            last=last,
            failure=failure,
            from_cache=bool(cached) and all(cached),
        )

    # The check uses the very URL object that is then sent, so no second parser can
    # disagree with it; a redirect that leaves the list is refused and its chain
    # recorded (``Page.hops``).
    def _target(self, raw: str) -> _Target | str:
        """The URL to request, or why it may not be requested."""
        try:
            url = httpx.URL(raw)
        except httpx.InvalidURL:
            return "not a valid URL"
        if url.scheme not in ("http", "https"):
            return f"scheme {url.scheme or '(none)'!r} is not http(s)"
        if url.userinfo:
            return "the URL carries credentials"
        try:
            # The name httpx dials (``url.host`` is its Unicode display form).
            host = canonical_host(url.raw_host.decode("ascii"))
        except PolicyError:
            return "the URL has no valid host"
        port = url.port or (443 if url.scheme == "https" else 80)
        if not any(pattern.matches(host, port) for pattern in self.allow):
            return f"{host}:{port} is not on the docs allow-list"
        return _Target(url=url.copy_with(fragment=None), host=host, port=port)

    def _delay(self, target: _Target, rules: RobotsRules) -> float:
        # A mirror is local: spacing protects remote sites, not our own files.
        if target.host in self._mirrors:
            return 0.0
        return max(self.min_delay_s, rules.crawl_delay(self.user_agent) or 0.0)

    def _rules(self, target: _Target) -> RobotsRules:
        origin = target.origin
        with self._robots_guard:
            lock = self._robots_locks.setdefault(origin, threading.Lock())
        with lock:
            known = self._robots.get(origin)
            if known is not None and known[1] > self.politeness.clock():
                return known[0]
            rules = self._fetch_robots(target)
            ttl = ROBOTS_MAX_AGE_S if rules.parser is not None or rules.allow_all else ROBOTS_RETRY_S
            self._robots[origin] = (rules, self.politeness.clock() + ttl)
            return rules

    def _fetch_robots(self, page_target: _Target) -> RobotsRules:
        current = str(page_target.url.copy_with(path="/robots.txt", query=None))
        for _ in range(self._max_redirects + 1):
            target = self._target(current)
            if isinstance(target, str):
                return unavailable(f"robots.txt redirect refused ({target})")
            result = self._fetch(
                target,
                cacheable=_robots_cacheable,
                max_age_s=ROBOTS_MAX_AGE_S,
                delay_s=0.0 if target.host in self._mirrors else self.min_delay_s,
            )
            if isinstance(result, _Failed):
                return unavailable(
                    f"robots.txt {result.error.value} ({result.detail})",
                    unreachable=result.error is ReadFailure.UNREACHABLE,
                )
            entry = result.entry
            if entry.status in _REDIRECTS and entry.location:
                current = _join(target.url, entry.location)
                continue
            return rules_from_response(entry.status, entry.body)
        return unavailable("robots.txt redirects too often")

    def _fetch(
        self,
        target: _Target,
        *,
        cacheable: Callable[[int], bool],
        max_age_s: float | None,
        delay_s: float,
    ) -> _Fetched | _Failed:
        key = str(target.url)
        # Mirrors are not cached: an author editing a mirrored docs tree sees
        # every change on the next run.
        cache = self._cache if target.host not in self._mirrors else None
        if cache is not None and self._cache_mode is not CacheMode.REFRESH:
            offline = self._cache_mode is CacheMode.OFFLINE
            hit = cache.get(key, max_age_s=None if offline else max_age_s)
            if hit is not None:
                return _Fetched(entry=hit, from_cache=True)
            if offline:
                raise DocsError(f"{key} is not in the docs cache, and --offline fetches nothing; "
                                "run once without --offline to fill it")
        with self.politeness.turn(target.host, delay_s):
            result = self._request(target)
        if isinstance(result, _Failed):
            return result
        if cache is not None and cacheable(result.status):
            cache.put(result)
        return _Fetched(entry=result, from_cache=False)

    def _request(self, target: _Target) -> Entry | _Failed:
        try:
            with self._client.stream("GET", target.url) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self._max_bytes:
                    return _Failed(
                        error=ReadFailure.TOO_LARGE, detail=f"declares {declared} bytes"
                    )
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > self._max_bytes:
                        return _Failed(
                            error=ReadFailure.TOO_LARGE,
                            detail=f"more than {self._max_bytes} bytes",
                            bytes=len(body),
                        )
                return Entry(
                    url=str(target.url),
                    status=response.status_code,
                    content_type=response.headers.get("content-type"),
                    location=response.headers.get("location"),
                    body=bytes(body),
                    stored_at=self._cache.now() if self._cache is not None else time.time(),
                )
        except httpx.ConnectError as exc:
            if self._proxy is not None and target.host not in self._mirrors:
                # Every connection goes to the proxy: this one failing is the
                # harness's trouble, not the docs'.
                raise ProxyError(
                    f"docs channel proxy {_proxy_url(self._proxy)} unreachable: {exc}"
                ) from exc
            return _Failed(error=ReadFailure.UNREACHABLE, detail=_describe(exc))
        except (httpx.TransportError, httpx.DecodingError) as exc:
            return _Failed(error=ReadFailure.UNREACHABLE, detail=_describe(exc))


def _blocks(body: bytes, *, media: str, charset: str | None, url: str) -> tuple[Block, ...]:
    """The page's code blocks, filed under the URL asked for (the route's own name for it)."""
    text = decode_text(body, charset)
    if media in HTML_TYPES:
        return extract(text, url=url)
    if media == "text/markdown":
        return extract_markdown(text, url=url)
    return ()


def _join(base: httpx.URL, location: str) -> str:
    try:
        return str(base.join(location.strip()))
    except httpx.InvalidURL:
        return location


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _proxy_url(proxy: tuple[str, int]) -> str:
    host, port = proxy
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
