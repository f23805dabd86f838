"""The proxy sidecar as its own process (``python -m firstrun.proxy``), on loopback.

It must enforce the policy it was handed as JSON, answer the attestation
host with its nonce, stream each record as it is written, and stop cleanly
on SIGTERM. Judged by what a real client on loopback gets back.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys

import pytest

from firstrun.errors import PolicyError
from firstrun.policy.network import Mode, NetworkPolicy
from firstrun.proxy.sidecar import policy_from_data

POLICY = NetworkPolicy.build(
    allow=["pypi.org", "*.pythonhosted.org", "registry.npmjs.org:8443"],
    deny=["evil.pypi.org"],
    docs=["docs.example.com"],
    overrides=[("internal.example", ["10.1.2.0/24"]), ("plain.example", [])],
    mode=Mode.REPORT,
)


def test_policy_round_trips_through_json() -> None:
    back = policy_from_data(json.loads(json.dumps(POLICY.to_data())))
    assert back == POLICY
    assert back.to_data() == POLICY.to_data()


@pytest.mark.parametrize("broken", [
    {},
    {**POLICY.to_data(), "allow": "pypi.org,evil.com"},
    {**POLICY.to_data(), "allow": ["*"]},
    {**POLICY.to_data(), "mode": "open"},
    {**POLICY.to_data(), "overrides": [{"pattern": "a.example", "networks": ["not-a-net"]}]},
])
def test_malformed_policy_is_refused(broken: dict[str, object]) -> None:
    with pytest.raises(PolicyError):
        policy_from_data(broken)


def _start(policy: NetworkPolicy) -> tuple[subprocess.Popen[str], dict[str, object]]:
    proc = subprocess.Popen([sys.executable, "-m", "firstrun.proxy", "127.0.0.1", "0"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"policy": policy.to_data()}))
    proc.stdin.close()
    ready = json.loads(proc.stdout.readline())
    assert ready["event"] == "ready"
    return proc, ready


def test_sidecar_enforces_the_policy_and_streams_records_live() -> None:
    proc, ready = _start(NetworkPolicy.build(allow=["pypi.org"]))
    assert proc.stdout is not None
    try:
        host, port = ready["address"]
        conn = http.client.HTTPConnection(host, port, timeout=10)
        # A denied name is never resolved, so this sends nothing anywhere.
        conn.request("GET", "http://denied.example/secret", headers={"Host": "denied.example"})
        response = conn.getresponse()
        response.read()
        conn.close()
        assert response.status == 403
        # The record arrives while the sidecar still runs: live, not at exit.
        line = json.loads(proc.stdout.readline())
        assert line["event"] == "record"
        assert line["record"]["host"] == "denied.example"
        assert line["record"]["decision"] == "deny"
        assert line["record"]["reason"] == "not_allowed"

        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "http://attest.firstrun.invalid/",
                     headers={"Host": "attest.firstrun.invalid"})
        body = conn.getresponse().read().decode()
        conn.close()
        assert ready["nonce"] in body
        assert json.loads(proc.stdout.readline())["record"]["reason"] == "attestation"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        proc.stdout.close()


def test_sidecar_refuses_a_policy_it_cannot_parse() -> None:
    proc = subprocess.run([sys.executable, "-m", "firstrun.proxy", "127.0.0.1", "0"],
                          input="allow=pypi.org,evil.com", capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert "cannot read the policy" in proc.stderr
