"""A launch that fails says why, in the words of the step that failed, and leaves nothing.

Both ends of the launch are driven to fail for real: a step of the launch
before bubblewrap (staging a source a root harness must stage), and
bubblewrap's own setup after it made the namespaces, while capture's
tables are already loading into them.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from sandbox_support import make_profile

from firstrun.errors import SandboxError
from firstrun.sandbox.base import ProxyEndpoint
from firstrun.sandbox.linux.backend import LinuxBackend
from firstrun.sandbox.linux.probe import bwrap_path

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
