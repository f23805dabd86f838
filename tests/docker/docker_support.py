"""Support for tests against the real dockerd that scripts/test starts."""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import dataclass

from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.network import NetworkPolicy
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.docker.backend import HELPER_SOURCE, sidecar_lib_binds
from firstrun.sandbox.docker.resources import docker, harness_identity
from firstrun.sandbox.docker.topology import DockerHost, Topology, build_topology

IMAGE = "firstrun/python:3.11"


def lib_binds() -> tuple[tuple[str, str], ...]:
    return sidecar_lib_binds()


def make_topology(workspace: str, *, harness: str | None = None) -> tuple[SandboxProfile, Topology]:
    profile = SandboxProfile(fs=FilesystemPolicy(workspace=workspace),
                             net=NetworkPolicy.build(allow=["pypi.org"]))
    host = DockerHost(workspace=workspace, uid=1000, gid=1000, image=IMAGE, sidecar_image=IMAGE,
                      lib_binds=lib_binds(), harness=harness or harness_identity(),
                      helper_source=HELPER_SOURCE)
    return profile, build_topology(profile, session=uuid.uuid4().hex[:12], host=host)


def create(topology: Topology) -> None:
    for argv in topology.create:
        docker(*argv)


@dataclass
class Sidecar:
    process: subprocess.Popen[str]
    nonce: str
    ip: str

    def next_message(self) -> dict[str, object]:
        assert self.process.stdout is not None
        return json.loads(self.process.stdout.readline())


def start_sidecar(profile: SandboxProfile, topology: Topology) -> Sidecar:
    proc = subprocess.Popen(["docker", "start", "--attach", "--interactive", topology.sidecar],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"policy": profile.net.to_data()}))
    proc.stdin.close()
    ready = json.loads(proc.stdout.readline())
    assert ready["event"] == "ready", ready
    ip = docker("inspect", "--format",
                '{{(index .NetworkSettings.Networks "%s").IPAddress}}' % topology.internal_network,
                topology.sidecar).stdout.strip()
    return Sidecar(process=proc, nonce=str(ready["nonce"]), ip=ip)


def start_run(topology: Topology) -> subprocess.Popen[bytes]:
    """Start the run container attached, as the backend does: its helper (pid 1) runs
    until this process's stdin closes. Returns once the helper said ready."""
    proc = subprocess.Popen(["docker", "start", "--attach", "--interactive", topology.run],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    assert ready.get("ok"), ready
    return proc


def run_python(topology: Topology, source: str) -> subprocess.CompletedProcess[str]:
    # As the session's uid, like every command; the container's own user is the helper's.
    return docker("exec", "--user", "1000:1000", topology.run, "python3", "-I", "-c", source,
                  check=False)


def labelled(kind: str, session: str) -> list[str]:
    listing = ("ps", "--all") if kind == "container" else (kind, "ls")
    fmt = "{{.Names}}" if kind == "container" else "{{.Name}}"
    return docker(*listing, "--filter", f"label=org.firstrun.session={session}",
                  "--format", fmt).stdout.split()

