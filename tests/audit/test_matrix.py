"""The real matrix on linux (and the local baseline): the model agrees with every cell, by evidence."""

from __future__ import annotations

import os

import pytest

from firstrun.audit.battery import (
    FRONTED_HOST,
    SYSTEM_DIR,
    AuditResult,
    Residual,
    configurations,
    run_configuration,
)
from firstrun.audit.fixtures import Registry
from firstrun.audit.model import ACTIONS, ActionResult, AuditedLayer
from firstrun.cli.audit import exit_status, render_text
from support.audit import cell as _cell
from support.audit import configuration_result as _config

pytestmark = pytest.mark.escape


def test_every_linux_configuration_ran_every_action(audit: AuditResult) -> None:
    names = [r.configuration.name for r in audit.results]
    assert names == [c.name for c in configurations("linux")] + ["local: no layers"]
    assert len(set(names)) == 13
    for r in audit.results:
        assert [c.action for c in r.cells] == [a.id for a in ACTIONS]


def test_model_and_reality_agree_on_every_cell(audit: AuditResult) -> None:
    assert audit.disagreements == ()


def test_the_battery_can_see_a_hole(audit: AuditResult) -> None:
    # Without the network layer the host's loopback canary, the abstract
    # socket listener and the resolver canary each really saw the session.
    bare = "linux: without seccomp, landlock, network"
    for action in ("host_loopback", "host_abstract_socket", "resolve_name", "raw_ip"):
        cell = _cell(audit, bare, action)
        assert cell.observed is ActionResult.THROUGH and cell.seen == 1, (action, cell.evidence)
    # The same listeners saw nothing under the full stack.
    for action in ("host_loopback", "host_abstract_socket", "resolve_name", "raw_ip"):
        cell = _cell(audit, "linux: full stack", action)
        assert cell.observed is ActionResult.STOPPED and cell.seen == 0, (action, cell.evidence)


def test_landlock_alone_still_closes_the_host_abstract_socket(audit: AuditResult) -> None:
    # The ABI 6 scope, measured: no network layer, yet the listener saw nothing.
    cell = _cell(audit, "linux: without seccomp, network", "host_abstract_socket")
    assert cell.observed is ActionResult.STOPPED and cell.seen == 0
    assert cell.stopped_by == (AuditedLayer.LANDLOCK,)


def test_seccomp_and_landlock_each_close_what_only_they_close(audit: AuditResult) -> None:
    assert _cell(audit, "linux: without seccomp", "io_uring").observed is ActionResult.THROUGH
    assert _cell(audit, "linux: without seccomp", "ptrace_sibling").observed is ActionResult.THROUGH
    assert _cell(audit, "linux: without landlock", "lower_oom_score").observed is ActionResult.THROUGH
    full = "linux: full stack"
    for action in ("io_uring", "ptrace_sibling", "lower_oom_score"):
        assert _cell(audit, full, action).observed is ActionResult.STOPPED


def test_the_full_stack_breaks_nothing_needed_and_leaves_only_the_residual(
        audit: AuditResult) -> None:
    full = _config(audit, "linux: full stack")
    assert full.needed_broken == 0 and full.not_run == 0
    assert full.session["enforcement"] == "enforced"
    linux = [r for r in audit.residual if r.backend == "linux"]
    assert {(r.configuration, r.action, r.closed_by, r.available) for r in linux} == {
        ("linux: full stack", "upload_registry", (AuditedLayer.METHOD_RULES,), (AuditedLayer.METHOD_RULES,)),
        ("linux: full stack", "credential_elsewhere", (AuditedLayer.CREDENTIAL_MASKING,),
         (AuditedLayer.CREDENTIAL_MASKING,)),
        ("linux: full stack", "domain_fronting", (AuditedLayer.METHOD_RULES,), (AuditedLayer.METHOD_RULES,)),
    }
    # The upload, the real credential and the fronted Host really reached the registry.
    assert _cell(audit, "linux: full stack", "upload_registry").seen == 1
    assert _cell(audit, "linux: full stack", "credential_elsewhere").seen == 1
    assert _cell(audit, "linux: full stack", "domain_fronting").seen == 1
    assert _cell(audit, "linux: full stack", "cloud_metadata").observed is ActionResult.STOPPED


def test_inspection_closes_the_residual_and_still_installs(audit: AuditResult) -> None:
    inspected = _config(audit, "linux: full stack + --inspect-tls")
    assert inspected.unneeded_open == 0 and inspected.needed_broken == 0
    assert inspected.session["enforcement"] == "enforced"
    for action in ("upload_registry", "credential_elsewhere", "domain_fronting"):
        cell = _cell(audit, "linux: full stack + --inspect-tls", action)
        assert cell.observed is ActionResult.STOPPED and cell.seen == 0, cell.evidence
    assert _cell(audit, "linux: full stack + --inspect-tls",
                 "install_package").observed is ActionResult.THROUGH


