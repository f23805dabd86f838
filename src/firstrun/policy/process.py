"""Process limits and the environment a sandboxed command starts with.

Guarantee: the environment is built from scratch. A command sees the names set
here and the toolchain homes and credential placeholders (never values) the
caller passes, none of which may shadow a name built here. Of the harness's own
variables only ``TERM`` and the certificate trust settings carry over (so pip,
npm and curl work behind a proxy); nothing else, API keys included, can leak
through the environment. Pure: stdlib only, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from firstrun.errors import PolicyError

CA_VARIABLES = (
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "PIP_CERT",
    "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
)

PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy")

LOCALE_DEFAULT = "C.UTF-8"

# Debian's system bundle, which OpenSSL, curl and Node read by default: where
# the harness reads the host's own, and where the sandbox's view shows one
# (with inspection, the run's bundle is bound there).
SANDBOX_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

# Names a credential placeholder may not take: each is built here or copied.
RESERVED_VARIABLES = frozenset({
    "PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME", "SHELL",
    "PYTHONDONTWRITEBYTECODE", "NO_PROXY", "no_proxy", *CA_VARIABLES, *PROXY_VARIABLES,
})


# The longest limit a command may ask for. Past it the arithmetic stops being
# defined: infinity and NaN never expire, and every supervisor's wait (epoll
# counts milliseconds in an int) overflows beyond about 24 days.
MAX_COMMAND_TIMEOUT_S = 7 * 24 * 3600.0

# The size of the filesystem a workspace firstrun makes is given, in MiB,
# unless a task's ``budgets.max_disk_mb`` or ``--max-disk`` says otherwise
# (0: no bound). Below the minimum ext4 has no room left for a workspace.
DEFAULT_DISK_MB = 4096
MIN_DISK_MB = 16


@dataclass(frozen=True, kw_only=True)
class Limits:
    command_timeout_s: float = 600.0
    output_bytes: int = 1 << 20
    pids: int = 1024
    memory_bytes: int = 4 << 30
    open_files: int = 4096

    def to_data(self) -> dict[str, object]:
        return {
            "command_timeout_s": self.command_timeout_s,
            "output_bytes": self.output_bytes,
            "pids": self.pids,
            "memory_bytes": self.memory_bytes,
            "open_files": self.open_files,
        }


def build_environment(
    host_env: Mapping[str, str],
    *,
    path: Sequence[str],
    home: str,
    tmpdir: str,
    proxy_url: str | None,
    no_proxy: str = "localhost,127.0.0.1,::1",
    inspected: bool = False,
    placeholders: Mapping[str, str] | None = None,
    toolchains: Sequence[tuple[str, str]] = (),
) -> dict[str, str]:
    """The complete environment of a sandboxed command.

    ``inspected``: the proxy terminates TLS, so every trust variable names
    ``SANDBOX_CA_BUNDLE``. ``placeholders``: credential name to placeholder.
    ``toolchains``: where each lent toolchain lives (``RUSTUP_HOME``,
    ``PYENV_ROOT``, ...), from ``FilesystemPolicy.toolchain_env``.
    """
    env = {
        "PATH": ":".join(path),
        "HOME": home,
        "TMPDIR": tmpdir,
        "LANG": LOCALE_DEFAULT,
        "LC_ALL": LOCALE_DEFAULT,
        "TERM": host_env.get("TERM", "dumb") if host_env.get("TERM", "").isprintable() else "dumb",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "SHELL": "/bin/bash",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if inspected:
        # With TLS inspection the host's trust settings do not carry over: every trust
        # variable names SANDBOX_CA_BUNDLE, where the backend shows the run's bundle
        # (the system CAs plus the run's CA).
        # One bundle for every client; a directory cannot hold the run CA.
        env.update({name: SANDBOX_CA_BUNDLE for name in CA_VARIABLES if name != "SSL_CERT_DIR"})
    else:
        for name in CA_VARIABLES:
            value = host_env.get(name)
            if value:
                env[name] = value
    for name, value in toolchains:
        if name in RESERVED_VARIABLES:
            raise PolicyError(f"a toolchain variable {name} would shadow the sandbox's own ${name}")
        env[name] = value
    for name, placeholder in (placeholders or {}).items():
        if name in RESERVED_VARIABLES:
            raise PolicyError(f"credential {name} would shadow the sandbox's own ${name}")
        env[name] = placeholder
    if proxy_url is not None:
        for name in PROXY_VARIABLES:
            env[name] = proxy_url
        env["NO_PROXY"] = no_proxy
        env["no_proxy"] = no_proxy
    return env
