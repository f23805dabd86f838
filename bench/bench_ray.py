#!/usr/bin/env python3
"""A sweep on a Ray cluster against the same sweep run locally: harness time per run, scheduling latency, runs per minute.

Guarantee: every figure comes from this one process's measurements, taken one
after the other at the same total concurrency: ``RUNS`` replay runs of the
bundled python-tabulate example through the real ``firstrun run`` on the
linux backend, first locally with ``--workers 2``, then with ``--engine ray``
on a real two-node Ray cluster on loopback (a head that runs nothing and two
worker nodes of one CPU each, every component bound to 127.0.0.1) with
``--workers 2``. The cluster is up for both sweeps, so its idle daemons load
both sides alike. Each sweep is a child process of its own with a timeout; a
sweep in which any run did not pass is an error, never a figure.

Harness time per run is measured the way ``bench_sweep.py`` measures it
inside each run: the run's duration minus its commands' own durations, both
from the run's trace (session start and attestation, docs reads, the check's
setup, teardown), so load that comes and goes between the two sweeps does not
move it. The bar: under Ray it is at most 1.2 times local. Beside it, shown
and not judged: each sweep's wall time per run (the Ray side includes joining
the cluster, probing its nodes and carrying each run's record and trace
back), and the Ray harness time plus each run's scheduling. To say where a
sweep's wall time goes, both sides also show the CLI's launch to its first
run (or submit), the last run's end to the CLI's exit, each run's duration and
its commands' share of it, and a worker slot's time outside any run per run
(``2 x`` the sweep's wall time less the runs' durations, over ``RUNS``).

Scheduling latency is per Ray run, from the driver's submit of its Ray task
(``extra.ray.submitted_at``) to its sandbox's start (the trace's
``sandbox_started``), and the node-side part of it, submit to the task's
start on its node (``extra.ray.scheduled_s``); median and max of ``RUNS``.
The local baseline for the first is each run's own start to its sandbox's
start (a local run has no submit). Driver and nodes share this machine's
clock.

Both sides install tabulate from the package registry through the sandbox's
egress proxy, ``RUNS`` small installs each. ``RUNS`` is fixed at 24; the whole
benchmark takes about five minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

RUNS = 24
# Total concurrency of both sweeps: local --workers 2; Ray 2 nodes x 1 CPU, --workers 2.
NODES = 2
CONCURRENCY = 2
HARNESS_BAR = 1.2
# One sweep's hang guard: 24 runs of ten seconds or so, two at a time, with room for a slow registry.
SWEEP_TIMEOUT_S = 1800
FIRSTRUN = Path(sys.executable).parent / "firstrun"
LOOPBACK = "127.0.0.1"
# Ray's own address lookups answer loopback too, so nothing listens beyond 127.0.0.1.
RAY_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@contextmanager
def loopback_cluster(nodes: int) -> Iterator[str]:
    """The address of a Ray cluster on 127.0.0.1: a head with no CPU and ``nodes`` one-CPU nodes."""
    try:
        from ray import cluster_utils
    except ImportError as exc:
        raise RuntimeError(f"bench_ray needs Ray ({exc.name}): pip install 'firstrun[ray]'") from None
    saved = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    os.environ.update(RAY_LOOPBACK_ENV)
    # Short: Ray's socket paths live beneath it.
    temp = tempfile.mkdtemp(prefix="ray-")
    cluster = None
    try:
        cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={
            "node_ip_address": LOOPBACK, "num_cpus": 0, "include_dashboard": False,
            "temp_dir": temp})
        for _ in range(nodes):
            cluster.add_node(node_ip_address=LOOPBACK, num_cpus=1)
        cluster.wait_for_nodes()
        yield str(cluster.address)
    finally:
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        if saved is None:
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = saved


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def sweep(label: str, engine: list[str], runs: int) -> dict[str, Any]:
    """Wall seconds of one sweep of ``runs`` and, per run, what its record and trace say."""
    root = tempfile.mkdtemp(prefix="firstrun-bench-ray-")
    try:
        out = os.path.join(root, "out")
        launched, start = time.time(), time.perf_counter()
        done = subprocess.run(
            [str(FIRSTRUN), "run", "--example", "python-tabulate", "--backend", "linux",
             "--repeat", str(runs), "--workers", str(CONCURRENCY), *engine, "--out", out],
            # cwd: a directory of its own, so no firstrun.yaml lying around is picked up.
            stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
            timeout=SWEEP_TIMEOUT_S, cwd=root, env={**os.environ, **RAY_LOOPBACK_ENV})
        wall = time.perf_counter() - start
        ended = launched + wall
        results = os.path.join(out, "results.json")
        records = json.loads(Path(results).read_text())["runs"] if os.path.exists(results) else []
        passed = sum(r["classification"] == "passed" for r in records)
        if done.returncode != 0 or passed != runs or len(records) != runs:
            raise RuntimeError(f"{label} sweep: {passed}/{runs} runs passed (exit {done.returncode}); "
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        per_run = []
        for record in records:
            commands, sandbox_at = 0.0, None
            with open(os.path.join(out, record["trace"]), encoding="utf-8") as trace:
                for line in trace:
                    event = json.loads(line)
                    if event.get("kind") == "command":
                        commands += float(event["duration_s"])
                    elif event.get("kind") == "sandbox_started" and sandbox_at is None:
                        sandbox_at = _ts(event["ts"])
            if sandbox_at is None:
                raise RuntimeError(f"{label} sweep: {record['trace']} has no sandbox_started")
            per_run.append({"outside_s": float(record["duration_s"]) - commands,
                            "commands_s": commands, "duration_s": float(record["duration_s"]),
                            "started_at": _ts(record["started_at"]), "sandbox_at": sandbox_at,
                            "node": record.get("node"),
                            "ray": (record.get("extra") or {}).get("ray")})
        return {"wall_s": wall, "launched": launched, "ended": ended, "runs": per_run}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _vs_local(side: str, figure: str) -> dict[str, str]:
    return {} if side == "local" else {"baseline": f"local_{figure}"}


def main(runs: int = RUNS) -> dict[str, dict[str, object]]:
    if shutil.which("bwrap") is None:
        raise RuntimeError("bench_ray needs bubblewrap (the linux backend)")
    with loopback_cluster(NODES) as address:
        local = sweep("local", [], runs)
        on_ray = sweep("ray", ["--engine", "ray", "--ray-address", address], runs)
    placed = [r["ray"] for r in on_ray["runs"]]
    if any(p is None for p in placed):
        raise RuntimeError("ray sweep: a run's record has no extra.ray")
    nodes = Counter(r["node"] for r in on_ray["runs"])
    if len(nodes) != NODES:
        raise RuntimeError(f"ray sweep: runs were carried out on {len(nodes)} node(s), not {NODES}: "
                           f"{dict(nodes)}")
    submit_to_sandbox = [r["sandbox_at"] - _ts(r["ray"]["submitted_at"]) for r in on_ray["runs"]]
    scheduled = [float(p["scheduled_s"]) for p in placed]
    start_to_sandbox = [r["sandbox_at"] - r["started_at"] for r in local["runs"]]
    local_harness = sum(r["outside_s"] for r in local["runs"]) / runs
    ray_harness = sum(r["outside_s"] for r in on_ray["runs"]) / runs

    figures: dict[str, dict[str, object]] = {}
    for name, got in (("local", local), ("ray", on_ray)):
        figures[f"{name}_sweep_wall"] = {"value": got["wall_s"], "unit": "s", "better": "lower",
                                         **_vs_local(name, "sweep_wall")}
        figures[f"{name}_runs_per_minute"] = {
            "value": 60 * runs / got["wall_s"], "unit": "runs/min", "better": "higher",
            **_vs_local(name, "runs_per_minute")}
        figures[f"{name}_wall_seconds_per_run"] = {
            "value": got["wall_s"] / runs, "unit": "s", "better": "lower",
            **_vs_local(name, "wall_seconds_per_run")}
        # Where a sweep's wall time goes beside its runs: the CLI's start (and under
        # Ray joining the cluster and probing its nodes) before the first run
        # starts (or is submitted), what follows the last run's end, and the runs'
        # own commands, which share the 2 cores with whatever else runs.
        first = min(_ts(r["ray"]["submitted_at"]) if r["ray"] else r["started_at"]
                    for r in got["runs"])
        last = max(r["started_at"] + r["duration_s"] for r in got["runs"])
        figures[f"{name}_launch_to_first_run"] = {
            "value": first - got["launched"], "unit": "s", "better": "lower",
            **_vs_local(name, "launch_to_first_run")}
        figures[f"{name}_last_run_end_to_exit"] = {
            "value": got["ended"] - last, "unit": "s", "better": "lower",
            **_vs_local(name, "last_run_end_to_exit")}
        figures[f"{name}_run_duration_per_run"] = {
            "value": sum(r["duration_s"] for r in got["runs"]) / runs, "unit": "s",
            "better": "lower", **_vs_local(name, "run_duration_per_run")}
        # A worker slot's time outside any run, per run: launch, tail, and the gaps
        # between one run's end and the next one's start in the same slot.
        figures[f"{name}_idle_slot_seconds_per_run"] = {
            "value": (CONCURRENCY * got["wall_s"] - sum(r["duration_s"] for r in got["runs"])) / runs,
            "unit": "s", "better": "lower", **_vs_local(name, "idle_slot_seconds_per_run")}
        figures[f"{name}_commands_seconds_per_run"] = {
            "value": sum(r["commands_s"] for r in got["runs"]) / runs, "unit": "s",
            "better": "lower", **_vs_local(name, "commands_seconds_per_run")}
    figures["local_in_run_harness_seconds_per_run"] = {
        "value": local_harness, "unit": "s", "better": "lower"}
    figures["ray_in_run_harness_seconds_per_run"] = {
        "value": ray_harness, "unit": "s", "better": "lower",
        "baseline": "local_in_run_harness_seconds_per_run", "bar": HARNESS_BAR}
    figures["ray_in_run_harness_plus_scheduling_per_run"] = {
        "value": ray_harness + sum(scheduled) / runs, "unit": "s", "better": "lower",
        "baseline": "local_in_run_harness_seconds_per_run"}
    figures["local_start_to_sandbox_median"] = {
        "value": statistics.median(start_to_sandbox), "unit": "s", "better": "lower"}
    figures["local_start_to_sandbox_max"] = {
        "value": max(start_to_sandbox), "unit": "s", "better": "lower"}
    figures["ray_submit_to_sandbox_median"] = {
        "value": statistics.median(submit_to_sandbox), "unit": "s", "better": "lower",
        "baseline": "local_start_to_sandbox_median"}
    figures["ray_submit_to_sandbox_max"] = {
        "value": max(submit_to_sandbox), "unit": "s", "better": "lower",
        "baseline": "local_start_to_sandbox_max"}
    figures["ray_scheduled_median"] = {
        "value": statistics.median(scheduled), "unit": "s", "better": "lower"}
    figures["ray_scheduled_max"] = {"value": max(scheduled), "unit": "s", "better": "lower"}
    for i, count in enumerate(sorted(nodes.values(), reverse=True)):
        figures[f"ray_runs_on_node_{i + 1}"] = {"value": count, "unit": "runs", "better": "higher"}
    return figures


if __name__ == "__main__":
    result = main()
    met = True
    for name, fig in result.items():
        text = f"{name:45s} {float(fig['value']):10.3f} {fig['unit']}"
        if "baseline" in fig:
            ratio = float(fig["value"]) / float(result[str(fig["baseline"])]["value"])
            text += f"  {ratio:5.2f}x {fig['baseline']}"
            if "bar" in fig:
                ok = ratio <= float(fig["bar"])
                met &= ok
                text += f"  [bar <= {float(fig['bar']):.2f}x: {'met' if ok else 'MISSED'}]"
        print(text)
    sys.exit(0 if met else 1)
