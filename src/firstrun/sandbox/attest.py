"""Attestation: prove from inside a session that its boundary holds.

Guarantee: ``attest`` runs the probe (``attest_probe.py``) inside the session
as an ordinary command, with the same restrictions as untrusted code, and adds
evidence only the harness can see: a canary listener on the host's loopback
must have accepted nothing. It returns every check, passed or not;
``require_passed`` turns any failure into ``AttestationFailed``.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass

from firstrun.errors import AttestationFailed
from firstrun.sandbox import attest_probe
from firstrun.sandbox.base import Check, Session, Stream
from firstrun.sandbox.bytecode import python_argv

_PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True, kw_only=True)
class AttestPlan:
    """What to prove, in the sandbox's own terms (paths as seen inside).

    ``landlock`` says whether the kernel write filter must be proven too (a
    write DAC would allow, refused); it is False only for a recorded downgrade.

    ``network`` is what the sandbox's network must look like: ``loopback_only``
    (an empty namespace: only ``lo``, no route), ``captured`` (only ``lo``,
    and transparent capture in force: the DNS stub answers the attestation
    host with a synthetic address and refuses other names, and a plain
    connection to that address, made without the proxy variables, reaches
    this run's proxy, which answers with the nonce), ``firewalled_captured``
    (a container's namespace under capture: the same proof, the host's own
    address refused outright) or ``firewalled`` (a
    container's interface whose namespace firewall refuses every destination
    but the proxy: a direct dial and the embedded DNS server must both be
    refused). ``host_address`` is where the host is reachable from inside,
    if anywhere: the canary listens there. ``proxy_host`` is the proxy's
    address as seen inside. ``profile_filtered`` is the host's own network
    behind a per-process rule (macOS Seatbelt): no namespace to inspect, so
    the proof is that a direct dial and a datagram are refused by that rule.

    ``kernel`` picks the privilege checks the probe can make: ``linux``
    (capabilities, no_new_privs, seccomp) or ``darwin`` (not root, and
    Seatbelt applied to the probe's own process). ``write_witness`` is a
    directory the session's uid may write by its mode but no rule allows:
    a write refused there was refused by the sandbox, not by file modes.

    ``shared`` is a session that shares the host's network (an audit
    configuration without the network layer): nothing about the network is
    proven, nothing is dialled, and the checks say so. ``seccomp`` says
    whether the syscall filter must be proven; False only for a session
    whose profile leaves that layer out (the audit's, again).

    ``supervisor`` is how the process that runs every command is walled
    off from them: ``same_uid`` (the linux helper, which shares the
    commands' uid: it is not dumpable, so its descriptors, memory and
    environment are out of reach), ``foreign_uid`` (docker's helper and the
    micro-VM's agent run under a uid no command has: the same, and no
    command can signal it either) or ``none`` (one sandbox per command, as
    under Seatbelt: nothing to reach). ``self_mem_sealed``: a command cannot
    open its own ``/proc/self/mem`` for writing (Landlock refuses it), the
    write that patches a process's read-only pages.

    ``user_restricted`` is a VM's user-mode network with ``restrict=on``: one
    interface, one on-link subnet and no route beyond it, no DNS answer;
    ``host_alias`` is where the host's ``host_address`` appears inside
    (user-mode networking's alias for the host loopback), which the probe
    dials while the canary listens on ``host_address``.

    ``foreign_kernel`` is what the host's kernel answers (``attest_probe.
    host_kernel``), for a session that claims a kernel of its own: the probe
    must find a different version and release, and fail the probes only the
    host kernel answers.

    ``harness_python``: ``python`` is the harness's own interpreter, bound
    in, so the probe is handed as the harness's byte code
    (``bytecode.python_argv``) instead of source to compile.

    ``capture_loading``: the harness is still loading capture's routes when
    the probe starts (``captured`` on linux), IPv4's default route through
    ``lo`` last: the probe's checks of the network wait until it is there.
    """

    python: str
    workspace: str
    real_homes: tuple[str, ...]
    exposed: tuple[str, ...]
    proxy_port: int | None
    nonce: str | None
    landlock: bool
    network: str = "loopback_only"
    host_address: str = "127.0.0.1"
    proxy_host: str = "127.0.0.1"
    kernel: str = "linux"
    write_witness: str | None = None
    seccomp: bool = True
    host_alias: str | None = None
    supervisor: str = "same_uid"
    self_mem_sealed: bool = False
    protected: tuple[tuple[str, str], ...] = ()
    foreign_kernel: dict[str, object] | None = None
    harness_python: bool = False
    capture_loading: bool = False


# Backend-neutral: any backend whose sandbox has a Python can run it.
def attest(session: Session, plan: AttestPlan) -> tuple[Check, ...]:
    """Run every check; never raises for a failed check, only records it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as canary:
        canary.bind((plan.host_address, 0))
        canary.listen(16)
        canary.setblocking(False)
        data = {
            "canary_port": canary.getsockname()[1],
            "host_address": plan.host_alias or plan.host_address,
            "network": plan.network,
            "proxy_host": plan.proxy_host,
            "proxy_port": plan.proxy_port,
            "nonce": plan.nonce,
            "real_homes": list(plan.real_homes),
            "exposed": list(plan.exposed),
            "workspace": plan.workspace,
            "landlock": plan.landlock,
            "kernel": plan.kernel,
            "write_witness": plan.write_witness,
            "seccomp": plan.seccomp,
            "supervisor": plan.supervisor,
            "self_mem_sealed": plan.self_mem_sealed,
            "protected": [list(p) for p in plan.protected],
            "foreign_kernel": plan.foreign_kernel,
            "capture_loading": plan.capture_loading,
        }
        # Read whole through on_output: the session's output cap is the
        # task's, and a small one must not truncate the probe's report.
        stdout = bytearray()
        result = session.exec(
            [*python_argv(plan.python, attest_probe, compiled=plan.harness_python),
             json.dumps(data)],
            timeout=_PROBE_TIMEOUT_S,
            on_output=lambda stream, chunk: stdout.extend(chunk) if stream is Stream.STDOUT
            else None,
        )
        accepted = 0
        while True:
            try:
                conn, _ = canary.accept()
            except BlockingIOError:
                break
            conn.close()
            accepted += 1
    try:
        reported = json.loads(stdout.decode("utf-8", "replace"))
        checks = [Check(name=c["name"], passed=bool(c["passed"]), detail=str(c["detail"]))
                  for c in reported]
    except (ValueError, KeyError, TypeError):
        checks = [Check(name="probe_ran", passed=False,
                        detail=f"exit {result.exit_code}: {result.stderr.text()[-500:]}")]
    if plan.proxy_port is None:
        checks.append(Check(name="proxy_answers", passed=True,
                            detail="not applicable: the session has no proxy"))
    if plan.network == "shared":
        checks.append(Check(name="host_canary_saw_nothing", passed=True,
                            detail="not applicable: the session shares the host's network"))
    else:
        checks.append(Check(name="host_canary_saw_nothing", passed=accepted == 0,
                            detail=f"host canary on {plan.host_address} accepted "
                                   f"{accepted} connection(s)"))
    return tuple(checks)


def require_passed(checks: tuple[Check, ...]) -> None:
    failed = [c for c in checks if not c.passed]
    if failed:
        raise AttestationFailed(
            "; ".join(f"{c.name}: {c.detail}" for c in failed)
        )
