"""--inspect-tls on the docker backend, on a real dockerd with real containers.

An HTTPS fixture registry (``audit.fixtures.Registry``, with a CA of its own
that only the sidecar trusts) listens on the host's docker bridge address;
the sidecar reaches it under two hosts: its name (through ``sidecar_hosts``),
which the credential names, and its IP literal, which it does not. Judged
by what the registry saw, what the run container can read, and what is on
the host's disk: an upload is refused before any byte reaches the registry,
a GET works through curl and pip trusting only the run's bundle, a
credential's value reaches only the host it names, and the run CA's private
key is nowhere the run container or the host's disk holds.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from firstrun.audit.battery import docker_bridge_address
from firstrun.audit.fixtures import PACKAGE, REGISTRY_HOST, Registry
from firstrun.errors import PolicyError, UsageError
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import NetworkPolicy
from firstrun.policy.process import SANDBOX_CA_BUNDLE
from firstrun.policy.profile import SandboxProfile
from firstrun.proxy.sidecar import policy_from_data
from firstrun.sandbox.base import OwnProxy
from firstrun.sandbox.docker.backend import DockerBackend, DockerSession
from firstrun.sandbox.docker.resources import docker
from support.profiles import make_profile

pytestmark = pytest.mark.usefixtures("docker_ready")

TOKEN = "REGISTRY_TOKEN"
TOKEN_SOURCE = "FIRSTRUN_TEST_REGISTRY_TOKEN_VALUE"

# Every file the run container can read, for the CA's public point (a
# serialized EC key embeds it; a certificate in PEM shows it only in base64),
# and every file on a runtime mount (what was not in the image) for a PEM key.
_SCAN = r"""
import json, os, sys
point = bytes.fromhex(sys.argv[1])
skip = ("/proc", "/sys", "/dev")
mounts = [line.split()[4] for line in open("/proc/self/mountinfo")]
runtime = [m for m in mounts if m != "/" and not m.startswith(skip)]
found = {"point": [], "pem_key": [], "files": 0}
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip]
    for name in files:
        path = os.path.join(root, name)
        try:
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 1 << 26:
                continue
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        found["files"] += 1
        if point in data:
            found["point"].append(path)
        on_runtime_mount = any(path == m or path.startswith(m.rstrip("/") + "/") for m in runtime)
        if on_runtime_mount and b"PRIVATE KEY-----" in data:
            found["pem_key"].append(path)
# Every environment this process can read (the helper's, pid 1, it cannot).
environ = b""
for entry in os.listdir("/proc"):
    if entry.isdigit() or entry == "self":
        try:
            environ += open(f"/proc/{entry}/environ", "rb").read()
        except OSError:
            pass
