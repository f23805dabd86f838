"""Odd commands against a real linux session: a bad argument is refused by name, and the
sandbox that was asked survives it.

Before these were refused up front, each one reached the helper inside the
sandbox: a NaN limit, a lone surrogate or a NUL in the working directory
killed it (and the session with it), infinity escaped as a bare
OverflowError, and a limit of a month overflowed the helper's own wait.
"""

from __future__ import annotations

import pytest

from firstrun.errors import SandboxError
from firstrun.policy.process import MAX_COMMAND_TIMEOUT_S
from firstrun.sandbox.base import prepare_command
from firstrun.sandbox.linux.backend import LinuxSession


def _prepare(**kw: object):  # type: ignore[no-untyped-def]
    args = {"cwd": None, "timeout": None, "env": None, "session_env": {"PATH": "/usr/bin"},
            "workspace": "/workspace", "default_timeout": 30.0, "who": "test"}
    args.update(kw)
    return prepare_command("true", **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -float("inf"), 1e300, 0, -1.0,
                                     30 * 86400.0, "5", True, None])
def test_a_limit_that_is_no_number_of_seconds_is_refused(timeout: object) -> None:
    args = {"timeout": timeout} if timeout is not None else {"default_timeout": float("nan")}
    with pytest.raises(SandboxError, match="not a number of seconds") as caught:
        _prepare(**args)
    assert caught.value.who == "test"


@pytest.mark.parametrize("timeout", [0.001, 1, MAX_COMMAND_TIMEOUT_S])
def test_a_limit_in_range_is_kept_as_seconds(timeout: float) -> None:
    assert _prepare(timeout=timeout).timeout == float(timeout)


@pytest.mark.parametrize("kwargs", [
    {"timeout": float("nan")},
    {"timeout": float("inf")},
    {"timeout": 30 * 86400.0},
    {"cwd": "a\0b"},
    {"cwd": "\ud800"},
    {"command": ["echo", "\ud800"]},
    {"command": "echo \udfff"},
    {"env": {"A": "\ud800"}},
    {"env": {"A": 1}},
    {"env": {1: "a"}},
    {"env": [("A", "B")]},
])
def test_a_bad_argument_is_refused_and_the_session_survives(session: LinuxSession,
                                                            kwargs: dict) -> None:
    command = kwargs.pop("command", "echo never")
    with pytest.raises(SandboxError) as caught:
        session.exec(command, **kwargs)
    assert caught.value.who == "linux"
    after = session.exec("echo alive")
    assert (after.exit_code, after.stdout.text()) == (0, "alive\n")


def test_what_the_kernel_takes_runs_as_given(session: LinuxSession) -> None:
    # Bytes a str carries by surrogateescape, newlines and '=' in values, a
    # newline in a name: all legal to the kernel, and passed through.
    result = session.exec(["/usr/bin/env"], env={"A": "x\ny=z", "B\nC": "1", "D": "\udcff"})
    assert result.exit_code == 0
    out = result.stdout.data
    assert b"A=x\ny=z\n" in out and b"B\nC=1\n" in out and b"D=\xff\n" in out


def test_the_longest_limit_runs(session: LinuxSession) -> None:
    result = session.exec("echo ok", timeout=MAX_COMMAND_TIMEOUT_S)
    assert (result.exit_code, result.timed_out, result.stdout.text()) == (0, False, "ok\n")


def test_argv_beyond_the_kernels_limit_is_a_failed_command(session: LinuxSession) -> None:
    huge = session.exec(["/bin/echo", "x" * 10_000_000])
    assert huge.exit_code == 127 and "Argument list too long" in huge.stderr.text()
    many = session.exec(["/bin/sh", "-c", 'echo "$#"', "sh", *(["a"] * 100_000)])
    assert (many.exit_code, many.stdout.text()) == (0, "100000\n")
