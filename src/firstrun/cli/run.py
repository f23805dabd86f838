"""``firstrun run`` and ``firstrun check``: tasks in, saved results and an honest exit status out.

Guarantee: every bad input (a flag, a task file, a mirror) is refused before any
run starts, and nothing firstrun did not write is replaced. Every finished run is
in ``OUT/results.json`` the moment it finishes, so whatever ends the command, a
signal included, what finished is kept: after SIGINT, SIGTERM or SIGHUP no new run
starts, the running ones end with their sessions closed, and the exit is 128+N.
The summary, the JUnit file and the exit status come from the saved ``RunRecord``s only.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from firstrun import __version__
from firstrun.agents.base import Agent
from firstrun.agents.cli.frame import ProcessAgent
from firstrun.agents.cli.install import cli_versions
from firstrun.agents.spend import DEFAULT_RUN_TOKENS, SpendGovernor
from firstrun.cli.color import colors, rich_console
from firstrun.cli.interrupt import Signalled, signals_unwind
from firstrun.cli.progress import SweepProgress
from firstrun.docs import Affordances, CacheMode, Mirror, parse_mirrors
from firstrun.errors import UsageError
from firstrun.policy.profile import LayerName
from firstrun.reports.junit import write_junit
from firstrun.reports.summary import route_finding_text, table_lines, total_line
from firstrun.results.arms import ARMS_FILE, Arm, read_arms, sweep_arms, write_arms
from firstrun.results.model import (
    Classification,
    RunRecord,
    SweepIdentity,
    TaskIdentity,
    incomparability,
)
from firstrun.results.store import RESULTS_FILE, SWEEP_KEY, ResultsStore, load_results
from firstrun.results.versions import shaping_versions
from firstrun.run.options import RUN_OPTION, RUN_OPTIONS, recorded_options
from firstrun.run.project import (
    ProjectConfig,
    apply_task_defaults,
    find_project_config,
    merged_mirrors,
    option_value,
)
from firstrun.sandbox.select import (
    REGISTRY,
    Resolution,
    entry,
    sweep_backend,
)
from firstrun.tasks.allowlist import AllowEntries, allow_snippet
from firstrun.tasks.load import DEFAULT_TASK_DIR, expand_task_paths, load_tasks
from firstrun.tasks.model import Task

if TYPE_CHECKING:
    from firstrun.run.config import RunConfig


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """Validated-by-argparse ``firstrun run`` arguments; the rest is checked in ``run_sweep_command``.

    One field per entry of ``run.options.RUN_OPTIONS``, which declares each
    (a test holds the two to each other); this type only gives them types.
    Options with a project key left None come from the project config
    (``config``, else ./firstrun.yaml), else their fallback.
    """

    tasks: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()
    # Each value an arm; none given: the replay agent, no model, all affordances.
    agent: tuple[str, ...] = ()
    model: tuple[str, ...] = ()
    base_url: str | None = None
    max_spend: Decimal | None = None
    price_file: str | None = None
    backend: str | None = None
    out: str | None = None
    resume: str | None = None
    config: str | None = None
    keep_sandbox: bool = False
    repeat: int = 1
    workers: int | None = None
    engine: str | None = None
    ray_address: str | None = None
    retry_infra: bool = False
    junit: str | None = None
    github_summary: bool = False
    github_summary_file: str | None = None
    docs_mirrors: tuple[str, ...] = ()
    cache_dir: str | None = None
    refresh: bool = False
    offline: bool = False
    affordances: tuple[str, ...] = ()
    probe_affordances: bool = False
    allow_unenforced: bool = False
    downgrades: frozenset[LayerName] = frozenset()
    image: str | None = None
    inspect_tls: bool | None = None
    quiet: bool = False
    verbose: bool = False
    color: str = "auto"
    argv: tuple[str, ...] = ()

    # Several --agent, --model or --affordances values make arms, run one after
    # another: each is a sweep of its own in OUT/ARM/, opened, resumed and
    # checked as a single sweep is.
    def arms(self) -> tuple[Arm, ...]:
        """The sweep's arms: every combination of the agents, models and affordances given."""
        return sweep_arms(self.agent, self.model, self.affordances)

    def sole_arm(self) -> Arm:
        """The one arm of a sweep that is not several (``mutate``'s, a test's)."""
        arms = self.arms()
        if len(arms) != 1:
            raise UsageError("this command takes one --agent, --model and --affordances value each")
        return arms[0]


