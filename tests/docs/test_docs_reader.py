"""DocsReader against real loopback HTTP servers, through real httpx."""

from __future__ import annotations

import json
import threading
from itertools import pairwise

import httpx
import pytest
from docsite import FakeClock, Route

from firstrun.docs import (
    CacheMode,
    DocsReader,
    Mirror,
    Page,
    Politeness,
    ReadFailure,
    default_user_agent,
)
from firstrun.errors import DocsError, ProxyError, UsageError
from firstrun.policy.hosts import HostPattern

QUICKSTART = b"""<!doctype html><html><head><title>Quickstart | Foo</title>
<style>body{color:red}</style><script>track()</script></head><body>
<nav><a href="/install">Install</a> <a href="/next/">Next</a></nav>
<main>
<h1>Quickstart</h1>
<p>Install <code>foo_tool</code>, then read <a href="/api#run">the API</a>.</p>
<div class="highlight-python notranslate"><div class="highlight"><pre><span class="kn">import</span> foo
foo.run()
</pre></div></div>
<pre><code class="language-bash">pip install foo_tool
</code></pre>
<ul><li>one</li><li>two</li></ul>
</main>
<footer>Copyright Foo Inc</footer>
</body></html>"""


def make_reader(*sites, clock: FakeClock | None = None, politeness: Politeness | None = None, **kw) -> DocsReader:
    if politeness is None:
        politeness = Politeness(clock=clock, sleep=clock.sleep) if clock else Politeness()
    options = dict(
        allow=[HostPattern.parse(s.netloc) for s in sites],
        proxy=None,
        cache_dir=None,
        user_agent=default_user_agent(),
        min_delay_s=0.0,
        mirrors={},
        politeness=politeness,
    )
    options.update(kw)
    return DocsReader(**options)


def test_html_becomes_markdown_with_fenced_code_and_absolute_links(serve):
    site = serve({"/quickstart": Route(body=QUICKSTART)})
    with make_reader(site) as reader:
        page = reader.read(site.url("/quickstart"))
    assert page.ok and page.status == 200 and page.error is None
    assert page.title == "Quickstart | Foo"
    assert page.markdown.startswith("# Quickstart\n")
    assert "```python\nimport foo\nfoo.run()\n```" in page.markdown
    assert "```bash\npip install foo_tool\n```" in page.markdown
    assert "Install `foo_tool`" in page.markdown
    assert f"[the API]({site.url('/api#run')})" in page.markdown
    assert "- one\n- two" in page.markdown
    for chrome in ("track()", "color:red", "Copyright", "Next"):
        assert chrome not in page.markdown
    # Navigation is left out of the text but its links are there to follow.
    assert page.links == (site.url("/install"), site.url("/next/"), site.url("/api"))
    assert page.bytes == len(QUICKSTART) and page.sha256 is not None
    assert page.hops == (site.url("/quickstart"),)
    assert not page.from_cache


def test_the_user_agent_says_who_is_asking(serve):
    site = serve({"/p": Route(body=b"<p>x</p>")})
    with make_reader(site) as reader:
        reader.read(site.url("/p"))
    assert {s.user_agent for s in site.seen} == {default_user_agent()}
    assert default_user_agent().startswith("firstrun/")


def test_redirect_within_the_host_is_followed(serve):
    site = serve(
        {
            "/old": Route(status=301, headers={"Location": "/quickstart"}),
            "/quickstart": Route(body=QUICKSTART),
        }
    )
    with make_reader(site) as reader:
        page = reader.read(site.url("/old"))
    assert page.ok
    assert page.url_requested == site.url("/old")
    assert page.url_final == site.url("/quickstart")
    assert page.hops == (site.url("/old"), site.url("/quickstart"))


