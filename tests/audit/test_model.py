"""The layer model's properties, over every subset of layers and over arbitrary actions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from firstrun.audit.model import (
    ACTIONS,
    DISK_BOUND,
    Action,
    ActionResult,
    AuditedLayer,
    Reach,
    action,
    closing_layers,
    predict,
    stoppers,
    subsets,
)

EVERY_CONFIGURATION = subsets(AuditedLayer)
FULL = frozenset(AuditedLayer)
# What the linux backend applies today: no method rules, no credential masking.
LINUX_FULL = frozenset({AuditedLayer.FILESYSTEM, AuditedLayer.NAMESPACES, AuditedLayer.SECCOMP, AuditedLayer.LANDLOCK,
                        AuditedLayer.NETWORK})


def test_every_subset_is_a_configuration_once() -> None:
    assert len(EVERY_CONFIGURATION) == 2 ** len(AuditedLayer)
    assert len(set(EVERY_CONFIGURATION)) == len(EVERY_CONFIGURATION)


def test_adding_a_layer_never_lets_more_through_over_every_subset() -> None:
    for config in EVERY_CONFIGURATION:
        for extra in AuditedLayer:
            bigger = config | {extra}
            for act in ACTIONS:
                if predict(act, config) is ActionResult.STOPPED:
                    assert predict(act, bigger) is ActionResult.STOPPED, (act.id, config, extra)
                # And what stopped it still stops it.
                assert set(stoppers(act, config)) <= set(stoppers(act, bigger))


actions = st.builds(
    Action, id=st.just("arbitrary"), title=st.just("arbitrary"), needed=st.booleans(),
    reaches=st.frozensets(st.sampled_from(list(Reach))),
)
configs = st.frozensets(st.sampled_from(list(AuditedLayer)))


@given(act=actions, config=configs, more=configs)
def test_monotone_for_any_action_the_battery_might_grow(act, config, more) -> None:
    if predict(act, config) is ActionResult.STOPPED:
        assert predict(act, config | more) is ActionResult.STOPPED


@given(act=actions, config=configs)
def test_closing_layers_are_exactly_the_missing_stoppers(act, config) -> None:
    closing = closing_layers(act, config)
    assert not set(closing) & config
    for layer in closing:
        assert predict(act, config | {layer}) is ActionResult.STOPPED
    assert predict(act, config | set(closing)) is (
        ActionResult.STOPPED if closing or stoppers(act, config) else ActionResult.THROUGH)


def test_needed_actions_are_never_stopped_by_the_full_stack() -> None:
    for act in ACTIONS:
        if act.needed:
            assert predict(act, FULL) is ActionResult.THROUGH, act.id


def test_the_full_model_stack_stops_every_unneeded_action() -> None:
    # Over a workspace of the harness's own, bounded as a run's is.
    for act in ACTIONS:
        if not act.needed:
            assert predict(act, FULL, host_refuses=DISK_BOUND) is ActionResult.STOPPED, act.id


def test_no_layer_is_dead_weight() -> None:
    for layer in AuditedLayer:
        assert any(predict(a, {layer}) is ActionResult.STOPPED for a in ACTIONS if not a.needed), layer


def test_no_layers_lets_everything_through() -> None:
    assert all(predict(a, frozenset()) is ActionResult.THROUGH for a in ACTIONS)


def test_what_the_harness_refuses_is_stopped_with_no_layer_and_stays_stopped() -> None:
    refused = frozenset({Reach.OOM_SCORE_DOWN})
    oom = action("lower_oom_score")
    assert predict(oom, frozenset(), "local", refused) is ActionResult.STOPPED
    assert stoppers(oom, frozenset(), "local") == ()
    for config in subsets(AuditedLayer):
        assert predict(oom, config, "linux", refused) is ActionResult.STOPPED
    untouched = [a for a in ACTIONS if not a.reaches & refused]
    assert all(predict(a, frozenset(), "local", refused) is ActionResult.THROUGH for a in untouched)


def test_the_linux_residual_is_the_write_the_credential_and_domain_fronting() -> None:
    open_ = {a.id: closing_layers(a, LINUX_FULL) for a in ACTIONS
             if not a.needed and predict(a, LINUX_FULL, host_refuses=DISK_BOUND)
             is ActionResult.THROUGH}
    assert open_ == {
        "upload_registry": (AuditedLayer.METHOD_RULES,),
        "credential_elsewhere": (AuditedLayer.CREDENTIAL_MASKING,),
        "domain_fronting": (AuditedLayer.METHOD_RULES,),
    }


INSPECTION = frozenset({AuditedLayer.METHOD_RULES, AuditedLayer.CREDENTIAL_MASKING})
DOCKER_FULL = frozenset({AuditedLayer.FILESYSTEM, AuditedLayer.NAMESPACES, AuditedLayer.SECCOMP, AuditedLayer.LANDLOCK,
                         AuditedLayer.NETWORK})

# Domain fronting by configuration: (backend, layers, predicted, stopped_by, closed_by).
FRONTING = [
    # The network layer decides on the CONNECT and the SNI, which name the
    # allowed host; the Host inside the tunnel is opaque to it.
    ("linux", frozenset({AuditedLayer.NETWORK}), ActionResult.THROUGH, (), (AuditedLayer.METHOD_RULES,)),
    ("linux", LINUX_FULL, ActionResult.THROUGH, (), (AuditedLayer.METHOD_RULES,)),
    ("linux", LINUX_FULL | INSPECTION, ActionResult.STOPPED, (AuditedLayer.METHOD_RULES,), ()),
    ("linux", frozenset({AuditedLayer.NETWORK}) | INSPECTION, ActionResult.STOPPED, (AuditedLayer.METHOD_RULES,), ()),
    # Masking a credential says nothing about where a request goes.
    ("linux", LINUX_FULL | {AuditedLayer.CREDENTIAL_MASKING}, ActionResult.THROUGH, (),
     (AuditedLayer.METHOD_RULES,)),
    ("docker", DOCKER_FULL, ActionResult.THROUGH, (), (AuditedLayer.METHOD_RULES,)),
    ("docker", DOCKER_FULL | INSPECTION, ActionResult.STOPPED, (AuditedLayer.METHOD_RULES,), ()),
    ("linux", frozenset(), ActionResult.THROUGH, (), (AuditedLayer.METHOD_RULES,)),
]


def test_domain_fronting_is_closed_only_by_the_inspecting_proxy() -> None:
    fronting = action("domain_fronting")
    assert not fronting.needed and fronting.reaches == {Reach.FRONTED_DESTINATION}
    for backend, layers, predicted, stopped_by, closed_by in FRONTING:
        got = (predict(fronting, layers, backend), stoppers(fronting, layers, backend),
               closing_layers(fronting, layers, backend))
        assert got == (predicted, stopped_by, closed_by), (backend, sorted(layers))


def test_a_fronted_destination_is_not_an_unlisted_one() -> None:
    # What the network layer stops is named by the CONNECT; a fronted host is
    # not, so neither reach implies the other.
    assert stoppers(action("host_loopback"), LINUX_FULL) == (AuditedLayer.NETWORK,)
    assert stoppers(action("domain_fronting"), {AuditedLayer.NETWORK}) == ()


def test_only_the_disk_bound_beneath_every_layer_stops_a_write_past_it() -> None:
    fill = action("fill_disk")
    assert not fill.needed and all(stoppers(fill, config) == () for config in EVERY_CONFIGURATION)
    assert predict(fill, FULL) is ActionResult.THROUGH
    assert predict(fill, frozenset(), "local", DISK_BOUND) is ActionResult.STOPPED


def test_the_filesystem_layer_holds_the_protected_entries_on_every_backend() -> None:
    protected = action("write_protected_entry")
    for backend in ("linux", "docker", "gvisor"):
        assert stoppers(protected, LINUX_FULL, backend) == (AuditedLayer.FILESYSTEM,), backend
    assert predict(protected, frozenset(), "local") is ActionResult.THROUGH


def test_action_ids_are_unique_snake_case() -> None:
    ids = [a.id for a in ACTIONS]
    assert len(ids) == len(set(ids))
    assert all(i.isidentifier() and i == i.lower() for i in ids)
