"""One real micro-VM behind the real proxy: the exec contract, attestation and escapes by evidence."""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Iterator

import pytest
from microvm_support import ACCEL, make_workspace

from firstrun.policy.process import Limits
from firstrun.proxy.server import EgressProxy
from firstrun.sandbox.base import ProxyEndpoint
from firstrun.sandbox.microvm.backend import MicrovmBackend, MicrovmSession
from support.profiles import make_profile

OUTPUT_CAP = 4096


@pytest.fixture(scope="module")
def session(proxy: tuple[EgressProxy, ProxyEndpoint]) -> Iterator[MicrovmSession]:
    workspace = make_workspace()
    profile = make_profile(workspace, limits=Limits(output_bytes=OUTPUT_CAP, memory_bytes=1 << 30))
    with MicrovmBackend(accel=ACCEL).start(profile, proxy=proxy[1]) as s:
        yield s
    shutil.rmtree(workspace, ignore_errors=True)


def test_attested_with_every_layer_applied(session: MicrovmSession) -> None:
    info = session.info
    assert info.backend == "microvm"
    assert all(c.passed for c in info.attestation), info.attestation
    names = {c.name for c in info.attestation}
    assert {"only_on_link_route", "no_route", "no_dns", "proxy_answers", "writes_confined",
            "seccomp_loaded", "host_canary_saw_nothing"} <= names
    assert all(layer.applied for layer in info.layers)
    namespaces = next(layer for layer in info.layers if layer.name == "namespaces")
    assert ("TCG" in namespaces.mechanism) == (ACCEL == "tcg")


def test_the_command_runs_under_the_guest_kernel(session: MicrovmSession) -> None:
    result = session.exec("uname -r")
    assert result.exit_code == 0
    assert result.stdout.text().strip() != os.uname().release


def test_exit_codes(session: MicrovmSession) -> None:
    assert session.exec("exit 3").exit_code == 3
    assert session.exec(["false"]).exit_code == 1
    assert session.exec(["/no/such/program"]).exit_code == 127
    assert session.exec("kill -9 $$").exit_code == 128 + 9


def test_output_is_capped_keeping_both_ends(session: MicrovmSession) -> None:
    result = session.exec("printf START; head -c 100000 /dev/zero | tr '\\0' x; printf END")
    assert result.stdout.total_bytes == 100008
    assert result.stdout.truncated
    assert len(result.stdout.data) == OUTPUT_CAP
    assert result.stdout.text().startswith("START") and result.stdout.text().endswith("END")


def test_timeout_kills_the_whole_tree(session: MicrovmSession) -> None:
    result = session.exec(
        "sleep 1000 & echo $! > /tmp/child; setsid sleep 1001 & echo $! > /tmp/daemon; "
        "(sleep 1002 &) ; sleep 1000", timeout=3)
    assert result.timed_out
    after = session.exec("for p in $(cat /tmp/child /tmp/daemon); do "
                         "kill -0 $p 2>/dev/null && echo alive $p; done; "
                         "ps -eo args | grep -c '^sleep 100[0-2]' || true")
    assert "alive" not in after.stdout.text()
    assert after.stdout.text().strip().splitlines()[-1] == "0"


def test_workspace_is_shared_and_the_root_is_read_only(session: MicrovmSession) -> None:
    result = session.exec("echo data > made-inside && touch /etc/x /usr/x /x 2>&1; id -u")
    assert "Read-only file system" in result.stdout.text()
    host = os.path.join(session._profile.fs.workspace, "made-inside")
    with open(host, encoding="utf-8") as f:
        assert f.read() == "data\n"


def test_env_points_at_the_proxy_and_has_no_resolver(session: MicrovmSession) -> None:
    result = session.exec("echo $HTTPS_PROXY; cat /etc/resolv.conf | wc -c")
    proxy_url, resolv = result.stdout.text().split()
    assert proxy_url == "http://10.0.2.100:3128"
    assert resolv == "0"


