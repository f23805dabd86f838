#!/usr/bin/env python3
"""The gvisor backend against linux and docker: start to first command, per-command latency,
a bundled example's wall time, and memory per idle sandbox.

Guarantee: every figure is measured in this one process, backend after
backend, with the same profile and command: start to first command is
``Backend.start`` (launch and attestation, as a run pays it) plus the first
``exec(["true"])``, median of ``STARTS`` sessions; per-command latency is the
median ``exec(["true"])`` over ``RUNS`` commands in one session; the example
is ``firstrun run --example python-tabulate`` end to end (pip install from
PyPI through the proxy included), once per backend, with the system PATH;
memory is the resident set of runsc's processes for one session (sentry,
gofer and their helpers) with the sandbox idle. gVisor's start is also
given phase by phase (``StartPhases``, the median of each phase's length). Bars: start at most 400 ms, a command at most 10 ms,
the example at most 2.5 times linux's. Docker figures appear only where the
docker backend probes available.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STARTS = 3
RUNS = 30
START_LIMIT_MS = 400.0
COMMAND_LIMIT_MS = 10.0
EXAMPLE_BAR = 2.5
FIRSTRUN = Path(sys.executable).parent / "firstrun"


def _rss_kib_naming(text: str) -> int:
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if text.encode() not in (entry / "cmdline").read_bytes():
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def _measure(backend: Any, starts: int,
             runs: int) -> tuple[float, float, int | None, dict[str, float]]:
    """(median start-to-first-command s, median per-command s, idle KiB of a gVisor session,
    each start phase's median length s)."""
    from firstrun.policy.profile import SandboxProfile
    from firstrun.sandbox.hostfs import host_filesystem_policy

    start_samples, command_samples = [], []
    phases: dict[str, list[float]] = {}
    rss = None
    for i in range(starts):
        workspace = tempfile.mkdtemp(prefix="firstrun-bench-gvisor-")
        try:
            profile = SandboxProfile(fs=host_filesystem_policy(workspace, os.environ, protect=False))
            began = time.perf_counter()
            session = backend.start(profile, proxy=None)
            try:
                for phase, length in (session.start_phases.durations().items()
                                      if session.start_phases is not None else ()):
                    phases.setdefault(phase, []).append(length)
                if session.exec(["true"]).exit_code != 0:
                    raise RuntimeError(f"true failed on {backend.name}")
                start_samples.append(time.perf_counter() - began)
                if i == starts - 1:
                    for _ in range(runs):
                        t = time.perf_counter()
                        session.exec(["true"])
                        command_samples.append(time.perf_counter() - t)
                    if backend.name == "gvisor":
                        time.sleep(1.0)
                        sessions = os.listdir("/run/firstrun/gvisor")
                        rss = sum(_rss_kib_naming(s) for s in sessions)
            finally:
                session.close()
        finally:
            shutil.rmtree(workspace, ignore_errors=True)
    return (statistics.median(start_samples), statistics.median(command_samples), rss,
            {phase: statistics.median(lengths) for phase, lengths in phases.items()})


# The example's commands find python3 by PATH. A version manager's shim first
# on it (pyenv's is a bash script that starts a dozen processes per python3)
# multiplies process starts, which gVisor makes dear; a fresh Debian 12 has
# only the system directories, and so does this figure, for every backend.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _example_s(backend: str) -> float:
    with tempfile.TemporaryDirectory(prefix="firstrun-bench-example-") as out:
        began = time.perf_counter()
        done = subprocess.run([str(FIRSTRUN), "run", "--example", "python-tabulate",
                               "--backend", backend, "--out", out], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=900, check=False,
                              env={**os.environ, "PATH": SYSTEM_PATH})
        took = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"the example failed on {backend}: {done.stdout[-500:]}{done.stderr[-500:]}")
    return took


def main(starts: int = STARTS, runs: int = RUNS) -> dict[str, dict[str, object]]:
    from firstrun.sandbox.docker.backend import DockerBackend
    from firstrun.sandbox.gvisor import probe
    from firstrun.sandbox.gvisor.backend import GvisorBackend
    from firstrun.sandbox.linux.backend import LinuxBackend

    runsc = probe.find_runsc()
    if isinstance(runsc, str):
        raise RuntimeError(f"the gvisor backend cannot run here: {runsc}")
    platform = runsc.platform
    figures: dict[str, dict[str, object]] = {}
    linux_start, linux_cmd, _, _ = _measure(LinuxBackend(), starts, runs)
    figures["linux_start_to_first_command"] = {"value": linux_start * 1e3, "unit": "ms",
                                               "better": "lower"}
    figures["linux_exec_true"] = {"value": linux_cmd * 1e3, "unit": "ms", "better": "lower"}
    docker = DockerBackend()
    have_docker = all(c.available for c in docker.probe())
    if have_docker:
        docker_start, docker_cmd, _, _ = _measure(docker, starts, runs)
        figures["docker_start_to_first_command"] = {"value": docker_start * 1e3, "unit": "ms",
                                                    "better": "lower"}
        figures["docker_exec_true"] = {"value": docker_cmd * 1e3, "unit": "ms", "better": "lower"}
    gv_start, gv_cmd, rss, gv_phases = _measure(GvisorBackend(), starts, runs)
    figures[f"gvisor_{platform}_start_to_first_command"] = {
        "value": gv_start * 1e3, "unit": "ms", "better": "lower",
        "baseline": "linux_start_to_first_command", "limit": START_LIMIT_MS}
    figures[f"gvisor_{platform}_exec_true"] = {
        "value": gv_cmd * 1e3, "unit": "ms", "better": "lower", "baseline": "linux_exec_true",
        "limit": COMMAND_LIMIT_MS}
    for phase, length in gv_phases.items():
        figures[f"gvisor_{platform}_start_{phase}"] = {"value": length * 1e3, "unit": "ms",
                                                       "better": "lower"}
    figures[f"gvisor_{platform}_idle_rss"] = {"value": (rss or 0) / 1024, "unit": "MiB",
                                              "better": "lower"}
    figures["linux_example_python_tabulate"] = {"value": _example_s("linux"), "unit": "s",
                                                "better": "lower"}
    if have_docker:
        figures["docker_example_python_tabulate"] = {"value": _example_s("docker"), "unit": "s",
                                                     "better": "lower"}
    figures[f"gvisor_{platform}_example_python_tabulate"] = {
        "value": _example_s("gvisor"), "unit": "s", "better": "lower",
        "baseline": "linux_example_python_tabulate", "bar": EXAMPLE_BAR}
    return figures


if __name__ == "__main__":
    result = main()
    for name, fig in result.items():
        print(f"{name:45s} {fig['value']:10.1f} {fig['unit']}")
    sys.exit(0)
