"""TLS inspection end to end: commands in a real linux or gvisor sandbox, a loopback HTTPS
registry.

Judged by evidence: what the fixture registries saw (or did not), what the
proxy recorded, and what the sandbox can read.
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from cryptography.hazmat.primitives import serialization
from proxy_fixtures import HttpUpstream, RecordingResolver
from tls_fixtures import HttpsRegistry, TestCA

from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.policy.process import SANDBOX_CA_BUNDLE
from firstrun.proxy.credentials import sandbox_variables
from firstrun.proxy.intercept import Interception, prepare_interception
from firstrun.proxy.records import EgressRecord, Scheme
from firstrun.proxy.server import EgressProxy
from firstrun.sandbox.base import ExecResult, ProxyEndpoint, Session
from firstrun.sandbox.gvisor.backend import GvisorBackend
from firstrun.sandbox.linux import probe
from firstrun.sandbox.linux.backend import LinuxBackend
from support.profiles import make_profile

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(probe.bwrap_path() is None, reason="bubblewrap is not installed"),
]

SECRET = "real-npm-token-7c1e0f"


@dataclass
class Rig:
    session: Session
    proxy: EgressProxy
    registry: HttpsRegistry
    other: HttpsRegistry
    plain: HttpUpstream
    interception: Interception | None
    workspace: str

    def sh(self, command: str) -> ExecResult:
        return self.session.exec(command, timeout=120)

    def records(self, wanted: Callable[[EgressRecord], bool] = lambda r: True,
                at_least: int = 0) -> list[EgressRecord]:
        """The records ``wanted`` picks, once there are ``at_least`` (bounded wait).

        A record is written when its exchange ends, which can be just after
        the command read the answer and exited.
        """
        deadline = time.monotonic() + 10
        while True:
            picked = [r for r in self.proxy.records() if wanted(r)]
            if len(picked) >= at_least or time.monotonic() > deadline:
                return picked
            time.sleep(0.01)

    def url(self, server: HttpsRegistry, path: str = "/") -> str:
        return f"https://{server.host}:{server.port}{path}"


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


def _backend(name: str) -> LinuxBackend | GvisorBackend:
    if name == "linux":
        return LinuxBackend()
    backend = GvisorBackend()
    missing = [c for c in backend.probe() if not c.available]
    if missing:
        pytest.skip(f"the gvisor backend is not available here: {missing[0].detail}")
    return backend


def _rig(test_ca: TestCA, *, inspect: bool, backend: str) -> Iterator[Rig]:
    registry = HttpsRegistry(host="registry.test", ca=test_ca)
    other = HttpsRegistry(host="other.test", ca=test_ca)
    plain = HttpUpstream()
    workspace = tempfile.mkdtemp(prefix="firstrun-test-ws-")
    private = tempfile.mkdtemp(prefix="firstrun-test-proxy-")
    # The fixture CA in the workspace: the sandbox's own way to trust the
    # registry when nobody intercepts.
    shutil.copy(test_ca.cafile, os.path.join(workspace, "fixture-ca.pem"))
    policy = NetworkPolicy.build(overrides=[
        (f"registry.test:{registry.port}", ["127.0.0.1/32"]),
        (f"other.test:{other.port}", ["127.0.0.1/32"]),
        (f"plain.test:{plain.port}", ["127.0.0.1/32"]),
    ])
    interception, bundle = None, None
    if inspect:
        policy = policy.with_inspection(InspectionPolicy.build(
            credentials=[("NPM_TOKEN", f"registry.test:{registry.port}", "NPM_TOKEN_REAL")]))
        assert policy.inspection is not None
        interception, bundle = prepare_interception(
            policy.inspection, env={"NPM_TOKEN_REAL": SECRET}, bundle_dir=private,
            extra_cafiles=[str(test_ca.cafile)])
    resolver = RecordingResolver({"registry.test": ["127.0.0.1"], "other.test": ["127.0.0.1"],
                                  "plain.test": ["127.0.0.1"]})
    proxy = EgressProxy(policy, resolver=resolver, interception=interception).start()
    socket_path = proxy.listen_unix(os.path.join(private, "proxy.sock"), Channel.SHELL)
    endpoint = ProxyEndpoint(
        socket_path=socket_path, nonce=proxy.nonce, trust_bundle=bundle,
        placeholders=tuple(sandbox_variables(interception.credentials).items())
        if interception else (),
    )
    profile = make_profile(workspace, net=policy)
    try:
        with _backend(backend).start(profile, proxy=endpoint) as session:
            yield Rig(session=session, proxy=proxy, registry=registry, other=other, plain=plain,
                      interception=interception, workspace=workspace)
    finally:
        proxy.stop()
        for server in (registry, other, plain):
            server.close()
        shutil.rmtree(workspace, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


@pytest.fixture(scope="module", params=["linux", "gvisor"])
def open_rig(request: pytest.FixtureRequest, test_ca: TestCA) -> Iterator[Rig]:
    yield from _rig(test_ca, inspect=False, backend=request.param)


@pytest.fixture(scope="module", params=["linux", "gvisor"])
def inspecting_rig(request: pytest.FixtureRequest, test_ca: TestCA) -> Iterator[Rig]:
    yield from _rig(test_ca, inspect=True, backend=request.param)


def _curl(url: str, *args: str) -> str:
    # -w: the status on the last line; -D -: the headers too, for the reason.
    return shlex.join(["curl", "-sS", "-D", "-", "-o", "/dev/null", "-w", "%{http_code}\n",
                       *args, url])


def test_without_inspection_an_upload_gets_through(open_rig: Rig) -> None:
    result = open_rig.sh(_curl(open_rig.url(open_rig.registry, "/upload"), "--cacert",
                               "fixture-ca.pem", "-X", "POST", "--data-binary", "package-bytes"))
    assert result.stdout.text().splitlines()[-1] == "200", result.stderr.text()
    assert [(s.method, s.path, s.body) for s in open_rig.registry.seen] == [
        ("POST", "/upload", b"package-bytes")]


def test_with_inspection_an_upload_is_refused_and_the_registry_sees_nothing(
    inspecting_rig: Rig,
) -> None:
    rig = inspecting_rig
    before = len(rig.registry.seen)
    results = {
        method: rig.sh(_curl(rig.url(rig.registry, "/upload"), "-X", method,
                             "--data-binary", "package-bytes"))
        for method in ("POST", "PUT")
    }
    for method, result in results.items():
        out = result.stdout.text().lower()
        assert out.splitlines()[-1] == "405", (method, out, result.stderr.text())
        assert "x-firstrun-reason: method_not_allowed" in out
    assert rig.registry.seen[before:] == []
    refused = rig.records(lambda r: r.scheme is Scheme.HTTPS and r.method in results, at_least=2)
    assert [(r.method, r.path, r.decision.value, r.reason.value) for r in refused] == [
        ("POST", "/upload", "deny", "method_not_allowed"),
        ("PUT", "/upload", "deny", "method_not_allowed")]


def test_with_inspection_curl_and_pip_trust_the_run_ca_and_reads_work(inspecting_rig: Rig) -> None:
    rig = inspecting_rig
    curl = rig.sh(_curl(rig.url(rig.registry, "/simple/")))
    assert curl.stdout.text().splitlines()[-1] == "200", curl.stderr.text()
    pip = rig.sh(shlex.join([
        "python3", "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--dest", "/tmp/dl",
        "--index-url", rig.url(rig.registry, "/simple/"), "no-such-package"]))
    paths = [(s.method, s.path) for s in rig.registry.seen]
    assert ("GET", "/simple/") in paths
    # pip verified the run CA's certificate and asked the index: the registry saw it.
    assert ("GET", "/simple/no-such-package/") in paths, pip.stdout.text() + pip.stderr.text()
    assert "CERTIFICATE_VERIFY_FAILED" not in pip.stdout.text() + pip.stderr.text()


def test_the_sandbox_sees_the_combined_bundle_and_never_the_key(inspecting_rig: Rig) -> None:
    rig = inspecting_rig
    assert rig.interception is not None
    ca = rig.interception.ca
    shown = rig.sh(f"cat {SANDBOX_CA_BUNDLE}").stdout.data
    with open(SANDBOX_CA_BUNDLE, "rb") as f:
        system = f.read()
    assert shown.startswith(system) and shown.endswith(ca.cert_pem)
    env = rig.sh("env").stdout.text()
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS",
                 "CURL_CA_BUNDLE"):
        assert f"{name}={SANDBOX_CA_BUNDLE}\n" in env
    # The key never exists outside the proxy's memory; look for it in every
    # encoding it could take, everywhere a command can read that is not
    # the (unchanged) system trees.
    keys = [ca._key, ca._leaf_key]
    needles = []
    for key in keys:
        der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        scalar = key.private_numbers().private_value.to_bytes(32, "big")
        needles += [base64.b64encode(der)[:40].decode(), scalar.hex()]
    with open(os.path.join(rig.workspace, "needles"), "w") as f:
        f.write("\n".join(needles))
    search = rig.sh(
        "grep -rlaF -f /workspace/needles --exclude=needles / "
        "--exclude-dir=proc --exclude-dir=sys --exclude-dir=dev --exclude-dir=usr "
        "--exclude-dir=.pyenv --exclude-dir=.cargo 2>/dev/null; "
        "grep -c -aF -f /workspace/needles /proc/self/environ /proc/1/cmdline; true")
    assert search.stdout.text().split() == ["/proc/self/environ:0", "/proc/1/cmdline:0"], (
        search.stdout.text())
    # Raw bytes too: the scalar as binary, in the bundle the sandbox reads.
    assert not any(k.private_numbers().private_value.to_bytes(32, "big") in shown for k in keys)


def test_a_placeholder_is_swapped_only_for_its_host(inspecting_rig: Rig) -> None:
    rig = inspecting_rig
    env = rig.sh("env").stdout.text()
    assert SECRET not in env
    placeholder = rig.sh("printf %s \"$NPM_TOKEN\"").stdout.text()
    assert placeholder.startswith("firstrun-npm_token-")
    header = 'Authorization: Bearer $NPM_TOKEN'
    for url in (rig.url(rig.registry, "/auth"), rig.url(rig.other, "/auth"),
                f"http://plain.test:{rig.plain.port}/auth"):
        result = rig.sh(f'curl -sS -o /dev/null -w "%{{http_code}}" -H "{header}" {url}')
        assert result.stdout.text() == "200", (url, result.stderr.text())
    (named,) = [s for s in rig.registry.seen if s.path == "/auth"]
    (elsewhere,) = [s for s in rig.other.seen if s.path == "/auth"]
    (in_clear,) = [r for r in rig.plain.seen.requests if r.target == b"/auth"]
    assert named.headers["authorization"] == f"Bearer {SECRET}"
    assert elsewhere.headers["authorization"] == f"Bearer {placeholder}"
    assert dict(in_clear.headers)[b"authorization"] == f"Bearer {placeholder}".encode()
    swapped = rig.records(lambda r: bool(r.credentials), at_least=1)
    assert [(r.host, r.path, r.credentials) for r in swapped] == [
        ("registry.test", "/auth", ("NPM_TOKEN",))]
    assert not any(SECRET in r.to_json() for r in rig.records())
