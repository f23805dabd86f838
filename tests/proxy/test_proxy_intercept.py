"""TLS inspection on real loopback sockets: method rules, SNI/Host/CONNECT agreement, credentials."""

from __future__ import annotations

import base64
import json
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509
from proxy_fixtures import HttpUpstream, RecordingResolver, connect, read_reply
from tls_fixtures import HttpsRegistry, TestCA, https_via_proxy, raw_tls_via_proxy

from firstrun.errors import PolicyError, ProxyError, UsageError
from firstrun.policy.hosts import parse_patterns
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.ca import RunCA, upstream_context
from firstrun.proxy.credentials import mint
from firstrun.proxy.intercept import Interception
from firstrun.proxy.records import EgressRecord, Scheme
from firstrun.proxy.server import EgressProxy
from firstrun.proxy.sidecar import policy_from_data

SECRET = "s3cret-real-token-value"
# The Python the harness's libraries were built for, as the docker backend says it.
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def registry(test_ca: TestCA) -> Iterator[HttpsRegistry]:
    server = HttpsRegistry(host="registry.test", ca=test_ca)
    yield server
    server.close()


@pytest.fixture
def other(test_ca: TestCA) -> Iterator[HttpsRegistry]:
    server = HttpsRegistry(host="other.test", ca=test_ca)
    yield server
    server.close()


def _policy(*servers: HttpsRegistry | HttpUpstream, names: tuple[str, ...]) -> NetworkPolicy:
    return NetworkPolicy.build(
        overrides=[(f"{name}:{s.port}", ["127.0.0.1/32"]) for name, s in zip(names, servers, strict=True)],
    )


class Proxy:
    def __init__(self, policy: NetworkPolicy, *, inspection: InspectionPolicy | None,
                 cafiles: tuple[str, ...], env: dict[str, str] | None = None,
                 record_path: str | None = None) -> None:
        resolver = RecordingResolver({"registry.test": ["127.0.0.1"], "other.test": ["127.0.0.1"],
                                      "plain.test": ["127.0.0.1"]})
        self.ca = RunCA()
        interception = None
        if inspection is not None:
            policy = policy.with_inspection(inspection)
            interception = Interception(ca=self.ca, upstream=upstream_context(cafiles),
                                        credentials=mint(inspection.credentials, env or {}))
        self.interception = interception
        self.proxy = EgressProxy(policy, resolver=resolver, interception=interception,
                                 record_path=record_path).start()
        self.address = self.proxy.listen_tcp(Channel.SHELL)

    def records(self, *, at_least: int = 0) -> list[EgressRecord]:
        """Every record once the proxy stopped; ``at_least`` waits for exchanges still ending.

        Stopping cancels an exchange still under way, so a test whose client
        hung up first waits (bounded) for the proxy to notice before stopping it.
        """
        deadline = time.monotonic() + 10
        while len(self.proxy.records()) < at_least and time.monotonic() < deadline:
            time.sleep(0.01)
        self.proxy.stop()
        return self.proxy.records()


def _inner(records: list[EgressRecord]) -> list[EgressRecord]:
    return [r for r in records if r.scheme is Scheme.HTTPS]


def test_without_inspection_an_upload_reaches_the_registry(registry: HttpsRegistry,
                                                           test_ca: TestCA) -> None:
    p = Proxy(_policy(registry, names=("registry.test",)), inspection=None, cafiles=())
    status, _, _ = https_via_proxy(p.address, "registry.test", registry.port,
                                   trust=test_ca.cafile.read_bytes(), method="POST",
                                   path="/upload", body=b"package-bytes")
    records = p.records()
    assert status == 200
    assert [(s.method, s.body) for s in registry.seen] == [("POST", b"package-bytes")]
    # The baseline the issue closes: the record shows only an opaque tunnel.
    assert [r.scheme for r in records] == [Scheme.HTTPS_TUNNEL]


