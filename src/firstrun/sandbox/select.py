"""Choosing a backend by name, from one registry table.

Guarantee: ``auto`` picks the first backend, by ``auto_rank`` (docker, linux,
seatbelt), that this machine can enforce now for every image the sweep needs;
never ``local``, and gvisor or a micro-VM only when the project asks for a
kernel of its own. ``resolve_backend`` says why each better backend was passed
over; the choice is made once per sweep and re-checked, never remade, before
each run. An unknown name is a usage error, never a silent fallback.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from firstrun.errors import SandboxUnavailable, UsageError
from firstrun.sandbox.base import Backend, Capability, RecordCallback


@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """What a run asks of whichever backend it gets; each backend takes what applies to it.

    ``image`` is the container image (backends that run one). ``on_record``
    receives the egress records of a backend that brings its own proxy
    (``Entry.own_proxy``); the others' records come from the harness proxy.
    """

    allow_unenforced: bool = False
    image: str | None = None
    on_record: RecordCallback | None = None
    # (name, address): names a backend's own proxy resolves to harness
    # services on the host (an agent CLI's routes), never through a resolver.
    hosts: tuple[tuple[str, str], ...] = ()


# The constructors an Entry names are module functions, never lambdas, so an
# Entry pickles as it is (by reference) and a Ray node gets the sweep's entry
# itself rather than a name to look up again.
def _plain(cls: type, options: BackendOptions) -> Backend:
    backend: Backend = cls()
    return backend


def _docker(cls: type, options: BackendOptions) -> Backend:
    backend: Backend = cls(image=options.image, on_record=options.on_record,
                           sidecar_hosts=options.hosts)
    return backend


def _with_unenforced(cls: type, options: BackendOptions) -> Backend:
    backend: Backend = cls(allow_unenforced=options.allow_unenforced)
    return backend


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One backend. ``auto_rank``: lower is preferred; None: ``auto`` never picks it.

    ``own_proxy``: the backend runs the shell channel's egress proxy itself
    (docker's sidecar) and reports records to ``BackendOptions.on_record``;
    the harness proxy then serves only the docs channel. ``captures``: the
    backend captures transparently (every flow and DNS query reaches the
    proxy whatever the program honours), so the harness proxy listens for
    redirected flows and DNS too and names them in the endpoint.
    ``inspects_tls``: it can show the run's CA bundle in its sandbox (linux
    and gvisor bind ``ProxyEndpoint.trust_bundle``; docker's sidecar makes the CA).
    ``own_kernel``: it runs commands on a kernel of their own, and names the
    probe (``module:function``, returning a ``Capability``) that says whether
    it can here as ``isolation: vm`` asks, and ``kernel_rank`` its place
    among such backends when ``auto`` must find one. ``unenforced``: it enforces
    nothing, and runs only when that is allowed. ``serves_at`` names the
    function (``module:function``) giving the host address where its own proxy
    reaches harness services (an agent CLI's MCP server); None: loopback, where
    the harness's proxy does. ``no_agent_cli``: why an agent CLI cannot run on
    it; None: it can.
    """

    name: str
    cls: str
    auto_rank: int | None
    build: Callable[[type, BackendOptions], Backend] = field(default=_plain)
    own_proxy: bool = False
    captures: bool = False
    inspects_tls: bool = False
    own_kernel: str | None = None
    kernel_rank: int | None = None
    unenforced: bool = False
    serves_at: str | None = None
    no_agent_cli: str | None = None

    def load(self) -> type:
        module, _, attr = self.cls.partition(":")
        cls: type = getattr(importlib.import_module(module), attr)
        return cls

    def construct(self, options: BackendOptions) -> Backend:
        """This backend, constructed with what applies to it of ``options``, not probed."""
        return self.build(self.load(), options)

    def unavailable(self, options: BackendOptions,
                    images: Sequence[str | None] = (None,)) -> Capability | None:
        """The first thing that keeps this backend from running every image in ``images``
        now; None: usable. The sweep's probe, and the check before each of its runs."""
        for image in dict.fromkeys(images):
            for cap in self.construct(replace(options, image=image)).probe():
                if not cap.available:
                    return cap
        return None


