"""The micro-VM's launch, as data: the QEMU command line and the guest's configuration.

Guarantee: the VM has exactly the devices listed here and nothing QEMU would
add by default (``-nodefaults -no-user-config``, no display, no option ROM
beyond the kernel loader): two read-only-or-workspace 9p shares, one
virtio-serial port for the agent, and, only when a proxy is given, one
virtio-net NIC on user-mode networking with ``restrict=on`` whose only way
out is a ``guestfwd`` of one guest address and port to a relay command that
reaches the harness's egress proxy. No host port is forwarded into the guest,
no DNS server or default route is given to it, and the guest's memory is the
session's memory cap. Every host file QEMU opens is named
``/proc/self/fd/N`` of a descriptor the harness opened: QEMU, running as an
unprivileged uid, needs no path to the cache or the workspace.

Pure: builds data; ``build_argv`` is golden-tested.
"""

from __future__ import annotations

from dataclasses import dataclass

from firstrun.policy.process import SANDBOX_CA_BUNDLE

# The guest's network: one on-link subnet, the guest's address in it, and the
# forwarded address where the proxy answers. 10.0.2.0/24 is user-mode
# networking's own subnet; with restrict=on nothing in it but the forward answers.
GUEST_NET = "10.0.2.0/24"
GUEST_ADDRESS = "10.0.2.15"
GUEST_NETMASK = "255.255.255.0"
GUEST_INTERFACE = "eth0"
PROXY_ADDRESS = "10.0.2.100"
PROXY_PORT = 3128
# Where the host's loopback appears in user-mode networking (unreachable with restrict=on).
HOST_ALIAS = "10.0.2.2"
DNS_ALIAS = "10.0.2.3"

SANDBOX_TMP = "/tmp"

# The guest kernel's command line; ``panic=-1 reboot=t`` turn a dead init
# into a VM that exits at once.
KERNEL_CMDLINE = ("console=ttyS0 quiet loglevel=3 reboot=t panic=-1 edd=off 8250.nr_uarts=1 "
                  "random.trust_cpu=on")
# Under emulation the machine model offers no reference clock to calibrate
# the TSC against, and the kernel hangs in the attempt: state a frequency.
# Under KVM, kvmclock keeps time and these would only be wrong.
TCG_CMDLINE = "tsc=reliable no_timer_check lpj=2000000 tsc_early_khz=2000000"


def kernel_cmdline(accel: str) -> str:
    return KERNEL_CMDLINE if accel == "kvm" else f"{KERNEL_CMDLINE} {TCG_CMDLINE}"


@dataclass(frozen=True, kw_only=True)
class VmFiles:
    """The descriptors (in QEMU's fd table) of what it opens on the host."""

    kernel_fd: int
    initramfs_fd: int
    rootfs_fd: int
    workspace_fd: int
    channel_fd: int


@dataclass(frozen=True, kw_only=True)
class VmSpec:
    """``accel`` is ``kvm`` or ``tcg``; ``relay`` is the guestfwd command, or None for no NIC."""

    qemu: str
    accel: str
    memory_mib: int
    files: VmFiles
    relay: tuple[str, ...] | None


def _fd(n: int) -> str:
    return f"/proc/self/fd/{n}"


def _quote_option(value: str) -> str:
    """QEMU's option syntax: a comma inside a value is written twice."""
    return value.replace(",", ",,")


def build_argv(spec: VmSpec) -> list[str]:
    f = spec.files
    argv = [
        spec.qemu,
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-machine", "microvm,rtc=on,acpi=on,pcie=off",
        # TCG's translation cache defaults to 1 GiB, most of it resident once
        # touched; a small one keeps an emulated VM's footprint near its guest's.
        "-accel", spec.accel if spec.accel == "kvm" else f"{spec.accel},tb-size=64",
        "-cpu", "host" if spec.accel == "kvm" else "max",
        "-smp", "1",
        "-m", str(spec.memory_mib),
        "-kernel", _fd(f.kernel_fd),
        "-initrd", _fd(f.initramfs_fd),
        "-append", kernel_cmdline(spec.accel),
        # The guest's console is QEMU's stdout, kept by the harness for errors.
        "-serial", "stdio",
        "-fsdev", f"local,id=root,path={_fd(f.rootfs_fd)},security_model=none,readonly=on",
        "-device", "virtio-9p-device,fsdev=root,mount_tag=root",
        "-fsdev", f"local,id=workspace,path={_fd(f.workspace_fd)},security_model=none",
        "-device", "virtio-9p-device,fsdev=workspace,mount_tag=workspace",
        "-chardev", f"socket,id=agent,fd={f.channel_fd}",
        "-device", "virtio-serial-device,max_ports=2",
        "-device", "virtserialport,chardev=agent,nr=1,name=firstrun.agent",
    ]
    if spec.relay is not None:
        command = _quote_option(" ".join(spec.relay))
        argv += [
            "-netdev", (f"user,id=net0,restrict=on,ipv6=off,net={GUEST_NET},"
                        f"host={HOST_ALIAS},dns={DNS_ALIAS},"
                        f"guestfwd=tcp:{PROXY_ADDRESS}:{PROXY_PORT}-cmd:{command}"),
            "-device", "virtio-net-device,netdev=net0",
        ]
    return argv


def guest_config(*, uid: int, gid: int, workspace: str, home: str, real_homes: tuple[str, ...],
                 tmpfs_bytes: int, limits: dict[str, object], seccomp: str, ca_bundle: str,
                 network: bool, protected: tuple[str, ...] = ()) -> dict[str, object]:
    """The agent's configuration line (JSON-ready): who commands run as and what is mounted.

    ``protected``: workspace entries the agent binds read-only over the 9p share.
    """
    return {
        "uid": uid, "gid": gid, "workspace": workspace, "home": home,
        "real_homes": list(real_homes), "tmpfs_bytes": tmpfs_bytes, "limits": limits,
        "seccomp": seccomp, "ca_bundle": ca_bundle, "ca_path": SANDBOX_CA_BUNDLE,
        "protected": list(protected),
        "net": {"interface": GUEST_INTERFACE, "address": GUEST_ADDRESS,
                "netmask": GUEST_NETMASK} if network else None,
    }