def _say_where(project: ProjectConfig | None, *, given: str | None) -> None:
    """Name the project config when it was found above the current directory, not given."""
    if project is not None and given is None \
            and os.path.dirname(os.path.abspath(project.path)) != os.getcwd():
        print(f"firstrun: project config {project.path}", file=sys.stderr)


def arm_dirs(out: Path, arms: Sequence[Arm]) -> list[Path]:
    """Where each arm's sweep is saved: ``out`` itself for a sweep of one arm."""
    return [out / arm.name for arm in arms] if len(arms) > 1 else [out]


def _check_layout(out: Path, arms: Sequence[Arm], *, resume: bool) -> None:
    """A sweep of several arms never shares ``out`` with a sweep of one, and one resumed
    runs the arms it started with."""
    flag = "--resume" if resume else "--out"
    saved = read_arms(out, label=flag)
    if len(arms) == 1:
        if saved is not None:
            how = ("give the --agent, --model and --affordances values it ran with, or resume "
                   f"one arm: --resume {os.fspath(out / saved[0].name)}") if resume \
                else "choose another --out"
            raise UsageError(f"{flag}: {os.fspath(out)!r} holds a sweep of several arms "
                             f"({', '.join(a.name for a in saved)}); {how}")
        return
    if not resume:
        if os.path.lexists(out / RESULTS_FILE):
            raise UsageError(f"--out: {os.fspath(out)!r} holds the {RESULTS_FILE} of a sweep of "
                             "one arm; a sweep of several goes in a directory of its own: choose "
                             "another --out")
        return
    if saved is None:
        raise UsageError(f"--resume: {os.fspath(out)!r} holds no sweep of several arms (no "
                         f"{ARMS_FILE}); resume it with the one --agent, --model and "
                         "--affordances it ran with")
    if tuple(saved) != tuple(arms):
        raise UsageError(f"--resume: {os.fspath(out)!r} holds the arms "
                         f"{', '.join(a.name for a in saved)}; this command's are "
                         f"{', '.join(a.name for a in arms)}")


def _check_paths(request: RunRequest, arms: Sequence[Arm] = ()) -> None:
    if request.quiet and request.verbose:
        raise UsageError("-q/--quiet and -v/--verbose: one prints less, the other more; give one")
    if request.retry_infra and request.resume is None:
        raise UsageError("--retry-infra: only with --resume DIR, whose infra_error attempts it "
                         "runs again")
    out = Path(request.out)
    flag = "--resume" if request.resume is not None else "--out"
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag}: {request.out!r} exists and is not a directory")
    arms = arms or (request.sole_arm(),)
    if out.is_dir():
        _check_layout(out, arms, resume=request.resume is not None)
    dirs = arm_dirs(out, arms)
    for where in dirs:
        if where.exists() and not where.is_dir():
            raise UsageError(f"{flag}: {os.fspath(where)!r} exists and is not a directory")
        runs = where / "runs"
        if os.path.lexists(runs) and not runs.is_dir():
            # Every run's trace goes beneath it; each would crash on its first event.
            raise UsageError(f"{flag}: {os.fspath(runs)!r} exists and is not a directory")
        results = where / RESULTS_FILE
        if request.resume is None and os.path.lexists(results):
            # A new sweep replaces OUT/results.json; only ever one firstrun wrote.
            try:
                load_results(results)
            except UsageError as exc:
                raise UsageError(f"--out: {exc.args[0]}; a new sweep would replace it, so it is "
                                 "left alone: choose another --out") from None
    if request.junit is not None:
        parent = os.path.dirname(os.path.abspath(request.junit))
        if not os.path.isdir(parent):
            raise UsageError(f"--junit: directory {parent!r} does not exist")
        if os.path.isdir(request.junit):
            raise UsageError(f"--junit: {request.junit!r} is a directory")
        # Written at the end through a temporary name ".NAME.XXXXXXXX.tmp": a name
        # too long for that would fail only after the whole sweep has run.
        if len(os.fsencode(os.path.basename(request.junit))) + 14 > os.pathconf(parent, "PC_NAME_MAX"):
            raise UsageError(f"--junit: the file name {os.path.basename(request.junit)!r} is too long")
        if any(os.path.realpath(request.junit) == os.path.realpath(d / RESULTS_FILE) for d in dirs):
            raise UsageError(f"--junit: {request.junit!r} is the sweep's own {RESULTS_FILE}")
    if request.price_file is not None and os.path.exists(request.price_file) \
            and not os.path.isfile(request.price_file):
        # A FIFO or device would be read forever.
        raise UsageError(f"--price-file: {request.price_file!r} is not a regular file")
    if request.cache_dir is not None and os.path.exists(request.cache_dir) and not os.path.isdir(request.cache_dir):
        raise UsageError(f"--cache-dir: {request.cache_dir!r} exists and is not a directory")
    if request.refresh and request.offline:
        raise UsageError("--refresh and --offline: one fetches every page, the other none; give one")
    for flag, given in (("--refresh", request.refresh), ("--offline", request.offline)):
        if given and request.cache_dir is None:
            raise UsageError(f"{flag}: there is no docs cache; give --cache-dir DIR "
                             "(or cache_dir in firstrun.yaml)")


