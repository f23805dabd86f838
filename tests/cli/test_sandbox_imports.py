"""``firstrun sandbox`` imports only what a sandboxed command needs.

Judged by the interpreter's own import log (``-X importtime``) of a real
``firstrun sandbox -- true``: the docs reader (bs4, markdownify, httpx),
TLS interception (cryptography) and the task models (pydantic, yaml) cost
its start about half a second and do nothing for it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from firstrun.sandbox.linux.probe import bwrap_path

NEVER = ("bs4", "markdownify", "httpx", "cryptography", "pydantic", "yaml", "scipy",
         "firstrun.docs", "firstrun.proxy.ca", "firstrun.tasks.model", "firstrun.run.sandbox")


def _imported(args: list[str]) -> set[str]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "firstrun", *args],
                          capture_output=True, text=True, timeout=300, check=False,
                          stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def _offenders(imported: set[str]) -> list[str]:
    return sorted(m for m in imported for top in NEVER if m == top or m.startswith(top + "."))


@pytest.mark.skipif(bwrap_path() is None, reason="needs bubblewrap")
def test_a_sandboxed_true_imports_no_docs_reader_interception_or_task_models() -> None:
    imported = _imported(["sandbox", "--backend", "linux", "--", "true"])
    assert "firstrun.sandbox.linux.backend" in imported  # the log is the real one
    assert _offenders(imported) == []


@pytest.mark.skipif(bwrap_path() is None, reason="needs bubblewrap")
def test_inspect_tls_still_brings_the_interception_code() -> None:
    # The control: the same log does show cryptography when the command needs it.
    imported = _imported(["sandbox", "--backend", "linux", "--inspect-tls", "--", "true"])
    assert "firstrun.proxy.ca" in imported and "cryptography" in imported
