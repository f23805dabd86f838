"""A launch that fails says why, in the words of the step that failed, and leaves nothing.

Both ends of the launch are driven to fail for real: a step of the launch
before bubblewrap (staging a source a root harness must stage), and
bubblewrap's own setup after it made the namespaces, while capture's
tables are already loading into them; and capture's routes, which load
while the attestation probe starts, failing under it.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.sandbox import capture
from firstrun.sandbox.base import ProxyEndpoint
from firstrun.sandbox.linux.backend import LinuxBackend
from firstrun.sandbox.linux.probe import bwrap_path
from support.profiles import make_profile

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="needs bubblewrap")


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root harness stages sources")
def test_a_launch_step_that_fails_refuses_with_its_reason(workspace: str) -> None:
    profile = make_profile(workspace)
    missing = os.path.join(workspace + "-absent", "tool")
    profile = replace(profile, fs=replace(profile.fs, readonly=(*profile.fs.readonly, missing)))
    with pytest.raises(SandboxError, match=r"cannot launch bubblewrap: firstrun launcher: .*"
                                           r"bind " + missing):
        LinuxBackend().start(profile, proxy=None)


def test_bubblewraps_own_setup_failing_under_capture_is_refused_in_its_words(
        workspace: str, proxy: tuple[object, ProxyEndpoint]) -> None:
    # /usr is bound read-only first, so bubblewrap cannot make this mount point.
    profile = make_profile(workspace)
    profile = replace(profile, fs=replace(profile.fs, hidden=(*profile.fs.hidden,
                                                              "/usr/firstrun-absent-mount")))
    with pytest.raises(SandboxError, match="/usr/firstrun-absent-mount"):
        LinuxBackend().start(profile, proxy=proxy[1])


def test_routes_that_cannot_load_refuse_the_session_while_the_probe_waits_for_them(
        workspace: str, proxy: tuple[object, ProxyEndpoint],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The tables load for real; the route tool fails, as on a host without
    # the routing the capture needs. The refusal is capture's, not the
    # probe's, whose checks were waiting for the route.
    real_tool = capture._tool
    monkeypatch.setattr(capture, "_tool",
                        lambda name: "/bin/false" if name == "ip" else real_tool(name))
    with pytest.raises(SandboxUnavailable, match=r"false (-6 )?route replace default") as refused:
        LinuxBackend().start(make_profile(workspace), proxy=proxy[1])
    assert refused.value.who == "capture"
