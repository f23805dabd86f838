"""firstrun's seccomp profile inside real containers: each refusal answers with its errno, work still works."""

from __future__ import annotations

import json
import os

import pytest

from firstrun.policy.profile import ALL_LAYERS, LayerName, SandboxProfile
from firstrun.sandbox.base import Enforcement
from firstrun.sandbox.docker.backend import DockerBackend
from support.profiles import make_profile

pytestmark = pytest.mark.usefixtures("docker_ready")

# Each attempt prints its own errno name (or "ok"); run as the session's uid.
PROBE = r'''
import ctypes, errno, json, os, socket, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def answer(rc):
    return "ok" if rc >= 0 else errno.errorcode[ctypes.get_errno()]
out = {}
buf = ctypes.create_string_buffer(120)
out["io_uring_setup"] = answer(libc.syscall(425, ctypes.c_uint(1), buf))
out["clone3"] = answer(libc.syscall(435, None, 0))
out["unshare_user"] = answer(libc.unshare(0x10000000))
pid = libc.syscall(56, ctypes.c_ulong(0x10000000 | 17), None, None, None, None)
if pid == 0:
    os._exit(0)
out["clone_newuser"] = answer(pid)
out["ioctl_tiocsti"] = answer(libc.syscall(16, 0, ctypes.c_ulong(0x5412), buf))
out["ioctl_tiocsti_high_bits"] = answer(libc.syscall(16, 0, ctypes.c_ulong(0x100005412), buf))
out["ioctl_tioclinux"] = answer(libc.syscall(16, 0, ctypes.c_ulong(0x541C), buf))
out["ioctl_tcgets"] = answer(libc.syscall(16, 0, ctypes.c_ulong(0x5401), buf))
out["personality_no_aslr"] = answer(libc.personality(0x0040000))
out["personality_linux"] = answer(libc.personality(0))
child = subprocess.Popen(["sleep", "30"])
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
out["ptrace_attach_child"] = answer(libc.ptrace(16, child.pid, None, None))
child.kill(); child.wait()
out["bpf"] = answer(libc.syscall(321, 0, None, 0))
for family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, 40):
    try:
        socket.socket(family, socket.SOCK_DGRAM).close()
        out[f"socket_{family}"] = "ok"
    except OSError as exc:
        out[f"socket_{family}"] = errno.errorcode[exc.errno]
thread = threading.Thread(target=lambda: out.__setitem__("thread", "ok"))
thread.start(); thread.join()
out["subprocess"] = subprocess.run(["sh", "-c", "echo ok"], capture_output=True,
                                   text=True).stdout.strip()
print(json.dumps(out))
'''

REFUSED = {
    "io_uring_setup": "EPERM", "clone3": "ENOSYS", "unshare_user": "EPERM",
    "clone_newuser": "EPERM", "ioctl_tiocsti": "EPERM", "ioctl_tiocsti_high_bits": "EPERM",
    "ioctl_tioclinux": "EPERM", "personality_no_aslr": "EPERM", "ptrace_attach_child": "EPERM",
    "bpf": "EPERM", "socket_16": "EAFNOSUPPORT", "socket_40": "EAFNOSUPPORT",
}
# The pipe on stdin is no terminal: TCGETS passes the filter and the tty layer refuses it.
WORKS = {"ioctl_tcgets": "ENOTTY", "personality_linux": "ok", "socket_1": "ok",
         "socket_2": "ok", "socket_10": "ok", "thread": "ok", "subprocess": "ok"}


@pytest.fixture
def workspace(workspace: str) -> str:
    os.chown(workspace, 4321, 4321)
    return workspace


def _answers(profile: SandboxProfile) -> tuple[dict[str, str], object]:
    with DockerBackend().start(profile, proxy=None) as session:
        result = session.exec(["/usr/bin/python3", "-I", "-S", "-c", PROBE], timeout=60)
        assert result.exit_code == 0, result.stderr.text()
        return json.loads(result.stdout.text()), session.info


def test_each_linux_refusal_answers_with_its_errno_inside_the_container(workspace: str) -> None:
    answers, info = _answers(make_profile(workspace))
    assert {k: answers[k] for k in REFUSED} == REFUSED
    assert {k: answers[k] for k in WORKS} == WORKS
    assert info.enforcement is Enforcement.ENFORCED  # type: ignore[attr-defined]
    seccomp = next(l for l in info.layers if l.name == LayerName.SECCOMP)  # type: ignore[attr-defined]
    assert seccomp.applied and seccomp.mechanism.startswith("firstrun seccomp profile (")
    checks = {c.name: c for c in info.attestation}  # type: ignore[attr-defined]
    for name in ("io_uring_refused", "clone_newuser_refused", "oom_score_not_lowered",
                 "seccomp_loaded"):
        assert checks[name].passed, checks[name]
    assert checks["io_uring_refused"].detail == "io_uring_setup: EPERM"
    assert "EACCES" in checks["oom_score_not_lowered"].detail


def test_without_the_layer_dockers_default_applies_and_lets_io_uring_through(
        workspace: str) -> None:
    # The contrast that shows the profile, not Docker's default, is what refuses these.
    answers, info = _answers(make_profile(workspace, required=ALL_LAYERS - {LayerName.SECCOMP}))
    assert answers["io_uring_setup"] == "ok"
    assert answers["ptrace_attach_child"] == "ok"
    assert answers["ioctl_tiocsti"] != "EPERM"
    assert answers["unshare_user"] == "EPERM"
    assert info.enforcement is Enforcement.DOWNGRADED  # type: ignore[attr-defined]
    seccomp = next(l for l in info.layers if l.name == LayerName.SECCOMP)  # type: ignore[attr-defined]
    assert not seccomp.applied and "Docker's default profile applies" in seccomp.detail
    assert "io_uring_refused" not in {c.name for c in info.attestation}  # type: ignore[attr-defined]
