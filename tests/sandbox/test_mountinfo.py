"""What the sandbox's mount table tells a command about the host's layout, read from inside.

A bind mount's entry in ``/proc/self/mountinfo`` names its source's path
within the source filesystem, so a workspace bound from the host's disk
shows the host's path to it, whatever staging it went through. A workspace
firstrun makes is a filesystem of its own, so its entry names only a loop
device and ``/``. The evidence is the table a command inside reads.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from sandbox_support import make_profile

from firstrun.images.build import PYTHON, image_present
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.base import Session
from firstrun.sandbox.disk import MIB, SizedWorkspace
from firstrun.sandbox.linux.backend import LinuxBackend

pytestmark = [pytest.mark.escape,
              pytest.mark.skipif(os.geteuid() != 0, reason="a sized workspace needs root")]


def _start(kind: str, profile: SandboxProfile) -> Iterator[Session]:
    if kind == "docker":
        if shutil.which("docker") is None or not image_present(PYTHON.tag):
            pytest.skip("needs a running dockerd and the default image")
        from firstrun.sandbox.docker.backend import DockerBackend
        backend: object = DockerBackend(image=PYTHON.tag)
    elif kind == "microvm":
        from firstrun.sandbox.microvm.backend import MicrovmBackend
        from firstrun.sandbox.microvm.image import find_image
        from firstrun.sandbox.microvm.probe import kvm
        if find_image() is None:
            pytest.skip("the micro-VM image is not built (scripts/test builds it)")
        backend = MicrovmBackend(accel="kvm" if kvm().available else "tcg")
    else:
        backend = LinuxBackend()
    with backend.start(profile, proxy=None) as session:  # type: ignore[attr-defined]
        yield session


@pytest.mark.parametrize("kind", ["linux", "docker", "microvm"])
def test_the_mount_table_inside_names_no_host_path_of_a_workspace_firstrun_made(kind: str) -> None:
    with SizedWorkspace(32 * MIB) as sized:
        top = os.path.dirname(sized.path)
        for session in _start(kind, make_profile(sized.path)):
            done = session.exec(["cat", "/proc/self/mountinfo"], timeout=120)
            table = done.stdout.text()
        assert done.exit_code == 0 and "/workspace" in table
        assert os.path.basename(top) not in table and sized.path not in table
