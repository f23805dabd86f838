"""Lending the workspace to the session uid and giving it back, attacked from both sides.

A root harness lends the workspace; these tests plant what a real host has in
a project (hard links shared with a tree elsewhere, another user's files, a
setuid file, a bind mount) and what a sandbox can make (setuid and setgid
entries, nesting deeper than any recursion), then judge from the host's own
inodes what changed outside the workspace and who owns what came back.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from firstrun.errors import SandboxError
from firstrun.sandbox.linux.backend import LinuxBackend
from support.profiles import make_profile

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="the workspace is lent only when the harness is root")

OWNER = (4321, 4322)


@pytest.fixture
def outside() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="firstrun-test-outside-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _owned_workspace(workspace: str) -> str:
    os.chmod(workspace, 0o755)
    os.chown(workspace, *OWNER)
    return workspace


def _entries(top: str) -> list[tuple[str, os.stat_result]]:
    found = [(top, os.lstat(top))]
    for parent, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(parent, name)
            found.append((path, os.lstat(path)))
    return found


def test_a_file_hard_linked_outside_is_never_lent(workspace: str, outside: str) -> None:
    # A git clone of a local repository or a package store links files like this.
    host_file = os.path.join(outside, "object")
    with open(host_file, "w") as f:
        f.write("original\n")
    os.chown(host_file, 4000, 4001)
    os.link(host_file, os.path.join(_owned_workspace(workspace), "object"))
    with LinuxBackend().start(make_profile(workspace), proxy=None) as s:
        assert (os.stat(host_file).st_uid, os.stat(host_file).st_gid) == (4000, 4001)
        result = s.exec("echo planted >> object")
        assert result.exit_code != 0
    with open(host_file) as f:
        assert f.read() == "original\n"
    assert (os.stat(host_file).st_uid, os.stat(host_file).st_gid) == (4000, 4001)


def test_links_that_all_live_inside_are_lent_and_come_back(workspace: str) -> None:
    _owned_workspace(workspace)
    first = os.path.join(workspace, "a")
    with open(first, "w") as f:
        f.write("x")
    os.chown(first, *OWNER)
    os.link(first, os.path.join(workspace, "b"))
    with LinuxBackend().start(make_profile(workspace), proxy=None) as s:
        assert s.exec("echo y >> b").exit_code == 0
    assert (os.stat(first).st_uid, os.stat(first).st_gid) == OWNER


def test_another_users_files_and_groups_stay_theirs(workspace: str) -> None:
    _owned_workspace(workspace)
    theirs = os.path.join(workspace, "theirs")
    grouped = os.path.join(workspace, "grouped")
    for path in (theirs, grouped):
        with open(path, "w") as f:
            f.write("x")
    os.chown(theirs, 4000, 4001)
    os.chown(grouped, OWNER[0], 4555)
    with LinuxBackend().start(make_profile(workspace), proxy=None) as s:
        assert s.exec("echo y >> grouped").exit_code == 0
    assert (os.stat(theirs).st_uid, os.stat(theirs).st_gid) == (4000, 4001)
    assert (os.stat(grouped).st_uid, os.stat(grouped).st_gid) == (OWNER[0], 4555)


def test_a_setuid_file_in_the_workspace_keeps_its_bit(workspace: str) -> None:
    tool = os.path.join(_owned_workspace(workspace), "tool")
    with open(tool, "w") as f:
        f.write("#!/bin/sh\n")
    os.chown(tool, *OWNER)
    os.chmod(tool, 0o4755)
    with LinuxBackend().start(make_profile(workspace), proxy=None):
        pass
    assert stat.S_IMODE(os.stat(tool).st_mode) == 0o4755


def test_nothing_the_sandbox_marks_setuid_or_setgid_comes_back_so(workspace: str) -> None:
    _owned_workspace(workspace)
    with LinuxBackend().start(make_profile(workspace), proxy=None) as s:
        made = s.exec("cp /bin/sh sh && chmod 4755 sh && touch g && chmod 2644 g && "
                      "mkdir d && chmod 2777 d && mkdir shut && chmod 0 shut && "
                      "touch none && chmod 0 none")
        assert made.exit_code == 0, made.stderr.text()
    for path, st in _entries(workspace):
        assert (st.st_uid, st.st_gid) == OWNER, path
        assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), path


def test_nesting_deeper_than_any_recursion_is_given_back_whole(workspace: str) -> None:
    _owned_workspace(workspace)
    with LinuxBackend().start(make_profile(workspace), proxy=None) as s:
        made = s.exec(["python3", "-c", "import os\nfor _ in range(2000):\n"
                       " os.mkdir('d')\n os.chdir('d')\nopen('leaf', 'w').close()"])
        assert made.exit_code == 0, made.stderr.text()
    # find(1), not os.walk: the test's own walk must not recurse either.
    owners = subprocess.run(["find", workspace, "-printf", "%U:%G\\n"], capture_output=True,
                            text=True, check=True).stdout.split()
    subprocess.run(["rm", "-rf", os.path.join(workspace, "d")], check=True)
    assert len(owners) == 2002
    assert set(owners) == {"%d:%d" % OWNER}


_BIND_MOUNT_SCRIPT = r"""
import json, os, subprocess, sys
from firstrun.errors import UsageError
from firstrun.sandbox.hostfs import check_workspace
from firstrun.sandbox.ownership import give_back, lend
workspace, outside = sys.argv[1], sys.argv[2]
subprocess.run(["mount", "--bind", outside, os.path.join(workspace, "bound")], check=True)
try:
    check_workspace(workspace, os.environ)
    refused = ""