# Flags left unset come from the project config (firstrun.yaml), for ``check``
# as for ``run``; a flag given wins over it.
def _with_project(request: RunRequest, project: ProjectConfig | None) -> RunRequest:
    """``request`` with every flag left unset filled from ``project``, else the built-in default."""
    filled = {o.field: option_value(o, getattr(request, o.field), project)
              for o in RUN_OPTIONS if o.project is not None}
    if request.resume is not None:
        if request.out is not None and os.path.abspath(request.out) != os.path.abspath(request.resume):
            raise UsageError(f"--resume: the sweep's results go back to {request.resume!r}; "
                             f"drop --out {request.out!r}")
        filled["out"] = request.resume
    return replace(request, **filled)


def _recorded(request: RunRequest, backend: str, where: Literal["identity", "meta"],
              arm: Arm) -> dict[str, Any]:
    # Both save the backend auto resolved to, not the one asked for, and the arm's own
    # agent, model and affordances.
    return recorded_options({**asdict(request), "backend": backend, "agent": arm.agent,
                             "model": arm.model, "affordances": arm.affordances}, where=where)


def _sweep_identity(request: RunRequest, tasks: list[Task], backend: str,
                    project: ProjectConfig | None, arm: Arm | None = None) -> SweepIdentity:
    return SweepIdentity(
        tasks=tuple(sorted(
            (TaskIdentity(name=t.name, sha256=t.sha256,
                          check_sha256=hashlib.sha256(t.check.encode()).hexdigest())
             for t in tasks), key=lambda t: t.name)),
        task_defaults_sha256=None if project is None else project.task_defaults_sha256(),
        **_recorded(request, backend, "identity", arm or request.sole_arm()),
    )


def _open_store(request: RunRequest, out: Path, identity: SweepIdentity,
                meta: dict[str, object]) -> ResultsStore:
    """A new sweep's store, or with --resume the saved sweep's, refused unless comparable."""
    # --resume DIR then runs only the attempts DIR has no finished run for, and is
    # refused here, before anything runs, unless this command measures what that
    # sweep recorded (its SweepIdentity). The store rewrites results.json
    # atomically after every run, which is what keeps finished runs on a signal.
    if request.resume is None:
        store = ResultsStore(out, meta={**meta, SWEEP_KEY: identity.to_data()})
        # Written now, so results.json exists (with its meta) even if no run finishes.
        try:
            store.flush()
        except OSError as exc:
            raise UsageError(f"--out: cannot write {store.path}: {exc.strerror or exc}") from None
        return store
    store = ResultsStore.reopen(out)
    reason = incomparability(store.identity(), identity)
    if reason is not None:
        raise UsageError(f"--resume: {out} holds a sweep this command cannot continue: {reason}")
    resumed = store.meta().get("resumed") or []
    store.update_meta({"resumed": [*resumed, {k: meta[k] for k in ("started_at", "argv", "config",
                                                                   "firstrun")}]})
    return store


