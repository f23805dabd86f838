"""A key never enters the sandbox, the trace, the results or the logs: proved with canaries.

The real ``firstrun run`` runs with canary keys in its environment (firstrun's
own variable and the vendor's standard one) and the SDK's debug logging on.
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
from pathlib import Path

import pytest

from firstrun.agents.keys import KEY_VARIABLES, read_key, require_key
from firstrun.errors import UsageError
from support import anthropic_wire as wire
from support.agents import DOCS_HOST, GREETER_DOCS, greeter_task
from support.vendor import VendorServer

FIRSTRUN = Path(sys.executable).parent / "firstrun"
CANARY = "sk-ant-canary-4f1d9e2b7c"
VENDOR_CANARY = "sk-ant-vendor-canary-93ab51"
DUMP = ("env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < \"$f\"; "
        "echo; done; ps -eo pid,args 2>/dev/null; cat /proc/self/environ | tr '\\0' '\\n'")


def test_a_canary_key_is_nowhere_but_the_request_to_the_vendor(tmp_path: Path) -> None:
    task = greeter_task(tmp_path, budgets={"max_tokens": 100_000})
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"{wire.MODEL}:\n  input: 3\n  output: 15\n  cached: 0.3\n", encoding="utf-8")
    out = tmp_path / "out"
    transcript = wire.script(
        wire.message(wire.bash(DUMP)),
        wire.message(wire.text("Looked around.")),
    )
    env = {**os.environ, "FIRSTRUN_ANTHROPIC_API_KEY": CANARY,
           "ANTHROPIC_API_KEY": VENDOR_CANARY, "ANTHROPIC_LOG": "debug"}
    with VendorServer(transcript) as server:
        done = subprocess.run(
            [str(FIRSTRUN), "run", str(task.path), "--agent", "claude", "--model", wire.MODEL,
             "--base-url", server.url, "--price-file", str(prices), "--max-spend", "5",
             "--backend", "linux", "--out", str(out),
             "--docs-mirror", f"{DOCS_HOST}={GREETER_DOCS}"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=240)
    assert done.returncode == 1, done.stderr  # the model never wrote the greeting: a docs gap
    assert wire.api_key(server.seen()[0]) == CANARY
    # The dump ran and is on record, so searching the record searches the sandbox.
    trace = next(out.rglob("trace.jsonl")).read_text(encoding="utf-8")
    assert "PATH=" in trace and "HOME=" in trace
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
