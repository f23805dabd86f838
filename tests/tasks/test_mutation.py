"""Mutants of a replay: the pins found in a step, and the mutants made of a run's steps."""

from __future__ import annotations

import pytest

from firstrun.tasks.load import load_tasks
from firstrun.tasks.mutation import RanStep, mutant, mutations, version_pins


@pytest.mark.parametrize(("command", "pins"), [
    ("pip install tabulate==0.9.0", [("==0.9.0", "==99999.0.0")]),
    ("pip install 'a == 1.2' b==2.0rc1", [("== 1.2", "== 99999.0"), ("==2.0rc1", "==99999.0")]),
    ("npm install ms@2.1.3 @scope/pkg@1.0.0-beta.2", [("@2.1.3", "@99999.0.0"),
                                                      ("@1.0.0-beta.2", "@99999.0.0")]),
    ("go install example.com/tool@v1.4.0", [("@v1.4.0", "@v99999.0.0")]),
    # Not pins: a range, an e-mail, a bare major, a comparison.
    ("pip install 'a>=1.0' && git config user.email me@host.example && npm i ms@2 && [ $x == 1 ]", []),
])
def test_version_pins_finds_each_pin_and_only_pins(command: str, pins: list[tuple[str, str]]) -> None:
    assert version_pins(command) == pins


def test_mutations_drop_each_step_and_break_each_pin() -> None:
    steps = [RanStep(command="pip install a==1.0 b==2.0", where="p block 0"),
             RanStep(command="python3 app.py", where="p block 1")]
    names = [m.name for m in mutations("t", steps)]
    assert names == ["t.drop-1", "t.pin-1-1", "t.pin-1-2", "t.drop-2"]


def test_a_mutant_is_the_same_task_under_its_own_name(tmp_path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("name: t\ngoal: g\ndocs: {entrypoint: 'https://d.example/'}\n"
                    "replay: [one, two]\nsuccess: {script: 'test -f done'}\n")
    [task] = load_tasks([str(path)])
    [drop_one, _] = mutations("t", [RanStep(command="one", where="x"), RanStep(command="two", where="y")])
    made = mutant(task, drop_one)
    assert made.name == "t.drop-1" and made.mutation == drop_one
    assert made.sha256 == task.sha256 and made.check == task.check and task.mutation is None
