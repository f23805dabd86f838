"""Claude Code, the real CLI from the npm registry, against a scripted Messages API server.

The CLI is installed once per test session from the registry (pinned by
integrity, as ``--agent claude-code`` installs it) into a directory under
pytest's temporary root. Inside the sandbox it reaches the scripted server
through the egress proxy: ``api.anthropic.test:<port>`` is routed to the
server's port by a recorded override, the route a test may take and a user's
run never does. The server listens where the backend's proxy reaches the host
(``support.agent_clis.serving``): loopback for the harness's proxy, the docker bridge's gateway
for docker's sidecar.
"""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import support.anthropic_wire as wire
from firstrun.agents.cli.claude_code import ClaudeCodeAgent, make_claude_code
from firstrun.agents.cli.frame import Route
from firstrun.agents.cli.install import CLAUDE_CODE, CliInstall
from support.agent_clis import CliRow
from support.agents import PRICE
from support.vendor import Reply, Request, Script

API_HOST = "api.anthropic.test"


def bash(command: str) -> dict[str, Any]:
    return wire.tool_use("Bash", command=command, description="run it")


def read_docs(url: str) -> dict[str, Any]:
    return wire.tool_use("mcp__firstrun__read_docs", url=url)


def agent(install: CliInstall, server_url: str, **options: Any) -> ClaudeCodeAgent:
    api = urlsplit(server_url)
    return make_claude_code(model=wire.MODEL, base_url=f"{api.scheme}://{API_HOST}:{api.port}",
                            price_file={wire.MODEL: PRICE}, install=install,
                            routes=(Route(host=API_HOST, port=int(api.port or 0),
                                          address=str(api.hostname)),),
                            max_retries=0, **options)


class Conversation:
    """The run's conversation by its model turns; any side request (one with no tools)
    gets a short text reply, so the script counts only the agent's own turns."""

    def __init__(self, *steps: Reply | list[Reply]) -> None:
        self._script = Script(steps, turn_of=wire.model_turns)

    def __call__(self, request: Request) -> Reply:
        if not (request.body or {}).get("tools"):
            return wire.message(wire.text("ok"))
        return self._script(request)


def served(*steps: Reply | list[Reply]) -> Any:
    return wire.streaming(Conversation(*steps))


ROW = CliRow(pin=CLAUDE_CODE, agent=agent, greeter=lambda page, command: served(
    wire.message(read_docs(page)), wire.message(bash(command)), wire.message(wire.text("Done."))))


def api_tls(directory: Path, host: str = API_HOST) -> tuple[ssl.SSLContext, Path]:
    """A server context for ``host`` and its CA's PEM file, both made here."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "firstrun test API CA")])
    now = datetime.datetime.now(datetime.UTC)

    def signed(subject: x509.Name, key: ec.EllipticCurvePrivateKey,
               extension: x509.ExtensionType, critical: bool) -> x509.Certificate:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(extension, critical=critical).sign(ca_key, hashes.SHA256()))

    ca = signed(ca_name, ca_key, x509.BasicConstraints(ca=True, path_length=0), True)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = signed(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]), key,
                  x509.SubjectAlternativeName([x509.DNSName(host)]), False)
    certfile, keyfile, cafile = directory / "api.pem", directory / "api.key", directory / "ca.pem"
    certfile.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    cafile.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile, keyfile)
    return context, cafile


__all__ = ["API_HOST", "ROW", "agent", "api_tls", "bash", "read_docs", "served"]
