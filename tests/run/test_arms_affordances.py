"""``--affordances all --affordances none`` in one replay sweep: two arms in the matrix,
each a sweep of its own whose identity differs in its affordances alone, and a sweep of
several arms never shares a directory with a sweep of one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIRSTRUN = Path(sys.executable).parent / "firstrun"
CLI_FIXTURES = Path(__file__).resolve().parents[1] / "cli" / "run_fixtures"
TASK = str(CLI_FIXTURES / "tasks" / "greet-pass.yaml")
MIRROR = ("--docs-mirror", f"greeter.docs.example={CLI_FIXTURES / 'docs'}")
ARMS = ("affordances=all", "affordances=none")


def firstrun(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FIRSTRUN), *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300)


def test_affordances_arms_join_the_matrix_each_with_its_own_identity(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = firstrun("run", TASK, *MIRROR, "--affordances", "all", "--affordances", "none",
                    "--backend", "linux", "--out", str(out))
    assert done.returncode == 0, done.stderr
    identities = []
    for arm, shown in zip(ARMS, ("all", "none"), strict=True):
        document = json.loads((out / arm / "results.json").read_text(encoding="utf-8"))
        assert [(r["task"], r["classification"]) for r in document["runs"]] == [("greet-pass", "passed")]
        assert document["meta"]["affordances"] == shown
        identities.append(document["meta"]["sweep"])
    assert identities[0]["affordances"] == "all" and identities[1]["affordances"] == "none"
    assert {k: v for k, v in identities[0].items() if k != "affordances"} == \
        {k: v for k, v in identities[1].items() if k != "affordances"}
    assert "  affordances=all   1/1 (100%" in done.stdout and "  affordances=none  1/1 (100%" in done.stdout
    findings = firstrun("findings", str(out), "--format", "markdown")
    assert findings.returncode == 0 and findings.stdout.startswith("## Arms\n")
    # One arm alone into the same directory, or several into a single sweep's, is refused.
    one = firstrun("run", TASK, *MIRROR, "--backend", "linux", "--out", str(out))
    assert one.returncode == 3 and "holds a sweep of several arms" in one.stderr
    many = firstrun("run", TASK, *MIRROR, "--affordances", "all", "--affordances", "none",
                    "--backend", "linux", "--out", str(out / ARMS[0]))
    assert many.returncode == 3 and "--out:" in many.stderr and "sweep of one arm" in many.stderr
    for refused in (one, many):
        assert len(refused.stderr.strip().splitlines()) == 1
