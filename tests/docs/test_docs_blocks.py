"""docs.blocks: a page's code blocks as data, on small pages and on arbitrary input.

The per-generator goldens are in test_docs_blocks_goldens.py; these pin the
rules each generator's markup goes through.
"""

from __future__ import annotations

import html

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstrun.docs.blocks import (
    BlockKind,
    FileSource,
    Step,
    extract,
    extract_markdown,
    placeholders,
    shell_steps,
)

URL = "https://docs.example.test/start/"


def one(page: str):
    (block,) = extract(page, url=URL)
    return block


def commands(text: str) -> list[str]:
    return [s.command for s in shell_steps(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pip install tabulate\npython -c 'import tabulate'", ["pip install tabulate", "python -c 'import tabulate'"]),
        # Comments and blank lines are not steps.
        ("# install it\n\npip install x\n", ["pip install x"]),
        # A \ continuation is one command, joined by one space.
        ("pip install \\\n    requests \\\n    tabulate", ["pip install requests tabulate"]),
        # A trailing pipe or && goes on.
        ("cat x |\n  sort\nmake &&\n  make install", ["cat x |\n  sort", "make &&\n  make install"]),
        # A heredoc's body, blank lines and all, is its command's.
        ("cat > app.py <<'EOF'\nimport x\n\nprint(x)\nEOF\npython app.py",
         ["cat > app.py <<'EOF'\nimport x\n\nprint(x)\nEOF", "python app.py"]),
        ("cat <<-END\n\tx\n\tEND\necho done", ["cat <<-END\n\tx\n\tEND", "echo done"]),
        # An open quote and a compound command go on to their end.
        ("echo 'one\ntwo'\nls", ["echo 'one\ntwo'", "ls"]),
        ("for f in *.py; do\n  wc -l $f\ndone\nls", ["for f in *.py; do\n  wc -l $f\ndone", "ls"]),
        ("if true; then\n  echo y\nfi", ["if true; then\n  echo y\nfi"]),
        # A here-string is not a heredoc.
        ("grep x <<< 'x'\nls", ["grep x <<< 'x'", "ls"]),
        # Words that are keywords only at a command's start.
        ("echo for while\nls", ["echo for while", "ls"]),
    ],
)
def test_unprompted_lines_are_commands(text, expected):
    assert commands(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$ pip install tabulate\nCollecting tabulate\nSuccessfully installed tabulate-0.9.0\n$ tabulate --help\nusage",
         [Step(command="pip install tabulate", output=("Collecting tabulate", "Successfully installed tabulate-0.9.0")),
          Step(command="tabulate --help", output=("usage",))]),
        # zsh's %, a virtualenv's (name) and user@host:dir before the prompt.
        ("% brew install jq", [Step(command="brew install jq")]),
        ("(.venv) $ pip list", [Step(command="pip list")]),
        ("me@box:~/src$ make", [Step(command="make")]),
        # npm prints "> script" under a $ prompt: output, not commands.
        ("$ npm start\n\n> app@1.0.0 start\n> node index.js\n\nListening on 3000",
         [Step(command="npm start", output=("> app@1.0.0 start", "> node index.js", "", "Listening on 3000"))]),
        # The shell's > continuation prompt inside a heredoc.
        ("$ cat > hi.txt <<EOF\n> hello\n> EOF\n$ cat hi.txt\nhello",
         [Step(command="cat > hi.txt <<EOF\nhello\nEOF"), Step(command="cat hi.txt", output=("hello",))]),
        ("$ pip install \\\n>   tabulate", [Step(command="pip install tabulate")]),
        # A block that opens with > uses it as its prompt.
        ("> npm install\n> npm test", [Step(command="npm install"), Step(command="npm test")]),
    ],
)
def test_prompted_blocks_keep_output_apart(text, expected):
    assert list(shell_steps(text)) == expected


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("export OPENAI_API_KEY=<your-api-key>", ("<your-api-key>",)),
        ("git clone https://github.com/<user name>/repo", ("<user name>",)),
        ("curl -H 'Authorization: Bearer YOUR_TOKEN' https://api.test", ("YOUR_TOKEN",)),
        ("cd your-project && ls", ("your-project",)),
        ("curl -H \"x: $STRIPE_SECRET_KEY\" x", ("$STRIPE_SECRET_KEY",)),
        ("echo ${GITHUB_TOKEN}", ("${GITHUB_TOKEN}",)),
        # A variable the command sets first is not left to the reader.
        ("export API_KEY=abc; curl -u $API_KEY x", ()),
        ("read -s API_TOKEN; use $API_TOKEN", ()),
        # Redirections, heredocs, here-strings, process substitution and HTML are not placeholders.
        ("sort < input.txt > out.txt", ()),
        ("sort <input.txt >out.txt", ()),
        ("cat <<EOF\nx\nEOF", ()),
        ("cat <<'END' > f", ()),
        ("grep x <<< \"$y\"", ()),
        ("diff <(ls a) <(ls b)", ()),
        ("echo '<p>hello</p>' > index.html", ()),
        ("cmd 2>&1 | tee log", ()),
        # Each once, in order.
        ("a <name> YOUR_KEY <name>", ("<name>", "YOUR_KEY")),
    ],
)
def test_placeholders(command, expected):
    assert placeholders(command) == expected


