#!/usr/bin/env python3
"""What a sweep costs over the commands it runs: runs per minute, and the harness's own CPU and memory.

Guarantee: every figure comes from this one process's measurements, taken one
after the other: the bundled python-tabulate example's replay commands and
success check run bare (``bash -c`` in a fresh directory with a fresh HOME,
no sandbox, no proxy), ``RUNS`` times in a loop cut into slices run before,
between and after the sweeps; and ``RUNS`` replay runs of the same example
through the real ``firstrun run`` on the linux backend with ``--workers`` 1,
2 and 4. Each sweep runs in a child process of
its own so its CPU time (user + system, every thread of the harness, none of
its children: bubblewrap and the commands are the bare loop's share) and
peak RSS are the harness's alone. A sweep in which any run did not pass is
an error, never a figure.

Harness overhead per run is the sweep's wall time per run minus the bare
loop's, with ``--workers 1`` (sequential against sequential, like for like);
the bar: under 1 second. With more workers the wall time per run can drop
below the bare loop's, so those overheads are shown, not judged. On a
machine shared with other work that figure moves with the load (the two
sides run minutes apart), so two steadier ones stand beside it: the
harness's CPU per run, and its in-run time per run (each run's duration
minus its commands' own durations, both from the run's trace: session
start and attestation, docs reads, the check's setup, teardown).

Both sides install tabulate from the package registry (the sandboxed runs
through the egress proxy), so each side makes ``RUNS`` small installs.
``RUNS`` is fixed at 20; the whole benchmark takes a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 20
WORKERS = (1, 2, 4)
OVERHEAD_LIMIT_S = 1.0
# One sweep's hang guard: 20 runs of a few seconds each, with room for a slow registry.
SWEEP_TIMEOUT_S = 1800


def _example():
    from firstrun.examples import find_example
    from firstrun.tasks.load import load_task

    return load_task(find_example("python-tabulate").task_path)


def _replay_commands(task) -> list[str]:
    """The commands ``replay: docs`` takes from the example's bundled pages, in route order."""
    from firstrun.agents.replay import docs_steps
    from firstrun.docs.blocks import extract
    from firstrun.examples import find_example

    docs = find_example("python-tabulate").docs_dir
    return [step.command for url in task.docs_route
            for step in docs_steps(extract((docs / url.rsplit("/", 1)[1]).read_text(), url=url),
                                   task.spec.replay_docs)]


