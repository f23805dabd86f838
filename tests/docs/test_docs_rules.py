"""Pure parts of read_docs: robots.txt matching, conversion, the cache file format."""

from __future__ import annotations

import pytest
from bs4 import BeautifulSoup
from hypothesis import given
from hypothesis import strategies as st

from firstrun.docs.cache import DiskCache, Entry
from firstrun.docs.convert import code_language, convert, media_type
from firstrun.docs.reader import default_user_agent
from firstrun.docs.robots import rules_from_response

UA = "firstrun/0.1.0 (+docs reading for quickstart tests)"


def robots(text: str):
    return rules_from_response(200, text.encode())


@pytest.mark.parametrize(
    ("text", "path", "allowed"),
    [
        # RFC 9309 §2.2.2: the most specific (longest) rule wins, whatever the order.
        ("User-agent: *\nAllow: /\nDisallow: /private\n", "/private/x", False),
        ("User-agent: *\nDisallow: /docs/\nAllow: /docs/public/\n", "/docs/public/a", True),
        ("User-agent: *\nDisallow: /docs/\nAllow: /docs/public/\n", "/docs/other", False),
        # Equal length: Allow, the least restrictive.
        ("User-agent: *\nDisallow: /page\nAllow: /page\n", "/page", True),
        # Wildcards and end anchors.
        ("User-agent: *\nDisallow: /*.pdf$\n", "/guide/manual.pdf", False),
        ("User-agent: *\nDisallow: /*.pdf$\n", "/guide/manual.pdf.html", True),
        ("User-agent: *\nDisallow: /*?print=\n", "/guide?print=1", False),
        ("User-agent: *\nDisallow: /*?print=\n", "/guide", True),
        # Percent-encoding is compared in one form.
        ("User-agent: *\nDisallow: /caf%C3%A9\n", "/café/menu", False),
        # An empty Disallow allows everything.
        ("User-agent: *\nDisallow:\n", "/anything", True),
        # A group for another robot does not bind us.
        ("User-agent: otherbot\nDisallow: /\n", "/anything", True),
        ("User-agent: FirstRun\nDisallow: /x\n\nUser-agent: *\nDisallow: /\n", "/y", True),
    ],
)
def test_robots_matching(text, path, allowed):
    assert robots(text).allows(f"https://docs.example.test{path}", UA) is allowed


@pytest.mark.parametrize(
    ("text", "path", "allowed"),
    [
        # RFC 9309 §2.2.1: two groups for firstrun are one, wherever they are.
        ("User-agent: firstrun\nDisallow: /a\n\nUser-agent: otherbot\nDisallow: /\n\n"
         "User-agent: firstrun\nDisallow: /b\n", "/a/x", False),
        ("User-agent: firstrun\nDisallow: /a\n\nUser-agent: otherbot\nDisallow: /\n\n"
         "User-agent: firstrun\nDisallow: /b\n", "/b/x", False),
        ("User-agent: firstrun\nDisallow: /a\n\nUser-agent: otherbot\nDisallow: /\n\n"
         "User-agent: firstrun\nDisallow: /b\n", "/c", True),
        # ... merged before matching, so the longest rule wins across them.
        ("User-agent: firstrun\nDisallow: /docs/\n\nUser-agent: FIRSTRUN\nAllow: /docs/public/\n",
         "/docs/public/a", True),
        ("User-agent: firstrun\nDisallow: /docs/\n\nUser-agent: FIRSTRUN\nAllow: /docs/public/\n",
         "/docs/other", False),
        # One group naming several robots, firstrun among them.
        ("User-agent: otherbot\nUser-agent: firstrun\nDisallow: /a\n", "/a", False),
        # The * groups, merged too, bind us only when no group names firstrun.
        ("User-agent: otherbot\nDisallow: /\n\nUser-agent: *\nDisallow: /private\n", "/private/x", False),
        ("User-agent: otherbot\nDisallow: /\n\nUser-agent: *\nDisallow: /private\n", "/public", True),
        ("User-agent: *\nDisallow: /a\n\nUser-agent: otherbot\nAllow: /\n\nUser-agent: *\nDisallow: /b\n",
         "/b", False),
        ("User-agent: *\nDisallow: /\n\nUser-agent: firstrun\nAllow: /\n", "/page", True),
        ("User-agent: *\nDisallow: /\n\nUser-agent: firstrun\nDisallow: /x\n", "/page", True),
        # Only the product token is matched: not a longer name, nor a word of our UA's comment.
        ("User-agent: firstrun-canary\nDisallow: /\n", "/page", True),
        ("User-agent: docs\nDisallow: /\n\nUser-agent: tests\nDisallow: /\n", "/page", True),
        # No group at all (empty or garbage, e.g. an HTML page): nothing binds us.
        ("", "/page", True),
        ("<!doctype html>\n<html><body><p style=\"color: red\">Disallow: /</p></body></html>\n", "/page", True),
        ("\ufffd\x00\ufffdPNG\n\x1a\n", "/page", True),
    ],
)
def test_robots_groups(text, path, allowed):
    assert robots(text).allows(f"https://docs.example.test{path}", UA) is allowed