def _select(request: RunRequest) -> tuple[list[Task], dict[str, Mirror]]:
    """The tasks to run and the docs mirrors they need; ``--docs-mirror`` wins over an example's own."""
    from firstrun.examples import example_mirrors, find_example, list_examples

    examples = []
    for name in request.examples:
        chosen = list_examples() if name == "all" else [find_example(name)]
        examples.extend(e for e in chosen if e not in examples)
    paths: list[str] = list(request.tasks)
    if not paths and not examples:
        files, _ = expand_task_paths([])
        if not files:
            raise UsageError(
                f"run: no task files in {DEFAULT_TASK_DIR}/; name TASK files, or try a bundled "
                "example: firstrun run --example NAME (firstrun examples lists them)"
            )
        paths = files
    paths += [os.fspath(e.task_path) for e in examples]
    tasks = load_tasks(paths)
    mirrors = example_mirrors(examples)
    mirrors.update(parse_mirrors(request.docs_mirrors))
    return tasks, mirrors


def run_sweep_command(request: RunRequest) -> int:
    """Run the suite; return the exit status (0/1/2, or 128+N after signal N)."""
    try:
        return _run_sweep_command(request)
    finally:
        # Left only once every run in flight has ended on its node.
        ray_engine = sys.modules.get("firstrun.run.ray_engine")
        if ray_engine is not None:
            ray_engine.leave()


