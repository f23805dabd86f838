"""The attestation probe: what a sandboxed command tries, and what it finds.

Guarantee: each check is a real attempt made from inside the sandbox, as an
ordinary command with the same restrictions as untrusted code, and reports
what happened (the errno, the bytes read), never an assumption. A check
passes only when the boundary held. Output is one JSON list on stdout.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import sys
import threading
import time

_CLONE_NEWUSER = 0x10000000


def _status() -> dict[str, str]:
    with open("/proc/self/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


class _Concurrent:
    """Checks that wait on the network, run in threads beside the rest.

    ``start`` returns the check's slot, ``[name]``, which holds
    ``[name, passed, detail]`` once ``join`` returned; a check that raises
    fails, with what it raised.
    """

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []

    def start(self, name: str, check, *args) -> list:
        slot: list = [name]

        def run() -> None:
            try:
                passed, detail = check(*args)
            except Exception as exc:  # a check that breaks proves nothing
                passed, detail = False, f"{type(exc).__name__}: {exc}"
            slot.extend((passed, detail))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)
        return slot

    def join(self) -> None:
        for thread in self._threads:
            thread.join()


def check_fds() -> tuple[bool, str]:
    # fstat opens nothing, so this sees exactly what the command inherited.
    extra = []
    for fd in range(3, 1024):
        try:
            os.fstat(fd)
        except OSError:
            continue
        extra.append(fd)
    return not extra, f"open fds beyond 0-2: {extra}" if extra else "only 0, 1, 2 open"


def check_interfaces(captured: bool = False) -> tuple[bool, str]:
    """Only ``lo``, and no route; under capture, only the default route through ``lo``
    that the nat rules rewrite to the relay."""
    with open("/proc/net/dev") as f:
        names = sorted(line.split(":", 1)[0].strip() for line in f.readlines()[2:])
    with open("/proc/net/route") as f:
        routes4 = [line for line in f.readlines()[1:] if not (captured and line.split()[0] == "lo")]
    with open("/proc/net/ipv6_route") as f:
        routes6 = [line for line in f if line.split()[-1] != "lo"]
    ok = names == ["lo"] and not routes4 and not routes6
    return ok, f"interfaces {names}, {len(routes4)} IPv4 and {len(routes6)} non-loopback IPv6 routes"


def check_no_route() -> tuple[bool, str]:
    # A UDP connect() sends nothing: it only asks the routing table.
    details = []
    ok = True
    for family, addr in ((socket.AF_INET, ("203.0.113.1", 53)), (socket.AF_INET6, ("2001:db8::1", 53))):
        s = socket.socket(family, socket.SOCK_DGRAM)
        try:
            s.connect(addr)
        except OSError as exc:
            details.append(f"{addr[0]}: {errno.errorcode.get(exc.errno, exc.errno)}")
            # gVisor's netstack says EHOSTUNREACH where Linux says ENETUNREACH.
            ok = ok and exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL)
        else:
            details.append(f"{addr[0]}: connected")
            ok = False
        finally:
            s.close()
    return ok, "; ".join(details)


def check_host_loopback(port: int, host: str = "127.0.0.1") -> tuple[bool, str]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, port))
    except OSError as exc:
        return True, f"connect {host}:{port}: {errno.errorcode.get(exc.errno, exc.errno)}"
    finally:
        s.close()
    return False, f"connected to {host}:{port}"


def _datagram_refused(addr: tuple[str, int], expect: int) -> tuple[bool, str]:
    """A datagram to ``addr`` must fail locally with ``expect``."""
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.sendto(b"\x00", addr)
    except OSError as exc:
        return (exc.errno == expect,
                f"udp {addr[0]}:{addr[1]}: {errno.errorcode.get(exc.errno, exc.errno)}")
    else:
        return False, f"udp {addr[0]}:{addr[1]}: sent"
    finally:
        u.close()


def _dial_refused(addr: tuple[str, int], expect: int) -> tuple[bool, str]:
    """A TCP dial to ``addr`` must fail with ``expect``."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(addr)
    except OSError as exc:
        why = errno.errorcode.get(exc.errno, exc.errno) if exc.errno else exc
        return exc.errno == expect, f"tcp {addr[0]}:{addr[1]}: {why}"
    else:
        return False, f"tcp {addr[0]}:{addr[1]}: connected"
    finally:
        s.close()


