"""Escape attempts, each made for real from inside a session and judged by evidence.

Evidence means something the host can observe: a canary listener that saw no
connection, a canary file that did not change, a host process that is gone,
a secret value that appears in no output. Exit codes alone prove nothing.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sandbox_support import (
    TcpCanary,
    UnixCanary,
    alive,
    has_ipv6_loopback,
    host_processes_with,
    wait_for_processes_with,
)

from firstrun.proxy.server import EgressProxy
from firstrun.sandbox.base import Session
from firstrun.sandbox.gvisor.backend import GvisorBackend
from firstrun.sandbox.linux.backend import LinuxBackend, LinuxSession
from support.profiles import make_profile

pytestmark = pytest.mark.escape

SECRET_NAMES = ("ANTHROPIC_API_KEY", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "OPENAI_API_KEY")


@dataclass
class Hostile:
    session: LinuxSession
    proxy: EgressProxy
    home: str
    workspace: str
    ssh_canary: str
    cargo_canary: str
    toolchain_canaries: dict[str, str]
    secrets: dict[str, str]
    leaked_fd: int
    leaked_path: str

    def run(self, command: str | list[str], **kwargs: object) -> str:
        """Run and return stdout + stderr, which every evidence check searches."""
        result = self.session.exec(command, timeout=60, **kwargs)
        return result.stdout.text() + result.stderr.text()


@pytest.fixture
def hostile(workspace: str, monkeypatch: pytest.MonkeyPatch, proxy) -> Iterator[Hostile]:
    egress, endpoint = proxy
    # A fake real home for the harness: never touch the real /root/.ssh.
    home = tempfile.mkdtemp(prefix="firstrun-fakehome-")
    os.makedirs(os.path.join(home, ".ssh"))
    os.makedirs(os.path.join(home, ".cargo", "bin"))
    ssh_canary = "ssh-canary-" + secrets.token_hex(8)
    cargo_canary = "cargo-canary-" + secrets.token_hex(8)
    with open(os.path.join(home, ".ssh", "id_ed25519"), "w") as f:
        f.write(ssh_canary)
    with open(os.path.join(home, ".cargo", "credentials.toml"), "w") as f:
        f.write(cargo_canary)
    # Toolchains on the PATH keep configuration and tokens beside their programs.
    toolchain_canaries: dict[str, str] = {}
    for relative in (".cargo/config.toml", ".cargo/credentials", ".npm-global/etc/npmrc",
                     ".pyenv/.netrc", ".gem/credentials", "go/pkg/mod/cache/download/token"):
        path = os.path.join(home, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        toolchain_canaries[path] = "toolchain-canary-" + secrets.token_hex(8)
        with open(path, "w") as f:
            f.write(toolchain_canaries[path])
    for program in (".npm-global/bin", ".pyenv/shims", ".gem/ruby/3.1.0/bin", "go/bin"):
        os.makedirs(os.path.join(home, program), exist_ok=True)
    monkeypatch.setenv("HOME", home)
    monkeypatch.setenv("PATH", ":".join([
        f"{home}/.cargo/bin", f"{home}/.npm-global/bin", f"{home}/.pyenv/shims",
        f"{home}/.gem/ruby/3.1.0/bin", f"{home}/go/bin", os.environ["PATH"]]))
    values = {name: f"{name.lower()}-canary-{secrets.token_hex(8)}" for name in SECRET_NAMES}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    # An fd the harness leaks carelessly (no CLOEXEC) before starting the session.
    leaked_path = os.path.join(home, "leaked.txt")
    with open(leaked_path, "w") as f:
        f.write("original")
    leaked_fd = os.open(leaked_path, os.O_RDWR | os.O_APPEND)
    os.set_inheritable(leaked_fd, True)
    session = LinuxBackend().start(make_profile(workspace), proxy=endpoint)
    try:
        yield Hostile(session=session, proxy=egress, home=home, workspace=workspace,
                      ssh_canary=ssh_canary, cargo_canary=cargo_canary,
                      toolchain_canaries=toolchain_canaries, secrets=values,
                      leaked_fd=leaked_fd, leaked_path=leaked_path)
    finally:
        session.close()
        os.close(leaked_fd)
        shutil.rmtree(home, ignore_errors=True)


class Confined:
    """A session on one backend of those that load the linux seccomp filter."""

    def __init__(self, session: Session, workspace: str) -> None:
        self.session = session
        self.workspace = workspace

    def run(self, command: str | list[str]) -> str:
        result = self.session.exec(command, timeout=60)
        return result.stdout.text() + result.stderr.text()


def _gvisor_missing() -> str | None:
    missing = [f"{c.name}: {c.detail}" for c in GvisorBackend().probe() if not c.available]
    return "; ".join(missing) or None


@pytest.fixture(params=["linux", "gvisor"])
def confined(request: pytest.FixtureRequest, workspace: str, proxy) -> Iterator[Confined]:
    """The same attempts, under bubblewrap and under gVisor's own kernel."""
    if request.param == "gvisor" and (why := _gvisor_missing()):
        pytest.skip(f"the gvisor backend is not available here: {why}")
    backend = LinuxBackend() if request.param == "linux" else GvisorBackend()
    with backend.start(make_profile(workspace), proxy=proxy[1]) as session:
        yield Confined(session, workspace)