def test_inspection_refuses_uploads_and_lets_reads_through(registry: HttpsRegistry,
                                                           test_ca: TestCA) -> None:
    p = Proxy(_policy(registry, names=("registry.test",)), inspection=InspectionPolicy(),
              cafiles=(str(test_ca.cafile),))
    trust = p.ca.cert_pem
    get = https_via_proxy(p.address, "registry.test", registry.port, trust=trust, path="/simple/")
    head = https_via_proxy(p.address, "registry.test", registry.port, trust=trust, method="HEAD")
    refused = {
        method: https_via_proxy(p.address, "registry.test", registry.port, trust=trust,
                                method=method, path="/upload", body=b"package-bytes")
        for method in ("POST", "PUT", "PATCH", "DELETE")
    }
    records = p.records()
    assert get[0] == 200 and get[2] == b"registry.test saw GET /simple/\n"
    assert head[0] == 200
    assert {m: (s, h["x-firstrun-reason"]) for m, (s, h, _) in refused.items()} == {
        m: (405, "method_not_allowed") for m in ("POST", "PUT", "PATCH", "DELETE")}
    # Evidence: the registry saw the reads and nothing else.
    assert [(s.method, s.path) for s in registry.seen] == [("GET", "/simple/"), ("HEAD", "/")]
    inner = _inner(records)
    assert [(r.method, r.path, r.decision.value, r.reason.value, r.status) for r in inner] == [
        ("GET", "/simple/", "allow", "allowed_read_only", 200),
        ("HEAD", "/", "allow", "allowed_read_only", 200),
        *[(m, "/upload", "deny", "method_not_allowed", 405)
          for m in ("POST", "PUT", "PATCH", "DELETE")],
    ]
    assert all(r.host == "registry.test" and r.port == registry.port for r in inner)
    assert inner[0].bytes_down > 0 and inner[0].bytes_up > 0
    tunnels = [r for r in records if r.scheme is Scheme.HTTPS_TUNNEL]
    assert len(tunnels) == 6 and all(r.decision.value == "allow" for r in tunnels)


def test_a_method_rule_opens_one_path_and_the_body_cap_holds(registry: HttpsRegistry,
                                                             test_ca: TestCA) -> None:
    rules = InspectionPolicy.build(rules=[(f"registry.test:{registry.port}", ["post"], "/api/")],
                                   max_body_bytes=1000)
    p = Proxy(_policy(registry, names=("registry.test",)), inspection=rules,
              cafiles=(str(test_ca.cafile),))
    trust = p.ca.cert_pem
    ok = https_via_proxy(p.address, "registry.test", registry.port, trust=trust, method="POST",
                         path="/api/search", body=b"q=x")
    elsewhere = https_via_proxy(p.address, "registry.test", registry.port, trust=trust,
                                method="POST", path="/upload", body=b"q=x")
    big = https_via_proxy(p.address, "registry.test", registry.port, trust=trust, method="POST",
                          path="/api/search", body=b"x" * 5000)
    # An iterable body goes chunked: no declared length, so the cap is judged as it arrives.
    chunked = https_via_proxy(p.address, "registry.test", registry.port, trust=trust,
                              method="POST", path="/api/search",
                              body=iter([b"x" * 800, b"x" * 800]))
    records = p.records()
    assert ok[0] == 200
    assert (elsewhere[0], elsewhere[1]["x-firstrun-reason"]) == (405, "method_not_allowed")
    assert (big[0], big[1]["x-firstrun-reason"]) == (413, "body_too_large")
    assert (chunked[0], chunked[1]["x-firstrun-reason"]) == (413, "body_too_large")
    assert [(s.method, s.path, s.body) for s in registry.seen] == [("POST", "/api/search", b"q=x")]
    assert [r.reason.value for r in _inner(records)] == [
        "allowed_by_method_rule", "method_not_allowed", "body_too_large", "body_too_large"]


def test_upstream_is_verified_against_the_trust_store(registry: HttpsRegistry) -> None:
    # The fixture's CA is not in the system store: the proxy must not vouch for it.
    p = Proxy(_policy(registry, names=("registry.test",)), inspection=InspectionPolicy(),
              cafiles=())
    status, headers, _ = https_via_proxy(p.address, "registry.test", registry.port,
                                         trust=p.ca.cert_pem)
    records = p.records()
    assert (status, headers["x-firstrun-reason"]) == (502, "upstream_certificate_invalid")
    assert registry.seen == []
    assert [r.reason.value for r in _inner(records)] == ["upstream_certificate_invalid"]


