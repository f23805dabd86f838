"""The pure model of the sandbox's layers: which layer stops which action.

Guarantee: ``predict`` is a pure function of an action, a configuration (a set
of layers), a backend and what the host already refuses, and it is monotone in
the layers: a configuration stops an action exactly when one of its layers
does (or the host refuses it), so adding layers never lets more through. Each
layer is a predicate over what an action touches (``Reach``), never its name,
as its backend's mechanism provides it. Pure: stdlib only, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from itertools import combinations


class AuditedLayer(StrEnum):
    """A layer of the stack, named for its guarantee (the order is the stack's, bottom up)."""

    FILESYSTEM = "filesystem"
    NAMESPACES = "namespaces"
    SECCOMP = "seccomp"
    LANDLOCK = "landlock"
    NETWORK = "network"
    METHOD_RULES = "method_rules"
    CREDENTIAL_MASKING = "credential_masking"


AUDITED_GUARANTEES: Mapping[AuditedLayer, str] = {
    AuditedLayer.FILESYSTEM: "only the workspace, the toolchain and the system directories are "
                      "visible, the system read-only",
    AuditedLayer.NAMESPACES: "the session sees only its own processes, holds no capabilities, and "
                      "ends with everything it started",
    AuditedLayer.SECCOMP: "kernel interfaces a sandbox has no use for are refused",
    AuditedLayer.LANDLOCK: "writes land only beneath the workspace and the session's own directories; "
                    "no signal or abstract socket crosses out of the session",
    AuditedLayer.NETWORK: "the only way out is the egress proxy, which allows only the allow-list",
    AuditedLayer.METHOD_RULES: "each decrypted request names its tunnel's host (SNI, Host and CONNECT "
                        "agree), and allowed hosts are read-only (GET, HEAD) unless a rule "
                        "opens a method (proxy --inspect-tls)",
    AuditedLayer.CREDENTIAL_MASKING: "the session holds a placeholder; the proxy swaps in the real "
                              "value only on requests to the credential's own host",
}


# The facts are deliberately coarse: they say what an action touches, in the
# terms a layer decides on (a path outside the sandbox's view, a destination
# the allow-list does not name, a write to an allowed host), so a new action is
# predicted from what it does.
class Reach(StrEnum):
    """One thing an action touches, in the terms a layer decides on.

    An action touches every one of its reaches, so a layer that refuses any
    one of them stops the action.
    """

    WORKSPACE_WRITE = "workspace_write"
    # A workspace entry tools would run or trust (.git, .bashrc, .vscode, ...):
    # held read-only in a workspace that is not firstrun's own.
    PROTECTED_WRITE = "protected_write"
    # More bytes in the workspace than its disk bound (a filesystem of its own size).
    PAST_DISK_BOUND = "past_disk_bound"
    TOOLCHAIN_EXEC = "toolchain_exec"
    READ_FROM_ALLOWED_HOST = "read_from_allowed_host"
    HOST_FILE_READ = "host_file_read"
    SYSTEM_FILE_WRITE = "system_file_write"
    HOST_PROCESS = "host_process"
    OUTLIVE_SESSION = "outlive_session"
    NEW_NAMESPACE = "new_namespace"
    MOUNT = "mount"
    KERNEL_SURFACE = "kernel_surface"
    TRACE_PROCESS = "trace_process"
    PROC_SELF_WRITE = "proc_self_write"
    # Lowering its own OOM score: the kernel allows it below the process's
    # floor (the value its parent started it at, or a privileged process
    # set) only with CAP_SYS_RESOURCE.
    OOM_SCORE_DOWN = "oom_score_down"
    HOST_ABSTRACT_SOCKET = "host_abstract_socket"
    UNLISTED_DESTINATION = "unlisted_destination"
    # A host the allow-list does not name, named only by the Host of a request
    # inside a tunnel whose CONNECT and SNI name an allowed one (domain
    # fronting): the network layer decides on those two, so it lets it by.
    FRONTED_DESTINATION = "fronted_destination"
    WRITE_TO_ALLOWED_HOST = "write_to_allowed_host"
    CREDENTIAL_ELSEWHERE = "credential_elsewhere"


# What each layer refuses. A layer is the predicate "the action touches one of these".
_STOPS: Mapping[AuditedLayer, frozenset[Reach]] = {
    # The mount namespace's view: what is not bound does not exist, and the
    # system directories are bound read-only.
    AuditedLayer.FILESYSTEM: frozenset({Reach.HOST_FILE_READ, Reach.SYSTEM_FILE_WRITE,
                                        Reach.PROTECTED_WRITE}),
    # pid namespace (host processes invisible), no capabilities (no mount),
    # nested user namespaces disabled, and a session that kills all it started.
    AuditedLayer.NAMESPACES: frozenset({Reach.HOST_PROCESS, Reach.OUTLIVE_SESSION,
                                 Reach.NEW_NAMESPACE, Reach.MOUNT}),
    AuditedLayer.SECCOMP: frozenset({Reach.NEW_NAMESPACE, Reach.MOUNT, Reach.KERNEL_SURFACE,
                              Reach.TRACE_PROCESS}),
    # Write rights beneath the writable roots only (so no /proc/self writes),
    # and the ABI 6 scopes (abstract unix sockets, signals).
    AuditedLayer.LANDLOCK: frozenset({Reach.SYSTEM_FILE_WRITE, Reach.PROC_SELF_WRITE,
                               Reach.HOST_ABSTRACT_SOCKET}),
    # An empty network namespace (abstract sockets are per namespace) whose
    # only way out is the proxy, whose floor and allow-list refuse the rest,
    # by either route (a direct dial, or asking the proxy).
    AuditedLayer.NETWORK: frozenset({Reach.UNLISTED_DESTINATION, Reach.HOST_ABSTRACT_SOCKET}),
    # The proxy's judgement of each request it decrypted: first its Host must
    # be the tunnel's (so a rule is asked about the host the request really
    # names), then its method. One judgement, turned on by one flag, so one
    # layer: the proxy never applies either without the other.
    AuditedLayer.METHOD_RULES: frozenset({Reach.WRITE_TO_ALLOWED_HOST, Reach.FRONTED_DESTINATION}),
    AuditedLayer.CREDENTIAL_MASKING: frozenset({Reach.CREDENTIAL_ELSEWHERE}),
}

# The docker backend provides the same guarantees by other mechanisms, so a
# layer there stops what its own mechanism stops:
_DOCKER_STOPS: Mapping[AuditedLayer, frozenset[Reach]] = {
    **_STOPS,
    # The image's own root: no host file is there to read or write; the
    # protected entries are bound read-only over the workspace's.
    AuditedLayer.FILESYSTEM: frozenset({Reach.HOST_FILE_READ, Reach.SYSTEM_FILE_WRITE,
                                        Reach.PROTECTED_WRITE}),
    # The container: its own pid and network namespaces (so no host
    # process and no host abstract socket), no capabilities under Docker's
    # default seccomp (no namespace, no mount), removed with every process
    # at close, and an OOM score the kernel floors at the value runc set as
    # root (lowering it needs CAP_SYS_RESOURCE).
    AuditedLayer.NAMESPACES: frozenset({Reach.HOST_PROCESS, Reach.OUTLIVE_SESSION,
                                 Reach.NEW_NAMESPACE, Reach.MOUNT, Reach.OOM_SCORE_DOWN,
                                 Reach.HOST_ABSTRACT_SOCKET}),
    # firstrun's profile carries the linux rules: the same refusals.
    AuditedLayer.SECCOMP: _STOPS[AuditedLayer.SECCOMP],
    # Landlock's guarantee by a read-only root with tmpfs /tmp and HOME:
    # writes only; it neither scopes sockets nor guards /proc.
    AuditedLayer.LANDLOCK: frozenset({Reach.SYSTEM_FILE_WRITE}),
}

# The gvisor backend, as measured on runsc 20240729:
_GVISOR_STOPS: Mapping[AuditedLayer, frozenset[Reach]] = {
    **_DOCKER_STOPS,
    # The sandbox: a kernel of its own (the sentry), so the host kernel's
    # surface is out of reach and what the sentry lacks (io_uring) it
    # refuses; its own pid and network stacks; no capability to mount; the
    # sandbox ends with everything in it. It grants a new user namespace,
    # and in it a mount, and ptrace; and an OOM score is the sentry's own
    # bookkeeping, lowered at will (the host's OOM killer sees one sentry).
    AuditedLayer.NAMESPACES: frozenset({Reach.HOST_PROCESS, Reach.OUTLIVE_SESSION, Reach.MOUNT,
                                        Reach.KERNEL_SURFACE, Reach.HOST_ABSTRACT_SOCKET}),
}

# Each backend's mechanisms; linux is the reference, and a backend not named
# here is judged by it.
STOPS_BY_BACKEND: Mapping[str, Mapping[AuditedLayer, frozenset[Reach]]] = {
    "linux": _STOPS,
    "docker": _DOCKER_STOPS,
    "gvisor": _GVISOR_STOPS,
}

Predicate = Callable[["Action"], bool]


def layer_predicate(layer: AuditedLayer, backend: str = "linux") -> Predicate:
    """``layer`` as ``backend`` provides it, as a predicate: True when it stops the action."""
    stops = STOPS_BY_BACKEND.get(backend, _STOPS)[layer]
    return lambda action: bool(action.reaches & stops)


LAYER_PREDICATES: Mapping[AuditedLayer, Predicate] = {layer: layer_predicate(layer) for layer in AuditedLayer}
_PREDICATES: Mapping[str, Mapping[AuditedLayer, Predicate]] = {
    backend: {layer: layer_predicate(layer, backend) for layer in AuditedLayer}
    for backend in STOPS_BY_BACKEND
}


def _predicates(backend: str) -> Mapping[AuditedLayer, Predicate]:
    return _PREDICATES.get(backend, LAYER_PREDICATES)


class ActionResult(StrEnum):
    STOPPED = "stopped"
    THROUGH = "through"


@dataclass(frozen=True, kw_only=True)
class Action:
    """One thing a session might do: ``needed`` by a task or not, and what it touches."""

    id: str
    title: str
    needed: bool
    reaches: frozenset[Reach]


ACTIONS: tuple[Action, ...] = (
    Action(id="write_workspace", title="write a file in the workspace", needed=True,
           reaches=frozenset({Reach.WORKSPACE_WRITE})),
    Action(id="run_test", title="run the project's tests", needed=True,
           reaches=frozenset({Reach.TOOLCHAIN_EXEC, Reach.WORKSPACE_WRITE})),
    Action(id="install_package", title="install a package from the allowed registry",
           needed=True,
           reaches=frozenset({Reach.TOOLCHAIN_EXEC, Reach.READ_FROM_ALLOWED_HOST,
                              Reach.WORKSPACE_WRITE})),
    Action(id="read_home_secret", title="read a secret in the home directory", needed=False,
           reaches=frozenset({Reach.HOST_FILE_READ})),
    Action(id="write_system_file", title="write a system file (under /usr)", needed=False,
           reaches=frozenset({Reach.SYSTEM_FILE_WRITE})),
    Action(id="write_protected_entry", title="rewrite a protected workspace entry (.git/config)",
           needed=False, reaches=frozenset({Reach.PROTECTED_WRITE})),
    Action(id="leave_process", title="leave a process behind after the session closes",
           needed=False, reaches=frozenset({Reach.OUTLIVE_SESSION})),
    Action(id="read_host_environ", title="read another process's environment secrets",
           needed=False, reaches=frozenset({Reach.HOST_PROCESS})),
    Action(id="kill_host_process", title="kill a host process", needed=False,
           reaches=frozenset({Reach.HOST_PROCESS})),
    Action(id="create_user_namespace", title="create a user namespace", needed=False,
           reaches=frozenset({Reach.NEW_NAMESPACE})),
    Action(id="mount", title="mount a filesystem", needed=False,
           reaches=frozenset({Reach.MOUNT})),
    Action(id="io_uring", title="open an io_uring (kernel attack surface)", needed=False,
           reaches=frozenset({Reach.KERNEL_SURFACE})),
    Action(id="ptrace_sibling", title="ptrace another process of the session", needed=False,
           reaches=frozenset({Reach.TRACE_PROCESS})),
    Action(id="lower_oom_score", title="lower its OOM score below the supervisor's",
           needed=False, reaches=frozenset({Reach.PROC_SELF_WRITE, Reach.OOM_SCORE_DOWN})),
    Action(id="host_abstract_socket", title="connect to a host abstract unix socket",
           needed=False, reaches=frozenset({Reach.HOST_ABSTRACT_SOCKET})),
    Action(id="host_loopback", title="connect to the host's loopback (canary listener)",
           needed=False, reaches=frozenset({Reach.UNLISTED_DESTINATION})),
    Action(id="raw_ip", title="dial the allowed registry's raw IP, bypassing the proxy",
           needed=False, reaches=frozenset({Reach.UNLISTED_DESTINATION})),
    Action(id="resolve_name", title="resolve a name through a resolver of its choosing",
           needed=False, reaches=frozenset({Reach.UNLISTED_DESTINATION})),
    Action(id="cloud_metadata", title="reach the cloud metadata address", needed=False,
           reaches=frozenset({Reach.UNLISTED_DESTINATION})),
    Action(id="upload_registry", title="upload to the allowed registry", needed=False,
           reaches=frozenset({Reach.WRITE_TO_ALLOWED_HOST})),
    Action(id="credential_elsewhere",
           title="send a task's credential to an allowed host it does not belong to",
           needed=False, reaches=frozenset({Reach.CREDENTIAL_ELSEWHERE})),
    Action(id="domain_fronting",
           title="reach another tenant through an allowed host (domain fronting)",
           needed=False, reaches=frozenset({Reach.FRONTED_DESTINATION})),
    # Last: it leaves the workspace full.
    Action(id="fill_disk", title="write past the workspace's disk bound", needed=False,
           reaches=frozenset({Reach.PAST_DISK_BOUND})),
)

# Beneath every backend: a workspace of firstrun's own is a filesystem of its
# own size, wherever the harness can mount one (``sandbox.disk``).
DISK_BOUND: frozenset[Reach] = frozenset({Reach.PAST_DISK_BOUND})

ACTION_IDS: tuple[str, ...] = tuple(a.id for a in ACTIONS)


def action(action_id: str) -> Action:
    for candidate in ACTIONS:
        if candidate.id == action_id:
            return candidate
    raise KeyError(action_id)


def stoppers(act: Action, layers: Iterable[AuditedLayer], backend: str = "linux") -> tuple[AuditedLayer, ...]:
    """The layers of a configuration of ``backend`` that stop ``act``, in stack order."""
    present = frozenset(layers)
    predicates = _predicates(backend)
    return tuple(layer for layer in AuditedLayer if layer in present and predicates[layer](act))


def predict(act: Action, layers: Iterable[AuditedLayer], backend: str = "linux",
            host_refuses: frozenset[Reach] = frozenset()) -> ActionResult:
    """Stopped when any layer of the configuration stops it, or the harness's
    own process already cannot (``host_refuses``); through otherwise."""
    # Below every layer is the harness's own process. A backend without a
    # session of its own (``local``) runs commands with exactly the harness's
    # privileges, so what those refuse (for example an OOM score below the
    # process's floor, when the harness lacks CAP_SYS_RESOURCE) is stopped
    # there with no layer to thank; so is a write past the disk bound of the
    # workspace the harness made (``DISK_BOUND``). The audit measures those
    # facts of the host and passes them in; monotonicity holds for any fixed
    # ``host_refuses``. The prediction is checked against the real matrix
    # ``firstrun audit`` measures: where they disagree, one of them is wrong.
    if act.reaches & host_refuses or stoppers(act, layers, backend):
        return ActionResult.STOPPED
    return ActionResult.THROUGH


def closing_layers(act: Action, layers: Iterable[AuditedLayer], backend: str = "linux") -> tuple[AuditedLayer, ...]:
    """The layers missing from a configuration of ``backend`` that would each stop ``act``."""
    # Every layer is in the model whether or not a given backend can apply it,
    # because the residual a configuration leaves open is named by the layers
    # that would close it (``METHOD_RULES`` and ``CREDENTIAL_MASKING`` are the
    # proxy's ``--inspect-tls``). Domain fronting is such a residual: without
    # inspection the proxy cannot read the Host inside a tunnel to an allowed
    # host; with it, ``METHOD_RULES`` refuses a Host that is not the tunnel's.
    present = frozenset(layers)
    predicates = _predicates(backend)
    return tuple(layer for layer in AuditedLayer if layer not in present and predicates[layer](act))


def subsets(layers: Iterable[AuditedLayer]) -> tuple[frozenset[AuditedLayer], ...]:
    """Every subset of ``layers``, smallest first (the audit's configurations)."""
    pool = tuple(sorted(frozenset(layers), key=tuple(AuditedLayer).index))
    return tuple(frozenset(c) for n in range(len(pool) + 1) for c in combinations(pool, n))
