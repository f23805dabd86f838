"""Session-wide memory and pids caps: real kernel, real cgroups, bounded loads.

The live tests run where this harness can make a session cgroup (root on a
cgroup v1 or delegated v2 host) and judge by the kernel's own counters
(peak usage, OOM kills, refused forks, members) read from the host, never
by an exit code alone. The discovery and v2 preparation logic is also
tested against temporary trees shaped like /proc and /sys/fs/cgroup, since
a v1 host cannot run a v2 memory controller.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_support import alive

from firstrun.policy.process import Limits
from firstrun.policy.profile import LayerName
from firstrun.sandbox.base import Stream
from firstrun.sandbox.linux import cgroup
from firstrun.sandbox.linux.backend import LinuxBackend, LinuxSession
from firstrun.sandbox.linux.cgroup import CgroupParent, CgroupVersion, NoCgroup
from support.profiles import make_profile

MEMORY = 64 << 20
PIDS = 32


def _session_cgroups_possible() -> bool:
    found = cgroup.locate_self()
    return isinstance(found, CgroupParent) and isinstance(cgroup.assess(found), CgroupParent)


live = pytest.mark.skipif(not _session_cgroups_possible(),
                          reason="this harness cannot make session cgroups here")


@pytest.fixture
def capped(workspace: str) -> Iterator[LinuxSession]:
    profile = make_profile(workspace, limits=Limits(memory_bytes=MEMORY, pids=PIDS))
    with LinuxBackend().start(profile, proxy=None) as s:
        assert s.cgroup is not None
        yield s


def _limits_layer(session: LinuxSession):
    (layer,) = [l for l in session.info.layers if l.name == LayerName.LIMITS]
    return layer


# Touches 256 MiB of MAP_SHARED memory a page at a time, saying how far it got.
SHARED_TOUCH = textwrap.dedent("""
    import mmap, sys
    size = 256 << 20
    m = mmap.mmap(-1, size, flags=mmap.MAP_SHARED)
    for i in range(0, size, 4096):
        m[i] = 1
        if i % (16 << 20) == 0:
            print(i >> 20, flush=True)
    print('touched all', flush=True)
""")


@live
def test_shared_memory_is_capped_for_the_session(capped: LinuxSession) -> None:
    # RLIMIT_DATA does not count MAP_SHARED pages: per process, this ran to
    # 256 MiB under a 64 MiB limit.
    result = capped.exec(["python3", "-c", SHARED_TOUCH], timeout=120)
    assert "touched all" not in result.stdout.text()
    assert result.exit_code == 128 + signal.SIGKILL
    assert capped.cgroup.oom_kills() >= 1
    assert capped.cgroup.memory_peak() <= MEMORY
    # The supervisor survived: the OOM killer took the command.
    assert capped.exec("echo alive", timeout=60).stdout.text() == "alive\n"


# Writes 60 MiB to each tmpfs in turn, from one process, saying how much landed.
FILL = textwrap.dedent("""
    import os
    chunk = b'x' * (1 << 20)
    for path in ('/tmp/fill', '/dev/shm/fill', os.path.expanduser('~/fill')):
        with open(path, 'wb', buffering=0) as f:
            for mib in range(60):
                try:
                    f.write(chunk)
                except OSError as exc:
                    print(path, 'refused', exc.errno, flush=True)
                    break
                print(path, mib + 1, flush=True)
""")


@live
def test_tmpfs_mounts_together_stop_at_the_cap(capped: LinuxSession) -> None:
    # Each tmpfs is sized to the limit on its own, so without a session cap
    # three of them held three times the limit.
    written: dict[str, int] = {}
    result = capped.exec(["python3", "-c", FILL], timeout=120)
    for line in result.stdout.text().splitlines():
        path, what = line.split()[:2]
        if what != "refused":
            written[path] = int(what)
    assert sum(written.values()) < 3 * 60
    assert sum(written.values()) << 20 <= MEMORY
    assert capped.cgroup.memory_peak() <= MEMORY
    assert capped.cgroup.oom_kills() >= 1 or "refused" in result.stdout.text()


# Forks children that wait on a pipe until the parent has tried 4 * PIDS
# times, then reports; the children exit when the pipe closes.
FORK_LOOP = textwrap.dedent(f"""
    import os
    r, w = os.pipe()
    made = refused = 0
    for _ in range({4 * PIDS}):
        try:
            pid = os.fork()
        except OSError:
            refused += 1
            continue
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        made += 1
    print('made', made, 'refused', refused, flush=True)
    os.read(0, 1)
