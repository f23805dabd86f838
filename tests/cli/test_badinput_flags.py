"""Flag values that used to hang, fill memory, or fail only inside a session are refused at parse.

``--price-file`` naming a FIFO or a device was read forever; ``--repeat``
is queued in full before the first run, so an absurd count filled memory;
``sandbox --timeout`` past the sandbox's own limit started a session only to
fail in it (exit 125). Each is now one ``firstrun: error:`` line naming the
flag, exit 3.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.badinput import Run, one_error


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_price_file_that_is_no_regular_file_is_refused(firstrun: Run, tmp_path: Path, special: str) -> None:
    path = special
    if not special.startswith("/"):
        path = os.fspath(tmp_path / special)
        os.mkfifo(path)
    err = one_error(firstrun("run", "--example", "all", "--price-file", path, cwd=str(tmp_path), timeout=60))
    assert f"--price-file: '{path}' is not a regular file" in err


@pytest.mark.parametrize("value", ["10001", "99999999999999999999"])
def test_repeat_past_the_bound_is_refused(firstrun: Run, tmp_path: Path, value: str) -> None:
    err = one_error(firstrun("run", "--example", "all", "--repeat", value, cwd=str(tmp_path), timeout=60))
    assert "--repeat" in err and "at most 10000" in err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("value", ["604801", "1e300"])
def test_sandbox_timeout_past_the_sandbox_limit_is_a_flag_error(firstrun: Run, value: str) -> None:
    err = one_error(firstrun("sandbox", "--timeout", value, "--", "true", timeout=60))
    assert "--timeout" in err and "at most 604800" in err


LONG = "a" * 300


@pytest.mark.parametrize("argv", [
    ["run", "--example", "all", "--out", LONG],
    ["run", "--example", "all", "--resume", LONG],
    ["show", LONG],
    ["report", LONG, "--markdown", "-"],
    ["diff", LONG, LONG],
    ["sandbox", "--record", LONG, "--", "true"],
    ["init", "https://x.example/", "--out", LONG],
], ids=["run-out", "run-resume", "show", "report", "diff", "sandbox-record", "init-out"])
def test_a_path_too_long_for_the_filesystem_is_one_line(firstrun: Run, tmp_path: Path, argv: list[str]) -> None:
    err = one_error(firstrun(*argv, cwd=str(tmp_path), timeout=60))
    assert "File name too long" in err


def test_junit_name_too_long_is_refused_before_any_run(firstrun: Run, tmp_path: Path) -> None:
    name = "j" * 250
    err = one_error(firstrun("run", "--example", "all", "--junit", name, cwd=str(tmp_path), timeout=60))
    assert "--junit: the file name" in err and "too long" in err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(("flags", "says"), [
    (["--offline"], "--offline: there is no docs cache; give --cache-dir DIR"),
    (["--refresh"], "--refresh: there is no docs cache; give --cache-dir DIR"),
    (["--refresh", "--offline", "--cache-dir", "c"], "--refresh and --offline: one fetches every "
     "page, the other none; give one"),
])
def test_a_cache_flag_without_a_cache_or_with_its_opposite_is_one_line(
        firstrun: Run, tmp_path: Path, flags: list[str], says: str) -> None:
    err = one_error(firstrun("run", "--example", "all", *flags, cwd=str(tmp_path), timeout=60))
    assert says in err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(("agent", "key"), [("claude-code", "FIRSTRUN_ANTHROPIC_API_KEY"),
                                            ("codex", "FIRSTRUN_OPENAI_API_KEY"),
                                            ("gemini-cli", "FIRSTRUN_GEMINI_API_KEY")])
def test_an_agent_cli_on_a_backend_that_cannot_inspect_is_refused_before_any_run(
        firstrun: Run, tmp_path: Path, agent: str, key: str) -> None:
    from firstrun.agents.cli.install import AGENT_CLIS

    pin = AGENT_CLIS[agent]
    # A cached install, so the check needs no download.
    cached = tmp_path / "cache" / "firstrun" / "agents" / pin.key / pin.executable
    cached.parent.mkdir(parents=True)
    cached.write_text("")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), key: "sk-test"}
    err = one_error(firstrun("run", "--example", "python-tabulate", "--agent", agent,
                             "--backend", "local", "--out", str(tmp_path / "out"),
                             cwd=str(tmp_path), env=env, timeout=60))
    # Its key goes into its API requests through inspection of that host alone: no
    # --inspect-tls is asked for, but the backend must be able to show the run's CA.
    assert f"--backend local: --agent {agent}" in err and "--inspect-tls" not in err
    assert not (tmp_path / "out").exists()