def _all_refused(results: list[tuple[bool, str]]) -> tuple[bool, str]:
    return all(ok for ok, _ in results), "; ".join(detail for _, detail in results)


def check_firewalled() -> tuple[bool, str]:
    """A container's namespace firewall: direct egress and the embedded DNS are refused locally.

    Both answers come from the firewall before any packet leaves: EPERM for
    a datagram, and for a TCP dial to a TEST-NET address (no such host
    exists to answer) a reset, ECONNREFUSED.
    """
    return _all_refused([
        _datagram_refused(("192.0.2.1", 53), errno.EPERM),
        _datagram_refused(("127.0.0.11", 53), errno.EPERM),
        _dial_refused(("192.0.2.1", 80), errno.ECONNREFUSED),
    ])


def check_profile_filtered() -> tuple[bool, str]:
    """The host's network behind a per-process rule (Seatbelt): the rule itself refuses.

    EPERM comes from the sandbox before routing, so no packet leaves;
    an unreachable network would answer with another errno and fail this.
    """
    return _all_refused([
        _datagram_refused(("192.0.2.1", 53), errno.EPERM),
        _dial_refused(("192.0.2.1", 80), errno.EPERM),
    ])


def check_on_link_only() -> tuple[bool, str]:
    """A VM's user-mode NIC: one interface beside ``lo``, and no IPv4 route off its subnet."""
    with open("/proc/net/dev") as f:
        names = sorted(line.split(":", 1)[0].strip() for line in f.readlines()[2:])
    with open("/proc/net/route") as f:
        routes = [line.split() for line in f.readlines()[1:]]
    # Columns: iface, destination, gateway (hex); an on-link route has gateway 0.
    off_link = [r for r in routes if r[1] == "00000000" or r[2] != "00000000"]
    ok = len(names) == 2 and "lo" in names and not off_link
    return ok, f"interfaces {names}, {len(routes)} IPv4 route(s), {len(off_link)} default or via a gateway"


def check_no_dns() -> tuple[bool, str]:
    """No resolver configured, and user-mode networking's DNS address answers nothing."""
    details = []
    ok = True
    try:
        socket.getaddrinfo("deb.debian.org", 443)
    except OSError as exc:
        details.append(f"getaddrinfo: {exc}")
    else:
        details.append("getaddrinfo resolved deb.debian.org")
        ok = False
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # The resolver would be one virtual link away: an answer takes milliseconds,
    # so a second of silence is no resolver, and keeps a VM's attestation short.
    u.settimeout(1)
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03deb\x06debian\x03org\x00\x00\x01\x00\x01"
    try:
        u.sendto(query, ("10.0.2.3", 53))
        u.recv(512)
    except OSError as exc:
        details.append(f"udp 10.0.2.3:53: {errno.errorcode.get(exc.errno, exc.errno) if exc.errno else 'no answer'}")
    else:
        details.append("udp 10.0.2.3:53: answered")
        ok = False
    finally:
        u.close()
    return ok, "; ".join(details)


_ATTEST_MAX_BYTES = 65536
_ATTEST_TIMEOUT_S = 10.0


