"""Rendering a page in a real headless Chromium with no network, and reading its screenshot.

Chromium runs inside a fresh network namespace (only a downed loopback), so
the page renders with no network to load anything from, and inside a fresh
pid namespace whose processes all die with it, so no browser process
outlives a test. Console output is read from ``--enable-logging=stderr``;
lines whose source is one of Chromium's own ``chrome://`` pages (its
headless shell logs from them, for example a "slow network" notice about
its own fonts when there is no network) are not the page's and are left out.
A Chromium that cannot start fails the test with its reason; nothing is
skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from firstrun.reports.html import FINDING_COLOUR, PLOT_COLOUR

WINDOW = (1280, 1400)
_BROWSER_OWN = re.compile(r'", source: chrome://\S+ \(\d+\)$')


def _chromium_argv(profile: Path, screenshot: Path, url: str) -> list[str]:
    chromium, unshare = shutil.which("chromium"), shutil.which("unshare")
    if chromium is None:
        pytest.fail("chromium is not installed: run scripts/install --with-test-deps")
    if unshare is None:
        pytest.fail("unshare (util-linux) is not installed: run scripts/install")
    return [
        unshare, "--net", "--pid", "--fork", "--kill-child", "--map-root-user",
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
        f"--screenshot={screenshot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", url,
    ]


def render(page: Path, tmp_path: Path) -> tuple[Image.Image, list[str]]:
    """Screenshot ``page`` and return it with every console line Chromium logged."""
    shot = tmp_path / f"{page.stem}.png"
    profile = tmp_path / f"{page.stem}-profile"
    proc = subprocess.Popen(_chromium_argv(profile, shot, page.as_uri()), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"chromium did not finish rendering {page} in 120 s; stderr ends: {stderr[-2000:]}")
    if proc.returncode != 0 or not shot.is_file():
        pytest.fail(f"chromium could not render {page} (exit {proc.returncode}); stderr ends: {stderr[-2000:]}")
    console = [line for line in stderr.splitlines()
               if ":CONSOLE" in line and not _BROWSER_OWN.search(line)]
    image = Image.open(shot).convert("RGB")
    image.load()
    return image, console


def _hex(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def plot_pixels(image: Image.Image) -> int:
    target = _hex(PLOT_COLOUR)
    return sum(n for n, rgb in image.getcolors(maxcolors=image.width * image.height)
               if all(abs(a - b) <= 6 for a, b in zip(rgb, target, strict=True)))


def top_row(image: Image.Image, colour: str = PLOT_COLOUR) -> int | None:
    """The first row (from the top) holding a pixel of ``colour``; None when none does."""
    target = _hex(colour)
    pixels = image.load()
    for y in range(image.height):
        if any(all(abs(a - b) <= 6 for a, b in zip(pixels[x, y], target, strict=True))
               for x in range(image.width)):
            return y
    return None


def finding_pixels(image: Image.Image) -> int:
    target = _hex(FINDING_COLOUR)
    return sum(n for n, rgb in image.getcolors(maxcolors=image.width * image.height)
               if all(abs(a - b) <= 6 for a, b in zip(rgb, target, strict=True)))