""")


@live
def test_a_fork_loop_stops_at_pids_max(capped: LinuxSession) -> None:
    seen: list[tuple[int, int]] = []

    def at_peak(stream: Stream, data: bytes) -> None:
        # While every child still waits: what the kernel counts in the cgroup.
        if stream is Stream.STDOUT and b"made" in data:
            seen.append((capped.cgroup.pids_current(), len(capped.cgroup.members())))

    result = capped.exec(["python3", "-c", FORK_LOOP], timeout=120, on_output=at_peak)
    made, refused = (int(w) for w in result.stdout.text().split()[1::2])
    assert refused > 0 and made < 4 * PIDS
    assert capped.cgroup.forks_refused() >= refused
    (tasks, processes), = seen
    assert tasks <= PIDS and processes <= PIDS


@live
def test_close_kills_everything_and_removes_the_cgroup(workspace: str) -> None:
    profile = make_profile(workspace, limits=Limits(memory_bytes=MEMORY, pids=PIDS))
    session = LinuxBackend().start(profile, proxy=None)
    session.exec("setsid sleep 1000 & (sleep 1000 &) ; true", timeout=60)
    assert session.cgroup is not None
    directories = session.cgroup.directories
    members = [(pid, cgroup.start_time(pid)) for pid in session.cgroup.members()]
    # bubblewrap, the helper (its namespace's init), the two sleeps.
    assert len(members) >= 4
    session.close()
    assert not any(os.path.exists(d) for d in directories)
    assert not any(start is not None and alive(pid, start) for pid, start in members)


@live
def test_the_limits_layer_names_the_cgroup(capped: LinuxSession) -> None:
    layer = _limits_layer(capped)
    assert layer.applied
    assert layer.mechanism == f"{capped.cgroup.version.value} memory+pids"
    assert f"memory {MEMORY} bytes" in layer.detail and f"pids {PIDS}" in layer.detail
    # bubblewrap and the helper (its namespace's init) are members from the start.
    assert len(capped.cgroup.members()) >= 2


@live
def test_leftovers_of_a_killed_harness_are_reaped_at_the_next_start(workspace: str,
                                                                     tmp_path: Path) -> None:
    # A real harness process, SIGKILLed with its session open.
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})
        from support.profiles import make_profile
        from firstrun.policy.process import Limits
        from firstrun.sandbox.linux.backend import LinuxBackend
        s = LinuxBackend().start(make_profile({workspace!r}, limits=Limits(memory_bytes={MEMORY})),
                                 proxy=None)
        print(*s.cgroup.directories, flush=True)
        sys.stdin.read()
    """)
    harness = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        directories = harness.stdout.readline().split()
        assert directories and all(os.path.isdir(d) for d in directories)
    finally:
        harness.kill()
        harness.wait()
        harness.stdin.close()
        harness.stdout.close()
    assert all(os.path.isdir(d) for d in directories)
    parent = cgroup.discover()
    assert isinstance(parent, CgroupParent)
    assert not any(os.path.exists(d) for d in directories)


@live
def test_a_live_owners_cgroup_is_never_reaped(capped: LinuxSession) -> None:
    parent = cgroup.discover()
    assert isinstance(parent, CgroupParent)
    assert all(os.path.isdir(d) for d in capped.cgroup.directories)


def test_without_a_cgroup_the_layer_says_rlimits_only(workspace: str, monkeypatch) -> None:
    # A machine with no usable cgroup: the session still starts (rlimits
    # always apply) and the layer says exactly what enforces.
    monkeypatch.setattr(cgroup, "discover", lambda proc="/proc/self": NoCgroup(
        reason="test: none", fix="none"))
    with LinuxBackend().start(make_profile(workspace), proxy=None) as s:
        assert s.cgroup is None
        layer = _limits_layer(s)
    assert layer.applied and layer.mechanism == "rlimit (no writable cgroup)"
    assert "test: none" in layer.detail and "MAP_SHARED and tmpfs pages not counted" in layer.detail


# --- discovery and v2 preparation, on trees shaped like the kernel's ---

