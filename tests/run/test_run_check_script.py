"""The generated check is pinned as text, is valid bash, and never carries a task's secrets wrong.

Regenerate the golden files after an intended change with
``FIRSTRUN_UPDATE_GOLDEN=1 .venv/bin/pytest tests/run/test_run_check_script.py``
and review the diff.
"""

from __future__ import annotations

import os
import subprocess
import zlib
from pathlib import Path

import pytest

from firstrun.run.check import TRUSTED_PATH, build_check_script, check_port, prelude
from firstrun.tasks.load import load_task

pytestmark = pytest.mark.fast

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"
GOLDEN = Path(__file__).parent / "golden"
VALID = Path(__file__).parents[1] / "fixtures" / "tasks" / "valid"


@pytest.mark.parametrize("name", ["serve-declared", "check-file", "expect-output"])
def test_check_script_golden(name: str) -> None:
    # The check's PATH and the prelude are the same for every task and are
    # checked verbatim below; the golden files pin what differs per task, so
    # a prelude change does not rewrite every one of them.
    script = build_check_script(load_task(FIXTURES / f"{name}.yaml"), port=21234)
    head = TRUSTED_PATH + "\nQS_PORT=21234\n" + prelude().rstrip("\n") + "\n"
    assert script.startswith(head)
    criteria = script[len(head):]
    golden = GOLDEN / f"{name}.sh"
    if os.environ.get("FIRSTRUN_UPDATE_GOLDEN"):
        golden.write_text(criteria, encoding="utf-8")
    assert criteria == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", sorted([*FIXTURES.glob("*.yaml"), *VALID.glob("*.yaml")]),
                         ids=lambda p: p.name)
def test_every_check_is_valid_bash(path: Path) -> None:
    script = build_check_script(load_task(path), port=check_port("x"))
    parsed = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert parsed.returncode == 0, parsed.stderr


def test_port_is_quickstarted_s_stable_port() -> None:
    # 21000 + crc32(name) % 20000, as quickstarted chose it.
    for name in ("a", "fastapi-quickstart", "greeter-pass"):
        assert check_port(name) == 21000 + zlib.crc32(name.encode()) % 20000
        assert 21000 <= check_port(name) < 41000


def test_json_pairs_are_written_as_json_spells_them() -> None:
    script = build_check_script(load_task(FIXTURES / "serve-declared.yaml"), port=1)
    assert "--json ready=true" in script
    assert "--json count=42" in script
    assert "--json 'greeting=hello, reader'" in script
    assert "True" not in script


def test_the_task_script_runs_after_the_declared_criteria_in_a_subshell() -> None:
    task = load_task(VALID / "serve-wait-http.yaml")
    script = build_check_script(task, port=1)
    serve = script.index("qs_serve .venv/bin/itemapi serve")
    wait = script.index("qs_wait_http /items/42")
    own = script.index("(\ntest -f app.py\n)")
    assert serve < wait < own
