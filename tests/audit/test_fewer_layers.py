"""The audit's knob on the linux backend: a layer left out of ``required`` is not applied, and says so."""

from __future__ import annotations

import json

import pytest

from firstrun.errors import SandboxError
from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.profile import ALL_LAYERS, LayerName, SandboxProfile
from firstrun.sandbox.base import Enforcement, ProxyEndpoint
from firstrun.sandbox.linux.backend import LinuxBackend
from firstrun.sandbox.linux.spec import HostView, build_launch_spec, helper_config
from support.profiles import make_profile

FS = FilesystemPolicy(workspace="/HOST/ws", readonly=("/usr",), real_homes=("/root",))
HOST = HostView(directories=frozenset({"/usr", "/PY"}), interpreter="/PY/bin/python3",
                prefix="/PY")


def _argv(profile: SandboxProfile) -> list[str]:
    config = helper_config(profile, control_fd=3, dial_fd=None)
    return list(build_launch_spec(profile, host=HOST, helper_code="<HELPER>", config=config,
                                  seccomp_fd=None, stage_dir=None).argv)


def test_without_the_network_layer_only_unshare_net_goes() -> None:
    full = _argv(SandboxProfile(fs=FS))
    shared = _argv(SandboxProfile(fs=FS, required=ALL_LAYERS - {LayerName.NETWORK}))
    assert "--unshare-net" in full and "--unshare-net" not in shared
    assert [a for a in full if a != "--unshare-net"][:-1] == shared[:-1]
    assert {"--unshare-user", "--unshare-pid", "--disable-userns"} <= set(shared)


def test_landlock_left_out_is_not_even_attempted() -> None:
    config = helper_config(SandboxProfile(fs=FS, required=ALL_LAYERS - {LayerName.LANDLOCK}),
                           control_fd=3, dial_fd=None)
    assert config["landlock"]["apply"] is False and config["landlock"]["required"] is False
    # A run's profile (every layer required) applies and requires Landlock.
    full = helper_config(SandboxProfile(fs=FS), control_fd=3, dial_fd=None)
    assert full["landlock"]["apply"] is True and full["landlock"]["required"] is True


@pytest.mark.escape
def test_omitted_layers_are_really_absent_and_recorded(tmp_path) -> None:
    omitted = {LayerName.SECCOMP, LayerName.LANDLOCK, LayerName.NETWORK}
    profile = make_profile(str(tmp_path), required=ALL_LAYERS - omitted)
    with LinuxBackend().start(profile, proxy=None) as session:
        info = session.info
        status = session.exec("grep Seccomp: /proc/self/status; cat /proc/net/dev").stdout.text()
        oom = session.exec("echo 999 > /proc/self/oom_score_adj && cat /proc/self/oom_score_adj")
    assert info.enforcement is Enforcement.DOWNGRADED
    assert set(info.downgrades) == {layer.value for layer in omitted}
    applied = {layer.name: layer.applied for layer in info.layers}
    assert not any(applied[layer] for layer in omitted)
    assert applied[LayerName.NAMESPACES] and applied[LayerName.UNPRIVILEGED]
    # Evidence from the kernel, not the record: no filter, the host's
    # interfaces, and a /proc write Landlock would refuse went through.
    assert "Seccomp:\t0" in status
    assert len(status.splitlines()) > 4
    assert oom.stdout.text().strip() == "999"


def test_a_profile_without_the_network_layer_takes_no_proxy(tmp_path) -> None:
    profile = make_profile(str(tmp_path), required=ALL_LAYERS - {LayerName.NETWORK})
    with pytest.raises(SandboxError):
        LinuxBackend().start(profile, proxy=ProxyEndpoint(socket_path="/nonexistent", nonce="n"))


def test_the_full_profile_records_every_layer_applied(tmp_path) -> None:
    profile = make_profile(str(tmp_path))
    with LinuxBackend().start(profile, proxy=None) as session:
        info = session.info
    assert info.enforcement is Enforcement.ENFORCED and not info.downgrades
    assert all(layer.applied for layer in info.layers)
    assert json.dumps(info.to_data())
