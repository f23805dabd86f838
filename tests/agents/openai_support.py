"""An OpenAI agent pointed at a scripted Chat Completions server, with its retry
sleeps recorded instead of slept, and round prices so spend is exact."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

from openai_wire import MODEL

from firstrun.agents.loop import LoopAgent
from firstrun.agents.openai_agent import make_openai
from firstrun.agents.spend import FilePrice

KEY = "sk-openai-test-key"
# USD per million tokens.
PRICE = FilePrice(model=MODEL, input=Decimal(2), output=Decimal(8), cached=Decimal("0.5"))


def agent(url: str, *, sleeps: list[float] | None = None, price: FilePrice = PRICE,
          **loop: Any) -> LoopAgent:
    """An OpenAI agent on the scripted server at ``url``; retry waits go to ``sleeps``."""
    record = sleeps if sleeps is not None else []
    return make_openai(model=MODEL, base_url=f"{url}/v1", price_file={MODEL: price},
                       environ={"FIRSTRUN_OPENAI_API_KEY": KEY}, sleep=record.append,
                       rng=random.Random(7), **loop)