def test_sni_must_name_the_connect_target(registry: HttpsRegistry, test_ca: TestCA) -> None:
    p = Proxy(_policy(registry, names=("registry.test",)), inspection=InspectionPolicy(),
              cafiles=(str(test_ca.cafile),))
    with pytest.raises((ssl.SSLError, OSError)):
        raw_tls_via_proxy(p.address, f"registry.test:{registry.port}", sni="other.test",
                          trust=p.ca.cert_pem).close()
    records = p.records(at_least=1)
    assert registry.handshakes == 0 and registry.seen == []
    assert [(r.scheme, r.decision.value, r.reason.value) for r in records] == [
        (Scheme.HTTPS_TUNNEL, "deny", "sni_mismatch")]


def test_host_header_must_name_the_connect_target(registry: HttpsRegistry, other: HttpsRegistry,
                                                  test_ca: TestCA) -> None:
    p = Proxy(_policy(registry, other, names=("registry.test", "other.test")),
              inspection=InspectionPolicy(), cafiles=(str(test_ca.cafile),))
    tls = raw_tls_via_proxy(p.address, f"registry.test:{registry.port}", sni="registry.test",
                            trust=p.ca.cert_pem)
    with tls:
        tls.sendall(f"GET / HTTP/1.1\r\nHost: other.test:{other.port}\r\n\r\n".encode())
        reply = read_reply(tls)
    records = p.records()
    assert (reply.status, reply.headers[b"x-firstrun-reason"]) == (403, b"host_mismatch")
    assert registry.seen == [] and other.seen == []
    assert [r.reason.value for r in _inner(records)] == ["host_mismatch"]


def test_a_tunnel_that_does_not_carry_tls_is_refused(registry: HttpsRegistry,
                                                     test_ca: TestCA) -> None:
    p = Proxy(_policy(registry, names=("registry.test",)), inspection=InspectionPolicy(),
              cafiles=(str(test_ca.cafile),))
    with connect(p.address) as sock:
        target = f"registry.test:{registry.port}"
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        assert read_reply(sock, method=b"CONNECT").status == 200
        sock.sendall(f"POST /upload HTTP/1.1\r\nHost: {target}\r\nContent-Length: 1\r\n\r\nx".encode())
        sock.settimeout(10)
        assert sock.recv(100) == b""
    records = p.records(at_least=1)
    assert registry.handshakes == 0
    assert [r.reason.value for r in records] == ["tls_required"]


def test_a_client_that_does_not_trust_the_run_ca_is_recorded(registry: HttpsRegistry,
                                                              test_ca: TestCA) -> None:
    p = Proxy(_policy(registry, names=("registry.test",)), inspection=InspectionPolicy(),
              cafiles=(str(test_ca.cafile),))
    with pytest.raises(ssl.SSLCertVerificationError):
        https_via_proxy(p.address, "registry.test", registry.port,
                        trust=test_ca.cafile.read_bytes())
    records = p.records(at_least=1)
    assert registry.seen == []
    assert [r.reason.value for r in records] == ["client_tls_failed"]


