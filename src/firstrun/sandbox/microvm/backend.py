"""The microvm backend: one QEMU micro-VM per session, with its own kernel, attested before use.

Guarantee: ``MicrovmBackend.start`` returns a session only after the guest
agent reported its mounts and network in place and attestation proved the
boundary from inside; otherwise it powers the VM off, gives the workspace
back and raises. Commands run under a kernel of their own; QEMU never runs as
root, dies with the harness, reaches the host only through descriptors the
harness opened, and its guest's one way out is the egress proxy.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.policy.process import CA_VARIABLES, SANDBOX_CA_BUNDLE
from firstrun.policy.profile import LayerName, Provides, SandboxProfile, unprovided
from firstrun.sandbox import attest as attestation
from firstrun.sandbox import bytecode
from firstrun.sandbox.base import (
    Capability,
    Enforcement,
    LayerStatus,
    ProxyEndpoint,
    SessionInfo,
)
from firstrun.sandbox.channel import JsonLines, kill_and_wait
from firstrun.sandbox.linux import seccomp
from firstrun.sandbox.microvm import agent, probe, relay
from firstrun.sandbox.microvm.image import MicrovmImage, find_image
from firstrun.sandbox.microvm.spec import (
    PROXY_ADDRESS,
    PROXY_PORT,
    SANDBOX_TMP,
    MicrovmFacts,
    VmFiles,
    prepare,
)
from firstrun.sandbox.ownership import pick_uid, recover
from firstrun.sandbox.protect import describe as describe_protection
from firstrun.sandbox.supervised import READY_TIMEOUT_S, LaunchedSession, tail_of, take_workspace

AGENT_SOURCE = bytecode.source(agent).encode()
ACCEL_VARIABLE = "FIRSTRUN_MICROVM_ACCEL"
# The launcher and the relay run as QEMU's uid, which may not reach the
# harness's own interpreter (under a 0700 home); Debian's python3 is a
# firstrun dependency.
RELAY_PYTHON = "/usr/bin/python3"

_UID_RANGE = (1_600_000_000, 1_700_000_000)
# Boot under emulation takes seconds (about 12 s on a loaded 2-core machine).
_TCG_READY_TIMEOUT_S = 180.0

PROVIDES: Provides = {
    LayerName.NAMESPACES: "separate guest kernel (QEMU microvm)",
    LayerName.LANDLOCK: "read-only 9p root + tmpfs",
    LayerName.SECCOMP: "seccomp-bpf in the guest",
    LayerName.NETWORK: "user-mode networking, restrict=on, one forward to the proxy",
    LayerName.LIMITS: "VM memory + rlimits in the guest",
    LayerName.UNPRIVILEGED: "non-root uid in the guest, QEMU unprivileged on the host",
}


def _error(what: str, exc: OSError) -> SandboxError:
    return SandboxError(f"{what}: {exc}", who="microvm")


def _splice(a: socket.socket, b: socket.socket) -> None:
    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    other = threading.Thread(target=pump, args=(b, a), daemon=True)
    other.start()
    pump(a, b)
    other.join()
    a.close()
    b.close()


# The guest's only NIC is user-mode networking with restrict=on; its one forward leads here,
# so the same policy and records apply.
class _ProxyRelay:
    """The host end of the guest's one forward: an abstract socket for one uid, joined to the proxy.

    Abstract, so nothing is left on disk if the harness dies; checked by
    SO_PEERCRED, so only the session's QEMU (and the relays it starts) may use it.
    """

    def __init__(self, proxy_socket: str, uid: int) -> None:
        self.name = f"firstrun-microvm-{secrets.token_hex(8)}"
        self._proxy = proxy_socket
        self._uid = uid
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind("\0" + self.name)
        self._sock.listen(64)
        threading.Thread(target=self._serve, daemon=True, name="firstrun-microvm-relay").start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            _, uid, _ = struct.unpack("3i", cred)
            if uid != self._uid:
                conn.close()
                continue
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self._proxy)
            except OSError:
                upstream.close()
                conn.close()
                continue
            threading.Thread(target=_splice, args=(conn, upstream), daemon=True).start()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


class MicrovmSession(LaunchedSession):
    """A running micro-VM and the agent inside it; the process is QEMU, the whole VM."""

    who = "microvm"
    sandbox = "the VM"
    # After ``shutdown`` the agent syncs the 9p workspace and the guest powers off; QEMU is
    # killed if it is still there once the grace is over (``interrupt`` kills it at once).
    close_grace_s = 10.0
    # Under TCG emulation the guest runs many times slower than the host.
    liveness_s = 30.0

    def __init__(self, *, process: subprocess.Popen[bytes], channel: socket.socket,
                 env: dict[str, str], profile: SandboxProfile, info: SessionInfo,
                 console: IO[bytes], relay: _ProxyRelay | None, cleanup: ExitStack) -> None:
        super().__init__(process=process, channel=JsonLines(channel, peer="the guest agent"),
                         env=env, profile=profile, info=info, output=console, cleanup=cleanup)
        self.pid = process.pid
        # Named here for the tests that knock on it; closed by the cleanup.
        self._relay = relay

    def tail(self) -> str:
        """The end of the guest's console, its own lines first.

        What init, the agent and QEMU wrote says why a boot failed; the
        kernel's (timestamped) lines after it are mostly a panic's trace.
        """
        text = tail_of(self._output, limit=None)
        own = [line for line in text.splitlines() if line and not line.startswith("[")]
        return ("\n".join(own[-20:]) + "\n" if own else "") + text[-1000:]


def _ca_bundle() -> bytes:
    """The host's CA bundle and every CA variable's file: what pip, npm and curl trust here."""
    paths = [SANDBOX_CA_BUNDLE] if os.path.isfile(SANDBOX_CA_BUNDLE) else []
    for name in CA_VARIABLES:
        value = os.environ.get(name, "")
        if value.startswith("/") and os.path.isfile(value) and value not in paths:
            paths.append(value)
    return b"\n".join(Path(p).read_bytes() for p in paths)


# Run between the uid change (which would clear a parent-death signal set
# earlier) and QEMU: SIGKILL when the harness dies, even by SIGKILL; a
# harness already gone by then (the parent changed) means no VM at all.
_LAUNCHER = """import ctypes, os, signal, sys
if ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != int(sys.argv[1]):
    os._exit(1)