def test_real_ssh_key_is_unreadable(hostile: Hostile) -> None:
    key = os.path.join(hostile.home, ".ssh", "id_ed25519")
    out = hostile.run(f"cat {key}; ls -la {hostile.home} {hostile.home}/.ssh; "
                      f"cat /proc/1/root{key} /proc/self/root{key}; "
                      f"grep -r ssh-canary {hostile.home} /root /home 2>&1 | head")
    assert hostile.ssh_canary not in out
    assert "No such file" in out


def test_secret_inside_an_exposed_toolchain_stays_hidden(hostile: Hostile) -> None:
    cargo = os.path.join(hostile.home, ".cargo")
    out = hostile.run(f"test -d {cargo}/bin && echo toolchain-visible; "
                      f"cat {cargo}/credentials.toml; head -c 100 {cargo}/credentials.toml; "
                      f"cat /proc/self/root{cargo}/credentials.toml")
    assert "toolchain-visible" in out
    assert hostile.cargo_canary not in out


def test_a_toolchain_on_the_path_lends_its_programs_never_its_configuration(
        hostile: Hostile) -> None:
    # Each toolchain is lent by the parts that run (bin, shims, versions), so
    # the tokens and registry configuration kept at its root stay behind.
    bins = ("/.cargo/bin", "/.npm-global/bin", "/.pyenv/shims", "/.gem/ruby/3.1.0/bin", "/go/bin")
    out = hostile.run("; ".join(
        [f"test -d {hostile.home}{b} && echo lent:{b}" for b in bins]
        + [f"cat {p} /proc/self/root{p}" for p in hostile.toolchain_canaries]
        + [f"grep -rs toolchain-canary {hostile.home} /proc/1/root{hostile.home}"]))
    assert all(f"lent:{b}" in out for b in bins), out
    assert not any(canary in out for canary in hostile.toolchain_canaries.values()), out


def test_writes_outside_the_workspace_do_not_land(hostile: Hostile) -> None:
    host_tmp = tempfile.NamedTemporaryFile("w", prefix="firstrun-hosttmp-", delete=False)
    host_tmp.write("original")
    host_tmp.close()
    etc_canary = f"/etc/firstrun-canary-{secrets.token_hex(4)}"
    home_canary = os.path.join(hostile.home, "planted")
    try:
        hostile.run(f"echo pwned > {etc_canary}; echo pwned > {home_canary}; "
                    f"mkdir -p {hostile.home}; echo pwned > {home_canary}; "
                    f"echo pwned > {host_tmp.name}; echo pwned >> /usr/lib/os-release; "
                    f"echo pwned > /root/.bashrc")
        assert not os.path.exists(etc_canary)
        assert not os.path.exists(home_canary)
        with open(host_tmp.name) as f:
            assert f.read() == "original"
        assert b"pwned" not in open("/usr/lib/os-release", "rb").read()
    finally:
        os.unlink(host_tmp.name)


