"""Every bad input ends in one line naming what was wrong, and exit status 3."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

Run = Callable[..., subprocess.CompletedProcess[str]]

CASES = [
    # (argv, text the one line must contain)
    (["sandbox", "--bogus", "--", "true"], "--bogus"),
    (["sandbox", "--allow", "*.com", "--", "true"], "--allow"),
    (["sandbox", "--allow", "*", "--", "true"], "--allow"),
    (["sandbox", "--deny", "exa mple.com", "--", "true"], "--deny"),
    (["sandbox", "--allow", "pypi.org:99999", "--", "true"], "--allow"),
    (["sandbox", "--workspace", "/nonexistent/firstrun-test", "--", "true"], "--workspace"),
    (["sandbox", "--record", "/nonexistent/dir/rec.jsonl", "--", "true"], "--record"),
    (["sandbox", "--backend", "podman", "--", "true"], "--backend"),
    (["sandbox", "--timeout", "-1", "--", "true"], "--timeout"),
    (["sandbox", "--timeout", "soon", "--", "true"], "--timeout"),
    (["sandbox", "--allow-downgrade", "everything", "--", "true"], "--allow-downgrade"),
    (["sandbox", "--allow-unenf", "--", "true"], "--allow-unenf"),
    (["sandbox", "--"], "missing command"),
    (["sandbox", "echo", "hi"], "echo"),
    (["sandbox"], "missing command"),
    (["doctor", "--", "true"], "doctor"),
    (["frobnicate"], "frobnicate"),
]


@pytest.mark.parametrize(("argv", "names"), CASES, ids=[" ".join(a) or "(none)" for a, _ in CASES])
def test_bad_input_is_one_line_and_exit_3(firstrun: Run, argv: list[str], names: str) -> None:
    proc = firstrun(*argv)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1, proc.stderr
    assert err[0].startswith("firstrun: error: ")
    assert names in err[0]
    assert proc.stdout == ""


def test_help_exits_zero(firstrun: Run) -> None:
    proc = firstrun("sandbox", "--help")
    assert proc.returncode == 0
    for flag in ("--backend", "--allow", "--deny", "--workspace", "--record",
                 "--allow-unenforced", "--allow-downgrade", "--report-only", "--timeout", "--json"):
        assert flag in proc.stdout


def test_a_bare_firstrun_prints_the_help_and_exits_zero(firstrun: Run) -> None:
    proc = firstrun()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: firstrun [-h] [-V] COMMAND ...") and proc.stderr == ""


def test_version_has_a_short_flag_and_python_m_is_the_same_command(firstrun: Run) -> None:
    import sys

    short, long = firstrun("-V"), firstrun("--version")
    module = subprocess.run([sys.executable, "-m", "firstrun", "-V"], capture_output=True,
                            text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert short.returncode == long.returncode == module.returncode == 0
    assert short.stdout == long.stdout == module.stdout and short.stdout.startswith("firstrun ")


@pytest.mark.parametrize("argv", [["schema"], ["examples"], ["doctor", "--json"]])
def test_a_reader_that_closed_the_pipe_early_is_no_error(argv: list[str]) -> None:
    """``firstrun schema | head -c 1``: the reader is gone before a byte is written, so the
    first write meets EPIPE; the command ends quietly, as if killed by SIGPIPE."""
    import os
    import sys
    from pathlib import Path

    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([str(Path(sys.executable).parent / "firstrun"), *argv], stdout=write, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.stderr == "" and proc.returncode == 141, proc.stderr


def test_every_commands_help_ends_with_examples_of_it(firstrun: Run) -> None:
    from firstrun.cli.main import EXAMPLES

    for command, examples in EXAMPLES.items():
        shown = firstrun(command, "--help")
        assert shown.returncode == 0, shown.stderr
        tail = shown.stdout.rstrip("\n").splitlines()[-len(examples) - 1:]
        assert tail == ["examples:", *(f"  {line}" for line in examples)], (command, tail)
        assert all(line.startswith(f"firstrun {command}") or command == "examples"
                   for line in examples)


def test_a_usage_line_written_by_hand_names_every_flag_of_its_command() -> None:
    """Written by hand, a usage line drifts from the parser (check's once left out --image,
    --out, --config and --inspect-tls); one that does not say [OPTIONS] names every flag."""
    import argparse
    import re

    from firstrun.cli.main import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    written = {name: parser for name, parser in commands.choices.items()
               if parser.usage is not None and "[OPTIONS]" not in parser.usage}
    assert {"check", "diff", "report", "audit"} <= set(written)
    for name, parser in written.items():
        named = set(re.findall(r"--[\w-]+", parser.usage.replace("--[no-]", "--")))
        flags = {flag.replace("--no-", "--", 1) for action in parser._actions for flag in action.option_strings
                 if flag.startswith("--") and flag != "--help"}
        assert flags <= named, (name, sorted(flags - named))