def test_placeholder_is_swapped_only_for_its_host_and_never_in_plain_http(
    registry: HttpsRegistry, other: HttpsRegistry, upstream: HttpUpstream, test_ca: TestCA,
    tmp_path: Path,
) -> None:
    inspection = InspectionPolicy.build(
        credentials=[("NPM_TOKEN", f"registry.test:{registry.port}", "NPM_TOKEN_REAL")])
    log = tmp_path / "records.jsonl"
    p = Proxy(_policy(registry, other, upstream, names=("registry.test", "other.test", "plain.test")),
              inspection=inspection, cafiles=(str(test_ca.cafile),),
              env={"NPM_TOKEN_REAL": SECRET}, record_path=str(log))
    assert p.interception is not None
    (cred,) = p.interception.credentials
    placeholder = cred.placeholder
    assert SECRET not in placeholder and SECRET not in repr(cred)
    trust = p.ca.cert_pem
    bearer = {"Authorization": f"Bearer {placeholder}"}
    https_via_proxy(p.address, "registry.test", registry.port, trust=trust, headers=bearer)
    https_via_proxy(p.address, "other.test", other.port, trust=trust, headers=bearer)
    # pip and git send a token from the URL as Basic credentials.
    basic = base64.b64encode(f"__token__:{placeholder}".encode()).decode()
    https_via_proxy(p.address, "registry.test", registry.port, trust=trust,
                    headers={"Authorization": f"Basic {basic}"})
    with connect(p.address) as sock:
        sock.sendall(
            f"GET http://plain.test:{upstream.port}/ HTTP/1.1\r\nHost: plain.test:{upstream.port}\r\n"
            f"Authorization: Bearer {placeholder}\r\nConnection: close\r\n\r\n".encode())
        read_reply(sock)
    records = p.records()
    assert registry.seen[0].headers["authorization"] == f"Bearer {SECRET}"
    assert base64.b64decode(registry.seen[1].headers["authorization"][6:]) == (
        f"__token__:{SECRET}".encode())
    assert other.seen[0].headers["authorization"] == f"Bearer {placeholder}"
    (plain,) = upstream.seen.requests
    assert dict(plain.headers)[b"authorization"] == f"Bearer {placeholder}".encode()
    inner = _inner(records)
    assert [(r.host, r.credentials) for r in inner] == [
        ("registry.test", ("NPM_TOKEN",)), ("other.test", ()), ("registry.test", ("NPM_TOKEN",))]
    assert SECRET not in log.read_text() and "NPM_TOKEN" in log.read_text()
    assert all(json.loads(line)["credentials"] in ([], ["NPM_TOKEN"])
               for line in log.read_text().splitlines())


def test_a_missing_credential_value_is_refused_up_front() -> None:
    inspection = InspectionPolicy.build(credentials=[("NPM_TOKEN", "registry.test", "NOT_SET")])
    with pytest.raises(UsageError, match=r"\$NOT_SET"):
        mint(inspection.credentials, {})


def test_inspection_is_all_or_nothing() -> None:
    policy = NetworkPolicy.build().with_inspection(InspectionPolicy())
    with pytest.raises(ProxyError):
        EgressProxy(policy)
    with pytest.raises(ProxyError):
        EgressProxy(NetworkPolicy.build(),
                    interception=Interception(ca=RunCA(), upstream=upstream_context()))


