"""The one place every backend checks a command before it runs: argv, environment, cwd, limit."""

from __future__ import annotations

import pytest

from firstrun.errors import SandboxError
from firstrun.sandbox.base import prepare_command

WORKSPACE = "/workspace"


def _prepare(command: object = "true", **kw: object):  # type: ignore[no-untyped-def]
    args = {"cwd": None, "timeout": None, "env": None, "session_env": {"PATH": "/usr/bin"},
            "workspace": WORKSPACE, "default_timeout": 30.0, "who": "test"}
    args.update(kw)
    return prepare_command(command, **args)  # type: ignore[arg-type]


def test_a_string_runs_under_bash_and_defaults_apply() -> None:
    cmd = _prepare("echo hi")
    assert (cmd.argv, cmd.cwd, cmd.timeout) == (["/bin/bash", "-c", "echo hi"], WORKSPACE, 30.0)
    assert _prepare(["ls", "-l"], timeout=5.0).timeout == 5.0


@pytest.mark.parametrize("cwd, resolved", [("sub", "/workspace/sub"), ("a/../b", "/workspace/b"),
                                           ("./", WORKSPACE), ("/workspace/x", "/workspace/x")])
def test_a_cwd_beneath_the_workspace_is_resolved(cwd: str, resolved: str) -> None:
    assert _prepare(cwd=cwd).cwd == resolved


@pytest.mark.parametrize("cwd", ["..", "../etc", "sub/../../root", "/etc", "/workspace2"])
def test_a_cwd_outside_the_workspace_is_refused_by_name(cwd: str) -> None:
    with pytest.raises(SandboxError, match="outside the workspace") as caught:
        _prepare(cwd=cwd)
    assert caught.value.who == "test"


def test_extra_variables_add_but_never_replace() -> None:
    cmd = _prepare(env={"PATH": "/evil", "EXTRA": "1"})
    assert cmd.env == {"PATH": "/usr/bin", "EXTRA": "1"}
    with pytest.raises(SandboxError, match="invalid environment variable"):
        _prepare(env={"A=B": "x"})


@pytest.mark.parametrize("command", [[], ["a\0b"], [1]])
def test_an_unrunnable_argv_is_refused(command: object) -> None:
    with pytest.raises(SandboxError, match="non-empty"):
        _prepare(command)