def _run_sweep_command(request: RunRequest) -> int:
    from firstrun.agents import make_agent
    from firstrun.agents.spend import load_price_file
    from firstrun.cli.flags import summary_target
    from firstrun.run.suite import EXIT_NO_EVIDENCE, run_suite, suite_exit_code

    project = find_project_config(request.config)
    _say_where(project, given=request.config)
    request = _with_project(request, project)
    arms = request.arms()
    _check_paths(request, arms)
    out = Path(request.out)
    dirs = arm_dirs(out, arms)
    summary = summary_target(request.github_summary, request.github_summary_file)
    if summary is not None and any(os.path.realpath(summary.path) == os.path.realpath(d / RESULTS_FILE)
                                   for d in dirs):
        raise UsageError(f"{summary.flag}: {os.fspath(summary.path)!r} is the sweep's own {RESULTS_FILE}")
    tasks, mirrors = _select(request)
    if project is not None:
        tasks = apply_task_defaults(tasks, project.spec)
        mirrors = merged_mirrors(project, mirrors)
    prices = load_price_file(request.price_file) if request.price_file is not None else None

    def agent_of(arm: Arm) -> Callable[[], Agent]:
        def new_agent() -> Agent:
            return make_agent(arm.agent, model=arm.model, base_url=request.base_url,
                              price_file=prices)
        return new_agent

    # Built once up front, for every arm, so an unknown --agent, a bad --model, a
    # missing SDK or key, or an unpriced --max-spend is refused before any run.
    made = [agent_of(arm)() for arm in arms]
    for agent in made:
        _spend_governor(agent, request.max_spend, tasks)
    pricings = [getattr(agent, "pricing", None) for agent in made]
    from firstrun.run.sandbox import check_inspection
    from firstrun.sandbox.select import inspecting_backend

    inspect_tls = bool(request.inspect_tls)
    check_inspection(tasks, inspect_tls=inspect_tls, env=os.environ)
    backend = inspecting_backend(request.backend, inspect_tls=inspect_tls, flag="--backend")
    # A key the proxy holds goes into the agent's API requests through TLS
    # inspection of that host alone, which the backend must be able to show.
    for arm, agent in zip(arms, made, strict=True):
        if isinstance(agent, ProcessAgent) and agent.key_held:
            inspecting_backend(backend, inspect_tls=True, flag="--backend",
                               why=f"--agent {arm.agent} (the proxy puts its key into its API "
                                   "requests)")
    images = [task.spec.image or request.image for task in tasks]
    cluster = None
    if request.engine == "ray":
        cluster = _ray_cluster(request, backend, images, project)
        resolution: Resolution | str = cluster.plan.resolution
    else:
        resolution = _resolve(backend, request.allow_unenforced, images, project)
    if isinstance(resolution, str):
        print(resolution, file=sys.stderr)
        return EXIT_NO_EVIDENCE
    if resolution.passed_over:
        # Said when auto had to settle for less than its first choice; the
        # choice itself is always in results.json's meta.
        print(f"firstrun: {resolution.explain()}", file=sys.stderr)
    warning = capture_warning(resolution.backend)
    if warning is not None:
        print(warning, file=sys.stderr)
    # Every arm's store is opened (and, resumed, checked) before any run starts, so
    # a sweep stopped in its first arm leaves the others' identities to resume.
    stores = [_open_store(request, where, _sweep_identity(request, tasks, resolution.backend,
                                                          project, arm),
                          meta=sweep_meta(request, resolution, project, arm))
              for arm, where in zip(arms, dirs, strict=True)]
    if len(arms) > 1 and request.resume is None:
        write_arms(out, arms)
    stop = threading.Event()
    signum: int | None = None
    spent = Decimal(0)
    reached = False
    report_only = False
    with signals_unwind():
        try:
            for arm, where, store, pricing in zip(arms, dirs, stores, pricings, strict=True):
                config = run_config(request, resolution.backend, mirrors, project,
                                    inspect_tls=inspect_tls, arm=arm, out=where)
                report_only = config.report_only
                if stop.is_set() or reached:
                    continue
                governor = None
                if request.max_spend is not None:
                    # One --max-spend for the whole sweep: an arm may spend what the
                    # arms before it left.
                    if spent >= request.max_spend:
                        reached = True
                        continue
                    governor = SpendGovernor(cap=request.max_spend - spent, pricing=pricing)
                if len(arms) > 1 and not request.quiet:
                    print(f"firstrun: arm {arm.name} ({os.fspath(where)})", file=sys.stderr)
                progress = sweep_progress(request, sys.stderr)
                with progress.shown():
                    outcome = run_suite(
                        tasks,
                        agent_factory=agent_of(arm) if cluster is None else None,
                        engine=None if cluster is None else cluster.engine(
                            agent=arm.agent, model=arm.model, base_url=request.base_url,
                            prices=prices, mirrors=mirrors),
                        config=config,
                        store=store,
                        repeat=request.repeat,
                        workers=request.workers or (1 if cluster is None else cluster.plan.cpus),
                        stop=stop,
                        on_event=progress.update,
                        spend=governor,
                        done=store.finished(retry_infra=request.retry_infra),
                        resolution=resolution,
                    )
                if governor is not None:
                    spent += governor.spent
                    reached = outcome.spend_reached
                if outcome.backend_lost is not None:
                    print(f"firstrun: stopped starting runs: {outcome.backend_lost}; finished "
                          "runs are kept", file=sys.stderr)
                    stop.set()
        except Signalled as sig:
            # The first signal stops the suite starting new runs; run_suite has already set ``stop`` and waited for the runs in
            # flight to end with their sessions closed; signals stay ignored
            # until this block exits. Setting it here too covers a signal that
            # came before run_suite's own handling began.
            stop.set()
            signum = sig.signum
    by_arm = [[RunRecord.from_data(run) for run in store.runs()] for store in stores]
    records = [r for arm_records in by_arm for r in arm_records]
    if reached:
        print(f"firstrun: --max-spend {request.max_spend} USD reached ({spent} USD settled): "
              "no further run was started", file=sys.stderr)
    if request.junit is not None:
        # A testsuite per task and arm: the same task under two arms is two suites.
        write_junit(request.junit, records if len(arms) == 1 else
                    [replace(r, task=f"{arm.name}/{r.task}")
                     for arm, arm_records in zip(arms, by_arm, strict=True) for r in arm_records])
    if summary is not None:
        from firstrun.cli.report import summary_markdown
        from firstrun.reports.load import load_sweep
        from firstrun.reports.output import append_text

        append_text(summary.path, summary_markdown(load_sweep(out, label="--out")))
    color = colors(request.color, sys.stdout)
    if signum is not None:
        _say_interrupted(records)
    for arm, where, arm_records in zip(arms, dirs, by_arm, strict=True):
        if len(arms) > 1:
            print(f"== arm {arm.name} ==")
        _print_summary(arm_records, where, interrupted=False, report_only=report_only,
                       quiet=request.quiet, color=color)
    if len(arms) > 1:
        from firstrun.reports.findings import arms_matrix
        from firstrun.reports.findings_report import matrix_text

        print(matrix_text(arms_matrix([(a.name, r) for a, r in zip(arms, by_arm, strict=True)])),
              end="")
    if signum is not None:
        return 128 + signum
    return suite_exit_code(records)