def _attest_get(address: tuple[str, int], target: str) -> tuple[int, bytes]:
    """One ``GET target`` for the attestation host over a fresh connection: (status, body).

    A plain socket rather than http.client, whose import (the email package)
    is most of the probe's own start on gVisor. The proxy closes after its
    answer, so what comes before EOF is the response, read for at most
    ``_ATTEST_TIMEOUT_S`` in all and ``_ATTEST_MAX_BYTES``; a status line that
    is not HTTP/1.x is status 0.
    """
    deadline = time.monotonic() + _ATTEST_TIMEOUT_S
    with socket.create_connection(address, timeout=_ATTEST_TIMEOUT_S) as conn:
        conn.sendall(f"GET {target} HTTP/1.1\r\nHost: attest.firstrun.invalid\r\n"
                     "Connection: close\r\n\r\n".encode("ascii"))
        response = b""
        while len(response) < _ATTEST_MAX_BYTES:
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            chunk = conn.recv(_ATTEST_MAX_BYTES - len(response))
            if not chunk:
                break
            response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    parts = head.split(b"\r\n", 1)[0].split(b" ", 2)
    http = len(parts) > 1 and parts[0].startswith(b"HTTP/1.") and parts[1].isdigit()
    return (int(parts[1]) if http else 0), body


def _answered(status: int, body: bytes, nonce: str) -> bool:
    """The proxy's attestation answer: 200, and this run's (non-empty) nonce in the body."""
    return status == 200 and bool(nonce) and nonce.encode() in body


def check_proxy(port: int, nonce: str, host: str = "127.0.0.1") -> tuple[bool, str]:
    try:
        status, body = _attest_get((host, port), "http://attest.firstrun.invalid/")
    except OSError as exc:
        return False, f"proxy unreachable through the relay: {exc}"
    present = bool(nonce) and nonce.encode() in body
    return _answered(status, body, nonce), \
        f"status {status}, nonce {'present' if present else 'absent'}"


# The stub's synthetic addresses, 198.18.0.0/15: the first 15 bits.
_SYNTHETIC_PREFIX, _SYNTHETIC_BITS = 0xC612_0000, 15


def _synthetic(address: str) -> bool:
    try:
        value = int.from_bytes(socket.inet_aton(address), "big")
    except OSError:
        return False
    return value >> (32 - _SYNTHETIC_BITS) == _SYNTHETIC_PREFIX >> (32 - _SYNTHETIC_BITS)


def _refused_name() -> tuple[bool, str]:
    try:
        socket.getaddrinfo("refused.firstrun.invalid", 80)
    except socket.gaierror as exc:
        return (exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", -5)),
                f"refused.firstrun.invalid: {exc.strerror}")
    return False, "refused.firstrun.invalid resolved"


def check_captured(nonce: str) -> tuple[bool, str]:
    """Transparent capture from inside: the stub's answers, and a plain dial reaching the proxy.

    The name the stub must refuse is asked beside the one it must answer.
    """
    refusal = _Concurrent()
    refused = refusal.start("refused", _refused_name)
    details = []
    try:
        infos = socket.getaddrinfo("attest.firstrun.invalid", 80, socket.AF_INET,
                                   socket.SOCK_STREAM)
        address = infos[0][4][0]
    except OSError as exc:
        refusal.join()
        return False, f"attest.firstrun.invalid did not resolve: {exc}"
    synthetic = _synthetic(address)
    details.append(f"attest.firstrun.invalid -> {address}")
    try:
        status, body = _attest_get((address, 80), "/")
        answered = _answered(status, body, nonce)
        details.append(f"plain dial: nonce {'present' if answered else 'absent'}")
    except OSError as exc:
        answered = False
        details.append(f"plain dial failed: {exc}")
    refusal.join()
    _, was_refused, said = refused
    details.insert(1, said)
    return synthetic and was_refused and answered, "; ".join(details)


def check_homes(homes: list[str], exposed: list[str]) -> tuple[bool, str]:
    visible = []
    for home in homes:
        try:
            entries = os.listdir(home)
        except OSError:
            continue
        allowed = {os.path.relpath(e, home).split("/", 1)[0] for e in exposed
                   if e.startswith(home.rstrip("/") + "/")}
        visible += [f"{home}/{e}" for e in entries if e not in allowed]
    return not visible, f"visible in real homes: {visible}" if visible else "real homes unreadable"


