"""Which directories may be a workspace: a pure decision, over hostile and ordinary paths."""

from __future__ import annotations

import pytest

from firstrun.policy.filesystem import workspace_refusal

HOMES = ("/root", "/home/ada")


@pytest.mark.parametrize("path", [
    "/tmp/firstrun-ws-abc", "/tmp/pytest-of-root/x", "/work/main", "/opt/project", "/srv/app",
    "/var/tmp/ws", "/home/ada/projects/site", "/root/src", "/mnt/data/repo",
    "/home/ada/.sshkeys-notes",  # a name that only starts like a secret
])
def test_project_directories_may_be_workspaces(path: str) -> None:
    assert workspace_refusal(path, HOMES) is None


@pytest.mark.parametrize("path, why", [
    ("/", "holds the host's /usr"),
    ("/tmp", "holds the host's /tmp"),
    ("/home", "holds the host's /home"),
    ("/var", "holds the host's /var"),
    ("/opt", "holds the host's /opt"),
    ("/usr/local/src/x", "inside the host's system tree /usr"),
    ("/etc/nginx", "inside the host's system tree /etc"),
    ("/proc/self", "inside the host's system tree /proc"),
    ("/sys/fs/cgroup", "inside the host's system tree /sys"),
    ("/dev/shm", "inside the host's system tree /dev"),
    ("/run/user/1000", "inside the host's system tree /run"),
    ("/root", "holds the host's /root"),
    ("/home/ada", "holds the home directory /home/ada"),
    ("/home/ada/.ssh", "inside /home/ada/.ssh, a secret location"),
    ("/root/.aws/cli", "inside /root/.aws, a secret location"),
    ("/home/ada/.config/gcloud/x", "inside /home/ada/.config/gcloud, a secret location"),
])
def test_host_trees_homes_and_secrets_are_refused_with_the_reason(path: str, why: str) -> None:
    refusal = workspace_refusal(path, HOMES)
    assert refusal is not None and why in refusal


def test_a_home_outside_the_usual_places_is_still_a_home() -> None:
    assert "home directory /data/users/bob" in (
        workspace_refusal("/data/users/bob", ("/data/users/bob",)) or "")
    assert "holds the home directory" in (workspace_refusal("/data", ("/data/users/bob",)) or "")