# Adding a backend is one Entry here: its name, the class ("module:Class"), where ``auto``
# ranks it, and, if its constructor takes options, a ``build`` that picks them from
# BackendOptions. BACKENDS (the --backend choices) follows the table, and so do ``firstrun
# doctor`` and the conformance suite, which runs against every entry that probes available.
# Backends are imported only when selected or probed, so a machine without one backend's
# dependencies can still use the others.
REGISTRY: tuple[Entry, ...] = (
    Entry(name="docker", cls="firstrun.sandbox.docker.backend:DockerBackend", auto_rank=1,
          build=_docker, own_proxy=True, inspects_tls=True,
          serves_at="firstrun.sandbox.docker.backend:harness_address"),
    Entry(name="linux", cls="firstrun.sandbox.linux.backend:LinuxBackend", auto_rank=2,
          captures=True, inspects_tls=True),
    Entry(name="seatbelt", cls="firstrun.sandbox.seatbelt.backend:SeatbeltBackend", auto_rank=3,
          no_agent_cli="the pinned agent CLIs are Linux builds"),
    Entry(name="gvisor", cls="firstrun.sandbox.gvisor.backend:GvisorBackend", auto_rank=None,
          captures=True, inspects_tls=True, own_kernel="firstrun.sandbox.gvisor.probe:kernel",
          kernel_rank=2),
    Entry(name="microvm", cls="firstrun.sandbox.microvm.backend:MicrovmBackend", auto_rank=None,
          own_kernel="firstrun.sandbox.microvm.probe:kvm", kernel_rank=1,
          no_agent_cli="its guest sees the workspace, /tmp and its home alone, so the agent "
                       "CLI's install cannot be lent into it"),
    Entry(name="local", cls="firstrun.sandbox.local:LocalBackend", auto_rank=None,
          build=_with_unenforced, unenforced=True),
    Entry(name="fake", cls="firstrun.sandbox.fake:FakeBackend", auto_rank=None,
          build=_with_unenforced, unenforced=True),
)

BACKENDS: tuple[str, ...] = ("auto", *(e.name for e in REGISTRY))


def entry(name: str) -> Entry:
    for candidate in REGISTRY:
        if candidate.name == name:
            return candidate
    raise UsageError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


def service_address(chosen: Entry) -> str:
    """The host address where ``chosen``'s shell proxy reaches a harness service.

    Raises ``SandboxUnavailable`` when the backend cannot say (its probe's reason).
    """
    if chosen.serves_at is None:
        return "127.0.0.1"
    module, _, attr = chosen.serves_at.partition(":")
    address: str = getattr(importlib.import_module(module), attr)()
    return address


def agent_cli_backends() -> tuple[str, ...]:
    """The enforcing backends an agent CLI can run on, for messages that name them."""
    return tuple(e.name for e in REGISTRY if e.no_agent_cli is None and not e.unenforced)


def inspecting() -> tuple[str, ...]:
    """The backends that can inspect TLS, for messages that name them."""
    return tuple(e.name for e in REGISTRY if e.inspects_tls)


def _own_kernel_here(candidate: Entry) -> Capability:
    assert candidate.own_kernel is not None
    module, _, attr = candidate.own_kernel.partition(":")
    found: Capability = getattr(importlib.import_module(module), attr)()
    return found


def ranked(*, own_kernel: bool) -> tuple[Entry, ...]:
    """The backends ``auto`` considers, strongest first: by ``kernel_rank`` among those
    with a kernel of their own, else by ``auto_rank``."""
    if own_kernel:
        return tuple(sorted((e for e in REGISTRY if e.own_kernel),
                            key=lambda e: e.kernel_rank or 0))
    return tuple(sorted((e for e in REGISTRY if e.auto_rank is not None),
                        key=lambda e: e.auto_rank or 0))


