"""Choosing a backend by name.

Guarantee: ``auto`` picks the strongest backend this machine can enforce and
never an unenforced one (nor a micro-VM, which is opt-in); ``local`` is
refused unless unenforced execution was explicitly allowed. A name that is
not a backend is a usage error, never a silent fallback.
"""

from __future__ import annotations

from firstrun.errors import SandboxUnavailable, UsageError
from firstrun.sandbox.base import Backend
from firstrun.sandbox.linux.backend import LinuxBackend
from firstrun.sandbox.local import LocalBackend

BACKENDS = ("auto", "linux", "local")


def select_backend(name: str, *, allow_unenforced: bool) -> Backend:
    if name == "linux":
        return LinuxBackend()
    if name == "local":
        backend = LocalBackend(allow_unenforced=allow_unenforced)
        if not allow_unenforced:
            (cap,) = backend.probe()
            raise SandboxUnavailable("the local backend enforces nothing; refused",
                                     who="local", fix=cap.fix)
        return backend
    if name == "auto":
        linux = LinuxBackend()
        missing = [c for c in linux.probe() if not c.available]
        if not missing:
            return linux
        raise SandboxUnavailable(
            "no enforcing backend is available: "
            + "; ".join(f"{c.name}: {c.detail}" for c in missing),
            who="select",
            fix="; ".join(c.fix for c in missing if c.fix),
        )
    raise UsageError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
