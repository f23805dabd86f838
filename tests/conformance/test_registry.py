"""The backend registry, auto's order and the layer check (pure)."""

from __future__ import annotations

import pytest

from firstrun.errors import SandboxUnavailable, UsageError
from firstrun.policy.profile import ALL_LAYERS, LayerName, unprovided
from firstrun.sandbox.docker.backend import PROVIDES as DOCKER_PROVIDES
from firstrun.sandbox.select import (
    BACKENDS,
    REGISTRY,
    BackendOptions,
    Resolution,
    agent_cli_backends,
    build_backend,
    entry,
    resolve_backend,
    select_backend,
    service_address,
)
from support.profiles import make_profile


def test_backends_are_the_registry_plus_auto_and_auto_never_picks_unenforced() -> None:
    assert BACKENDS == ("auto", *(e.name for e in REGISTRY))
    ranked = [e.name for e in sorted((e for e in REGISTRY if e.auto_rank is not None),
                                     key=lambda e: e.auto_rank or 0)]
    assert ranked[:2] == ["docker", "linux"]
    assert entry("local").auto_rank is None
    assert entry("docker").own_proxy and not entry("linux").own_proxy
    with pytest.raises(UsageError):
        entry("podman")
    with pytest.raises(UsageError):
        resolve_backend("podman", BackendOptions())


def test_each_entry_builds_its_backend_with_the_options_it_takes() -> None:
    seen: list[dict[str, object]] = []
    docker = build_backend("docker", BackendOptions(image="firstrun/node:24",
                                                    on_record=seen.append))
    assert docker.name == "docker"
    assert build_backend("linux", BackendOptions()).name == "linux"
    local = build_backend("local", BackendOptions(allow_unenforced=True))
    assert [c.available for c in local.probe()] == [True]
    with pytest.raises(SandboxUnavailable):
        select_backend("local", allow_unenforced=False)


def test_a_named_backend_resolves_to_itself_and_says_so() -> None:
    resolution = resolve_backend("linux", BackendOptions())
    assert resolution == Resolution(requested="linux", backend="linux")
    assert resolution.explain() == "backend linux (asked for by name)"
    assert resolution.to_data() == {"requested": "linux", "backend": "linux", "passed_over": []}


def test_docker_provides_every_layer_so_a_full_profile_is_enforced(workspace: str) -> None:
    assert set(DOCKER_PROVIDES) == ALL_LAYERS
    assert unprovided(make_profile(workspace), DOCKER_PROVIDES) == ()
    # A backend that lacks Landlock's guarantee is refused it, unless downgraded.
    without = {k: v for k, v in DOCKER_PROVIDES.items() if k is not LayerName.LANDLOCK}
    assert unprovided(make_profile(workspace), without) == (LayerName.LANDLOCK,)
    downgraded = make_profile(workspace, downgrades=frozenset({LayerName.LANDLOCK}))
    assert unprovided(downgraded, without) == ()


def test_the_policy_hash_says_what_was_required_not_which_backend(workspace: str) -> None:
    full = make_profile(workspace)
    assert full.policy_hash() == make_profile(workspace).policy_hash()
    downgraded = make_profile(workspace, downgrades=frozenset({LayerName.LANDLOCK}))
    assert full.policy_hash() != downgraded.policy_hash()
    assert full.enforced == ALL_LAYERS


def test_what_a_run_may_ask_of_a_backend_is_read_from_its_entry(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A backend added to the registry gets inspection, isolation: vm and the local
    refusal from its entry alone: nothing in run/ or cli/ names it."""
    from firstrun.sandbox import select
    from firstrun.sandbox.select import inspecting_backend

    assert select.inspecting() == ("docker", "linux", "gvisor")
    fresh = select.Entry(name="fresh", cls="firstrun.sandbox.local:LocalBackend", auto_rank=None,
                         build=lambda cls, o: cls(allow_unenforced=o.allow_unenforced),
                         inspects_tls=True, own_kernel="firstrun.sandbox.microvm.probe:kvm",
                         unenforced=True)
    monkeypatch.setattr(select, "REGISTRY", (*select.REGISTRY, fresh))
    assert inspecting_backend("fresh", inspect_tls=True, flag="--backend") == "fresh"
    with pytest.raises(UsageError, match="needs the docker or linux or gvisor or fresh backend"):
        inspecting_backend("seatbelt", inspect_tls=True, flag="--backend")
    with pytest.raises(SandboxUnavailable, match="the fresh backend enforces nothing"):
        select.select_backend("fresh", allow_unenforced=False)
    with pytest.raises(SandboxUnavailable, match="the linux backend shares the host's kernel") as shared:
        select.require_vm("linux", who="task t")
    here = select.own_kernel_backend()
    assert shared.value.fix == (f"run it with --backend {here}" if here else
                                "run it with --backend gvisor or --backend microvm (neither can "
                                "run here: firstrun doctor says why)")
    from firstrun.sandbox.microvm.probe import kvm
    if kvm().available:
        select.require_vm("fresh", who="task t")
    else:
        with pytest.raises(SandboxUnavailable, match="requires isolation: vm, which needs KVM"):
            select.require_vm("fresh", who="task t")


def test_an_own_proxy_says_where_it_reaches_the_harness_and_the_routes_reach_it() -> None:
    # The harness's proxy dials harness services on loopback; a backend's own proxy
    # must name the host address it reaches instead, and be told the routed names.
    assert service_address(entry("linux")) == "127.0.0.1"
    assert all(e.serves_at is not None for e in REGISTRY
               if e.own_proxy and e.no_agent_cli is None)
    docker = build_backend("docker", BackendOptions(hosts=(("harness.firstrun.internal",
                                                            "172.17.0.1"),)))
    assert docker._sidecar_hosts == (("harness.firstrun.internal", "172.17.0.1"),)
    assert set(agent_cli_backends()) == {"docker", "linux", "gvisor"}
