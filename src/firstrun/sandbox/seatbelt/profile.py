"""The macOS Seatbelt launch of a session, as a pure function of the profile.

Guarantee: ``build_seatbelt_spec`` is pure and golden-tested. The profile
denies by default; it allows reads except beneath the real homes, private
directories and secrets (bar the workspace, temporary directory and needed
toolchain roots), writes only to the workspace (never its protected entries),
the temporary directory and a few devices, and TCP only to the proxy's port.
No path is spliced into its text; a profile file in a writable root is refused.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from firstrun.errors import SandboxError
from firstrun.policy.filesystem import is_under
from firstrun.policy.profile import SandboxProfile

SANDBOX_EXEC = "/usr/bin/sandbox-exec"

# Device files every shell and installer writes to.
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/tty", "/dev/dtracehelper",
                    "/dev/stdout", "/dev/stderr")

# Mach services a command needs to run at all: user and group lookups
# (getpwuid, which Python, git and npm call), the system logger, and the
# trust daemon that verifies TLS certificates for curl and git (Security
# framework). No other service is reachable.
MACH_SERVICES = (
    "com.apple.system.opendirectoryd.libinfo",
    "com.apple.system.logger",
    "com.apple.trustd",
    "com.apple.trustd.agent",
    "com.apple.SecurityServer",
)


@dataclass(frozen=True, kw_only=True)
class SeatbeltHost:
    """What the pure builder needs from the host, gathered by the backend.

    ``canonical`` maps each policy path whose real path differs (macOS's
    ``/var`` is ``/private/var``) to that real path; Seatbelt matches real
    paths only. ``tmpdir`` is the sandbox's own temporary directory (HOME
    lives inside it); ``profile_file`` is where the profile text is written.
    ``private`` are host directories outside the homes that hold the user's
    own files (unreadable like a home); ``readable`` are paths the harness
    itself needs readable inside (the interpreter that runs the attestation
    probe), exposed like a toolchain root when they lie in a home.
    """

    canonical: tuple[tuple[str, str], ...] = ()
    tmpdir: str
    profile_file: str
    private: tuple[str, ...] = ()
    readable: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SeatbeltSpec:
    profile_text: str
    parameters: tuple[tuple[str, str], ...]
    profile_file: str

    def named(self, kind: str) -> tuple[str, ...]:
        """The values of one kind of parameter, in order: ``HOME``, ``PRIVATE``,
        ``HIDDEN``, ``TOOLCHAIN``, ``WRITABLE`` (the workspace, then the sandbox's
        temporary directory) or ``ANCESTOR``."""
        return tuple(v for n, v in self.parameters if n.rpartition("_")[0] == kind)

    def argv(self, command: list[str], *, sandbox_exec: str = SANDBOX_EXEC) -> list[str]:
        """``sandbox-exec -f FILE -D NAME=VALUE ... -- COMMAND...``."""
        argv = [sandbox_exec, "-f", self.profile_file]
        for name, value in self.parameters:
            argv += ["-D", f"{name}={value}"]
        return [*argv, "--", *command]


def _ancestors(path: str) -> list[str]:
    found = []
    while path != "/":
        path = posixpath.dirname(path)
        found.append(path)
    return found


def _rule(action: str, *filters: str) -> str:
    return f"(allow {action} {' '.join(f for f in filters if f)})"


def _params(kind: str, names: list[str]) -> str:
    return " ".join(f'({kind} (param "{n}"))' for n in names)


def _excluding(names: list[str]) -> str:
    return " ".join(f'(require-not (subpath (param "{n}")))' for n in names)


def build_seatbelt_spec(profile: SandboxProfile, *, host: SeatbeltHost,
                        proxy_port: int | None) -> SeatbeltSpec:
    """The profile text, its parameters and the profile file for one session."""
    # The only value written into the text is the proxy port, an integer checked here, so it
    # cannot change the text's structure; it is not a -D parameter because the literal
    # "localhost:PORT" is the form of Seatbelt's ``remote ip`` filter that current macOS is
    # known to parse.
    if proxy_port is not None and not (type(proxy_port) is int and 0 < proxy_port < 65536):
        raise SandboxError(f"proxy port {proxy_port!r} is not a TCP port", who="seatbelt")
    fs = profile.fs
    real = dict(host.canonical)

    # Paths are expected canonical (macOS's /tmp is /private/tmp); the backend resolves them
    # before calling this.
    def canonical(path: str, what: str) -> str:
        path = real.get(path, path)
        if not path.startswith("/") or posixpath.normpath(path) != path or "\0" in path:
            raise SandboxError(f"{what} {path!r} is not a canonical absolute path",
                               who="seatbelt")
        return path

    workspace = canonical(fs.workspace, "workspace")
    tmpdir = canonical(host.tmpdir, "sandbox temporary directory")
    profile_file = canonical(host.profile_file, "profile file")
    homes = [canonical(h, "home") for h in fs.real_homes]
    private = [canonical(p, "private directory") for p in host.private]
    # The profile file must sit outside every writable root, or a command could replace it
    # for the next command. A writable root that holds a real home or a private directory is
    # refused too: everything beneath a writable root is readable and writable.
    for root in (workspace, tmpdir):
        if is_under(profile_file, root):
            raise SandboxError(
                f"the profile file {profile_file} is inside the writable root {root}; "
                "a command could replace it", who="seatbelt")
        for kept in (*homes, *private):
            if is_under(kept, root):
                raise SandboxError(
                    f"the writable root {root} contains {kept}, whose files must stay "
                    "unreadable; use a workspace beneath it instead", who="seatbelt")
    toolchains = [canonical(p, "toolchain root") for p in (*fs.readonly, *host.readable)
                  if any(is_under(canonical(p, "read-only root"), h) for h in (*homes, *private))]

    # Every path reaches sandbox-exec only as a -D NAME=VALUE argument, named in the text
    # through (param "..."), so no workspace name (quotes, parentheses, newlines) can change
    # what the profile says.
    params: list[tuple[str, str]] = []

    def name_all(prefix: str, values: list[str]) -> list[str]:
        names = []
        for i, value in enumerate(dict.fromkeys(values)):
            names.append(f"{prefix}_{i}")
            params.append((names[-1], value))
        return names

    home_names = name_all("HOME", homes)
    private_names = name_all("PRIVATE", private)
    hidden_names = name_all("HIDDEN", [canonical(p, "hidden path") for p in fs.hidden])
    toolchain_names = name_all("TOOLCHAIN", toolchains)
    writable_names = name_all("WRITABLE", [workspace, tmpdir])
    # Held without a placeholder: Seatbelt refuses a write to a path that
    # does not exist yet, and a rename of one that does, by name.
    protected_names = name_all("PROTECTED", [posixpath.join(workspace, name)
                                             for name, _ in fs.protected])
    # Resolving a path under a home lstat()s each ancestor: allow their
    # metadata (names and modes, never contents) and nothing more.
    ancestor_names = name_all("ANCESTOR", sorted(
        {a for p in (workspace, tmpdir, *toolchains) for a in _ancestors(p)}))

    lines = [
        "(version 1)",
        # Every rule is an allow under (deny default), exclusions written as require-not
        # inside the rule, so the result does not depend on how Seatbelt orders competing
        # rules. No Unix socket is allowed, so no docker.sock, ssh-agent or D-Bus.
        "(deny default)",
        "",
        ";; processes: only within this sandbox",
        "(allow process-exec process-fork)",
        "(allow signal (target same-sandbox))",
        "(allow process-info* (target same-sandbox))",
        "(allow sysctl-read)",
        "(allow ipc-posix-sem ipc-posix-shm)",
        "(allow mach-lookup",
        *(f'  (global-name "{s}")' for s in MACH_SERVICES),
        ")",
        "",
        ";; reads: the system, never the real homes, private directories or hidden paths",
        _rule("file-read*", "(require-all (subpath \"/\")", _excluding(home_names),
              _excluding(private_names), _excluding(hidden_names) + ")"),
        _rule("file-read*", _params("subpath", writable_names)),
    ]
    if toolchain_names:
        lines.append(_rule("file-read*", "(require-all (require-any",
                           _params("subpath", toolchain_names) + ")",
                           _excluding(hidden_names) + ")"))
    if ancestor_names:
        lines.append(_rule("file-read-metadata", _params("literal", ancestor_names)))
    lines += [
        "",
        ";; writes: the workspace, the sandbox's temporary directory, a few devices",
        *((_rule("file-write*", f'(require-all (subpath (param "{writable_names[0]}"))',
                 _excluding(protected_names) + ")"),
           _rule("file-write*", _params("subpath", writable_names[1:])))
          if protected_names else (_rule("file-write*", _params("subpath", writable_names)),)),
        "(allow file-write-data file-ioctl",
        *(f'  (literal "{d}")' for d in WRITABLE_DEVICES),
        ")",
        "",
        ";; network: only the harness's egress proxy on localhost",
        f'(allow network-outbound (remote ip "localhost:{proxy_port}"))'
        if proxy_port is not None else ";; no proxy: no network at all",
    ]
    return SeatbeltSpec(profile_text="\n".join(lines) + "\n", parameters=tuple(params),
                        profile_file=profile_file)
