"""``--docs-mirror``: a docs host served from a directory or a loopback server."""

from __future__ import annotations

import os

import pytest
from docsite import Route

from firstrun.docs import (
    DocsReader,
    Mirror,
    ReadFailure,
    default_user_agent,
    parse_mirrors,
)
from firstrun.errors import UsageError
from firstrun.policy.hosts import HostPattern

HOST = "docs.example.test"


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "site"
    (root / "guide").mkdir(parents=True)
    (root / "index.html").write_text("<h1>Home</h1><a href='guide/'>Guide</a>")
    (root / "install.html").write_text("<h1>Install</h1><pre><code class='language-sh'>pip install foo</code></pre>")
    (root / "guide" / "index.html").write_text("<h1>Guide</h1><a href='step2.html'>Step 2</a>")
    (root / "notes.md").write_text("# Notes\n\nplain markdown\n")
    (root / "robots.txt").write_text("User-agent: *\nDisallow: /drafts/\n")
    (root / "drafts").mkdir()
    (root / "drafts" / "wip.html").write_text("<p>draft</p>")
    secret = tmp_path / "secret.txt"
    secret.write_text("CANARY-outside-the-mirror")
    os.symlink(secret, root / "leak.html")
    os.symlink(tmp_path, root / "up")
    return root


def reader_for(mirror: Mirror, **kw) -> DocsReader:
    return DocsReader(
        allow=[HostPattern.parse(HOST)],
        proxy=None,
        cache_dir=kw.pop("cache_dir", None),
        user_agent=default_user_agent(),
        min_delay_s=0.0,
        mirrors={mirror.host: mirror},
        **kw,
    )


def test_directory_mirror_serves_pages_under_the_real_urls(tree):
    with reader_for(Mirror.parse(f"{HOST}={tree}")) as reader:
        home = reader.read(f"https://{HOST}/")
        install = reader.read(f"https://{HOST}/install")
        notes = reader.read(f"https://{HOST}/notes.md")
        guide = reader.read(f"https://{HOST}/guide")
    assert home.ok and home.markdown.startswith("# Home")
    assert home.url_final == f"https://{HOST}/"
    assert home.links == (f"https://{HOST}/guide/",)
    assert install.ok and "```sh\npip install foo\n```" in install.markdown
    assert notes.ok and notes.markdown == "# Notes\n\nplain markdown\n"
    # /guide is a directory: redirected to /guide/ as a static server does, so
    # its relative links resolve under /guide/.
    assert guide.ok and guide.hops == (f"https://{HOST}/guide", f"https://{HOST}/guide/")
    assert guide.links == (f"https://{HOST}/guide/step2.html",)


def test_directory_mirror_honours_its_robots(tree):
    with reader_for(Mirror.parse(f"{HOST}={tree}")) as reader:
        page = reader.read(f"https://{HOST}/drafts/wip.html")
    assert page.error is ReadFailure.ROBOTS_DISALLOWED


@pytest.mark.parametrize(
    "path",
    [
        "/%2e%2e/secret.txt",
        "/guide/%2E%2E/%2e%2e/secret.txt",
        "/..%2fsecret.txt",
        "/leak.html",
        "/leak",
        "/up/secret.txt",
    ],
)
def test_directory_mirror_refuses_to_leave_its_directory(tree, path):
    with reader_for(Mirror.parse(f"{HOST}={tree}")) as reader:
        page = reader.read(f"https://{HOST}{path}")
    assert page.error is ReadFailure.HTTP_ERROR and page.status == 403
    assert "CANARY" not in page.markdown


def test_directory_mirror_missing_page_is_404(tree):
    with reader_for(Mirror.parse(f"{HOST}={tree}")) as reader:
        page = reader.read(f"https://{HOST}/nope")
    assert page.error is ReadFailure.HTTP_ERROR and page.status == 404


def test_mirror_does_not_widen_the_allow_list(tree):
    mirror = Mirror.parse(f"other.example.test={tree}")
    with reader_for(mirror) as reader:
        page = reader.read("https://other.example.test/")
    assert page.error is ReadFailure.NOT_ALLOWED


def test_mirrors_are_not_cached(tree, tmp_path):
    cache = tmp_path / "cache"
    with reader_for(Mirror.parse(f"{HOST}={tree}"), cache_dir=str(cache)) as reader:
        assert reader.read(f"https://{HOST}/install").ok
        (tree / "install.html").write_text("<h1>Install, edited</h1>")
        page = reader.read(f"https://{HOST}/install")
    assert page.markdown.startswith("# Install, edited") and not page.from_cache
    assert list(cache.iterdir()) == []


def test_server_mirror_reads_as_the_real_host(serve):
    elsewhere = serve({"*": Route(body=b"<p>never</p>")}, host="127.0.0.2")
    site = serve(
        {
            "/start": Route(body=b"<h1>Start</h1><a href='/next'>next</a>"),
            "/old": Route(status=301, headers={"Location": "/start"}),
            "/away": Route(status=302, headers={"Location": elsewhere.url("/x")}),
        }
    )
    site.routes["/absolute"] = Route(status=302, headers={"Location": site.url("/start")})
    mirror = Mirror.parse(f"{HOST}={site.url('')}")
    with reader_for(mirror) as reader:
        start = reader.read(f"https://{HOST}/start")
        old = reader.read(f"https://{HOST}/old")
        absolute = reader.read(f"https://{HOST}/absolute")
        away = reader.read(f"https://{HOST}/away")
    assert start.ok and start.url_final == f"https://{HOST}/start"
    assert start.links == (f"https://{HOST}/next",)
    assert old.ok and old.hops == (f"https://{HOST}/old", f"https://{HOST}/start")
    # A Location naming the mirror server itself is mapped back to the host.
    assert absolute.ok and absolute.url_final == f"https://{HOST}/start"
    assert away.error is ReadFailure.REDIRECT_NOT_ALLOWED
    assert elsewhere.seen == []
    assert "/robots.txt" in site.paths()


@pytest.mark.parametrize(
    "text",
    [
        "no-equals-sign",
        "=/tmp",
        "docs.example.test=",
        "bad host=/tmp",
        "docs.example.test=/definitely/not/a/dir",
        "docs.example.test=http://203.0.113.7:8000",
        "docs.example.test=ftp://127.0.0.1/",
        "docs.example.test=http://127.0.0.1:99999",
        "docs.example.test=http://127.0.0.1:8000/?q=1",
        "docs.example.test=http://127.0.0.1:8000/docs",
        "docs.example.test=http://[::1",
    ],
)
def test_bad_mirror_flags_are_one_line_usage_errors(text):
    with pytest.raises(UsageError) as caught:
        Mirror.parse(text)
    message = str(caught.value)
    assert "--docs-mirror" in message and "\n" not in message


def test_mirror_flags_parse(tmp_path):
    mirrors = parse_mirrors([f"Docs.Example.TEST.={tmp_path}", "api.example.test=http://localhost:8123/"])
    assert mirrors["docs.example.test"].directory == os.path.realpath(tmp_path)
    assert mirrors["api.example.test"].base_url == "http://localhost:8123"
    with pytest.raises(UsageError):
        parse_mirrors([f"a.example.test={tmp_path}", f"a.example.test={tmp_path}"])
