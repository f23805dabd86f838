#!/usr/bin/env python3
"""The microvm backend against linux and docker: boot to first command, per-command latency, memory.

Guarantee: every figure is measured in this one process, backend after
backend, with the same profile and the same command (``true``): boot to
first command is ``Backend.start`` (launch and attestation, as a run pays
it) plus the first ``exec``, median of ``BOOTS`` sessions; per-command
latency is the median ``session.exec(["true"])`` over ``RUNS`` commands in
one session; memory is QEMU's resident set (VmRSS) with the VM idle after
that. The accelerator (KVM, or TCG where KVM cannot run Debian's kernel)
is part of each microvm figure's name, so an emulated figure is never read
as a KVM one. Bars: per-command at most 3x linux; boot at most 250 ms.
Docker figures appear only where the docker backend probes available.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

BOOTS = 3
RUNS = 30
COMMAND_BAR = 3.0
BOOT_LIMIT_MS = 250.0


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _measure(backend: Any, boots: int, runs: int) -> tuple[float, float, Any]:
    """(median boot-to-first-command s, median per-command s, pid of the last VM or None)."""
    from firstrun.policy.profile import SandboxProfile
    from firstrun.sandbox.hostfs import host_filesystem_policy

    boot_samples, command_samples = [], []
    pid = None
    rss = None
    for i in range(boots):
        workspace = tempfile.mkdtemp(prefix="firstrun-bench-microvm-")
        try:
            profile = SandboxProfile(fs=host_filesystem_policy(workspace, os.environ, protect=False))
            start = time.perf_counter()
            session = backend.start(profile, proxy=None)
            try:
                if session.exec(["true"]).exit_code != 0:
                    raise RuntimeError(f"true failed on {backend.name}")
                boot_samples.append(time.perf_counter() - start)
                if i == boots - 1:
                    for _ in range(runs):
                        t = time.perf_counter()
                        session.exec(["true"])
                        command_samples.append(time.perf_counter() - t)
                    pid = getattr(session, "pid", None)
                    if pid is not None:
                        time.sleep(1.0)
                        rss = _rss_kib(pid)
            finally:
                session.close()
        finally:
            shutil.rmtree(workspace, ignore_errors=True)
    return statistics.median(boot_samples), statistics.median(command_samples), rss


def main(boots: int = BOOTS, runs: int = RUNS) -> dict[str, dict[str, object]]:
    from firstrun.sandbox.docker.backend import DockerBackend
    from firstrun.sandbox.linux.backend import LinuxBackend
    from firstrun.sandbox.microvm import probe
    from firstrun.sandbox.microvm.backend import MicrovmBackend

    accel = "kvm" if probe.kvm().available else "tcg"
    figures: dict[str, dict[str, object]] = {}
    linux_boot, linux_cmd, _ = _measure(LinuxBackend(), boots, runs)
    figures["linux_boot_to_first_command"] = {"value": linux_boot * 1e3, "unit": "ms",
                                              "better": "lower"}
    figures["linux_exec_true"] = {"value": linux_cmd * 1e3, "unit": "ms", "better": "lower"}
    docker = DockerBackend()
    if all(c.available for c in docker.probe()):
        docker_boot, docker_cmd, _ = _measure(docker, boots, runs)
        figures["docker_boot_to_first_command"] = {"value": docker_boot * 1e3, "unit": "ms",
                                                   "better": "lower"}
        figures["docker_exec_true"] = {"value": docker_cmd * 1e3, "unit": "ms",
                                       "better": "lower", "baseline": "linux_exec_true"}
    vm_boot, vm_cmd, rss = _measure(MicrovmBackend(accel=accel), boots, runs)
    figures[f"microvm_{accel}_boot_to_first_command"] = {
        "value": vm_boot * 1e3, "unit": "ms", "better": "lower",
        "baseline": "linux_boot_to_first_command", "limit": BOOT_LIMIT_MS}
    figures[f"microvm_{accel}_exec_true"] = {
        "value": vm_cmd * 1e3, "unit": "ms", "better": "lower", "baseline": "linux_exec_true",
        "bar": COMMAND_BAR}
    figures[f"microvm_{accel}_idle_rss"] = {"value": rss / 1024, "unit": "MiB",
                                            "better": "lower"}
    return figures


if __name__ == "__main__":
    result = main()
    for name, fig in result.items():
        print(f"{name:40s} {fig['value']:10.1f} {fig['unit']}")
    sys.exit(0)
