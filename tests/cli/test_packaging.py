"""The built wheel carries the license, its SPDX expression and the one version the package says.

Its project URLs name the one repository the README and the Actions guide use the Action from.
It requires scipy (and so numpy) in its test extra only: the statistics are the standard library's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from firstrun import __version__

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                    "--disable-pip-version-check", "-w", str(out), str(ROOT)],
                   check=True, timeout=600, capture_output=True)
    [built] = out.glob("firstrun-*.whl")
    return built


def test_the_wheel_carries_the_license_and_the_packages_own_version(wheel: Path) -> None:
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


def test_the_wheels_project_urls_are_the_repository_the_action_is_used_from(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
    urls = dict(line.removeprefix("Project-URL: ").split(", ", 1) for line in metadata.splitlines()
                if line.startswith("Project-URL: "))
    assert set(urls) == {"Homepage", "Documentation", "Repository", "Issues"}
    used = {m for doc in (ROOT / "README.md", ROOT / "docs" / "github-actions.md")
            for m in re.findall(r"uses: ([\w.-]+/firstrun)@", doc.read_text())}
    (repository,) = {f"https://github.com/{name}" for name in used}
    assert urls["Repository"] == urls["Homepage"] == repository
    assert urls["Issues"] == f"{repository}/issues"
    assert urls["Documentation"].startswith(repository)


def test_scipy_and_numpy_are_required_by_the_tests_only(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
    requires = [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines()
                if line.startswith("Requires-Dist: ")]
    assert requires  # the metadata read is the real one
    assert [r for r in requires if r.startswith(("scipy", "numpy"))] == ['scipy>=1.11; extra == "test"']


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


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_the_wheel_alone_runs_a_bundled_example_from_a_clean_venv(wheel: Path, tmp_path: Path) -> None:
    # What a user gets from PyPI: the wheel and its locked dependencies, no
    # test extras, no checkout on sys.path (run from elsewhere, isolated).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", "-c", str(ROOT / "constraints.txt"), str(wheel)],
                   check=True, timeout=900, capture_output=True)
    cli = str(venv / "bin" / "firstrun")
    listed = subprocess.run([cli, "examples"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, check=False)
    assert listed.returncode == 0 and "python-tabulate" in listed.stdout, listed.stderr
    ran = subprocess.run([cli, "run", "--example", "python-tabulate", "--backend", "linux",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=900, cwd=tmp_path, stdin=subprocess.DEVNULL, check=False)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "1/1 (100%" in ran.stdout