def test_a_raw_ip_dial_reaches_only_the_proxy_which_refuses_it(hostile: Hostile) -> None:
    # Under transparent capture the dial is accepted inside, by the relay; what
    # must hold is that nothing answers it and the proxy refused it by the
    # address alone, never dialling (the registry's real address is one the
    # host can reach, so only the boundary keeps it from answering).
    out = hostile.run(["python3", "-c", (
        "import socket, errno\n"
        "for fam, addr in ((socket.AF_INET, ('203.0.113.80', 443)), "
        "(socket.AF_INET6, ('::ffff:203.0.113.80', 443)), (socket.AF_INET6, ('2001:db8::1', 443))):\n"
        "    s = socket.socket(fam); s.settimeout(5)\n"
        "    try:\n"
        "        s.connect(addr); s.sendall(b'\\x16\\x03\\x01'); print('ANSWERED' if s.recv(64) else 'closed')\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode[e.errno])\n"
    )])
    assert "ANSWERED" not in out, out
    refused = [r for r in hostile.proxy.records() if r.capture == "transparent"
               and r.host != "attest.firstrun.invalid"]
    assert refused and all(r.denied and r.reason == "ip_literal" and r.resolved is None
                           for r in refused), refused
    assert "203.0.113.80" in {r.host for r in refused}


def test_names_resolve_only_to_what_stands_for_them(hostile: Hostile) -> None:
    out = hostile.run(["python3", "-c", (
        "import socket\n"
        "for name in ('pypi.org', 'example.com'):\n"
        "    try:\n"
        "        print(name, socket.getaddrinfo(name, 443, socket.AF_INET)[0][4][0])\n"
        "    except socket.gaierror as e:\n"
        "        print(name, 'gaierror')\n"
    )])
    answers = dict(line.split() for line in out.splitlines())
    # An allowed name gets a synthetic address (the stub never resolves it);
    # a refused one, nothing.
    assert answers["pypi.org"].startswith("198.18."), out
    assert answers["example.com"] == "gaierror"
    records = hostile.proxy.records()
    assert not [r for r in records if r.host == "pypi.org"]
    assert [(r.scheme, r.reason) for r in records if r.host == "example.com"] == [
        ("dns", "dns_not_allowed")]


def test_a_client_ignoring_the_proxy_variables_still_goes_through_the_proxy(
        hostile: Hostile, records_until) -> None:
    # Pinned to the registry's real address, curl reaches only the proxy, which
    # refuses an address that stands for no name; resolving by itself, it gets
    # the synthetic address, and the proxy carries it like a CONNECT, recorded.
    out = hostile.run("curl -sS --noproxy '*' --max-time 10 --resolve pypi.org:443:203.0.113.80 "
                      "https://pypi.org/simple/six/ -o /dev/null; echo rc=$?; "
                      "env -u https_proxy -u HTTPS_PROXY -u ALL_PROXY -u all_proxy curl -sS "
                      "--max-time 30 https://pypi.org/simple/six/ -o /dev/null; echo rc=$?")
    first, second = (line for line in out.splitlines() if line.startswith("rc="))
    assert first != "rc=0" and second == "rc=0", out
    records = records_until(hostile.proxy.records, lambda rs: any(
        r.host == "pypi.org" and r.capture == "transparent" for r in rs))
    transparent = [(r.host, r.decision.value, r.reason.value) for r in records
                   if r.capture == "transparent" and r.host != "attest.firstrun.invalid"]
    assert ("203.0.113.80", "deny", "ip_literal") in transparent
    assert ("pypi.org", "allow", "allowed_by_list") in transparent


