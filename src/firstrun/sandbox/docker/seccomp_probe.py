"""The docker session's own seccomp and OOM checks, run inside the container.

Guarantee: each check is a real attempt by an ordinary command, reported as
the kernel answered it: ``io_uring_setup`` refused (EPERM or ENOSYS), a raw
``clone`` with CLONE_NEWUSER refused, and ``oom_score_adj`` not lowerable
below its starting value. Output: a JSON list of ``{"name", "passed",
"detail"}``. Stdlib only.
"""

import ctypes
import errno
import json
import os
import platform
import sys

_SYS = {"x86_64": {"io_uring_setup": 425, "clone": 56},
        "aarch64": {"io_uring_setup": 425, "clone": 220}}
_CLONE_NEWUSER = 0x10000000
_SIGCHLD = 17


def _name(code: int) -> str:
    return errno.errorcode.get(code, str(code))


def main() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    numbers = _SYS[platform.machine()]
    checks = []
    params = ctypes.create_string_buffer(120)
    fd = libc.syscall(numbers["io_uring_setup"], ctypes.c_uint(1), params)
    err = ctypes.get_errno()
    if fd >= 0:
        os.close(fd)
    checks.append({"name": "io_uring_refused", "passed": fd < 0 and err in (errno.EPERM, errno.ENOSYS),
                   "detail": "io_uring_setup: " + ("an io_uring fd" if fd >= 0 else _name(err))})
    # libc's ``unshare`` is proven by the shared attestation probe; the raw clone is what
    # firstrun's rules add.
    # clone's flags and exit signal in one argument, the rest zero: a fork-like call.
    pid = libc.syscall(numbers["clone"], ctypes.c_ulong(_CLONE_NEWUSER | _SIGCHLD), None, None,
                       None, None)
    err = ctypes.get_errno()
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
    checks.append({"name": "clone_newuser_refused", "passed": pid < 0,
                   "detail": "clone(CLONE_NEWUSER): " + ("a child" if pid >= 0 else _name(err))})
    # The kernel's floor for a process without CAP_SYS_RESOURCE is the value runc set as
    # root.
    path = "/proc/self/oom_score_adj"
    with open(path) as f:
        before = int(f.read())
    try:
        with open(path, "w") as f:
            f.write(str(before - 1))
        lowered = "accepted"
    except OSError as exc:
        lowered = _name(exc.errno)
    with open(path) as f:
        after = int(f.read())
    checks.append({"name": "oom_score_not_lowered", "passed": after >= before,
                   "detail": f"oom_score_adj {before} -> {before - 1}: {lowered}, now {after}"})
    json.dump(checks, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