def run_config(request: RunRequest, backend: str, mirrors: dict[str, Mirror],
               project: ProjectConfig | None, *, inspect_tls: bool,
               arm: Arm | None = None, out: Path | None = None) -> RunConfig:
    """How each run of the sweep (of ``arm``, saved in ``out``) is carried out, from the
    request filled from the project."""
    from firstrun.run.runner import RunConfig

    arm = arm or request.sole_arm()
    return RunConfig(
        out_dir=out or Path(request.out or "results"),
        backend=backend,
        image=request.image,
        allow_unenforced=request.allow_unenforced,
        downgrades=request.downgrades,
        keep_sandbox=request.keep_sandbox,
        docs_mirrors=mirrors,
        cache_dir=Path(request.cache_dir) if request.cache_dir is not None else None,
        cache_mode=CacheMode.REFRESH if request.refresh
        else CacheMode.OFFLINE if request.offline else CacheMode.USE,
        affordances=Affordances(arm.affordances),
        probe_affordances=request.probe_affordances,
        inspect_tls=inspect_tls,
        permissions=(project.permissions,) if project is not None else (),
    )


def sweep_meta(request: RunRequest, resolution: Resolution,
               project: ProjectConfig | None, arm: Arm | None = None) -> dict[str, Any]:
    """What results.json's meta says of the sweep (of ``arm``): versions, options, backend,
    when, how, and the arm's name when it is one of several."""
    arm = arm or request.sole_arm()
    return {
        "firstrun": __version__,
        "versions": shaping_versions(arm.agent) | cli_versions(arm.agent),
        **_recorded(request, resolution.backend, "meta", arm),
        **({"arm": arm.name} if arm.name else {}),
        "backend_resolution": resolution.to_data(),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": list(request.argv),
        "config": None if project is None else project.to_record(),
    }


def sweep_progress(request: RunRequest, stderr: TextIO) -> SweepProgress:
    """What the sweep shows on ``stderr`` as it runs: the board on a terminal unless ``-q``, a
    line per finished run with ``-v``, coloured as ``--color`` decides for ``stderr``."""
    return SweepProgress(draw=stderr.isatty() and not request.quiet, verbose=request.verbose,
                         color=colors(request.color, stderr), stream=stderr)


def capture_warning(backend: str) -> str | None:
    """What ``firstrun run`` says first on a backend where nothing records a dial that
    ignores the proxy variables, so a run it broke cannot be told from a gap in the docs."""
    chosen = entry(backend)
    if chosen.captures or chosen.own_proxy or chosen.unenforced:
        return None
    capturing = [e.name for e in REGISTRY if e.captures or e.own_proxy]
    return (f"firstrun: the {chosen.name} backend does not capture: a program that ignores "
            "the proxy variables reaches nothing and leaves no record, so a run it failed "
            f"reads as docs_gap; such tasks belong on {', '.join(capturing[:-1])} or "
            f"{capturing[-1]}")


def _print_summary(records: list[RunRecord], out: Path, *, interrupted: bool,
                   report_only: bool = False, quiet: bool = False, color: bool = False) -> None:
    """The end of ``run`` on stdout (the interruption notice on stderr): the table, where the
    results and traces are, a line per run that did not pass; with ``quiet`` (``-q``) only the
    whole sweep in one line, where the results are, and the warning on checks that ran
    beside the agent. ``color`` draws the table with rich instead of plain text."""
    if interrupted:
        _say_interrupted(records)
    if not records:
        print("no run finished")
    elif quiet:
        print(total_line(records))
    elif color:
        _rich_table(records)
    else:
        print("\n".join(table_lines(records)))
    print(f"results: {out / RESULTS_FILE}")
    if quiet:
        _print_shared(records)
        return
    print(f"traces:  {out / 'runs'}/TASK/ATTEMPT/trace.jsonl (narrate one: firstrun show DIR)")
    for record in records:
        if record.classification is not Classification.PASSED and record.trace:
            run_dir = (out / record.trace).parent
            print(f"  {record.task} #{record.attempt} {record.classification.value} ({record.reason})"
                  f"{_detail(record)}; firstrun show {run_dir}")
            if record.classification is Classification.BLOCKED and record.allow_fix:
                print(f"    the task lines that would allow it ({record.task_file}):")
                print(_indented(allow_snippet(AllowEntries.from_data(record.allow_fix)), 6))
    if report_only:
        learnt = AllowEntries()
        for record in records:
            learnt |= AllowEntries.from_data(record.allow_fix)
        if learnt:
            print("firstrun: report mode: the runs reached what their tasks do not allow yet; "
                  "to allow it, add to the task:")
            print(_indented(allow_snippet(learnt), 2))
        else:
            print("firstrun: report mode: the runs reached nothing their tasks do not allow")
    _print_shared(records)
    for record in records:
        # Recorded, never classified: the check alone decides, but a reader hit this page.
        for finding in record.route_findings:
            print(f"  {record.task} #{record.attempt} route page not read: {route_finding_text(finding)}")