def _try_write(path: str) -> int | None:
    try:
        os.mkdir(path)
    except OSError as exc:
        return exc.errno
    os.rmdir(path)
    return None


def check_writes(workspace: str, landlock: bool, witness: str | None = None) -> tuple[bool, str]:
    details = []
    ok = True
    if witness is not None:
        # This uid may write here by the directory's mode: only the sandbox refuses.
        err = _try_write(os.path.join(witness, "firstrun-attest"))
        details.append(f"{witness}: {errno.errorcode.get(err, err) if err else 'written'}")
        ok = err in (errno.EPERM, errno.EACCES)
    for path in ("/etc/firstrun-attest", "/usr/firstrun-attest"):
        err = _try_write(path)
        details.append(f"{path}: {errno.errorcode.get(err, err) if err else 'written'}")
        ok = ok and err is not None
    if landlock:
        # The sandbox root is a tmpfs the sandbox uid owns: only Landlock stops this.
        err = _try_write("/firstrun-attest")
        details.append(f"/firstrun-attest: {errno.errorcode.get(err, err) if err else 'written'}")
        ok = ok and err == errno.EACCES
    err = _try_write(os.path.join(workspace, ".firstrun-attest"))
    details.append(f"workspace: {errno.errorcode.get(err, err) if err else 'writable'}")
    ok = ok and err is None
    return ok, "; ".join(details)


_HELD = (errno.EROFS, errno.EBUSY, errno.EPERM, errno.EACCES)


def _errno_of(action) -> int | None:
    try:
        action()
    except OSError as exc:
        return exc.errno
    return None


def check_protected(workspace: str, protected: list[list[str]]) -> tuple[bool, str]:
    """Each protected entry refuses a write into it and a rename (the swap for a planted one)."""
    details = []
    ok = True
    for name, kind in protected:
        path = os.path.join(workspace, name)
        if not os.path.lexists(path):
            # Held by name alone (Seatbelt): creating it must be refused.
            def create(path: str = path, kind: str = kind) -> None:
                if kind == "dir":
                    os.mkdir(path)
                    os.rmdir(path)
                else:
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW))
                    os.unlink(path)
            made = _errno_of(create)
            ok = ok and made in _HELD
            details.append(f"{name}: create {errno.errorcode.get(made, made) if made else 'allowed'}")
            continue
        if kind == "dir":
            wrote = _try_write(os.path.join(path, ".firstrun-attest"))
        else:
            def append(path: str = path) -> None:
                os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW))
            wrote = _errno_of(append)
        moved = _errno_of(lambda path=path: os.rename(path, path + ".firstrun-attest"))
        if moved is None:
            os.rename(path + ".firstrun-attest", path)
        ok = ok and wrote in _HELD and moved in _HELD
        details.append(f"{name}: write {errno.errorcode.get(wrote, wrote) if wrote else 'allowed'}"
                       f", rename {errno.errorcode.get(moved, moved) if moved else 'allowed'}")
    return ok, "; ".join(details)


_PR_GET_NO_NEW_PRIVS = 39


def check_privileges() -> tuple[bool, str]:
    st = _status()
    # Asked of the kernel, not read from /proc: gVisor's status file has no
    # NoNewPrivs line.
    nnp = ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
    ok = int(st["CapEff"], 16) == 0 and nnp == 1
    return ok, f"CapEff {st['CapEff']}, NoNewPrivs {nnp}"


def _refused(attempt: str, action) -> tuple[bool, str]:
    try:
        result = action()
    except OSError as exc:
        return exc.errno in (errno.EACCES, errno.EPERM), \
            f"{attempt}: {errno.errorcode.get(exc.errno, exc.errno)}"
    if isinstance(result, int) and not isinstance(result, bool):
        os.close(result)
    return False, f"{attempt}: allowed"


