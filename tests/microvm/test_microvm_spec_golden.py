"""Golden test: the QEMU argv of a micro-VM is pinned, device by device."""

from __future__ import annotations

from firstrun.sandbox.microvm import relay
from firstrun.sandbox.microvm.spec import (
    KERNEL_CMDLINE,
    TCG_CMDLINE,
    VmFiles,
    VmSpec,
    build_argv,
    guest_config,
)

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