def _say_interrupted(records: Sequence[RunRecord]) -> None:
    print(f"firstrun: interrupted: {len(records)} finished run{'s' if len(records) != 1 else ''} "
          "kept; runs that had not finished are not recorded", file=sys.stderr)


def _print_shared(records: list[RunRecord]) -> None:
    shared = [r for r in records if r.check_isolation == "shared"]
    if shared:
        print(f"  {len(shared)} run{'s' if len(shared) != 1 else ''} checked beside the agent's "
              "own processes (wait_http with no serve; check_isolation: shared): such a pass "
              "could be forged")


def _indented(text: str, width: int) -> str:
    return "\n".join(" " * width + line for line in text.rstrip("\n").splitlines())


_DETAIL_CHARS = 160


def _detail(record: RunRecord) -> str:
    text = " ".join(record.detail.split())
    if not text:
        return ""
    return ": " + (text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 3] + "...")


def _rich_table(records: list[RunRecord]) -> None:
    from rich.table import Table

    from firstrun.reports.summary import columns, summarize

    rows, total = summarize(records)
    cols = columns([*rows, total])
    table = Table(title="firstrun run", title_justify="left")
    table.add_column("task")
    table.add_column("runs", justify="right")
    for c in cols:
        table.add_column(c.value, justify="right")
    table.add_column("pass rate (evidential runs)", justify="right")
    for row in [*rows, total]:
        table.add_row(
            row.task, str(row.runs), *(str(row.counts.get(c, 0)) for c in cols), row.pass_rate_text(),
            end_section=row is rows[-1],
        )
    rich_console(sys.stdout, color=True, highlight=False).print(table)


def _spend_governor(agent: Agent, max_spend: Decimal | None,
                    tasks: list[Task]) -> SpendGovernor | None:
    """The --max-spend governor, refused up front when the agent's spend cannot be known
    or a task's run could never fit under it."""
    if max_spend is None:
        return None
    pricing = getattr(agent, "pricing", None)
    if agent.model is None:
        raise UsageError(f"--max-spend: the {agent.name} agent uses no model and spends nothing")
    if pricing is None:
        raise UsageError(f"--max-spend: no price is known for model {agent.model!r}; "
                         "give one with --price-file")
    governor = SpendGovernor(cap=max_spend, pricing=pricing)
    for task in tasks:
        need = governor.estimate(task.spec.budgets)
        if need > max_spend:
            raise UsageError(
                f"--max-spend: {max_spend} USD is less than one run of {task.name} reserves "
                f"({need.normalize():f} USD: its budgets.max_tokens, or "
                f"{DEFAULT_RUN_TOKENS} tokens when unset, at {agent.model}'s highest rate)")
    return governor


def _ray_cluster(request: RunRequest, backend: str, images: list[str | None],
                 project: ProjectConfig | None) -> Any:
    """The cluster this sweep runs on, its nodes probed; each excluded node said, with why."""
    if request.keep_sandbox:
        raise UsageError("--keep-sandbox: under --engine ray a run's workspace stays on its "
                         "node; keep workspaces with --engine local")
    try:
        from firstrun.run import ray_engine
    except ImportError as exc:
        raise UsageError(f"--engine ray: Ray is not installed ({exc.name or 'ray'}): "
                         "pip install 'firstrun[ray]'") from None
    cluster = ray_engine.Cluster.join(request.ray_address)
    needs_kernel = project is not None and project.spec.isolation == "vm"
    cluster.probe(backend, allow_unenforced=request.allow_unenforced, images=images,
                  needs_kernel=needs_kernel)
    for node, why in cluster.plan.excluded:
        print(f"firstrun: node {node.label} excluded: {why}", file=sys.stderr)
    if request.quiet:
        return cluster
    print(f"firstrun: running on {len(cluster.plan.nodes)} Ray node"
          f"{'s' if len(cluster.plan.nodes) != 1 else ''} ({cluster.plan.cpus} CPUs): "
          + ", ".join(node.label for node in cluster.plan.nodes), file=sys.stderr)
    return cluster


