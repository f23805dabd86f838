"""Filling the host's disk through the workspace, for real, on every backend here.

The evidence is the host's: the blocks the workspace's image file holds on
the host's disk after the sandbox tried to write twice the bound, never the
command's exit status alone; and, after a harness killed by SIGKILL, the
host's own mount table.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sandbox_support import start_session

import firstrun
from firstrun.sandbox.disk import DISK_LEASE_DIR, MIB, SizedWorkspace, open_sized_workspace, recover
from support.profiles import make_profile

pytestmark = [pytest.mark.escape,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a sized filesystem needs root")]

FIRSTRUN = Path(sys.executable).parent / "firstrun"
BOUND = 32 * MIB


def _on_host_disk(sized: SizedWorkspace) -> int:
    """Bytes the workspace's image file holds on the host's disk."""
    return os.stat(os.path.join(os.path.dirname(sized.path), "image")).st_blocks * 512


def _mounts() -> set[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return {line.split()[4] for line in f}


@pytest.mark.parametrize("kind", ["linux", "docker", "gvisor", "microvm"])
def test_the_sandbox_cannot_put_more_than_the_bound_on_the_hosts_disk(kind: str) -> None:
    with SizedWorkspace(BOUND) as sized:
        mount = sized.path
        for session in start_session(kind, make_profile(sized.path)):
            done = session.exec(["sh", "-c", "dd if=/dev/zero of=fill bs=1M count=64; "
                                             "dd if=/dev/zero of=more bs=1M count=8"], timeout=300)
            assert "No space left on device" in done.stderr.text()
        assert _on_host_disk(sized) <= BOUND
        assert 24 * MIB < sized.bound().peak_bytes <= BOUND
        assert sized.bound().reached
    # Gone with the session's end: the mount, the image and the lease.
    assert mount not in _mounts()
    assert not os.path.exists(os.path.dirname(mount))
    assert not os.listdir(DISK_LEASE_DIR)


def test_a_workspace_well_within_its_bound_is_not_reached_and_holds_no_lost_found() -> None:
    with SizedWorkspace(BOUND) as sized:
        assert os.listdir(sized.path) == []
        assert stat.S_IMODE(os.stat(sized.path).st_mode) == 0o700
        Path(sized.path, "small").write_bytes(b"x" * MIB)
        bound = sized.bound()
        assert not bound.reached and bound.bound_bytes == BOUND and bound.peak_bytes >= MIB


def test_the_inodes_running_out_is_reaching_the_bound_too() -> None:
    with SizedWorkspace(BOUND) as sized:
        made = 0
        with pytest.raises(OSError) as refused:
            while True:
                os.mkdir(os.path.join(sized.path, str(made)))
                made += 1
        assert refused.value.errno == errno.ENOSPC
        assert sized.reached


def test_a_kept_copy_keeps_links_and_fifos_as_they_are(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    with SizedWorkspace(BOUND) as sized:
        top = Path(sized.path)
        (top / "notes.txt").write_text("kept\n")
        (top / "passwd").symlink_to("/etc/passwd")
        os.mkfifo(top / "pipe")  # read through, it would hang the copy
        (top / "sub").mkdir()
        (top / "sub" / "deep.txt").write_text("deep\n")
        sized.copy_to(str(kept))
    assert (kept / "notes.txt").read_text() == "kept\n"
    assert os.readlink(kept / "passwd") == "/etc/passwd"
    assert stat.S_ISFIFO(os.lstat(kept / "pipe").st_mode)
    assert (kept / "sub" / "deep.txt").read_text() == "deep\n"


def test_after_a_sigkilled_harness_recover_unmounts_and_removes_what_it_left() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from firstrun.sandbox.disk import SizedWorkspace\n"
         f"sized = SizedWorkspace({BOUND}).__enter__()\n"
         "print(sized.path, flush=True)\n"
         "time.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        path = child.stdout.readline().strip()
        assert path in _mounts()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert path in _mounts()  # nothing else unmounts it
    assert os.path.dirname(path) in recover()
    assert path not in _mounts()
    assert not os.path.exists(os.path.dirname(path))
    assert not os.listdir(DISK_LEASE_DIR)


def test_a_harness_that_is_not_root_records_the_default_and_refuses_a_bound_it_was_asked_for(
) -> None:
    script = ("import json\n"
              "from firstrun.errors import SandboxUnavailable\n"
              "from firstrun.sandbox.disk import open_sized_workspace\n"
              "default = open_sized_workspace(32, asked=False)\n"
              "try:\n"
              "    open_sized_workspace(32, asked=True)\n"
              "    asked = 'made'\n"
              "except SandboxUnavailable as exc:\n"
              "    asked = str(exc)\n"
              "print(json.dumps([default.to_data(), asked]))\n")
    # The package as nobody can read it: a checkout may live in a 0700 directory.
    readable = tempfile.mkdtemp(prefix="firstrun-test-src-")
    try:
        os.chmod(readable, 0o755)
        shutil.copytree(Path(firstrun.__file__).parent, os.path.join(readable, "firstrun"))
        done = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                               sys.executable, "-c", script],
                              capture_output=True, text=True, timeout=60, cwd="/",
                              env={**os.environ, "PYTHONPATH": readable})
    finally:
        shutil.rmtree(readable, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    default, asked = json.loads(done.stdout)
    assert default["bound_bytes"] is None and "needs root" in default["mechanism"]
    assert "needs root" in asked
    assert open_sized_workspace(0, asked=True).to_data()["bound_bytes"] is None


def test_firstrun_sandbox_says_when_the_bound_was_reached() -> None:
    done = subprocess.run(
        [str(FIRSTRUN), "sandbox", "--backend", "linux", "--max-disk", "32", "--json", "--",
         "dd", "if=/dev/zero", "of=fill", "bs=1M", "count=64"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    document = json.loads(done.stdout)
    assert document["exit_code"] != 0
    assert document["disk"]["bound_bytes"] == BOUND and document["disk"]["reached"] is True
    plain = subprocess.run(
        [str(FIRSTRUN), "sandbox", "--backend", "linux", "--max-disk", "32", "--",
         "dd", "if=/dev/zero", "of=fill", "bs=1M", "count=64"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert "firstrun: disk: the workspace reached its bound of 32 MiB" in plain.stderr


@pytest.mark.parametrize(("flags", "says"), [
    (["--max-disk", "32", "--workspace", "."], "--max-disk: firstrun can only bound a workspace"),
    (["--max-disk", "5"], "--max-disk: must be 0 (no bound) or at least 16 MiB"),
    (["--max-disk", "lots"], "--max-disk: not a whole number of MiB"),
])
def test_a_disk_bound_it_cannot_keep_is_a_one_line_flag_error(
        flags: list[str], says: str, tmp_path: Path) -> None:
    done = subprocess.run([str(FIRSTRUN), "sandbox", *flags, "--", "true"], cwd=tmp_path,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 3
    assert says in done.stderr and "Traceback" not in done.stderr