def test_a_file_block_and_a_shell_block_name_their_placeholders():
    page = ("<p>Save this as <code>.env</code>:</p><pre><code>API_KEY=&lt;your-api-key&gt;</code></pre>"
            "<pre><code class='language-bash'>curl -u YOUR_USER x\necho YOUR_USER</code></pre>")
    env, shell = extract(page, url=URL)
    assert env.placeholders == ("<your-api-key>",)
    assert shell.placeholders == ("YOUR_USER",)


def test_a_variable_set_in_an_earlier_step_or_block_is_not_a_placeholder():
    page = ("<pre><code class='language-bash'>export SERVICE_TOKEN=$(cat token.txt)</code></pre>"
            "<pre><code class='language-bash'>curl -H \"t: $SERVICE_TOKEN\" x\ncurl $OTHER_TOKEN</code></pre>")
    first, second = extract(page, url=URL)
    assert second.steps[0].placeholders == ()
    assert second.steps[1].placeholders == ("$OTHER_TOKEN",)


@pytest.mark.parametrize("language", ["bash", "sh", "shell", "console", "zsh", "terminal", "shell-session",
                                      "sh-session", "shellsession"])
def test_shell_languages(language):
    block = one(f"<pre><code class='language-{language}'>ls</code></pre>")
    assert block.kind is BlockKind.SHELL
    assert block.steps == (Step(command="ls"),)


def test_an_unlabelled_block_is_shell_only_when_it_opens_with_a_prompt():
    assert one("<pre><code>$ make test\nok</code></pre>").kind is BlockKind.SHELL
    assert one("<pre><code>make test</code></pre>").kind is BlockKind.OTHER
    assert one("<pre><code>&gt; a quotation</code></pre>").kind is BlockKind.OTHER
    assert one("<pre><code class='language-python'>$ x = 1</code></pre>").kind is BlockKind.OTHER
    # pymdownx labels a fence given no language "text".
    assert one("<div class='language-text highlight'><pre><code>$ make</code></pre></div>").kind is BlockKind.SHELL
    assert one("<div class='language-text highlight'><pre><code>make</code></pre></div>").kind is BlockKind.OTHER


def test_the_language_may_be_on_any_of_the_blocks_own_wrappers():
    # MkDocs Material with line numbers: the language is on the div around the table.
    page = ("<p>Run:</p><div class='language-bash highlight'><table class='highlighttable'><tr>"
            "<td class='linenos'><div class='linenodiv'><pre><span class='normal'>1</span></pre></div></td>"
            "<td class='code'><div><pre><code>ls</code></pre></div></td></tr></table></div>")
    block = one(page)
    assert (block.language, block.text) == ("bash", "ls")


def test_github_scopes_are_languages():
    page = ('<div class="highlight highlight-source-shell notranslate position-relative overflow-auto">'
            "<pre>ls</pre></div>")
    assert one(page).language == "shell"


def test_copy_buttons_and_line_numbers_are_not_text():
    page = ("<div class='highlight'><pre><span class='linenos'>1</span>ls\n<span class='linenos'>2</span>pwd"
            "<button class='copybtn'>Copy</button></pre></div>")
    assert one(page).text == "ls\npwd"


@pytest.mark.parametrize(
    ("before", "skip", "file"),
    [
        ("<!-- firstrun: skip -->", True, None),
        ("<!--firstrun:skip-->", True, None),
        ("<!-- firstrun: file=conf/app.toml -->", False, "conf/app.toml"),
        ("<!-- firstrun: skip file=app.py -->", True, "app.py"),
        # Not a mark: another tool's comment, an unsafe file name.
        ("<!-- prettier-ignore -->", False, None),
        ("<!-- firstrun: file=a b -->", False, None),
    ],
)
def test_marks(before, skip, file):
    block = one(f"<p>Then:</p>\n{before}\n<div class='highlight'><pre><code class='language-bash'>ls</code></pre></div>")
    assert block.skip is skip
    assert block.file == file
    if file:
        assert block.kind is BlockKind.FILE
        assert block.file_source is FileSource.MARK


def test_a_mark_binds_only_the_block_right_after_it():
    page = ("<!-- firstrun: skip --><p>Run:</p><pre><code class='language-bash'>ls</code></pre>"
            "<!-- firstrun: skip --><pre><code class='language-bash'>pwd</code></pre>"
            "<pre><code class='language-bash'>id</code></pre>")
    assert [b.skip for b in extract(page, url=URL)] == [False, True, False]


def test_skip_class():
    page = "<div class='highlight firstrun-skip'><pre><code class='language-bash'>rm -rf build</code></pre></div>"
    assert one(page).skip


