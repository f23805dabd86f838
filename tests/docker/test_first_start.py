"""A Docker daemon's first start, for real: its own data root, exec root, socket and bridge.

CI's machine has run Docker before, so its daemon's default bridge already
records a gateway; a daemon starting for the first time does not (the IPAM
record has only the subnet until a restart, moby/moby#26799). This starts
one in network and mount namespaces of its own, so its ``docker0`` is its own
too and its mounts end with it, and asks it what the audit and the backend ask.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("dockerd") is None or shutil.which("unshare") is None,
    reason="a first start needs root, dockerd and unshare(1) (scripts/test installs them)")


@pytest.fixture
def fresh_daemon() -> Iterator[tuple[str, int]]:
    """(DOCKER_HOST, pid) of a daemon that has never run, in its own network namespace.

    Its roots are under a short /tmp path: containerd's socket lives in the
    exec root, and a Unix socket's path holds at most 107 bytes.
    """
    root = Path(tempfile.mkdtemp(prefix="frd-", dir="/tmp"))
    sock, pidfile = root / "docker.sock", root / "docker.pid"
    log = open(root / "log", "wb")  # noqa: SIM115 (closed below)
    launcher = subprocess.Popen(
        ["unshare", "--net", "--mount", "sh", "-c",
         f'ip link set lo up && exec dockerd --data-root "{root}/data" --exec-root '
         f'"{root}/exec" --pidfile "{pidfile}" --host "unix://{sock}"'],
        stdout=log, stderr=subprocess.STDOUT)
    host = f"unix://{sock}"
    try:
        deadline = time.monotonic() + 120
        while subprocess.run(["docker", "-H", host, "info"], capture_output=True).returncode:
            if launcher.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the fresh dockerd did not start: {(root / 'log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield host, int(pidfile.read_text())
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
            try:
                launcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                launcher.kill()
                launcher.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def test_the_bridge_gateway_is_found_on_a_daemons_first_start(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    host, pid = fresh_daemon
    ipam = json.loads(subprocess.run(
        ["docker", "-H", host, "network", "inspect", "bridge", "--format", "{{json .IPAM}}"],
        capture_output=True, text=True, check=True).stdout)
    # Control: this really is the first start the bug needs.
    assert ipam["Config"] and not ipam["Config"][0].get("Gateway"), ipam
    # The kernel's own answer, in the daemon's namespace.
    shown = subprocess.run(["nsenter", f"--target={pid}", "--net", "ip", "-4", "-o", "addr",
                            "show", "dev", "docker0"], capture_output=True, text=True,
                           check=True).stdout
    kernel = shown.split()[3].split("/")[0]
    # What the audit asks, asked where that daemon's bridge is.
    found = subprocess.run(
        ["nsenter", f"--target={pid}", "--net", sys.executable, "-c",
         "from firstrun.audit.battery import docker_bridge_address; print(docker_bridge_address())"],
        capture_output=True, text=True, env={**os.environ, "DOCKER_HOST": host})
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == kernel
