"""host_filesystem_policy over a real (temporary) directory tree."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from firstrun.policy.filesystem import SYSTEM_READONLY
from firstrun.sandbox.hostfs import host_filesystem_policy


@pytest.fixture
def fake_home() -> Iterator[str]:
    home = tempfile.mkdtemp(prefix="firstrun-hostfs-")
    for d in (".pyenv/shims", ".pyenv/versions", ".local/bin", ".cargo/bin", ".ssh", "src/bin"):
        os.makedirs(os.path.join(home, d))
    for f in (".cargo/credentials.toml", ".ssh/id_ed25519", "corp-ca.pem"):
        open(os.path.join(home, f), "w").close()
    yield home
    shutil.rmtree(home)


def test_policy_exposes_toolchains_hides_secrets_and_lists_homes(fake_home: str) -> None:
    ca = os.path.join(fake_home, "corp-ca.pem")
    env = {
        "HOME": fake_home,
        "PATH": ":".join([f"{fake_home}/.pyenv/shims", f"{fake_home}/.local/bin",
                          f"{fake_home}/.cargo/bin", f"{fake_home}/.ssh", "/usr/bin",
                          "relative/bin", f"{fake_home}/missing/bin"]),
        "SSL_CERT_FILE": ca,
        "REQUESTS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",
    }
    policy = host_filesystem_policy(f"{fake_home}/src", env, protect=False)
    assert policy.workspace == os.path.realpath(f"{fake_home}/src")
    extra = [p for p in policy.readonly if p not in SYSTEM_READONLY]
    assert extra == [f"{fake_home}/.pyenv/shims", f"{fake_home}/.pyenv/versions",
                     f"{fake_home}/.local/bin", f"{fake_home}/.cargo/bin", ca]
    # A PATH entry inside a secret location (~/.ssh) exposes nothing; a
    # toolchain is lent by its programs, so ~/.cargo/credentials.toml is never bound.
    assert policy.hidden == ()
    assert policy.toolchain_env == (("PYENV_ROOT", f"{fake_home}/.pyenv"),)
    assert fake_home in policy.real_homes and "/root" in policy.real_homes
    assert all(os.path.lexists(p) for p in policy.readonly)


def test_every_home_directory_is_a_real_home(fake_home: str) -> None:
    homes = host_filesystem_policy(f"{fake_home}/src", {"HOME": fake_home}, protect=False).real_homes
    for name in os.listdir("/home"):
        if os.path.isdir(os.path.join("/home", name)):
            assert os.path.realpath(os.path.join("/home", name)) in homes
