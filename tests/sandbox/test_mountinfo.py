"""What the sandbox's mount table tells a command about the host's layout, read from inside.

A bind mount's entry in ``/proc/self/mountinfo`` names its source's path
within the source filesystem, so a workspace bound from the host's disk
shows the host's path to it, whatever staging it went through. A workspace
firstrun makes is a filesystem of its own, so its entry names only a loop
device and ``/``. The evidence is the table a command inside reads.
"""

from __future__ import annotations

import os

import pytest
from sandbox_support import start_session

from firstrun.sandbox.disk import MIB, SizedWorkspace
from support.profiles import make_profile

pytestmark = [pytest.mark.escape,
              pytest.mark.skipif(os.geteuid() != 0, reason="a sized workspace needs root")]


@pytest.mark.parametrize("kind", ["linux", "docker", "gvisor", "microvm"])
def test_the_mount_table_inside_names_no_host_path_of_a_workspace_firstrun_made(kind: str) -> None:
    with SizedWorkspace(32 * MIB) as sized:
        top = os.path.dirname(sized.path)
        for session in start_session(kind, make_profile(sized.path)):
            done = session.exec(["cat", "/proc/self/mountinfo"], timeout=120)
            table = done.stdout.text()
        assert done.exit_code == 0 and "/workspace" in table
        assert os.path.basename(top) not in table and sized.path not in table
