"""Fixture tasks on the greeter docs site, and one agent per vendor pointed at a scripted
server, with retry sleeps recorded instead of slept and round prices so spend is exact."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

from firstrun.agents.claude import make_claude
from firstrun.agents.gemini_agent import make_gemini
from firstrun.agents.loop import LoopAgent
from firstrun.agents.openai_agent import make_openai
from firstrun.agents.spend import FilePrice
from firstrun.results.model import RunRecord
from firstrun.run.events import CommandRan, Event, Source
from firstrun.run.runner import RunConfig, run_task
from firstrun.tasks.load import load_task
from firstrun.tasks.model import Task
from support import anthropic_wire, gemini_wire, openai_wire

# The greeter quickstart, served from a directory mirror under DOCS_HOST.
GREETER_DOCS = Path(__file__).parent / "greeter_docs"
DOCS_HOST = "docs.greeter.test"
DOCS = f"http://{DOCS_HOST}/"
TEST_KEY = "sk-ant-test-key"
OPENAI_KEY = "sk-openai-test-key"
GEMINI_KEY = "gemini-test-key"
# USD per million tokens for each scripted model: round numbers, so spend is exact.
PRICE = FilePrice(model=anthropic_wire.MODEL, input=Decimal(3), output=Decimal(15),
                  cached=Decimal("0.3"))
OPENAI_PRICE = FilePrice(model=openai_wire.MODEL, input=Decimal(2), output=Decimal(8),
                         cached=Decimal("0.5"))
GEMINI_PRICE = FilePrice(model=gemini_wire.MODEL, input=Decimal(1), output=Decimal(4),
                         cached=Decimal("0.25"))


def greeter_task(directory: Path, *, name: str = "greeter", goal: str | None = None,
                 budgets: dict[str, int] | None = None) -> Task:
    """Create greeting.txt holding 'hello, reader'; the check looks for exactly that."""
    lines = [f"name: {name}",
             f"goal: {goal or 'Create greeting.txt holding the greeting the quickstart shows.'}",
             "docs:", f"  entrypoint: {DOCS}",
             "success:", "  script: |",
             "    grep -q 'hello, reader' greeting.txt || qs_fail \"greeting.txt lacks the greeting\""]
    if budgets:
        lines += ["budgets:", *(f"  {k}: {v}" for k, v in budgets.items())]
    path = directory / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_task(path)


def claude(url: str, *, sleeps: list[float] | None = None, key: str = TEST_KEY,
           price: FilePrice = PRICE, **loop: Any) -> LoopAgent:
    """A Claude agent on the scripted server; retry waits go to ``sleeps``, not to sleep."""
    record = sleeps if sleeps is not None else []
    return make_claude(model=anthropic_wire.MODEL, base_url=url,
                       price_file={anthropic_wire.MODEL: price},
                       environ={"FIRSTRUN_ANTHROPIC_API_KEY": key},
                       sleep=record.append, rng=random.Random(7), **loop)


def openai_agent(url: str, *, sleeps: list[float] | None = None,
                 price: FilePrice = OPENAI_PRICE, **loop: Any) -> LoopAgent:
    """An OpenAI agent on the scripted Chat Completions server at ``url``."""
    record = sleeps if sleeps is not None else []
    return make_openai(model=openai_wire.MODEL, base_url=f"{url}/v1",
                       price_file={openai_wire.MODEL: price},
                       environ={"FIRSTRUN_OPENAI_API_KEY": OPENAI_KEY}, sleep=record.append,
                       rng=random.Random(7), **loop)


def gemini_agent(url: str, *, sleeps: list[float] | None = None,
                 price: FilePrice = GEMINI_PRICE, **loop: Any) -> LoopAgent:
    """A Gemini agent on the scripted generateContent server at ``url``."""
    record = sleeps if sleeps is not None else []
    return make_gemini(model=gemini_wire.MODEL, base_url=url,
                       price_file={gemini_wire.MODEL: price},
                       environ={"FIRSTRUN_GEMINI_API_KEY": GEMINI_KEY}, sleep=record.append,
                       rng=random.Random(7), **loop)


def run_agent(task: Task, agent: LoopAgent, config: RunConfig) -> tuple[RunRecord, list[Event]]:
    """One run of ``task`` by ``agent``, and every event it emitted."""
    events: list[Event] = []
    record = run_task(task, attempt=1, agent=agent, config=config, on_event=events.append)
    return record, events


def agent_commands(events: list[Event]) -> list[CommandRan]:
    return [e for e in events if isinstance(e, CommandRan) and e.source is Source.AGENT]
