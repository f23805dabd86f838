"""A key never enters the sandbox, the trace, the results or the logs: proved with canaries.

The real ``firstrun run`` runs each vendor's agent with canary keys in its
environment (firstrun's own variable and the vendor's standard one) and the
SDK's debug logging on where it has a switch for it.
The scripted model dumps everything the sandbox can see of environments
and processes; that output is recorded in the trace, so one search of every
file under --out, and of the command's own output, covers the sandbox, the
trace, the results and the logs. The server saw the first canary as the
key, so the canary was live, not absent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from firstrun.agents.keys import KEY_VARIABLES, read_key, require_key
from firstrun.errors import UsageError
from support.agents import DOCS_HOST, GREETER_DOCS, greeter_task
from support.vendor import VendorServer
from support.wire_formats import ANTHROPIC, GEMINI, OPENAI, WireFormat

FIRSTRUN = Path(sys.executable).parent / "firstrun"
CANARY = "sk-canary-4f1d9e2b7c"
VENDOR_CANARY = "sk-vendor-canary-93ab51"
DUMP = ("env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < \"$f\"; "
        "echo; done; ps -eo pid,args 2>/dev/null; cat /proc/self/environ | tr '\\0' '\\n'")


@dataclass(frozen=True, kw_only=True)
class KeyCase:
    """How ``firstrun run`` is pointed at one vendor's scripted server, and where its SDK
    reads a key and turns its debug log on (None: the SDK has no such switch)."""

    fmt: WireFormat
    vendor_variable: str
    debug_log: str | None
    base_url: Callable[[str], str]


CASES = (
    KeyCase(fmt=ANTHROPIC, vendor_variable="ANTHROPIC_API_KEY", debug_log="ANTHROPIC_LOG",
            base_url=lambda url: url),
    KeyCase(fmt=OPENAI, vendor_variable="OPENAI_API_KEY", debug_log="OPENAI_LOG",
            base_url=lambda url: f"{url}/v1"),
    KeyCase(fmt=GEMINI, vendor_variable="GEMINI_API_KEY", debug_log=None,
            base_url=lambda url: url),
)


@pytest.mark.parametrize("case", CASES, ids=[c.fmt.name for c in CASES])
def test_a_canary_key_is_nowhere_but_the_request_to_the_vendor(case: KeyCase,
                                                               tmp_path: Path) -> None:
    fmt = case.fmt
    task = greeter_task(tmp_path, budgets={"max_tokens": 100_000})
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"{fmt.model}:\n  input: 3\n  output: 15\n  cached: 0.3\n", encoding="utf-8")
    out = tmp_path / "out"
    transcript = fmt.script(fmt.reply(None, fmt.bash(DUMP)), fmt.reply("Looked around."))
    env = {**os.environ, fmt.key_variable: CANARY, case.vendor_variable: VENDOR_CANARY}
    if case.debug_log is not None:
        env[case.debug_log] = "debug"
    with VendorServer(transcript) as server:
        done = subprocess.run(
            [str(FIRSTRUN), "run", str(task.path), "--agent", fmt.name, "--model", fmt.model,
             "--base-url", case.base_url(server.url), "--price-file", str(prices),
             "--max-spend", "5", "--backend", "linux", "--out", str(out),
             "--docs-mirror", f"{DOCS_HOST}={GREETER_DOCS}"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=240)
    assert done.returncode == 1, done.stderr  # the model never wrote the greeting: a docs gap
    assert fmt.api_key(server.seen()[0]) == CANARY
    # The dump ran and is on record, so searching the record searches the sandbox.
    trace = next(out.rglob("trace.jsonl")).read_text(encoding="utf-8")
    assert "PATH=" in trace and "HOME=" in trace
    if case.debug_log is not None:
        assert "DEBUG" in done.stderr  # the SDK's debug log was on
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) >= 2
    for canary in (CANARY, VENDOR_CANARY):
        for path in files:
            assert canary.encode() not in path.read_bytes(), path
        assert canary not in done.stdout and canary not in done.stderr


def test_firstrun_s_own_variable_wins_then_the_vendor_s() -> None:
    assert KEY_VARIABLES["anthropic"] == ("FIRSTRUN_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY")
    both = {"FIRSTRUN_ANTHROPIC_API_KEY": "ours", "ANTHROPIC_API_KEY": "theirs"}
    assert read_key("anthropic", both) == "ours"
    blank = {"FIRSTRUN_ANTHROPIC_API_KEY": " ", "ANTHROPIC_API_KEY": "theirs"}
    assert read_key("anthropic", blank) == "theirs"
    assert read_key("openai", {"OPENAI_API_KEY": "o"}) == "o"
    assert read_key("gemini", {}) is None


def test_a_missing_key_names_the_variables_and_not_a_value() -> None:
    with pytest.raises(UsageError) as caught:
        require_key("anthropic", agent="claude", environ={"OPENAI_API_KEY": "unrelated-secret"})
    message = str(caught.value)
    assert "FIRSTRUN_ANTHROPIC_API_KEY or ANTHROPIC_API_KEY" in message
    assert "unrelated-secret" not in message
