"""The one session shape of the backends whose sandbox is a process the harness launched.

Guarantee: a ``LaunchedSession`` (bubblewrap, runsc, docker's attach client,
QEMU) owns that process and the stack of everything its start acquired.
``interrupt`` kills the process at once; ``close`` waits ``close_grace_s`` for
it to exit, kills what is left, then unwinds the stack, whatever went before.
A supervisor that never says ready, or says it failed, is a ``SandboxError``
carrying the end of what the sandbox wrote. ``take_workspace`` leaves the
workspace as it found it: placeholders removed, lent entries given back.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import IO

from firstrun.errors import SandboxError
from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox import protect
from firstrun.sandbox.base import SessionInfo
from firstrun.sandbox.channel import JsonLines, SupervisedSession, kill_and_wait, wait_for_exit
from firstrun.sandbox.ownership import give_back, lend

# How long a supervisor has to say it is ready; a backend that boots more
# (a container with its sidecar, an emulated VM) sets its own.
READY_TIMEOUT_S = 30.0
# How much of what the sandbox wrote an error carries.
TAIL_BYTES = 2000


def tail_of(output: IO[bytes], limit: int | None = TAIL_BYTES) -> str:
    """The last ``limit`` bytes (None: all) of ``output``, a file the sandbox's process
    writes, as text."""
    try:
        output.seek(0)
        data = output.read()
        return data[-limit if limit is not None else 0:].decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return ""


def take_workspace(acquired: ExitStack, fs: FilesystemPolicy, *, lent: int | None,
                   owner: tuple[int, int], who: str, stage_dir: str | None = None) -> None:
    """Place the protected entries' placeholders and, when ``lent`` is a uid, lend it the
    workspace (``ownership.lend``; ``stage_dir`` as there); each undone on ``acquired``.

    Registered before the sandbox is launched, so they are undone after it is
    gone: nothing of the sandbox is left to write the workspace given back.
    """
    placeholders = protect.place(fs, who=who)
    acquired.callback(protect.remove, fs.workspace, placeholders)
    if lent is not None:
        # Undone whether or not the lend finished: give_back changes only
        # what the uid owns.
        acquired.callback(give_back, fs.workspace, lent, owner)
        lend(fs.workspace, lent, who=who, stage_dir=stage_dir)


def read_ready(channel: JsonLines, *, within_s: float, tail: Callable[[], str], sandbox: str,
               who: str, refused: Callable[[dict], SandboxError] | None = None) -> dict:
    """The supervisor's ready line, once it says ``ok``; else the error that says why not.

    ``sandbox`` names what did not start in the error, with ``tail`` (its
    own last words); ``refused`` makes the error for a supervisor that
    answered but failed (by default: the supervisor's own error).
    """
    try:
        ready = channel.recv(time.monotonic() + within_s)
    except (OSError, ValueError) as exc:
        raise SandboxError(f"{sandbox} did not start: {exc}: {tail()}", who=who) from exc
    if ready is None:
        raise SandboxError(f"{sandbox} did not start: {tail()}", who=who)
    if not ready.get("ok"):
        if refused is not None:
            raise refused(ready)
        raise SandboxError(f"{channel.peer} failed: {ready.get('error')}", who=who)
    return ready


class LaunchedSession(SupervisedSession):
    """A supervised session whose sandbox lives and dies with one launched process.

    A subclass names ``who`` and ``sandbox`` (what the sandbox is called in
    errors), and extends ``_end`` where more than the process must go.
    """

    sandbox = "the sandbox"
    ready_timeout_s = READY_TIMEOUT_S

    def __init__(self, *, process: subprocess.Popen[bytes], channel: JsonLines,
                 env: dict[str, str], profile: SandboxProfile, info: SessionInfo,
                 output: IO[bytes], cleanup: ExitStack) -> None:
        super().__init__(channel=channel, env=env, profile=profile, info=info)
        self._process = process
        self._output = output
        # Everything the start acquired, each with its undo: the one cleanup path.
        self._cleanup = cleanup

    def tail(self) -> str:
        """The end of what the sandbox's process wrote, which says why it ended."""
        return tail_of(self._output)

    def await_ready(self, *, within_s: float | None = None) -> dict:
        """The supervisor's ready line (see ``read_ready``)."""
        return read_ready(self._channel,
                          within_s=self.ready_timeout_s if within_s is None else within_s,
                          tail=self.tail, sandbox=self.sandbox, who=self.who,
                          refused=self._refused)

    def _refused(self, ready: dict) -> SandboxError:
        return SandboxError(f"{self._channel.peer} failed: {ready.get('error')}", who=self.who)

    def _ended_detail(self) -> str:
        return f"{self.sandbox} ended during a command: {self.tail()}"

    def _end(self) -> None:
        kill_and_wait(self._process)

    def interrupt(self) -> None:
        # The process is the sandbox: its death ends every command in it at
        # once, and the exec blocked on the channel then reads EOF.
        if self._process.poll() is None:
            self._process.kill()

    def _teardown(self) -> None:
        # Woken by a pidfd where the kernel has them, so close waits no longer than the exit.
        wait_for_exit(self._process, self.close_grace_s)
        self._end()

    def _restore(self) -> None:
        try:
            self._cleanup.close()
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxError(f"restoring the host after the session: {exc}",
                               who=self.who) from exc
