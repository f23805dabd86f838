"""A pinned agent CLI from the npm registry, in a cache outside every workspace.

Guarantee: ``ensure`` returns the CLI's directory only when it holds exactly
the pinned tarball's contents: the tarball is downloaded from the npm
registry, refused unless its ``dist.integrity`` matches the pin, and
unpacked beside the final path, then renamed into place, so a half-written
cache is never used. Nothing is fetched from inside a run: the session is
lent the directory read-only (``CliInstall.root``) and runs ``executable``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from firstrun.errors import SandboxError

NPM_REGISTRY = "https://registry.npmjs.org"


@dataclass(frozen=True, kw_only=True)
class CliPin:
    """One agent CLI: the package a reader installs, and the one whose files run here.

    Claude Code's ``@anthropic-ai/claude-code`` is a launcher whose
    postinstall copies a native binary out of a per-platform package; firstrun
    takes that package (``tarball_name``) directly, so no install script runs.
    Codex's ``@openai/codex`` is a node launcher whose optional dependency is
    a per-platform version of the same package (``0.171.0-linux-x64``),
    holding the native binary under ``vendor/``; firstrun takes that one.
    Gemini CLI's own tarball is its whole program: a bundle with no required
    dependencies (its optional ones, a pty and a keychain, go unused here).
    """

    cli: str
    package: str
    version: str
    tarball_name: str
    tarball_version: str
    integrity: str
    # Relative to the unpacked package directory.
    executable: str

    @property
    def url(self) -> str:
        base = self.tarball_name.rsplit("/", 1)[-1]
        return f"{NPM_REGISTRY}/{self.tarball_name}/-/{base}-{self.tarball_version}.tgz"

    @property
    def key(self) -> str:
        return f"{self.cli}-{self.version}-{self.integrity.partition('-')[2][:16]}".replace("/", "_")


CLAUDE_CODE = CliPin(
    cli="claude-code", package="@anthropic-ai/claude-code", version="2.1.332",
    tarball_name="@anthropic-ai/claude-code-linux-x64", tarball_version="2.1.332",
    integrity="sha512-f4JWhzwYutJIHScC7/dYOPX6s28tt7ZADhsOi8zwOHq5fFPEuUeChh2NMfinSg0GrUckYxaeebC4h0DqiKzLcw==",
    executable="claude",
)

GEMINI_CLI = CliPin(
    cli="gemini-cli", package="@google/gemini-cli", version="0.61.0",
    tarball_name="@google/gemini-cli", tarball_version="0.61.0",
    integrity="sha512-dbQ9A0qBtFJNi6XBkHvfZ6Azpn6PNgH/P8h2MZ67RLlX8hSAVjup39CRWqdRxZv7YXIuhrFaytr8y0jKnkoxnQ==",
    # A node script (#!/usr/bin/env node): the sandbox's node runs it.
    executable="bundle/gemini.js",
)

CODEX = CliPin(
    cli="codex", package="@openai/codex", version="0.171.0",
    tarball_name="@openai/codex", tarball_version="0.171.0-linux-x64",
    integrity="sha512-l66NZkQgdk2C3pbcfULDz42yEUB581MVA6I+Y43Wp4OIqEy73HCdmZ0GTjeAHY2ycuH4N00d9VsLrwT1jxshTw==",
    executable="vendor/x86_64-unknown-linux-musl/bin/codex",
)


# ``--agent`` name to the CLI it runs.
AGENT_CLIS = {"claude-code": CLAUDE_CODE, "codex": CODEX, "gemini-cli": GEMINI_CLI}


def cli_versions(agent: str) -> dict[str, str]:
    """The pinned CLI package ``--agent agent`` runs, by its npm name (empty for other agents).

    For ``meta.versions``: a sweep run by a different CLI release is told apart by ``diff``.
    """
    pin = AGENT_CLIS.get(agent)
    return {pin.package: pin.version} if pin is not None else {}


@dataclass(frozen=True, kw_only=True)
class CliInstall:
    pin: CliPin
    root: str

    @property
    def executable(self) -> str:
        return os.path.join(self.root, self.pin.executable)


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/firstrun/agents``; for root without it, ``/var/cache/firstrun/agents``.

    Not root's home: a container image's /root is 0700, and a directory lent at
    its own path under it could not be reached by the session's uid.
    """
    base = os.environ.get("XDG_CACHE_HOME") or (
        "/var/cache" if os.geteuid() == 0 else os.path.join(os.path.expanduser("~"), ".cache"))
    return Path(base) / "firstrun" / "agents"


def _download(pin: CliPin) -> bytes:
    try:
        with urllib.request.urlopen(pin.url, timeout=600) as answer:
            return answer.read()
    except OSError as exc:
        raise SandboxError(f"{pin.package}@{pin.version}: cannot download {pin.url}: {exc}",
                           who="agents") from exc


def verify(pin: CliPin, body: bytes) -> None:
    """Refuse ``body`` unless it is the pinned tarball (its ``dist.integrity``)."""
    algorithm, _, expected = pin.integrity.partition("-")
    got = base64.b64encode(hashlib.new(algorithm, body).digest()).decode()
    if got != expected:
        raise SandboxError(f"{pin.package}@{pin.version}: integrity {algorithm}-{got} is not "
                           f"the pinned {pin.integrity}", who="agents")


def ensure(pin: CliPin, cache: Path | None = None) -> CliInstall:
    """The pinned CLI, installed into ``cache`` (default: ``default_cache()``) once."""
    where = (cache or default_cache()) / pin.key
    if (where / pin.executable).is_file():
        return CliInstall(pin=pin, root=str(where))
    body = _download(pin)
    verify(pin, body)
    where.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{pin.key}-", dir=where.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
            # "data": no absolute paths, no links out, no device files.
            archive.extractall(staging, filter="data")
        package = staging / "package"
        (package / pin.executable).chmod(0o755)
        # World-readable: the sandbox's uid reads it through the read-only lend.
        for path in (package, *package.rglob("*")):
            path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
        try:
            package.rename(where)
        except OSError:
            # Another run installed it first; theirs is the same verified tarball.
            if not (where / pin.executable).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return CliInstall(pin=pin, root=str(where))


def ensure_node(cache: Path | None = None) -> str:
    """The host's ``node`` (>= 20), copied once into ``cache`` by its hash: the path to run.

    A JavaScript CLI runs on it in every session, lent read-only like the CLI,
    so a container whose image has no node (docker's) runs the same node the
    host does. ``SandboxError`` when the host has none, or one too old.
    """
    found = shutil.which("node")
    if found is None:
        raise SandboxError("the host has no node (>= 20) to run a JavaScript agent CLI on",
                           who="agents")
    source = os.path.realpath(found)
    with open(source, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()[:16]
    where = (cache or default_cache()) / f"node-{digest}"
    executable = where / "node"
    if not executable.is_file():
        where.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".node-{digest}-", dir=where.parent))
        try:
            shutil.copy2(source, staging / "node")
            staging.chmod(0o755)
            (staging / "node").chmod(0o755)
            try:
                staging.rename(where)
            except OSError:
                # Another run copied it first: the same bytes, by their hash.
                if not executable.is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    version = subprocess.run([str(executable), "--version"], capture_output=True, text=True,
                             check=False).stdout.strip()
    major = version.lstrip("v").split(".")[0]
    if not major.isdigit() or int(major) < 20:
        raise SandboxError(f"the host's node is {version or 'unknown'}; a JavaScript agent CLI "
                           "needs node >= 20", who="agents")
    return str(executable)
