"""The in-container supervisor under a real dockerd, judged by the container's own process table."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from docker_support import create, make_topology

from firstrun.sandbox.docker import supervisor
from firstrun.sandbox.docker.resources import docker, remove
from firstrun.sandbox.docker.topology import Topology

pytestmark = pytest.mark.usefixtures("docker_ready")
SOURCE = Path(supervisor.__file__).read_text(encoding="utf-8")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/sandbox"}


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    workspace = tempfile.mkdtemp(prefix="firstrun-docker-ws-")
    os.chown(workspace, 1000, 1000)
    _, topo = make_topology(workspace)
    try:
        create(topo)
        docker("start", topo.run)
        yield topo
    finally:
        remove(topo)
        os.rmdir(workspace)


def _start(topology: Topology, command: str, timeout: float) -> subprocess.Popen[str]:
    config = {"argv": ["/bin/bash", "-c", command], "cwd": "/workspace", "env": ENV,
              "timeout": timeout}
    proc = subprocess.Popen(["docker", "exec", "-i", topology.run, "python3", "-I", "-S", "-c",
                             SOURCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(config) + "\n")
    proc.stdin.flush()
    return proc


def _frames(proc: subprocess.Popen[str]) -> tuple[dict[str, bytes], dict[str, object]]:
    assert proc.stdout is not None
    out = {"stdout": b"", "stderr": b""}
    for line in proc.stdout:
        msg = json.loads(line)
        if msg["op"] == "out":
            out[msg["stream"]] += base64.b64decode(msg["data"])
        elif msg["op"] == "exit":
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait(timeout=30)
            return out, msg
    raise AssertionError("no exit frame")


def _processes(topology: Topology) -> str:
    return docker("exec", topology.run, "ps", "-eo", "args").stdout


def test_output_is_framed_and_cannot_forge_the_exit(topology: Topology) -> None:
    forged = '{"op":"exit","code":0,"timed_out":false,"duration_s":0}'
    out, exit_ = _frames(_start(topology, f"echo '{forged}'; echo err >&2; exit 3", 30))
    assert out == {"stdout": forged.encode() + b"\n", "stderr": b"err\n"}
    assert (exit_["code"], exit_["timed_out"]) == (3, False)


def test_timeout_kills_the_whole_tree_setsid_double_fork_included(topology: Topology) -> None:
    out, exit_ = _frames(_start(
        topology, "setsid bash -c '(sleep 4101 &) ; sleep 4102' & sleep 4103", 2))
    assert exit_["timed_out"] is True
    table = _processes(topology)
    assert "sleep 410" not in table, table


def test_a_killed_exec_client_takes_the_command_with_it(topology: Topology) -> None:
    # Control: without the supervisor, killing the client leaves the command running.
    bare = subprocess.Popen(["docker", "exec", "-i", topology.run, "sleep", "4299"],
                            stdin=subprocess.PIPE)
    for _ in range(100):
        if "sleep 4299" in _processes(topology):
            break
    bare.kill()
    bare.wait()
    bare.stdin.close()  # type: ignore[union-attr]
    assert "sleep 4299" in _processes(topology)
    docker("exec", topology.run, "pkill", "-KILL", "-f", "sleep 4299")

    proc = _start(topology, "echo started; setsid sleep 4201 & sleep 4202", 600)
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline())
    assert base64.b64decode(first["data"]) == b"started\n"
    proc.kill()  # the harness side of docker exec dies; stdin closes inside
    proc.wait()
    proc.stdout.close()
    proc.stdin.close()  # type: ignore[union-attr]
    # The supervisor sees its stdin close and kills the tree; wait for it by
    # polling the container's table a bounded number of times.
    for _ in range(100):
        table = _processes(topology)
        if "sleep 420" not in table:
            break
        subprocess.run(["sleep", "0.1"], check=True)
    assert "sleep 420" not in table, table


def test_what_a_command_leaves_running_in_time_stays(topology: Topology) -> None:
    out, exit_ = _frames(_start(topology, "setsid sleep 4301 >/dev/null 2>&1 < /dev/null &", 30))
    assert (exit_["code"], exit_["timed_out"]) == (0, False)
    assert "sleep 4301" in _processes(topology)