def own_kernel_backend() -> str | None:
    """The backend that gives a kernel of its own here, by ``kernel_rank``; None: none can.

    The micro-VM with KVM is preferred (a hardware boundary); without KVM,
    gVisor's user-space kernel, since the micro-VM would be emulated.
    """
    return next((e.name for e in ranked(own_kernel=True) if _own_kernel_here(e).available), None)


def inspecting_backend(backend: str, *, inspect_tls: bool, flag: str,
                       why: str = "--inspect-tls") -> str:
    """The backend to resolve: under --inspect-tls (or what ``why`` names) one that
    cannot inspect is refused.

    ``auto`` stays ``auto``: it prefers docker, then linux, both inspecting;
    should it land on another, the run refuses itself (``run.sandbox.open_sandbox``).
    """
    if not inspect_tls or backend == "auto":
        return backend
    if not entry(backend).inspects_tls:
        raise UsageError(
            f"{flag} {backend}: {why} needs the {' or '.join(inspecting())} backend; "
            f"the {backend} backend cannot show the run's CA bundle in its sandbox"
        )
    return backend


def require_vm(backend: Entry | str, *, who: str) -> None:
    """Refuse a run that asked for ``isolation: vm`` on a backend that cannot give it one.

    A backend that shares the host's kernel is refused, naming one that can
    give a kernel of its own here; so is one whose own kernel cannot run
    here as asked (the micro-VM under emulation: the requirement names KVM,
    and a task that asks for a VM should not silently run a hundred times
    slower).
    """
    chosen = backend if isinstance(backend, Entry) else entry(backend)
    name = chosen.name
    if chosen.own_kernel is None:
        kernels = [e.name for e in REGISTRY if e.own_kernel]
        here = own_kernel_backend()
        raise SandboxUnavailable(
            f"{who} requires isolation: vm (a kernel of its own); the {name} backend "
            "shares the host's kernel", who=here or " or ".join(kernels),
            fix=f"run it with --backend {here}" if here is not None else
            f"run it with --backend {' or --backend '.join(kernels)} (neither can run here: "
            "firstrun doctor says why)")
    found = _own_kernel_here(chosen)
    if not found.available:
        raise SandboxUnavailable(f"{who} requires isolation: vm, which needs "
                                 f"{found.name.upper()}: {found.detail}", who=name, fix=found.fix)


def build_backend(name: str, options: BackendOptions) -> Backend:
    """The named backend (never ``auto``), constructed but not probed."""
    return entry(name).construct(options)


def probe_backend(name: str, options: BackendOptions) -> tuple[Capability, ...]:
    """What ``name`` needs on this machine, each found available or not, with fixes."""
    return build_backend(name, options).probe()


def unavailable(name: str, options: BackendOptions,
                images: Sequence[str | None] = (None,)) -> Capability | None:
    """The first thing that keeps ``name`` from running every image in ``images``; None: usable."""
    return entry(name).unavailable(options, images)


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """The concrete backend for a sweep, and why each preferred one was passed over."""

    requested: str
    backend: str
    passed_over: tuple[str, ...] = ()

    @property
    def chosen(self) -> Entry:
        """The backend's entry, which the sweep's runs carry (``RunConfig.chosen``)."""
        return entry(self.backend)

    def explain(self) -> str:
        if self.requested != "auto":
            return f"backend {self.backend} (asked for by name)"
        why = "; ".join(self.passed_over)
        return f"backend {self.backend} (auto" + (f"; not {why})" if why else ")")

    def to_data(self) -> dict[str, object]:
        return {"requested": self.requested, "backend": self.backend,
                "passed_over": list(self.passed_over)}


