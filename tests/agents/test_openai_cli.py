"""``firstrun run --agent openai`` as a user runs it: a local OpenAI-compatible server
with no key and no usage, and canary keys that appear nowhere but the request.

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
CANARY = "sk-openai-canary-5e0c1a77d2"
VENDOR_CANARY = "sk-openai-vendor-canary-c4f9e3"
DUMP = ("env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < \"$f\"; "
        "echo; done; cat /proc/self/environ | tr '\\0' '\\n'")


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


def test_a_canary_key_is_nowhere_but_the_request_to_the_vendor(tmp_path: Path) -> None:
    task = greeter_task(tmp_path)
    out = tmp_path / "out"
    transcript = wire.script(wire.completion(None, wire.bash(DUMP)),
                             wire.completion("Looked around."))
    env = {**os.environ, "FIRSTRUN_OPENAI_API_KEY": CANARY, "OPENAI_API_KEY": VENDOR_CANARY,
           "OPENAI_LOG": "debug"}
    with VendorServer(transcript) as server:
        done = firstrun_run(task.path, out, server.url, env, "--model", wire.MODEL)
    assert done.returncode == 1, done.stderr  # no greeting written: a docs gap
    assert wire.api_key(server.seen()[0]) == CANARY
    trace = next(out.rglob("trace.jsonl")).read_text(encoding="utf-8")
    assert "PATH=" in trace and "HOME=" in trace
    assert "DEBUG" in done.stderr  # the SDK's debug log was on
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) >= 2
    for canary in (CANARY, VENDOR_CANARY):
        for path in files:
            assert canary.encode() not in path.read_bytes(), path
        assert canary not in done.stdout and canary not in done.stderr
