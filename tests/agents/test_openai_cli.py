"""``firstrun run --agent openai`` as a user runs it: a local OpenAI-compatible server
with no key and no usage (the key canaries are test_agents_keys.py's).

The scripted server answers like a local model server (Ollama, llama.cpp's
server): no ``usage``, no ``refusal`` field, a model id the price table does
not know. The saved results must say tokens and spend are unknown, not zero.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from firstrun.agents.openai_agent import NO_KEY
from firstrun.run.events import read_trace
from support import openai_wire as wire
from support.agents import DOCS_HOST, GREETER_DOCS, greeter_task
from support.vendor import VendorServer

FIRSTRUN = Path(sys.executable).parent / "firstrun"
GREET = "printf 'hello, reader\\n' > greeting.txt"


def firstrun_run(task: Path, out: Path, url: str, env: dict[str, str],
                 *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FIRSTRUN), "run", str(task), "--agent", "openai", "--base-url", f"{url}/v1",
         "--backend", "linux", "--out", str(out),
         "--docs-mirror", f"{DOCS_HOST}={GREETER_DOCS}", *extra],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=240)


def test_a_local_server_without_key_or_usage_runs_and_records_spend_unknown(
        tmp_path: Path) -> None:
    task = greeter_task(tmp_path)
    out = tmp_path / "out"
    # Some local servers end a turn that calls tools with finish_reason "stop":
    # the calls run all the same, and the turn is recorded as tool use.
    transcript = wire.script(wire.completion(None, wire.bash(GREET), local=True,
                                             finish_reason="stop"),
                             wire.completion("Done.", local=True))
    env = {k: v for k, v in os.environ.items()
           if k not in ("FIRSTRUN_OPENAI_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL")}
    with VendorServer(transcript) as server:
        done = firstrun_run(task.path, out, server.url, env, "--model", "llama3.2")
    assert done.returncode == 0, done.stderr
    first = server.seen()[0]
    assert first.path == "/v1/chat/completions" and first.body["model"] == "llama3.2"
    # No key was set, so the placeholder went, and the server ignored it.
    assert wire.api_key(first) == NO_KEY
    (run,) = json.loads((out / "results.json").read_text(encoding="utf-8"))["runs"]
    assert run["classification"] == "passed" and run["model"] == "llama3.2"
    usage = run["extra"]["usage"]
    assert usage["spend"] is None and usage["price_source"] is None
    assert usage["input_tokens"] is None and usage["output_tokens"] is None
    assert [t["spend"] for t in usage["per_turn"]] == [None, None]
    turns = [e for e in read_trace(next(out.rglob("trace.jsonl"))) if e["kind"] == "model_turn"]
    assert [(t["stop"], t["vendor_stop"]) for t in turns] == [("tool_use", "stop"),
                                                              ("end", "stop")]
