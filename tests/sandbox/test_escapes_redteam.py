"""Red-team escapes: what a hostile command tries after reading the enforcement code.

Each test is an attack made for real inside a linux session and judged by
evidence the host can see (a host process that is gone, a file that never
appeared, a tmpfs that refused bytes, a process the kernel killed), never by
an exit code alone. The suite in ``test_escapes.py`` covers the issue's list;
these cover holes found, and boundaries probed, by reading the code.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
from sandbox_support import host_processes_with

from firstrun.policy.process import Limits
from firstrun.sandbox.base import Stream
from firstrun.sandbox.linux.backend import LinuxBackend, LinuxSession
from support.profiles import make_profile

pytestmark = pytest.mark.escape

# Writes to stdout without end through a pipe enlarged to 1 MiB: the helper
# reads 64 KiB per round, so the pipe is never empty when it looks again.
# ``flooding`` appears in the working directory once the pipe is full.
FLOOD = (
    "import fcntl, os\n"
    "fcntl.fcntl(1, 1031, 1 << 20)\n"  # F_SETPIPE_SZ
    "chunk = b'y' * (1 << 16)\n"
    "for _ in range(16):\n"
    "    os.write(1, chunk)\n"
    "open('flooding', 'w').close()\n"
    "while True:\n"
    "    os.write(1, chunk)\n"
)


@pytest.fixture
def small(workspace: str) -> Iterator[LinuxSession]:
    """A session with a small memory limit, so filling it is cheap and bounded."""
    profile = make_profile(workspace, limits=Limits(memory_bytes=32 << 20))
    with LinuxBackend().start(profile, proxy=None) as s:
        yield s


def _drop_output(stream: Stream, data: bytes) -> None:
    del stream, data


def test_timeout_holds_while_the_command_keeps_its_pipe_full(session: LinuxSession,
                                                               workspace: str) -> None:
    # The hole: the deadline was only looked at when the pipes went quiet,
    # so a command that never let them go quiet never timed out; the harness
    # gave up on the helper instead and the command ran on.
    token = f"firstrun-flood-{secrets.token_hex(6)}"
    sentinel = os.path.join(workspace, "outlived-its-timeout")
    with open(os.path.join(workspace, "flood.py"), "w") as f:
        f.write(FLOOD)
    result = session.exec(
        f"bash -c 'exec -a {token} python3 flood.py' & sleep 8; touch {os.path.basename(sentinel)}",
        timeout=1, on_output=_drop_output,
    )
    assert result.timed_out
    assert host_processes_with(token) == []
    assert not os.path.exists(sentinel)


def test_a_background_writer_cannot_hold_the_exec(session: LinuxSession, workspace: str) -> None:
    # The command exits at once; what it left behind floods the same pipe.
    # The exec must come back as a finished command, not wait on the writer
    # until the harness declares the sandbox lost.
    with open(os.path.join(workspace, "flood.py"), "w") as f:
        f.write(FLOOD)
    result = session.exec("python3 flood.py & until [ -e flooding ]; do sleep 0.01; done; "
                          "echo started >&2", timeout=20,
                          on_output=_drop_output)
    assert (result.exit_code, result.timed_out) == (0, False)
    assert result.stderr.text() == "started\n"
    # The session is still usable: the flood lost its pipe with the exec.
    assert session.exec("echo next", timeout=20).stdout.text() == "next\n"


# Writes up to 64 MiB to /dev/shm a MiB at a time, saying how much landed.
SHM_FILL = (
    "with open('/dev/shm/fill', 'wb', buffering=0) as f:\n"
    "    for mib in range(64):\n"
    "        try:\n"
    "            f.write(b'x' * (1 << 20))\n"
    "        except OSError as exc:\n"
    "            print('refused', exc.errno, flush=True)\n"
    "            break\n"
    "        print(mib + 1, flush=True)\n"
)


def test_dev_shm_is_capped_like_every_other_tmpfs(small: LinuxSession) -> None:
    # /dev/shm was a directory of bubblewrap's /dev tmpfs, which has no size
    # option: half the host's RAM for a command whose memory limit is 32 MiB.
    out = small.exec(["python3", "-c", SHM_FILL], timeout=60).stdout.text().split()
    written = max((int(w) for w in out if w.isdigit() and int(w) <= 64), default=0)
    assert written < 32
    if small.cgroup is None:
        # rlimits only: the tmpfs's own size refuses the write (ENOSPC).
        assert out[-2:] == ["refused", "28"]
    else:
        # The session cap stops it first, by the kernel's own count.
        assert small.cgroup.memory_peak() <= 32 << 20
        assert small.cgroup.oom_kills() >= 1 or out[-2] == "refused"


def test_a_command_cannot_stop_the_helper_and_its_timeout_still_holds(workspace: str) -> None:
    # The helper is the command's parent and shares its uid and Landlock
    # domain. A stopped helper would enforce nothing (no timeout, no kill);
    # the hole was first that the sandbox ran on unsupervised, then that a
    # command could stop it at all. As its namespace's init the helper now
    # takes no signal from inside: the stop is dropped, and the command's
    # one-second timeout kills it.
    token = f"firstrun-unsupervised-{secrets.token_hex(6)}"
    session = LinuxBackend().start(make_profile(workspace), proxy=None)
    try:
        result = session.exec(f"kill -STOP $PPID; exec -a {token} sleep 1000", timeout=1)
        assert result.timed_out
        assert host_processes_with(token) == []
        assert session.exec("echo supervised").stdout.text() == "supervised\n"
    finally:
        session.close()


# Runs one raw syscall through a foreign ABI, from machine code in an
# executable page: ``i386`` is ``int 0x80`` (IA-32 emulation is on in this
# kernel), ``x32`` is ``syscall`` with the x32 bit (0x40000000) set. The
# filter's rules are written for x86-64 numbers; either ABI would read them
# as different syscalls if the filter let it through.
FOREIGN_ABI = (
    "import ctypes, mmap, os, sys\n"
    "abi = sys.argv[1]\n"
    "if abi == 'i386':\n"  # push rbx; mov eax, 310 (unshare); mov ebx, NEWUSER; int 0x80; pop rbx; ret
    "    code = b'\\x53\\xb8' + (310).to_bytes(4, 'little') + b'\\xbb' + (0x10000000).to_bytes(4, 'little') + b'\\xcd\\x80\\x5b\\xc3'\n"
    "else:\n"  # mov eax, 0x40000000|272 (x32 unshare); mov edi, NEWUSER; syscall; ret
    "    code = b'\\xb8' + (0x40000000 | 272).to_bytes(4, 'little') + b'\\xbf' + (0x10000000).to_bytes(4, 'little') + b'\\x0f\\x05\\xc3'\n"
    "page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
    "page.write(code)\n"
    "call = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))\n"
    "before = os.readlink('/proc/self/ns/user')\n"
    "print('calling', flush=True)\n"
    "rc = call()\n"
    "print('returned', rc, os.readlink('/proc/self/ns/user') != before, flush=True)\n"
)


@pytest.mark.parametrize("abi", ["i386", "x32"])
def test_seccomp_cannot_be_sidestepped_through_a_foreign_abi(session: LinuxSession,
                                                             abi: str) -> None:
    result = session.exec(["python3", "-c", FOREIGN_ABI, abi], timeout=60)
    # The kernel killed the process at the syscall (SIGSYS: 128 + 31);
    # nothing after it ran, so no new user namespace was ever entered.
    assert result.stdout.text() == "calling\n"
    assert result.exit_code == 128 + 31


# Every way to make a name that is not a plain open(O_CREAT), aimed at the
# sandbox root: a tmpfs the sandbox uid owns, so only Landlock stands in the
# way (file permissions would allow each one).
ODD_WRITES = (
    "import os, socket\n"
    "open('/workspace/f', 'w').close()\n"
    "open('/tmp/g', 'w').close()\n"
    "attempts = {\n"
    "    'rename_refer': lambda: os.rename('/tmp/g', '/g'),\n"
    "    'hard_link': lambda: os.link('/tmp/g', '/h'),\n"
    "    'o_tmpfile': lambda: os.open('/', os.O_TMPFILE | os.O_RDWR, 0o600),\n"
    "    'fifo': lambda: os.mkfifo('/fifo'),\n"
    "    'unix_socket': lambda: socket.socket(socket.AF_UNIX).bind('/sock'),\n"
    "    'symlink': lambda: os.symlink('/etc', '/link'),\n"
    "    'mkdir_dev': lambda: os.mkdir('/dev/planted'),\n"
    # Commands start at 1000 so the OOM killer takes them before the helper;
    # lowering back to 0 needs no privilege: only Landlock refuses the open.
    "    'oom_score_adj': lambda: open('/proc/self/oom_score_adj', 'w').write('0'),\n"
    "}\n"
    "for name, attempt in attempts.items():\n"
    "    try:\n"
    "        attempt()\n"
    "        print(name, 'DONE')\n"
    "    except OSError as e:\n"
    "        print(name, e.errno)\n"
    "print('score', open('/proc/self/oom_score_adj').read().strip())\n"
)


def test_landlock_refuses_every_kind_of_new_name_outside_the_writable_roots(
        session: LinuxSession) -> None:
    before = session.exec("ls -a / /dev", timeout=60).stdout.text()
    out = session.exec(["python3", "-c", ODD_WRITES], timeout=60).stdout.text()
    assert "DONE" not in out and len(out.splitlines()) == 9
    # Evidence, not errnos: nothing new exists, and the process kept its score.
    assert out.splitlines()[-1] == "score 1000"
    assert session.exec("ls -a / /dev", timeout=60).stdout.text() == before
