"""Golden tests: the QEMU argv of a micro-VM is pinned device by device, and its whole launch plan."""

from __future__ import annotations

import json
import os
from pathlib import Path

from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.process import SANDBOX_CA_BUNDLE, Limits
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.base import ProxyEndpoint
from firstrun.sandbox.microvm import relay
from firstrun.sandbox.microvm.spec import (
    KERNEL_CMDLINE,
    TCG_CMDLINE,
    MicrovmFacts,
    VmFiles,
    VmSpec,
    build_argv,
    guest_config,
    prepare,
)

GOLDEN = Path(__file__).parent / "golden"

FILES = VmFiles(kernel_fd=3, initramfs_fd=4, rootfs_fd=5, workspace_fd=6, channel_fd=7)

BASE = [
    "/usr/bin/qemu-system-x86_64",
    "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
    "-machine", "microvm,rtc=on,acpi=on,pcie=off",
    "-accel", "kvm",
    "-cpu", "host",
    "-smp", "1",
    "-m", "1184",
    "-kernel", "/proc/self/fd/3",
    "-initrd", "/proc/self/fd/4",
    "-append", KERNEL_CMDLINE,
    "-serial", "stdio",
    "-fsdev", "local,id=root,path=/proc/self/fd/5,security_model=none,readonly=on",
    "-device", "virtio-9p-device,fsdev=root,mount_tag=root",
    "-fsdev", "local,id=workspace,path=/proc/self/fd/6,security_model=none",
    "-device", "virtio-9p-device,fsdev=workspace,mount_tag=workspace",
    "-chardev", "socket,id=agent,fd=7",
    "-device", "virtio-serial-device,max_ports=2",
    "-device", "virtserialport,chardev=agent,nr=1,name=firstrun.agent",
]


def test_no_proxy_means_no_nic() -> None:
    spec = VmSpec(qemu="/usr/bin/qemu-system-x86_64", accel="kvm", memory_mib=1184,
                  files=FILES, relay=None)
    assert build_argv(spec) == BASE


def test_proxy_is_the_only_forward_of_a_restricted_nic() -> None:
    spec = VmSpec(qemu="/usr/bin/qemu-system-x86_64", accel="kvm", memory_mib=1184,
                  files=FILES, relay=("/usr/bin/python3", "-c", "'a,b'", "name"))
    assert build_argv(spec) == [
        *BASE,
        "-netdev", ("user,id=net0,restrict=on,ipv6=off,net=10.0.2.0/24,host=10.0.2.2,"
                    "dns=10.0.2.3,guestfwd=tcp:10.0.2.100:3128-cmd:/usr/bin/python3 -c 'a,,b' name"),
        "-device", "virtio-net-device,netdev=net0",
    ]


def test_tcg_emulates_a_cpu_model_not_the_host() -> None:
    spec = VmSpec(qemu="q", accel="tcg", memory_mib=256, files=FILES, relay=None)
    argv = build_argv(spec)
    assert argv[argv.index("-accel") + 1] == "tcg,tb-size=64"
    assert argv[argv.index("-cpu") + 1] == "max"
    assert argv[argv.index("-append") + 1] == f"{KERNEL_CMDLINE} {TCG_CMDLINE}"


def test_relay_program_fits_in_a_forward() -> None:
    # QEMU cuts a long guestfwd command short (a relay of 1 KiB was cut).
    argv = relay.command("/usr/bin/python3", "firstrun-microvm-0123456789abcdef")
    assert len(" ".join(argv)) < 512


def test_guest_config_has_no_network_without_a_proxy() -> None:
    config = guest_config(uid=1000, gid=1000, workspace="/workspace", home="/home/sandbox",
                          real_homes=("/root",), tmpfs_bytes=1 << 30,
                          limits={"pids": 64, "open_files": 128}, seccomp="", ca_bundle="",
                          network=False)
    assert config["net"] is None
    assert config["real_homes"] == ["/root"]


PROFILE = SandboxProfile(
    fs=FilesystemPolicy(workspace="/HOST/ws", real_homes=("/root",), protected=((".git", "dir"),)),
    limits=Limits(pids=256, memory_bytes=1 << 30, open_files=2048),
)


def _facts(**overrides: object) -> MicrovmFacts:
    facts = {
        "qemu": "/usr/bin/qemu-system-x86_64", "accel": "kvm",
        "launcher_python": "/usr/bin/python3", "launcher_source": "<LAUNCHER>",
        "harness_pid": 4242, "uid": 1600000001, "gid": 1600000001, "files": FILES,
        "relay": None, "seccomp": b"BPF", "ca_bundle": b"CERTS",
        "host_env": {"PATH": "/HOME/.cargo/bin:/usr/bin", "SSL_CERT_FILE": "/CA/corp.pem",
                     "OPENAI_API_KEY": "sk-never"},
    }
    facts.update(overrides)
    return MicrovmFacts(**facts)  # type: ignore[arg-type]


def _plan_golden(name: str, data: dict) -> None:
    data = json.loads(json.dumps(data))
    path = GOLDEN / name
    if os.environ.get("FIRSTRUN_UPDATE_GOLDEN"):
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert data == json.loads(path.read_text())


def test_the_plan_without_a_proxy_has_no_nic_and_names_no_proxy() -> None:
    plan = prepare(PROFILE, None, _facts())
    # The launcher, told the harness's pid, execs exactly the pinned QEMU argv.
    assert plan.argv[:6] == ("/usr/bin/python3", "-I", "-S", "-c", "<LAUNCHER>", "4242")
    assert list(plan.argv[6:]) == BASE
    assert plan.pass_fds == (3, 4, 5, 6, 7)
    assert plan.qemu_env == {"PATH": "/HOME/.cargo/bin:/usr/bin"}
    assert plan.config["net"] is None
    assert (plan.config["seccomp"], plan.config["ca_bundle"]) == ("QlBG", "Q0VSVFM=")
    # The host's CA variable names the guest's one bundle; no key, no proxy variable.
    assert plan.env["SSL_CERT_FILE"] == plan.config["ca_path"] == SANDBOX_CA_BUNDLE
    assert "OPENAI_API_KEY" not in plan.env and "http_proxy" not in plan.env
    assert (plan.attest.network, plan.attest.nonce, plan.attest.host_alias) == (
        "loopback_only", None, None)
    _plan_golden("microvm_plan_no_proxy.json", plan.to_data())


def test_the_plan_with_a_proxy_forwards_one_address_to_the_relay() -> None:
    plan = prepare(PROFILE, ProxyEndpoint(socket_path="/run/p.sock", nonce="n1"),
                   _facts(accel="tcg", relay=relay.command("/usr/bin/python3", "firstrun-microvm-x")))
    assert plan.env["http_proxy"] == "http://10.0.2.100:3128"
    assert plan.config["net"] == {"interface": "eth0", "address": "10.0.2.15",
                                  "netmask": "255.255.255.0"}
    assert (plan.attest.network, plan.attest.nonce, plan.attest.host_alias) == (
        "user_restricted", "n1", "10.0.2.2")
    assert plan.argv[plan.argv.index("-m") + 1] == "1184"
    _plan_golden("microvm_plan_proxy.json", plan.to_data())
