"""The seccomp filter of the linux backend, as data first and BPF second.

Guarantee: every sandboxed process runs under a filter that refuses the
syscalls a confined process could use to inspect or steer its neighbours
(ptrace, process_vm_*, pidfd_getfd, kcmp), to rearrange or leave its
namespaces (mount family, pivot_root, chroot, unshare, setns, clone with any
CLONE_NEW* flag), to reach kernel attack surface it never needs (bpf,
keyrings, userfaultfd, perf, io_uring, modules, kexec, memfd_secret), to push keystrokes
into a terminal (TIOCSTI, TIOCLINUX), or to open sockets outside AF_UNIX,
AF_INET and AF_INET6. ``clone3`` answers ENOSYS so libc falls back to
``clone``, whose flags a filter can inspect (clone3 passes them in memory).

``RULES`` is plain data so a golden test can pin it; ``compile_filter`` turns
it into BPF with libseccomp, which knows each architecture's syscall numbers.
Syscalls that do not exist on the running architecture are skipped there.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from enum import StrEnum

from firstrun.errors import SandboxError


class Action(StrEnum):
    EPERM = "eperm"
    ENOSYS = "enosys"
    EAFNOSUPPORT = "eafnosupport"


class Op(StrEnum):
    EQ = "eq"
    GT = "gt"
    MASKED_EQ = "masked_eq"


@dataclass(frozen=True, kw_only=True)
class ArgCmp:
    """``arg[index] <op> value``; MASKED_EQ is ``(arg & mask) == value``."""

    index: int
    op: Op
    value: int
    mask: int = 0


@dataclass(frozen=True, kw_only=True)
class Rule:
    """Apply ``action`` to ``syscall`` when every comparison holds (none: always)."""

    syscall: str
    action: Action
    args: tuple[ArgCmp, ...] = ()


_ERRNO = {Action.EPERM: errno.EPERM, Action.ENOSYS: errno.ENOSYS, Action.EAFNOSUPPORT: errno.EAFNOSUPPORT}

_DENY_ALWAYS = (
    # Inspecting or steering other processes of the same uid.
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # Changing the mount table or the root, which would undo the filesystem view.
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr",
    # New or foreign namespaces: a fresh user namespace hands back every capability.
    "unshare", "setns",
    # Kernel surface no quickstart needs and many exploits start from.
    "kexec_load", "kexec_file_load", "bpf", "keyctl", "add_key", "request_key",
    "userfaultfd", "perf_event_open", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "init_module", "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at",
    "swapon", "swapoff", "reboot", "acct", "syslog", "quotactl",
    # Memory the kernel hides even from itself: nothing can inspect what is kept there.
    "memfd_secret",
)

# CLONE_NEWTIME (0x80) is left out: for clone() that bit is part of the exit
# signal, and new time namespaces are only reachable through clone3.
_CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

# The kernel's ioctl request argument is 32 bits; compare only those, so a
# request with junk in the upper half cannot slip past an exact 64-bit match.
_LOW32 = 0xFFFFFFFF
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C

# Personality flags that weaken a process's own hardening (ASLR off,
# executable data, page zero mapped). A filter cannot test set membership on
# one argument, so the flags are refused bit by bit; harmless personas such
# as PER_LINUX32 stay available.
_PERSONALITY_FLAGS = {
    "MMAP_PAGE_ZERO": 0x0100000,
    "ADDR_COMPAT_LAYOUT": 0x0200000,
    "READ_IMPLIES_EXEC": 0x0400000,
    "ADDR_NO_RANDOMIZE": 0x0040000,
}

_AF_UNIX, _AF_INET, _AF_INET6 = 1, 2, 10


def _rules() -> tuple[Rule, ...]:
    rules = [Rule(syscall=name, action=Action.EPERM) for name in _DENY_ALWAYS]
    rules.append(Rule(syscall="clone3", action=Action.ENOSYS))
    rules += [
        Rule(syscall="clone", action=Action.EPERM,
             args=(ArgCmp(index=0, op=Op.MASKED_EQ, mask=flag, value=flag),))
        for flag in _CLONE_NEW_FLAGS.values()
    ]
    rules += [
        Rule(syscall="ioctl", action=Action.EPERM,
             args=(ArgCmp(index=1, op=Op.MASKED_EQ, mask=_LOW32, value=request),))
        for request in (_TIOCSTI, _TIOCLINUX)
    ]
    rules += [
        Rule(syscall="personality", action=Action.EPERM,
             args=(ArgCmp(index=0, op=Op.MASKED_EQ, mask=flag, value=flag),))
        for flag in _PERSONALITY_FLAGS.values()
    ]
    # One rule per refused family: a rule cannot compare one argument twice.
    rules += [
        Rule(syscall="socket", action=Action.EAFNOSUPPORT,
             args=(ArgCmp(index=0, op=Op.EQ, value=family),))
        for family in (0, *range(_AF_INET + 1, _AF_INET6))
    ]
    rules.append(
        Rule(syscall="socket", action=Action.EAFNOSUPPORT,
             args=(ArgCmp(index=0, op=Op.GT, value=_AF_INET6),))
    )
    return tuple(rules)


RULES: tuple[Rule, ...] = _rules()


def rules_to_data(rules: tuple[Rule, ...] = RULES) -> list[dict[str, object]]:
    """Plain data for golden tests and for recording what was enforced."""
    return [
        {
            "syscall": r.syscall,
            "action": r.action.value,
            "args": [
                {"index": a.index, "op": a.op.value, "value": a.value, "mask": a.mask}
                for a in r.args
            ],
        }
        for r in rules
    ]


def compile_filter(rules: tuple[Rule, ...] = RULES) -> int:
    """Compile ``rules`` to BPF in a memfd and return the fd, rewound.

    The fd is close-on-exec; the caller owns it and hands it to ``bwrap
    --seccomp`` through ``pass_fds``, so no other child ever inherits it.
    """
    import pyseccomp

    ops = {
        Op.EQ: pyseccomp.EQ, Op.GT: pyseccomp.GT, Op.MASKED_EQ: pyseccomp.MASKED_EQ,
    }
    try:
        filt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
        for rule in rules:
            # Negative: no such syscall on this architecture, so nothing to refuse.
            if pyseccomp.resolve_syscall(pyseccomp.system_arch(), rule.syscall) < 0:
                continue
            args = [
                pyseccomp.Arg(a.index, ops[a.op], a.mask, a.value)
                if a.op is Op.MASKED_EQ
                else pyseccomp.Arg(a.index, ops[a.op], a.value)
                for a in rule.args
            ]
            filt.add_rule(pyseccomp.ERRNO(_ERRNO[rule.action]), rule.syscall, *args)
        fd = os.memfd_create("firstrun-seccomp", os.MFD_CLOEXEC)
        with os.fdopen(os.dup(fd), "wb") as out:
            filt.export_bpf(out)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError as exc:
        raise SandboxError(f"cannot build the seccomp filter: {exc}", who="seccomp") from exc
    return fd