def test_host_loopback_canary_sees_no_connection(hostile: Hostile) -> None:
    v4 = TcpCanary("127.0.0.1")
    # A host booted without IPv6 has no ::1 to listen on: the IPv4 canary still judges.
    v6 = TcpCanary("::1") if has_ipv6_loopback() else None
    v6_target = f", ('::1', {v6.port})" if v6 is not None else ""
    try:
        out = hostile.run(["python3", "-c", (
            "import socket\n"
            f"for addr in (('127.0.0.1', {v4.port}), ('127.0.0.2', {v4.port}), "
            f"('0.0.0.0', {v4.port}){v6_target}):\n"
            "    s = socket.socket(socket.AF_INET6 if ':' in addr[0] else socket.AF_INET)\n"
            "    s.settimeout(5)\n"
            "    try:\n"
            "        s.connect(addr); print('CONNECTED', addr)\n"
            "    except OSError as e:\n"
            "        print('refused', e.errno)\n"
        )])
        # And through the proxy, which must refuse the harness's own loopback.
        out += hostile.run(f"curl -sS --max-time 10 http://127.0.0.1:{v4.port}/; "
                           f"curl -sS --max-time 10 -x http://127.0.0.1:3128 "
                           f"http://localhost:{v4.port}/")
        assert "CONNECTED" not in out
        assert v4.accepted() == 0 and (v6 is None or v6.accepted() == 0)
    finally:
        v4.close()
        if v6 is not None:
            v6.close()


def test_no_process_survives_close(workspace: str) -> None:
    token = f"firstrun-survivor-{secrets.token_hex(6)}"
    daemon = (
        "import os, signal, sys, time\n"
        "if os.fork(): sys.exit(0)\n"
        "os.setsid()\n"
        "if os.fork(): sys.exit(0)\n"
        "for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT): signal.signal(sig, signal.SIG_IGN)\n"
        "os.closerange(0, 3)\n"
        "time.sleep(1000)\n"
    )
    session = LinuxBackend().start(make_profile(workspace), proxy=None)
    session.exec(["python3", "-c", daemon, token])
    session.exec(f"nohup bash -c 'exec -a {token} sleep 1000' > /dev/null 2>&1 & disown")
    survivors = wait_for_processes_with(token, 2)
    assert len(survivors) == 2
    session.close()
    assert not any(alive(pid, start) for pid, start in survivors)
    assert host_processes_with(token) == []


# A child keeps a canary in its memory and says where; the parent attaches to
# it and reads there, word by word (PTRACE_PEEKDATA) and in one go
# (process_vm_readv), and prints whatever bytes it got.
TRACER = """
import ctypes, os, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
child = subprocess.Popen([sys.executable, '-c', (
    'import ctypes, sys, time\\n'
    'canary = ctypes.create_string_buffer(sys.argv[1].encode())\\n'
    'print(ctypes.addressof(canary), flush=True)\\n'
    'ok = ctypes.string_at(ctypes.addressof(canary), len(sys.argv[1])) == sys.argv[1].encode()\\n'
    'print("control", "holds" if ok else "missing", flush=True)\\n'
    'time.sleep(1000)\\n'), sys.argv[1]], stdout=subprocess.PIPE, text=True)
address = int(child.stdout.readline())
print(child.stdout.readline().strip())
n = len(sys.argv[1])
rc = libc.ptrace(16, child.pid, None, None)  # PTRACE_ATTACH
print('attach', rc, ctypes.get_errno())
time.sleep(0.1)
got = bytearray()
for offset in range(0, n, 8):
    ctypes.set_errno(0)
    word = libc.ptrace(2, child.pid, ctypes.c_void_p(address + offset), None)  # PEEKDATA
    if ctypes.get_errno() == 0:
        got += (word & (1 << 64) - 1).to_bytes(8, 'little')
print('peek', ctypes.get_errno(), got.hex())
class IoVec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
buf = ctypes.create_string_buffer(n)
local, remote = IoVec(ctypes.addressof(buf), n), IoVec(address, n)
libc.process_vm_readv.restype = ctypes.c_ssize_t
read = libc.process_vm_readv(child.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
print('vm_readv', read, ctypes.get_errno(), buf.raw[:max(read, 0)].hex())
tracer = [l for l in open(f'/proc/{child.pid}/status') if l.startswith('TracerPid')][0]
print('tracer', tracer.split()[1])
child.kill()
"""


