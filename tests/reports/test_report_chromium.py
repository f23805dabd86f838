"""The HTML report in a real headless Chromium (Debian's ``chromium``), with no network at all.

Chromium runs inside a fresh network namespace (only a downed loopback), so
the page renders with no network to load anything from, and inside a fresh
pid namespace whose processes all die with it, so no browser process
outlives a test. Console output is read from ``--enable-logging=stderr``:
the page runs no script, so it must log nothing at all; a control page that
does log proves the scan sees console lines here. The screenshot is judged
by its pixels: the plot's colour is used by nothing else on the page, and a
control report with no plot shows none of it. A Chromium that cannot start
fails the test with its reason; nothing is skipped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from PIL import Image
from report_support import HOSTILE, record, runs, write_results

from firstrun.reports.html import PLOT_COLOUR, write_html
from firstrun.reports.load import load_saved
from firstrun.results.model import Classification

WINDOW = (1280, 1400)


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
    console = [line for line in stderr.splitlines() if ":CONSOLE" in line]
    image = Image.open(shot).convert("RGB")
    image.load()
    return image, console


def _hex(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def plot_pixels(image: Image.Image) -> int:
    target = _hex(PLOT_COLOUR)
    return sum(n for n, rgb in image.getcolors(maxcolors=image.width * image.height)
               if all(abs(a - b) <= 6 for a, b in zip(rgb, target, strict=True)))


def test_console_scan_sees_a_page_that_logs(tmp_path: Path) -> None:
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"><title>c</title></head>'
                       '<body><p>control</p><script>console.error("control-error")</script></body></html>')
    _, console = render(control, tmp_path)
    assert any("control-error" in line for line in console), console


def test_report_renders_without_console_errors_and_shows_the_plot(tmp_path: Path) -> None:
    records = [
        *runs("python-quickstart", 3, 1),
        record(HOSTILE, 1, Classification.DOCS_GAP, detail=HOSTILE,
               blocked_egress=({"host": HOSTILE, "port": 443, "reason": "not_allowed", "channel": "shell"},)),
        record(HOSTILE, 2, Classification.INFRA_ERROR),
    ]
    out = write_results(tmp_path / "res", records)
    page = tmp_path / "report.html"
    write_html(page, load_saved(out, label="RESULTS_DIR"))
    image, console = render(page, tmp_path)
    # The page runs no script and loads nothing: a CSP refusal, an injected
    # script's output or a failed load would each be a console line.
    assert console == []
    assert image.size == WINDOW
    lo, hi = zip(*image.getextrema(), strict=True)
    assert max(hi) - min(lo) > 100, "the screenshot is blank"
    # Two plots (a point and an interval bar each) are in the first screenful.
    assert plot_pixels(image) > 200


def test_a_report_without_evidence_draws_no_plot_colour(tmp_path: Path) -> None:
    out = write_results(tmp_path / "res", [record("t", 1, Classification.INFRA_ERROR)])
    page = tmp_path / "none.html"
    write_html(page, load_saved(out, label="RESULTS_DIR"))
    image, console = render(page, tmp_path)
    assert console == []
    assert plot_pixels(image) == 0
