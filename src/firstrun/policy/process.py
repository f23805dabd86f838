"""Process limits and the environment a sandboxed command starts with.

Guarantee: the environment is built from scratch. Only the names listed here
reach a command, and of the harness's own variables only certificate trust
settings carry over (so pip, npm and curl work behind a TLS-intercepting
proxy). Nothing else from the harness, API keys included, can leak through
the environment, because nothing else is ever copied.

Pure: stdlib only, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CA_VARIABLES = (
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "PIP_CERT",
    "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
)

PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy")

LOCALE_DEFAULT = "C.UTF-8"


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
) -> dict[str, str]:
    """The complete environment of a sandboxed command."""
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
    for name in CA_VARIABLES:
        value = host_env.get(name)
        if value:
            env[name] = value
    if proxy_url is not None:
        for name in PROXY_VARIABLES:
            env[name] = proxy_url
        env["NO_PROXY"] = no_proxy
        env["no_proxy"] = no_proxy
    return env
