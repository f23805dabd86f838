"""The docker backend's seccomp profile: an allow-list, with the linux backend's refusals on top.

Guarantee: ``build_profile`` is a pure function of the linux backend's rules
(``firstrun.sandbox.linux.seccomp.RULES``), so one list decides what every
backend refuses: each rule refuses here exactly the calls it refuses there,
with the same errno, or ``build_profile`` raises. Beneath is an allow-list, so
a syscall added to the kernel later is refused until someone decides it is
needed. The profile file is never in any container's view.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Mapping

from firstrun.sandbox.linux.seccomp import RULES, Action, Op, Rule

_ERRNO = {Action.EPERM: errno.EPERM, Action.ENOSYS: errno.ENOSYS,
          Action.EAFNOSUPPORT: errno.EAFNOSUPPORT}
_OPS = {Op.EQ: "SCMP_CMP_EQ", Op.GT: "SCMP_CMP_GT", Op.MASKED_EQ: "SCMP_CMP_MASKED_EQ"}

# What ordinary programs (interpreters, compilers, package managers, test
# runners, servers on loopback) call, by purpose. Names another architecture
# lacks are skipped by runc there. Deliberately absent: everything needing a
# capability the container never holds (mount, module, clock, reboot, raw
# I/O, namespace and tracing calls), and kernel interfaces no quickstart
# needs (fanotify, lookup_dcookie, memfd_secret, process_madvise, quotactl).
ALLOWED: Mapping[str, tuple[str, ...]] = {
    "files": (
        "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "preadv2",
        "pwritev", "pwritev2", "open", "openat", "openat2", "creat", "close", "close_range",
        "lseek", "_llseek", "dup", "dup2", "dup3", "pipe", "pipe2", "fcntl", "fcntl64", "ioctl",
        "stat", "lstat", "fstat", "newfstatat", "stat64", "lstat64", "fstat64", "fstatat64",
        "statx", "statfs", "fstatfs", "statfs64", "fstatfs64",
        "access", "faccessat", "faccessat2", "getdents", "getdents64", "getcwd", "chdir",
        "fchdir", "mkdir", "mkdirat", "rmdir", "rename", "renameat", "renameat2", "link",
        "linkat", "symlink", "symlinkat", "unlink", "unlinkat", "readlink", "readlinkat",
        "mknod", "mknodat", "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown",
        "lchown", "fchownat", "chown32", "fchown32", "lchown32", "umask", "truncate",
        "ftruncate", "truncate64", "ftruncate64", "fallocate", "fsync", "fdatasync", "sync",
        "syncfs", "sync_file_range", "flock", "utime", "utimes", "utimensat",
        "utimensat_time64", "futimesat", "getxattr", "lgetxattr", "fgetxattr", "listxattr",
        "llistxattr", "flistxattr", "setxattr", "lsetxattr", "fsetxattr", "removexattr",
        "lremovexattr", "fremovexattr", "copy_file_range", "sendfile", "sendfile64", "splice",
        "tee", "vmsplice", "fadvise64", "fadvise64_64", "readahead", "inotify_init",
        "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "memfd_create",
    ),
    "memory": (
        "brk", "mmap", "mmap2", "munmap", "mprotect", "mremap", "madvise", "mincore", "msync",
        "mlock", "mlock2", "munlock", "mlockall", "munlockall", "membarrier", "pkey_alloc",
        "pkey_free", "pkey_mprotect",
    ),
    "processes": (
        "fork", "vfork", "clone", "clone3", "execve", "execveat", "exit", "exit_group",
        "wait4", "waitid", "waitpid", "kill", "tkill", "tgkill", "pidfd_open",
        "pidfd_send_signal", "getpid", "getppid", "gettid", "getpgid", "getpgrp", "setpgid",
        "getsid", "setsid", "getuid", "geteuid", "getgid", "getegid", "getresuid",
        "getresgid", "getgroups", "getuid32", "geteuid32", "getgid32", "getegid32",
        "getresuid32", "getresgid32", "getgroups32",
        # Without capabilities these can only give up identity, never gain one.
        "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups",
        "setfsuid", "setfsgid", "setuid32", "setgid32", "setreuid32", "setregid32",
        "setresuid32", "setresgid32", "setgroups32", "setfsuid32", "setfsgid32",
        "capget", "capset", "prctl", "personality", "set_tid_address", "set_robust_list",
        "get_robust_list", "rseq", "futex", "futex_time64", "futex_waitv", "getpriority",
        "setpriority", "ioprio_get", "ioprio_set", "sched_yield", "sched_getaffinity",
        "sched_setaffinity", "sched_getparam", "sched_setparam", "sched_getscheduler",
        "sched_setscheduler", "sched_getattr", "sched_setattr", "sched_get_priority_max",
        "sched_get_priority_min", "sched_rr_get_interval", "sched_rr_get_interval_time64",
        "getrlimit", "setrlimit", "prlimit64", "ugetrlimit", "getrusage", "times", "uname",
        "sysinfo", "getcpu", "getrandom", "set_thread_area", "get_thread_area",
        # A process may confine itself further; never loosen (filters only stack).
        "seccomp", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
    ),
    "signals": (
        "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend",
        "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
        "sigaltstack", "signalfd", "signalfd4", "sigreturn", "sigprocmask", "pause", "alarm",
        "restart_syscall",
    ),
    "time": (
        "clock_gettime", "clock_gettime64", "clock_getres", "clock_getres_time64",
        "clock_nanosleep", "clock_nanosleep_time64", "nanosleep", "gettimeofday", "time",
        "getitimer", "setitimer", "timer_create", "timer_settime", "timer_settime64",
        "timer_gettime", "timer_gettime64", "timer_getoverrun", "timer_delete",
        "timerfd_create", "timerfd_settime", "timerfd_settime64", "timerfd_gettime",
        "timerfd_gettime64",
    ),
    "events": (
        "poll", "ppoll", "ppoll_time64", "select", "_newselect", "pselect6",
        "pselect6_time64", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
        "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2",
        # Classic asynchronous I/O (databases use it); io_uring is refused below.
        "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
        "io_pgetevents_time64",
    ),
    # No socketcall: on 32-bit x86 it multiplexes socket() past the family check.
    "sockets": (
        "socket", "socketpair", "bind", "connect", "listen", "accept", "accept4",
        "getsockname", "getpeername", "getsockopt", "setsockopt", "sendto", "recvfrom",
        "send", "recv", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "recvmmsg_time64",
        "shutdown",
    ),
    # The container has its own IPC namespace (--ipc private).
    "ipc": (
        "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop",
        "semtimedop_time64", "semctl", "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open",
        "mq_unlink", "mq_timedsend", "mq_timedsend_time64", "mq_timedreceive",
        "mq_timedreceive_time64", "mq_notify", "mq_getsetattr",
    ),
}

# x86-64's own thread-pointer and LDT calls, which its libc and runtimes need.
ARCH_ALLOWED: Mapping[str, tuple[str, ...]] = {
    "arch_prctl": ("amd64",),
    "modify_ldt": ("amd64",),
}

# Native ABIs only, as the linux backend's filter: a 32-bit compat syscall
# matches no architecture and is refused. (With x86 in, libseccomp would also
# have to fold the socket rules into socketcall's, and it cannot fold these.)
_ARCH_MAP = (
    {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": []},
    {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": []},
)


# The combination below is fixed by what the loaders do, as measured on docker 20.10 with
# its runc and libseccomp 2.5. An unlisted syscall fails with EPERM, the default action: the
# daemon ignores ``defaultErrnoRet`` (with ENOSYS there, an unlisted syscall still answered
# EPERM), so the profile states EPERM. runc skips a rule whose action is the default's, and
# libseccomp lets an unconditional allow override every conditional rule of the same
# syscall. The live tests show each refusal answering with its errno inside a container.
_DEFAULT_ERRNO = errno.EPERM
_LOW32 = 0xFFFFFFFF


def _arg(index: int, op: str, value: int, value_two: int | None = None) -> dict[str, object]:
    # Docker's MASKED_EQ takes the mask as ``value`` and the datum as ``valueTwo``.
    arg: dict[str, object] = {"index": index, "value": value, "op": op}
    if value_two is not None:
        arg["valueTwo"] = value_two
    return arg


def _refusal(rule: Rule) -> dict[str, object]:
    entry: dict[str, object] = {"names": [rule.syscall], "action": "SCMP_ACT_ERRNO",
                                "errnoRet": _ERRNO[rule.action]}
    if rule.args:
        entry["args"] = [_arg(a.index, _OPS[a.op], a.mask, a.value) if a.op is Op.MASKED_EQ
                         else _arg(a.index, _OPS[a.op], a.value) for a in rule.args]
    return entry


def _prefixes(excluded: frozenset[int], prefix: int = 0, length: int = 0) -> list[tuple[int, int]]:
    """(mask, datum) pairs over 32 bits whose union is every value but ``excluded``."""
    shift = 32 - length
    if not any(value >> shift == prefix for value in excluded):
        mask = (_LOW32 << shift) & _LOW32
        return [(mask, prefix << shift)]
    if length == 32:
        return []
    return (_prefixes(excluded, prefix << 1, length + 1)
            + _prefixes(excluded, (prefix << 1) | 1, length + 1))


# An argument rule answering EPERM (clone, ioctl, personality) cannot be stated as a refusal
# (runc would skip it), so its syscall is allowed exactly where none of its rules holds.
def _complement(rules: list[Rule]) -> list[dict[str, object]]:
    """Allow conditions (any one suffices) that hold exactly where no rule of ``rules`` does."""
    cmps = [r.args[0] for r in rules]
    if any(len(r.args) != 1 for r in rules) or len({a.index for a in cmps}) != 1 or any(
            a.op is not Op.MASKED_EQ for a in cmps):
        raise ValueError(f"{rules[0].syscall}: only one masked comparison per rule, all on one "
                         "argument, can be turned into an allow-list")
    index = cmps[0].index
    if all(a.mask == a.value for a in cmps):
        # Each rule tests flag bits: allowed where none of them is set.
        union = 0
        for a in cmps:
            union |= a.mask
        return [_arg(index, "SCMP_CMP_MASKED_EQ", union, 0)]
    if all(a.mask == _LOW32 for a in cmps):
        # Each rule names a 32-bit value: allowed on every other one.
        return [_arg(index, "SCMP_CMP_MASKED_EQ", mask, datum)
                for mask, datum in _prefixes(frozenset(a.value for a in cmps))]
    raise ValueError(f"{rules[0].syscall}: masked comparisons mix flag tests and values")


def _conditional(name: str, rules: list[Rule]) -> list[dict[str, object]]:
    answers = {_ERRNO[r.action] for r in rules}
    if answers == {_DEFAULT_ERRNO}:
        return [{"names": [name], "action": "SCMP_ACT_ALLOW", "args": [arg]}
                for arg in _complement(rules)]
    if _DEFAULT_ERRNO in answers:
        raise ValueError(f"{name}: rules answering EPERM and another errno cannot be combined")
    # An argument rule answering another errno (socket's EAFNOSUPPORT) is emitted as a
    # refusal, its syscall allowed by a condition that always holds: of two matching
    # conditional rules libseccomp applies the refusal.
    # An unsigned ``>= 0`` always holds; conditional, so the refusals stay in force.
    return [{"names": [name], "action": "SCMP_ACT_ALLOW",
             "args": [_arg(0, "SCMP_CMP_GE", 0)]}, *(_refusal(r) for r in rules)]


def build_profile(rules: tuple[Rule, ...] = RULES) -> dict[str, object]:
    """Docker's seccomp JSON: ``ALLOWED`` less what ``rules`` refuse, with ``rules`` in force.

    Raises ``ValueError`` for a rule it cannot express (a programming error:
    the golden test builds the profile from the real rules).
    """
    refused = {r.syscall for r in rules if not r.args}
    conditional: dict[str, list[Rule]] = {}
    for rule in rules:
        if rule.args and rule.syscall not in refused:
            conditional.setdefault(rule.syscall, []).append(rule)
    names = sorted({n for group in ALLOWED.values() for n in group} - refused - set(conditional))
    syscalls: list[dict[str, object]] = [{"names": names, "action": "SCMP_ACT_ALLOW"}]
    syscalls += [{"names": [name], "action": "SCMP_ACT_ALLOW", "includes": {"arches": list(arches)}}
                 for name, arches in ARCH_ALLOWED.items() if name not in refused]
    for name in sorted(conditional):
        syscalls += _conditional(name, conditional[name])
    # Refused outright with EPERM: not allowed, so the default answers.
    syscalls += [_refusal(r) for r in rules
                 if not r.args and _ERRNO[r.action] != _DEFAULT_ERRNO]
    return {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": _DEFAULT_ERRNO,
            "archMap": [dict(a) for a in _ARCH_MAP], "syscalls": syscalls}


def profile_json(rules: tuple[Rule, ...] = RULES) -> str:
    """The profile as the file's text (stable: a golden test pins it)."""
    return json.dumps(build_profile(rules), indent=1, sort_keys=True) + "\n"


# For ``docker create --security-opt seccomp=FILE``: the docker CLI reads the file and sends
# its content with the create request, so it is never in any container's view.
def write_profile(directory: str, rules: tuple[Rule, ...] = RULES) -> str:
    """Write the profile into ``directory`` (the harness's own, 0700) and return its path."""
    path = os.path.join(directory, "seccomp.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(profile_json(rules))
    return path


def mechanism(rules: tuple[Rule, ...] = RULES) -> str:
    """How SessionInfo.layers names this layer."""
    return f"firstrun seccomp profile ({len(rules)} rules) over docker"
