"""The bundled python-tabulate quickstart, replayed inside a micro-VM: docs, PyPI through the proxy, the check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from microvm_support import ACCEL

pytestmark = pytest.mark.e2e

FIRSTRUN = Path(sys.executable).parent / "firstrun"
EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "firstrun" / "examples" / "python-tabulate"


def _example(tmp_path: Path) -> Path:
    """The bundled example's task, with a time budget for the guest's speed (its docs are
    served from its own directory, as ``--example`` would).

    Its 300 s are for a reader's machine; under TCG every instruction is
    emulated, and its venv and pip install took from 3 to over 5 minutes
    here, varying with the host's load. What this test proves is the path
    (docs, PyPI through the proxy, the check), not the budget.
    """
    task_dir = tmp_path / "python-tabulate"
    shutil.copytree(EXAMPLE, task_dir)
    task = task_dir / "task.yaml"
    if ACCEL == "tcg":
        text = task.read_text(encoding="utf-8")
        assert "  max_seconds: 300\n" in text
        task.write_text(text.replace("  max_seconds: 300\n", "  max_seconds: 900\n"),
                        encoding="utf-8")
    return task


@pytest.mark.timeout(1200)
def test_python_tabulate_replay_passes_on_microvm(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [str(FIRSTRUN), "run", str(task := _example(tmp_path)), "--agent", "replay",
         "--docs-mirror", f"python-tabulate.docs.example={task.parent / 'docs'}",
         "--backend", "microvm", "--out", str(out)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1100,
        env={**os.environ, "FIRSTRUN_MICROVM_ACCEL": ACCEL}, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = json.loads((out / "results.json").read_text(encoding="utf-8"))["runs"]
    assert (run["classification"], run["check_exit"]) == ("passed", 0)
    assert run["backend"] == "microvm" and run["enforcement"] == "enforced"
    assert run["attestation"] and all(a["passed"] for a in run["attestation"])
    assert run["blocked_egress"] == []
    trace = [json.loads(line) for line in
             (out / run["trace"]).read_text(encoding="utf-8").splitlines() if line]
    shell = [e["record"] for e in trace if e.get("kind") == "egress"
             and e["record"]["channel"] == "shell" and e["record"]["reason"] != "attestation"]
    # The install reached the real registry, and only through the proxy's records.
    assert {r["host"] for r in shell} == {"pypi.org", "files.pythonhosted.org"}
    assert all(r["decision"] == "allow" for r in shell)
