"""``firstrun completion``: each shell's script offers what the parser accepts, and the shell takes it.

bash is driven for real: the script is sourced in a ``bash`` and its
completion function is called with ``COMP_WORDS``/``COMP_CWORD`` set as
readline sets them. zsh and fish parse the script (``-n``) when installed,
and fish also answers ``complete -C`` from it; for all three, every
subcommand and every flag of the parser, read here straight from argparse,
is in the script.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from firstrun.agents import AGENTS
from firstrun.cli.completion import DIRECTORIES, FREE, PATHS, SHELLS, completion_script
from firstrun.cli.main import build_parser, main
from firstrun.run.options import ENGINES
from firstrun.sandbox.select import BACKENDS


def _script(shell: str) -> str:
    return completion_script(build_parser(), shell)


def _commands(parser: argparse.ArgumentParser,
              path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser under ``parser`` with its words after ``firstrun``, read from argparse itself."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return [name for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name in action.choices]


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [name for action in parser._actions for name in action.option_strings]


def _complete_bash(words: list[str], cwd: Path) -> list[str]:
    """What bash offers for ``words`` (the last one being completed), with the script sourced."""
    script = cwd / "firstrun.bash"
    script.write_text(_script("bash"))
    array = " ".join("'" + word.replace("'", "'\\''") + "'" for word in words)
    program = (f"source {script}\n"
               "complete -p firstrun\n"
               f"COMP_WORDS=({array}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))\n"
               "_firstrun\n"
               "printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], cwd=cwd, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    registered, *offered = proc.stdout.splitlines()
    assert registered == "complete -F _firstrun firstrun"
    return [line for line in offered if line]


@pytest.mark.parametrize(("words", "offered"), [
    (["firstrun", "ru"], ["run"]),
    (["firstrun", "run", "--back"], ["--backend"]),
    (["firstrun", "run", "--backend", ""], list(BACKENDS)),
    # readline splits --backend=li at '=' (COMP_WORDBREAKS); kept as one word, the prefix stays.
    (["firstrun", "run", "--backend", "=", ""], list(BACKENDS)),
    (["firstrun", "run", "--backend", "=", "li"], ["linux"]),
    (["firstrun", "run", "--backend=li"], ["--backend=linux"]),
    (["firstrun", "run", "--agent", ""], list(AGENTS)),
    (["firstrun", "run", "tasks/a.yaml", "--engine", "r"], ["ray"]),
    (["firstrun", "run", "--engine", "local", "--eng"], ["--engine"]),
    (["firstrun", "check", "t.yaml", "--backend", "li"], ["linux"]),
    (["firstrun", "sandbox", "--backend", "do"], ["docker"]),
    (["firstrun", "validate", "--format", "g"], ["github"]),
    (["firstrun", "audit", "--format", "m"], ["markdown"]),
    (["firstrun", "images", ""], ["build"]),
    (["firstrun", "images", "build", "--mi"], ["--microvm"]),
    (["firstrun", "completion", ""], list(SHELLS)),
    (["firstrun", "completion", "bash", ""], []),
    (["firstrun", "-"], ["-h", "--help", "-V", "--version"]),
])
def test_bash_completes_commands_flags_and_choices(tmp_path: Path, words: list[str], offered: list[str]) -> None:
    assert _complete_bash(words, tmp_path) == offered


def test_bash_completes_paths_where_the_parser_takes_them(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks.yaml").write_text("")
    assert sorted(_complete_bash(["firstrun", "run", "ta"], tmp_path)) == ["tasks", "tasks.yaml"]
    assert _complete_bash(["firstrun", "run", "--out", "ta"], tmp_path) == ["tasks"]
    assert sorted(_complete_bash(["firstrun", "run", "--junit", "ta"], tmp_path)) == ["tasks", "tasks.yaml"]
    # A value that is not a path completes to nothing, never to the files here.
    assert _complete_bash(["firstrun", "run", "--repeat", "ta"], tmp_path) == []
    # After the value, the next word is a task again.
    assert sorted(_complete_bash(["firstrun", "run", "--repeat", "3", "ta"], tmp_path)) == ["tasks", "tasks.yaml"]
    # sandbox's words after '--' are a command line: a command, then its arguments.
    assert "bash" in _complete_bash(["firstrun", "sandbox", "--", "bas"], tmp_path)
    assert sorted(_complete_bash(["firstrun", "sandbox", "--", "cat", "ta"], tmp_path)) == ["tasks", "tasks.yaml"]


def test_bash_offers_every_subcommand_and_every_flag_of_the_parser(tmp_path: Path) -> None:
    for path, parser in _commands(build_parser()):
        words = ["firstrun", *path]
        if _subcommands(parser):
            assert _complete_bash([*words, ""], tmp_path) == _subcommands(parser), path
        assert _complete_bash([*words, "-"], tmp_path) == _flags(parser), path


def test_every_value_the_parser_takes_completes_to_something_decided() -> None:
    """A new metavar must be named as a path, a directory or free text, not left to chance."""
    for path, parser in _commands(build_parser()):
        for action in parser._actions:
            if action.nargs == 0 or action.choices or isinstance(action, argparse._SubParsersAction):
                continue
            metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
            assert metavar in PATHS | DIRECTORIES | FREE, (path, action.option_strings, metavar)


def _installed(shell: str) -> str:
    found = shutil.which(shell)
    if found is None:
        pytest.skip(f"{shell} is not installed here (which {shell} found nothing)")
    return found


def _zsh_function(script: str, path: tuple[str, ...]) -> str:
    name = "_firstrun" + "".join("_" + word for word in path)
    match = re.search(rf"^{name}\(\) {{\n(.*?)^}}\n", script, re.MULTILINE | re.DOTALL)
    assert match, name
    return match.group(1)


def test_the_zsh_script_names_every_subcommand_flag_and_choice() -> None:
    script = _script("zsh")
    assert script.startswith("#compdef firstrun\n")
    for path, parser in _commands(build_parser()):
        body = _zsh_function(script, path)
        for name in _subcommands(parser):
            assert f"'{name}:" in body and f"'{name}') _firstrun" in body, (path, name)
        for flag in _flags(parser):
            assert re.search(rf"[)*']{re.escape(flag)}=?-?\[", body), (path, flag)
    run = _zsh_function(script, ("run",))
    assert f":BACKEND:({' '.join(BACKENDS)})" in run and f":ENGINE:({' '.join(ENGINES)})" in run


def test_zsh_accepts_the_script(tmp_path: Path) -> None:
    zsh = _installed("zsh")
    script = tmp_path / "_firstrun"
    script.write_text(_script("zsh"))
    proc = subprocess.run([zsh, "-n", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def _fish_lines(script: str, path: tuple[str, ...]) -> list[str]:
    key = " ".join(path)
    return [line for line in script.splitlines()
            if line.startswith("complete -c firstrun -n ") and f"\\'{key}\\'" in line.split(" -a ")[0]
            .split(" -l ")[0].split(" -s ")[0]]


def test_the_fish_script_names_every_subcommand_and_flag() -> None:
    script = _script("fish")
    for path, parser in _commands(build_parser()):
        lines = _fish_lines(script, path)
        for name in _subcommands(parser):
            assert any(f" -a '{name}' " in line for line in lines), (path, name)
        for flag in _flags(parser):
            spelling = f" -l '{flag[2:]}'" if flag.startswith("--") else f" -s '{flag[1:]}'"
            assert any(spelling in line for line in lines), (path, flag)


def test_fish_accepts_the_script_and_completes_from_it(tmp_path: Path) -> None:
    fish = _installed("fish")
    script = tmp_path / "firstrun.fish"
    script.write_text(_script("fish"))
    proc = subprocess.run([fish, "--no-config", "-n", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    (tmp_path / "tasks").mkdir()

    def offered(line: str) -> list[str]:
        proc = subprocess.run(
            [fish, "--no-config", "-c", f"source {script}; complete -C {line!r}"], cwd=tmp_path,
            capture_output=True, text=True, timeout=60, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr
        return [out.split("\t")[0] for out in proc.stdout.splitlines()]

    assert offered("firstrun ru") == ["run"]
    assert offered("firstrun run --back") == ["--backend"]
    assert offered("firstrun run --backend ") == sorted(BACKENDS)
    assert offered("firstrun run --backend=li") == ["--backend=linux"]
    assert offered("firstrun run --out ta") == ["tasks/"]
    assert offered("firstrun completion ") == sorted(SHELLS)
    assert offered("firstrun images ") == ["build"]


def test_the_bash_script_is_the_one_the_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["completion", "bash"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == _script("bash")


def test_an_unknown_shell_is_one_line_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["completion", "tcsh"])
    assert exited.value.code == 3
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert captured.out == "" and line.startswith("firstrun: error: ") and "tcsh" in line
    assert all(shell in line for shell in SHELLS)
