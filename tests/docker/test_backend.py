"""The docker backend on a real dockerd: sessions, escapes judged by canaries, cleanup, reaping."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.policy.network import NetworkPolicy
from firstrun.policy.profile import LayerName
from firstrun.sandbox.base import Enforcement, ProxyEndpoint
from firstrun.sandbox.docker.backend import DockerBackend
from firstrun.sandbox.docker.resources import docker, harness_identity
from firstrun.sandbox.helper import landlock_abi
from support.profiles import make_profile

pytestmark = pytest.mark.usefixtures("docker_ready")
# The docker backend brings its own proxy; the endpoint only says "with a proxy".
WITH_PROXY = ProxyEndpoint(socket_path="/nonexistent/harness-proxy.sock", nonce="unused")


PYPI = NetworkPolicy.build(allow=["pypi.org"])



def _owned_by(harness: str) -> tuple[list[str], list[str], list[str]]:
    """What a harness left: filtered by its label, so concurrent suites do not interfere."""
    label = f"label=org.firstrun.harness={harness}"
    return (docker("ps", "--all", "--filter", label, "--format", "{{.Names}}").stdout.split(),
            docker("network", "ls", "--filter", label, "--format", "{{.Name}}").stdout.split(),
            docker("volume", "ls", "--filter", label, "--format", "{{.Name}}").stdout.split())


def _left() -> tuple[list[str], list[str], list[str]]:
    return _owned_by(harness_identity())


def test_a_session_runs_commands_attested_and_gives_the_workspace_back(workspace: str) -> None:
    os.chown(workspace, 4321, 4322)
    with DockerBackend().start(make_profile(workspace, net=PYPI), proxy=WITH_PROXY) as session:
        assert all(c.passed for c in session.info.attestation)
        names = {c.name for c in session.info.attestation}
        assert {"direct_egress_refused", "proxy_answers", "host_canary_saw_nothing",
                "seccomp_loaded", "no_privileges", "writes_confined"} <= names
        # Every layer required, every layer provided: enforced, with Landlock
        # (where this kernel has it) applied by the helper over the read-only root.
        assert session.info.enforcement is Enforcement.ENFORCED
        assert session.info.downgrades == ()
        # The image it ran in, for what a failed step's image lacked (run.lacking).
        assert session.info.image == "firstrun/python:3.11"
        layers = {l.name: l for l in session.info.layers}
        assert set(layers) == {layer.value for layer in LayerName}
        assert all(l.applied for l in layers.values())
        abi = landlock_abi()
        assert layers["landlock"].mechanism == (f"landlock ABI {abi} + read-only root" if abi
                                                else "read-only root + tmpfs")
        checks = {c.name: c for c in session.info.attestation}
        if abi:
            # The witness tmpfs is writable by its mode: only Landlock refuses.
            assert "/run/firstrun-witness: EACCES" in checks["writes_confined"].detail
        assert "signal 1: EPERM" in checks["supervisor_out_of_reach"].detail
        result = session.exec("id -u; mkdir -p sub && echo hi > sub/f && cat sub/f; touch /etc/x",
                              timeout=60)
        assert result.stdout.text() == "4321\nhi\n"
        assert result.exit_code == 1 and "Read-only file system" in result.stderr.text()
        assert session.exec(["pwd"], cwd="sub").stdout.text() == "/workspace/sub\n"
    for path in (os.path.join(workspace, "sub"), os.path.join(workspace, "sub", "f")):
        assert os.stat(path).st_uid == 4321
    assert _left() == ([], [], [])


def test_a_root_owned_workspace_is_lent_and_given_back(workspace: str) -> None:
    assert os.stat(workspace).st_uid == 0
    with DockerBackend().start(make_profile(workspace, net=PYPI), proxy=None) as session:
        uid = int(session.exec("id -u; echo x > made", timeout=60).stdout.text())
        assert uid != 0
        assert os.stat(os.path.join(workspace, "made")).st_uid == uid
    assert {os.stat(os.path.join(workspace, p)).st_uid for p in ("", "made")} == {0}


def test_direct_dials_fail_and_the_host_canary_sees_nothing(workspace: str) -> None:
    canary = socket.socket()
    canary.bind(("0.0.0.0", 0))
    canary.listen(16)
    canary.setblocking(False)
    port = canary.getsockname()[1]
    try:
        with DockerBackend().start(make_profile(workspace, net=PYPI), proxy=WITH_PROXY) as session:
            # The host's address on the internal bridge.
            gateway_ip = docker("network", "inspect", "--format",
                                "{{(index .IPAM.Config 0).Gateway}}",
                                session.topology.internal_network).stdout.strip()
            # Judged by an answer: under capture a dial elsewhere is accepted by
            # the relay, refused by the proxy and closed with nothing said.
            script = ("import socket,sys\n"
                      "for h in sys.argv[2:]:\n"
                      "    s=socket.socket(); s.settimeout(5)\n"
                      "    try:\n"
                      "        s.connect((h,int(sys.argv[1]))); s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
                      "        print(h,'ANSWERED' if s.recv(64) else 'closed')\n"
                      "    except OSError as e: print(h,e.errno)\n")
            out = session.exec(["python3", "-c", script, str(port), gateway_ip, "172.17.0.1",
                                "127.0.0.1"], timeout=60).stdout.text()
            assert "ANSWERED" not in out and len(out.splitlines()) == 3, out
            curl = session.exec(f"curl -sS --noproxy '*' -m 5 http://{gateway_ip}:{port}/",
                                timeout=60)
            assert curl.exit_code != 0
        with pytest.raises(BlockingIOError):
            canary.accept()
    finally:
        canary.close()


def test_the_sidecar_enforces_the_policy_and_records_reach_the_harness_live(
        workspace: str) -> None:
    fifo = os.path.join(workspace, "seen")
    os.mkfifo(fifo)
    os.chown(fifo, 0, 0)
    os.chmod(fifo, 0o666)
    records: list[dict[str, object]] = []

    def on_record(record: dict[str, object]) -> None:
        records.append(record)
        if record["host"] == "denied.example":
            # The command waits on this: it can only end if the record
            # reached the harness while the command still ran.
            with open(fifo, "w") as f:
                f.write("seen\n")

    with DockerBackend(on_record=on_record).start(make_profile(workspace, net=PYPI), proxy=WITH_PROXY) as s:
        result = s.exec("curl -sS -o /dev/null -w '%{http_code}\\n' http://denied.example/x; "
                        "cat seen", timeout=60)
        assert result.stdout.text() == "403\nseen\n"
    denied = [r for r in records if r["host"] == "denied.example"]
    assert [(r["decision"], r["reason"], r["layer"]) for r in denied] == [
        ("deny", "not_allowed", "default")]
    assert records[0]["reason"] == "attestation"


def test_a_timeout_kills_the_tree_and_interrupt_ends_a_command(workspace: str) -> None:
    with DockerBackend().start(make_profile(workspace, net=PYPI), proxy=None) as session:
        result = session.exec("setsid bash -c 'sleep 5101 & sleep 5102' & sleep 5103", timeout=2)
        assert result.timed_out
        assert "sleep 510" not in session.exec("ps -eo args", timeout=30).stdout.text()
        started = threading.Event()

        def stop_when_started(stream: object, data: bytes) -> None:
            started.set()

        threading.Thread(target=lambda: (started.wait(60), session.interrupt()),
                         daemon=True).start()
        with pytest.raises(SandboxError):
            session.exec("echo go; sleep 5201", timeout=600, on_output=stop_when_started)
        with pytest.raises(SandboxError):
            session.exec("true")
    assert _left() == ([], [], [])


CHILD = """
import os, sys, time
from firstrun.policy.network import NetworkPolicy
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.docker.backend import DockerBackend
from firstrun.sandbox.docker.resources import harness_identity
from firstrun.sandbox.hostfs import host_filesystem_policy
from firstrun.sandbox.base import ProxyEndpoint
profile = SandboxProfile(fs=host_filesystem_policy(sys.argv[1], os.environ, protect=False),
                         net=NetworkPolicy.build())
