#!/usr/bin/env python3
"""How long ``firstrun sandbox`` and ``firstrun run`` take to stop when SIGTERM arrives
mid-command, per backend.

Guarantee: each figure is the median of a few real runs of the console
script: a command that would sleep for ten minutes is started (``sandbox``
runs it; ``run`` replays it as a task's documented step), SIGTERM is sent
once the command is running (a file it creates says so), and the time from
the signal to the CLI's exit is measured; teardown (the session killed, its
workspace given back, its containers and networks removed, the proxy
stopped, finished runs written) is inside that time. The baseline is the
same CLI running ``true`` start to finish in the same run, so a slow
machine shows in both. The limit is absolute: at most 2 seconds from the
signal to the exit.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRIALS = 3
LIMIT_S = 2.0
FIRSTRUN = Path(sys.executable).parent / "firstrun"


TASK = """\
name: bench-interrupt
goal: Wait.
docs:
  path: [https://docs.bench.test/]
  allow: [docs.bench.test]
replay:
  - touch {marker}; sleep 600
success:
  script: test -f {marker}
"""


def _stop_time(backend: str, command: str) -> float:
    """Seconds from SIGTERM to exit, for ``firstrun sandbox`` or ``firstrun run``."""
    workspace = tempfile.mkdtemp(prefix="firstrun-bench-term-")
    marker = os.path.join(workspace, "started")
    try:
        if command == "sandbox":
            argv = [str(FIRSTRUN), "sandbox", "--backend", backend, "--workspace", workspace,
                    "--", "sh", "-c", "touch started; sleep 600"]
        else:
            docs = os.path.join(workspace, "docs")
            os.mkdir(docs)
            with open(os.path.join(docs, "index.html"), "w") as f:
                f.write("<html><body><pre>sleep 600</pre></body></html>")
            task = os.path.join(workspace, "task.yaml")
            with open(task, "w") as f:
                f.write(TASK.format(marker="started"))
            out = os.path.join(workspace, "out")
            argv = [str(FIRSTRUN), "run", task, "--agent", "replay", "--backend", backend,
                    "--docs-mirror", f"docs.bench.test={docs}", "--out", out, "--keep-sandbox"]
            marker = os.path.join(out, "runs", "bench-interrupt", "1", "workspace", "started")
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not os.path.exists(marker):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{backend}: the command never started")
            time.sleep(0.01)
        signalled = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        return time.perf_counter() - signalled
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def _true_time(backend: str) -> float:
    started = time.perf_counter()
    subprocess.run([str(FIRSTRUN), "sandbox", "--backend", backend, "--", "true"], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def _backends() -> list[str]:
    found = ["linux"]
    if os.geteuid() == 0 and shutil.which("docker") and subprocess.run(
            ["docker", "info"], capture_output=True).returncode == 0:
        found.append("docker")
    return found


def main(trials: int = TRIALS) -> dict[str, dict[str, object]]:
    figures: dict[str, dict[str, object]] = {}
    for backend in _backends():
        whole = statistics.median(_true_time(backend) for _ in range(trials))
        figures[f"{backend}: sandbox -- true, start to exit"] = {
            "value": whole, "unit": "s", "better": "lower"}
        for command in ("sandbox", "run"):
            stop = statistics.median(_stop_time(backend, command) for _ in range(trials))
            figures[f"{backend}: {command}, SIGTERM mid-command to exit"] = {
                "value": stop, "unit": "s", "better": "lower", "limit": LIMIT_S,
                "baseline": f"{backend}: sandbox -- true, start to exit"}
    return figures


if __name__ == "__main__":
    for name, figure in main().items():
        print(f"{name}: {figure['value']:.3f} {figure['unit']}")