def bare_loop(runs: int) -> float:
    """Seconds for ``runs`` bare runs: each replay command then the check, in a fresh directory."""
    from firstrun.run.check import build_check_script, check_port

    task = _example()
    check = build_check_script(task, port=check_port(task.name))
    start = time.perf_counter()
    for _ in range(runs):
        work = tempfile.mkdtemp(prefix="firstrun-bench-bare-")
        try:
            env = {**os.environ, "HOME": os.path.join(work, ".home"), "TMPDIR": work}
            os.mkdir(env["HOME"])
            for command in (*task.spec.setup, *_replay_commands(task), check):
                subprocess.run(["bash", "-c", command], cwd=work, env=env, check=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return time.perf_counter() - start


def _child(out: str, workers: int, runs: int, report: str) -> None:
    """In a fresh process: one sweep through the CLI, then this process's own rusage."""
    from firstrun.cli.main import main

    try:
        main(["run", "--example", "python-tabulate", "--backend", "linux", "--repeat", str(runs),
              "--workers", str(workers), "--out", out])
    except SystemExit as exc:
        code = exc.code
    usage = resource.getrusage(resource.RUSAGE_SELF)
    Path(report).write_text(json.dumps({
        "exit": code, "cpu_s": usage.ru_utime + usage.ru_stime, "maxrss_kb": usage.ru_maxrss,
    }))


def sweep(workers: int, runs: int) -> dict[str, float]:
    """Wall seconds, harness CPU seconds and harness peak RSS (MB) of one sweep of ``runs``."""
    root = tempfile.mkdtemp(prefix="firstrun-bench-sweep-")
    try:
        out, report = os.path.join(root, "out"), os.path.join(root, "rusage.json")
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, __file__, "--child", out, str(workers), str(runs), report],
            # cwd: a directory of its own, so no firstrun.yaml lying around is picked up.
            stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
            timeout=SWEEP_TIMEOUT_S, cwd=root)
        wall = time.perf_counter() - start
        measured = json.loads(Path(report).read_text()) if os.path.exists(report) else None
        runs_saved = json.loads(Path(out, "results.json").read_text())["runs"]
        passed = sum(r["classification"] == "passed" for r in runs_saved)
        if measured is None or measured["exit"] != 0 or passed != runs:
            raise RuntimeError(f"sweep --workers {workers}: {passed}/{runs} runs passed "
                               f"(exit {done.returncode}); {done.stdout[-2000:]}{done.stderr[-2000:]}")
        # Each run's own time outside its commands, from its trace: measured
        # inside the run, so load that came and went between the bare loop and
        # this sweep cannot move it.
        outside = 0.0
        for record in runs_saved:
            commands = 0.0
            with open(os.path.join(out, record["trace"]), encoding="utf-8") as trace:
                for line in trace:
                    event = json.loads(line)
                    if event.get("kind") == "command":
                        commands += float(event["duration_s"])
            outside += float(record["duration_s"]) - commands
        return {"wall_s": wall, "cpu_s": measured["cpu_s"], "rss_mb": measured["maxrss_kb"] / 1024,
                "outside_s": outside}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(runs: int = RUNS) -> dict[str, dict[str, object]]:
    if shutil.which("bwrap") is None:
        raise RuntimeError("bench_sweep needs bubblewrap (the linux backend)")
    # The bare loop runs in slices between the sweeps, so a machine shared
    # with other work loads both sides alike rather than whichever ran first.
    slices = [runs // (len(WORKERS) + 1)] * (len(WORKERS) + 1)
    slices[-1] += runs - sum(slices)
    bare_total = bare_loop(slices[0])
    swept: dict[int, dict[str, float]] = {}
    for workers, count in zip(WORKERS, slices[1:], strict=True):
        swept[workers] = sweep(workers, runs)
        bare_total += bare_loop(count)
    bare = bare_total / runs
    figures: dict[str, dict[str, object]] = {
        "bare_seconds_per_run": {"value": bare, "unit": "s", "better": "lower"},
        "bare_runs_per_minute": {"value": 60 / bare, "unit": "runs/min", "better": "higher"},
    }
    for workers, got in swept.items():
        per_run = got["wall_s"] / runs
        figures[f"w{workers}_runs_per_minute"] = {
            "value": 60 / per_run, "unit": "runs/min", "better": "higher",
            "baseline": "bare_runs_per_minute"}
        overhead: dict[str, object] = {"value": per_run - bare, "unit": "s", "better": "lower"}
        if workers == 1:
            overhead["limit"] = OVERHEAD_LIMIT_S
        figures[f"w{workers}_overhead_seconds_per_run"] = overhead
        figures[f"w{workers}_in_run_harness_seconds_per_run"] = {
            "value": got["outside_s"] / runs, "unit": "s", "better": "lower"}
        figures[f"w{workers}_harness_cpu_seconds_per_run"] = {
            "value": got["cpu_s"] / runs, "unit": "s", "better": "lower"}
        figures[f"w{workers}_harness_peak_rss"] = {
            "value": got["rss_mb"], "unit": "MB", "better": "lower"}
    return figures


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        sys.exit(0)
    figures = main()
    for name, fig in figures.items():
        print(f"{name:40s} {fig['value']:10.3f} {fig['unit']}")
    overhead = figures["w1_overhead_seconds_per_run"]["value"]
    print(f"harness overhead per run (--workers 1): {overhead:.3f} s "
          f"({'under' if overhead < OVERHEAD_LIMIT_S else 'NOT under'} {OVERHEAD_LIMIT_S} s)")
    sys.exit(0 if overhead < OVERHEAD_LIMIT_S else 1)
