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
from collections.abc import Callable, Iterable, Sequence
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


@dataclass(frozen=True, kw_only=True)
class FilesystemPolicy:
    """Host paths, as the harness sees them.

    ``readonly`` are bound read-only at the same path; ``hidden`` are masked
    inside them (files by an empty file, directories by an empty tmpfs).
    ``real_homes`` are the directories whose content must be unreadable.
    ``toolchain_env`` are the variables the lent toolchains need to find
    themselves (``Toolchain.home_variable``), set in every command's environment.
    ``protected`` are the workspace entries held read-only (see
    ``workspace_protection``), each ``(name, kind)`` with kind ``file`` or
    ``dir``; ``lifted`` the protected names the user let the sandbox write.
    ``lent`` are host directories bound read-only at the same path on every
    backend, a container's included (an agent CLI's install), unlike
    ``readonly``, which a container's own image replaces.
    """

    workspace: str
    readonly: tuple[str, ...] = SYSTEM_READONLY
    hidden: tuple[str, ...] = ()
    real_homes: tuple[str, ...] = ()
    sandbox_home: str = "/home/sandbox"
    sandbox_workspace: str = "/workspace"
    toolchain_env: tuple[tuple[str, str], ...] = ()
    protected: tuple[tuple[str, str], ...] = ()
    lifted: tuple[str, ...] = ()
    lent: tuple[str, ...] = ()

    def to_data(self) -> dict[str, object]:
        # Keys added later appear only when set, so older policies keep their hash.
        return {
            "workspace": self.sandbox_workspace,
            "readonly": list(self.readonly),
            "hidden": list(self.hidden),
            "real_homes": list(self.real_homes),
            "sandbox_home": self.sandbox_home,
        } | ({"toolchain_env": [list(p) for p in self.toolchain_env]} if self.toolchain_env else {}
             ) | ({"protected": [list(p) for p in self.protected]} if self.protected else {}
                  ) | ({"lifted": list(self.lifted)} if self.lifted else {}
                       ) | ({"lent": list(self.lent)} if self.lent else {})


