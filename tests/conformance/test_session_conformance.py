"""One contract, every available backend: attestation, environment canaries, escapes judged by evidence.

Each escape is attempted for real from inside a session, and judged on the
host: a canary listener that saw no connection, a canary file unchanged, a
marked process absent from the host's process table. Where an attempt could
pass vacuously, a control proves the evidence would have shown it.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import uuid
from pathlib import Path

import pytest
from conformance_support import session_on

from firstrun.policy.profile import LayerName
from firstrun.sandbox.base import Enforcement
from firstrun.sandbox.linux.seccomp import RULES, Action
from firstrun.sandbox.select import REGISTRY

# The registries' address here (a TLS-intercepting proxy): reachable from the
# host, so a failed direct dial from inside is the boundary, not the network.
REGISTRY_ADDRESS = ("203.0.113.80", 443)

# A dial is judged by whether anything answered it: under transparent capture
# every connection is accepted inside (by the relay) and then refused by the
# proxy, which closes it with nothing sent back.
DIAL = """
import socket, sys
for spec in sys.argv[1:]:
    host, port = spec.rsplit(":", 1)
    s = socket.socket(); s.settimeout(5)
    try:
        s.connect((host, int(port)))
        s.sendall(b"GET / HTTP/1.1\\r\\nHost: " + host.encode() + b"\\r\\n\\r\\n")
        print(spec, "ANSWERED" if s.recv(64) else "closed unanswered")
    except OSError as e:
        print(spec, "refused", e.errno)
    finally:
        s.close()
