"""The real matrix on gvisor: the model (gVisor's own mechanisms) agrees with every cell, by evidence.

The witnesses and the fixture registry listen on the host's loopback, which
only the harness's proxy reaches (the sandbox's loopback is the sentry's
own); nothing leaves this machine.
"""

from __future__ import annotations

import pytest

from firstrun.audit.battery import AuditResult, configurations, run_audit
from firstrun.audit.model import ACTIONS, ActionResult, AuditedLayer
from firstrun.sandbox.gvisor.backend import GvisorBackend
from support.audit import cell as _cell
from support.audit import configuration_result as _config

pytestmark = [pytest.mark.escape, pytest.mark.skipif(
    any(not c.available for c in GvisorBackend().probe()),
    reason="the gvisor backend is not available here (scripts/test installs runsc)")]

FULL = "gvisor: full stack"
NO_FILTER = "gvisor: without seccomp"
INSPECTED = "gvisor: full stack + --inspect-tls"


@pytest.fixture(scope="module")
def gvisor_audit() -> AuditResult:
    return run_audit(["gvisor"])


def test_every_gvisor_configuration_ran_every_action(gvisor_audit: AuditResult) -> None:
    assert gvisor_audit.skipped == ()
    names = [r.configuration.name for r in gvisor_audit.results]
    assert names == [c.name for c in configurations("gvisor")] == [NO_FILTER, FULL, INSPECTED]
    for r in gvisor_audit.results:
        assert [c.action for c in r.cells] == [a.id for a in ACTIONS]
        assert r.not_run == 0 and r.needed_broken == 0


def test_model_and_reality_agree_on_every_gvisor_cell(gvisor_audit: AuditResult) -> None:
    assert gvisor_audit.disagreements == ()


def test_the_filter_is_what_closes_namespaces_and_ptrace_in_the_sentry(
        gvisor_audit: AuditResult) -> None:
    # gVisor's own kernel grants both; the linux filter, loaded in it, refuses both.
    for action in ("create_user_namespace", "ptrace_sibling"):
        assert _cell(gvisor_audit, NO_FILTER, action).observed is ActionResult.THROUGH
        full = _cell(gvisor_audit, FULL, action)
        assert full.observed is ActionResult.STOPPED and "EPERM" in full.evidence, full
        assert full.stopped_by == (AuditedLayer.SECCOMP,)
    # What the sentry lacks it refuses by itself: the filter adds its own errno.
    assert _cell(gvisor_audit, NO_FILTER, "io_uring").evidence == "io_uring_setup: ENOSYS"
    assert _cell(gvisor_audit, FULL, "io_uring").evidence == "io_uring_setup: EPERM"


def test_each_session_records_the_seccomp_layer_it_ran_under(gvisor_audit: AuditResult) -> None:
    def seccomp(config: str) -> dict[str, object]:
        layers = _config(gvisor_audit, config).session["layers"]
        return next(l for l in layers if l["name"] == "seccomp")  # type: ignore[union-attr]
    full, omitted = seccomp(FULL), seccomp(NO_FILTER)
    assert full["applied"] and str(full["mechanism"]).startswith("seccomp-bpf in the sentry (")
    assert not omitted["applied"] and str(omitted["detail"]).startswith("omitted")
    assert _config(gvisor_audit, NO_FILTER).session["enforcement"] == "downgraded"
    assert _config(gvisor_audit, FULL).session["enforcement"] == "enforced"


def test_the_residual_is_the_proxys_and_the_sentrys_oom_score(gvisor_audit: AuditResult) -> None:
    # An OOM score inside is the sentry's bookkeeping: no layer the model
    # knows closes it, and the audit says so rather than hiding it.
    oom = _cell(gvisor_audit, FULL, "lower_oom_score")
    assert oom.observed is ActionResult.THROUGH and oom.evidence == "1000 -> 999"
    assert {(r.configuration, r.action, r.closed_by) for r in gvisor_audit.residual} == {
        (FULL, "lower_oom_score", ()),
        (FULL, "upload_registry", (AuditedLayer.METHOD_RULES,)),
        (FULL, "credential_elsewhere", (AuditedLayer.CREDENTIAL_MASKING,)),
        (FULL, "domain_fronting", (AuditedLayer.METHOD_RULES,)),
        (INSPECTED, "lower_oom_score", ()),
    }
    # The system file under the read-only root stays whole in every configuration.
    for config in (NO_FILTER, FULL, INSPECTED):
        cell = _cell(gvisor_audit, config, "write_system_file")
        assert cell.observed is ActionResult.STOPPED and "unchanged" in cell.evidence