def resolve_backend(name: str, options: BackendOptions,
                    images: Sequence[str | None] = (None,), *,
                    own_kernel: bool = False) -> Resolution:
    """``auto`` made concrete for a sweep whose tasks use ``images``; a named backend as is.

    ``own_kernel``: the project requires a kernel of its own, so ``auto``
    picks among the backends that give one (``own_kernel_backend``), which
    it otherwise never does. Raises ``SandboxUnavailable`` when ``auto``
    finds nothing enforcing, with every candidate's reason and fix.
    """
    if name != "auto":
        entry(name)
        return Resolution(requested=name, backend=name)
    if own_kernel:
        chosen = own_kernel_backend()
        if chosen is None:
            kernels = [e.name for e in REGISTRY if e.own_kernel]
            raise SandboxUnavailable(
                "isolation: vm needs a kernel of its own, and neither "
                f"{' nor '.join(kernels)} can give one here", who="select",
                fix="; ".join(c.fix for e in REGISTRY if e.own_kernel
                              for c in (_own_kernel_here(e),) if c.fix) or None)
        shared = ", ".join(e.name for e in REGISTRY if e.auto_rank is not None and not e.own_kernel)
        return Resolution(requested=name, backend=chosen, passed_over=(
            f"{shared}: they share the host's kernel, and isolation: vm asks for one of its own",))
    passed: list[str] = []
    fixes: list[str] = []
    for candidate in ranked(own_kernel=False):
        try:
            missing = unavailable(candidate.name, options, images)
        except ImportError as exc:
            passed.append(f"{candidate.name}: cannot be loaded here ({exc})")
            continue
        if missing is None:
            return Resolution(requested=name, backend=candidate.name, passed_over=tuple(passed))
        passed.append(f"{candidate.name}: {missing.name}: {missing.detail}"
                      + (f" (fix: {missing.fix})" if missing.fix else ""))
        if missing.fix:
            fixes.append(missing.fix)
    raise SandboxUnavailable("no enforcing backend is available: " + "; ".join(passed),
                             who="select", fix="; ".join(fixes) or None)


def select_backend(name: str, *, allow_unenforced: bool,
                   options: BackendOptions | None = None) -> Backend:
    """The backend to start sessions with; ``auto`` resolves here (a sweep resolves it once first)."""
    options = replace(options or BackendOptions(), allow_unenforced=allow_unenforced)
    if name == "auto":
        name = resolve_backend(name, options, (options.image,)).backend
    backend = build_backend(name, options)
    if entry(name).unenforced and not allow_unenforced:
        (cap,) = backend.probe()
        raise SandboxUnavailable(f"the {name} backend enforces nothing; refused",
                                 who=name, fix=cap.fix)
    return backend


def sweep_backend(backend: str, allow_unenforced: bool, images: Sequence[str | None], *,
                  needs_kernel: bool = False,
                  required_by: str | None = None) -> Resolution | str:
    """The sweep's one concrete backend here, or why every run would be refused, said once.

    A backend that cannot enforce (``local`` without --allow-unenforced, a
    machine without bubblewrap, docker without the image) would refuse each
    run alike; recording that as one infra_error per run would only bury the
    one line that matters. So would ``isolation: vm`` (``needs_kernel``, set
    by ``required_by``) on a backend that cannot give it. ``auto`` is
    resolved here, once, for the images the tasks use. A Ray sweep asks the
    same of every node (``run.ray_engine.plan``).
    """
    options = BackendOptions(allow_unenforced=allow_unenforced)
    try:
        resolution = resolve_backend(backend, options, images or [None], own_kernel=needs_kernel)
        select_backend(resolution.backend, allow_unenforced=allow_unenforced)
        if backend != "auto":
            missing = unavailable(backend, options, images or [None])
            if missing is not None:
                raise SandboxUnavailable(missing.detail, who=backend, fix=missing.fix)
        if needs_kernel:
            require_vm(resolution.backend, who=required_by or "isolation: vm")
    except SandboxUnavailable as exc:
        fix = f"; fix: {exc.fix}" if exc.fix else ""
        return f"firstrun: refused ({exc.who}): {' '.join(exc.args[0].split())}{fix}"
    return resolution
