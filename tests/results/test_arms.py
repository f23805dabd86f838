"""A sweep's arms: every combination of the values given, named by what varies, refused
in one line naming the flag when two would be one, and read back only as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from firstrun.errors import UsageError
from firstrun.results.arms import ARMS_FILE, Arm, read_arms, sweep_arms, write_arms


def test_one_value_each_is_one_arm_with_no_name() -> None:
    assert sweep_arms((), (), ()) == (Arm(name="", agent="replay", model=None, affordances="all"),)
    (arm,) = sweep_arms(("openai",), ("m",), ("none",))
    assert (arm.name, arm.agent, arm.model, arm.affordances) == ("", "openai", "m", "none")


def test_arms_are_the_product_in_the_order_given_named_by_what_varies() -> None:
    arms = sweep_arms(("openai",), ("b", "a"), ("all", "none"))
    assert [(a.model, a.affordances) for a in arms] == [
        ("b", "all"), ("b", "none"), ("a", "all"), ("a", "none")]
    assert [a.name for a in arms] == ["b+affordances=all", "b+affordances=none",
                                      "a+affordances=all", "a+affordances=none"]
    assert [a.name for a in sweep_arms(("claude", "openai"), (), ())] == ["claude", "openai"]


def test_a_name_is_one_safe_directory_name() -> None:
    arms = sweep_arms(("openai",), ("org/model:7b", "..hidden"), ())
    assert [a.name for a in arms] == ["org-model-7b", "hidden"]
    # One value names no arm, so any model name the agent takes will do.
    assert sweep_arms(("openai",), ("...",), ())[0].model == "..."


@pytest.mark.parametrize(("agents", "models", "affordances", "flag"), [
    (("openai", "openai"), ("m",), (), "--agent: 'openai' is given twice"),
    (("openai",), ("m", "n", "m"), (), "--model: 'm' is given twice"),
    ((), (), ("none", "none"), "--affordances: 'none' is given twice"),
    (("openai",), ("org/m", "org:m"), (), "--model: the values 'org/m' and 'org:m' would share"),
    (("openai",), ("m", "..."), (), "--model: '...' has no letter or digit"),
])
def test_values_that_would_make_one_arm_twice_are_refused_naming_the_flag(
        agents: tuple[str, ...], models: tuple[str, ...], affordances: tuple[str, ...],
        flag: str) -> None:
    with pytest.raises(UsageError) as caught:
        sweep_arms(agents, models, affordances)
    assert caught.value.args[0].startswith(flag) and "\n" not in caught.value.args[0]


def test_the_arms_file_reads_back_as_written(tmp_path: Path) -> None:
    arms = sweep_arms(("openai",), ("a", "b"), ())
    assert read_arms(tmp_path, label="RESULTS_DIR") is None
    write_arms(tmp_path, arms)
    assert read_arms(tmp_path, label="RESULTS_DIR") == arms


@pytest.mark.parametrize("text", [
    "not json", '{"schema_version": 9, "arms": []}', '{"schema_version": 1}',
    '{"schema_version": 1, "arms": [{"name": "a"}]}',
    '{"schema_version": 1, "arms": [{"name": "../x", "agent": "a", "model": null, "affordances": "all"}]}',
])
def test_an_arms_file_this_version_cannot_read_is_one_line_naming_the_argument(
        tmp_path: Path, text: str) -> None:
    (tmp_path / ARMS_FILE).write_text(text, encoding="utf-8")
    with pytest.raises(UsageError) as caught:
        read_arms(tmp_path, label="RESULTS_DIR")
    assert caught.value.args[0].startswith("RESULTS_DIR: ") and "\n" not in caught.value.args[0]
