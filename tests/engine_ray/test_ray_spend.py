"""``--max-spend`` holds across a Ray cluster's nodes: one ledger, the driver's.

The agents run on the nodes against a scripted Anthropic server on loopback,
driven by the official SDK; each node reads the API key from its own
environment, which is the only way a key reaches it.
"""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from ray_support import firstrun, loopback_cluster

from support import anthropic_wire as wire
from support.agents import DOCS_HOST, GREETER_DOCS, greeter_task
from support.vendor import VendorServer

NODE_KEY = "sk-ant-node-only-7d1e"
# The driver's own, which it checks up front and never sends.
DRIVER_KEY = "sk-ant-driver-never-sent-52b0"


@pytest.mark.skipif(sys.platform != "linux", reason="the nodes' sandboxes are linux's")
def test_the_spend_cap_holds_across_nodes(tmp_path: Path) -> None:
    # Each run reserves 1 USD (max_tokens 1000 at 1000 USD per million) and
    # spends 0.7; under 2.5 exactly three runs fit, whichever nodes take them,
    # since a fourth needs settled + held <= 1.5 and three started hold 2.1.
    tasks = [greeter_task(tmp_path, name=f"greeter-{n}", budgets={"max_tokens": 1000}).path
             for n in range(3)]
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({wire.MODEL: {"input": 1000, "output": 1000}}))
    transcript = wire.script(wire.message(wire.text("Nothing to do."), tokens=(600, 100)))
    with loopback_cluster(2, env={"ANTHROPIC_API_KEY": NODE_KEY}) as made, \
            VendorServer(transcript) as server:
        done = firstrun("run", *map(str, tasks), "--repeat", "2", "--agent", "claude",
                        "--model", wire.MODEL, "--base-url", server.url, "--price-file",
                        str(prices), "--max-spend", "2.5", "--workers", "3", "--backend", "linux",
                        "--docs-mirror", f"{DOCS_HOST}={GREETER_DOCS}", "--engine", "ray",
                        "--ray-address", made.address, "--out", str(tmp_path / "out"),
                        env={"ANTHROPIC_API_KEY": DRIVER_KEY})
        seen = server.seen()
    assert "--max-spend 2.5 USD reached (2.1 USD settled)" in done.stderr, done.stderr
    runs = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    assert len(runs) == 3 and len(seen) == 3
    assert [r["extra"]["usage"]["spend"] for r in runs] == ["0.7"] * 3
    assert sum(Decimal(r["extra"]["usage"]["spend"]) for r in runs) <= Decimal("2.5")
    assert len({r["node"] for r in runs}) == 2
    # The key each node sent is the one in its own environment, never the driver's.
    assert {wire.api_key(request) for request in seen} == {NODE_KEY}
    assert DRIVER_KEY not in json.dumps(runs)