@pytest.mark.parametrize(
    ("rules", "path", "allowed"),
    [
        # RFC 9309 §2.2.3: '*' is any run of characters, in the middle or at the end.
        ("Disallow: /*/private/\n", "/en/private/page", False),
        ("Disallow: /*/private/\n", "/private/page", True),
        ("Disallow: /a*b*c\n", "/axxbyyc/d", False),
        ("Disallow: /a*b*c\n", "/axxcyyb", True),
        ("Disallow: /private*\n", "/private", False),
        ("Disallow: *.json\n", "/api/v1/spec.json", False),
        # '$' anchors the end of path and query; elsewhere it is a character.
        ("Disallow: /index$\n", "/index", False),
        ("Disallow: /index$\n", "/index.html", True),
        ("Disallow: /*.php$\n", "/a/b.php", False),
        ("Disallow: /*.php$\n", "/a/b.php?x=1", True),
        ("Disallow: /$\n", "/", False),
        ("Disallow: /$\n", "/page", True),
        ("Disallow: /a$b\n", "/a$b/c", False),
        # §2.2.2: the longest match wins between Allow and Disallow, wildcards counted.
        ("Disallow: /\nAllow: /$\n", "/", True),
        ("Disallow: /\nAllow: /$\n", "/page", False),
        ("Allow: /p\nDisallow: /\n", "/page", True),
        ("Disallow: /docs/\nAllow: /*.html\n", "/docs/a.html", True),
        ("Disallow: /docs/*.html\nAllow: /docs/\n", "/docs/a.html", False),
        ("Disallow: /docs/*.html\nAllow: /docs/\n", "/docs/a.txt", True),
        # Equal length, one with a wildcard: Allow, the least restrictive.
        ("Disallow: /a*\nAllow: /ab\n", "/abc", True),
    ],
)
def test_robots_patterns(rules, path, allowed):
    assert robots(f"User-agent: firstrun\n{rules}").allows(f"https://docs.example.test{path}", UA) is allowed


def test_robots_match_firstruns_own_user_agent():
    # The header the reader sends, whatever the version: its product token is firstrun.
    rules = robots("User-agent: *\nAllow: /\n\nUser-agent: FirstRun\nDisallow: /\n")
    assert rules.allows("https://docs.example.test/page", default_user_agent()) is False
    assert rules.allows("https://docs.example.test/page", "otherbot/1.0") is True


@pytest.mark.parametrize(
    ("status", "allowed"), [(404, True), (410, True), (401, True), (429, False), (500, False), (503, False)]
)
def test_robots_status(status, allowed):
    assert rules_from_response(status, b"User-agent: *\nDisallow: /\n").allows("https://h/x", UA) is allowed


def test_crawl_delay():
    assert robots("User-agent: *\nCrawl-delay: 7\n").crawl_delay(UA) == 7.0
    assert robots("User-agent: *\nDisallow: /x\n").crawl_delay(UA) is None


