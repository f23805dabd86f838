"""The local backend: commands run directly on the host, with no boundary at all.

Guarantee: it is never chosen by accident. ``LocalBackend`` refuses to start
unless constructed with ``allow_unenforced=True`` (``--allow-unenforced``), and
every session says so: UNENFORCED, every layer not applied, no attestation. It
keeps the contract's hygiene (an environment built from scratch, a fresh HOME,
capped output, process groups killed on timeout, ``kill_all`` and ``close``),
but a command that leaves its process group can outlive the session.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.policy.process import build_environment
from firstrun.policy.profile import LayerName, SandboxProfile
from firstrun.sandbox.base import (
    Capability,
    Enforcement,
    ExecResult,
    LayerStatus,
    OutputCallback,
    ProxyEndpoint,
    SessionInfo,
    Stream,
    prepare_command,
)
from firstrun.sandbox.output import collect_streams

_REFUSAL_FIX = "pass --allow-unenforced to run without a sandbox, and accept that it is recorded"


# A command that leaves its process group (setsid) can outlive the session here and race the
# success check; only an enforcing backend can promise otherwise.
class LocalSession:
    """Commands on the host in the workspace. ``proxy_url`` goes into the proxy variables
    (``local`` passes none); ``on_close`` runs once, after every process group is killed."""

    def __init__(self, profile: SandboxProfile, info: SessionInfo, *, proxy_url: str | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        self.info = info
        self._profile = profile
        self._home = tempfile.mkdtemp(prefix="firstrun-home-")
        self._env = build_environment(os.environ, path=os.environ.get("PATH", "").split(":"),
                                      home=self._home, tmpdir=tempfile.gettempdir(),
                                      proxy_url=proxy_url)
        self._on_close = on_close
        self._groups: set[int] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._cleaned = False

    def __enter__(self) -> LocalSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def exec(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        cmd = prepare_command(command, cwd=cwd, timeout=timeout, env=env, session_env=self._env,
                              workspace=self._profile.fs.workspace,
                              default_timeout=self._profile.limits.command_timeout_s, who="local")
        with self._lock:
            if self._closed:
                raise SandboxError("session is closed", who="local")
        started = time.monotonic()
        try:
            proc = subprocess.Popen(cmd.argv, cwd=cmd.cwd, env=cmd.env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    close_fds=True, start_new_session=True)
        except OSError as exc:
            raise SandboxError(f"cannot start {cmd.argv[0]!r}: {exc}", who="local") from exc
        self._groups.add(proc.pid)
        outputs, timed_out = collect_streams(proc, started + cmd.timeout,
                                             self._profile.limits.output_bytes, on_output)
        if timed_out:
            _killpg(proc.pid)
        code = proc.wait()
        with self._lock:
            if self._closed:
                raise SandboxError("the session was interrupted during a command", who="local")
        return ExecResult(exit_code=128 - code if code < 0 else code,
                          stdout=outputs[Stream.STDOUT].result(),
                          stderr=outputs[Stream.STDERR].result(),
                          duration_s=time.monotonic() - started, timed_out=timed_out)

    def kill_all(self) -> int:
        killed: set[int] = set()
        while members := _group_members(self._groups):
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        for pgid in list(self._groups):
            _killpg(pgid)
        return len(killed)

    def interrupt(self) -> None:
        with self._lock:
            self._closed = True
        for pgid in list(self._groups):
            _killpg(pgid)

    def close(self) -> None:
        with self._lock:
            if self._cleaned:
                return
            self._closed = self._cleaned = True
        for pgid in list(self._groups):
            _killpg(pgid)
        shutil.rmtree(self._home, ignore_errors=True)
        if self._on_close is not None:
            self._on_close()


def _group_members(groups: set[int]) -> list[int]:
    """Live pids (zombies aside) in any of ``groups``, from /proc; none where there is no /proc."""
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in (b"Z", b"X") and int(fields[2]) in groups:
            found.append(int(name))
    return found


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class LocalBackend:
    name = "local"
    # What its probe says it is, and how to allow it (``fake`` says its own).
    detail = "commands run directly on the host, with no boundary"
    refusal_fix = _REFUSAL_FIX

    def __init__(self, *, allow_unenforced: bool = False) -> None:
        self._allowed = allow_unenforced

    def probe(self) -> tuple[Capability, ...]:
        return (Capability(name="unenforced", available=self._allowed, detail=self.detail,
                           fix=None if self._allowed else self.refusal_fix),)

    def refuse_unless_allowed(self) -> None:
        if not self._allowed:
            raise SandboxUnavailable(f"the {self.name} backend enforces nothing and was not "
                                     "allowed", who=self.name, fix=self.refusal_fix)

    def start(self, profile: SandboxProfile, *, proxy: ProxyEndpoint | None) -> LocalSession:
        self.refuse_unless_allowed()
        layers = tuple(
            LayerStatus(name=layer, applied=False, mechanism="none",
                        detail="unenforced: the local backend applies no boundary")
            for layer in LayerName
        )
        info = SessionInfo(backend=self.name, enforcement=Enforcement.UNENFORCED,
                           policy_hash=profile.policy_hash(), layers=layers,
                           downgrades=tuple(sorted(profile.required)))
        return LocalSession(profile, info)
