"""What a default image lacked that this host has, when a failed step needed it.

Guarantee: after a failed check in a default image (``RECIPES``), a step that
exited 127 (the shell's "not found") offers the words its own text runs as
commands, and any failed step the libraries the loader could not open (read in
``missing_libraries`` alone: the loader's message is the only signal). One
command asks the image which it has; the host is asked the same. What the
image lacks and the host has becomes one ``ImageLacked`` event.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence

from firstrun.images.build import RECIPES
from firstrun.run.events import CommandRan, Event, ImageLacked, Source
from firstrun.sandbox.base import Session

# The shell's exit status for a command it could not find.
NOT_FOUND = 127
LDCONFIG = "/sbin/ldconfig"
# glibc's loader ("error while loading shared libraries: X: cannot open
# shared object file") and dlopen's dlerror, which Python's ImportError
# repeats, end alike.
_LOADER = re.compile(r"([A-Za-z0-9_.+-]+\.so(?:\.[0-9][0-9.]*)?): cannot open shared object file")
# Words in a command's place that are no tool: the shell's reserved words, and
# prefixes that run the next word as the command.
_NOT_TOOLS = frozenset({"if", "then", "elif", "else", "fi", "while", "until", "do", "done",
                        "case", "esac", "for", "select", "function", "!", "{", "}",
                        "sudo", "env", "time", "exec", "nohup", "command", "builtin", "xargs"})
_HEADERS = frozenset({"for", "case", "select", "function"})
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "\n", ";;", "|&"})
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_CACHE_ENTRY = re.compile(r"^\s+(\S+) \(")


def missing_libraries(text: str) -> list[str]:
    """The shared libraries a loader or dlopen said it could not open, in order, once each."""
    return list(dict.fromkeys(_LOADER.findall(text)))


def command_words(script: str) -> list[str]:
    """The words ``script`` runs as commands by name (pure; none for a script shlex cannot read).

    Assignments before a command, reserved words and prefixes that run the
    next word (``sudo``, ``env``, ``time``, ...) are skipped; paths (``./x``) are no
    tool an image has; a here-document's body runs nothing.
    """
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace = " \t\r"
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    words: list[str] = []
    at_command = True
    heredoc: str | None = None
    skipping: str | None = None
    for i, token in enumerate(tokens):
        if skipping is not None:
            # The body ends at a line that is the delimiter alone.
            if token == skipping and tokens[i - 1] == "\n" and tokens[i + 1:i + 2] in ([], ["\n"]):
                skipping = None
            continue
        if token == "<<" and i + 1 < len(tokens):
            heredoc = tokens[i + 1].lstrip("-")
        if token in _SEPARATORS:
            at_command = True
            if token == "\n" and heredoc is not None:
                skipping, heredoc = heredoc, None
            continue
        if not at_command:
            continue
        if "=" in token and _NAME.fullmatch(token.split("=", 1)[0]) or token in _NOT_TOOLS:
            # What follows ``for``, ``case`` and ``select`` up to a separator is no command.
            at_command = token not in _HEADERS
            continue
        at_command = False
        if _NAME.fullmatch(token):
            words.append(token)
    return list(dict.fromkeys(words))


def loader_cache(listing: str) -> frozenset[str]:
    """The library names in ``ldconfig -p``'s listing (pure)."""
    return frozenset(m.group(1) for line in listing.splitlines()
                     if (m := _CACHE_ENTRY.match(line)))


def wanted(events: Sequence[Event], check_script: str) -> tuple[list[str], list[str]]:
    """The commands and libraries the run's failed steps could not find (pure)."""
    commands: list[str] = []
    libraries: list[str] = []
    for event in events:
        if not isinstance(event, CommandRan) or event.source is Source.SETUP \
                or event.exit_code == 0:
            continue
        if event.exit_code == NOT_FOUND:
            commands += command_words(check_script if event.source is Source.CHECK
                                      else event.command)
        libraries += missing_libraries(event.stderr + "\n" + event.stdout)
    return list(dict.fromkeys(commands)), list(dict.fromkeys(libraries))


def _host_libraries() -> frozenset[str]:
    try:
        done = subprocess.run([LDCONFIG, "-p"], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return loader_cache(done.stdout)


# Prints "absent NAME" for each name the image cannot run, then its loader cache.
_PROBE = ('for c in "$@"; do command -v "$c" >/dev/null 2>&1 || echo "absent $c"; done; '
          f"{LDCONFIG} -p 2>/dev/null")


def image_lacked(session: Session, image: str | None, events: Sequence[Event],
                 check_script: str) -> ImageLacked | None:
    """What the default image ``image`` lacked and this host has; None when nothing or no default image."""
    if image not in {recipe.tag for recipe in RECIPES}:
        return None
    commands, libraries = wanted(events, check_script)
    if not commands and not libraries:
        return None
    result = session.exec(["/bin/sh", "-c", _PROBE, "firstrun-probe", *commands], timeout=60)
    output = result.stdout.text()
    absent = {line.removeprefix("absent ") for line in output.splitlines()
              if line.startswith("absent ")}
    image_has = loader_cache(output)
    host_has = _host_libraries() if libraries else frozenset()
    lacked_commands = [c for c in commands if c in absent and shutil.which(c) is not None]
    lacked_libraries = [lib for lib in libraries if lib not in image_has and lib in host_has]
    if not lacked_commands and not lacked_libraries:
        return None
    return ImageLacked(image=image, commands=lacked_commands, libraries=lacked_libraries)