def check_supervisor(mode: str, self_mem: bool) -> tuple[bool, str]:
    """The process that runs this one (the helper or agent) is out of this one's reach.

    Its descriptors (the channel to the harness), memory and environment
    must not open, nor pid 1's memory; under ``foreign_uid`` it must not
    take a signal either; with ``self_mem`` this process's own memory file
    must not open for writing.
    """
    parent = os.getppid()
    if mode == "sentry":
        return _sentry_supervisor(parent)
    attempts = [
        (f"list /proc/{parent}/fd", lambda: os.listdir(f"/proc/{parent}/fd") and None),
        (f"read /proc/{parent}/environ", lambda: os.open(f"/proc/{parent}/environ", os.O_RDONLY)),
        (f"write /proc/{parent}/mem", lambda: os.open(f"/proc/{parent}/mem", os.O_RDWR)),
        ("write /proc/1/mem", lambda: os.open("/proc/1/mem", os.O_RDWR)),
    ]
    if mode == "foreign_uid":
        attempts.append((f"signal {parent}", lambda: os.kill(parent, 0)))
    if self_mem:
        attempts.append(("write /proc/self/mem", lambda: os.open("/proc/self/mem", os.O_RDWR)))
    results = [_refused(what, action) for what, action in attempts]
    return all(ok for ok, _ in results), "; ".join(detail for _, detail in results)


# What a gVisor helper's environment holds: runsc's fixed launch variables, no secret.
_LAUNCH_ENV = frozenset({"PATH", "LANG", "HOME"})


def _sentry_supervisor(parent: int) -> tuple[bool, str]:
    """gVisor's answer for a helper of another uid, which differs from Linux's.

    The sentry lists a foreign process's descriptors and shows its
    environment where Linux would refuse; what must hold is that none of its
    descriptors (the channel to the harness among them) opens for writing,
    its environment holds nothing but the launch's fixed variables, and its
    memory and signals are refused.
    """
    # ENOENT: a descriptor closed between the listing and the open.
    held = (errno.EACCES, errno.EPERM, errno.ENXIO, errno.ENODEV, errno.ENOENT)
    details, ok = [], True
    fds = sorted(os.listdir(f"/proc/{parent}/fd"), key=int)
    for fd in fds:
        try:
            os.close(os.open(f"/proc/{parent}/fd/{fd}", os.O_WRONLY))
        except OSError as exc:
            if exc.errno not in held:
                ok = False
                details.append(f"/proc/{parent}/fd/{fd}: {errno.errorcode.get(exc.errno, exc.errno)}")
            continue
        ok = False
        details.append(f"/proc/{parent}/fd/{fd} opened for writing")
    details.append(f"none of its {len(fds)} descriptors opens for writing" if ok else "")
    try:
        with open(f"/proc/{parent}/environ", "rb") as f:
            names = {entry.split(b"=", 1)[0].decode("utf-8", "replace")
                     for entry in f.read().split(b"\0") if entry}
    except OSError as exc:
        details.append(f"read /proc/{parent}/environ: {errno.errorcode.get(exc.errno, exc.errno)}")
    else:
        extra = sorted(names - _LAUNCH_ENV)
        ok = ok and not extra
        details.append(f"its environment: {', '.join(sorted(names)) or 'empty'}")
    for what, action in ((f"write /proc/{parent}/mem", lambda: os.open(f"/proc/{parent}/mem", os.O_RDWR)),
                         ("write /proc/1/mem", lambda: os.open("/proc/1/mem", os.O_RDWR)),
                         (f"signal {parent}", lambda: os.kill(parent, 0))):
        refused, detail = _refused(what, action)
        ok = ok and refused
        details.append(detail)
    return ok, "; ".join(d for d in details if d)


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def check_seccomp() -> tuple[bool, str]:
    """The filter is on: a new user namespace is refused, and so is a read of
    the probe's own memory by process_vm_readv, which every kernel grants a
    process over itself: only the filter refuses it."""
    mode = _status()["Seccomp"].strip()
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.unshare(_CLONE_NEWUSER)
    err = ctypes.get_errno()
    source, target = ctypes.create_string_buffer(b"probe"), ctypes.create_string_buffer(5)
    local, remote = _IoVec(ctypes.addressof(target), 5), _IoVec(ctypes.addressof(source), 5)
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    read = libc.process_vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    read_err = ctypes.get_errno()
    ok = mode == "2" and rc != 0 and read < 0
    return ok, (f"Seccomp {mode}, unshare(CLONE_NEWUSER): "
                f"{errno.errorcode.get(err, err) if rc else 'succeeded'}, process_vm_readv(itself): "
                f"{errno.errorcode.get(read_err, read_err) if read < 0 else f'read {read} bytes'}")


