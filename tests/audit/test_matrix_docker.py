"""The real matrix on docker: the model (docker's own mechanisms) agrees with every cell, by evidence.

The witnesses listen on the host's address on docker's default bridge (a
container cannot reach the host's loopback), the fixture registry too, and
the sidecar reaches the registry by the name in its /etc/hosts; nothing
leaves this machine.
"""

from __future__ import annotations

import ipaddress

import pytest

from firstrun.audit.battery import (
    AuditResult,
    configurations,
    docker_bridge_address,
    run_audit,
)
from firstrun.audit.model import ACTIONS, ActionResult, AuditedLayer, predict, stoppers, subsets
from firstrun.images.build import image_present
from support.audit import cell as _cell
from support.audit import configuration_result as _config

pytestmark = pytest.mark.escape

FULL = "docker: full stack"
DEFAULT_SECCOMP = "docker: without seccomp"
INSPECTED = "docker: full stack + --inspect-tls"


@pytest.fixture(scope="module")
def docker_audit() -> AuditResult:
    if not image_present("firstrun/python:3.11"):
        pytest.fail("firstrun/python:3.11 is not in the local daemon; scripts/test starts "
                    "dockerd and runs 'firstrun images build --python'")
    return run_audit(["docker"])


def test_every_docker_configuration_ran_every_action(docker_audit: AuditResult) -> None:
    assert docker_audit.skipped == ()
    names = [r.configuration.name for r in docker_audit.results]
    assert names == [c.name for c in configurations("docker")] == [DEFAULT_SECCOMP, FULL, INSPECTED]
    for r in docker_audit.results:
        assert [c.action for c in r.cells] == [a.id for a in ACTIONS]
        assert r.not_run == 0


def test_model_and_reality_agree_on_every_docker_cell(docker_audit: AuditResult) -> None:
    assert docker_audit.disagreements == ()


def test_firstruns_profile_is_what_closes_io_uring_and_ptrace(docker_audit: AuditResult) -> None:
    # Docker's default profile lets both through; the same session with
    # firstrun's profile refuses both, and the kernel said so.
    for action in ("io_uring", "ptrace_sibling"):
        assert _cell(docker_audit, DEFAULT_SECCOMP, action).observed is ActionResult.THROUGH
        full = _cell(docker_audit, FULL, action)
        assert full.observed is ActionResult.STOPPED and "EPERM" in full.evidence
        assert full.stopped_by == (AuditedLayer.SECCOMP,)
    assert _cell(docker_audit, FULL, "io_uring").evidence == "io_uring_setup: EPERM"


def test_the_oom_score_floor_is_the_containers_not_the_read_only_roots(
        docker_audit: AuditResult) -> None:
    for config in (DEFAULT_SECCOMP, FULL):
        cell = _cell(docker_audit, config, "lower_oom_score")
        # Commands start at the OOM killer's first choice (the helper's 1000) and
        # cannot go below it without CAP_SYS_RESOURCE, which no command has.
        assert cell.observed is ActionResult.STOPPED and cell.evidence == "1000 -> 999: EACCES"
        assert cell.stopped_by == (AuditedLayer.NAMESPACES,)


def test_host_witnesses_on_the_bridge_saw_nothing(docker_audit: AuditResult) -> None:
    for config in (DEFAULT_SECCOMP, FULL):
        for action in ("host_loopback", "resolve_name", "raw_ip", "host_abstract_socket"):
            cell = _cell(docker_audit, config, action)
            assert cell.observed is ActionResult.STOPPED and cell.seen == 0, (config, action, cell)
        metadata = _cell(docker_audit, config, "cloud_metadata")
        # Judged from the sidecar's own records, rebuilt with EgressRecord.from_data.
        assert metadata.observed is ActionResult.STOPPED and "ip_literal" in metadata.evidence


