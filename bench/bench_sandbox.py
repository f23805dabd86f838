#!/usr/bin/env python3
"""Per-command overhead of the linux sandbox, against bare exec and plain bwrap.

Guarantee: the three figures are medians of the same command (``true``),
measured in the same process one after the other, so the ratios compare like
with like. Bare exec is ``subprocess.run(["true"])``; plain bwrap is a fresh
``bwrap --ro-bind / / --unshare-all true`` per command (no extra layers);
firstrun is ``session.exec(["true"])`` in one attested session, which is how
an agent runs its commands. The bar: firstrun at most 1.5x plain bwrap.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

RUNS = 200
BAR = 1.5


def _median_s(fn, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(runs: int = RUNS) -> dict[str, dict[str, object]]:
    from firstrun.policy.profile import SandboxProfile
    from firstrun.sandbox.hostfs import host_filesystem_policy
    from firstrun.sandbox.linux.backend import LinuxBackend

    bwrap = shutil.which("bwrap")
    true = shutil.which("true")
    if bwrap is None or true is None:
        raise RuntimeError("bench_sandbox needs bwrap and true on PATH")
    bare = _median_s(lambda: subprocess.run([true], check=True), runs)
    plain = _median_s(
        lambda: subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-all", true], check=True),
        runs,
    )
    workspace = tempfile.mkdtemp(prefix="firstrun-bench-")
    try:
        profile = SandboxProfile(fs=host_filesystem_policy(workspace, os.environ, protect=False))
        with LinuxBackend().start(profile, proxy=None) as session:
            def one() -> None:
                if session.exec([true]).exit_code != 0:
                    raise RuntimeError("true failed inside the sandbox")
            firstrun = _median_s(one, runs)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return {
        "bare_exec_true": {"value": bare * 1e3, "unit": "ms", "better": "lower"},
        "plain_bwrap_true": {"value": plain * 1e3, "unit": "ms", "better": "lower",
                             "baseline": "bare_exec_true"},
        "firstrun_session_exec_true": {"value": firstrun * 1e3, "unit": "ms", "better": "lower",
                                       "baseline": ["plain_bwrap_true", "bare_exec_true"],
                                       "bar": BAR},
    }


if __name__ == "__main__":
    figures = main()
    for name, fig in figures.items():
        print(f"{name:30s} {fig['value']:8.3f} ms")
    firstrun = figures["firstrun_session_exec_true"]["value"]
    plain = figures["plain_bwrap_true"]["value"]
    bare = figures["bare_exec_true"]["value"]
    print(f"firstrun / plain bwrap: {firstrun / plain:.2f}x (bar {BAR}x)")
    print(f"firstrun / bare exec:   {firstrun / bare:.2f}x")
    sys.exit(0 if firstrun / plain <= BAR else 1)