session = DockerBackend().start(profile, proxy=ProxyEndpoint(socket_path="/x", nonce="x"))
print(harness_identity(), flush=True)
time.sleep(600)
"""


def test_a_sigkilled_harness_leaves_resources_that_the_next_start_reaps(workspace: str) -> None:
    other = tempfile.mkdtemp(prefix="firstrun-docker-ws-")
    child = subprocess.Popen([sys.executable, "-c", CHILD, other], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        dead = child.stdout.readline().strip()
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        containers, networks, _ = _owned_by(dead)
        assert len(containers) == 2 and len(networks) == 2
        with DockerBackend().start(make_profile(workspace, net=PYPI), proxy=None) as session:
            assert session.exec("true", timeout=30).exit_code == 0
            assert _owned_by(dead) == ([], [], [])
            containers, networks, _ = _left()
            assert sorted(containers) == sorted([session.topology.run, session.topology.sidecar])
    finally:
        shutil.rmtree(other, ignore_errors=True)
    assert _left() == ([], [], [])


def test_refusals_before_anything_is_created(workspace: str) -> None:
    with pytest.raises(SandboxUnavailable) as missing:
        DockerBackend(image="node:22-slim").start(make_profile(workspace, net=PYPI), proxy=None)
    assert missing.value.fix is not None and "docker pull node:22-slim" in missing.value.fix
    assert _left() == ([], [], [])


def test_a_tunnel_still_open_at_close_is_recorded(workspace: str) -> None:
    # A tunnel's record is written when it ends (it carries the bytes and the
    # duration), so a session that killed its sidecar outright would lose the
    # record of every tunnel a background process still held open.
    records: list[dict[str, object]] = []
    with DockerBackend(on_record=records.append).start(make_profile(workspace, net=PYPI),
                                                       proxy=WITH_PROXY) as s:
        held = s.exec(
            "python3 - <<'PY' &\n"
            "import os, socket, time, urllib.parse\n"
            "proxy = urllib.parse.urlsplit(os.environ['https_proxy'])\n"
            "c = socket.create_connection((proxy.hostname, proxy.port))\n"
            "c.sendall(b'CONNECT pypi.org:443 HTTP/1.1\\r\\nHost: pypi.org:443\\r\\n\\r\\n')\n"
            "open('status', 'wb').write(c.recv(100).split(b'\\r\\n')[0] + b'\\n')\n"
            "time.sleep(3600)\n"
            "PY\n"
            "for _ in $(seq 600); do [ -s status ] && break; sleep 0.1; done; cat status; "
            "echo held", timeout=120)
        assert held.stdout.text().splitlines() == ["HTTP/1.1 200 Connection established", "held"]
        assert not [r for r in records if r["host"] == "pypi.org"]
    tunnels = [r for r in records if r["host"] == "pypi.org"]
    assert [(r["method"], r["decision"]) for r in tunnels] == [("CONNECT", "allow")]


@pytest.mark.parametrize("name", ["ws,readonly", 'a "quoted"\nname,readonly'])
def test_a_workspace_named_anything_is_bound_as_itself(name: str) -> None:
    # Docker reads --mount as CSV: unquoted, each name would make the
    # workspace read-only, or (the quote and the newline) not parse at all.
    parent = tempfile.mkdtemp(prefix="firstrun-docker-odd-")
    try:
        path = os.path.join(parent, name)
        os.mkdir(path)
        with DockerBackend().start(make_profile(path, net=PYPI), proxy=WITH_PROXY) as session:
            result = session.exec("echo hi > made && pwd", timeout=60)
        assert (result.exit_code, result.stdout.text()) == (0, "/workspace\n"), result.stderr.text()
        with open(os.path.join(path, "made")) as f:
            assert f.read() == "hi\n"
    finally:
        shutil.rmtree(parent, ignore_errors=True)
