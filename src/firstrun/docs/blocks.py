"""A page's code blocks as data: what replay, drift, init and mutate read of a page.

Guarantee: ``extract(html, url=...)`` is a pure function of a page (no I/O,
and it never raises): the page's code blocks in document order, each with its
index, its language, its kind, and its text as a reader copies it (line
numbers, copy buttons and other widget markup never reach it). An author's mark
just before a block (``<!-- firstrun: skip -->``, ``<!-- firstrun: file=NAME -->``)
decides first. ``extract_markdown`` gives the same for a page served as Markdown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from html import escape
from typing import Any

from bs4 import BeautifulSoup, Comment, NavigableString, Tag
from markdown_it import MarkdownIt

from .convert import code_language


class BlockKind(StrEnum):
    SHELL = "shell"
    FILE = "file"
    OTHER = "other"


class FileSource(StrEnum):
    """How the page ties a file block to its file name."""

    MARK = "mark"          # <!-- firstrun: file=NAME -->
    TITLE = "title"        # the generator's title or caption on the block
    SENTENCE = "sentence"  # the sentence just before it: "Save this as `app.py`"


# A shell block gives its commands with prompts stripped and ``\`` continuations
# joined, a console's output kept apart as each command's documented output; a
# file block gives the file its page ties it to.
@dataclass(frozen=True, kw_only=True)
class Step:
    """One command of a shell block, and the output the docs show for it."""

    command: str
    output: tuple[str, ...] = ()
    placeholders: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Block:
    """One code block: ``index`` counts the page's non-empty blocks from 0; ``text``
    is what a reader copies; ``steps`` a shell block's commands; ``file`` a file
    block's name, as the page gives it; ``placeholders`` the values its steps or
    its file leave to the reader."""

    page: str
    index: int
    language: str | None
    kind: BlockKind
    text: str
    steps: tuple[Step, ...] = ()
    file: str | None = None
    file_source: FileSource | None = None
    skip: bool = False
    placeholders: tuple[str, ...] = ()

    @property
    def content(self) -> str:
        """What a file block writes: its text, ending in one newline."""
        return self.text + "\n" if self.text else ""

    def to_data(self) -> dict[str, Any]:
        return {
            "page": self.page, "index": self.index, "language": self.language, "kind": self.kind.value,
            "text": self.text,
            "steps": [{"command": s.command, "output": list(s.output), "placeholders": list(s.placeholders)}
                      for s in self.steps],
            "file": self.file, "file_source": self.file_source.value if self.file_source else None,
            "skip": self.skip, "placeholders": list(self.placeholders),
        }


# Shell languages as generators label them, each to one name.
_LANGUAGE_ALIASES = {
    "shell-session": "console", "sh-session": "console", "shellsession": "console",
    "bash-session": "console", "terminal": "console",
    "shell-script": "shell", "shellscript": "shell",
}
SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "console", "zsh"})
# What a generator labels a block it was given no language for (pymdownx: text).
_UNLABELLED = frozenset({None, "text", "plaintext", "plain", "txt"})
# GitHub names a block's language by its TextMate scope (highlight-source-shell).
_SCOPE_PREFIX = re.compile(r"^(?:source|text)-")

# A prompt: $, % or > and a space, after an optional (venv) and user@host:dir.
_PROMPT = re.compile(r"^[ \t]*(?:\([^()\s]{1,40}\)[ \t]*)?(?:[\w.-]+@[\w.-]+(?::[^\s$%>#]*)?[ \t]?)?([$%>])(?: |$)")
_MARK = re.compile(r"^\s*firstrun:\s*(.*?)\s*$", re.DOTALL)
_FILE_NAME = re.compile(
    r"^(?:~/|\./)?(?:[\w.-]+/)*(?:[\w-][\w.-]*\.[A-Za-z][\w-]{0,15}|\.[\w][\w.-]*"
    r"|Dockerfile|Containerfile|Makefile|Procfile|Gemfile|Rakefile|Justfile|Vagrantfile|Brewfile|Caddyfile)$"
)
# The sentence before a block that ties it to a file; "add to `x`" edits a
# file rather than writing it, so it is not one of them.
_FILE_SENTENCES = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"\bsave\b[^`.]{0,60}?\bas\s+`([^`]+)`",
    r"\bfile\s+(?:named|called)\s+`([^`]+)`",
    r"\b(?:create|make|write)\s+(?:a|an|the)\s+(?:new\s+)?`([^`]+)`\s+file\b",
    r"\b(?:create|write)\s+`([^`]+)`",
    r"\b(?:put|paste|place|write)\b[^`.]{0,60}?\bin(?:to)?\s+`([^`]+)`",
))

# Markup that is not part of the text a reader copies: copy buttons, line
# numbers (Pygments' .linenos, Hugo's .ln/.lnt, Docusaurus's codeLineNumber),
# and what a generator marks unselectable.
_NOT_TEXT = (
    "button, clipboard-copy, .copybtn, .md-clipboard, .linenos, .lineno, .ln, .lnt, "
    "[class*=codeLineNumber], [data-line-number], [style*='user-select:none'], [style*='user-select: none']"
)
_LINE_NUMBER_COLUMN = "td.linenos, .linenodiv, td.lntd:first-child, td.gutter"
_TITLE = (
    ".filename, .caption-text, .code-block-caption, [class*=codeBlockTitle], "
    "[data-component-part=code-block-header-filename], [data-rehype-pretty-code-title], figcaption"
)
_TITLE_ATTRIBUTES = ("data-title", "title", "data-filename", "filename")
# Where a block's own wrappers end: these hold the page's prose.
_PROSE = ("p", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "dl", "blockquote", "table")
_WRAPPERS = frozenset({"div", "figure", "span", "td", "tr", "tbody", "table"})
_SKIP_CLASS = "firstrun-skip"
_INFO_TITLE = re.compile(r"""\btitle=(?:"([^"]*)"|'([^']*)'|(\S+))""")

