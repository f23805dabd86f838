"""The sweep's backend entry travels with its runs: looked up once per sweep, never by a run,
and carried whole to a Ray node, whose run looks nothing up by name either."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
import ray.cloudpickle
from run_support import fixture_task

from firstrun.agents import ReplayAgent
from firstrun.results.model import Classification
from firstrun.results.store import ResultsStore
from firstrun.run import sandbox as run_sandbox
from firstrun.run.runner import RunConfig, run_task
from firstrun.run.suite import run_suite
from firstrun.sandbox import select
from firstrun.sandbox.select import REGISTRY, entry

pytestmark = pytest.mark.fast


@pytest.fixture
def fake(config: RunConfig) -> RunConfig:
    return replace(config, backend="fake", allow_unenforced=True)


def _runs_look_nothing_up(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a run looked its backend up again: {args}")

    monkeypatch.setattr(run_sandbox, "entry", refuse)
    monkeypatch.setattr(run_sandbox, "resolve_backend", refuse)


def test_a_sweep_looks_its_entry_up_before_its_runs_and_they_never_do(
        fake: RunConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    looked: list[str] = []
    by_name = select.entry

    def counted(name: str) -> select.Entry:
        looked.append(name)
        return by_name(name)

    monkeypatch.setattr(select, "entry", counted)
    _runs_look_nothing_up(monkeypatch)
    before_runs: list[int] = []

    def on_event(name: str, attempt: int, event: object) -> None:
        if not before_runs:
            before_runs.append(len(looked))

    outcome = run_suite([fixture_task("pass")], agent_factory=ReplayAgent, config=fake,
                        store=ResultsStore(fake.out_dir, meta={}), repeat=3, on_event=on_event)
    assert [r.classification for r in outcome.records] == [Classification.PASSED] * 3
    # Resolved before the first run began; three runs later, nothing more.
    assert before_runs == [len(looked)] and set(looked) == {"fake"}


def test_every_entry_pickles_whole_so_a_node_gets_the_entry_not_a_name() -> None:
    for chosen in REGISTRY:
        assert pickle.loads(pickle.dumps(chosen)) == chosen


def test_a_run_on_a_node_runs_the_entry_it_was_sent(
        fake: RunConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    # What the Ray engine does with a run's config: Ray's pickler on the driver,
    # the standard one where the node's run process reads its job (run.node_run).
    sent = replace(fake, chosen=entry("fake"))
    job = pickle.loads(ray.cloudpickle.dumps({"config": sent}))
    assert job["config"].chosen == entry("fake")
    _runs_look_nothing_up(monkeypatch)
    record = run_task(fixture_task("pass"), attempt=1, agent=ReplayAgent(), config=job["config"])
    assert (record.classification, record.backend) == (Classification.PASSED, "fake")


def test_an_entry_is_only_carried_under_its_own_name(fake: RunConfig) -> None:
    with pytest.raises(ValueError, match="resolved to another's entry"):
        replace(fake, chosen=entry("linux"))