def _resolve(backend: str, allow_unenforced: bool, images: list[str | None],
             project: ProjectConfig | None) -> Resolution | str:
    # A project requiring ``isolation: vm`` is refused here once, before any run
    # or check, on a backend that cannot give it; each run's sandbox enforces it
    # again, the project's task defaults having put it into every task.
    needs_kernel = project is not None and project.spec.isolation == "vm"
    return sweep_backend(backend, allow_unenforced, images, needs_kernel=needs_kernel,
                         required_by=f"the project config {project.path}" if project else None)


def check_command(
    task_path: str, *, sandbox: str, backend: str | None = None, allow_unenforced: bool = False,
    out: str | None = None, image: str | None = None, inspect_tls: bool | None = None,
    config: str | None = None, allow_write: tuple[str, ...] = (),
) -> int:
    """Re-run only the success check of one task against a kept workspace.

    ``backend``, ``out`` and ``inspect_tls`` left None come from the project
    config (``config``, else ./firstrun.yaml), else the built-in defaults; its
    task defaults and ``isolation`` apply to the task, so the check runs under
    the sandbox its run had. Its docs keys and permissions do not apply: a
    check reads no docs and makes no tool calls.
    """
    project = find_project_config(config)
    _say_where(project, given=config)
    spec = project.spec if project is not None else None
    backend = option_value(RUN_OPTION["backend"], backend, project)
    out = option_value(RUN_OPTION["out"], out, project)
    inspect_tls = bool(option_value(RUN_OPTION["inspect_tls"], inspect_tls, project))
    if not os.path.isdir(sandbox):
        raise UsageError(f"--sandbox: {sandbox!r} is not a directory (a workspace kept by run --keep-sandbox)")
    for where in (out, os.path.join(out, "runs")):
        if os.path.lexists(where) and not os.path.isdir(where):
            # The check's trace goes beneath it.
            raise UsageError(f"--out: {where!r} exists and is not a directory")
    from firstrun.sandbox.hostfs import check_workspace

    # Named by its flag here, before any backend could lend it to the sandbox uid.
    check_workspace(sandbox, os.environ, label="--sandbox")
    tasks = load_tasks([task_path])
    if len(tasks) != 1:
        raise UsageError(f"check: TASK must name one task file; {task_path!r} holds {len(tasks)}")
    if project is not None:
        tasks = apply_task_defaults(tasks, project.spec)
    from firstrun.run.check import recheck
    from firstrun.run.runner import RunConfig
    from firstrun.run.sandbox import check_inspection
    from firstrun.run.suite import EXIT_NO_EVIDENCE, suite_exit_code
    from firstrun.sandbox.select import inspecting_backend

    check_inspection(tasks, inspect_tls=inspect_tls, env=os.environ)
    backend = inspecting_backend(backend, inspect_tls=inspect_tls, flag="--backend")
    resolution = _resolve(backend, allow_unenforced, [tasks[0].spec.image or image], project)
    if isinstance(resolution, str):
        print(resolution, file=sys.stderr)
        return EXIT_NO_EVIDENCE
    config = RunConfig(out_dir=Path(out), backend=resolution.backend, chosen=resolution.chosen,
                       allow_unenforced=allow_unenforced, image=image, inspect_tls=inspect_tls)
    with signals_unwind():
        record = recheck(tasks[0], sandbox_dir=Path(sandbox), config=config,
                         allow_write=allow_write or (spec.allow_write if spec else ()))
    ran = "the check did not run" if record.check_exit is None else f"exit {record.check_exit}"
    print(f"check: {record.classification.value} ({record.reason}), {ran}{_detail(record)}")
    if record.check_output:
        print(record.check_output.rstrip("\n"))
    if record.trace:
        print(f"trace: {Path(out) / record.trace}")
    return suite_exit_code([record])
