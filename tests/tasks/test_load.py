from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from firstrun.errors import TaskError, UsageError
from firstrun.tasks.load import expand_task_paths, load_task, load_tasks, read_task
from firstrun.tasks.model import DocsReplay, ReplayStep

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"
VALID = FIXTURES / "valid"
INVALID = FIXTURES / "invalid"

VALID_FILES = sorted(VALID.glob("*.yaml"))

# file -> (line, detail): the whole of the one line a user sees after "file:".
INVALID_EXPECTED = {
    "typo-top-level.yaml": (5, "unknown key 'sucess'; did you mean 'success'?"),
    "typo-nested.yaml": (9, "unknown key 'max_secods' in budgets; did you mean 'max_seconds'?"),
    "wrong-type.yaml": (8, "budgets.max_turns: expected an integer, got 'lots'"),
    "disk-too-small.yaml": (9, "budgets.max_disk_mb: must be 0 (no bound) or at least 16 MiB, got 8"),
    "setup-not-a-list.yaml": (5, "setup: expected a list, got 'python3 -m venv .venv'"),
    "bad-yaml.yaml": (
        5,
        "invalid YAML: expected <block end>, but found '<block mapping start>' "
        "(while parsing a block mapping at line 1)",
    ),
    "missing-check-file.yaml": (
        6,
        "success.file 'checks/not-there.sh' does not exist "
        f"(looked for {INVALID / 'checks' / 'not-there.sh'})",
    ),
    "wildcard-com.yaml": (
        8,
        "network.allow[1]: pattern '*.com' covers a whole public suffix; "
        "name the registrable domain",
    ),
    "duplicate-key.yaml": (7, "duplicate key 'script' (first at line 6)"),
    "script-and-file.yaml": (7, "success.file: 'script' and 'file' are both given; use one"),
    "empty-pattern.yaml": (
        9,
        "success.expect_output.contains[1]: an empty pattern matches anything, "
        "so it asserts nothing",
    ),
    "multiline-pattern.yaml": (
        7,
        "success.expect_output.contains: a pattern spans several lines, which grep reads "
        "as alternatives; list each line separately",
    ),
    "path-and-entrypoint.yaml": (
        4,
        "docs.entrypoint: 'path' and 'entrypoint' are both given; put the entrypoint "
        "first in 'path'",
    ),
    "empty-wait-http.yaml": (7, "success.wait_http: empty; give it something to assert"),
    "name-with-slash.yaml": (
        1,
        "name: a task name may hold letters, digits, '.', '_' and '-' and starts with a "
        "letter or digit (it names output directories), got '../escape'",
    ),
    "missing-goal.yaml": (1, "missing required key 'goal'"),
    "not-http.yaml": (
        6,
        "docs.path[1]: must be an http(s) URL, got 'ftp://docs.example.org/files/'",
    ),
    "empty.yaml": (1, "the file is empty; a task needs name, goal, docs and success"),
    "image-as-option.yaml": (
        5,
        "image: '--privileged' is not an image reference (NAME[:TAG][@DIGEST], a lowercase "
        "name such as python:3.11-slim or registry.example:5000/team/tool:1.2)",
    ),
    "replay-word.yaml": (
        5,
        "replay: expected 'docs', a mapping {from: docs, values, skip} or a list of steps, got 'doc'",
    ),
    "replay-docs-typo.yaml": (7, "unknown key 'valeus' in replay; did you mean 'values'?"),
    "replay-skip-off-route.yaml": (
        6, "replay: replay.skip names https://docs.example.org/other, which is not a page of docs.path"),
    "replay-step-blank-mark.yaml": (8, "replay[1].undocumented: must not be empty"),
    "top-level-list.yaml": (
        1,
        "the top level must be a mapping of keys (name, goal, docs, success, ...)",
    ),
}


def test_every_invalid_fixture_has_an_expected_error() -> None:
    assert {p.name for p in INVALID.glob("*.yaml")} == set(INVALID_EXPECTED)


@pytest.mark.parametrize("name", sorted(INVALID_EXPECTED))
def test_invalid_file_gives_exactly_one_located_line(name: str) -> None:
    path = INVALID / name
    with pytest.raises(TaskError) as caught:
        read_task(path)
    line, detail = INVALID_EXPECTED[name]
    err = caught.value
    assert (err.path, err.line, err.detail) == (str(path), line, detail)
    assert err.args[0] == f"{path}:{line}: {detail}"
    assert "\n" not in str(err)
    assert isinstance(err, UsageError)
    # Converted at the boundary: nothing from PyYAML or pydantic rides along.
    assert err.__cause__ is None
    assert err.__context__ is None or err.__suppress_context__