@pytest.mark.parametrize(
    ("text", "delay"),
    [
        # From the merged group of firstrun's groups, not from the * group.
        ("User-agent: firstrun\nDisallow: /a\n\nUser-agent: firstrun\nCrawl-delay: 4\n", 4.0),
        ("User-agent: *\nCrawl-delay: 9\n\nUser-agent: firstrun\nDisallow: /x\n", None),
        ("User-agent: firstrun\nCrawl-delay: 2.5\n", 2.5),
        ("User-agent: firstrun\nCrawl-delay: soon\n", None),
    ],
)
def test_crawl_delay_groups(text, delay):
    assert robots(text).crawl_delay(UA) == delay


@pytest.mark.parametrize(
    ("html", "language"),
    [
        ('<pre><code class="language-python">x</code></pre>', "python"),
        ('<pre><code class="lang-js">x</code></pre>', "js"),
        ('<div class="highlight-console notranslate"><div class="highlight"><pre>x</pre></div></div>', "console"),
        ('<div class="highlight-default notranslate"><div class="highlight"><pre>x</pre></div></div>', None),
        ('<div class="sourceCode"><pre class="sourceCode python"><code>x</code></pre></div>', "python"),
        ('<pre data-lang="TOML">x</pre>', "toml"),
        ('<pre class="prism-code language-tsx"><code>x</code></pre>', "tsx"),
        ("<pre>x</pre>", None),
    ],
)
def test_code_language_from_markup(html, language):
    pre = BeautifulSoup(html, "html.parser").find("pre")
    assert code_language(pre) == language


@given(st.text(alphabet="`ab\n ", max_size=40))
def test_no_code_can_close_its_fence_early(code):
    html = "<pre><code>" + code.replace("&", "&amp;").replace("<", "&lt;") + "</code></pre>"
    markdown = convert(html.encode(), media="text/html", charset=None, url="https://h/", max_chars=10_000).markdown
    if not code.strip("\n"):
        return
    fence = markdown.split("\n", 1)[0]
    assert set(fence) == {"`"} and len(fence) >= 3
    # The block closes only at its last line: no line inside is the fence.
    inner = markdown.rstrip("\n").split("\n")[1:-1]
    assert not any(line.strip() == fence or line.startswith(fence) for line in inner)
    assert markdown.rstrip("\n").endswith(fence)


def test_body_without_main_drops_page_chrome_but_keeps_article_parts():
    html = b"""<body><header><a href="/">Site</a></header><aside>Sidebar</aside>
    <article><header><h1>Title</h1></header><p>Body</p><aside>A callout</aside></article>
    <article><p>Second</p></article><footer>Foot</footer></body>"""
    md = convert(html, media="text/html", charset=None, url="https://h/p", max_chars=10_000).markdown
    assert "# Title" in md and "A callout" in md and "Second" in md
    assert "Sidebar" not in md and "Site" not in md and "Foot" not in md


def test_charset_from_meta_is_honoured():
    html = '<meta charset="iso-8859-1"><p>café</p>'.encode("iso-8859-1")
    md = convert(html, media="text/html", charset=None, url="https://h/", max_chars=1000).markdown
    assert "café" in md


@pytest.mark.parametrize(
    ("content_type", "body", "expected"),
    [
        ("text/html; charset=utf-8", b"", "text/html"),
        ("TEXT/Markdown", b"", "text/markdown"),
        ("application/json", b"{}", "application/json"),
        ("image/png", b"\x89PNG", None),
        ("application/octet-stream", b"abc", None),
        (None, b"  <!DOCTYPE html><p>x", "text/html"),
        (None, b"plain words", "text/plain"),
        (None, b"\x00\x01\x02", None),
    ],
)
def test_media_type(content_type, body, expected):
    assert media_type(content_type, body) == expected


def test_cache_round_trip_and_age(tmp_path):
    now = [5000.0]
    cache = DiskCache(str(tmp_path), wall_clock=lambda: now[0])
    entry = Entry(
        url="https://h/robots.txt", status=200, content_type="text/plain", location=None,
        body=b"User-agent: *\n\x00binary-safe\n", stored_at=now[0],
    )
    cache.put(entry)
    assert cache.get(entry.url) == entry
    assert cache.get("https://h/other") is None
    now[0] += 100
    assert cache.get(entry.url, max_age_s=50) is None
    assert cache.get(entry.url, max_age_s=500) == entry
    assert [p.name.startswith(".tmp-") for p in tmp_path.iterdir()] == [False]
