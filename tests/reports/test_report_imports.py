"""The statistics and every command that reports them import neither scipy nor numpy.

Judged in a fresh interpreter each time: by its own import log
(``-X importtime``) of a real ``firstrun diff`` and ``firstrun report`` of
saved results, and by ``sys.modules`` once every module of the CLI, the
reports and the results is imported.
scipy and numpy are 216 MB of a 291 MB install and over a second to import,
for two functions the standard library computes; they are test dependencies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from report_support import runs, write_results

pytestmark = pytest.mark.fast

NEVER = ("scipy", "numpy")

EVERY_MODULE = """
import importlib, pkgutil, sys
import firstrun.cli, firstrun.reports, firstrun.results
for package in (firstrun.cli, firstrun.reports, firstrun.results):
    for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
print("\\n".join(sys.modules))
"""


def _python(args: list[str], *, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          check=False, stdin=subprocess.DEVNULL, cwd=cwd,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _imported(args: list[str], *, cwd: Path) -> set[str]:
    log = _python(["-X", "importtime", "-m", "firstrun", *args], cwd=cwd).stderr
    return {line.rsplit("|", 1)[1].strip() for line in log.splitlines()
            if line.startswith("import time:") and "|" in line}


def _offenders(imported: set[str]) -> list[str]:
    return sorted(m for m in imported for top in NEVER if m == top or m.startswith(top + "."))


def test_diff_and_report_import_neither_scipy_nor_numpy(tmp_path: Path) -> None:
    # Fisher's convictions table, so diff computes a p and report an interval.
    before = str(write_results(tmp_path / "before", runs("quick", 10, 3)))
    after = str(write_results(tmp_path / "after", runs("quick", 2, 15)))
    diffed = _imported(["diff", before, after], cwd=tmp_path)
    reported = _imported(["report", before, "--out", str(tmp_path / "r.html"),
                          "--markdown", str(tmp_path / "r.md")], cwd=tmp_path)
    for imported in (diffed, reported):
        assert "firstrun.results.stats" in imported  # the log is the real one
        assert _offenders(imported) == []
    assert "firstrun.reports.html" in reported and "firstrun.reports.markdown" in reported


def test_no_module_of_the_cli_reports_or_results_imports_scipy_or_numpy(tmp_path: Path) -> None:
    loaded = set(_python(["-c", EVERY_MODULE], cwd=tmp_path).stdout.split())
    assert {"firstrun.results.stats", "firstrun.cli.report", "firstrun.cli.run"} <= loaded
    assert _offenders(loaded) == []
