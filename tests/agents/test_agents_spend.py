"""Spend: prices (a price file, genai-prices, unknown), the per-run spend limit, and
``--max-spend`` holding across parallel runs, with threads, on the fake backend."""

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
from firstrun.results.store import ResultsStore
from firstrun.run.runner import RunConfig, run_task
from firstrun.run.suite import run_suite
from firstrun.tasks.model import Budgets
from support import anthropic_wire as wire
from support.agents import claude, greeter_task
from support.vendor import Router, VendorServer

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


def _priced_claude(url: str):
    # A thousandth of a USD per token, either way: spend is tokens / 1000.
    return claude(url, price=FilePrice(model=wire.MODEL, input=Decimal(1000), output=Decimal(1000)))


def test_max_spend_stops_a_parallel_sweep_without_passing_the_cap(config: RunConfig,
                                                                  tmp_path: Path) -> None:
    # Each run reserves 1 USD (max_tokens 1000) and spends 0.7; under a 2.5 cap
    # exactly three runs fit (a fourth needs settled + held <= 1.5, and three
    # started runs hold at least 2.1), whatever order the three workers take.
    tasks = [greeter_task(tmp_path, name=f"greeter-{n}", budgets={"max_tokens": 1000})
             for n in range(3)]
    transcript = wire.script(wire.message(wire.text("Nothing to do."), tokens=(600, 100)))
    with VendorServer(transcript) as server:
        governor = SpendGovernor(cap=Decimal("2.5"), pricing=_priced_claude(server.url).pricing)
        outcome = run_suite(tasks, agent_factory=lambda: _priced_claude(server.url),
                            config=config, store=ResultsStore(config.out_dir, meta={}),
                            repeat=2, workers=3, spend=governor)
    assert outcome.spend_reached and not outcome.interrupted
    assert len(outcome.records) == 3 and len(server.seen()) == 3
    assert all(r.extra["usage"]["spend"] == "0.7" for r in outcome.records)
    assert governor.spent == Decimal("2.1")


def test_parallel_runs_each_follow_their_own_transcript(config: RunConfig,
                                                         tmp_path: Path) -> None:
    goals = {n: f"Create greeting.txt holding the greeting (variant {n})." for n in range(3)}
    tasks = [greeter_task(tmp_path, name=f"greeter-{n}", goal=goals[n]) for n in range(3)]
    routes = {
        goals[n]: wire.script(
            wire.message(wire.bash(f"{GREET}; echo variant {n}")),
            wire.message(wire.text(f"Done with variant {n}.")))
        for n in range(3)
    }
    with VendorServer(Router(wire.first_user_text, routes)) as server:
        outcome = run_suite(tasks, agent_factory=lambda: claude(server.url), config=config,
                            store=ResultsStore(config.out_dir, meta={}), workers=3)
    by_task = {r.task: r for r in outcome.records}
    assert sorted(by_task) == ["greeter-0", "greeter-1", "greeter-2"]
    for n in range(3):
        record = by_task[f"greeter-{n}"]
        assert record.classification is Classification.PASSED
        assert record.extra["claim"] == f"Done with variant {n}."
    assert len(server.seen()) == 6


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