@pytest.mark.escape
def test_direct_dials_reach_nothing(session: MicrovmSession) -> None:
    canary = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    canary.bind(("127.0.0.1", 0))
    canary.listen(8)
    canary.setblocking(False)
    port = canary.getsockname()[1]
    script = (
        "import json, socket\n"
        "out = {}\n"
        f"for host in ('10.0.2.2', '127.0.0.1', '203.0.113.80', '10.0.2.3'):\n"
        "    s = socket.socket(); s.settimeout(5)\n"
        f"    try:\n        s.connect((host, {port})); out[host] = 'connected'\n"
        "    except OSError as e:\n        out[host] = str(e)\n"
        "print(json.dumps(out))\n")
    result = session.exec(["python3", "-c", script])
    outcomes = json.loads(result.stdout.text())
    assert all(v != "connected" for v in outcomes.values()), outcomes
    with pytest.raises(BlockingIOError):
        canary.accept()
    canary.close()


@pytest.mark.escape
def test_the_proxy_is_the_only_way_out(session: MicrovmSession,
                                       proxy: tuple[EgressProxy, ProxyEndpoint]) -> None:
    # Through the proxy: its own attestation answer, the nonce. Around it: nothing.
    result = session.exec("curl -s --max-time 20 http://attest.firstrun.invalid/; echo; "
                          "curl -s --noproxy '*' --max-time 5 http://203.0.113.80/ "
                          "|| echo direct-failed")
    lines = result.stdout.text().splitlines()
    assert proxy[1].nonce in lines[0]
    assert lines[-1] == "direct-failed"


@pytest.mark.escape
def test_links_planted_in_the_workspace_reach_no_host_file(session: MicrovmSession,
                                                           tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    # A host file outside the workspace, named by its host path inside the guest:
    # the guest resolves every link in its own tree, where that path is not the host's.
    canary_dir = tmp_path_factory.mktemp("microvm-canary")
    canary = canary_dir / "canary.txt"
    canary.write_text("original\n", encoding="utf-8")
    os.chmod(canary_dir, 0o777)
    os.chmod(canary, 0o666)
    result = session.exec(
        f"ln -s {canary} link; echo pwned > link; echo pwned > {canary}; "
        f"ln {canary} hard; cat {canary}; ls -la /workspace/..", timeout=30)
    assert canary.read_text(encoding="utf-8") == "original\n"
    assert sorted(os.listdir(canary_dir)) == ["canary.txt"]
    assert "original" not in result.stdout.text()
    # Back on the host, the planted link is a link, and following it is the host's business.
    assert os.path.islink(os.path.join(session._profile.fs.workspace, "link"))


@pytest.mark.escape
def test_the_proxy_relay_serves_only_the_sessions_qemu_uid(
        session: MicrovmSession, proxy: tuple[EgressProxy, ProxyEndpoint]) -> None:
    # Any other local process (this one included) that finds the abstract
    # name is turned away before a byte reaches the proxy.
    if os.geteuid() != 0:
        pytest.skip("QEMU runs as this test's own uid unless the harness is root")
    assert session._relay is not None
    records_before = len(proxy[0].records())
    answer = b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect("\0" + session._relay.name)
        try:
            sock.sendall(b"GET http://attest.firstrun.invalid/ HTTP/1.1\r\n"
                         b"Host: attest.firstrun.invalid\r\n\r\n")
            answer = sock.recv(1024)
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert answer == b""
    assert len(proxy[0].records()) == records_before


@pytest.mark.escape
def test_a_command_cannot_speak_on_the_agents_channel(session: MicrovmSession) -> None:
    # The channel is the agent's (root's) device; a command that could open it
    # could forge exits or read other commands' output.
    result = session.exec("ls /dev/vport*p1 && echo '{}' > /dev/vport*p1; "
                          "cat /dev/vport*p1 </dev/null; echo done", timeout=30)
    assert result.stdout.text().splitlines()[-1] == "done"
    assert result.stderr.text().count("Permission denied") == 2
    assert session.exec("echo still-served").stdout.text() == "still-served\n"


def test_memory_is_capped_by_the_vm_and_the_session_survives(session: MicrovmSession) -> None:
    # The profile's 1 GiB (plus the guest's overhead) is all the RAM there is:
    # a command that keeps allocating is stopped inside, and QEMU stays within it.
    result = session.exec(["python3", "-c",
                           "a = []\nwhile True:\n    a.append(bytearray(64 << 20))"], timeout=300)
    assert result.exit_code != 0 and not result.timed_out
    assert session.exec("echo alive").stdout.text() == "alive\n"
    with open(f"/proc/{session.pid}/status", encoding="utf-8") as f:
        rss_kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    # Guest RAM (1 GiB + 160 MiB) plus QEMU itself and TCG's 64 MiB translation cache.
    assert rss_kib < (1024 + 160 + 320) * 1024