found["environ"] = environ.decode("utf-8", "replace")
print(json.dumps(found))
"""


@dataclass
class Inspected:
    session: DockerSession
    registry: Registry
    records: list[dict[str, object]]
    secret: str
    workspace: str

    @property
    def named(self) -> str:
        """The host the credential names."""
        return f"{REGISTRY_HOST}:{self.registry.port}"

    @property
    def other(self) -> str:
        """The same fixture as a second host, which no credential names."""
        return f"{self.registry.address}:{self.registry.port}"


@pytest.fixture(scope="module")
def inspected() -> Iterator[Inspected]:
    address = docker_bridge_address()
    secret = f"real-token-{os.urandom(8).hex()}"
    records: list[dict[str, object]] = []
    workspace = tempfile.mkdtemp(prefix="firstrun-docker-ws-")
    with Registry(address) as registry:
        policy = NetworkPolicy.build(
            allow=(), source="test",
            overrides=[(f"{host}:{registry.port}", [f"{address}/32"])
                       for host in (REGISTRY_HOST, address)],
        ).with_inspection(InspectionPolicy.build(
            credentials=[(TOKEN, f"{REGISTRY_HOST}:{registry.port}", TOKEN_SOURCE)],
            source="test"))
        backend = DockerBackend(on_record=records.append,
                                sidecar_hosts=((REGISTRY_HOST, address),),
                                upstream_cafiles=(registry.cafile,),
                                credential_env={TOKEN_SOURCE: secret})
        profile = make_profile(workspace, net=policy)
        try:
            with backend.start(profile, proxy=OwnProxy()) as session:
                yield Inspected(session=session, registry=registry, records=records,
                                secret=secret, workspace=workspace)
        finally:
            shutil.rmtree(workspace, ignore_errors=True)


def _curl(session: DockerSession, *args: str) -> tuple[int, str]:
    result = session.exec(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", *args],
                          timeout=60.0)
    assert result.exit_code == 0, result.stderr.text()
    return int(result.stdout.text()), result.stderr.text()


def _bundle_source(session: DockerSession) -> str:
    mounts = json.loads(docker("inspect", "--format", "{{json .Mounts}}",
                               session.topology.run).stdout)
    (source,) = [m["Source"] for m in mounts if m["Destination"] == SANDBOX_CA_BUNDLE]
    return str(source)


def _run_ca(session: DockerSession) -> x509.Certificate:
    # The last block; some system CAs carry serials newer cryptography warns about.
    with open(_bundle_source(session), "rb") as f:
        last = f.read().rsplit(b"-----BEGIN CERTIFICATE-----", 1)[1]
    return x509.load_pem_x509_certificate(b"-----BEGIN CERTIFICATE-----" + last)


def test_the_session_records_inspection_and_proves_the_run_ca_is_trusted(
        inspected: Inspected) -> None:
    info = inspected.session.info
    assert all(c.passed for c in info.attestation), info.attestation
    assert "run_ca_trusted" in {c.name for c in info.attestation}
    (network,) = [layer for layer in info.layers if layer.name.value == "network"]
    fingerprint = _run_ca(inspected.session).fingerprint(hashes.SHA256()).hex()[:16]
    assert f"TLS inspected by the sidecar (run CA sha256 {fingerprint}" in network.detail
    assert TOKEN in network.detail


def test_an_upload_is_refused_and_the_registry_saw_nothing(inspected: Inspected,
                                                           records_until) -> None:
    status, _ = _curl(inspected.session, "-X", "POST", "--data-binary", "wheel bytes",
                      f"https://{inspected.named}/legacy/")
    assert status == 405
    assert [s for s in inspected.registry.seen() if s.method == "POST"] == []
    def posts(records: list) -> list:
        return [r for r in records if r.get("method") == "POST" and r.get("scheme") == "https"]

    refused = posts(records_until(lambda: list(inspected.records), posts))
    assert refused and refused[-1]["decision"] == "deny"


def test_a_get_works_with_curl_and_pip_trusting_only_the_run_bundle(inspected: Inspected) -> None:
    # The run container was never given the registry's own CA: success means
    # the sidecar re-signed and the bundle at SANDBOX_CA_BUNDLE holds its CA.
    status, err = _curl(inspected.session, f"https://{inspected.named}/simple/{PACKAGE}/")
    assert status == 200, err
    result = inspected.session.exec(
        ["pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
         "-d", "/tmp/dl", "--index-url", f"https://{inspected.named}/simple/", PACKAGE],
        timeout=120.0)
    assert result.exit_code == 0, result.stdout.text() + result.stderr.text()
    assert any(s.method == "GET" and s.path.startswith("/packages/")
               for s in inspected.registry.seen())


def test_a_placeholder_is_swapped_only_for_its_named_host(inspected: Inspected) -> None:
    env = inspected.session.exec(["printenv", TOKEN]).stdout.text().strip()
    assert env.startswith("firstrun-") and inspected.secret not in env
    header = f"Authorization: Bearer ${TOKEN}"
    for host in (inspected.named, inspected.other):
        result = inspected.session.exec(
            f'curl -sS -o /dev/null -H "{header}" "https://{host}/simple/?who={host}"',
            timeout=60.0)
        assert result.exit_code == 0, result.stderr.text()

    def authorizations(host: str) -> list[str]:
        return [v for s in inspected.registry.seen() if s.path.endswith(f"?who={host}")
                for k, v in s.headers if k.lower() == "authorization"]

    assert authorizations(inspected.named) == [f"Bearer {inspected.secret}"]
    assert authorizations(inspected.other) == [f"Bearer {env}"]
    sidecar_env = json.loads(docker("inspect", "--format", "{{json .Config.Env}}",
                                    inspected.session.topology.sidecar).stdout)
    assert not any(inspected.secret in v for v in sidecar_env)


def test_the_ca_private_key_is_nowhere_the_run_container_or_the_host_disk_holds(
        inspected: Inspected) -> None:
    ca = _run_ca(inspected.session)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    point = ca.public_key().public_bytes(serialization.Encoding.X962,
                                         serialization.PublicFormat.UncompressedPoint)
    result = inspected.session.exec(["python3", "-I", "-c", _SCAN, point.hex()], timeout=300.0)
    assert result.exit_code == 0, result.stderr.text()
    found = json.loads(result.stdout.text())
    assert found["files"] > 1000  # the scan read the image, not an empty view
    assert found["point"] == [] and found["pem_key"] == []
    assert "PRIVATE KEY" not in found["environ"] and inspected.secret not in found["environ"]
    # The host side: the session's trust directory holds certificates only.
    trust_dir = os.path.dirname(_bundle_source(inspected.session))
    for name in os.listdir(trust_dir):
        with open(os.path.join(trust_dir, name), "rb") as f:
            data = f.read()
        assert b"PRIVATE KEY" not in data and point not in data
        blocks = data.count(b"-----BEGIN ")
        assert blocks == data.count(b"-----BEGIN CERTIFICATE-----") > 1
    for directory in (inspected.workspace,):
        for root, _, files in os.walk(directory):
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    data = f.read()
                assert b"PRIVATE KEY" not in data and point not in data


def test_a_missing_credential_value_is_refused() -> None:
    workspace = tempfile.mkdtemp(prefix="firstrun-docker-ws-")
    try:
        policy = NetworkPolicy.build(allow=["pypi.org"]).with_inspection(InspectionPolicy.build(
            credentials=[(TOKEN, "pypi.org", TOKEN_SOURCE)]))
        profile = make_profile(workspace, net=policy)
        with pytest.raises(UsageError, match=TOKEN_SOURCE):
            DockerBackend(credential_env={}).start(profile, proxy=OwnProxy())
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def test_the_sidecar_parses_back_the_inspection_it_was_sent() -> None:
    policy = NetworkPolicy.build(allow=["pypi.org"], shell_docs=["docs.example.com"]).with_inspection(
        InspectionPolicy.build(rules=[("upload.pypi.org", ["POST"], "/legacy/")],
                               credentials=[(TOKEN, "pypi.org", TOKEN_SOURCE)], max_body_bytes=99))
    assert policy_from_data(json.loads(json.dumps(policy.to_data()))) == policy
    broken = policy.to_data()
    broken["inspection"] = {**policy.inspection.to_data(), "max_body_bytes": "99"}  # type: ignore[union-attr]
    with pytest.raises(PolicyError):
        policy_from_data(broken)


def test_under_inspection_the_topology_binds_the_bundle_and_gives_the_sidecar_the_host_cas() -> None:
    from dataclasses import replace

    from firstrun.policy.filesystem import FilesystemPolicy
    from firstrun.sandbox.docker.topology import DockerHost, build_topology

    host = DockerHost(workspace="/HOST/ws", uid=1000, gid=1000, image="img", sidecar_image="img",
                      lib_binds=(), harness="1:2", ca_files=(SANDBOX_CA_BUNDLE, "/etc/extra.pem"))
    profile = SandboxProfile(fs=FilesystemPolicy(workspace="/HOST/ws"))
    plain = build_topology(profile, session="s1", host=host)
    inspected = build_topology(profile, session="s1", host=replace(
        host, trust_bundle="/PRIVATE/trust.pem",
        sidecar_ca_files=(SANDBOX_CA_BUNDLE, "/etc/extra.pem", "/FIXTURE/ca.pem")))

    def binds(argv: tuple[str, ...]) -> list[str]:
        return [argv[i + 1] for i, a in enumerate(argv) if a == "--mount"]

    # Without inspection: unchanged, the host's bundles at their own paths in the run container.
    assert binds(plain.create[4])[1:] == [
        f"type=bind,source={SANDBOX_CA_BUNDLE},target={SANDBOX_CA_BUNDLE},readonly",
        "type=bind,source=/etc/extra.pem,target=/etc/extra.pem,readonly"]
    assert not any("ca.pem" in b or "certs" in b for b in binds(plain.create[2]))
    # With it: the run container's one trust file is the bundle; the sidecar gets the CAs.
    assert binds(inspected.create[4]) == [
        "type=bind,source=/HOST/ws,target=/workspace",
        f"type=bind,source=/PRIVATE/trust.pem,target={SANDBOX_CA_BUNDLE},readonly"]
    assert binds(inspected.create[2]) == [
        f"type=bind,source={p},target={p},readonly"
        for p in (SANDBOX_CA_BUNDLE, "/etc/extra.pem", "/FIXTURE/ca.pem")]