def test_the_sidecar_reaches_the_registry_and_the_residual_stays_open(
        docker_audit: AuditResult) -> None:
    full = _config(docker_audit, FULL)
    assert full.needed_broken == 0 and full.session["enforcement"] == "enforced"
    install = _cell(docker_audit, FULL, "install_package")
    assert install.observed is ActionResult.THROUGH and "module installed" in install.evidence
    upload = _cell(docker_audit, FULL, "upload_registry")
    assert upload.observed is ActionResult.THROUGH and upload.seen == 1
    # Open without inspection; the residual names what closes it, and docker has it.
    assert {(r.action, r.closed_by, r.available) for r in docker_audit.residual} == {
        ("upload_registry", (AuditedLayer.METHOD_RULES,), (AuditedLayer.METHOD_RULES,)),
        ("credential_elsewhere", (AuditedLayer.CREDENTIAL_MASKING,), (AuditedLayer.CREDENTIAL_MASKING,)),
        ("domain_fronting", (AuditedLayer.METHOD_RULES,), (AuditedLayer.METHOD_RULES,)),
    }


def test_the_sidecars_inspection_closes_the_residual_and_breaks_nothing(
        docker_audit: AuditResult) -> None:
    inspected = _config(docker_audit, INSPECTED)
    assert inspected.needed_broken == 0 and inspected.session["enforcement"] == "enforced"
    install = _cell(docker_audit, INSPECTED, "install_package")
    assert install.observed is ActionResult.THROUGH and "module installed" in install.evidence
    upload = _cell(docker_audit, INSPECTED, "upload_registry")
    assert upload.observed is ActionResult.STOPPED and upload.seen == 0 and "HTTP 405" in upload.evidence
    assert upload.stopped_by == (AuditedLayer.METHOD_RULES,)
    credential = _cell(docker_audit, INSPECTED, "credential_elsewhere")
    assert credential.observed is ActionResult.STOPPED and credential.seen == 0
    assert credential.stopped_by == (AuditedLayer.CREDENTIAL_MASKING,)
    fronting = _cell(docker_audit, INSPECTED, "domain_fronting")
    assert fronting.observed is ActionResult.STOPPED and fronting.seen == 0
    assert "host_mismatch" in fronting.evidence
    network = next(l for l in inspected.session["layers"]  # type: ignore[union-attr]
                   if l["name"] == "network")
    assert "TLS inspected by the sidecar" in str(network["detail"])
    assert "run_ca_trusted" in {c["name"] for c in inspected.session["attestation"]}  # type: ignore[union-attr]


def test_each_session_records_the_seccomp_mechanism_it_ran_under(
        docker_audit: AuditResult) -> None:
    def seccomp(config: str) -> dict[str, object]:
        layers = _config(docker_audit, config).session["layers"]
        return next(l for l in layers if l["name"] == "seccomp")  # type: ignore[union-attr]
    full, default = seccomp(FULL), seccomp(DEFAULT_SECCOMP)
    assert full["applied"] and str(full["mechanism"]).startswith("firstrun seccomp profile (")
    assert not default["applied"] and "Docker's default profile applies" in str(default["detail"])
    assert _config(docker_audit, DEFAULT_SECCOMP).session["enforcement"] == "downgraded"


def test_the_witness_address_is_this_hosts_private_bridge_address() -> None:
    address = ipaddress.ip_address(docker_bridge_address())
    assert address.is_private and not address.is_loopback


def test_the_docker_model_is_monotone_and_honest_about_mechanisms() -> None:
    for config in subsets(AuditedLayer):
        for extra in AuditedLayer:
            for act in ACTIONS:
                if predict(act, config, "docker") is ActionResult.STOPPED:
                    assert predict(act, config | {extra}, "docker") is ActionResult.STOPPED
    by_id = {a.id: a for a in ACTIONS}
    # The read-only root confines writes and nothing else; the container owns the rest.
    assert stoppers(by_id["lower_oom_score"], {AuditedLayer.LANDLOCK}, "docker") == ()
    assert stoppers(by_id["host_abstract_socket"], {AuditedLayer.LANDLOCK}, "docker") == ()
    assert stoppers(by_id["write_system_file"], {AuditedLayer.LANDLOCK}, "docker") == (AuditedLayer.LANDLOCK,)
    assert stoppers(by_id["lower_oom_score"], {AuditedLayer.LANDLOCK}, "linux") == (AuditedLayer.LANDLOCK,)
