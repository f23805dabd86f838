"""Turning a fetched docs body into the markdown an agent reads.

Guarantee: HTML keeps its headings, lists, links and code blocks; a code block
stays fenced with a fence no code inside it can close, and carries its language
when the page's markup names one. Site chrome (scripts, styles, navigation,
footers, anchor glyphs) is left out of the markdown, but every link on the
page, navigation included, is listed absolute in ``links``. Markdown and plain
text pass through unchanged. Nothing here does I/O.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from bs4 import BeautifulSoup, Tag
from markdownify import ATX, MarkdownConverter

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_APPLICATION_TYPES = frozenset(
    {"application/json", "application/xml", "application/yaml", "application/x-yaml", "application/toml"}
)
MAX_LINKS = 1000

# Never content, wherever they are.
_ALWAYS_STRIP = (
    "script, style, noscript, template, svg, iframe, object, embed, form, button, "
    "nav, footer, [role=navigation], [role=search], [hidden], "
    "a.headerlink, a.hash-link, a.anchor, a.anchorjs-link, .linenos, .lineno"
)
# Chrome when they frame the page; inside <main> or an <article> they are often
# content (a callout in an <aside>, the page's <h1> in a <header>).
_CHROME_OUTSIDE_CONTENT = "header, aside, [role=banner], [role=contentinfo], [role=complementary]"

# ``language-x``, ``lang-x``, Sphinx's ``highlight-x``; pandoc's ``sourceCode x``
# is read in ``code_language``.
_LANGUAGE_CLASS = re.compile(r"^(?:language|lang|highlight|brush)-([A-Za-z0-9_+#.-]{1,30})$")
_LANGUAGE_NAME = re.compile(r"^[A-Za-z0-9_+#.-]{1,30}$")
_NO_LANGUAGE = frozenset({"default", "none", "plain", "nohighlight", "notranslate"})
_MD_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_BARE_URL = re.compile(r"https?://[^\s<>()\"'`\]]+")
_MD_TITLE = re.compile(r"^#\s+(.+?)\s*#*\s*$", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class Converted:
    markdown: str
    title: str | None
    links: tuple[str, ...]
    truncated: bool


def media_type(content_type: str | None, body: bytes) -> str | None:
    """The media type a body is to be read as, or None when it is not text.

    A missing Content-Type is sniffed conservatively: an HTML preamble means
    HTML, UTF-8 without NULs means plain text, anything else is not text.
    """
    if content_type:
        mt = content_type.split(";", 1)[0].strip().lower()
        if mt in HTML_TYPES or mt.startswith("text/") or mt in _TEXT_APPLICATION_TYPES:
            return mt
        if mt.endswith("+json") or mt.endswith("+xml"):
            return mt
        return None
    head = body[:1024].lstrip().lower()
    if head.startswith(b"<!doctype html") or head.startswith(b"<html"):
        return "text/html"
    if b"\x00" in body[:4096]:
        return None
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return "text/plain"


def charset_of(content_type: str | None) -> str | None:
    if not content_type:
        return None
    for param in content_type.split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            return value.strip().strip('"').lower() or None
    return None


def convert(
    body: bytes, *, media: str, charset: str | None, url: str, max_chars: int
) -> Converted:
    """Markdown, title and links of ``body`` fetched from ``url``, cut at ``max_chars``."""
    if media in HTML_TYPES:
        markdown, title, links = _from_html(body, charset=charset, url=url)
    else:
        markdown = decode_text(body, charset)
        title = _markdown_title(markdown) if media == "text/markdown" else None
        links = _text_links(markdown, url)
    markdown, truncated = _cap(markdown, max_chars)
    return Converted(markdown=markdown, title=title, links=links, truncated=truncated)


def decode_text(body: bytes, charset: str | None) -> str:
    """A text body as a string: its declared charset, else UTF-8, bad bytes replaced."""
    try:
        return body.decode(charset or "utf-8", errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


def _cap(markdown: str, max_chars: int) -> tuple[str, bool]:
    if len(markdown) <= max_chars:
        return markdown, False
    cut = markdown.rfind("\n", 0, max_chars)
    if cut < max_chars * 4 // 5:
        cut = max_chars
    note = (
        f"\n\n[firstrun: page cut here; showing {cut} of {len(markdown)} characters. "
        "The rest of the page was not shown.]\n"
    )
    return markdown[:cut] + note, True


def _from_html(body: bytes, *, charset: str | None, url: str) -> tuple[str, str | None, tuple[str, ...]]:
    soup = BeautifulSoup(body, "html.parser", from_encoding=charset)
    base = url
    base_tag = soup.find("base", href=True)
    if isinstance(base_tag, Tag):
        base = urllib.parse.urljoin(url, str(base_tag["href"]).strip())

    title = None
    if soup.title is not None and soup.title.get_text(strip=True):
        title = soup.title.get_text(" ", strip=True)

    links = _html_links(soup, base, url)
    for tag, attr in (("a", "href"), ("img", "src")):
        for el in soup.find_all(tag, attrs={attr: True}):
            el[attr] = urllib.parse.urljoin(base, str(el[attr]).strip())

    root = _content_root(soup)
    for el in root.select(_ALWAYS_STRIP):
        el.decompose()
    if root.name in ("body", "[document]"):
        for el in root.select(_CHROME_OUTSIDE_CONTENT):
            if el.find_parent("article") is None:
                el.decompose()
    markdown = _Converter(
        heading_style=ATX,
        bullets="-",
        escape_underscores=False,
        escape_asterisks=False,
        code_language_callback=code_language,
    ).convert_soup(root)
    markdown = re.sub(r"\n{3,}", "\n\n", markdown.strip()) + "\n"
    if title is None:
        h1 = root.find("h1")
        if h1 is not None and h1.get_text(strip=True):
            title = h1.get_text(" ", strip=True)
    return markdown, title, links


def _content_root(soup: BeautifulSoup) -> Tag:
    for selector in ("main", "[role=main]"):
        found = soup.select_one(selector)
        if found is not None:
            return found
    articles = soup.find_all("article")
    if len(articles) == 1 and isinstance(articles[0], Tag):
        return articles[0]
    return soup.body if soup.body is not None else soup


# Navigation included: the next page of a quickstart is often linked only from
# the sidebar.
def _html_links(soup: BeautifulSoup, base: str, page_url: str) -> tuple[str, ...]:
    here = urllib.parse.urldefrag(page_url).url
    seen: dict[str, None] = {}
    for el in soup.find_all("a", href=True):
        _add_link(seen, urllib.parse.urljoin(base, str(el["href"]).strip()), here)
        if len(seen) >= MAX_LINKS:
            break
    return tuple(seen)


def _text_links(text: str, page_url: str) -> tuple[str, ...]:
    here = urllib.parse.urldefrag(page_url).url
    seen: dict[str, None] = {}
    found = [(m.start(), m.group(1)) for m in _MD_LINK.finditer(text)]
    found += [(m.start(), m.group(0).rstrip(".,;:")) for m in _BARE_URL.finditer(text)]
    for _, target in sorted(found):
        _add_link(seen, urllib.parse.urljoin(page_url, target), here)
        if len(seen) >= MAX_LINKS:
            break
    return tuple(seen)


def _add_link(seen: dict[str, None], absolute: str, here: str) -> None:
    target = urllib.parse.urldefrag(absolute).url
    if urllib.parse.urlsplit(target).scheme in ("http", "https") and target != here:
        seen.setdefault(target, None)


def _markdown_title(text: str) -> str | None:
    match = _MD_TITLE.search(text)
    return match.group(1) if match else None


def code_language(pre: Tag) -> str | None:
    """The language a code block's markup names, from the <pre>, its <code> or wrappers."""
    candidates: list[Tag] = [pre]
    code = pre.find("code")
    if isinstance(code, Tag):
        candidates.insert(0, code)
    parent = pre.parent
    for _ in range(3):
        if not isinstance(parent, Tag):
            break
        candidates.append(parent)
        parent = parent.parent
    for el in candidates:
        for attr in ("data-lang", "data-language"):
            value = el.get(attr)
            if isinstance(value, str) and _usable(value):
                return value.lower()
        classes = [str(c) for c in el.get("class") or ()]
        for cls in classes:
            match = _LANGUAGE_CLASS.match(cls)
            if match and _usable(match.group(1)):
                return match.group(1).lower()
        if "sourceCode" in classes:
            for cls in classes:
                if cls != "sourceCode" and _usable(cls):
                    return cls.lower()
    return None


def _usable(name: str) -> bool:
    return bool(_LANGUAGE_NAME.match(name)) and name.lower() not in _NO_LANGUAGE


class _Converter(MarkdownConverter):
    """markdownify, with fences that code cannot close and clean line breaks in code."""

    def convert_pre(self, el: Tag, text: str, parent_tags: set[str]) -> str:
        if not text:
            return ""
        language = code_language(el) or ""
        longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
        fence = "`" * max(3, longest + 1)
        return f"\n\n{fence}{language}\n{text.strip(chr(10))}\n{fence}\n\n"

    def convert_br(self, el: Tag, text: str, parent_tags: set[str]) -> str:
        if "pre" in parent_tags:
            return "\n" + text
        return super().convert_br(el, text, parent_tags)
