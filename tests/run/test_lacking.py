"""What a default image lacked: the loader's message, a step's command words, the loader cache."""

from __future__ import annotations

import pytest

from firstrun.run.events import CommandRan, Source
from firstrun.run.lacking import command_words, loader_cache, missing_libraries, wanted

pytestmark = pytest.mark.fast

# The one place the loader's message is read: every form it reaches a step in.
LOADER = [
    # glibc's loader starting a program (Playwright's bundled node on a bare image).
    ("/home/sandbox/.cache/ms-playwright-go/node: error while loading shared libraries: "
     "libatomic.so.1: cannot open shared object file: No such file or directory",
     ["libatomic.so.1"]),
    # dlopen, as Python's ImportError repeats it.
    ("ImportError: libGL.so.1: cannot open shared object file: No such file or directory",
     ["libGL.so.1"]),
    ("OSError: libnss3.so: cannot open shared object file: No such file or directory",
     ["libnss3.so"]),
    # Two of them, one twice: in order, once each.
    ("a: error while loading shared libraries: libX11.so.6: cannot open shared object file\n"
     "b: error while loading shared libraries: libgomp.so.1: cannot open shared object file\n"
     "c: error while loading shared libraries: libX11.so.6: cannot open shared object file",
     ["libX11.so.6", "libgomp.so.1"]),
    # Not the loader: a missing data file, a library found but wrong.
    ("cat: data.so: No such file or directory", []),
    ("node: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.38' not found", []),
    ("", []),
]


@pytest.mark.parametrize(("text", "libraries"), LOADER)
def test_the_loaders_message_names_the_missing_libraries(text: str, libraries: list[str]) -> None:
    assert missing_libraries(text) == libraries


WORDS = [
    ("corepack enable", ["corepack"]),
    ("corepack enable && yarn install", ["corepack", "yarn"]),
    ("A=1 B=2 make -j2 all", ["make"]),
    ("sudo env CI=1 time npx playwright install || echo failed", ["npx", "echo"]),
    ("(cd app && npm ci) | tee log; ./run.sh", ["cd", "npm", "tee"]),
    ("if command -v bun; then bun x; fi", ["bun"]),
    ("for f in a b; do gzip $f; done", ["gzip"]),
    # A here-document's body runs nothing; the line after it does.
    ("cat > latest.mjs <<'JS'\nconst name = process.argv[2];\nJS\nnode latest.mjs ms",
     ["cat", "node"]),
    ("cat <<-EOF > x\n\tfoo bar\n\tEOF\nuv sync", ["cat", "uv"]),
    ("/usr/bin/python3 -m venv .venv", []),
    ("echo 'unbalanced", []),
]


@pytest.mark.parametrize(("script", "words"), WORDS)
def test_command_words_are_what_the_step_runs_by_name(script: str, words: list[str]) -> None:
    assert command_words(script) == words


def test_the_loader_cache_lists_each_library_by_name() -> None:
    listing = ("3 libs found in cache `/etc/ld.so.cache'\n"
               "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n"
               "\tlibatomic.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libatomic.so.1\n"
               "\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6\n"
               "absent make\n")
    assert loader_cache(listing) == {"libz.so.1", "libatomic.so.1", "libc.so.6"}


def _ran(source: Source, command: str, code: int, stderr: str = "") -> CommandRan:
    return CommandRan(source=source, command=command, exit_code=code, duration_s=0.0,
                      stderr=stderr)


def test_only_failed_steps_offer_what_they_could_not_find() -> None:
    loader = "x: error while loading shared libraries: libatomic.so.1: cannot open shared object file"
    events = [
        _ran(Source.SETUP, "setuptool go", 127),
        _ran(Source.AGENT, "jq . a.json", 0),
        # Exit 1 is not "not found": its words are not asked about; the loader's message is.
        _ran(Source.AGENT, "python3 bundled.py", 1, loader),
        _ran(Source.AGENT, "corepack enable && yarn", 127, "bash: corepack: command not found"),
        _ran(Source.CHECK, "<success check>", 127),
    ]
    assert wanted(events, "make test") == (["corepack", "yarn", "make"], ["libatomic.so.1"])
