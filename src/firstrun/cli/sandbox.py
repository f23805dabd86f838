"""``firstrun sandbox``: one command, in a fresh attested session, behind the recording proxy.

Guarantee: the command runs only after the backend attested the session; its
only way out is an egress proxy under this policy (the harness's, or the
backend's own, such as docker's sidecar). However this returns, the session is
closed, nothing it started is left running, and the proxy is stopped. Exit:
the command's code, 124 for a timeout, 125 when the sandbox refused or failed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

from firstrun.cli.interrupt import signals_unwind
from firstrun.cli.render import summary_lines
from firstrun.errors import UsageError
from firstrun.policy.filesystem import is_under
from firstrun.policy.hosts import parse_patterns
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import DEFAULT_ALLOW, Mode, NetworkPolicy
from firstrun.policy.process import DEFAULT_DISK_MB, Limits
from firstrun.policy.profile import LayerName, SandboxProfile
from firstrun.sandbox.base import ExecResult, Stream
from firstrun.sandbox.disk import DiskBound, SizedWorkspace, open_sized_workspace, unbounded
from firstrun.sandbox.hostfs import check_workspace, host_filesystem_policy
from firstrun.sandbox.select import (
    BackendOptions,
    entry,
    inspecting_backend,
    resolve_backend,
    select_backend,
)
from firstrun.tasks.allowlist import allow_entries, allow_snippet

# The exit status keeps the command's own result apart from the harness's:
# the command's code, 124 for a timeout (as timeout(1) says it), 125 when the
# sandbox refused or failed (main's EXIT_SANDBOX).
EXIT_TIMEOUT = 124


@dataclass(frozen=True, kw_only=True)
class SandboxRequest:
    """Validated ``firstrun sandbox`` arguments."""

    command: tuple[str, ...]
    backend: str = "auto"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    workspace: str | None = None
    record: str | None = None
    allow_unenforced: bool = False
    downgrades: frozenset[LayerName] = frozenset()
    report_only: bool = False
    inspect_tls: bool = False
    timeout_s: float | None = None
    json: bool = False
    image: str | None = None
    allow_write: tuple[str, ...] = ()
    # None: the default bound for a workspace of firstrun's own, none for yours.
    max_disk_mb: int | None = None


def build_network_policy(request: SandboxRequest) -> NetworkPolicy:
    """Default registries plus ``--allow``; ``--deny`` wins. Errors name the flag."""
    allow = parse_patterns(DEFAULT_ALLOW, source="default allow-list") + parse_patterns(
        request.allow, source="--allow"
    )
    deny = parse_patterns(request.deny, source="--deny")
    mode = Mode.REPORT if request.report_only else Mode.ENFORCE
    policy = NetworkPolicy(allow=allow, deny=deny, mode=mode)
    # No task, so no method rules or credentials: every host is read-only.
    return policy.with_inspection(InspectionPolicy()) if request.inspect_tls else policy


def _check_paths(request: SandboxRequest) -> None:
    if request.workspace is not None and not os.path.isdir(request.workspace):
        raise UsageError(f"--workspace: {request.workspace!r} is not an existing directory")
    if request.workspace is not None:
        check_workspace(request.workspace, os.environ, label="--workspace")
        if request.max_disk_mb:
            raise UsageError(f"--max-disk: firstrun can only bound a workspace it makes itself, "
                             f"not {request.workspace!r}; drop --max-disk or --workspace")
    if request.record is not None:
        parent = os.path.dirname(os.path.abspath(request.record))
        if not os.path.isdir(parent):
            raise UsageError(f"--record: directory {parent!r} does not exist")
        if os.path.isdir(request.record):
            raise UsageError(f"--record: {request.record!r} is a directory")
        if request.workspace is not None:
            # The sandbox may rewrite anything in its workspace: an audit trail
            # kept there could be truncated, forged or swapped for a symlink.
            workspace = os.path.realpath(request.workspace)
            where = os.path.realpath(request.record)
            if is_under(where, workspace):
                raise UsageError(f"--record: {request.record!r} is inside the workspace, where "
                                 "the sandbox could rewrite it; write the record outside it")


class _LiveOutput:
    """Streams the command's output as it comes, and remembers where a line was left open."""

    def __init__(self, *, all_to_stderr: bool) -> None:
        self._all_to_stderr = all_to_stderr
        self._open_line_on_stderr = False

    def __call__(self, stream: Stream, data: bytes) -> None:
        if not data:
            return
        to_stderr = self._all_to_stderr or stream is Stream.STDERR
        out = sys.stderr if to_stderr else sys.stdout
        out.buffer.write(data)
        out.buffer.flush()
        self._open_line_on_stderr = not data.endswith(b"\n") and (to_stderr or _same_file(1, 2))

    def end_line(self) -> None:
        """So the summary starts on its own line even after ``printf foo``."""
        if self._open_line_on_stderr:
            sys.stderr.write("\n")