@pytest.mark.parametrize(
    ("sentence", "file"),
    [
        ("Save this as <code>app.py</code>:", "app.py"),
        ("Create a file named <code>src/main.rs</code> with:", "src/main.rs"),
        ("Create an <code>.env</code> file:", ".env"),
        ("Put the following in <code>Dockerfile</code>.", "Dockerfile"),
        ("Create <code>pyproject.toml</code>:", "pyproject.toml"),
        # Not a file the block is written to.
        ("Add these lines to <code>app.py</code>:", None),
        ("Run <code>python app.py</code>:", None),
        ("Create a virtual environment with <code>python -m venv .venv</code>:", None),
    ],
)
def test_the_sentence_before_a_block_ties_it_to_a_file(sentence, file):
    block = one(f"<p>{sentence}</p>\n<pre><code class='language-python'>print(1)</code></pre>")
    assert block.file == file
    assert block.kind is (BlockKind.FILE if file else BlockKind.OTHER)


def test_a_console_block_is_never_a_file():
    block = one("<p>Save this as <code>out.txt</code>:</p><pre><code>$ ls\nout.txt</code></pre>")
    assert block.kind is BlockKind.SHELL


def test_file_content_ends_in_one_newline():
    block = one("<p>Save this as <code>app.py</code>:</p><pre><code>print(1)\n\n</code></pre>")
    assert block.content == "print(1)\n"


def test_empty_blocks_are_not_blocks_and_indices_follow_the_page():
    page = ("<pre></pre><pre><code class='language-bash'>ls</code></pre><pre>  \n</pre>"
            "<pre><code class='language-python'>x = 1</code></pre>")
    assert [(b.index, b.kind) for b in extract(page, url=URL)] == [(0, BlockKind.SHELL), (1, BlockKind.OTHER)]


@pytest.mark.parametrize(
    ("fence", "language", "file", "skip"),
    [
        ("```python title=\"app.py\"", "python", "app.py", False),
        ("```js title='src/index.js' showLineNumbers", "js", "src/index.js", False),
        # Mintlify: the file name after the language.
        ("```python client.py", "python", "client.py", False),
        ("```bash Terminal", "bash", None, False),
        # pymdownx.superfences: the language and classes in braces.
        ("``` { .bash .firstrun-skip }", "bash", None, True),
        ("```", None, None, False),
    ],
)
def test_a_markdown_fence_gives_language_file_and_class(fence, language, file, skip):
    (block,) = extract_markdown(f"Then:\n\n{fence}\nls\n```\n", url=URL)
    assert (block.language, block.file, block.skip) == (language, file, skip)


def test_a_mark_binds_in_markdown_with_or_without_a_blank_line():
    text = "<!-- firstrun: skip -->\n```bash\nrm -rf x\n```\n\n<!-- firstrun: file=a.txt -->\n\n```\nhi\n```\n"
    skipped, file = extract_markdown(text, url=URL)
    assert skipped.skip and (file.kind, file.file) == (BlockKind.FILE, "a.txt")


@given(st.text(max_size=400))
def test_extraction_never_raises_on_text(text):
    extract(text, url=URL)
    extract_markdown(text, url=URL)


_TAGS = st.sampled_from(["pre", "code", "div", "p", "span", "td", "table", "tr", "button", "br", "!--", "figure"])


@st.composite
def tag_soup(draw):
    parts = []
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            attr = draw(st.sampled_from(["", " class='language-bash'", " class='linenos'", " title='a.py'",
                                         " class='firstrun-skip'"]))
            parts.append(f"<{draw(_TAGS)}{attr}>")
        elif kind == 1:
            parts.append(f"</{draw(_TAGS)}>")
        elif kind == 2:
            parts.append(draw(st.sampled_from(["$ ", "> ", "\\\n", "<<EOF\n", "EOF\n", "'", "<!-- firstrun: skip -->",
                                               "<!-- firstrun: file=x.py -->", "Save this as <code>a.py</code>"])))
        else:
            parts.append(draw(st.text(max_size=20)))
    return "".join(parts)


@given(tag_soup())
def test_extraction_never_raises_on_tag_soup(page):
    for block in extract(page, url=URL):
        assert block.text


_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_./=", min_size=1, max_size=12)
# A command starts with a program's name: a first word such as "if" or
# "for" opens a compound command, which rightly takes the next lines.
_COMMAND = st.tuples(st.sampled_from(["pip", "npm", "python", "echo", "make", "ls"]),
                     st.lists(_WORD, max_size=4)).map(lambda c: " ".join([c[0], *c[1]]))
_OUTPUT = st.lists(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 .:-", min_size=1, max_size=30)
                   .map(str.strip).filter(bool), max_size=3)


@given(st.lists(st.tuples(_COMMAND, _OUTPUT), min_size=1, max_size=5), st.sampled_from(["$ ", "% "]))
def test_prompt_stripping_round_trips(session, prompt):
    text = "\n".join(prompt + command + "".join("\n" + line for line in output) for command, output in session)
    block = one(f"<pre><code class='language-console'>{html.escape(text)}</code></pre>")
    assert [(s.command, list(s.output)) for s in block.steps] == [(c, o) for c, o in session]
