"""A run image whose Python is not the harness's, for real: Debian 13's Python 3.13.

The harness binds its own proxy modules into the sidecar, which runs the
image's python3. Without --inspect-tls nothing compiled is loaded, so a
3.13 image serves a 3.11 harness: the helper, the probe and the sidecar
all run on 3.13, and the session attests. With --inspect-tls the sidecar
would need the harness's cffi backend, built for 3.11: it refuses in one
line before loading it. The image is built by firstrun's own images
module (debootstrap of trixie; the root tarball is cached like the default
images') and removed afterwards.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from firstrun.errors import SandboxUnavailable
from firstrun.images.build import ImageRecipe, build_images
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import NetworkPolicy
from firstrun.sandbox.base import OwnProxy
from firstrun.sandbox.docker.backend import DockerBackend
from firstrun.sandbox.docker.resources import docker
from support.profiles import make_profile

pytestmark = pytest.mark.usefixtures("docker_ready")

TRIXIE = ImageRecipe(key="test-python313", tag="firstrun-test/python:3.13", suite="trixie",
                     packages=("ca-certificates", "curl", "bash", "coreutils", "procps",
                               "python3"))


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    build_images((TRIXIE,))
    try:
        yield TRIXIE.tag
    finally:
        docker("image", "rm", "--force", TRIXIE.tag)



def test_a_plain_session_on_another_python_attests_and_runs(image: str, workspace: str) -> None:
    assert sys.version_info[:2] != (3, 13)  # otherwise this proves nothing
    profile = make_profile(workspace, net=NetworkPolicy.build(allow=["pypi.org"]))
    with DockerBackend(image=image).start(profile, proxy=OwnProxy()) as session:
        # proxy_answers among them: the sidecar on 3.13 serves the nonce.
        assert {c.name for c in session.info.attestation if c.passed} >= {
            "proxy_answers", "supervisor_out_of_reach", "host_canary_saw_nothing"}
        assert all(c.passed for c in session.info.attestation)
        result = session.exec(["python3", "-c", "import sys; print(sys.version_info[:2])"])
        assert result.stdout.text().strip() == "(3, 13)"


def test_inspection_on_another_python_is_refused_in_one_line(image: str, workspace: str) -> None:
    before = set(docker("ps", "--all", "--filter", "label=org.firstrun.managed=1",
                        "--format", "{{.Names}}").stdout.split())
    profile = make_profile(
        workspace, net=NetworkPolicy.build(allow=["pypi.org"]).with_inspection(InspectionPolicy.build()))
    with pytest.raises(SandboxUnavailable) as refused:
        DockerBackend(image=image).start(profile, proxy=OwnProxy())
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert str(refused.value).endswith(
        f"the image's Python is 3.13, and the proxy sidecar cannot load the harness's "
        f"cryptography, built for Python {here}")
    assert "\n" not in str(refused.value)
    assert refused.value.fix is not None and f"image whose python3 is {here}" in refused.value.fix
    after = set(docker("ps", "--all", "--filter", "label=org.firstrun.managed=1",
                       "--format", "{{.Names}}").stdout.split())
    assert after <= before
