"""The linux backend: bubblewrap namespaces, Landlock, seccomp, rlimits and a proxy relay."""

from firstrun.sandbox.linux.backend import LinuxBackend, LinuxSession

__all__ = ["LinuxBackend", "LinuxSession"]
