"""Spend: prices (a price file, genai-prices, unknown), the per-run spend limit, and the
governor holding its cap under racing threads (``--max-spend`` across a parallel sweep is
every vendor's, in test_vendor_contract.py)."""

from __future__ import annotations

import threading
from decimal import Decimal
from pathlib import Path

import pytest

from firstrun.agents.spend import (
    FilePrice,
    SpendGovernor,
    load_price_file,
    price_for,
)
from firstrun.agents.vendor import TokenUsage
from firstrun.errors import UsageError
from firstrun.results.model import Classification
from firstrun.run.runner import RunConfig, run_task
from firstrun.tasks.model import Budgets
from support import anthropic_wire as wire
from support.agents import claude, greeter_task
from support.vendor import VendorServer

pytestmark = pytest.mark.fast

GREET = "printf 'hello, reader\\n' > greeting.txt"


def test_a_price_file_prices_each_kind_of_token() -> None:
    price = FilePrice(model="m", input=Decimal(3), output=Decimal(15), cached=Decimal("0.3"))
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=100_000, cached_tokens=400_000)
    assert price.cost(usage) == Decimal("1.8") + Decimal("0.12") + Decimal("1.5")
    assert price.highest_per_token() == Decimal(15) / 1_000_000


def test_usage_a_price_file_has_no_price_for_is_unknown_not_zero() -> None:
    price = FilePrice(model="m", input=Decimal(3), output=Decimal(15))
    assert price.cost(TokenUsage(input_tokens=10, output_tokens=1, cached_tokens=5)) is None
    assert price.cost(TokenUsage(input_tokens=10, output_tokens=1, cache_write_tokens=5)) is None


def test_prices_come_from_the_file_then_genai_prices_else_unknown() -> None:
    mine = FilePrice(model="claude-sonnet-4-5", input=Decimal(1), output=Decimal(2))
    assert price_for("anthropic", "claude-sonnet-4-5", {"claude-sonnet-4-5": mine}) is mine
    table = price_for("anthropic", "claude-sonnet-4-5")
    assert table is not None and table.source.startswith("genai-prices ")
    cost = table.cost(TokenUsage(input_tokens=1_000_000, output_tokens=0))
    assert cost is not None and cost > 0
    assert price_for("anthropic", "no-such-model-anywhere") is None


def test_price_files_load_from_yaml_and_json_and_refuse_mistakes(tmp_path: Path) -> None:
    yaml_file = tmp_path / "p.yaml"
    yaml_file.write_text("m:\n  input: 3\n  output: '15'\n  cached: 0.3\n", encoding="utf-8")
    (loaded,) = load_price_file(yaml_file).values()
    assert (loaded.input, loaded.output, loaded.cached) == (3, 15, Decimal("0.3"))
    json_file = tmp_path / "p.json"
    json_file.write_text('{"m": {"input": 1, "output": 2}}', encoding="utf-8")
    assert load_price_file(json_file)["m"].cached is None
    for text, problem in [("m:\n  input: 3\n", "'output' is required"),
                          ("m:\n  input: -1\n  output: 2\n", "non-negative"),
                          ("m:\n  input: 1\n  output: 2\n  outptu: 3\n", "unknown key 'outptu'"),
                          ("m: [1, 2\n", "not valid YAML"),
                          ("[]\n", "a mapping of model id")]:
        yaml_file.write_text(text, encoding="utf-8")
        with pytest.raises(UsageError, match=problem) as caught:
            load_price_file(yaml_file)
        assert str(yaml_file) in str(caught.value)


def test_the_governor_holds_the_cap_under_racing_threads() -> None:
    # Every run reserves 1 and spends 0.5. A run starts only while settled +
    # held + 1 <= 5, so exactly nine start, whatever the interleaving.
    per_token = FilePrice(model="m", input=Decimal(1_000_000), output=Decimal(1_000_000))
    governor = SpendGovernor(cap=Decimal(5), pricing=per_token)
    budgets = Budgets(max_tokens=1)
    start = threading.Barrier(6)
    lock = threading.Lock()
    held: list[Decimal] = []
    worst: list[Decimal] = []
    runs: list[int] = []

    def worker() -> None:
        start.wait()
        while (reservation := governor.reserve(budgets)) is not None:
            with lock:
                held.append(reservation.amount)
                worst.append(governor.spent + sum(held))
                runs.append(reservation.number)
            with lock:
                held.remove(reservation.amount)
            governor.settle(reservation, reservation.amount / 2)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(runs) == 9 and governor.spent == Decimal("4.5") and governor.reached
    assert max(worst) <= 5


def test_unknown_spend_settles_at_the_whole_reservation() -> None:
    price = FilePrice(model="m", input=Decimal(1_000_000), output=Decimal(1_000_000))
    governor = SpendGovernor(cap=Decimal(3), pricing=price)
    reservation = governor.reserve(Budgets(max_tokens=2))
    assert reservation is not None and reservation.amount == 2
    governor.settle(reservation, None)
    assert governor.spent == 2
    assert governor.reserve(Budgets(max_tokens=2)) is None and governor.reached


def test_a_run_stops_at_its_own_spend_limit(config: RunConfig, tmp_path: Path) -> None:
    # 3 USD per million input tokens: 400k input tokens cost 1.2 USD, past a 1 USD limit.
    transcript = wire.script(wire.message(wire.bash(GREET), tokens=(400_000, 10)))
    with VendorServer(transcript) as server:
        record = run_task(greeter_task(tmp_path), attempt=1, agent=claude(server.url),
                          config=config, max_spend=Decimal(1))
    assert (record.classification, record.reason) == (Classification.BUDGET_EXHAUSTED,
                                                      "budget_exhausted")
    assert record.detail.startswith("max_spend: 1.20015 USD spent of the run's 1")
    assert record.extra["usage"]["max_spend"] == "1" and record.commands == 0


def test_a_turn_without_a_price_ends_a_run_that_has_a_spend_limit(config: RunConfig,
                                                                  tmp_path: Path) -> None:
    # The price has no rate for cached reads, and this turn read from the cache.
    transcript = wire.script(wire.message(wire.bash(GREET), tokens=(100, 10), cached=50))
    with VendorServer(transcript) as server:
        agent = claude(server.url, price=FilePrice(model=wire.MODEL, input=Decimal(3),
                                                   output=Decimal(15)))
        record = run_task(greeter_task(tmp_path), attempt=1, agent=agent, config=config,
                          max_spend=Decimal(1))
    assert record.classification is Classification.BUDGET_EXHAUSTED
    assert record.detail == "max_spend: turn 1 has no price, so the run's 1 USD cannot be held"
    assert record.extra["usage"]["spend"] is None and record.commands == 0
