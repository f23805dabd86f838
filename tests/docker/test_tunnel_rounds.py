"""New CONNECT tunnels through the docker sidecar, in rounds of 150 at once, none lost.

An HTTPS server with a CA of its own listens on the host's docker bridge
address; a policy override lets the sidecar reach it under a test name. A
client inside the run container opens ``PER_ROUND`` tunnels at once through
the sidecar, each a TLS handshake and one GET naming the tunnel, round after
round. Judged by what the server saw (every tunnel's GET arrived, once) and
by the sidecar's records (one allowed CONNECT per tunnel, bytes both ways,
none cut); the client's own count is only its report. A sidecar that
cannot start a tunnel's threads loses most of a round.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import shutil
import ssl
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from firstrun.audit.battery import docker_bridge_address
from firstrun.policy.network import NetworkPolicy
from firstrun.sandbox.base import OwnProxy
from firstrun.sandbox.docker.backend import DockerBackend
from support.profiles import make_profile

pytestmark = pytest.mark.usefixtures("docker_ready")

HOST = "tunnels.firstrun.test"
ROUNDS = 2
PER_ROUND = 150

# Run inside the run container by its Python: the tunnels bench's client.
CLIENT = (Path(__file__).resolve().parents[2] / "bench" / "tunnel_client.py").read_text(
    encoding="utf-8")


class Upstream:
    """An HTTPS server on ``address``: a certificate for ``HOST`` from a CA of its own, and
    the path of every GET it answered."""

    def __init__(self, address: str, directory: str) -> None:
        now = datetime.datetime.now(datetime.UTC)
        ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "firstrun tunnel test CA")])

        def cert(subject: x509.Name, public: ec.EllipticCurvePublicKey, *, ca: bool) -> x509.Certificate:
            builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
                       .public_key(public).serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(hours=1))
                       .not_valid_after(now + datetime.timedelta(hours=2))
                       .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None),
                                      critical=True))
            if not ca:
                builder = builder.add_extension(x509.SubjectAlternativeName(
                    [x509.DNSName(HOST), x509.IPAddress(ipaddress.ip_address(address))]),
                    critical=False)
            return builder.sign(ca_key, hashes.SHA256())

        pem = serialization.Encoding.PEM
        self.cafile = os.path.join(directory, "ca.pem")
        with open(self.cafile, "wb") as f:
            f.write(cert(ca_name, ca_key.public_key(), ca=True).public_bytes(pem))
        chain, keyfile = os.path.join(directory, "server.pem"), os.path.join(directory, "server.key")
        with open(chain, "wb") as f:
            f.write(cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]),
                         key.public_key(), ca=False).public_bytes(pem))
        with open(os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(chain, keyfile)
        self.seen: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(asyncio.start_server(
            self._answer, address, 0, ssl=self._context, backlog=1024))
        self.port: int = self._server.sockets[0].getsockname()[1]
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.seen[head.split(b" ", 2)[1].decode("ascii", "replace")] += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


@dataclass
class Rounds:
    upstream: Upstream
    records: list[dict[str, object]]
    client: dict[str, object]


@pytest.fixture(scope="module")
def rounds() -> Iterator[Rounds]:
    address = docker_bridge_address()
    directory = tempfile.mkdtemp(prefix="firstrun-tunnels-")
    workspace = tempfile.mkdtemp(prefix="firstrun-docker-ws-")
    upstream = Upstream(address, directory)
    try:
        shutil.copy(upstream.cafile, os.path.join(workspace, "ca.pem"))
        policy = NetworkPolicy.build(allow=(), source="test",
                                     overrides=[(f"{HOST}:{upstream.port}", [f"{address}/32"])])
        records: list[dict[str, object]] = []
        profile = make_profile(workspace, net=policy)
        backend = DockerBackend(on_record=records.append, sidecar_hosts=((HOST, address),))
        with backend.start(profile, proxy=OwnProxy()) as session:
            inside = profile.fs.sandbox_workspace
            result = session.exec(["python3", "-c", CLIENT, HOST, str(upstream.port), "0",
                                   str(PER_ROUND), f"{inside}/ca.pem", str(ROUNDS)],
                                  timeout=300.0)
            assert result.exit_code == 0, result.stderr.text()
            client = json.loads(result.stdout.text())
        # Read after the close: the sidecar delivered its last records by then.
        yield Rounds(upstream=upstream, records=records, client=client)
    finally:
        upstream.close()
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(workspace, ignore_errors=True)


def test_the_upstream_saw_every_tunnels_request_once(rounds: Rounds) -> None:
    expected = {f"/t/{n}" for n in range(ROUNDS * PER_ROUND)}
    assert set(rounds.upstream.seen) == expected, rounds.client
    assert set(rounds.upstream.seen.values()) == {1}
    assert rounds.client["ok"] == ROUNDS * PER_ROUND, rounds.client


def test_every_tunnel_is_one_allowed_record_with_bytes_both_ways(rounds: Rounds) -> None:
    tunnels = [r for r in rounds.records if r["method"] == "CONNECT" and r["host"] == HOST]
    assert len(tunnels) == ROUNDS * PER_ROUND
    assert {r["decision"] for r in tunnels} == {"allow"}
    empty = [r for r in tunnels if not (r["bytes_up"] and r["bytes_down"])]
    assert empty == []
    assert [r for r in tunnels if r["cut"]] == []