@pytest.mark.parametrize("path", VALID_FILES, ids=lambda p: p.name)
def test_every_valid_fixture_loads(path: Path) -> None:
    task = load_task(path)
    assert task.path == str(path)
    assert task.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert task.docs_route


def test_the_fixtures_cover_quickstarted_schema() -> None:
    tasks = {t.name: t for t in load_tasks([VALID])}
    python = tasks["tinyjson-quickstart"].spec
    assert python.docs.path and len(python.docs.path) == 2 and python.docs.entrypoint is None
    assert python.setup == ("python3 -m venv .venv",)
    node = tasks["leftpad-node-quickstart"].spec
    assert node.image == "node:22-slim"
    assert node.docs.entrypoint and node.docs.path is None
    assert node.budgets.max_tokens == 200_000 and node.budgets.max_command_seconds == 300
    assert node.network.allow == ("binaries.leftpad.example.net",)
    served = tasks["itemapi-serve"].spec.success
    assert served.serve and served.wait_http is not None
    assert served.wait_http.path == "/items/42" and served.wait_http.timeout == 60
    assert served.wait_http.contains == ("item",)
    assert served.wait_http.json_pairs == (("item_id", 42), ("name", "widget"))
    expect = tasks["sumtool-expect-output"].spec
    assert expect.success.expect_output is not None
    assert expect.success.expect_output.contains == ("35.75",)
    assert expect.success.script is None and expect.success.file is None
    assert expect.network.only == ("pypi.org", "files.pythonhosted.org")
    assert tasks["webframe-check-file"].spec.success.file == "checks/webframe.sh"


def test_defaults_are_quickstarted_budgets_and_nothing_extra(write_task) -> None:
    task = read_task(
        write_task("""
        name: minimal
        goal: g
        docs: {entrypoint: https://docs.example.org/}
        success: {script: test -f a}
    """)
    )
    b = task.spec.budgets
    assert (
        b.max_turns,
        b.max_seconds,
        b.max_command_seconds,
        b.max_output_chars,
        b.max_tokens,
        b.max_disk_mb,
        b.disk_asked,
    ) == (
        20,
        480,
        300,
        20_000,
        0,
        4096,
        False,
    )
    assert task.spec.setup == () and task.spec.replay == () and task.spec.image is None
    assert task.spec.network.allow == () and task.spec.network.only is None
    assert task.spec.firstrun.network.overrides == ()


def test_quickstarted_leniencies_mean_what_they_meant(write_task) -> None:
    """Nulls are absent, blank scripts are absent, numbers are strings, commands are trimmed."""
    task = read_task(
        write_task("""
        name: 2048
        goal: g
        image: ""
        docs:
          entrypoint: https://docs.example.org/
          allow:
          - https://Other.Example.org/some/page
        network:
        budgets:
          max_turns: "12"
        setup:
          - "  python3 -m venv .venv  "
          - ""
        success:
          script: ""
          expect_output:
            contains: 42
    """)
    )
    assert task.name == "2048"
    assert task.spec.image is None
    assert task.spec.docs.allow == ("other.example.org",)
    assert task.spec.budgets.max_turns == 12
    assert task.spec.setup == ("python3 -m venv .venv",)
    assert task.spec.success.script is None
    assert task.spec.success.expect_output is not None
    assert task.spec.success.expect_output.contains == ("42",)


def test_replay_docs_in_each_form_and_the_hand_written_list(write_task) -> None:
    head = "name: t\ngoal: g\ndocs:\n  path: [https://d.example/a]\nsuccess:\n  script: test -f x\n"
    word = load_task(write_task(head + "replay: docs\n")).spec
    assert word.replay_docs == DocsReplay(source="docs") and word.replay_steps == ()
    full = load_task(write_task(head + (
        "replay:\n  from: docs\n  values: {your-api-key: k3y, PORT: 8080}\n"
        "  skip: [{page: 'https://d.example/a', block: 2}]\n"))).spec.replay_docs
    assert full is not None and full.values == (("your-api-key", "k3y"), ("PORT", "8080"))
    assert full.value("<your-api-key>") == "k3y" and full.value("${PORT}") == "8080"
    assert full.value("YOUR_TOKEN") is None
    assert full.skips("https://d.example/a", 2) and not full.skips("https://d.example/a", 1)
    steps = load_task(write_task(head + (
        "replay:\n  - ' ls '\n  - ''\n  - run: touch ready\n    undocumented: the guide assumes it\n"
    ))).spec
    assert steps.replay_docs is None
    assert steps.replay_steps == (ReplayStep(run="ls"),
                                  ReplayStep(run="touch ready", undocumented="the guide assumes it"))