def test_no_command_traces_or_reads_another(confined: Confined) -> None:
    canary = "trace-canary-" + secrets.token_hex(12)
    out = confined.run(["python3", "-c", TRACER, canary])
    assert "control holds" in out, out  # the address is where the canary is
    assert "attach -1 1" in out and "tracer 0" in out, out  # EPERM
    assert "peek 1 " in out and "vm_readv -1 1 " in out, out
    # Not a byte of it came back, by either route.
    assert canary not in out and canary.encode().hex()[:16] not in out


def test_helper_introspection_is_denied(hostile: Hostile) -> None:
    out = hostile.run(["python3", "-c", (
        "import os\n"
        # The helper is this command's parent: its control socket is behind /proc/<pid>/fd.
        "helper = os.getppid()\n"
        "for what in ('fd', 'mem', 'environ'):\n"
        "    try:\n"
        "        os.listdir(f'/proc/{helper}/fd') if what == 'fd' else open(f'/proc/{helper}/{what}', 'rb').read(1)\n"
        "        print('helper', what, 'OPEN')\n"
        "    except OSError as e:\n"
        "        print('helper', what, 'denied', e.errno)\n"
    )])
    assert out.count("denied") == 3 and "OPEN" not in out


def test_tiocsti_cannot_inject_input(hostile: Hostile) -> None:
    out = hostile.run(["python3", "-c", (
        "import ctypes, fcntl, os, termios\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "master, slave = os.openpty()\n"
        "for request in (termios.TIOCSTI, termios.TIOCSTI | (1 << 32)):\n"
        "    c = ctypes.c_char(b'x')\n"
        "    rc = libc.syscall(16, slave, ctypes.c_ulong(request), ctypes.byref(c))\n"  # SYS_ioctl
        "    print('ioctl', rc, ctypes.get_errno())\n"
        "os.set_blocking(slave, False)\n"
        "try:\n"
        "    print('INJECTED', os.read(slave, 10))\n"
        "except BlockingIOError:\n"
        "    print('nothing injected')\n"
    )])
    assert out.count("ioctl -1 1") == 2
    assert "INJECTED" not in out and "nothing injected" in out


def test_harness_secrets_are_visible_by_no_route(hostile: Hostile) -> None:
    out = hostile.run("env; cat /proc/1/environ /proc/*/environ /proc/*/cmdline 2>/dev/null "
                      "| tr '\\0' '\\n'; cat /proc/self/environ | tr '\\0' '\\n'")
    assert "PATH=" in out  # the routes were really read
    for value in hostile.secrets.values():
        assert value not in out


def test_inherited_fds_are_not_usable_inside(hostile: Hostile) -> None:
    fd = hostile.leaked_fd
    out = hostile.run(f"ls /proc/self/fd; for fd in $(seq 3 {fd + 8}); do "
                      f"(echo pwned >&$fd) 2>/dev/null && echo wrote-$fd; done; echo done")
    assert "wrote-" not in out and "done" in out
    with open(hostile.leaked_path) as f:
        assert f.read() == "original"


def test_etc_shadow_is_unreadable(hostile: Hostile) -> None:
    if os.geteuid() != 0:
        pytest.skip("a non-root harness cannot read /etc/shadow either")
    with open("/etc/shadow") as f:
        first = f.readline().strip()
    out = hostile.run("cat /etc/shadow; head -c 100 /etc/shadow")
    assert first and first not in out
    assert "Permission denied" in out


def test_host_sockets_are_unreachable(hostile: Hostile) -> None:
    tag = secrets.token_hex(4)
    canaries = [UnixCanary(f"/tmp/firstrun-canary-{tag}.sock"),
                UnixCanary(f"\0firstrun-canary-{tag}")]
    os.makedirs("/run/firstrun-test", exist_ok=True)
    canaries.append(UnixCanary(f"/run/firstrun-test/canary-{tag}.sock"))
    targets = [c.address for c in canaries] + [
        "/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
        "/run/dbus/system_bus_socket", "/run/user/0/bus",
    ]
    try:
        out = hostile.run(["python3", "-c", (
            "import socket, sys\n"
            "for path in sys.argv[1:]:\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try:\n"
            "        s.connect(path.replace('@', '\\0', 1) if path.startswith('@') else path)\n"
            "        print('CONNECTED', path)\n"
            "    except OSError as e:\n"
            "        print('refused', e.errno)\n"
        ), *[t.replace("\0", "@", 1) for t in targets]])
        assert "CONNECTED" not in out
        assert out.count("refused") == len(targets)
        assert [c.accepted() for c in canaries] == [0, 0, 0]
    finally:
        for c in canaries:
            c.close()


