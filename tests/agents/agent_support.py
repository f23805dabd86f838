"""Support for the agent tests: fixture tasks on a mirrored docs site, and a Claude
agent pointed at a scripted server, with its retry sleeps recorded instead of slept."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

from anthropic_wire import MODEL

from firstrun.agents.claude import make_claude
from firstrun.agents.loop import LoopAgent
from firstrun.agents.spend import FilePrice
from firstrun.tasks.load import load_task
from firstrun.tasks.model import Task

FIXTURES = Path(__file__).parent / "fixtures"
DOCS_HOST = "docs.greeter.test"
DOCS = f"http://{DOCS_HOST}/"
TEST_KEY = "sk-ant-test-key"
# USD per million tokens for the scripted model: round numbers, so spend is exact.
PRICE = FilePrice(model=MODEL, input=Decimal(3), output=Decimal(15), cached=Decimal("0.3"))


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
    return make_claude(model=MODEL, base_url=url, price_file={MODEL: price},
                       environ={"FIRSTRUN_ANTHROPIC_API_KEY": key},
                       sleep=record.append, rng=random.Random(7), **loop)
