"""The built wheel carries the license, its SPDX expression and the one version the package says."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from firstrun import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_carries_the_license_and_the_packages_own_version(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                    "--disable-pip-version-check", "-w", str(tmp_path), str(ROOT)],
                   check=True, timeout=600, capture_output=True)
    [wheel] = tmp_path.glob("firstrun-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
        license_file = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
        assert archive.read(license_file) == (ROOT / "LICENSE").read_bytes()
    fields = [line.split(": ", 1) for line in metadata.splitlines() if ": " in line]
    assert ["Version", __version__] in fields
    assert ["License-Expression", "Apache-2.0"] in fields
    assert any(key == "Classifier" for key, _ in fields)


def test_the_installed_set_is_the_locked_set() -> None:
    # scripts/install installs through constraints.txt; a drifted install would
    # test another set than the one CI, the Action and users get.
    from importlib import metadata

    pins = [line.split("==", 1) for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert pins and all(len(pin) == 2 for pin in pins)
    drifted = [(name, locked, metadata.version(name)) for name, locked in pins
               if metadata.version(name) != locked]
    assert drifted == []