def test_seccomp_refuses_namespace_and_kernel_surface(confined: Confined) -> None:
    out = confined.run(["python3", "-c", (
        "import ctypes, errno, os, socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(name, nr, *args):\n"
        "    rc = libc.syscall(nr, *[ctypes.c_ulong(a) for a in args])\n"
        "    print(name, 'ok' if rc >= 0 else errno.errorcode[ctypes.get_errno()])\n"
        "ns = os.readlink('/proc/self/ns/user')\n"
        "call('unshare_user', 272, 0x10000000)\n"
        "call('unshare_mount', 272, 0x00020000)\n"
        "call('unshare_user_mount', 272, 0x10000000 | 0x00020000)\n"
        "call('clone_newuser', 56, 0x10000000 | 17, 0, 0, 0, 0)\n"
        "call('clone3', 435, 0, 0)\n"
        "call('mount', 165, 0, 0, 0, 0, 0)\n"
        "call('bpf', 321, 0, 0, 0)\n"
        "call('keyctl', 250, 0, 0)\n"
        "call('userfaultfd', 323, 0)\n"
        "call('io_uring_setup', 425, 1, 0)\n"
        "call('perf_event_open', 298, 0, 0, 0, 0, 0)\n"
        "call('personality_no_aslr', 135, 0x0040000)\n"
        "call('memfd_secret', 447, 0)\n"
        "for fam in (socket.AF_NETLINK, socket.AF_PACKET, 0, 40):\n"
        "    try:\n"
        "        socket.socket(fam, socket.SOCK_RAW if fam != 40 else socket.SOCK_STREAM).close()\n"
        "        print('family', fam, 'ok')\n"
        "    except OSError as e:\n"
        "        print('family', fam, errno.errorcode[e.errno])\n"
        "print('same_userns', os.readlink('/proc/self/ns/user') == ns)\n"
    )])
    lines = dict(line.rsplit(" ", 1) for line in out.splitlines())
    for name in ("unshare_user", "unshare_mount", "unshare_user_mount", "clone_newuser", "mount", "bpf", "keyctl",
                 "userfaultfd", "io_uring_setup", "perf_event_open", "personality_no_aslr",
                 "memfd_secret"):
        assert lines[name] == "EPERM", (name, out)
    assert lines["clone3"] == "ENOSYS"
    for fam in (16, 17, 0, 40):
        assert lines[f"family {fam}"] == "EAFNOSUPPORT", (fam, out)
    assert lines["same_userns"] == "True"


# A user namespace of its own would make the command root over a mount
# namespace of its own, where it could mount a tmpfs over the workspace's
# directory and hide what it writes there from the host.
MOUNTER = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def answer(rc):
    return 'ok' if rc == 0 else errno.errorcode[ctypes.get_errno()]
os.mkdir('target')
before = open('/proc/self/mountinfo').read()
print('unshare', answer(libc.unshare(0x10000000 | 0x00020000)))
print('mount', answer(libc.mount(b'tmpfs', b'target', b'tmpfs', 0, None)))
with open('target/marker', 'w') as f:
    f.write('written')
print('mountinfo', 'same' if open('/proc/self/mountinfo').read() == before else 'CHANGED')
"""


def test_no_user_namespace_or_mount_of_its_own(confined: Confined) -> None:
    out = confined.run(["python3", "-c", MOUNTER])
    assert "unshare EPERM" in out and "mount EPERM" in out, out
    assert "mountinfo same" in out, out
    # What was written landed in the host's directory: nothing was mounted over it.
    with open(os.path.join(confined.workspace, "target", "marker")) as f:
        assert f.read() == "written"