def test_redirect_to_a_host_not_allowed_is_refused_and_recorded(serve):
    elsewhere = serve({"*": Route(body=b"<p>you should not see this</p>")}, host="127.0.0.2")
    site = serve(
        {
            "/start": Route(status=301, headers={"Location": "/leave"}),
            "/leave": Route(status=302, headers={"Location": elsewhere.url("/secret")}),
        }
    )
    with make_reader(site) as reader:
        page = reader.read(site.url("/start"))
    assert page.error is ReadFailure.REDIRECT_NOT_ALLOWED
    assert page.hops == (site.url("/start"), site.url("/leave"), elsewhere.url("/secret"))
    assert page.url_final == site.url("/leave") and page.status == 302
    assert page.markdown == ""
    # Evidence: the host off the list never saw a request, robots.txt included.
    assert elsewhere.seen == []
    record = page.to_record()
    assert record["error"] == "redirect_not_allowed"
    assert record["hops"][-1] == elsewhere.url("/secret")


def test_redirect_to_another_scheme_is_refused(serve):
    site = serve({"/ftp": Route(status=302, headers={"Location": "ftp://files.example/x"})})
    with make_reader(site) as reader:
        page = reader.read(site.url("/ftp"))
    assert page.error is ReadFailure.REDIRECT_NOT_ALLOWED
    assert page.hops[-1] == "ftp://files.example/x"


def test_redirect_loop_stops(serve):
    site = serve(
        {"/a": Route(status=302, headers={"Location": "/b"}), "/b": Route(status=302, headers={"Location": "/a"})}
    )
    with make_reader(site, max_redirects=3) as reader:
        page = reader.read(site.url("/a"))
    assert page.error is ReadFailure.TOO_MANY_REDIRECTS
    assert len(page.hops) == 5
    assert site.paths().count("/a") + site.paths().count("/b") == 4


def test_a_host_not_allowed_is_never_contacted(serve):
    site = serve({"*": Route(body=b"<p>x</p>")})
    other = serve({"*": Route(body=b"<p>x</p>")}, host="127.0.0.2")
    with make_reader(site) as reader:
        page = reader.read(other.url("/p"))
        not_http = reader.read("file:///etc/passwd")
        with_credentials = reader.read(f"http://user:pw@{site.netloc}/p")
    assert page.error is ReadFailure.NOT_ALLOWED and page.status is None
    assert not_http.error is ReadFailure.NOT_ALLOWED
    assert with_credentials.error is ReadFailure.NOT_ALLOWED
    assert other.seen == [] and site.seen == []


def test_robots_disallow_is_respected(serve):
    robots = b"User-agent: *\nDisallow: /private\nAllow: /private/public\n"
    site = serve(
        {
            "/robots.txt": Route(body=robots, content_type="text/plain"),
            "/private/page": Route(body=b"<p>secret</p>"),
            "/private/public/page": Route(body=b"<p>public</p>"),
        }
    )
    with make_reader(site) as reader:
        refused = reader.read(site.url("/private/page"))
        allowed = reader.read(site.url("/private/public/page"))
    assert refused.error is ReadFailure.ROBOTS_DISALLOWED
    assert refused.status is None and refused.markdown == ""
    assert allowed.ok and "public" in allowed.markdown
    # robots.txt fetched once per origin; the disallowed page never requested.
    assert site.paths() == ["/robots.txt", "/private/public/page"]


def test_robots_rules_addressed_to_firstrun_apply(serve):
    robots = b"User-agent: otherbot\nDisallow:\n\nUser-agent: firstrun\nDisallow: /\n"
    site = serve({"/robots.txt": Route(body=robots, content_type="text/plain"), "/p": Route(body=b"x")})
    with make_reader(site) as reader:
        assert reader.read(site.url("/p")).error is ReadFailure.ROBOTS_DISALLOWED


def test_robots_unavailable_disallows_and_missing_allows(serve):
    broken = serve({"/robots.txt": Route(status=503, body=b"down"), "/p": Route(body=b"<p>x</p>")})
    missing = serve({"/p": Route(body=b"<p>x</p>")}, host="127.0.0.2")
    with make_reader(broken, missing) as reader:
        refused = reader.read(broken.url("/p"))
        read = reader.read(missing.url("/p"))
    assert refused.error is ReadFailure.ROBOTS_DISALLOWED
    assert broken.paths() == ["/robots.txt"]
    assert read.ok and missing.paths() == ["/robots.txt", "/p"]


