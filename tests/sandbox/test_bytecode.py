"""A program handed over as the harness's byte code runs as its source does.

Same ``__name__``, same ``sys.argv`` after the program; the only difference
is that nothing is compiled in the sandbox.
"""

from __future__ import annotations

import subprocess
import sys

import bytecode_echo

from firstrun.sandbox.bytecode import BOOTSTRAP, python_argv


def _run(argv: list[str]) -> str:
    done = subprocess.run([*argv, "one", "two words"], capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout


def test_the_code_runs_as_the_source_with_the_same_argv() -> None:
    compiled = python_argv(sys.executable, bytecode_echo, compiled=True)
    source = python_argv(sys.executable, bytecode_echo, compiled=False)
    assert compiled[4] == BOOTSTRAP and source[4].startswith('"""A stdlib-only program')
    assert _run(compiled) == _run(source) == \
        '{"name": "__main__", "argv": ["one", "two words"]}\n'
