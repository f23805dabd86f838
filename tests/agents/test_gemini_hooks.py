"""The hook relay Gemini CLI runs (real node) and the harness's hook endpoint: what reaches
the harness, what the CLI is told, and that every failure is a refusal (exit 2)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from firstrun.agents.cli.gemini_hooks import RELAY, HookServer

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="Gemini CLI's relay needs node")


def relay(hook: dict[str, Any], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert NODE is not None
    return subprocess.run([NODE, "-e", RELAY], input=json.dumps(hook), env=env, text=True,
                          capture_output=True, timeout=60, check=False)


def test_the_relay_hands_the_hook_and_the_transcripts_tokens_to_the_harness(
        tmp_path: Path) -> None:
    transcript = tmp_path / "session.jsonl"
    turn = {"id": "a", "type": "gemini", "model": "m", "tokens": {"input": 100, "output": 20}}
    transcript.write_text("\n".join(json.dumps(line) for line in (
        {"sessionId": "s", "kind": "main"},
        {"id": "u", "type": "user", "content": [{"text": "hi"}]},
        turn,
        {**turn, "tokens": {"input": 100, "output": 25}, "toolCalls": []},  # rewritten whole
        {"$set": {"messages": [{"id": "b", "type": "gemini", "tokens": {"input": 7}}]}},
    )) + "\n")
    seen: list[dict[str, Any]] = []

    def answer(hook: dict[str, Any]) -> dict[str, Any]:
        seen.append(hook)
        return {"decision": "deny", "reason": "no"}

    server = HookServer()
    server.bind(answer)
    with server:
        # The harness's own port stands in for the proxy: it takes the absolute-form target.
        done = relay({"hook_event_name": "BeforeTool", "tool_name": "run_shell_command",
                      "tool_input": {"command": "ls"}, "transcript_path": str(transcript),
                      "llm_request": {"big": True}},
                     {"http_proxy": f"http://127.0.0.1:{server.port}",
                      "FIRSTRUN_HOOK_URL": server.url})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"decision": "deny", "reason": "no"}
    (hook,) = seen
    assert hook["tool_input"] == {"command": "ls"} and "llm_request" not in hook
    assert hook["firstrun_turns"] == [{"model": "m", "input": 100, "output": 25},
                                      {"input": 7}]


@pytest.mark.parametrize("env", [
    pytest.param({"FIRSTRUN_HOOK_URL": "http://harness.firstrun.internal:1/hook"}, id="no-proxy"),
    pytest.param({"http_proxy": "http://127.0.0.1:9",
                  "FIRSTRUN_HOOK_URL": "http://harness.firstrun.internal:1/hook"},
                 id="unreachable"),
])
def test_a_relay_that_cannot_ask_the_harness_refuses(env: dict[str, str]) -> None:
    done = relay({"hook_event_name": "BeforeTool", "transcript_path": "/nonexistent"}, env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("firstrun:")


def test_a_relay_given_no_hook_refuses() -> None:
    assert NODE is not None
    done = subprocess.run([NODE, "-e", RELAY], input="not json", text=True,
                          capture_output=True, timeout=60, check=False, env={})
    assert done.returncode == 2


def test_the_harness_answers_a_bad_request_with_400() -> None:
    import urllib.error
    import urllib.request

    server = HookServer()
    server.bind(lambda hook: {})
    with server:
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}{server.path}", data=b"[1]",
                                         method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
