"""The daemon probe: the CVE-2024-29018 judgement (pure) and a real answer from dockerd."""

from __future__ import annotations

import os

import pytest

from firstrun.sandbox.docker.probe import dns_leak_fixed, engine_version, probe_daemon
from firstrun.sandbox.docker.resources import docker


@pytest.mark.parametrize(("text", "fixed"), [
    ("20.10.24+dfsg1", False),
    ("23.0.10", False),
    ("23.0.11", True),
    ("24.0.9", False),
    ("25.0.4", False),
    ("25.0.5", True),
    ("26.0.0", True),
    ("28.2.2", True),
])
def test_dns_leak_fix_by_engine_version(text: str, fixed: bool) -> None:
    version = engine_version(text)
    assert version is not None
    assert dns_leak_fixed(version) is fixed


def test_unreadable_version() -> None:
    assert engine_version("dev") is None


@pytest.mark.usefixtures("docker_ready")
def test_the_running_daemon_answers_with_its_version() -> None:
    cap = probe_daemon(os.environ)
    assert cap.available, cap
    server = docker("version", "--format", "{{.Server.Version}}").stdout.strip()
    assert f"Engine {server}," in cap.detail
    version = engine_version(server)
    assert version is not None
    assert ("has the CVE-2024-29018 fix" in cap.detail) is dns_leak_fixed(version)


def test_a_missing_socket_and_a_remote_host_are_reported_with_fixes(tmp_path) -> None:
    cap = probe_daemon({"DOCKER_HOST": f"unix://{tmp_path}/absent.sock"})
    assert not cap.available and cap.fix is not None and "no socket" in cap.detail
    cap = probe_daemon({"DOCKER_HOST": "tcp://192.0.2.1:2375"})
    assert not cap.available and "not dialled" in cap.detail
