"""Many runs: bounded concurrency, repeats, a clean stop, and results kept as they finish.

Guarantee: each finished run is stored (``results.json`` rewritten atomically)
the moment it finishes, so an interrupt keeps every finished run, and a resumed
sweep ends with each attempt stored once. When ``stop`` is set no new run starts
and the runs in flight end with their sessions closed; a record back after the
stop is never stored, so a command the stop killed is never a verdict. The sweep
runs one backend; under ``--max-spend`` a run starts only once its spend is reserved.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Protocol

from firstrun.agents.base import Agent
from firstrun.agents.spend import SpendGovernor
from firstrun.docs import Politeness
from firstrun.errors import UsageError
from firstrun.results.model import Classification, RunRecord
from firstrun.results.store import ResultsStore
from firstrun.run.classify import RunReason
from firstrun.run.config import RunConfig
from firstrun.run.events import Event
from firstrun.run.runner import run_task
from firstrun.run.sandbox import run_image
from firstrun.sandbox.select import (
    BackendOptions,
    Resolution,
    resolve_backend,
)
from firstrun.tasks.model import Task

EXIT_PASSED = 0
EXIT_DOCS_GAP = 1
EXIT_NO_EVIDENCE = 2


@dataclass(frozen=True, kw_only=True)
class SuiteOutcome:
    records: list[RunRecord]
    interrupted: bool
    spend_reached: bool = False
    resolution: Resolution | None = None
    backend_lost: str | None = None


# Where each run is carried out: LocalEngine on the worker thread itself;
# run.ray_engine.RayEngine on a node of a Ray cluster, while the worker thread
# waits for it. Either way the driver keeps the queue, the spend ledger and the
# store, here.
class Engine(Protocol):
    """Carries out one run where it runs, and says when the sweep's backend is gone there."""

    def unavailable(self, task: Task, config: RunConfig) -> str | None:
        """Why no run of ``task`` can start now (the backend is lost); None: it can."""

    def execute(self, task: Task, *, attempt: int, config: RunConfig,
                on_event: Callable[[Event], None] | None, stop: threading.Event,
                max_spend: Decimal | None) -> RunRecord:
        """The run's record, its trace written under ``config.out_dir`` (``run_task``'s)."""


@dataclass(frozen=True)
class LocalEngine:
    """Each run on this machine, on the worker thread that asked for it."""

    agent_factory: Callable[[], Agent]

    def unavailable(self, task: Task, config: RunConfig) -> str | None:
        assert config.chosen is not None, "run_suite resolves the sweep's backend first"
        missing = config.chosen.unavailable(BackendOptions(
            allow_unenforced=config.allow_unenforced), (run_image(task, config),))
        if missing is None:
            return None
        return (f"backend {config.backend} is not available now: {missing.name}: "
                f"{missing.detail}" + (f" (fix: {missing.fix})" if missing.fix else ""))

    def execute(self, task: Task, *, attempt: int, config: RunConfig,
                on_event: Callable[[Event], None] | None, stop: threading.Event,
                max_spend: Decimal | None) -> RunRecord:
        return run_task(task, attempt=attempt, agent=self.agent_factory(), config=config,
                        on_event=on_event, stop=stop, max_spend=max_spend)


