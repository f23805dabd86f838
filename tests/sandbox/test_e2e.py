"""End to end through the real egress proxy and a real package registry."""

from __future__ import annotations

import os

import pytest

from firstrun.sandbox.linux.backend import LinuxBackend
from support.profiles import make_profile

pytestmark = pytest.mark.e2e


def test_pip_download_through_the_proxy_and_a_denied_host_is_recorded(workspace: str,
                                                                       proxy) -> None:
    egress, endpoint = proxy
    with LinuxBackend().start(make_profile(workspace), proxy=endpoint) as session:
        pip = session.exec(
            "PIP_CONFIG_FILE=/dev/null python3 -m pip download --no-deps --disable-pip-version-check "
            "-d /workspace/dl six --index-url https://pypi.org/simple",
            timeout=180,
        )
        denied = session.exec("curl -sS --max-time 30 https://example.com/", timeout=60)
    assert pip.exit_code == 0, pip.stderr.text()
    assert [n for n in os.listdir(os.path.join(workspace, "dl")) if n.startswith("six-")]
    assert denied.exit_code != 0
    records = egress.records()
    allowed = {r.host for r in records if r.decision == "allow"}
    assert {"pypi.org", "files.pythonhosted.org"} <= allowed
    refused = [r for r in records if r.host == "example.com"]
    assert refused and all(r.decision == "deny" and r.reason == "not_allowed" for r in refused)
