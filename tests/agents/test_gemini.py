"""What only the Gemini agent does, through the official ``google-genai`` SDK against a
scripted generateContent server on loopback (what every vendor does is
test_vendor_contract.py).

Each transcript is judged by evidence: the requests the server received
(the functionResponse parts the SDK sent back, the model turns as they were
returned), the run's trace, and the check's verdict on the workspace.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from firstrun.agents import make_agent
from firstrun.agents.gemini_agent import DEFAULT_MODEL
from firstrun.agents.loop import LoopAgent
from firstrun.errors import UsageError
from firstrun.run.runner import RunConfig
from support import gemini_wire as wire
from support.agents import gemini_agent as agent
from support.agents import greeter_task, run_agent
from support.vendor import VendorServer

pytestmark = pytest.mark.fast


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