def run_suite(
    tasks: Sequence[Task],
    *,
    agent_factory: Callable[[], Agent] | None = None,
    engine: Engine | None = None,
    config: RunConfig,
    store: ResultsStore,
    repeat: int = 1,
    workers: int = 1,
    stop: threading.Event | None = None,
    on_event: Callable[[str, int, Event], None] | None = None,
    spend: SpendGovernor | None = None,
    done: Collection[tuple[str, int]] = frozenset(),
    resolution: Resolution | None = None,
) -> SuiteOutcome:
    """Run every task ``repeat`` times on ``workers`` threads; records in finishing order.

    ``engine`` carries out each run (default: ``LocalEngine(agent_factory)``).
    ``on_event(task_name, attempt, event)`` is called from worker threads.
    ``resolution``: the sweep's backend as its caller resolved it; None: resolved here.
    """
    if (engine is None) == (agent_factory is None):
        raise ValueError("run_suite takes exactly one of agent_factory and engine")
    engine = engine if engine is not None else LocalEngine(agent_factory)  # type: ignore[arg-type]
    if repeat < 1:
        raise UsageError("--repeat must be at least 1")
    if workers < 1:
        raise UsageError("--workers must be at least 1")
    stop = stop if stop is not None else threading.Event()
    # One concrete backend for the whole sweep: auto is resolved once, before any
    # run (SuiteOutcome.resolution says what it chose and why). The sweep never
    # switches: a backend that has become unavailable (the daemon stopped, the
    # image was removed) is caught before each run by engine.unavailable, and then
    # no new run starts (SuiteOutcome.backend_lost) while those in flight finish.
    if resolution is None:
        resolution = resolve_backend(config.backend, BackendOptions(),
                                     [run_image(task, config) for task in tasks] or [config.image])
    # Its entry is looked up here, once, and every run carries it (RunConfig.chosen).
    config = replace(config, backend=resolution.backend, chosen=resolution.chosen)
    lost: list[str] = []
    if config.politeness is None:
        # One spacing for the whole sweep, so parallel runs are polite together.
        config = replace(config, politeness=Politeness())
    jobs: queue.SimpleQueue[tuple[Task, int]] = queue.SimpleQueue()
    pending = 0
    for attempt in range(1, repeat + 1):
        for task in tasks:
            # ``done``: a resumed sweep's stored runs (ResultsStore.finished).
            if (task.name, attempt) not in done:
                jobs.put((task, attempt))
                pending += 1
    records: list[RunRecord] = []
    lock = threading.Lock()
    crashed: list[BaseException] = []

    def work() -> None:
        while not stop.is_set():
            if spend is not None and spend.reached:
                return
            with lock:
                if lost:
                    return
            try:
                task, attempt = jobs.get_nowait()
            except queue.Empty:
                return
            missing = engine.unavailable(task, config)
            if missing is not None:
                with lock:
                    lost.append(missing)
                return
            # With --max-spend a run starts only once its reservation is held, and
            # that is its spend limit, settled at its recorded spend when it ends.
            # A reservation that cannot fit starts no new run (spend_reached),
            # while the runs in flight finish: the cap stops the sweep, it does
            # not interrupt it.
            reservation = None
            if spend is not None:
                reservation = spend.reserve(task.spec.budgets, stop=stop)
                if reservation is None:
                    return
            forward = None
            if on_event is not None:
                def forward(event: Event, name: str = task.name, n: int = attempt) -> None:
                    on_event(name, n, event)
            record = None
            try:
                record = engine.execute(task, attempt=attempt, config=config, on_event=forward,
                                        stop=stop, max_spend=None if reservation is None
                                        else reservation.amount)
            except BaseException as exc:
                # run_task maps everything inside a run; this is the store or
                # the trace directory failing. Stop the sweep, keep what finished.
                with lock:
                    crashed.append(exc)
                stop.set()
                return
            finally:
                if spend is not None and reservation is not None:
                    spend.settle(reservation, None if record is None else record.spent())
            # A record taken in after the stop is not kept, whatever it says:
            # the stop may have reached the run (on its node, or through a
            # signal to its command) before its check decided, and no engine
            # can say it did not. Losing a run is honest; a false verdict is not.
            if record.reason == RunReason.INTERRUPTED or stop.is_set():
                continue
            with lock:
                store.add(record.to_data())
                records.append(record)

    count = min(workers, pending)
    remaining = [count]
    all_done = threading.Event()

    def worker() -> None:
        try:
            work()
        finally:
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    all_done.set()

    # Each run executes start to finish on one worker thread that outlives its
    # session: the linux backend's bubblewrap dies with the thread that forked it
    # (--die-with-parent follows the thread, not the process).
    threads = [threading.Thread(target=worker, name=f"firstrun-run-{i}") for i in range(count)]
    if not threads:
        all_done.set()
    for thread in threads:
        thread.start()
    try:
        # Short waits keep the main thread responsive to signals. Not
        # Thread.join: an exception raised inside join (a signal handler's)
        # can leave the thread marked finished while it still runs.
        while not all_done.wait(0.2):
            pass
    except BaseException:
        # Ctrl-C in the main thread: let the runs in flight end cleanly (their
        # sessions closed, finished ones stored) before the interrupt goes on.
        stop.set()
        all_done.wait()
        raise
    finally:
        if all_done.is_set():
            for thread in threads:
                thread.join()
    if crashed:
        raise crashed[0]
    return SuiteOutcome(records=records, interrupted=stop.is_set(),
                        spend_reached=spend is not None and spend.reached,
                        resolution=resolution, backend_lost=lost[0] if lost else None)


def suite_exit_code(records: Sequence[RunRecord]) -> int:
    """0: every evidential run passed (and there was one); 1: a docs gap; 2: no evidence."""
    if any(r.classification is Classification.DOCS_GAP for r in records):
        return EXIT_DOCS_GAP
    if any(r.classification is Classification.PASSED for r in records):
        return EXIT_PASSED
    return EXIT_NO_EVIDENCE