def is_under(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or beneath it, by components (``/a/bc`` is not under ``/a/b``)."""
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
        if is_under(tree, workspace):
            return f"it holds the host's {tree}"
    for tree in _NEVER_INSIDE:
        if is_under(workspace, tree):
            return f"it is inside the host's system tree {tree}"
    for home in homes:
        if is_under(home, workspace):
            return f"it holds the home directory {home}, whose secrets the sandbox hides"
        for secret in SECRET_HOME_PATHS:
            if is_under(workspace, posixpath.join(home, secret)):
                return f"it is inside {posixpath.join(home, secret)}, a secret location"
    return None


@dataclass(frozen=True, kw_only=True)
class Toolchain:
    """One toolchain under a home: what of it runs, and what it needs beside it.

    ``lend`` are paths under ``root`` (``""`` the root itself) lent read-only:
    programs, libraries and installed versions, never configuration or
    credential files. ``home_variable`` is set to the root's real path inside,
    for a toolchain that would otherwise look for itself under the sandbox's
    fresh HOME (rustup, pyenv, nvm). ``companions`` are other roots it runs
    from: a ``~/.cargo/bin/cargo`` is rustup's proxy into ``~/.rustup``.
    """

    root: str
    lend: tuple[str, ...]
    home_variable: str | None = None
    companions: tuple[str, ...] = ()


TOOLCHAINS: tuple[Toolchain, ...] = (
    # cargo's own home (registry cache, config.toml, credentials) stays the
    # sandbox's: $HOME/.cargo there is fresh and writable.
    Toolchain(root=".cargo", lend=("bin",), companions=(".rustup",)),
    Toolchain(root=".rustup", lend=("toolchains", "settings.toml", "update-hashes"),
              home_variable="RUSTUP_HOME"),
    Toolchain(root=".pyenv", lend=("bin", "libexec", "shims", "versions", "plugins", "version"),
              home_variable="PYENV_ROOT"),
    Toolchain(root=".nvm", lend=("versions", "alias", "nvm.sh", "nvm-exec"),
              home_variable="NVM_DIR"),
    Toolchain(root=".local/bin", lend=("",),
              companions=(".local/share/pipx", ".local/share/uv", ".local/lib")),
    Toolchain(root=".local/share/pipx", lend=("venvs", "shared")),
    Toolchain(root=".local/share/uv", lend=("python", "tools")),
    Toolchain(root=".local/lib", lend=("",)),
    Toolchain(root=".npm-global", lend=("bin", "lib")),
    Toolchain(root=".gem", lend=("ruby",)),
    Toolchain(root="go", lend=("bin",)),
    Toolchain(root=".volta", lend=("bin", "tools")),
    Toolchain(root=".bun", lend=("bin",)),
    Toolchain(root=".deno", lend=("bin",)),
    Toolchain(root=".asdf", lend=("bin", "lib", "shims", "installs", "plugins", "asdf.sh"),
              home_variable="ASDF_DIR"),
    Toolchain(root=".local/share/mise", lend=("installs", "shims")),
    Toolchain(root=".local/share/pnpm", lend=("",)),
    Toolchain(root=".sdkman", lend=("bin", "candidates", "src")),
    Toolchain(root=".goenv", lend=("bin", "libexec", "shims", "versions"),
              home_variable="GOENV_ROOT"),
    Toolchain(root=".rbenv", lend=("bin", "libexec", "shims", "versions"),
              home_variable="RBENV_ROOT"),
    Toolchain(root=".nodenv", lend=("bin", "libexec", "shims", "versions"),
              home_variable="NODENV_ROOT"),
    Toolchain(root=".juliaup", lend=("bin",)),
    Toolchain(root=".dotnet", lend=("dotnet", "host", "shared", "sdk", "packs", "tools")),
    Toolchain(root=".ghcup", lend=("bin", "ghc")),
    Toolchain(root=".elan", lend=("bin", "toolchains")),
)
_BY_ROOT = {t.root: t for t in TOOLCHAINS}


@dataclass(frozen=True, kw_only=True)
class Lending:
    """What the PATH needs from the homes: paths to lend read-only, and variables to set."""

    readonly: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


def toolchain_lending(path_entries: Sequence[str], homes: Iterable[str],
                      exists: Callable[[str], bool]) -> Lending:
    """The parts of each toolchain the PATH runs from (see ``TOOLCHAINS``), and their variables.

    ``exists`` says whether a host path exists (the caller's I/O; this stays
    pure). An entry under a home but under no known toolchain is lent as the
    entry itself, and beside a ``bin`` its sibling ``lib`` (an npm prefix's
    packages), never widened further. Nothing under a secret location is lent.
    """
    readonly: list[str] = []
    env: list[tuple[str, str]] = []
    homes = [posixpath.normpath(h) for h in homes if h and h != "/"]

    def lend(path: str, home: str) -> None:
        if any(is_under(path, posixpath.join(home, s)) for s in SECRET_HOME_PATHS):
            return
        if exists(path) and path not in readonly:
            readonly.append(path)

    def lend_toolchain(chain: Toolchain, home: str, seen: set[str]) -> None:
        if chain.root in seen:
            return
        seen.add(chain.root)
        root = posixpath.join(home, chain.root)
        if not exists(root):
            return
        for part in chain.lend:
            lend(posixpath.join(root, part) if part else root, home)
        if chain.home_variable is not None and all(n != chain.home_variable for n, _ in env):
            env.append((chain.home_variable, root))
        for other in chain.companions:
            if other in _BY_ROOT:
                lend_toolchain(_BY_ROOT[other], home, seen)

    for entry in path_entries:
        if not entry or not entry.startswith("/"):
            continue
        entry = posixpath.normpath(entry)
        for home in homes:
            if not is_under(entry, home) or entry == home:
                continue
            rel = posixpath.relpath(entry, home)
            chain = next((t for t in TOOLCHAINS if is_under(rel, t.root)), None)
            if chain is None:
                lend(entry, home)
                if posixpath.basename(entry) == "bin":
                    lend(posixpath.join(posixpath.dirname(entry), "lib"), home)
                continue
            seen: set[str] = set()
            lend_toolchain(chain, home, seen)
            # An entry the toolchain's parts do not cover (a plugin's own shims) still runs.
            if not any(is_under(entry, r) for r in readonly):
                lend(entry, home)
    return Lending(readonly=tuple(readonly), env=tuple(env))


# Entries of a workspace that something on the host runs or trusts later:
# git (its hooks and config run at the owner's next commit, .gitmodules at the
# next clone), shells that start there, editors and agents that load a
# project's settings and servers. Written by a sandboxed command into the
# owner's own checkout, each is an escape that waits. Name and kind of the
# placeholder that holds the name when it is absent.
PROTECTED_ENTRIES: tuple[tuple[str, str], ...] = (
    (".git", "dir"), (".gitmodules", "file"), (".gitconfig", "file"),
    (".bashrc", "file"), (".bash_profile", "file"), (".bash_login", "file"),
    (".profile", "file"), (".zshrc", "file"), (".zprofile", "file"), (".zshenv", "file"),
    (".ripgreprc", "file"), (".mcp.json", "file"),
    (".vscode", "dir"), (".idea", "dir"), (".claude", "dir"), (".codex", "dir"),
)
PROTECTED_NAMES = tuple(name for name, _ in PROTECTED_ENTRIES)


@dataclass(frozen=True, kw_only=True)
class Protection:
    """What ``workspace_protection`` decided: entries held read-only, names lifted, or a refusal."""

    protected: tuple[tuple[str, str], ...] = ()
    lifted: tuple[str, ...] = ()
    refusal: str | None = None


def workspace_protection(kinds: Callable[[str], str | None],
                         lift: Iterable[str] = ()) -> Protection:
    """Which of ``PROTECTED_ENTRIES`` a workspace holds read-only, lifting those in ``lift``.

    ``kinds`` says what a workspace entry is: ``file``, ``dir``, ``symlink``,
    ``other``, or None when absent (the caller's I/O). An absent entry is
    protected with its placeholder's kind, so it cannot be created either;
    a present one with its own. A symlink cannot be held read-only by a
    bind (the mount would land on its target), so it is a refusal, as is
    an unknown name in ``lift`` (a typo would otherwise protect nothing it
    meant to and lift nothing).
    """
    lifted = tuple(dict.fromkeys(lift))
    unknown = [name for name in lifted if name not in PROTECTED_NAMES]
    if unknown:
        return Protection(refusal=f"{unknown[0]!r} is not a protected workspace entry "
                                  f"(they are: {', '.join(PROTECTED_NAMES)})")
    protected: list[tuple[str, str]] = []
    for name, placeholder in PROTECTED_ENTRIES:
        if name in lifted:
            continue
        kind = kinds(name)
        if kind == "symlink":
            return Protection(refusal=f"the workspace's {name} is a symlink, which cannot be held "
                                      f"read-only; remove it, or lift it with --allow-write {name}")
        if kind == "other":
            return Protection(refusal=f"the workspace's {name} is neither a file nor a "
                                      f"directory; remove it, or lift it with --allow-write {name}")
        protected.append((name, kind or placeholder))
    return Protection(protected=tuple(protected), lifted=lifted)


def secrets_inside(roots: Iterable[str], homes: Iterable[str]) -> tuple[str, ...]:
    """Secret paths that fall inside an exposed toolchain root (e.g. ~/.cargo/credentials)."""
    hidden: list[str] = []
    for home in homes:
        for secret in SECRET_HOME_PATHS:
            full = posixpath.join(home, secret)
            if any(is_under(full, r) for r in roots) and full not in hidden:
                hidden.append(full)
    return tuple(hidden)
