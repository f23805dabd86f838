"""``firstrun sandbox`` end to end: the real console script, real bubblewrap, the real proxy.

Nothing here leaves the machine: the only destinations are ones the proxy
refuses on the name alone (and so never resolves), or nothing at all.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from firstrun.images.build import image_present
from firstrun.sandbox.ownership import LEASE_DIR, process_identity
from firstrun.sandbox.protect import MARKER
from support.servers import LoopbackServer, QuietHandler

FIRSTRUN = Path(sys.executable).parent / "firstrun"

Run = Callable[..., subprocess.CompletedProcess[str]]


def test_echo_runs_and_streams_output(firstrun: Run) -> None:
    proc = firstrun("sandbox", "--backend", "linux", "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hi\n"
    assert "backend linux" in proc.stderr
    assert "enforcement enforced" in proc.stderr
    assert "policy sha256:" in proc.stderr


def test_exit_code_passes_through(firstrun: Run) -> None:
    proc = firstrun("sandbox", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "out\n"
    assert proc.stderr.startswith("err\n")


def test_timeout_exits_124_and_kills_the_command(firstrun: Run, tmp_path: Path) -> None:
    proc = firstrun("sandbox", "--workspace", str(tmp_path), "--timeout", "1", "--",
                    "sh", "-c", "sleep 30; touch finished")
    assert proc.returncode == 124, proc.stderr
    assert not (tmp_path / "finished").exists()


def test_denied_request_is_reported_and_recorded(firstrun: Run, tmp_path: Path) -> None:
    record = tmp_path / "egress.jsonl"
    proc = firstrun("sandbox", "--record", str(record), "--",
                    "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "http://example.com/")
    assert proc.stdout == "403", proc.stderr
    assert "egress blocked: 1 attempt to 1 destination" in proc.stderr
    assert "example.com:80" in proc.stderr and "not_allowed" in proc.stderr
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    denied = [r for r in rows if r["host"] == "example.com"]
    assert len(denied) == 1
    assert denied[0]["decision"] == "deny" and denied[0]["reason"] == "not_allowed"
    # Refused on the name: never resolved, so not even a DNS query left.
    assert denied[0]["resolved"] is None


def test_deny_beats_allow(firstrun: Run, tmp_path: Path) -> None:
    record = tmp_path / "egress.jsonl"
    proc = firstrun("sandbox", "--record", str(record), "--allow", "example.com",
                    "--deny", "example.com", "--",
                    "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "http://example.com/")
    assert proc.stdout == "403", proc.stderr
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(r["host"], r["reason"]) for r in rows if r["host"] == "example.com"] == [
        ("example.com", "denied_by_list")
    ]


def test_json_reports_session_and_records(firstrun: Run) -> None:
    proc = firstrun("sandbox", "--backend", "linux", "--json", "--",
                    "sh", "-c", "echo to-stdout; curl -s -o /dev/null http://example.com/; exit 3")
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    assert "to-stdout" in proc.stderr
    assert doc["exit_code"] == 3 and doc["timed_out"] is False
    session = doc["session"]
    assert session["backend"] == "linux" and session["enforcement"] == "enforced"
    assert session["policy_hash"].startswith("sha256:")
    assert session["attestation"] and all(c["passed"] for c in session["attestation"])
    assert [r["reason"] for r in doc["records"] if r["host"] == "example.com"] == ["not_allowed"]


def test_workspace_is_the_working_directory_and_comes_back_owned_by_the_caller(
    firstrun: Run, tmp_path: Path
) -> None:
    proc = firstrun("sandbox", "--workspace", str(tmp_path), "--",
                    "sh", "-c", "pwd; echo data > made-inside")
    assert proc.returncode == 0, proc.stderr
    made = tmp_path / "made-inside"
    assert made.read_text() == "data\n"
    assert made.stat().st_uid == os.getuid()


def test_local_backend_is_refused_without_allow_unenforced(firstrun: Run, tmp_path: Path) -> None:
    proc = firstrun("sandbox", "--backend", "local", "--workspace", str(tmp_path), "--",
                    "touch", "ran")
    assert proc.returncode == 125
    assert "--allow-unenforced" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "ran").exists()


def test_local_backend_with_allow_unenforced_is_recorded_unenforced(firstrun: Run) -> None:
    proc = firstrun("sandbox", "--backend", "local", "--allow-unenforced", "--json", "--",
                    "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["session"]["backend"] == "local"
    assert doc["session"]["enforcement"] == "unenforced"


def _processes_with_argument(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in argv:
            found.append(int(entry.name))
    return found


def _backends() -> list[object]:
    docker = pytest.param("docker", marks=pytest.mark.skipif(
        os.geteuid() != 0 or not image_present("firstrun/python:3.11"),
        reason="the docker backend needs root, a dockerd and firstrun/python:3.11 "
               "(scripts/test provides them)"))
    return ["linux", docker]


def _owners(top: Path) -> set[int]:
    return {os.lstat(p).st_uid for p in (top, *top.rglob("*"))}


def _start_and_wait(backend: str, workspace: Path, marker: str,
                    tmpdir: Path | None = None) -> subprocess.Popen[bytes]:
    """``tmpdir``: the harness's TMPDIR, for a harness that will not live to clean it."""
    env = dict(os.environ) if tmpdir is None else {**os.environ, "TMPDIR": str(tmpdir)}
    proc = subprocess.Popen(
        [str(FIRSTRUN), "sandbox", "--backend", backend, "--workspace", str(workspace), "--",
         "sh", "-c", f"touch started; (setsid sleep {marker} &); sleep {marker}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        # The harness keeps an inherited ignored SIGHUP (nohup's contract), so a suite
        # started under nohup would otherwise test nohup, not a terminal that closed.
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not (workspace / "started").exists() or len(_processes_with_argument(marker)) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the command never started: {proc.communicate()}")
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_interrupt_closes_the_session_and_leaves_nothing_running(
    tmp_path: Path, signum: int, backend: str
) -> None:
    # A duration no other process on the machine would use, to find ours in /proc.
    marker = f"3{os.getpid() % 1000:03d}.{signum}17"
    workspace, tmpdir = tmp_path / "ws", tmp_path / "tmp"
    workspace.mkdir()
    tmpdir.mkdir()
    proc = _start_and_wait(backend, workspace, marker, tmpdir=tmpdir)
    harness = process_identity(proc.pid)
    try:
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, err
    assert _processes_with_argument(marker) == []
    # Given back, and nothing of the session's left on the host or in the daemon:
    # no proxy socket directory, no disk image, in the harness's TMPDIR.
    assert _owners(workspace) == {os.geteuid()}
    assert os.listdir(tmpdir) == []
    assert not any(Path(LEASE_DIR).glob("*.json")) or all(
        json.loads(p.read_text())["workspace"] != str(workspace)
        for p in Path(LEASE_DIR).glob("*.json"))
    if backend == "docker":
        left = subprocess.run(["docker", "ps", "--all", "--quiet", "--filter",
                               f"label=org.firstrun.harness={harness}"],
                              capture_output=True, text=True, check=True).stdout
        assert left == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root harness lends the workspace")
@pytest.mark.parametrize("backend", _backends())
def test_after_a_sigkilled_harness_the_next_start_gives_the_workspace_back(
    tmp_path: Path, backend: str
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "mine").write_text("the owner's file\n")
    marker = f"4{os.getpid() % 1000:03d}.9"
    # A SIGKILLed harness leaves its private temporary directories: keep them here.
    (tmp_path / "tmp").mkdir()
    proc = _start_and_wait(backend, workspace, marker, tmpdir=tmp_path / "tmp")
    lent = os.stat(workspace).st_uid
    assert lent != 0
    proc.kill()
    proc.wait()
    # Killed at once: nobody gave anything back, and the lease says what was lent.
    assert _owners(workspace) == {lent}
    [lease] = [json.loads(p.read_text()) for p in Path(LEASE_DIR).glob("*.json")
               if json.loads(p.read_text())["workspace"] == str(workspace)]
    assert (lease["uid"], lease["owner"]) == (lent, [0, 0])
    # The harness proxy's socket directory too (docker's proxy is its sidecar).
    sockdirs = list((tmp_path / "tmp").glob("firstrun-proxy-*"))
    assert len(sockdirs) == (backend != "docker")
    later = subprocess.run([str(FIRSTRUN), "sandbox", "--backend", backend, "--", "true"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    assert later.returncode == 0, later.stderr
    assert list((tmp_path / "tmp").glob("firstrun-proxy-*")) == []
    assert _owners(workspace) == {0}
    assert (workspace / "mine").read_text() == "the owner's file\n"
    assert not Path(LEASE_DIR, f"{lent}.json").exists()
    assert _processes_with_argument(marker) == []
    # Its placeholders for the workspace's protected entries outlived it,
    # marked as its own; the next session over that workspace removes them.
    assert os.getxattr(workspace / ".bashrc", MARKER).decode().startswith(f"{proc.pid}:")
    again = subprocess.run([str(FIRSTRUN), "sandbox", "--backend", backend, "--workspace",
                            str(workspace), "--", "true"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert sorted(os.listdir(workspace)) == ["mine", "started"]


@pytest.fixture
def loopback_http_server() -> Iterator[tuple[int, list[str]]]:
    """A plain HTTP server on the host's 127.0.0.1 that remembers every path it served."""
    seen: list[str] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            seen.append(self.path)
            body = b"canary\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with LoopbackServer(Handler) as server:
        yield server.port, seen


def test_enforce_mode_refuses_the_hosts_loopback(
    firstrun: Run, loopback_http_server: tuple[int, list[str]]
) -> None:
    port, seen = loopback_http_server
    proc = firstrun("sandbox", "--json", "--allow", f"localhost:{port}", "--",
                    "curl", "-s", "--noproxy", "", f"http://localhost:{port}/enforced")
    doc = json.loads(proc.stdout)
    assert seen == []
    (rec,) = [r for r in doc["records"] if r["host"] == "localhost"]
    assert rec["decision"] == "deny" and rec["reason"] == "resolved_loopback"


def test_report_only_reports_name_rules_but_still_enforces_the_floor(
    firstrun: Run, loopback_http_server: tuple[int, list[str]]
) -> None:
    port, seen = loopback_http_server
    # NO_PROXY lists localhost; --noproxy '' makes curl use the proxy anyway.
    # pypi.org is on the default allow-list; --deny makes it a name-rule
    # denial, which report mode lets through (a real registry request).
    proc = firstrun("sandbox", "--report-only", "--deny", "pypi.org", "--json", "--", "bash", "-c",
                    f"curl -sS --noproxy '' http://localhost:{port}/reported; "
                    "curl -sS -o /dev/null https://pypi.org/simple/six/")
    assert proc.returncode == 0, proc.stderr
    assert seen == []
    doc = json.loads(proc.stdout)
    (local,) = [r for r in doc["records"] if r["host"] == "localhost"]
    assert (local["decision"], local["reason"], local["would_deny"]) == (
        "deny", "resolved_loopback", None)
    (pypi,) = [r for r in doc["records"] if r["host"] == "pypi.org"]
    assert (pypi["decision"], pypi["would_deny"]) == ("allow", "denied_by_list")
    assert pypi["bytes_down"] > 0


@pytest.mark.parametrize("workspace", ["/", "/tmp", "/etc/..", "/proc/self", os.path.expanduser("~")])
def test_a_workspace_that_would_hand_over_the_host_is_refused_before_anything_runs(
        firstrun: Run, workspace: str) -> None:
    # Lending "/" to the sandbox's uid would chown the host; binding a home
    # writable would expose its secrets. Refused in one line, nothing started.
    before = {p: os.stat(p).st_uid for p in ("/", "/etc", "/tmp")}
    proc = firstrun("sandbox", "--workspace", workspace, "--", "touch", "firstrun-was-here")
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("firstrun: error: --workspace: "), lines
    assert "cannot be a workspace" in lines[0] and "Traceback" not in proc.stderr
    assert {p: os.stat(p).st_uid for p in before} == before
    assert not os.path.exists(os.path.join(os.path.realpath(workspace), "firstrun-was-here"))


@pytest.mark.parametrize("image", ["--privileged", "-v/:/host", "Bad Image"])
def test_an_image_that_is_not_a_reference_is_refused_as_a_flag_error(firstrun: Run,
                                                                      image: str) -> None:
    proc = firstrun("sandbox", f"--image={image}", "--", "true")
    assert proc.returncode == 3, proc.stderr
    assert f"argument --image: {image!r} is not an image reference" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a network namespace of the test's own needs root and unshare(1)")
def test_the_harness_works_on_a_host_with_no_ipv6_loopback() -> None:
    # The harness in a namespace whose loopback has IPv6 turned off, as on a
    # host booted with ipv6.disable=1: doctor, and a session (its proxy, its
    # relays, capture and attestation), all on IPv4 alone.
    script = (
        "sysctl -qw net.ipv6.conf.lo.disable_ipv6=1 && ip link set lo up && "
        "! python3 -c 'import socket; socket.socket(socket.AF_INET6).bind((\"::1\", 0))' && "
        f"{FIRSTRUN} doctor >/dev/null && "
        f"{FIRSTRUN} sandbox --backend linux -- python3 -c 'print(\"ran\")'"
    )
    done = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ran")
    assert "attestation 11/11 passed" in done.stderr


def test_a_protected_entry_is_lifted_only_by_name_and_only_in_a_workspace_of_ones_own(
        firstrun: Run, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    lifted = firstrun("sandbox", "--workspace", str(workspace), "--allow-write", ".vscode",
                      "--json", "--", "sh", "-c", "mkdir .vscode && touch .vscode/tasks.json")
    assert lifted.returncode == 0, lifted.stderr
    namespaces = next(layer for layer in json.loads(lifted.stdout)["session"]["layers"]
                      if layer["name"] == "namespaces")
    assert "lifted by the user: .vscode" in namespaces["detail"]
    assert sorted(os.listdir(workspace)) == [".vscode"]
    for argv, says in ((["--workspace", str(workspace), "--allow-write", ".vscod"],
                        "argument --allow-write: invalid choice: '.vscod'"),
                       (["--allow-write", ".vscode"], "the workspace is firstrun's own")):
        refused = firstrun("sandbox", *argv, "--", "touch", "ran")
        assert refused.returncode == 3 and says in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") <= 2 and "Traceback" not in refused.stderr
    (workspace / ".bashrc").symlink_to("/etc/hostname")
    refused = firstrun("sandbox", "--workspace", str(workspace), "--", "touch", "ran")
    assert refused.returncode == 3 and "the workspace's .bashrc is a symlink" in refused.stderr
    assert not (workspace / "ran").exists()


@pytest.mark.parametrize("inside", ["egress.jsonl", "sub/../egress.jsonl", "link/egress.jsonl"])
def test_a_record_inside_the_workspace_is_refused_before_anything_runs(
        firstrun: Run, tmp_path: Path, inside: str) -> None:
    # The sandbox could truncate, forge or swap for a symlink a record kept there.
    workspace = tmp_path / "ws"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "link").symlink_to(workspace)
    proc = firstrun("sandbox", "--workspace", str(workspace), "--record",
                    str(workspace / inside), "--", "touch", "ran")
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1 and "--record" in proc.stderr and "inside the workspace" in proc.stderr
    assert not (workspace / "ran").exists() and not (workspace / "egress.jsonl").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root harness makes a sized workspace")
def test_a_refusal_while_the_workspace_is_made_leaves_no_disk_behind() -> None:
    # The workspace is made beside the policy's checks: one refused later
    # still unmounts and removes it, and drops its lease.
    proc = subprocess.Popen([str(FIRSTRUN), "sandbox", "--allow", "not a host!", "--", "true"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 3 and "--allow" in err, err
    leases = [json.loads(p.read_text()) for p in Path("/run/firstrun/disks").glob("*.json")]
    # A lease goes only after its filesystem is unmounted and removed.
    assert not [lease for lease in leases if lease["harness"].split(":")[0] == str(proc.pid)]
