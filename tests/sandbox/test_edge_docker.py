"""Odd commands on the docker backend: what the kernel takes runs, as on linux.

The command used to travel to the in-container supervisor as one argument of
``docker exec``, where 128 KiB is the most one argument may hold: an argv of
100,000 words or a large environment ended the command as a sandbox failure
before anything ran. It travels on the supervisor's stdin now.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from firstrun.errors import SandboxError
from firstrun.images.build import image_present
from firstrun.sandbox.docker.backend import DockerBackend, DockerSession
from support.profiles import make_profile

IMAGE = "firstrun/python:3.11"


@pytest.fixture(scope="module")
def session() -> Iterator[DockerSession]:
    if os.geteuid() != 0 or shutil.which("docker") is None or not image_present(IMAGE):
        pytest.skip(f"needs root, a running dockerd and {IMAGE} (scripts/test provides them)")
    workspace = tempfile.mkdtemp(prefix="firstrun-test-edge-docker-")
    profile = make_profile(workspace)
    try:
        with DockerBackend(image=IMAGE).start(profile, proxy=None) as s:
            yield s
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def test_an_argv_of_a_hundred_thousand_words_runs(session: DockerSession) -> None:
    many = session.exec(["/bin/sh", "-c", 'echo "$#"', "sh", *(["a"] * 100_000)])
    assert (many.exit_code, many.stdout.text()) == (0, "100000\n")


def test_an_environment_past_one_arguments_limit_runs(session: DockerSession) -> None:
    env = {f"V{i}": "x" * 50_000 for i in range(4)}
    result = session.exec('printf %s "$V3" | wc -c', env=env)
    assert (result.exit_code, result.stdout.text().strip()) == (0, "50000")


def test_an_argument_the_kernel_refuses_is_a_failed_command(session: DockerSession) -> None:
    huge = session.exec(["/bin/echo", "x" * 1_000_000])
    assert huge.exit_code == 127 and "Argument list too long" in huge.stderr.text()
    after = session.exec("echo alive")
    assert (after.exit_code, after.stdout.text()) == (0, "alive\n")


def test_an_entry_that_cannot_be_lent_refuses_the_start_in_one_line(
        session: DockerSession) -> None:
    # Not a traceback from the middle of start: the lend undoes itself and says what stopped it.
    workspace = tempfile.mkdtemp(prefix="firstrun-test-edge-docker-frozen-")
    frozen = os.path.join(workspace, "z")
    with open(frozen, "w") as f:
        f.write("x")
    try:
        if subprocess.run(["chattr", "+i", frozen], capture_output=True).returncode != 0:
            pytest.skip("needs chattr(1) on a filesystem with the immutable flag")
        profile = make_profile(workspace)
        with pytest.raises(SandboxError) as caught:
            DockerBackend(image=IMAGE).start(profile, proxy=None)
        assert caught.value.who == "docker" and "\n" not in str(caught.value)
        assert f"cannot lend the workspace to the sandbox uid: {frozen}" in str(caught.value)
        assert os.stat(workspace).st_uid == 0
    finally:
        subprocess.run(["chattr", "-i", frozen], capture_output=True)
        shutil.rmtree(workspace, ignore_errors=True)
