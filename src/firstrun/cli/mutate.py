"""``firstrun mutate``: does each task's check fail when a documented step is missing?

Guarantee: every task is first replayed unmutated, and only a task whose
unmutated run passed is mutated (each step removed, each version pin made
impossible), from the steps that run's trace records. Both rounds are ordinary
sweeps into one results store, so ``--resume`` runs only what has not finished,
and the scores come from the saved runs alone (``results.mutation``). Exit
status: 0 every judged mutant was killed, 1 one survived, 2 none could be judged.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import replace
from pathlib import Path

from firstrun.cli.interrupt import Signalled, signals_unwind
from firstrun.cli.run import (
    RunRequest,
    _check_paths,
    _open_store,
    _resolve,
    _say_where,
    _select,
    _sweep_identity,
    _with_project,
    capture_warning,
    run_config,
    sweep_meta,
    sweep_progress,
)
from firstrun.errors import UsageError
from firstrun.results.model import Classification, RunRecord
from firstrun.results.mutation import TaskScore, Verdict, mutation_scores
from firstrun.results.store import RESULTS_FILE, ResultsStore
from firstrun.run.events import Source, read_trace
from firstrun.run.project import apply_task_defaults, find_project_config
from firstrun.tasks.model import Task
from firstrun.tasks.mutation import RanStep, mutant, mutations

EXIT_KILLED = 0
EXIT_SURVIVED = 1
# Nothing killed or survived: run.suite's EXIT_NO_EVIDENCE, the status of a run with none.

# Recorded in results.json's meta: the tasks this sweep mutated, for the report.
MUTATED_KEY = "mutated"


def mutate_command(request: RunRequest, *, as_json: bool = False) -> int:
    from firstrun.agents.replay import ReplayAgent
    from firstrun.run.suite import EXIT_NO_EVIDENCE, run_suite

    project = find_project_config(request.config)
    _say_where(project, given=request.config)
    request = replace(_with_project(request, project), agent=("replay",), repeat=1)
    _check_paths(request)
    tasks, mirrors = _select(request)
    if project is not None:
        tasks = apply_task_defaults(tasks, project.spec)
    for task in tasks:
        if task.spec.replay_docs is None and not task.spec.replay_steps:
            raise UsageError(f"mutate: {task.path}: task {task.name} has no replay block, so there "
                             "is no step to remove; add 'replay: docs' or a list of steps")
    from firstrun.run.sandbox import check_inspection
    from firstrun.sandbox.select import inspecting_backend

    inspect_tls = bool(request.inspect_tls)
    check_inspection(tasks, inspect_tls=inspect_tls, env=os.environ)
    backend = inspecting_backend(request.backend or "auto", inspect_tls=inspect_tls, flag="--backend")
    resolution = _resolve(backend, request.allow_unenforced,
                          [task.spec.image or request.image for task in tasks], project)
    if isinstance(resolution, str):
        print(resolution, file=sys.stderr)
        return EXIT_NO_EVIDENCE
    warning = capture_warning(resolution.backend)
    if warning is not None:
        print(warning, file=sys.stderr)
    out = Path(request.out or "results")
    config = run_config(request, resolution.backend, mirrors, project, inspect_tls=inspect_tls)
    store = _open_store(request, out, _sweep_identity(request, tasks, resolution.backend, project),
                        meta={**sweep_meta(request, resolution, project),
                              MUTATED_KEY: [task.name for task in tasks]})
    progress = sweep_progress(request, sys.stderr)
    stop = threading.Event()
    signum: int | None = None
    with signals_unwind(), progress.shown():
        try:
            for round_of in (lambda: tasks, lambda: _mutants(tasks, store, out)):
                if stop.is_set():
                    break
                run_suite(round_of(), agent_factory=ReplayAgent, config=config, store=store,
                          workers=request.workers or 1, stop=stop, on_event=progress.update,
                          done=store.finished(), resolution=resolution)
        except Signalled as sig:
            stop.set()
            signum = sig.signum
    records = [RunRecord.from_data(run) for run in store.runs()]
    scores = mutation_scores(records, [task.name for task in tasks])
    if as_json:
        print(json.dumps([score.to_data() for score in scores], indent=2))
    else:
        print("\n".join(score_lines(scores)))
        print(f"results: {out / RESULTS_FILE}")
        print(f"traces:  {out / 'runs'}/TASK/1/trace.jsonl (narrate one: firstrun show DIR)")
    if signum is not None:
        print("firstrun: interrupted: finished runs are kept; firstrun mutate --resume "
              f"{out} runs the rest", file=sys.stderr)
        return 128 + signum
    return exit_code(scores)


# A mutant of a failing task shows nothing. Each mutant is a task of its own
# name (``tasks.mutation``), with its own trace and resume key.
def _mutants(tasks: list[Task], store: ResultsStore, out: Path) -> list[Task]:
    """Every mutant of each task whose unmutated run passed, from the steps its trace records."""
    runs = {(str(r["task"]), int(r["attempt"])): r for r in store.runs()}
    made = []
    for task in tasks:
        base = runs.get((task.name, 1))
        if base is None or base.get("classification") != Classification.PASSED.value or not base.get("trace"):
            continue
        steps = steps_ran(task, out / str(base["trace"]))
        made.extend(mutant(task, mutation) for mutation in mutations(task.name, steps))
    return made


def steps_ran(task: Task, trace: Path) -> list[RanStep]:
    """The replay's steps as its trace records them, each with where it came from: the page
    and block for ``replay: docs``, the task file's line for a hand-written step."""
    steps = []
    for event in read_trace(trace):
        if event.get("kind") != "command" or event.get("source") != Source.AGENT.value:
            continue
        origin = event.get("origin")
        if origin:
            where = f"{origin['page']} block {origin['block']}"
        else:
            index = len(steps)
            where = f"{task.path}:{task.locations.line(('replay', index))}"
        steps.append(RanStep(command=str(event["command"]), where=where))
    return steps


def score_lines(scores: list[TaskScore]) -> list[str]:
    """Each task's score, then a line per mutant; a survivor names its step and where."""
    lines = []
    labels = {Verdict.KILLED: "killed", Verdict.SURVIVED: "SURVIVED", Verdict.NOT_RUN: "not run"}
    for score in scores:
        lines.append(f"{score.task}: {score.score_text()}"
                     + (f": {score.why_none}" if score.why_none else ""))
        for outcome in score.mutants:
            lines.append(f"  {labels[outcome.verdict]:<8} {outcome.name}: {outcome.describe()}: "
                         f"{_short(outcome.reason)}")
    return lines


def exit_code(scores: list[TaskScore]) -> int:
    from firstrun.run.suite import EXIT_NO_EVIDENCE

    if any(s.count(Verdict.SURVIVED) for s in scores):
        return EXIT_SURVIVED
    if any(s.count(Verdict.KILLED) for s in scores):
        return EXIT_KILLED
    return EXIT_NO_EVIDENCE


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