# Placeholders a reader fills in. <...> is one only when it cannot be a
# redirection or a heredoc: a name right after the <, a > right after it.
_ANGLE = re.compile(r"(?<![<\w&\d])<([A-Za-z][\w.-]*(?:[ ][\w.-]+)*)>(?!>)")
_HTML_TAGS = frozenset({
    "html", "head", "body", "div", "span", "p", "a", "b", "i", "em", "strong", "br", "hr", "img",
    "script", "style", "title", "meta", "link", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li",
    "table", "tr", "td", "th", "pre", "code", "form", "input", "button", "main", "section", "header", "footer",
})
_CAPS = re.compile(r"(?<![\w$])(?:YOUR|MY)_[A-Z0-9_]*[A-Z0-9](?!\w)|(?<![\w$<-])your[-_][a-z0-9]+(?:[-_][a-z0-9]+)*(?![\w>])")
_SECRET_VARIABLE = re.compile(
    r"\$\{?((?:YOUR|MY)_\w+|[A-Za-z_][A-Za-z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?))\b\}?")
_ASSIGNMENT = re.compile(r"(?:^|[\s;&|(])([A-Za-z_]\w*)=(?!=)")
_DECLARATION = re.compile(r"\b(?:export|read|declare|local)\s+(?:-\w+\s+)*([A-Za-z_]\w*)")


def extract(html: str | bytes, *, url: str) -> tuple[Block, ...]:
    """The code blocks of the page ``html`` read from ``url``, in document order."""
    soup = BeautifulSoup(html, "html.parser")
    blocks: list[Block] = []
    assigned: set[str] = set()
    for pre in _code_pres(soup):
        block = _block(pre, index=len(blocks), url=url, assigned=assigned)
        if block is not None:
            blocks.append(block)
    return tuple(blocks)


def extract_markdown(text: str, *, url: str) -> tuple[Block, ...]:
    """The code blocks of a page served as Markdown (a raw README, an ``.md`` page).

    It is rendered as CommonMark with its raw HTML kept, so an author's
    ``<!-- firstrun: ... -->`` mark binds as on a built page; a fence's info
    string gives the language, and its file when it names one (``title="app.py"``,
    as MkDocs and Docusaurus write it, or a file name after the language, as
    Mintlify does); ``{ .bash .firstrun-skip }`` gives the language and a class.
    """
    renderer = MarkdownIt("commonmark", {"html": True})
    renderer.add_render_rule("fence", _render_fence)
    return extract(renderer.render(text), url=url)