"""

# The host's address on the sandbox's link, if it has one: the first host of
# the first subnet route off lo (a container's bridge); none in an empty netns.
HOST_ON_LINK = ("awk '$1 != \"lo\" && $1 != \"Iface\" && $2 != \"00000000\" "
                "{print $2; exit}' /proc/net/route")


def test_attestation_passes_and_is_recorded(backend: str, workspace: str) -> None:
    with session_on(backend, workspace) as session:
        info = session.info
    assert info.backend == backend
    assert info.enforcement is Enforcement.ENFORCED and info.downgrades == ()
    assert info.attestation and all(c.passed for c in info.attestation), info.attestation
    names = {c.name for c in info.attestation}
    assert {"proxy_answers", "writes_confined", "real_homes_unreadable", "no_privileges",
            "seccomp_loaded"} <= names
    layers = {layer.name: layer for layer in info.layers}
    assert set(layers) == {layer.value for layer in LayerName}
    assert all(layer.applied and layer.mechanism for layer in layers.values())
    saved = info.to_data()
    assert saved["attestation"] and saved["layers"]


def test_harness_secrets_stay_outside(backend: str, workspace: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("FIRSTRUN_CONFORMANCE_TOKEN", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    home_canary = Path.home() / f".firstrun-conformance-{uuid.uuid4().hex}"
    home_canary.write_text(secret)
    try:
        with session_on(backend, workspace) as session:
            shown = session.exec(f"env; cat /proc/self/environ; cat {home_canary}; "
                                 f"ls -a {Path.home()}", timeout=60)
            # Control: the same command does print what the sandbox may see.
            assert "PATH=" in shown.stdout.text()
    finally:
        home_canary.unlink()
    assert secret not in shown.stdout.text() + shown.stderr.text()
    assert home_canary.name not in shown.stdout.text()


def test_no_way_to_the_host_or_the_network_but_the_proxy(backend: str, workspace: str) -> None:
    canary = socket.socket()
    canary.bind(("0.0.0.0", 0))
    canary.listen(16)
    canary.setblocking(False)
    port = canary.getsockname()[1]
    # Control: the registry address answers the host, so only the boundary
    # can make the dial from inside fail.
    socket.create_connection(REGISTRY_ADDRESS, timeout=10).close()
    try:
        with session_on(backend, workspace) as session:
            subnet = session.exec(HOST_ON_LINK, timeout=30).stdout.text().split()
            targets = [f"127.0.0.1:{port}", "{}:{}".format(*REGISTRY_ADDRESS)]
            if subnet:
                octets = [int(subnet[0][i:i + 2], 16) for i in (6, 4, 2, 0)]
                octets[3] += 1
                targets.append(".".join(map(str, octets)) + f":{port}")
            dialled = session.exec(["python3", "-c", DIAL, *targets], timeout=120)
            lines = dialled.stdout.text().splitlines()
            assert len(lines) == len(targets), dialled.stderr.text()
            assert not any("ANSWERED" in line for line in lines), lines
            # A name resolves inside only to what stands for it (transparent
            # capture's synthetic range), never to where it really is.
            resolved = session.exec(
                ["python3", "-c", "import socket; print(socket.getaddrinfo('pypi.org', 443)[0][4][0])"],
                timeout=60)
            if resolved.exit_code == 0:
                assert ipaddress.ip_address(resolved.stdout.text().strip()) in \
                    ipaddress.ip_network("198.18.0.0/15"), resolved.stdout.text()
            else:
                assert "gaierror" in resolved.stderr.text()
        with pytest.raises(BlockingIOError):
            canary.accept()
    finally:
        canary.close()


def test_writes_outside_the_workspace_change_nothing(backend: str, workspace: str) -> None:
    canary = Path("/var/tmp") / f"firstrun-conformance-{uuid.uuid4().hex}"
    canary.write_text("original\n")
    beside = Path(workspace).parent / f"{Path(workspace).name}-escape"
    etc = Path("/etc") / f"firstrun-conformance-{uuid.uuid4().hex}"
    # In a system directory the sandbox shows read-only, writable by its mode:
    # only the read-only view stands between a command and the host's file.
    system = Path("/usr/local/share") / f"firstrun-conformance-{uuid.uuid4().hex}"
    system.write_text("original\n")
    system.chmod(0o666)
    try:
        with session_on(backend, workspace) as session:
            session.exec(f"echo pwned > {canary}; echo pwned > {beside}; echo pwned > {etc}; "
                         f": > {system}; echo pwned >> {system}; echo mine > inside", timeout=60)
        assert canary.read_text() == "original\n"
        assert system.read_text() == "original\n"
        assert not beside.exists() and not etc.exists()
        # Control: the same command's write inside the workspace landed.
        assert (Path(workspace) / "inside").read_text() == "mine\n"
    finally:
        canary.unlink()
        system.unlink()
        for path in (beside, etc):
            if path.exists():
                path.unlink()


def _host_pids_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


# Backends whose commands run under another kernel.
VM_BACKENDS = frozenset(e.name for e in REGISTRY if e.own_kernel)


def test_a_process_left_behind_is_gone_after_close(backend: str, workspace: str) -> None:
    marker = f"firstrun-left-{uuid.uuid4().hex}"
    with session_on(backend, workspace) as session:
        started = session.exec(
            f"setsid nohup bash -c 'exec -a {marker} sleep 3600' >/dev/null 2>&1 & "
            f"nohup bash -c 'exec -a {marker} sleep 3601' >/dev/null 2>&1 & "
            # Both run under their marker before the command returns (the
            # background shells exec on their own time); matched whole, so
            # the shells whose command lines merely mention it do not count.
            f"for _ in $(seq 300); do [ \"$(pgrep -fxc '{marker} 360[01]')\" = 2 ] && break; "
            "sleep 0.1; done; "
            "echo started",
            timeout=60)
        assert started.stdout.text() == "started\n"
        if backend in VM_BACKENDS:
            # A guest's processes are not in the host's table: the control is
            # the guest's own, and "gone" is the whole VM (or sentry) gone.
            seen = session.exec(f"pgrep -fxc '{marker} 360[01]'", timeout=60)
            assert seen.stdout.text().strip() == "2", seen.stderr.text()
            vm_pid = session.pid
        else:
            # Control: from the host, the marked processes outlived the command.
            assert len(_host_pids_with(marker)) == 2
    if backend in VM_BACKENDS:
        assert not os.path.exists(f"/proc/{vm_pid}")
    assert _host_pids_with(marker) == []


def test_workspace_files_belong_to_the_workspace_owner(backend: str, workspace: str) -> None:
    # The workspace's owner stands for the invoking user (a non-root one here,
    # so a root-owned leftover would show).
    os.chown(workspace, 4321, 4322)
    with session_on(backend, workspace) as session:
        made = session.exec("mkdir -p a/b && echo x > a/b/f && ln -s f a/b/l && "
                            "python3 -m venv --without-pip venv >/dev/null", timeout=120)
        assert made.exit_code == 0, made.stderr.text()
    owners = set()
    for root, dirs, files in os.walk(workspace):
        for name in [*dirs, *files]:
            owners.add(os.lstat(os.path.join(root, name)).st_uid)
    assert owners == {4321}


def test_kill_all_leaves_nothing_a_command_started_and_counts_it(
        backend: str, workspace: str) -> None:
    # What the success check relies on, on every backend: after kill_all
    # nothing a command left is running (judged by a marked process gone from
    # the sandbox's own table, and from the host's where it runs there), and
    # the session still runs commands.
    marker = f"firstrun-leftover-{uuid.uuid4().hex}"
    with session_on(backend, workspace) as session:
        started = session.exec(
            f"setsid nohup bash -c 'exec -a {marker} sleep 3600' >/dev/null 2>&1 & "
            f"nohup bash -c 'exec -a {marker} sleep 3601' >/dev/null 2>&1 & "
            f"for _ in $(seq 300); do [ \"$(pgrep -fxc '{marker} 360[01]')\" = 2 ] && break; "
            "sleep 0.1; done; echo started", timeout=60)
        assert started.stdout.text() == "started\n"
        assert session.kill_all() == 2
        seen = session.exec(f"pgrep -fxc '{marker} 360[01]'", timeout=60)
        assert seen.stdout.text().strip() == "0"
        if backend not in VM_BACKENDS:
            assert _host_pids_with(marker) == []
        assert session.exec("echo on", timeout=60).stdout.text() == "on\n"


# Each attempt as an ordinary command, answered by its errno name (or "ok").
# Calls without a libc wrapper go by number, for the two native ABIs.
REFUSALS = r"""
import ctypes, errno, json, os, platform, socket, subprocess
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
NR = {"x86_64": {"clone": 56, "clone3": 435, "io_uring_setup": 425, "bpf": 321},
      "aarch64": {"clone": 220, "clone3": 435, "io_uring_setup": 425, "bpf": 280}}[platform.machine()]
