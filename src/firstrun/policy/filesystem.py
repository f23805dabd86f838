"""What a sandboxed command may read and write.

Guarantee: the workspace is the only host directory a command can write;
system directories are visible read-only; the invoking user's home is absent
except for the toolchain directories that the command's PATH needs, and the
secret locations inside those stay hidden even then. The lists here are data:
backends turn them into mounts, Landlock rules or Seatbelt parameters.

Pure: stdlib only, no I/O (the caller passes in what exists).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SYSTEM_READONLY = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

# Relative to a home directory. Credentials and histories: a quickstart never
# needs them, and an agent that read one could paste it anywhere it can write.
SECRET_HOME_PATHS = (
    ".ssh", ".gnupg", ".aws", ".azure", ".config/gcloud", ".kube", ".docker",
    ".netrc", ".npmrc", ".yarnrc", ".yarnrc.yml", ".pypirc", ".git-credentials",
    ".gitconfig", ".config/git", ".config/gh", ".config/hub", ".config/pip", ".pip",
    ".bash_history", ".zsh_history", ".python_history", ".node_repl_history",
    ".psql_history", ".mysql_history", ".lesshst", ".viminfo", ".pgpass", ".my.cnf",
    ".vault-token", ".terraform.d", ".terraformrc", ".cargo/credentials",
    ".cargo/credentials.toml", ".local/share/keyrings", ".password-store",
    ".config/anthropic", ".config/openai", ".env",
)

# A PATH entry below one of these means the whole root is the toolchain
# (pyenv shims exec ``$PYENV_ROOT/libexec``; nvm's node lives in versions/).
TOOLCHAIN_ROOTS = (
    ".pyenv", ".nvm", ".asdf", ".rustup", ".cargo", ".volta", ".bun", ".deno",
    ".local/share/mise", ".local/share/pnpm", ".sdkman", ".goenv", ".rbenv", ".nodenv",
    ".juliaup", ".local/bin", ".local/lib", "go", ".dotnet", ".ghcup", ".elan",
)


@dataclass(frozen=True, kw_only=True)
class FilesystemPolicy:
    """Host paths, as the harness sees them.

    ``readonly`` are bound read-only at the same path; ``hidden`` are masked
    inside them (files by an empty file, directories by an empty tmpfs).
    ``real_homes`` are the directories whose content must be unreadable.
    """

    workspace: str
    readonly: tuple[str, ...] = SYSTEM_READONLY
    hidden: tuple[str, ...] = ()
    real_homes: tuple[str, ...] = ()
    sandbox_home: str = "/home/sandbox"
    sandbox_workspace: str = "/workspace"

    def to_data(self) -> dict[str, object]:
        return {
            "workspace": self.sandbox_workspace,
            "readonly": list(self.readonly),
            "hidden": list(self.hidden),
            "real_homes": list(self.real_homes),
            "sandbox_home": self.sandbox_home,
        }


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


# Trees of the host itself. A workspace is lent to the sandbox's uid and
# bound writable, so one that holds any of these would hand the host over;
# one inside the system and kernel trees is not a project at all.
HOST_TREES = (*SYSTEM_READONLY, "/boot", "/dev", "/proc", "/sys", "/run", "/var", "/tmp", "/home",
              "/root", "/srv", "/mnt", "/media", "/snap")
_NEVER_INSIDE = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot",
                 "/dev", "/proc", "/sys", "/run")


def workspace_refusal(workspace: str, homes: Iterable[str]) -> str | None:
    """Why ``workspace`` (an absolute, resolved path) must not be one; None when it may.

    Refused: a directory that holds a host tree (``/``, ``/usr``, ``/tmp``
    itself), one inside the system or kernel trees (``/proc/...``,
    ``/usr/...``; ``/opt/...`` is allowed, projects live there), a real home
    or a directory holding one (its secrets would be bound writable and
    lent), and a directory inside a home's secret locations.
    """
    for tree in HOST_TREES:
        if _under(tree, workspace):
            return f"it holds the host's {tree}"
    for tree in _NEVER_INSIDE:
        if _under(workspace, tree):
            return f"it is inside the host's system tree {tree}"
    for home in homes:
        if _under(home, workspace):
            return f"it holds the home directory {home}, whose secrets the sandbox hides"
        for secret in SECRET_HOME_PATHS:
            if _under(workspace, posixpath.join(home, secret)):
                return f"it is inside {posixpath.join(home, secret)}, a secret location"
    return None


def toolchain_roots(path_entries: Sequence[str], homes: Iterable[str]) -> tuple[str, ...]:
    """The directories under a home that the PATH needs, widened to their toolchain root.

    Entries outside every home are system paths and need nothing extra here.
    An entry under a home but under no known toolchain root is exposed as the
    entry itself, never widened to its parent.
    """
    found: list[str] = []
    homes = [posixpath.normpath(h) for h in homes if h and h != "/"]
    for entry in path_entries:
        if not entry or not entry.startswith("/"):
            continue
        entry = posixpath.normpath(entry)
        for home in homes:
            if not _under(entry, home) or entry == home:
                continue
            rel = posixpath.relpath(entry, home)
            root = next(
                (posixpath.join(home, t) for t in TOOLCHAIN_ROOTS if _under(rel, t)), entry
            )
            if any(_under(root, posixpath.join(home, s)) for s in SECRET_HOME_PATHS):
                continue
            if root not in found:
                found.append(root)
    return tuple(found)


def secrets_inside(roots: Iterable[str], homes: Iterable[str]) -> tuple[str, ...]:
    """Secret paths that fall inside an exposed toolchain root (e.g. ~/.cargo/credentials)."""
    hidden: list[str] = []
    for home in homes:
        for secret in SECRET_HOME_PATHS:
            full = posixpath.join(home, secret)
            if any(_under(full, r) for r in roots) and full not in hidden:
                hidden.append(full)
    return tuple(hidden)