def test_reduced_configurations_say_they_are_downgraded(audit: AuditResult) -> None:
    for r in audit.results:
        if r.configuration.backend == "linux" and r.configuration.omitted:
            assert r.session["enforcement"] == "downgraded"
            applied = {layer["name"]: layer["applied"] for layer in r.session["layers"]}
            assert not any(applied[layer.value] for layer in r.configuration.omitted)


def test_the_local_baseline_stops_only_what_the_harness_itself_cannot_do(
        audit: AuditResult) -> None:
    local = _config(audit, "local: no layers")
    assert local.session["enforcement"] == "unenforced"
    assert local.needed_broken == 0
    refused = local.configuration.host_refuses
    by_id = {a.id: a for a in ACTIONS}
    for c in local.cells:
        expected = ActionResult.STOPPED if by_id[c.action].reaches & refused else ActionResult.THROUGH
        assert c.observed in (expected, None), (c.action, c.evidence)
        assert c.stopped_by == ()
    assert _cell(audit, "local: no layers", "leave_process").seen == 1
    assert _cell(audit, "local: no layers", "cloud_metadata").observed is None


def _argv0s() -> list[bytes]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    found.append(f.read().split(b"\0", 1)[0])
            except OSError:
                continue
    return found


def test_the_audit_left_nothing_behind(audit: AuditResult) -> None:
    # The local baseline really left a process behind (seen above); the
    # audit ended it, and removed every file it planted.
    assert audit.results
    assert not [a for a in _argv0s() if a.startswith(b"firstrun-audit-linger-")]
    assert not [n for n in os.listdir(SYSTEM_DIR) if n.startswith("firstrun-audit-")]
    assert not [n for n in os.listdir(os.path.expanduser("~"))
                if n.startswith(".firstrun-audit-")]


def test_under_inspection_the_registry_sees_a_placeholder_and_no_upload() -> None:
    (config,) = [c for c in configurations("linux") if c.name == "linux: full stack + --inspect-tls"]
    with Registry() as registry:
        result = run_configuration(config, registry)
        seen = registry.seen()
    assert result.needed_broken == 0
    # The credential request arrived, carrying something that is not the real value.
    authorized = [v for s in seen for k, v in s.headers if k.lower() == "authorization"]
    assert len(authorized) == 1 and authorized[0].startswith("Bearer firstrun-")
    assert not [s for s in seen if s.method in ("POST", "PUT")]
    assert any(s.path.endswith(".whl") for s in seen)


def test_domain_fronting_is_a_residual_without_inspection_and_closed_with_it() -> None:
    # Its own two sessions (not the shared matrix), so -k fronting runs only these.
    full, inspected = "linux: full stack", "linux: full stack + --inspect-tls"
    by_name = {c.name: c for c in configurations("linux")}
    with Registry() as registry:
        audit = AuditResult(results=tuple(run_configuration(by_name[name], registry)
                                          for name in (full, inspected)))
        fronted = [s for s in registry.seen()
                   if any(k.lower() == "host" and v == FRONTED_HOST for k, v in s.headers)]
    # Without inspection the tunnel is opaque: the registry answered the
    # request that named the other tenant, and the model said it would.
    open_ = _cell(audit, full, "domain_fronting")
    assert (open_.predicted, open_.observed, open_.seen) == (ActionResult.THROUGH,) * 2 + (1,)
    assert "HTTP 404" in open_.evidence and "refused 0 as host_mismatch" in open_.evidence
    # With it the proxy refused the Host before a byte went upstream.
    closed = _cell(audit, inspected, "domain_fronting")
    assert (closed.predicted, closed.observed, closed.seen) == (ActionResult.STOPPED,) * 2 + (0,)
    assert closed.stopped_by == (AuditedLayer.METHOD_RULES,)
    assert "HTTP 403 host_mismatch" in closed.evidence
    assert "refused 1 as host_mismatch" in closed.evidence
    assert len(fronted) == 1
    # Reported as a residual of the full stack that the backend can close, not a failure.
    assert [r for r in audit.residual if r.action == "domain_fronting"] == [Residual(
        configuration=full, backend="linux", action="domain_fronting",
        closed_by=(AuditedLayer.METHOD_RULES,), available=(AuditedLayer.METHOD_RULES,))]
    assert audit.disagreements == () and exit_status(audit) == 0
    text = render_text(audit)
    assert "    domain_fronting: closed by method_rules (--inspect-tls" in text
    assert f"{inspected}: nothing open" in text