def test_check_file_is_held_in_memory(tmp_path: Path) -> None:
    shutil.copytree(VALID, tmp_path / "valid")
    task = load_task(tmp_path / "valid" / "check-file.yaml")
    check = tmp_path / "valid" / "checks" / "webframe.sh"
    expected = check.read_text()
    check.unlink()
    assert task.check == expected
    assert task.check_path == str(check)


def test_empty_check_file_is_refused(write_task) -> None:
    write_task("\n", name="checks/empty.sh")
    path = write_task("""
        name: t
        goal: g
        docs: {entrypoint: https://docs.example.org/}
        success:
          file: checks/empty.sh
    """)
    with pytest.raises(TaskError) as caught:
        read_task(path)
    assert caught.value.args[0] == f"{path}:5: success.file 'checks/empty.sh' is empty"


def test_no_such_task_file(tmp_path: Path) -> None:
    with pytest.raises(TaskError) as caught:
        read_task(tmp_path / "nope.yaml")
    assert caught.value.args[0] == f"{tmp_path / 'nope.yaml'}: no such file"
    assert caught.value.line is None


def test_non_utf8_file_names_the_line(write_task) -> None:
    path = write_task("name: t\ngoal: g\n")
    path.write_bytes(b"name: t\ngoal: caf\xe9\n")
    with pytest.raises(TaskError) as caught:
        read_task(path)
    assert caught.value.args[0] == f"{path}:2: not UTF-8 text"


def test_merge_keys_are_not_duplicates(write_task) -> None:
    task = read_task(
        write_task("""
        name: merged
        goal: g
        docs: {entrypoint: https://docs.example.org/}
        budgets: &b {max_turns: 5, max_seconds: 60}
        success:
          script: test -f a
        replay: []
        network: {allow: [a.example.org]}
    """)
    )
    assert task.spec.budgets.max_turns == 5


def test_load_task_refuses_a_task_that_cannot_produce_evidence(write_task) -> None:
    path = write_task("""
        name: serve-only
        goal: g
        docs: {entrypoint: https://docs.example.org/}
        success:
          serve: python3 -m http.server $QS_PORT
    """)
    read_task(path)  # well-formed
    with pytest.raises(TaskError) as caught:
        load_task(path)
    assert caught.value.line == 5
    assert "nothing checks it" in caught.value.detail


def test_expand_paths_files_dirs_globs(tmp_path: Path) -> None:
    shutil.copytree(VALID, tmp_path / "tasks")
    a = str(tmp_path / "tasks" / "node-quickstart.yaml")
    files, unmatched = expand_task_paths(
        [a, str(tmp_path / "tasks"), str(tmp_path / "t*/*.yaml"), str(tmp_path / "none*.yaml")]
    )
    assert files[0] == a
    assert len(files) == len(VALID_FILES)
    assert unmatched == [str(tmp_path / "none*.yaml")]


def test_load_tasks_refuses_unmatched_paths_and_shared_names(tmp_path: Path, write_task) -> None:
    with pytest.raises(UsageError):
        load_tasks([tmp_path / "missing"])
    body = """
        name: same
        goal: g
        docs: {entrypoint: https://docs.example.org/}
        success: {script: test -f a}
    """
    first = write_task(body, name="a.yaml")
    second = write_task(body, name="b.yaml")
    with pytest.raises(TaskError) as caught:
        load_tasks([first, second])
    assert caught.value.args[0] == f"{second}:1: task name 'same' is also the name of {first}"


@pytest.mark.parametrize(
    "pattern",
    ["*.co.kr", "*.com.sg", "*.web.app", "*.fly.dev", "*.onrender.com", "*.githubusercontent.com"],
)
def test_a_wildcard_over_a_public_suffix_is_refused_at_its_line(write_task, pattern: str) -> None:
    path = write_task(f"""
        name: t
        goal: g
        docs: {{entrypoint: https://docs.example.org/}}
        network:
          allow:
            - pypi.org
            - "{pattern}"
        success: {{script: test -f a}}
    """)
    with pytest.raises(TaskError) as caught:
        read_task(path)
    assert caught.value.args[0] == (
        f"{path}:7: network.allow[1]: pattern {pattern!r} covers a whole public suffix; "
        "name the registrable domain"
    )


def test_a_wildcard_over_a_registrable_domain_loads(write_task) -> None:
    task = read_task(
        write_task("""
        name: t
        goal: g
        docs: {entrypoint: https://docs.example.org/}
        network:
          allow: ["*.pythonhosted.org", "*.example.com", "*.myapp.fly.dev"]
        success: {script: test -f a}
    """)
    )
    assert task.spec.network.allow == ("*.pythonhosted.org", "*.example.com", "*.myapp.fly.dev")