_SYS_LANDLOCK_CREATE_RULESET = 444
_LANDLOCK_CREATE_RULESET_VERSION = 1


def host_kernel() -> dict[str, object]:
    """What only this kernel answers: its version banner, its release and its Landlock ABI.

    Run on the host by the harness and inside by the probe; a session on a
    kernel of its own must answer every one differently.
    """
    with open("/proc/version", encoding="utf-8", errors="replace") as f:
        version = f.read().strip()
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    return {"version": version, "release": os.uname().release,
            "landlock_abi": abi if abi > 0 else -ctypes.get_errno(),
            "osrelease": os.path.exists("/proc/sys/kernel/osrelease")}


def check_foreign_kernel(host: dict[str, object]) -> tuple[bool, str]:
    here = host_kernel()
    same = [key for key in ("version", "release") if here[key] == host[key]]
    # Where the host answers, this kernel must not: Landlock's ABI, and a
    # sysctl every Linux kernel has but a user-space kernel need not.
    if isinstance(host["landlock_abi"], int) and host["landlock_abi"] > 0 \
            and here["landlock_abi"] == host["landlock_abi"]:
        same.append("landlock_abi")
    if host["osrelease"] and here["osrelease"]:
        same.append("osrelease")
    detail = (f"inside: {here['version']!r} (release {here['release']}, landlock "
              f"{here['landlock_abi']}, /proc/sys/kernel/osrelease "
              f"{'present' if here['osrelease'] else 'absent'}); host: release {host['release']}")
    return not same, detail + (f"; the same as the host's: {', '.join(same)}" if same else "")


def check_not_root() -> tuple[bool, str]:
    return os.geteuid() != 0, f"euid {os.geteuid()}, egid {os.getegid()}"


def check_seatbelt() -> tuple[bool, str]:
    """Seatbelt's own answer for this process: ``sandbox_check(pid, NULL, 0)`` is 1 when sandboxed."""
    libc = ctypes.CDLL(None)
    libc.sandbox_check.restype = ctypes.c_int
    libc.sandbox_check.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    rc = libc.sandbox_check(os.getpid(), None, 0)
    return rc == 1, f"sandbox_check(self): {rc}"


_CAPTURE_WAIT_S = 10.0


def _await_capture_route() -> None:
    """Until IPv4's default route through ``lo`` is there, or ``_CAPTURE_WAIT_S`` passed.

    The harness adds it last, after capture's tables and IPv6's route; past
    the deadline the checks run anyway, and fail for what is missing.
    """
    deadline = time.monotonic() + _CAPTURE_WAIT_S
    while time.monotonic() < deadline:
        with open("/proc/net/route") as f:
            if any(line.split()[:2] == ["lo", "00000000"] for line in f.readlines()[1:]):
                return
        time.sleep(0.001)


def _firewalled_captured(plan: dict) -> tuple[bool, str]:
    # Every other flow is redirected to the relay, so a dial "succeeds"
    # locally and is refused by the proxy; what the firewall itself must
    # refuse is the host and the sidecar's ports kept for the helper.
    return _all_refused([
        _dial_refused((plan["host_address"], 80), errno.ECONNREFUSED),
        _dial_refused((plan["proxy_host"], plan["proxy_port"] + 1), errno.ECONNREFUSED),
        _dial_refused((plan["proxy_host"], plan["proxy_port"] + 2), errno.ECONNREFUSED),
    ])