def answer(rc):
    return "ok" if rc >= 0 else errno.errorcode[ctypes.get_errno()]
out = {}
out["unshare"] = answer(libc.unshare(0x10000000 | 0x00020000))
out["mount"] = answer(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None))
pid = libc.syscall(NR["clone"], ctypes.c_ulong(0x10000000 | 17), None, None, None, None)
if pid == 0:
    os._exit(0)
out["clone"] = answer(pid)
out["clone3"] = answer(libc.syscall(NR["clone3"], None, ctypes.c_size_t(0)))
buf = ctypes.create_string_buffer(120)
out["io_uring_setup"] = answer(libc.syscall(NR["io_uring_setup"], ctypes.c_uint(1), buf))
out["bpf"] = answer(libc.syscall(NR["bpf"], 0, None, 0))
out["ioctl"] = answer(libc.ioctl(0, ctypes.c_ulong(0x5412), buf))  # TIOCSTI
out["personality"] = answer(libc.personality(0x0040000))  # ADDR_NO_RANDOMIZE
child = subprocess.Popen(["sleep", "60"])
out["ptrace"] = answer(libc.ptrace(16, child.pid, None, None))  # PTRACE_ATTACH
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local, remote = IoVec(ctypes.addressof(buf), 8), IoVec(ctypes.addressof(buf) + 8, 8)
libc.process_vm_readv.restype = ctypes.c_ssize_t
out["process_vm_readv"] = answer(libc.process_vm_readv(child.pid, ctypes.byref(local), 1,
                                                       ctypes.byref(remote), 1, 0))
child.kill()
child.wait()
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close()
    out["socket"] = "ok"
except OSError as exc:
    out["socket"] = errno.errorcode[exc.errno]
print(json.dumps(out))
"""
_ERRNO = {Action.EPERM: errno.EPERM, Action.ENOSYS: errno.ENOSYS,
          Action.EAFNOSUPPORT: errno.EAFNOSUPPORT}


def _rule_answer(syscall: str) -> str:
    """The errno the linux rules give ``syscall``: one table for every backend."""
    [answer] = {errno.errorcode[_ERRNO[r.action]] for r in RULES if r.syscall == syscall}
    return answer


def test_each_refusal_answers_with_the_rules_errno(backend: str, workspace: str) -> None:
    with session_on(backend, workspace) as session:
        result = session.exec(["python3", "-c", REFUSALS], timeout=120)
        # Control: what the rules leave alone still works here.
        works = session.exec(["python3", "-c", "import socket, subprocess; "
                              "socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close(); "
                              "print(subprocess.run(['echo', 'ok'], capture_output=True, "
                              "text=True).stdout.strip())"], timeout=60)
    assert result.exit_code == 0, result.stderr.text()
    answers = json.loads(result.stdout.text())
    assert answers == {name: _rule_answer(name) for name in answers}
    assert answers["clone3"] == "ENOSYS" and answers["socket"] == "EAFNOSUPPORT"
    assert works.stdout.text() == "ok\n", works.stderr.text()