def test_requests_to_one_host_are_spaced_by_crawl_delay(serve):
    clock = FakeClock()
    robots = b"User-agent: *\nCrawl-delay: 3\n"
    site = serve(
        {"/robots.txt": Route(body=robots, content_type="text/plain"), "*": Route(body=b"<p>x</p>")},
        clock=clock,
    )
    with make_reader(site, clock=clock, min_delay_s=1.0) as reader:
        for path in ("/a", "/b", "/c"):
            assert reader.read(site.url(path)).ok
    assert site.paths() == ["/robots.txt", "/a", "/b", "/c"]
    times = [s.at for s in site.seen]
    gaps = [later - earlier for earlier, later in pairwise(times)]
    # Crawl-delay (larger than min_delay) is known once robots.txt is read,
    # before the first page is asked, so it spaces every request after it.
    assert gaps == [3.0, 3.0, 3.0]


def test_politeness_holds_across_threads_and_readers(serve):
    clock = FakeClock()
    shared = Politeness(clock=clock, sleep=clock.sleep)
    site = serve({"*": Route(body=b"<p>x</p>")}, clock=clock)
    readers = [make_reader(site, politeness=shared, min_delay_s=2.0) for _ in range(3)]
    pages: list[Page] = []
    lock = threading.Lock()

    def work(reader: DocsReader, worker: int) -> None:
        for n in range(3):
            page = reader.read(site.url(f"/w{worker}/p{n}"))
            with lock:
                pages.append(page)

    threads = [threading.Thread(target=work, args=(r, i)) for i, r in enumerate(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for r in readers:
        r.close()
    assert len(pages) == 9 and all(p.ok for p in pages)
    # Three readers each ask robots.txt once, then three pages: 12 requests,
    # and the server saw them at strictly spaced times whatever the thread.
    times = [s.at for s in site.seen]
    assert len(times) == 12
    assert all(later - earlier >= 2.0 for earlier, later in pairwise(times))


def test_second_read_comes_from_the_cache(serve, tmp_path):
    site = serve(
        {
            "/old": Route(status=301, headers={"Location": "/quickstart"}),
            "/quickstart": Route(body=QUICKSTART),
        }
    )
    with make_reader(site, cache_dir=str(tmp_path)) as first:
        live = first.read(site.url("/old"))
    with make_reader(site, cache_dir=str(tmp_path)) as second:
        cached = second.read(site.url("/old"))
    assert live.ok and not live.from_cache
    assert cached.ok and cached.from_cache
    assert cached.markdown == live.markdown and cached.sha256 == live.sha256
    assert cached.hops == live.hops
    assert site.paths() == ["/robots.txt", "/old", "/quickstart"]


def test_a_corrupt_cache_entry_is_a_miss(serve, tmp_path):
    site = serve({"/p": Route(body=b"<p>original</p>")})
    with make_reader(site, cache_dir=str(tmp_path)) as reader:
        reader.read(site.url("/p"))
    for entry in tmp_path.glob("*.entry"):
        raw = entry.read_bytes()
        entry.write_bytes(raw.replace(b"original", b"tampered"))
    with make_reader(site, cache_dir=str(tmp_path)) as reader:
        page = reader.read(site.url("/p"))
    assert "original" in page.markdown and not page.from_cache
    assert site.paths().count("/p") == 2


def test_errors_are_not_cached(serve, tmp_path):
    site = serve({"/gone": Route(status=404, body=b"gone")})
    for _ in range(2):
        with make_reader(site, cache_dir=str(tmp_path)) as reader:
            assert reader.read(site.url("/gone")).error is ReadFailure.HTTP_ERROR
    assert site.paths().count("/gone") == 2


def test_not_found_is_a_page_not_an_exception(serve):
    site = serve({})
    with make_reader(site) as reader:
        page = reader.read(site.url("/missing"))
    assert page.error is ReadFailure.HTTP_ERROR
    assert page.status == 404 and page.url_final == site.url("/missing")
    assert page.markdown == "" and page.bytes == len(b"no such page")


def test_unreachable_host_is_a_page(closed_port):
    dead = f"127.0.0.1:{closed_port}"
    reader = DocsReader(
        allow=[HostPattern.parse(dead)],
        proxy=None,
        cache_dir=None,
        user_agent=default_user_agent(),
        min_delay_s=0.0,
        mirrors={},
    )
    with reader:
        page = reader.read(f"http://{dead}/docs")
    assert page.error is ReadFailure.UNREACHABLE
    assert page.status is None and page.sha256 is None


def test_a_server_that_hangs_up_makes_the_page_unreachable(serve):
    site = serve({"/robots.txt": Route(status=404), "/drop": Route(drop=True)})
    with make_reader(site) as reader:
        page = reader.read(site.url("/drop"))
    assert page.error is ReadFailure.UNREACHABLE
    assert page.url_final == site.url("/drop") and page.status is None
    assert site.paths() == ["/robots.txt", "/drop"]


def test_not_text_and_too_large(serve):
    site = serve(
        {
            "/logo.png": Route(body=b"\x89PNG\r\n\x1a\n\x00\x00", content_type="image/png"),
            "/huge": Route(body=b"<p>" + b"x" * 5000 + b"</p>"),
        }
    )
    with make_reader(site, max_bytes=1000) as reader:
        image = reader.read(site.url("/logo.png"))
        huge = reader.read(site.url("/huge"))
    assert image.error is ReadFailure.NOT_TEXT and image.status == 200
    assert huge.error is ReadFailure.TOO_LARGE and huge.sha256 is None


def test_long_pages_are_cut_with_a_note(serve):
    body = "\n".join(f"line {n}" for n in range(2000)).encode()
    site = serve({"/long.txt": Route(body=body, content_type="text/plain")})
    with make_reader(site, max_markdown_chars=1000) as reader:
        page = reader.read(site.url("/long.txt"))
    assert page.ok and page.truncated
    assert page.markdown.startswith("line 0\nline 1\n")
    assert "[firstrun: page cut here" in page.markdown
    assert len(page.markdown) < 1200


def test_markdown_sources_pass_through(serve):
    source = b"# Install\n\nRun `pip install foo_tool`.\n\nSee [next](next.md) and https://other.example/x.\n"
    site = serve({"/docs/install.md": Route(body=source, content_type="text/markdown")})
    with make_reader(site) as reader:
        page = reader.read(site.url("/docs/install.md"))
    assert page.markdown == source.decode()
    assert page.title == "Install"
    assert page.links == (site.url("/docs/next.md"), "https://other.example/x")


def test_record_is_json_and_complete(serve):
    site = serve({"/p": Route(body=QUICKSTART)})
    with make_reader(site) as reader:
        page = reader.read(site.url("/p"))
    record = json.loads(json.dumps(page.to_record()))
    assert record["url_requested"] == record["url_final"] == site.url("/p")
    assert record["status"] == 200 and record["bytes"] == len(QUICKSTART)
    assert record["sha256"] == page.sha256 and record["error"] is None
    assert record["markdown_chars"] == len(page.markdown)
    # The code blocks travel as data, so a report judges them from the trace.
    assert [(b["index"], b["language"], b["kind"]) for b in record["blocks"]] == [
        (0, "python", "other"), (1, "bash", "shell")]
    assert record["blocks"][1]["page"] == site.url("/p")
    assert record["blocks"][1]["steps"] == [
        {"command": "pip install foo_tool", "output": [], "placeholders": []}]


def test_a_markdown_page_gives_its_fenced_blocks(serve):
    source = b"# Install\n\n```console\n$ pip install foo_tool\nDone\n```\n"
    site = serve({"/install.md": Route(body=source, content_type="text/markdown")})
    with make_reader(site) as reader:
        page = reader.read(site.url("/install.md"))
        missing = reader.read(site.url("/gone.md"))
    assert [(b.kind.value, [s.command for s in b.steps]) for b in page.blocks] == [
        ("shell", ["pip install foo_tool"])]
    assert page.blocks[0].steps[0].output == ("Done",)
    assert not missing.ok and missing.blocks == ()


def test_all_traffic_goes_through_the_proxy(serve):
    proxy = serve({"*": Route(body=b"<h1>Via proxy</h1>")})
    reader = DocsReader(
        allow=[HostPattern.parse("docs.example.test")],
        proxy=("127.0.0.1", proxy.port),
        cache_dir=None,
        user_agent=default_user_agent(),
        min_delay_s=0.0,
        mirrors={},
    )
    with reader:
        page = reader.read("http://docs.example.test/guide")
    assert page.ok and page.markdown.strip() == "# Via proxy"
    # The name was never resolved or dialled by the reader: the proxy got
    # absolute-form requests for it.
    assert [s.request_line for s in proxy.seen] == [
        "GET http://docs.example.test/robots.txt HTTP/1.1",
        "GET http://docs.example.test/guide HTTP/1.1",
    ]


def test_a_dead_proxy_is_a_harness_error(closed_port):
    reader = DocsReader(
        allow=[HostPattern.parse("docs.example.test")],
        proxy=("127.0.0.1", closed_port),
        cache_dir=None,
        user_agent=default_user_agent(),
        min_delay_s=0.0,
        mirrors={},
    )
    with reader, pytest.raises(ProxyError):
        reader.read("http://docs.example.test/guide")


def test_bad_configuration_is_refused():
    base = dict(allow=[], cache_dir=None, user_agent=default_user_agent(), mirrors={})
    with pytest.raises(UsageError):
        DocsReader(proxy=None, min_delay_s=-1.0, **base)
    with pytest.raises(UsageError):
        DocsReader(proxy=("127.0.0.1", 1), min_delay_s=0.0, transport=object(), **base)
    with pytest.raises(UsageError):
        DocsReader(
            proxy=None,
            min_delay_s=0.0,
            **{**base, "mirrors": {"a.example": Mirror(host="b.example", base_url="http://127.0.0.1:1")}},
        )


def test_refresh_fetches_every_page_anew_and_stores_it(serve, tmp_path):
    site = serve({"/p": Route(body=b"<p>first</p>")})
    with make_reader(site, cache_dir=str(tmp_path)) as reader:
        reader.read(site.url("/p"))
    site.routes["/p"] = Route(body=b"<p>second</p>")
    with make_reader(site, cache_dir=str(tmp_path), cache_mode=CacheMode.REFRESH) as reader:
        refreshed = reader.read(site.url("/p"))
    assert "second" in refreshed.markdown and not refreshed.from_cache
    with make_reader(site, cache_dir=str(tmp_path)) as reader:
        later = reader.read(site.url("/p"))
    assert "second" in later.markdown and later.from_cache


def test_offline_serves_the_cache_only_and_a_miss_is_the_harnesss_failure(serve, tmp_path):
    site = serve({"/p": Route(body=b"<p>kept</p>"), "/q": Route(body=b"<p>never read</p>")})
    with make_reader(site, cache_dir=str(tmp_path)) as reader:
        reader.read(site.url("/p"))
    asked = len(site.seen)
    with make_reader(site, cache_dir=str(tmp_path), cache_mode=CacheMode.OFFLINE) as reader:
        kept = reader.read(site.url("/p"))
        with pytest.raises(DocsError, match=r"/q is not in the docs cache, and --offline fetches nothing"):
            reader.read(site.url("/q"))
    assert kept.from_cache and "kept" in kept.markdown
    assert len(site.seen) == asked
    with pytest.raises(UsageError, match="cache mode offline needs a cache directory"):
        make_reader(site, cache_mode=CacheMode.OFFLINE)


def test_a_unicode_host_is_checked_as_the_name_httpx_dials():
    dialled: list[bytes] = []

    def answer(request):
        dialled.append(request.url.raw_host)
        return httpx.Response(404 if request.url.path == "/robots.txt" else 200,
                              headers={"content-type": "text/markdown"}, text="# faß")

    def reader(entry: str) -> DocsReader:
        return make_reader(allow=[HostPattern.parse(entry)], transport=httpx.MockTransport(answer))

    # IDNA 2003 read faß.de as fass.de, so an allowed fass.de let xn--fa-hia.de be dialled.
    with reader("fass.de") as r:
        assert r.read("https://faß.de/").error is ReadFailure.NOT_ALLOWED
    assert dialled == []
    with reader("faß.de") as r:
        assert r.read("https://xn--fa-hia.de/").error is None
        assert r.read("https://FAß.de/").error is None
        # httpx takes any ASCII name; one that is no A-label names no allowed host.
        assert r.read("https://xn--zz.de/").error is ReadFailure.NOT_ALLOWED
    assert set(dialled) == {b"xn--fa-hia.de"}
