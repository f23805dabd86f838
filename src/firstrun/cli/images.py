"""``firstrun images build``: the default images, built locally from Debian packages.

Guarantee: builds only what is missing (an image already in the daemon is
left alone; a cached root filesystem is imported without a new debootstrap),
prints one line per step on stderr, and exits 0 only when every image asked
for is present afterwards. With neither ``--python`` nor ``--node``, both
(unless only ``--microvm`` was asked for, which builds the micro-VM's boot
files alone).
"""

from __future__ import annotations

import argparse
import sys

from firstrun.images.build import NODE, PYTHON, RECIPES, build_images, default_cache_dir


def add_images_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    images = sub.add_parser(
        "images", help="build the default container images locally (no registry needed)",
        description="Container images for the docker backend.", allow_abbrev=False)
    actions = images.add_subparsers(dest="images_action", required=True, metavar="ACTION")
    build = actions.add_parser(
        "build", allow_abbrev=False,
        help=f"build {PYTHON.tag} and {NODE.tag} with debootstrap + docker import",
        description=f"Build {PYTHON.tag} (Debian bookworm's Python 3.11, venv, pip) and "
        f"{NODE.tag} (Node.js 24 LTS, npm and corepack, from the npm registry's pinned "
        "packages) from Debian packages with debootstrap, both with the shared libraries "
        "prebuilt binaries expect, and load them with docker import. The root filesystem is cached; "
        "an image already present is left alone. Needs root, debootstrap and a docker daemon.")
    build.add_argument("--python", action="store_true", help=f"build {PYTHON.tag}")
    build.add_argument("--node", action="store_true", help=f"build {NODE.tag}")
    build.add_argument("--microvm", action="store_true",
                       help="build the microvm backend's kernel, initramfs and root tree "
                            "(from Debian's installed kernel and the python root filesystem)")
    build.add_argument("--cache-dir", metavar="DIR",
                       help=f"where root filesystems are cached (default: {default_cache_dir()})")


def images_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    chosen = tuple(r for r in RECIPES if getattr(args, r.key))
    cache_dir = Path(args.cache_dir) if args.cache_dir else None

    def log(line: str) -> None:
        print(f"firstrun images: {line}", file=sys.stderr, flush=True)

    if chosen or not args.microvm:
        build_images(chosen or RECIPES, cache_dir=cache_dir, log=log)
    if args.microvm:
        from firstrun.sandbox.microvm.image import build_image

        build_image(cache_dir=cache_dir, log=log)
    return 0
