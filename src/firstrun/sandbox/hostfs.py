"""The filesystem policy of this host: the I/O half of ``firstrun.policy.filesystem``.

Guarantee: the policy names only paths that exist here, so a backend can bind
every one; every directory holding a real user's files is a real home, of which
only the toolchain parts PATH runs from are readable, their secrets hidden. A
user's workspace has its protected entries listed, to be held read-only. A
workspace that would hand over a host tree or a home, or holds a mount point,
is refused before any policy exists, so no backend ever lends or binds one.
"""

from __future__ import annotations

import os
import posixpath
import pwd
import sys
from collections.abc import Iterable, Mapping

from firstrun.errors import UsageError
from firstrun.policy.filesystem import (
    SYSTEM_READONLY,
    FilesystemPolicy,
    Protection,
    is_under,
    secrets_inside,
    toolchain_lending,
    workspace_protection,
    workspace_refusal,
)
from firstrun.policy.process import CA_VARIABLES
from firstrun.sandbox.ownership import mount_points_beneath
from firstrun.sandbox.protect import entry_kind

_SYSTEM_TREES = ("/etc", "/usr")


# $HOME, /root, the sudo user's home and each /home/*.
def real_homes(env: Mapping[str, str]) -> tuple[str, ...]:
    """Every directory on this host that holds a real user's files."""
    found: list[str] = []

    def add(path: str | None) -> None:
        if path and path.startswith("/") and path != "/":
            real = os.path.realpath(path)
            if os.path.isdir(real) and real not in found:
                found.append(real)

    add(env.get("HOME"))
    add("/root")
    sudo_user = env.get("SUDO_USER")
    if sudo_user:
        try:
            add(pwd.getpwnam(sudo_user).pw_dir)
        except KeyError:
            pass
    try:
        entries = sorted(os.listdir("/home"))
    except OSError:
        entries = []
    for name in entries:
        add(posixpath.join("/home", name))
    return tuple(found)


def _one_line(text: str) -> str:
    """``text`` with each control character (a newline in a path) written as its escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def check_workspace(workspace: str, env: Mapping[str, str], *, label: str = "workspace") -> str:
    """``workspace`` resolved, or a ``UsageError`` (led by ``label``) saying why it cannot be one."""
    return _checked_workspace(workspace, real_homes(env), label)


# A workspace with a mount point inside is refused because every backend binds what is
# mounted beneath the workspace along with it.
def _checked_workspace(workspace: str, homes: tuple[str, ...], label: str) -> str:
    resolved = os.path.realpath(workspace)
    why = workspace_refusal(resolved, homes)
    if why is None and sys.platform == "linux":
        # Every backend binds the workspace with what is mounted inside it:
        # a bind of a home or of /proc there would be inside the sandbox too.
        inner = mount_points_beneath(resolved)
        if inner:
            why = f"{min(inner)} is a mount point inside it, which the sandbox would see through"
    if why is not None:
        shown = workspace if resolved == workspace else f"{workspace} ({resolved})"
        raise UsageError(_one_line(f"{label}: {shown} cannot be a workspace: {why}; "
                                   "use a project directory"))
    return resolved


def host_filesystem_policy(workspace: str, env: Mapping[str, str], *, protect: bool,
                           lift: Iterable[str] = ()) -> FilesystemPolicy:
    """The filesystem policy for running commands over ``workspace`` on this host.

    ``protect``: the workspace is not one firstrun made for this session (a
    user's checkout), so its protected entries are held read-only
    (``workspace_protection``), less the names in ``lift``. Every caller
    says which, so a user's directory is never lent unprotected by default.

    Raises ``UsageError`` for a workspace ``check_workspace`` refuses, or
    for protected entries that cannot be held (a symlink, an unknown name).
    """
    homes = real_homes(env)
    resolved = _checked_workspace(workspace, homes, "workspace")
    path_entries = [e for e in env.get("PATH", "").split(":") if e]
    lending = toolchain_lending(path_entries, homes, os.path.exists)
    roots = lending.readonly
    readonly = [p for p in SYSTEM_READONLY if os.path.lexists(p)]
    readonly += roots
    # CA bundles the CA variables point at outside /etc and /usr are exposed read-only, so
    # TLS through an intercepting proxy keeps working inside.
    for name in CA_VARIABLES:
        value = env.get(name)
        if not value or not value.startswith("/"):
            continue
        target = posixpath.normpath(value)
        if any(is_under(target, t) for t in _SYSTEM_TREES) or not os.path.exists(target):
            continue
        # The bundle itself is exposed, never its directory, which may be a home.
        if not any(is_under(target, r) for r in readonly) and target not in readonly:
            readonly.append(target)
    hidden = tuple(p for p in secrets_inside(roots, homes) if os.path.lexists(p))
    protection = Protection()
    if protect:
        protection = workspace_protection(lambda name: entry_kind(resolved, name), lift)
        if protection.refusal is not None:
            raise UsageError(f"workspace {resolved}: {protection.refusal}")
    elif lift:
        raise UsageError("--allow-write: the workspace is firstrun's own, where nothing is protected")
    return FilesystemPolicy(
        workspace=resolved,
        readonly=tuple(readonly),
        hidden=hidden,
        real_homes=homes,
        toolchain_env=lending.env,
        protected=protection.protected,
        lifted=protection.lifted,
    )