HYBRID_CGROUP = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
1:cpu:/
0::/
"""
HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2_CGROUP = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/firstrun.scope\n"
V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_locate_v1_hybrid_uses_the_v1_hierarchies() -> None:
    assert cgroup.locate(HYBRID_CGROUP, HYBRID_MOUNTS) == CgroupParent(
        version=CgroupVersion.V1, memory="/sys/fs/cgroup/memory/process_api/abc",
        pids="/sys/fs/cgroup/pids")


def test_locate_pure_v2() -> None:
    path = "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/firstrun.scope"
    assert cgroup.locate(V2_CGROUP, V2_MOUNTS) == CgroupParent(
        version=CgroupVersion.V2, memory=path, pids=path)


def test_locate_a_container_whose_mount_root_is_its_own_cgroup() -> None:
    mounts = "50 40 0:26 /docker/c1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"
    found = cgroup.locate("0::/docker/c1/app\n", mounts)
    assert found == CgroupParent(version=CgroupVersion.V2, memory="/sys/fs/cgroup/app",
                                 pids="/sys/fs/cgroup/app")
    # A cgroup outside what the mount shows is not guessed at.
    assert isinstance(cgroup.locate("0::/elsewhere\n", mounts), NoCgroup)


def test_locate_refuses_controllers_split_across_versions() -> None:
    mounts = HYBRID_MOUNTS.replace(" - cgroup cgroup rw,pids", " - tmpfs tmpfs rw")
    assert isinstance(cgroup.locate(HYBRID_CGROUP, mounts), NoCgroup)


def test_mountinfo_escapes_are_decoded() -> None:
    (mount,) = cgroup.parse_mountinfo(
        "41 31 0:38 / /sys/fs/cgroup/with\\040space rw - cgroup2 cgroup2 rw\n")
    assert mount.mount_point == "/sys/fs/cgroup/with space"


def _v2_parent(tmp_path: Path, *, controllers: str, enabled: str, procs: str) -> CgroupParent:
    (tmp_path / "cgroup.controllers").write_text(controllers + "\n")
    (tmp_path / "cgroup.subtree_control").write_text(enabled + "\n")
    (tmp_path / "cgroup.procs").write_text(procs)
    return CgroupParent(version=CgroupVersion.V2, memory=str(tmp_path), pids=str(tmp_path))


def test_v2_with_controllers_enabled_is_usable(tmp_path: Path) -> None:
    parent = _v2_parent(tmp_path, controllers="cpu memory pids", enabled="memory pids",
                        procs="")
    assert cgroup.assess(parent) == parent
    assert cgroup.prepare(parent) == parent
    assert (tmp_path / "cgroup.subtree_control").read_text() == "memory pids\n"


def test_v2_enables_missing_controllers_when_the_parent_is_empty(tmp_path: Path) -> None:
    parent = _v2_parent(tmp_path, controllers="memory pids", enabled="", procs="")
    assert cgroup.assess(parent) == parent
    assert cgroup.prepare(parent) == parent
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory +pids"


def test_v2_parent_with_processes_and_no_controllers_is_not_available(tmp_path: Path) -> None:
    parent = _v2_parent(tmp_path, controllers="memory pids", enabled="pids", procs="1234\n")
    found = cgroup.assess(parent)
    assert isinstance(found, NoCgroup) and "no-internal-process" in found.reason


def test_v2_without_delegated_controllers_is_not_available(tmp_path: Path) -> None:
    parent = _v2_parent(tmp_path, controllers="cpu io", enabled="", procs="")
    for found in (cgroup.assess(parent), cgroup.prepare(parent)):
        assert isinstance(found, NoCgroup) and "memory, pids" in found.reason


def test_v2_limits_cap_memory_swap_and_pids(tmp_path: Path) -> None:
    for name in ("memory.max", "memory.swap.max", "pids.max"):
        (tmp_path / name).write_text("")
    assert cgroup._write_limits(CgroupVersion.V2, str(tmp_path), str(tmp_path), MEMORY, PIDS)
    assert [(tmp_path / n).read_text() for n in ("memory.max", "memory.swap.max", "pids.max")] \
        == [str(MEMORY), "0", str(PIDS)]


def test_only_cgroups_of_dead_owners_are_reaped(tmp_path: Path) -> None:
    parent = CgroupParent(version=CgroupVersion.V2, memory=str(tmp_path), pids=str(tmp_path))
    me = os.getpid()
    mine = tmp_path / cgroup.session_name(me, cgroup.start_time(me))
    dead = tmp_path / cgroup.session_name(me, cgroup.start_time(me) + 1)
    foreign = tmp_path / "someone-else"
    for d in (mine, dead, foreign):
        d.mkdir()
    assert cgroup.reap_leftovers(parent) == (dead.name,)
    assert mine.is_dir() and foreign.is_dir() and not dead.exists()