except UsageError as exc:
    refused = str(exc)
# Past the refusal, lending itself still stops at the mount point.
lend(workspace, 1_999_999_999, who="test")
lent = [os.stat(p).st_uid for p in (workspace, outside, os.path.join(outside, "file"))]
give_back(workspace, 1_999_999_999, (4321, 4322))
print(json.dumps({"refused": refused, "lent": lent}))
"""


def test_a_mount_inside_the_workspace_is_refused_and_never_lent(workspace: str,
                                                                outside: str) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private mount namespace")
    os.mkdir(os.path.join(_owned_workspace(workspace), "bound"))
    host_file = os.path.join(outside, "file")
    with open(host_file, "w") as f:
        f.write("original\n")
    os.chown(host_file, 4000, 4001)
    # The mount lives in a private namespace that dies with the child.
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", _BIND_MOUNT_SCRIPT,
         workspace, outside], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert f"{workspace}/bound is a mount point inside it" in seen["refused"]
    assert "\n" not in seen["refused"]
    assert seen["lent"] == [1_999_999_999, 0, 4000]
    assert (os.stat(outside).st_uid, os.stat(host_file).st_uid) == (0, 4000)
    assert os.stat(workspace).st_uid == OWNER[0]


def test_an_entry_swapped_for_a_symlink_is_not_chmodded_through_it(workspace: str,
                                                                   outside: str) -> None:
    # What a container that outlived its removal could do between the walk's
    # lstat and the chmod that strips a setgid bit: the swap is made here.
    from firstrun.sandbox.ownership import _chmod_entry

    host_file = os.path.join(outside, "host")
    with open(host_file, "w") as f:
        f.write("x")
    os.chmod(host_file, 0o2644)
    entry = os.path.join(workspace, "entry")
    with open(entry, "w") as f:
        f.write("x")
    seen = os.lstat(entry)
    os.unlink(entry)
    os.symlink(host_file, entry)
    dir_fd = os.open(workspace, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with pytest.raises(OSError, match="changed"):
            _chmod_entry("entry", dir_fd, seen, 0o644)
    finally:
        os.close(dir_fd)
    assert stat.S_IMODE(os.stat(host_file).st_mode) == 0o2644



def test_an_entry_that_cannot_be_lent_refuses_the_start_in_one_line(workspace: str) -> None:
    _owned_workspace(workspace)
    for name in ("a", "z"):
        with open(os.path.join(workspace, name), "w") as f:
            f.write("x")
        os.chown(os.path.join(workspace, name), *OWNER)
    frozen = os.path.join(workspace, "z")
    if shutil.which("chattr") is None or \
            subprocess.run(["chattr", "+i", frozen], capture_output=True).returncode != 0:
        pytest.skip("needs chattr(1) on a filesystem with the immutable flag")
    try:
        with pytest.raises(SandboxError) as caught:
            LinuxBackend().start(make_profile(workspace), proxy=None)
    finally:
        subprocess.run(["chattr", "-i", frozen], check=True)
    message = str(caught.value)
    assert caught.value.who == "linux" and "\n" not in message
    assert f"cannot lend the workspace to the sandbox uid: {frozen}" in message
    assert {(st.st_uid, st.st_gid) for _, st in _entries(workspace)} == {OWNER}
