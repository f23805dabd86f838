"""The seccomp filter of the linux backend, as data first and BPF second.

Guarantee: every sandboxed process runs under a filter that refuses the
syscalls a confined process could use to inspect or steer its neighbours, to
rearrange or leave its namespaces, to reach kernel surface it never needs, to
weaken its own hardening (personality), to push keystrokes into a terminal, or
to open sockets outside AF_UNIX, AF_INET and AF_INET6.
"""

from __future__ import annotations

import ctypes
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
    # ENOSYS makes libc fall back to clone, whose flags a filter can inspect (clone3 passes
    # them in memory).
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


# Plain data so a golden test can pin it; ``compile_filter`` turns it into BPF with
# libseccomp, which knows each architecture's syscall numbers.
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


# libseccomp's ABI (seccomp.h): the ALLOW and ERRNO actions, the comparisons.
# Loaded by its soname: a wrapper that looks it up with ctypes.util.find_library forks
# ``ldconfig -p`` on every import, which cost each session's start two processes.
LIBSECCOMP = "libseccomp.so.2"
_ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000
_CMP = {Op.EQ: 4, Op.GT: 6, Op.MASKED_EQ: 7}


class _ArgCmp(ctypes.Structure):
    """``struct scmp_arg_cmp``; MASKED_EQ takes the mask in ``datum_a``, the value in ``datum_b``."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def libseccomp() -> ctypes.CDLL:
    """libseccomp, typed for the calls ``compile_filter`` makes; OSError when it cannot load."""
    lib = ctypes.CDLL(LIBSECCOMP, use_errno=True)
    lib.seccomp_init.argtypes = (ctypes.c_uint32,)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_release.argtypes = (ctypes.c_void_p,)
    lib.seccomp_release.restype = None
    lib.seccomp_arch_native.argtypes = ()
    lib.seccomp_arch_native.restype = ctypes.c_uint32
    lib.seccomp_syscall_resolve_name_arch.argtypes = (ctypes.c_uint32, ctypes.c_char_p)
    lib.seccomp_syscall_resolve_name_arch.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = (ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp))
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_export_bpf.argtypes = (ctypes.c_void_p, ctypes.c_int)
    lib.seccomp_export_bpf.restype = ctypes.c_int
    return lib


def _checked(rc: int, what: str) -> None:
    # libseccomp returns -errno.
    if rc < 0:
        raise OSError(-rc, f"{what}: {os.strerror(-rc)}")


def compile_filter(rules: tuple[Rule, ...] = RULES) -> int:
    """Compile ``rules`` to BPF in a memfd and return the fd, rewound.

    The fd is close-on-exec; the caller owns it and hands it to ``bwrap
    --seccomp`` through ``pass_fds``, so no other child ever inherits it.
    """
    try:
        lib = libseccomp()
        ctx = lib.seccomp_init(_ACT_ALLOW)
        if not ctx:
            raise OSError(errno.ENOMEM, "seccomp_init failed")
        try:
            arch = lib.seccomp_arch_native()
            for rule in rules:
                number = lib.seccomp_syscall_resolve_name_arch(arch, rule.syscall.encode())
                # Negative: no such syscall on this architecture, so nothing to refuse.
                if number < 0:
                    continue
                args = (_ArgCmp * max(1, len(rule.args)))(*(
                    _ArgCmp(a.index, _CMP[a.op], a.mask, a.value) if a.op is Op.MASKED_EQ
                    else _ArgCmp(a.index, _CMP[a.op], a.value, 0)
                    for a in rule.args))
                _checked(lib.seccomp_rule_add_array(ctx, _ACT_ERRNO | _ERRNO[rule.action], number,
                                                    len(rule.args), args), f"rule {rule.syscall}")
            fd = os.memfd_create("firstrun-seccomp", os.MFD_CLOEXEC)
            try:
                _checked(lib.seccomp_export_bpf(ctx, fd), "seccomp_export_bpf")
            except OSError:
                os.close(fd)
                raise
        finally:
            lib.seccomp_release(ctx)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError as exc:
        raise SandboxError(f"cannot build the seccomp filter: {exc}", who="seccomp") from exc
    return fd


def filter_program(rules: tuple[Rule, ...] = RULES) -> bytes:
    """``compile_filter``'s BPF as bytes, for a loader inside a sandbox of its own kernel
    (the gvisor helper, the micro-VM's agent): the very program bubblewrap loads."""
    with os.fdopen(compile_filter(rules), "rb") as f:
        return f.read()
