"""A docker session's start checks only what it uses (a daemon that answers, root, the
image), never the sweep's whole probe again."""

from __future__ import annotations

import pytest

from firstrun.errors import SandboxUnavailable
from firstrun.sandbox.docker import backend as docker_backend
from firstrun.sandbox.docker.backend import DockerBackend
from support.profiles import make_profile

pytestmark = pytest.mark.usefixtures("docker_ready")


def test_a_start_asks_the_daemon_only_whether_it_answers(
        workspace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []
    probe_daemon = docker_backend.probe_daemon

    def recorded(env: object, *, judge: bool = True) -> object:
        asked.append(judge)
        return probe_daemon(env, judge=judge)  # type: ignore[arg-type]

    def refuse(self: DockerBackend) -> None:
        raise AssertionError("the start probed the backend in full")

    monkeypatch.setattr(docker_backend, "probe_daemon", recorded)
    monkeypatch.setattr(DockerBackend, "probe", refuse)
    with DockerBackend().start(make_profile(workspace), proxy=None) as session:
        assert session.exec("echo up", timeout=60).stdout.text() == "up\n"
    assert asked == [False]


def test_a_daemon_that_does_not_answer_refuses_the_start_naming_it(
        workspace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{workspace}/absent.sock")
    with pytest.raises(SandboxUnavailable) as refused:
        DockerBackend().start(make_profile(workspace), proxy=None)
    assert refused.value.args[0].startswith(f"docker daemon: no socket at {workspace}/absent.sock")
    assert refused.value.fix is not None and "dockerd" in refused.value.fix