def _render_fence(self: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
    info = tokens[idx].info.strip()
    title = _INFO_TITLE.search(info)
    name = next((g for g in title.groups() if g is not None), None) if title else None
    if info.startswith("{"):
        classes = re.findall(r"(?<![\w-])\.([\w+#-]+)", info)
    else:
        words = info.split()
        classes = words[:1]
        if name is None and len(words) > 1 and "=" not in words[1] and _FILE_NAME.match(words[1]):
            name = words[1]
    attributes = ""
    if classes:
        attributes += f' class="{" ".join([f"language-{escape(classes[0])}", *map(escape, classes[1:])])}"'
    if name:
        attributes += f' data-title="{escape(name)}"'
    return f"<pre><code{attributes}>{escape(tokens[idx].content)}</code></pre>\n"


def shell_steps(text: str, *, assigned: Iterable[str] = ()) -> tuple[Step, ...]:
    """The commands of a shell block's text, each with the output the docs show for it.

    When any line starts with a prompt, only prompted lines start commands and
    the other lines are the output of the command before them; the prompt of
    the first such line ($, % or >) is the block's, so npm's ``> script``
    output under a ``$`` prompt stays output. Without prompts every line is a
    command, comments and blank lines dropped. Continuations (a trailing
    ``\\``, an open quote, heredoc or compound command, a trailing ``|``,
    ``&&`` or ``||``) make one command of several lines.
    """
    lines = text.split("\n")
    prompt = _block_prompt(lines)
    known = set(assigned)
    found: list[tuple[list[str], list[str]]] = []
    scanner: _Scanner | None = None
    for line in lines:
        if scanner is not None and scanner.open:
            if prompt is not None:
                line = re.sub(r"^>(?: |$)", "", line)
            parts = found[-1][0]
            if scanner.backslash:
                parts[-1] = parts[-1][:-1].rstrip()
                parts.append(" " + line.lstrip())
            else:
                parts.append("\n" + line)
            scanner.feed(line)
            continue
        match = _PROMPT.match(line)
        if prompt is not None and not (match and match.group(1) == prompt):
            if found and (line.strip() or found[-1][1]):
                found[-1][1].append(line.rstrip())
            continue
        command = (line[match.end():] if match else line).strip()
        if not command or command.startswith("#"):
            scanner = None
            continue
        scanner = _Scanner()
        found.append(([command], []))
        scanner.feed(command)
    steps = []
    for parts, output in found:
        command = "".join(parts).strip()
        while output and not output[-1]:
            output.pop()
        steps.append(Step(command=command, output=tuple(output), placeholders=placeholders(command, known)))
        known |= assigned_names(command)
    return tuple(steps)


def _block_prompt(lines: list[str]) -> str | None:
    """The block's prompt: the first $ or %; > only when the block opens with it."""
    for line in lines:
        m = _PROMPT.match(line)
        if m and m.group(1) in "$%":
            return m.group(1)
    first = next((line for line in lines if line.strip()), "")
    m = _PROMPT.match(first)
    return m.group(1) if m else None


def placeholders(command: str, assigned: Iterable[str] = ()) -> tuple[str, ...]:
    """The values ``command`` leaves to the reader, each once, in order of appearance.

    ``<your-api-key>``-style names in angle brackets (never a redirection,
    a heredoc or an HTML tag), ``YOUR_TOKEN`` and ``your-project``, and a
    ``$SECRET_KEY``-style variable (a name ending in KEY, TOKEN, SECRET,
    PASSWORD or CREDENTIALS) that is not in ``assigned``.
    """
    known = set(assigned) | assigned_names(command)
    found: list[tuple[int, str]] = []
    for m in _ANGLE.finditer(command):
        if m.group(1).lower() not in _HTML_TAGS:
            found.append((m.start(), m.group(0)))
    covered = [(start, start + len(text)) for start, text in found]
    for m in _CAPS.finditer(command):
        if not any(a <= m.start() < b for a, b in covered):
            found.append((m.start(), m.group(0)))
    for m in _SECRET_VARIABLE.finditer(command):
        if m.group(1) not in known:
            found.append((m.start(), m.group(0)))
    return tuple(dict.fromkeys(text for _, text in sorted(found)))


def assigned_names(command: str) -> set[str]:
    """Variables ``command`` sets (``NAME=``, ``export NAME``, ``read NAME``)."""
    return {m.group(1) for m in _ASSIGNMENT.finditer(command)} | {
        m.group(1) for m in _DECLARATION.finditer(command)}


def normalize_language(label: str | None) -> str | None:
    """A language label as one name: lower case, GitHub's scope prefix gone, aliases merged."""
    if not label:
        return None
    name = _SCOPE_PREFIX.sub("", label.strip().lower())
    return _LANGUAGE_ALIASES.get(name, name) or None


def _code_pres(soup: BeautifulSoup) -> list[Tag]:
    pres = []
    for pre in soup.find_all("pre"):
        if not isinstance(pre, Tag) or pre.find_parent("pre") is not None:
            continue
        if pre.find_parent(["script", "template", "noscript"]) is not None:
            continue
        if _line_numbers(pre):
            continue
        pres.append(pre)
    return pres


def _text(pre: Tag) -> str:
    for el in pre.select(_NOT_TEXT):
        el.decompose()
    for br in pre.find_all("br"):
        br.replace_with("\n")
    text = pre.get_text().replace("\r\n", "\n").replace("\r", "\n").replace("\u00a0", " ")
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _block(pre: Tag, *, index: int, url: str, assigned: set[str]) -> Block | None:
    outer = _outer(pre)
    marks = _marks(outer)
    language = normalize_language(_language(pre) or code_language(outer))
    title = _title(pre, outer)
    before = _sentence_file(outer)
    text = _text(pre)
    if not text:
        return None
    skip = "skip" in marks or any(_SKIP_CLASS in (el.get("class") or ()) for el in _chain(pre, outer))
    first = next((line for line in text.split("\n") if line.strip()), "")
    prompt = _PROMPT.match(first)
    prompted = prompt is not None and prompt.group(1) in "$%"
    file, source = None, None
    if marks.get("file"):
        file, source = marks["file"], FileSource.MARK
    elif title and not prompted:
        file, source = title, FileSource.TITLE
    elif before and not prompted:
        file, source = before, FileSource.SENTENCE
    if file is not None:
        return Block(page=url, index=index, language=language, kind=BlockKind.FILE, text=text,
                     file=file, file_source=source, skip=skip, placeholders=placeholders(text, assigned))
    if language in SHELL_LANGUAGES or (language in _UNLABELLED and prompted):
        steps = shell_steps(text, assigned=assigned)
        for step in steps:
            assigned |= assigned_names(step.command)
        found = tuple(dict.fromkeys(p for step in steps for p in step.placeholders))
        return Block(page=url, index=index, language=language, kind=BlockKind.SHELL, text=text,
                     steps=steps, skip=skip, placeholders=found)
    return Block(page=url, index=index, language=language, kind=BlockKind.OTHER, text=text, skip=skip)


def _language(pre: Tag) -> str | None:
    found = code_language(pre)
    if found:
        return found
    code = pre.find("code")
    for el in (code, pre):
        if isinstance(el, Tag):
            value = el.get("language")
            if isinstance(value, str) and value.strip():
                return value
    return None


def _outer(pre: Tag) -> Tag:
    """The outermost element that is this block's own: its wrappers, title and buttons."""
    outer = pre
    while isinstance(outer.parent, Tag) and outer.parent.name in _WRAPPERS:
        if not all(_chrome(child) for child in outer.parent.children if child is not outer):
            break
        outer = outer.parent
    return outer


def _chrome(node: Any) -> bool:
    """Whether a node beside a block belongs to it (a title, a button, a line-number column)."""
    if isinstance(node, Comment):
        return False
    if isinstance(node, NavigableString):
        return not node.strip()
    if not isinstance(node, Tag) or node.name in _PROSE or node.find(_PROSE) is not None:
        return False
    return all(_line_numbers(p) for p in ([node] if node.name == "pre" else node.find_all("pre")))


def _line_numbers(pre: Tag) -> bool:
    """Whether a <pre> is, or holds, a table's line-number column rather than code."""
    if pre.select_one(_LINE_NUMBER_COLUMN) is not None:
        return True
    for parent in pre.parents:
        classes = parent.get("class") or () if isinstance(parent, Tag) else ()
        if parent.name not in ("td", "div") or not classes:
            continue
        if {"linenos", "linenodiv", "gutter"} & set(classes) or (
                "lntd" in classes and parent.find_previous_sibling("td") is None):
            return True
    return False


def _chain(pre: Tag, outer: Tag) -> list[Tag]:
    chain = [pre]
    code = pre.find("code")
    if isinstance(code, Tag):
        chain.append(code)
    el: Any = pre
    while el is not outer and isinstance(el.parent, Tag):
        el = el.parent
        chain.append(el)
    return chain


def _previous(outer: Tag) -> tuple[list[Comment], Tag | None]:
    """The comments just before a block, and the element before them."""
    comments: list[Comment] = []
    for sibling in outer.previous_siblings:
        if isinstance(sibling, Comment):
            comments.append(sibling)
        elif isinstance(sibling, NavigableString):
            if sibling.strip():
                return comments, None
        elif isinstance(sibling, Tag):
            if sibling.name == "p" and not sibling.get_text(strip=True) and sibling.find(string=_is_comment):
                comments.extend(c for c in sibling.find_all(string=_is_comment))
                continue
            return comments, sibling
    return comments, None


def _is_comment(s: Any) -> bool:
    return isinstance(s, Comment)


def _marks(outer: Tag) -> dict[str, str]:
    marks: dict[str, str] = {}
    comments, _ = _previous(outer)
    for comment in comments:
        m = _MARK.match(str(comment))
        if not m:
            continue
        for word in m.group(1).split():
            key, _, value = word.partition("=")
            if key == "skip" and not value:
                marks["skip"] = "skip"
            elif key == "file" and _FILE_NAME.match(value):
                marks["file"] = value
    return marks


def _title(pre: Tag, outer: Tag) -> str | None:
    for el in _chain(pre, outer):
        for attr in _TITLE_ATTRIBUTES:
            value = el.get(attr)
            if isinstance(value, str) and _FILE_NAME.match(value.strip()):
                return value.strip()
    for el in outer.select(_TITLE):
        if el.find("pre") is None:
            name = el.get_text(" ", strip=True).rstrip("¶").strip()
            if _FILE_NAME.match(name):
                return name
    return None


def _sentence_file(outer: Tag) -> str | None:
    _, before = _previous(outer)
    if before is None or before.name != "p":
        return None
    parts = []
    for node in before.descendants:
        if isinstance(node, Tag) and node.name == "code":
            parts.append(f"`{node.get_text()}`")
        elif isinstance(node, NavigableString) and not isinstance(node, Comment) and node.find_parent("code") is None:
            parts.append(str(node))
    sentence = " ".join("".join(parts).split())
    for pattern in _FILE_SENTENCES:
        found = [m.group(1) for m in pattern.finditer(sentence) if _FILE_NAME.match(m.group(1))]
        if found:
            return found[-1]
    return None


class _Scanner:
    """Whether a command goes on to the next line: a shell's lexical state, line by line."""

    def __init__(self) -> None:
        self.quote: str | None = None
        self.heredocs: list[tuple[str, bool]] = []
        self.body = False
        self.depth = 0
        self.backslash = False
        self.operator = False

    @property
    def open(self) -> bool:
        return bool(self.quote or self.heredocs or self.depth > 0 or self.backslash or self.operator)

    def feed(self, line: str) -> None:
        if self.heredocs and self.body:
            delimiter, tabs = self.heredocs[0]
            if (line.lstrip("\t") if tabs else line) == delimiter:
                self.heredocs.pop(0)
            return
        self.backslash = self.operator = False
        word = ""
        command_position = True
        i, n = 0, len(line)
        last = ""
        while i < n:
            c = line[i]
            if self.quote == "'":
                if c == "'":
                    self.quote = None
                i += 1
                continue
            if self.quote == '"':
                if c == "\\":
                    i += 2
                    continue
                if c == '"':
                    self.quote = None
                i += 1
                continue
            if c == "\\":
                if i == n - 1:
                    self.backslash = True
                    break
                word += line[i:i + 2]
                i += 2
                continue
            if c in "'\"":
                self.quote = c
                word += c
                i += 1
                continue
            if c == "#" and not word:
                break
            if c.isspace() or c in ";&|()<>":
                if word:
                    command_position = self._word(word, command_position)
                    last = word
                    word = ""
                if line.startswith("<<<", i):
                    i, last = i + 3, "<<<"
                    continue
                if line.startswith("<<", i):
                    i = self._heredoc(line, i + 2)
                    last = "<<"
                    continue
                if c in ";&|(":
                    command_position = True
                    last = line[i:i + 2] if line[i:i + 2] in ("&&", "||") else c
                    i += len(last)
                    continue
                if not c.isspace():
                    last = c
                i += 1
                continue
            word += c
            i += 1
        if word:
            self._word(word, command_position)
            last = word
        if self.quote is None and not self.backslash:
            self.operator = last in ("|", "&&", "||")
        self.body = bool(self.heredocs)

    def _word(self, word: str, command_position: bool) -> bool:
        if command_position and word in ("if", "for", "while", "until", "case", "select", "{"):
            self.depth += 1
        elif word in ("fi", "done", "esac", "}") and command_position:
            self.depth = max(0, self.depth - 1)
        return word in ("then", "do", "else", "elif", "!", "{", "time")

    def _heredoc(self, line: str, i: int) -> int:
        tabs = line.startswith("-", i)
        if tabs:
            i += 1
        while i < len(line) and line[i] in " \t":
            i += 1
        m = re.match(r"""(['"]?)([\w.-]+)\1""", line[i:])
        if m:
            self.heredocs.append((m.group(2), tabs))
            return i + m.end()
        return i
