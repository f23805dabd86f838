"""The topology on a real dockerd, judged by evidence: a host canary, the sidecar's own records.

``--internal`` alone leaves the host reachable from the run container (a
canary on the host's 0.0.0.0 accepts a connection through the bridge); the
namespace firewall closes it, and the sidecar stays the one way out.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading

import pytest
from docker_support import create, labelled, make_topology, run_python, start_run, start_sidecar

from firstrun.sandbox.docker.resources import apply_firewall, docker, reap, remove

pytestmark = pytest.mark.usefixtures("docker_ready")

DIAL = """
import errno, json, socket, sys
out = {}
for host, port in json.loads(sys.argv[1]):
    s = socket.socket(); s.settimeout(5)
    try:
        s.connect((host, port)); out[f"{host}:{port}"] = "connected"
    except OSError as e:
        out[f"{host}:{port}"] = errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()
print(json.dumps(out))
"""


def _dial(topology, targets: list[tuple[str, int]]) -> dict[str, str]:
    done = docker("exec", "--user", "1000:1000", topology.run, "python3", "-I", "-c", DIAL,
                  json.dumps(targets))
    return json.loads(done.stdout)


def _accepted(canary: socket.socket) -> int:
    count = 0
    while True:
        try:
            conn, _ = canary.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def _gateway(topology) -> str:
    return docker("network", "inspect", "--format", "{{(index .IPAM.Config 0).Gateway}}",
                  topology.internal_network).stdout.strip()


def test_firewall_closes_the_host_and_leaves_only_the_sidecar() -> None:
    workspace = tempfile.mkdtemp(prefix="firstrun-docker-ws-")
    os.chown(workspace, 1000, 1000)
    profile, topology = make_topology(workspace)
    canary = socket.socket()
    canary.bind(("0.0.0.0", 0))
    canary.listen(16)
    canary.setblocking(False)
    port = canary.getsockname()[1]
    try:
        create(topology)
        sidecar = start_sidecar(profile, topology)
        start_run(topology)
        gateway = _gateway(topology)

        # Control: without the firewall the host's bridge address answers.
        before = _dial(topology, [(gateway, port)])
        assert before == {f"{gateway}:{port}": "connected"}
        assert _accepted(canary) == 1

        pid = int(docker("inspect", "--format", "{{.State.Pid}}", topology.run).stdout)
        apply_firewall(pid, sidecar.ip)
        after = _dial(topology, [(gateway, port), ("172.17.0.1", port), ("203.0.113.1", 80)])
        assert all(v != "connected" for v in after.values()), after
        assert _accepted(canary) == 0

        # The embedded DNS server (CVE-2024-29018's path) is unreachable.
        dns = run_python(topology, """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
try:
    s.sendto(b"\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x07invalid\\x00\\x00\\x01\\x00\\x01", ("127.0.0.11", 53))
    s.recv(512); print("answered")
except OSError as e:
    print("refused", e.errno)
""")
        assert dns.stdout.startswith("refused"), dns.stdout + dns.stderr

        # The sidecar still answers, with its nonce, and records a denied host.
        proxied = run_python(topology, f"""
import http.client
for host in ("attest.firstrun.invalid", "denied.example"):
    c = http.client.HTTPConnection("{sidecar.ip}", 3128, timeout=10)
    c.request("GET", f"http://{{host}}/", headers={{"Host": host}})
    r = c.getresponse(); print(r.status, r.read().decode(errors="replace"))
""")
        assert sidecar.nonce in proxied.stdout
        assert "403" in proxied.stdout
        first, second = sidecar.next_message(), sidecar.next_message()
        assert first["record"]["reason"] == "attestation"
        assert (second["record"]["host"], second["record"]["decision"],
                second["record"]["reason"]) == ("denied.example", "deny", "not_allowed")

        # Hardening as the daemon applied it.
        config = json.loads(docker("inspect", topology.run).stdout)[0]
        host = config["HostConfig"]
        assert host["CapDrop"] == ["ALL"] and host["ReadonlyRootfs"] is True
        assert host["SecurityOpt"] == ["no-new-privileges"]
        assert host["PidsLimit"] == profile.limits.pids
        assert list(config["NetworkSettings"]["Networks"]) == [topology.internal_network]
        internal = json.loads(docker("network", "inspect", topology.internal_network).stdout)[0]
        assert internal["Internal"] is True
        status = run_python(topology, "print(open('/proc/self/status').read())").stdout
        fields = dict(l.split(":\t", 1) for l in status.splitlines() if ":\t" in l)
        assert int(fields["CapEff"], 16) == 0
        assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"
        assert fields["Uid"].split()[0] == "1000"
    finally:
        canary.close()
        remove(topology)
        os.rmdir(workspace)
    assert labelled("container", topology.session) == []
    assert labelled("network", topology.session) == []


CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from docker_support import create, make_topology
profile, topology = make_topology(sys.argv[2])
print(topology.session, flush=True)
create(topology)
print("created", flush=True)
import time
time.sleep(600)
"""


def test_resources_of_a_killed_harness_are_reaped_and_a_live_ones_kept() -> None:
    workspace = tempfile.mkdtemp(prefix="firstrun-docker-ws-")
    here = os.path.dirname(__file__)
    child = subprocess.Popen([sys.executable, "-c", CHILD, here, workspace],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    session = child.stdout.readline().strip()
    assert child.stdout.readline().strip() == "created"
    _, mine = make_topology(workspace)
    try:
        create(mine)
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        assert len(labelled("container", session)) == 2
        reaped = reap()
        # Other dead harnesses' leftovers may go too; these must.
        assert {f"firstrun-{session}-run", f"firstrun-{session}-proxy"} <= set(reaped.containers)
        assert labelled("container", session) == []
        assert labelled("network", session) == []
        # This harness is alive: its resources stay.
        assert len(labelled("container", mine.session)) == 2
        assert len(labelled("network", mine.session)) == 2
    finally:
        remove(mine)
        os.rmdir(workspace)
    assert labelled("container", mine.session) == []


def test_concurrent_reapers_both_succeed() -> None:
    workspace = tempfile.mkdtemp(prefix="firstrun-docker-ws-")
    here = os.path.dirname(__file__)
    child = subprocess.Popen([sys.executable, "-c", CHILD, here, workspace],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    session = child.stdout.readline().strip()
    assert child.stdout.readline().strip() == "created"
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    errors: list[BaseException] = []

    def reaper() -> None:
        try:
            reap()
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=reaper) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.rmdir(workspace)
    assert errors == []
    assert labelled("container", session) == [] and labelled("network", session) == []