def _same_file(fd_a: int, fd_b: int) -> bool:
    try:
        return os.path.samestat(os.fstat(fd_a), os.fstat(fd_b))
    except OSError:
        return False


def _exit_code(result: ExecResult) -> int:
    if result.timed_out:
        return EXIT_TIMEOUT
    if result.exit_code < 0:
        # Killed by a signal: report it the way a shell does.
        return 128 - result.exit_code
    return result.exit_code & 0xFF


def _make_workspace(request: SandboxRequest,
                    stack: ExitStack) -> Callable[[], tuple[str, SizedWorkspace | DiskBound]]:
    """Start making the command's workspace; what it returns waits for it: (path, disk).

    A workspace of firstrun's own is a sized filesystem made by mkfs and
    mount, processes of their own: made in a thread, it is ready while this
    one imports and starts the proxy and the backend. Closed by ``stack``,
    made or half made.
    """
    if request.workspace is not None:
        mine = os.path.realpath(request.workspace), unbounded("a workspace of your own")
        return lambda: mine
    made: dict[str, SizedWorkspace | DiskBound | BaseException] = {}

    def make() -> None:
        try:
            made["disk"] = open_sized_workspace(
                DEFAULT_DISK_MB if request.max_disk_mb is None else request.max_disk_mb,
                asked=request.max_disk_mb is not None)
        except BaseException as exc:  # re-raised by wait, in the caller's thread
            made["error"] = exc

    thread = threading.Thread(target=make, name="firstrun-workspace", daemon=True)
    thread.start()

    def close() -> None:
        thread.join()
        if isinstance(made.get("disk"), SizedWorkspace):
            made["disk"].close()  # type: ignore[union-attr]

    stack.callback(close)

    def wait() -> tuple[str, SizedWorkspace | DiskBound]:
        thread.join()
        if "error" in made:
            raise made["error"]  # type: ignore[misc]
        disk = made["disk"]
        if isinstance(disk, SizedWorkspace):
            return disk.path, disk
        assert isinstance(disk, DiskBound)
        return stack.enter_context(tempfile.TemporaryDirectory(prefix="firstrun-ws-")), disk

    return wait


def run_sandbox(request: SandboxRequest) -> int:
    """Run the command; return the process exit status. Raises FirstrunError on refusal."""
    _check_paths(request)
    with ExitStack() as stack:
        stack.enter_context(signals_unwind())
        workspace_made = _make_workspace(request, stack)
        policy = build_network_policy(request)
        options = BackendOptions(allow_unenforced=request.allow_unenforced, image=request.image)
        name = inspecting_backend(request.backend, inspect_tls=request.inspect_tls,
                                  flag="--backend")
        chosen = entry(resolve_backend(name, options, (request.image,)).backend)
        select_backend(chosen.name, allow_unenforced=request.allow_unenforced)
        # Imported here, while the workspace is made: the proxy is most of
        # this command's imports.
        from firstrun.enclosure import ProxySetup, open_enclosure

        workspace, disk = workspace_made()
        limits = Limits() if request.timeout_s is None else Limits(command_timeout_s=request.timeout_s)
        profile = SandboxProfile(
            # A directory of the user's own is protected; a temporary one is ours.
            fs=host_filesystem_policy(workspace, os.environ, protect=request.workspace is not None,
                                      lift=request.allow_write),
            net=policy,
            limits=limits,
            downgrades=request.downgrades,
        )
        # A backend with its own proxy (docker's sidecar) gets the same policy, and
        # its records are reported (and written to --record) the same way.
        enclosure = stack.enter_context(open_enclosure(
            chosen, profile, ProxySetup(env=os.environ, record_path=request.record), options=options))
        session = enclosure.start()
        live = _LiveOutput(all_to_stderr=request.json)
        result = session.exec(list(request.command), timeout=request.timeout_s, on_output=live)
        if isinstance(disk, SizedWorkspace):
            disk = disk.bound()
    # Read after the session closed and the proxy stopped, so tunnels the
    # command left open are finished and recorded too.
    records = enclosure.records()
    info = session.info
    code = _exit_code(result)
    if request.json:
        document = {
            "session": info.to_data(),
            "command": list(request.command),
            "exit_code": code,
            "timed_out": result.timed_out,
            "duration_s": result.duration_s,
            "records": [r.to_data() for r in records],
            "disk": disk.to_data(),
        }
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        live.end_line()
        for line in summary_lines(info, records, report_only=request.report_only):
            print(line, file=sys.stderr)
        if disk.reached:
            print(f"firstrun: disk: the workspace reached its bound of {(disk.bound_bytes or 0) >> 20} "
                  "MiB; writes past it failed with ENOSPC (raise it with --max-disk)", file=sys.stderr)
        if request.report_only:
            learnt = allow_entries(r.to_data() for r in records)
            if learnt:
                print("firstrun: report mode: to allow what this command reached, add to a task:",
                      file=sys.stderr)
                sys.stderr.write(allow_snippet(learnt))
    return code