os.execv(sys.argv[2], sys.argv[2:])"""


def _layers(profile: SandboxProfile, *, accel: str, uid: int, proxy: bool,
            memory_mib: int) -> tuple[LayerStatus, ...]:
    fs = profile.fs
    limits = profile.limits
    details = {
        LayerName.NAMESPACES: f"own kernel in a QEMU microvm ({'KVM' if accel == 'kvm' else 'TCG emulation'}); "
                              "no host process, mount or network is visible"
                              + describe_protection(fs),
        LayerName.LANDLOCK: f"in place of Landlock: the root is a read-only 9p share; writable "
                            f"only {fs.sandbox_workspace} (9p), tmpfs {SANDBOX_TMP} and "
                            f"{fs.sandbox_home}",
        LayerName.SECCOMP: f"the linux backend's filter ({len(seccomp.RULES)} deny rules), "
                           "loaded in the guest with no_new_privs",
        LayerName.NETWORK: f"only {PROXY_ADDRESS}:{PROXY_PORT}, forwarded to the egress proxy; "
                           "no route, no DNS" if proxy else "no NIC at all (no proxy)",
        LayerName.LIMITS: f"session-wide: VM memory {memory_mib} MiB; in the guest: nproc "
                          f"{limits.pids}, open files {limits.open_files}, core 0; output "
                          f"{limits.output_bytes} bytes per stream",
        LayerName.UNPRIVILEGED: f"uid {uid} in the guest, no capabilities; QEMU as uid {uid} "
                                "on the host",
    }
    mechanism = dict(PROVIDES)
    if accel == "tcg":
        mechanism[LayerName.NAMESPACES] = "separate guest kernel (QEMU microvm, TCG emulation)"
    return tuple(LayerStatus(name=layer, applied=True, mechanism=mechanism[layer],
                             detail=details[layer]) for layer in LayerName)


# KVM unless FIRSTRUN_MICROVM_ACCEL=tcg asks for emulation, which is recorded as the
# namespaces layer's mechanism: KVM is never silently swapped for emulation.
def accel_from_env() -> str:
    accel = os.environ.get(ACCEL_VARIABLE, "kvm") or "kvm"
    if accel not in ("kvm", "tcg"):
        raise SandboxUnavailable(f"{ACCEL_VARIABLE}={accel!r} is neither kvm nor tcg",
                                 who="microvm", fix=f"unset {ACCEL_VARIABLE} or set it to tcg")
    return accel


class MicrovmBackend:
    """A QEMU micro-VM per session. ``accel`` None reads FIRSTRUN_MICROVM_ACCEL (default kvm)."""

    name = "microvm"

    def __init__(self, *, accel: str | None = None) -> None:
        self._accel = accel

    @property
    def accel(self) -> str:
        return self._accel or accel_from_env()

    def probe(self) -> tuple[Capability, ...]:
        return probe.probe(self.accel)

    def start(self, profile: SandboxProfile, *, proxy: ProxyEndpoint | None) -> MicrovmSession:
        accel = self.accel
        missing = probe.unusable(accel)
        if missing is not None:
            raise SandboxUnavailable(f"{missing.name}: {missing.detail}", who="microvm",
                                     fix=missing.fix)
        lacking = unprovided(profile, PROVIDES)
        if lacking:
            raise SandboxUnavailable(f"the microvm backend cannot enforce {', '.join(lacking)}",
                                     who="microvm", fix="use a backend that provides it")
        image = find_image()
        if image is None:
            raise SandboxUnavailable("the micro-VM image is not built", who="microvm",
                                     fix="firstrun images build --microvm")
        if not os.path.isdir(profile.fs.workspace):
            raise SandboxError(f"workspace {profile.fs.workspace} is not a directory",
                               who="microvm")
        return self._launch(profile, proxy, image, accel)

    def _launch(self, profile: SandboxProfile, proxy: ProxyEndpoint | None,
                image: MicrovmImage, accel: str) -> MicrovmSession:
        fs = profile.fs
        st = os.lstat(fs.workspace)
        owner = (st.st_uid, st.st_gid)
        root = os.geteuid() == 0
        if root:
            recover(who="microvm")
        # A root harness runs QEMU as a fresh per-session uid, lent the workspace for the
        # session as the linux backend does.
        lent = pick_uid(_UID_RANGE, who="microvm") if root else None
        uid, gid = (lent, lent) if lent is not None else (os.getuid(), os.getgid())
        groups: list[int] = []
        if root and accel == "kvm":
            # The device's own group (kvm on Debian): QEMU opens it as the lent uid.
            groups = [os.stat("/dev/kvm").st_gid]
        # Each resource is registered with its undo as it is acquired, so a
        # launch that fails anywhere unwinds exactly what it took, in reverse,
        # and a session that starts takes the same stack as its close.
        with ExitStack() as acquired:
            channel, guest_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            acquired.callback(channel.close)
            # Unlinked, as the relay's socket is abstract: no file is left behind but the
            # workspace.
            console = tempfile.TemporaryFile()
            acquired.callback(console.close)
            try:
                take_workspace(acquired, fs, lent=lent, owner=owner, who="microvm")
                # QEMU's own copies are all it needs: ours close once it runs, or failed to.
                with ExitStack() as passed:
                    passed.callback(guest_end.close)
                    opened: list[int] = []
                    # Every file QEMU reads is a descriptor opened here: nothing of the host
                    # is reachable by path.
                    for path, flags in ((image.kernel, os.O_RDONLY), (image.initramfs, os.O_RDONLY),
                                        (image.rootfs, os.O_PATH | os.O_DIRECTORY),
                                        (fs.workspace, os.O_PATH | os.O_DIRECTORY)):
                        opened.append(os.open(path, flags | os.O_CLOEXEC))
                        passed.callback(os.close, opened[-1])
                    relay_server: _ProxyRelay | None = None
                    if proxy is not None:
                        relay_server = _ProxyRelay(proxy.socket_path, uid)
                        acquired.callback(relay_server.close)
                    # What the VM is, is decided before QEMU runs, so it can be
                    # golden-tested; each resource is registered with its undo on one
                    # ExitStack as it is taken, which becomes the session's close: one
                    # cleanup path, whether the start fails or the session ends.
                    plan = prepare(profile, proxy, MicrovmFacts(
                        qemu=shutil.which(probe.QEMU) or probe.QEMU, accel=accel,
                        launcher_python=RELAY_PYTHON, launcher_source=_LAUNCHER,
                        harness_pid=os.getpid(), uid=uid, gid=gid,
                        files=VmFiles(kernel_fd=opened[0], initramfs_fd=opened[1],
                                      rootfs_fd=opened[2], workspace_fd=opened[3],
                                      channel_fd=guest_end.fileno()),
                        relay=relay.command(RELAY_PYTHON, relay_server.name)
                        if relay_server is not None else None,
                        seccomp=seccomp.filter_program(), ca_bundle=_ca_bundle(), host_env=os.environ))
                    process = subprocess.Popen(
                        plan.argv, stdin=subprocess.DEVNULL, stdout=console, stderr=console,
                        env=dict(plan.qemu_env), pass_fds=plan.pass_fds, close_fds=True,
                        user=uid if root else None, group=gid if root else None,
                        extra_groups=groups if root else None, start_new_session=True)
                acquired.callback(kill_and_wait, process)
            except OSError as exc:
                raise _error("cannot launch qemu", exc) from exc
            session = MicrovmSession(
                process=process, channel=channel, env=dict(plan.env), profile=profile,
                info=SessionInfo(backend=self.name, enforcement=Enforcement.ENFORCED,
                                 policy_hash=profile.policy_hash()),
                console=console, relay=relay_server, cleanup=acquired.pop_all())
        try:
            self._boot(session, channel, dict(plan.config), accel)
            checks = attestation.attest(session, plan.attest)
            session.info = SessionInfo(
                backend=self.name, enforcement=Enforcement.ENFORCED,
                policy_hash=profile.policy_hash(),
                layers=_layers(profile, accel=accel, uid=uid, proxy=proxy is not None,
                               memory_mib=plan.spec.memory_mib),
                attestation=checks)
            attestation.require_passed(checks)
        except BaseException:
            session.close()
            raise
        return session

    @staticmethod
    def _boot(session: MicrovmSession, channel: socket.socket, config: dict[str, object],
              accel: str) -> None:
        within_s = READY_TIMEOUT_S if accel == "kvm" else _TCG_READY_TIMEOUT_S
        try:
            channel.settimeout(within_s)
            channel.sendall(b"%d\n" % len(AGENT_SOURCE) + AGENT_SOURCE)
            channel.sendall(json.dumps(config, separators=(",", ":")).encode() + b"\n")
        except OSError as exc:
            raise SandboxError(f"the VM did not start: {exc}: {session.tail()}",
                               who="microvm") from exc
        session.await_ready(within_s=within_s)
