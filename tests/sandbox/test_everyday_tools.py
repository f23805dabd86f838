"""The tools a quickstart's reader types work inside, on the real host's toolchains.

A tool the sandbox broke would be counted as a gap in the docs, so each is
run for real: the host's own cargo (rustup's proxy into ~/.rustup), Python's
venv and pip, npm and git, each offline against local inputs, judged by the
artefact it makes; on linux with the host's tools, on docker with the
default images' (an install step that runs what it unpacked into /tmp, as
installers do, included).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from firstrun.images.build import NODE, PYTHON, image_present
from firstrun.sandbox.base import Session
from firstrun.sandbox.docker.backend import DockerBackend
from firstrun.sandbox.linux.backend import LinuxBackend
from support.profiles import make_profile

LINUX = "linux"


def _start(kind: str) -> Iterator[Session]:
    if kind != LINUX and (os.geteuid() != 0 or shutil.which("docker") is None
                          or not image_present(kind)):
        pytest.skip(f"needs root, a running dockerd and {kind} (scripts/test provides them)")
    workspace = tempfile.mkdtemp(prefix="firstrun-test-tools-")
    backend = LinuxBackend() if kind == LINUX else DockerBackend(image=kind)
    try:
        with backend.start(make_profile(workspace), proxy=None) as s:
            yield s
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


@pytest.fixture(scope="module", params=[LINUX, PYTHON.tag])
def session(request: pytest.FixtureRequest) -> Iterator[Session]:
    yield from _start(request.param)


@pytest.fixture(scope="module", params=[LINUX, NODE.tag])
def node_session(request: pytest.FixtureRequest) -> Iterator[Session]:
    yield from _start(request.param)


@pytest.fixture(scope="module")
def linux_session() -> Iterator[Session]:
    yield from _start(LINUX)


def _run(session: Session, script: str) -> str:
    result = session.exec(["sh", "-ec", script], timeout=300)
    output = result.stdout.text() + result.stderr.text()
    assert result.exit_code == 0, output
    return result.stdout.text()


def test_cargo_from_the_users_home_makes_and_builds_a_crate(linux_session: Session) -> None:
    cargo = shutil.which("cargo")
    home = os.path.expanduser("~")
    if cargo is None or not cargo.startswith(home + "/"):
        pytest.skip("this host has no cargo under a home directory to lend")
    out = _run(linux_session, "cargo new --quiet --offline hello && cd hello && "
                        "cargo build --quiet --offline && ./target/debug/hello")
    assert out == "Hello, world!\n"


_WHEEL = """
import zipfile
files = {
    "greeting/__init__.py": 'WORD = "hi"\\n',
    "greeting-1.0.dist-info/METADATA": "Metadata-Version: 2.1\\nName: greeting\\nVersion: 1.0\\n",
    "greeting-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
}
files["greeting-1.0.dist-info/RECORD"] = "".join(f"{n},,\\n" for n in files) + "greeting-1.0.dist-info/RECORD,,\\n"
with zipfile.ZipFile("greeting-1.0-py3-none-any.whl", "w") as wheel:
    for name, text in files.items():
        wheel.writestr(name, text)
"""


def test_a_venv_and_pip_install_a_local_wheel(session: Session) -> None:
    out = _run(session, f"""
        python3 -m venv venv
        python3 - <<'PY'
{_WHEEL}
PY
        ./venv/bin/pip install --quiet --no-index greeting-1.0-py3-none-any.whl
        cd / && /workspace/venv/bin/python -c 'import greeting; print(greeting.WORD)'
    """)
    assert out == "hi\n"


def test_npm_installs_a_local_package(node_session: Session) -> None:
    if shutil.which("npm") is None:
        pytest.skip("this host has no npm")
    out = _run(node_session, """
        mkdir -p dep app
        echo '{"name": "dep", "version": "1.0.0", "main": "index.js"}' > dep/package.json
        echo 'module.exports = "from dep";' > dep/index.js
        cd app && npm init -y >/dev/null && npm install --offline --no-audit --no-fund --silent ../dep
        node -e 'console.log(require("dep"))'
    """)
    assert out == "from dep\n"


def test_git_makes_a_repository_and_a_commit(session: Session) -> None:
    out = _run(session, """
        git init --quiet repo && cd repo
        echo hello > README && git add README
        git -c user.name=reader -c user.email=reader@example.invalid commit --quiet -m first
        git log --format=%s
    """)
    assert out == "first\n"


def test_an_installer_runs_what_it_unpacked_into_tmp_and_home(session: Session) -> None:
    # rustup-init, nvm and many vendor installers unpack a helper and run it.
    out = _run(session, """
        for dir in "${TMPDIR:-/tmp}" /tmp "$HOME"; do
            printf '#!/bin/sh\\necho ran from %s\\n' "$dir" > "$dir/helper"
            chmod +x "$dir/helper" && "$dir/helper"
        done
    """)
    assert out.count("ran from") == 3, out
