"""The conformance row of each agent CLI: it runs on every backend ``firstrun doctor`` reports
available here, and every other enforcing backend refuses it, saying why, before a session starts.

A CLI joins with one entry in ``ROWS`` (its support module's ``CliRow``). The
run is the real CLI from the npm registry against its scripted API: it reads the
greeter page through the harness's ``read_docs``, runs the documented command,
and the check passes; the page read, the command and the CLI's version are in
the trace whichever proxy (the harness's, docker's sidecar) routed it.
"""

from __future__ import annotations

from pathlib import Path

import claude_code_support
import codex_support
import gemini_cli_support
import pytest

from firstrun.agents.cli.install import CliInstall, ensure
from firstrun.cli.doctor import available_backends
from firstrun.docs import Mirror
from firstrun.results.model import Classification
from firstrun.run.events import CommandRan, DocsRead, Event, Failure, Source
from firstrun.run.runner import RunConfig, run_task
from firstrun.sandbox.select import REGISTRY
from support.agent_clis import CliRow, serving
from support.agents import DOCS, greeter_task
from support.vendor import VendorServer

ROWS: tuple[CliRow, ...] = (
    claude_code_support.ROW,
    codex_support.ROW,
    gemini_cli_support.ROW,
)
# Every backend that enforces; local and fake enforce nothing and are never a row's.
ENFORCING = tuple(e.name for e in REGISTRY if not e.unenforced)
AVAILABLE = available_backends()
GREET = "printf 'hello, reader\\n' > greeting.txt"


@pytest.fixture(scope="module")
def installs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CliInstall]:
    cache = tmp_path_factory.mktemp("agent-cache")
    return {row.name: ensure(row.pin, cache) for row in ROWS}


@pytest.mark.parametrize("backend", ENFORCING)
@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_an_agent_cli_runs_on_each_available_backend_and_is_refused_on_the_others(
        row: CliRow, backend: str, installs: dict[str, CliInstall], tmp_path: Path,
        greeter_mirror: dict[str, Mirror]) -> None:
    config = RunConfig(out_dir=tmp_path / "out", backend=backend, docs_mirrors=greeter_mirror)
    events: list[Event] = []
    install = installs[row.name]
    if backend in AVAILABLE and backend in row.refused_on:
        with VendorServer(row.greeter(DOCS, GREET), host=serving(backend)) as server:
            record = run_task(greeter_task(tmp_path), attempt=1,
                              agent=row.agent(install, server.url), config=config,
                              on_event=events.append)
        assert (record.classification, record.reason) == (Classification.INFRA_ERROR,
                                                          "sandbox_refused")
        (failure,) = [e for e in events if isinstance(e, Failure)]
        assert failure.who == "agents" and f"--agent {row.name}" in failure.message, failure
        assert not [e for e in events if e.kind == "sandbox_started"]
        return
    if backend not in AVAILABLE:
        # Nothing listens there: the run must be refused before it could call.
        agent = row.agent(install, "http://127.0.0.1:9")
        record = run_task(greeter_task(tmp_path), attempt=1, agent=agent, config=config,
                          on_event=events.append)
        assert (record.classification, record.reason) == (Classification.INFRA_ERROR,
                                                          "sandbox_refused")
        (failure,) = [e for e in events if isinstance(e, Failure)]
        assert failure.who == backend and failure.message, failure
        assert not [e for e in events if e.kind == "sandbox_started"]
        return
    with VendorServer(row.greeter(DOCS, GREET), host=serving(backend)) as server:
        record = run_task(greeter_task(tmp_path), attempt=1,
                          agent=row.agent(install, server.url), config=config,
                          on_event=events.append)
    assert (record.classification, record.reason) == (Classification.PASSED, "passed"), \
        [e for e in events if e.kind in ("failure", "agent_finished")]
    assert record.backend == backend and record.agent == row.name
    assert [r.page["url_requested"] for r in events if isinstance(r, DocsRead)] == [DOCS]
    assert [(c.command, c.exit_code) for c in events
            if isinstance(c, CommandRan) and c.source is Source.AGENT] == [(GREET, 0)]
    (finished,) = [e for e in events if e.kind == "agent_finished"]
    assert finished.usage["agent_cli"]["version"] == row.pin.version
