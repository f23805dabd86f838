"""The micro-VM's launch, as data: the QEMU command line and the guest's configuration.

Guarantee: ``build_argv`` and ``prepare`` are pure and golden-tested. The VM
has only the devices listed here: two 9p shares (the root read-only, the
workspace), the agent's virtio-serial port and, only with a proxy, a restricted
user-mode NIC whose one way out is a forward to the egress proxy. No host port
reaches the guest; its memory is the session's cap plus the guest's overhead;
QEMU opens host files only through the harness's descriptors.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from firstrun.policy.process import CA_VARIABLES, SANDBOX_CA_BUNDLE, build_environment
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.attest import AttestPlan
from firstrun.sandbox.base import ProxyEndpoint

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
GUEST_PYTHON = "/usr/bin/python3"
GUEST_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# Guest kernel, agent and page cache live beside the commands in the VM's RAM.
GUEST_OVERHEAD_MIB = 160

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


# Every host file QEMU opens is named by a descriptor the harness opened: QEMU, running as
# an unprivileged uid, needs no path to the cache or the workspace.
def _fd(n: int) -> str:
    return f"/proc/self/fd/{n}"


def _quote_option(value: str) -> str:
    """QEMU's option syntax: a comma inside a value is written twice."""
    return value.replace(",", ",,")


def build_argv(spec: VmSpec) -> list[str]:
    f = spec.files
    argv = [
        spec.qemu,
        # Nothing QEMU would add by default: no display, no option ROM beyond the kernel
        # loader.
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
            # restrict=on: nothing answers the guest but the guestfwd of one address and port
            # (not the host or DNS alias); the agent gives it no resolver and no default route.
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


@dataclass(frozen=True, kw_only=True)
class MicrovmFacts:
    """What ``start`` found on this host and set up for one session, so ``prepare`` is pure.

    ``qemu`` is the resolved emulator; ``launcher_python`` runs
    ``launcher_source`` with the harness's pid (``harness_pid``), which
    execs QEMU. ``uid``/``gid`` are who QEMU and the guest's commands run
    as. ``files`` are the descriptors the harness opened for QEMU.
    ``relay`` is the guestfwd command, set exactly when there is a proxy.
    ``seccomp`` is the compiled filter the guest loads, ``ca_bundle`` the
    host's CAs the guest trusts; ``host_env`` the harness's environment.
    """

    qemu: str
    accel: str
    launcher_python: str
    launcher_source: str
    harness_pid: int
    uid: int
    gid: int
    files: VmFiles
    relay: tuple[str, ...] | None
    seccomp: bytes
    ca_bundle: bytes
    host_env: Mapping[str, str]


@dataclass(frozen=True, kw_only=True)
class MicrovmPlan:
    """A session's launch, whole: what the harness runs (the launcher, then QEMU), the fds it
    passes and the environment it gives QEMU, the agent's configuration line, every command's
    environment and what the attestation proves."""

    spec: VmSpec
    argv: tuple[str, ...]
    pass_fds: tuple[int, ...]
    qemu_env: Mapping[str, str]
    config: Mapping[str, object]
    env: Mapping[str, str]
    attest: AttestPlan

    def to_data(self) -> dict[str, object]:
        return {"argv": list(self.argv), "pass_fds": list(self.pass_fds),
                "qemu_env": dict(self.qemu_env), "config": dict(self.config),
                "env": dict(self.env), "memory_mib": self.spec.memory_mib,
                "attest": asdict(self.attest)}


def prepare(profile: SandboxProfile, proxy: ProxyEndpoint | None,
            facts: MicrovmFacts) -> MicrovmPlan:
    """The launch of one micro-VM session, as a pure function of the profile and the facts.

    The VM's memory is the session's cap plus what the guest itself needs;
    without a proxy the VM has no NIC and nothing names a proxy.
    """
    fs = profile.fs
    limits = profile.limits
    spec = VmSpec(qemu=facts.qemu, accel=facts.accel,
                  memory_mib=limits.memory_bytes // (1 << 20) + GUEST_OVERHEAD_MIB,
                  relay=facts.relay, files=facts.files)
    config = guest_config(
        uid=facts.uid, gid=facts.gid, workspace=fs.sandbox_workspace, home=fs.sandbox_home,
        real_homes=fs.real_homes, tmpfs_bytes=limits.memory_bytes,
        limits={"pids": limits.pids, "open_files": limits.open_files},
        seccomp=base64.b64encode(facts.seccomp).decode(),
        ca_bundle=base64.b64encode(facts.ca_bundle).decode(), network=proxy is not None,
        protected=tuple(name for name, _ in fs.protected))
    env = build_environment(
        facts.host_env, path=GUEST_PATH, home=fs.sandbox_home, tmpdir=SANDBOX_TMP,
        proxy_url=f"http://{PROXY_ADDRESS}:{PROXY_PORT}" if proxy is not None else None)
    # The guest has one CA bundle (the host's, mounted over Debian's): point every CA
    # variable the host set at it, since the host's paths do not exist inside.
    env.update({name: SANDBOX_CA_BUNDLE for name in CA_VARIABLES if name in env})
    f = facts.files
    return MicrovmPlan(
        spec=spec,
        argv=(facts.launcher_python, "-I", "-S", "-c", facts.launcher_source,
              str(facts.harness_pid), *build_argv(spec)),
        pass_fds=(f.kernel_fd, f.initramfs_fd, f.rootfs_fd, f.workspace_fd, f.channel_fd),
        qemu_env={"PATH": facts.host_env.get("PATH", "/usr/bin:/bin")},
        config=config, env=env,
        attest=AttestPlan(
            python=GUEST_PYTHON, workspace=fs.sandbox_workspace, real_homes=fs.real_homes,
            exposed=(), proxy_port=PROXY_PORT if proxy is not None else None,
            nonce=proxy.nonce if proxy is not None else None, landlock=False,
            network="user_restricted" if proxy is not None else "loopback_only",
            host_alias=HOST_ALIAS if proxy is not None else None,
            proxy_host=PROXY_ADDRESS, supervisor="foreign_uid", protected=fs.protected))