def test_leaf_certificates_name_one_host_and_chain_to_the_run_ca() -> None:
    ca = RunCA()
    leaf = ca.issue("registry.test")
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["registry.test"]
    assert leaf.issuer == ca.cert.subject
    assert ca.server_context("registry.test") is ca.server_context("registry.test")
    ip = ca.issue("127.0.0.1").extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert [str(a) for a in ip.value.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_the_docker_sidecar_inspects_and_reports_only_public_things_on_its_ready_line() -> None:
    policy = NetworkPolicy.build().with_inspection(InspectionPolicy.build(
        credentials=[("NPM_TOKEN", "registry.test", "NPM_TOKEN_REAL")]))
    assert policy_from_data(json.loads(json.dumps(policy.to_data()))) == policy
    # An agent CLI's: its API host on the agent channel, inspected alone.
    scoped = replace(NetworkPolicy.build(), agent=parse_patterns(["api.vendor.test"], source="t")
                     ).with_inspection(InspectionPolicy.build(scope=["api.vendor.test"]))
    assert policy_from_data(json.loads(json.dumps(scoped.to_data()))) == scoped
    value = "npm-real-value-4f1c"
    proc = subprocess.Popen([sys.executable, "-m", "firstrun.proxy", "127.0.0.1", "0"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps({"policy": policy.to_data(), "libs_python": HERE,
                                     "credentials": {"NPM_TOKEN_REAL": value}}))
        proc.stdin.close()
        line = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    ready = json.loads(line)
    assert ready["event"] == "ready"
    ca = x509.load_pem_x509_certificate(ready["ca"].encode())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert list(ready["placeholders"]) == ["NPM_TOKEN"]
    assert ready["placeholders"]["NPM_TOKEN"].startswith("firstrun-npm_token-")
    assert value not in line and "PRIVATE KEY" not in line


def test_the_docker_sidecar_refuses_inspection_without_a_credentials_value() -> None:
    policy = NetworkPolicy.build().with_inspection(InspectionPolicy.build(
        credentials=[("NPM_TOKEN", "registry.test", "NPM_TOKEN_REAL")]))
    proc = subprocess.run([sys.executable, "-m", "firstrun.proxy", "127.0.0.1", "0"],
                          input=json.dumps({"policy": policy.to_data(), "libs_python": HERE}),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 3 and proc.stdout == ""
    assert "$NPM_TOKEN_REAL is not set" in proc.stderr


def test_one_tunnel_carries_many_judged_requests_over_http_1_1_only(
    registry: HttpsRegistry, test_ca: TestCA,
) -> None:
    p = Proxy(_policy(registry, names=("registry.test",)), inspection=InspectionPolicy(),
              cafiles=(str(test_ca.cafile),))
    target = f"registry.test:{registry.port}"
    tls = raw_tls_via_proxy(p.address, target, sni="registry.test", trust=p.ca.cert_pem,
                            alpn=("h2", "http/1.1"))
    with tls:
        # HTTP/2 is never negotiated: h11 parses every request.
        assert tls.selected_alpn_protocol() == "http/1.1"
        tls.sendall(f"GET /a HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        first = read_reply(tls)
        tls.sendall(f"GET /b HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        second = read_reply(tls)
        # An upload after reads on the same connection is judged on its own.
        tls.sendall(f"POST /c HTTP/1.1\r\nHost: {target}\r\nExpect: 100-continue\r\n"
                    f"Content-Length: 3\r\n\r\n".encode())
        third = read_reply(tls)
    records = p.records(at_least=4)
    assert (first.status, second.status, third.status) == (200, 200, 405)
    assert [(s.method, s.path) for s in registry.seen] == [("GET", "/a"), ("GET", "/b")]
    assert [(r.scheme, r.method, r.path, r.reason.value) for r in records] == [
        (Scheme.HTTPS, "GET", "/a", "allowed_read_only"),
        (Scheme.HTTPS, "GET", "/b", "allowed_read_only"),
        (Scheme.HTTPS, "POST", "/c", "method_not_allowed"),
        (Scheme.HTTPS_TUNNEL, "CONNECT", None, "allowed_by_override"),
    ]


def test_an_allowed_upload_that_expects_100_continue_gets_it(registry: HttpsRegistry,
                                                             test_ca: TestCA) -> None:
    rules = InspectionPolicy.build(rules=[(f"registry.test:{registry.port}", ["PUT"], "/")])
    p = Proxy(_policy(registry, names=("registry.test",)), inspection=rules,
              cafiles=(str(test_ca.cafile),))
    target = f"registry.test:{registry.port}"
    with raw_tls_via_proxy(p.address, target, sni="registry.test", trust=p.ca.cert_pem) as tls:
        tls.sendall(f"PUT /pkg HTTP/1.1\r\nHost: {target}\r\nExpect: 100-continue\r\n"
                    f"Content-Length: 5\r\n\r\n".encode())
        assert tls.recv(100).startswith(b"HTTP/1.1 100 ")
        tls.sendall(b"bytes")
        reply = read_reply(tls)
    p.records()
    assert reply.status == 200
    assert [(s.method, s.body) for s in registry.seen] == [("PUT", b"bytes")]


def test_under_inspection_plain_http_is_judged_by_the_same_rules(upstream: HttpUpstream) -> None:
    policy = _policy(upstream, names=("plain.test",))
    p = Proxy(policy, inspection=InspectionPolicy.build(max_body_bytes=10), cafiles=())
    url = f"http://plain.test:{upstream.port}"
    host = f"plain.test:{upstream.port}"
    replies = []
    for request in (
        f"GET {url}/simple/ HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n",
        f"POST {url}/upload HTTP/1.1\r\nHost: {host}\r\nContent-Length: 3\r\n\r\nabc",
        (f"GET {url}/big HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n"
         "8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n"),
    ):
        with connect(p.address) as sock:
            sock.sendall(request.encode())
            replies.append(read_reply(sock))
    records = p.records(at_least=3)
    assert [r.status for r in replies] == [200, 405, 413]
    assert [r.headers.get(b"x-firstrun-reason") for r in replies[1:]] == [
        b"method_not_allowed", b"body_too_large"]
    assert [r.reason.value for r in records] == [
        "allowed_by_override", "method_not_allowed", "body_too_large"]
    # Judged before anything went upstream: the server saw only the read.
    assert [(req.method, req.target) for req in upstream.seen.requests] == [(b"GET", b"/simple/")]


def test_a_sidecar_on_another_python_refuses_inspection_before_loading_cryptography() -> None:
    policy = NetworkPolicy.build().with_inspection(InspectionPolicy.build())
    other = f"{sys.version_info[0]}.{sys.version_info[1] + 1}"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "firstrun.proxy",
                           "127.0.0.1", "0"],
                          input=json.dumps({"policy": policy.to_data(), "libs_python": other}),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stdout.splitlines()
    refused = json.loads(line)
    here = HERE
    assert refused == {
        "event": "refused",
        "error": f"--inspect-tls on docker: the image's Python is {here}, and the proxy sidecar "
                 f"cannot load the harness's cryptography, built for Python {other}",
        "fix": f"run the harness on Python {here}, or give the run an image whose python3 is "
               f"{other}"}
    imported = {row.split("|")[-1].strip() for row in proc.stderr.splitlines() if "|" in row}
    assert "cryptography" not in imported and "_cffi_backend" not in imported


def test_only_another_python_than_the_libraries_is_refused() -> None:
    from firstrun.proxy.sidecar import libs_mismatch

    assert libs_mismatch("3.11", (3, 11)) is None
    assert libs_mismatch("3.12", (3, 11)) is not None
    # Not said is refused, never taken for a match.
    assert libs_mismatch(None, (3, 11)) is not None
    assert libs_mismatch(311, (3, 11)) is not None
    # The default image is named only where it is the one that fits.
    assert "firstrun/python:3.11" in libs_mismatch("3.11", (3, 13)).args[1]
    assert "firstrun/python:3.11" not in libs_mismatch("3.12", (3, 11)).args[1]


def test_a_scoped_inspection_opens_the_api_host_alone(
        registry: HttpsRegistry, other: HttpsRegistry, test_ca: TestCA) -> None:
    # An agent CLI's run without --inspect-tls: its API host (here registry.test)
    # is inspected to put its key in; every other tunnel stays the client's own.
    api = f"registry.test:{registry.port}"
    inspection = InspectionPolicy.build(
        credentials=[("ANTHROPIC_API_KEY", api, "KEY_REAL")],
        rules=[(api, ["POST"], "/v1/")], scope=[api])
    policy = replace(_policy(registry, other, names=("registry.test", "other.test")),
                     agent=parse_patterns([api], source="test"))
    p = Proxy(policy, inspection=inspection, cafiles=(str(test_ca.cafile),),
              env={"KEY_REAL": SECRET})
    assert p.interception is not None
    (cred,) = p.interception.credentials
    key = {"x-api-key": cred.placeholder}
    swapped = https_via_proxy(p.address, "registry.test", registry.port, trust=p.ca.cert_pem,
                              method="POST", path="/v1/messages", body=b"{}", headers=key)
    # Trusting the real server's CA alone, the client verifies other.test end to end:
    # the run's CA never stood in, and the upload inspection refuses goes through.
    opaque = https_via_proxy(p.address, "other.test", other.port,
                             trust=test_ca.cafile.read_bytes(), method="POST", path="/upload",
                             body=b"package-bytes", headers=key)
    with pytest.raises(ssl.SSLCertVerificationError):
        https_via_proxy(p.address, "other.test", other.port, trust=p.ca.cert_pem)
    records = p.records()
    assert swapped[0] == 200 and opaque[0] == 200
    (seen,) = registry.seen
    assert (seen.method, seen.headers["x-api-key"]) == ("POST", SECRET)
    # Opaque: the placeholder arrived as it was sent.
    assert [(s.method, s.headers["x-api-key"]) for s in other.seen] == [
        ("POST", cred.placeholder)]
    (inner,) = _inner(records)
    assert (inner.channel, inner.host, inner.credentials) == (
        Channel.AGENT, "registry.test", ("ANTHROPIC_API_KEY",))
    tunnels = [(r.channel, r.host) for r in records if r.scheme is Scheme.HTTPS_TUNNEL]
    assert tunnels == [(Channel.AGENT, "registry.test"), (Channel.SHELL, "other.test"),
                       (Channel.SHELL, "other.test")]


def test_a_served_docs_host_is_answered_by_the_docs_reader_and_never_dialled(
        tmp_path: Path) -> None:
    # An agent CLI's own web fetch: a docs host's requests are decrypted and
    # answered with what the run's docs reader made of the page.
    read: list[str] = []

    def reader(url: str) -> str:
        read.append(url)
        return f"# The page at {url}\n"

    policy = replace(NetworkPolicy.build(docs=["docs.test"]), serve_docs=True).with_inspection(
        InspectionPolicy.build(scope=["docs.test"]))
    resolver = RecordingResolver({})
    ca = RunCA()
    interception = Interception(ca=ca, upstream=upstream_context())
    proxy = EgressProxy(policy, resolver=resolver, interception=interception,
                        pages=reader).start()
    address = proxy.listen_tcp(Channel.SHELL)
    try:
        # A client that closes after its one request (axios does) ends the tunnel cleanly.
        got = https_via_proxy(address, "docs.test", 443, trust=ca.cert_pem, path="/guide?x=1",
                              headers={"Connection": "close"})
        head = https_via_proxy(address, "docs.test", 443, trust=ca.cert_pem, method="HEAD",
                               path="/guide")
        post = https_via_proxy(address, "docs.test", 443, trust=ca.cert_pem, method="POST",
                               path="/guide", body=b"q")
        with connect(address) as sock:
            sock.sendall(b"GET http://docs.test/plain HTTP/1.1\r\nHost: docs.test\r\n"
                         b"Connection: close\r\n\r\n")
            plain = read_reply(sock)
    finally:
        proxy.stop()
    records = proxy.records()
    assert (got[0], got[1]["content-type"], got[2]) == (
        200, "text/markdown; charset=utf-8", b"# The page at https://docs.test/guide?x=1\n")
    assert (head[0], head[2]) == (200, b"")
    assert (post[0], post[1]["x-firstrun-reason"]) == (405, "method_not_allowed")
    assert plain.status == 200 and plain.body == b"# The page at http://docs.test/plain\n"
    # Each read went to the reader once (the POST never did); the proxy itself
    # never resolved or dialled the docs host.
    assert read == ["https://docs.test/guide?x=1", "https://docs.test/guide",
                    "http://docs.test/plain"]
    assert resolver.asked == []
    assert [(r.scheme, r.method, r.reason.value) for r in records if r.path is not None] == [
        (Scheme.HTTPS, "GET", "allowed_as_page_read"),
        (Scheme.HTTPS, "HEAD", "allowed_as_page_read"),
        (Scheme.HTTPS, "POST", "method_not_allowed"),
        (Scheme.HTTP, "GET", "allowed_as_page_read"),
    ]
    tunnels = [r for r in records if r.scheme is Scheme.HTTPS_TUNNEL]
    assert [r.reason.value for r in tunnels] == ["allowed_as_page_read"] * 3
    # The closing client's tunnel ended whole, what it carried counted.
    assert tunnels[0].bytes_up > 0 and tunnels[0].bytes_down > len(got[2])


def test_serving_docs_needs_inspection_and_a_reader() -> None:
    policy = replace(NetworkPolicy.build(docs=["docs.test"]), serve_docs=True)
    with pytest.raises(ProxyError, match="page reader"):
        EgressProxy(policy.with_inspection(InspectionPolicy()),
                    interception=Interception(ca=RunCA(), upstream=upstream_context()))
    with pytest.raises(PolicyError, match="serve_docs"):
        policy_from_data(json.loads(json.dumps(policy.to_data())))
