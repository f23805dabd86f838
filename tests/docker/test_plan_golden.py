"""Golden tests: a docker session's whole launch plan, pinned, as the linux backend's is."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import NetworkPolicy
from firstrun.policy.process import SANDBOX_CA_BUNDLE, Limits
from firstrun.policy.profile import LayerName, SandboxProfile
from firstrun.sandbox.base import Enforcement, ProxyEndpoint
from firstrun.sandbox.docker.topology import DockerFacts, DockerPlan, prepare

GOLDEN = Path(__file__).parent / "golden"
PROXY = ProxyEndpoint(socket_path="/run/p.sock", nonce="unused")
SECRET = "sk-live-never-inside"
PROFILE = SandboxProfile(
    fs=FilesystemPolicy(workspace="/HOST/ws", real_homes=("/root",),
                        protected=((".git", "dir"),)),
    net=NetworkPolicy.build(allow=["pypi.org"]),
    limits=Limits(pids=256, memory_bytes=1 << 30, open_files=2048),
)
INSPECTED = SandboxProfile(
    fs=PROFILE.fs, limits=PROFILE.limits,
    net=NetworkPolicy.build(allow=["pypi.org"]).with_inspection(InspectionPolicy.build(
        credentials=[("PYPI_TOKEN", "pypi.org", "HOST_PYPI_TOKEN")])),
)


def _facts(**overrides: object) -> DockerFacts:
    facts = {
        "session": "s1", "image": "firstrun/python:3.11", "uid": 1000, "gid": 1000,
        "lib_binds": (("/SRC/firstrun", "firstrun"), ("/SITE/h11", "h11")),
        "harness": "4242:777", "ca_files": (SANDBOX_CA_BUNDLE, "/CA/corp.pem"),
        "seccomp_profile": "/PRIVATE/seccomp.json", "sidecar_hosts": (),
        "trust_bundle": None, "upstream_cafiles": (), "credentials": {},
        "host_env": {"PATH": "/HOME/.cargo/bin:/usr/bin", "SSL_CERT_FILE": "/CA/corp.pem",
                     "HOST_PYPI_TOKEN": SECRET, "OPENAI_API_KEY": "sk-never"},
        "helper_source": "<HELPER>", "libs_python": "3.11",
    }
    facts.update(overrides)
    return DockerFacts(**facts)  # type: ignore[arg-type]


def _plan_golden(name: str, plan: DockerPlan, *, placeholders: dict[str, str] | None = None) -> None:
    """The plan, with every command's environment once the sidecar is at 172.18.0.2."""
    data = json.loads(json.dumps({
        **plan.to_data(),
        "env": plan.environment(sidecar_ip="172.18.0.2", placeholders=placeholders)}))
    path = GOLDEN / name
    if os.environ.get("FIRSTRUN_UPDATE_GOLDEN"):
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert data == json.loads(path.read_text())


def test_the_plan_of_a_root_owned_workspace_runs_commands_as_the_lent_uid() -> None:
    plan = prepare(PROFILE, None, _facts(uid=1600000001, gid=1600000001))
    assert plan.user == "1600000001:1600000001"
    helper = json.loads(plan.topology.create[4][-1])
    assert helper["user"] == {"uid": 1600000001, "gid": 1600000001} and "capture" not in helper
    # No proxy: the sidecar is never started, and nothing names a proxy.
    assert plan.sidecar_request is None and not plan.capture
    env = plan.environment(sidecar_ip="172.18.0.2", placeholders=None)
    assert "http_proxy" not in env and env["PATH"] == "/usr/local/sbin:/usr/local/bin:" \
        "/usr/sbin:/usr/bin:/sbin:/bin"
    assert plan.attest.network == "firewalled" and plan.attest.proxy_port is None
    _plan_golden("docker_plan_lent_uid.json", plan)


def test_the_plan_of_a_user_owned_workspace_with_a_proxy_captures() -> None:
    plan = prepare(PROFILE, PROXY, _facts())
    assert plan.user == "1000:1000" and plan.capture
    assert plan.sidecar_request == {"policy": PROFILE.net.to_data()}
    env = plan.environment(sidecar_ip="172.18.0.2", placeholders=None)
    assert env["http_proxy"] == "http://172.18.0.2:3128"
    # Nothing of the harness's secrets, and its CA variable names the host file bound inside.
    assert SECRET not in env.values() and "OPENAI_API_KEY" not in env
    assert env["SSL_CERT_FILE"] == "/CA/corp.pem"
    # The running session's part: the nonce, where the sidecar and the host are, and the
    # Landlock witness only where the helper applied Landlock.
    attest = plan.attestation(nonce="n1", sidecar_ip="172.18.0.2", gateway="172.18.0.1",
                              landlock_abi=0)
    assert asdict(attest) == {**asdict(plan.attest), "nonce": "n1", "proxy_host": "172.18.0.2",
                              "host_address": "172.18.0.1"}
    sealed = plan.attestation(nonce="n1", sidecar_ip="172.18.0.2", gateway="172.18.0.1",
                              landlock_abi=6)
    assert (sealed.write_witness, sealed.self_mem_sealed) == ("/run/firstrun-witness", True)
    _plan_golden("docker_plan_proxy.json", plan)


def test_the_plan_under_inspection_sends_the_credential_to_the_sidecar_only() -> None:
    plan = prepare(INSPECTED, PROXY, _facts(
        trust_bundle="/PRIVATE/trust/trust.pem", upstream_cafiles=("/FIXTURE/ca.pem", "/CA/corp.pem"),
        credentials={"HOST_PYPI_TOKEN": SECRET}))
    assert plan.inspected and plan.sidecar_request is not None
    assert plan.sidecar_request["credentials"] == {"HOST_PYPI_TOKEN": SECRET}
    assert plan.sidecar_request["cafiles"] == [SANDBOX_CA_BUNDLE, "/CA/corp.pem", "/FIXTURE/ca.pem"]
    env = plan.environment(sidecar_ip="172.18.0.2", placeholders={"PYPI_TOKEN": "ph-1"})
    assert env["PYPI_TOKEN"] == "ph-1" and env["SSL_CERT_FILE"] == SANDBOX_CA_BUNDLE
    assert not any(SECRET in a for argv in plan.topology.create for a in argv)
    assert SECRET not in env.values() and SECRET not in repr(plan)
    _plan_golden("docker_plan_inspected.json", plan, placeholders={"PYPI_TOKEN": "ph-1"})


def test_a_profile_without_seccomp_keeps_dockers_default_and_is_downgraded() -> None:
    profile = SandboxProfile(fs=PROFILE.fs, net=PROFILE.net, limits=PROFILE.limits,
                             required=PROFILE.required - {LayerName.SECCOMP})
    plan = prepare(profile, PROXY, _facts(seccomp_profile=None))
    assert (plan.seccomp, plan.enforcement) == (False, Enforcement.DOWNGRADED)
    assert not any(a.startswith("seccomp=") for argv in plan.topology.create for a in argv)
    assert prepare(PROFILE, PROXY, _facts()).enforcement is Enforcement.ENFORCED
