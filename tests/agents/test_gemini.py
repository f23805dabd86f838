"""What only the Gemini agent does, through the official ``google-genai`` SDK against a
scripted generateContent server on loopback (what every vendor does is
test_vendor_contract.py).

Each transcript is judged by evidence: the requests the server received
(the functionResponse parts the SDK sent back, the model turns as they were
returned), the run's trace, and the check's verdict on the workspace.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from firstrun.agents import make_agent
from firstrun.agents.gemini_agent import DEFAULT_MODEL
from firstrun.agents.loop import LoopAgent
from firstrun.errors import UsageError
from firstrun.run.runner import RunConfig
from support import gemini_wire as wire
from support.agents import DOCS_HOST, GREETER_DOCS, greeter_task, run_agent
from support.agents import gemini_agent as agent
from support.vendor import VendorServer

GREET = "printf 'hello, reader\\n' > greeting.txt"
FIRSTRUN = Path(sys.executable).parent / "firstrun"


def test_a_cut_off_reply_is_asked_to_continue(config: RunConfig, tmp_path: Path) -> None:
    transcript = wire.script(
        wire.response(wire.text("I will now"), finish_reason="MAX_TOKENS"),
        wire.response(wire.text("Done.")),
    )
    with VendorServer(transcript) as server:
        run_agent(greeter_task(tmp_path), agent(server.url), config)
    last = server.seen()[1].body["contents"][-1]
    assert last["role"] == "user" and "cut off" in last["parts"][0]["text"]


def test_calls_the_loop_cannot_run_are_answered_as_errors(config: RunConfig,
                                                         tmp_path: Path) -> None:
    transcript = wire.script(
        wire.response(wire.call("web_search", query="greeter"), wire.bash("exit 3")),
        wire.response(wire.text("Stopping.")),
    )
    with VendorServer(transcript) as server:
        run_agent(greeter_task(tmp_path), agent(server.url), config)
    unknown, failed = wire.function_responses(server.seen()[1])
    assert unknown["name"] == "web_search" and "unknown tool" in unknown["response"]["error"]
    # A command that exited non-zero is reported under "error", with its exit code.
    assert failed["response"]["error"].startswith("exit code: 3\n")


def test_a_canary_key_is_nowhere_but_the_request_to_the_vendor(tmp_path: Path) -> None:
    canary, vendor_canary = "gemini-canary-8d2f6b1e90", "gemini-vendor-canary-71a0c4"
    task = greeter_task(tmp_path)
    out = tmp_path / "out"
    transcript = wire.script(wire.response(wire.bash("env; cat /proc/self/environ")),
                             wire.response(wire.text("Looked around.")))
    env = {**os.environ, "FIRSTRUN_GEMINI_API_KEY": canary, "GEMINI_API_KEY": vendor_canary}
    with VendorServer(transcript) as server:
        done = subprocess.run(
            [str(FIRSTRUN), "run", str(task.path), "--agent", "gemini", "--model", wire.MODEL,
             "--base-url", server.url, "--backend", "linux", "--out", str(out),
             "--docs-mirror", f"{DOCS_HOST}={GREETER_DOCS}"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=240)
    assert done.returncode == 1, done.stderr
    assert wire.api_key(server.seen()[0]) == canary
    assert "PATH=" in next(out.rglob("trace.jsonl")).read_text(encoding="utf-8")
    for secret in (canary, vendor_canary):
        for path in (p for p in out.rglob("*") if p.is_file()):
            assert secret.encode() not in path.read_bytes(), path
        assert secret not in done.stdout and secret not in done.stderr


def test_make_agent_gemini_refuses_without_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIRSTRUN_GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    with pytest.raises(UsageError, match="no API key: set FIRSTRUN_GEMINI_API_KEY or "
                                         "GEMINI_API_KEY"):
        make_agent("gemini")
    monkeypatch.setenv("GEMINI_API_KEY", "k")
    chosen = make_agent("gemini")
    assert (chosen.name, chosen.model) == ("gemini", DEFAULT_MODEL)
    # The default model is priced by the maintained table.
    assert isinstance(chosen, LoopAgent) and chosen.pricing is not None