# Runs as ``python -I -S -c <this source> <plan json>`` (or the same program handed over as
# byte code: ``bytecode``): stdlib only, because inside the sandbox there is only the
# interpreter's own installation.
def main(argv: list[str]) -> int:
    plan = json.loads(argv[1])
    # While the probe is one thread with no socket of its own: the descriptors
    # it inherited, and unshare(), which the kernel refuses any process with
    # threads (EINVAL) whatever its filter says.
    results: list = [("no_inherited_fds", *check_fds())]
    kernel = plan.get("kernel", "linux")
    seccomp = plan.get("seccomp", True)
    seccomp_loaded = check_seccomp() if kernel != "darwin" and seccomp else None
    network = plan.get("network", "loopback_only")
    if plan.get("capture_loading"):
        _await_capture_route()
    # What waits on the network runs beside the rest; the report keeps this order.
    waiting = _Concurrent()
    if network == "shared":
        # The host's own network (an audit configuration): nothing to prove,
        # and nothing is dialled, so the probe sends no traffic at all.
        results.append(("network_not_required", True, "the session shares the host's network"))
    elif network == "firewalled":
        results.append(waiting.start("direct_egress_refused", check_firewalled))
    elif network == "profile_filtered":
        results.append(waiting.start("direct_egress_refused", check_profile_filtered))
    elif network == "firewalled_captured":
        results.append(waiting.start("direct_egress_refused", _firewalled_captured, plan))
        results.append(waiting.start("capture_in_force", check_captured, plan["nonce"]))
    elif network == "captured":
        results.append(("only_loopback_interface", *check_interfaces(captured=True)))
        results.append(waiting.start("capture_in_force", check_captured, plan["nonce"]))
    elif network == "user_restricted":
        results.append(("only_on_link_route", *check_on_link_only()))
        results.append(("no_route", *check_no_route()))
        results.append(waiting.start("no_dns", check_no_dns))
    else:
        results.append(("only_loopback_interface", *check_interfaces()))
        results.append(("no_route", *check_no_route()))
    if network != "shared":
        results.append(waiting.start("host_loopback_unreachable_inside", check_host_loopback,
                                     plan["canary_port"], plan.get("host_address", "127.0.0.1")))
    if plan["proxy_port"] is not None:
        results.append(waiting.start("proxy_answers", check_proxy, plan["proxy_port"],
                                     plan["nonce"], plan.get("proxy_host", "127.0.0.1")))
    results.append(("real_homes_unreadable", *check_homes(plan["real_homes"], plan["exposed"])))
    results.append(("writes_confined", *check_writes(plan["workspace"], plan["landlock"],
                                                     plan.get("write_witness"))))
    if plan.get("protected"):
        results.append(("workspace_entries_held",
                        *check_protected(plan["workspace"], plan["protected"])))
    if plan.get("supervisor", "same_uid") != "none":
        results.append(("supervisor_out_of_reach",
                        *check_supervisor(plan.get("supervisor", "same_uid"),
                                          plan.get("self_mem_sealed", False))))
    if plan.get("foreign_kernel") is not None:
        results.append(("kernel_not_the_hosts", *check_foreign_kernel(plan["foreign_kernel"])))
    if kernel == "darwin":
        results.append(("no_privileges", *check_not_root()))
        results.append(("seatbelt_applied", *check_seatbelt()))
    else:
        results.append(("no_privileges", *check_privileges()))
        if seccomp_loaded is not None:
            results.append(("seccomp_loaded", *seccomp_loaded))
        else:
            results.append(("seccomp_not_required", True, "the profile leaves seccomp out"))
    waiting.join()
    json.dump([{"name": n, "passed": p, "detail": d} for n, p, d in results], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
