"""``firstrun.yaml``: repeated flags in one file, refused where it would make runs incomparable."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from firstrun.cli.main import _run, build_parser
from firstrun.errors import TaskError, UsageError
from firstrun.run.project import (
    CONFIG_FILE,
    ProjectSpec,
    apply_task_defaults,
    find_project_config,
    load_project_config,
)
from firstrun.sandbox.select import own_kernel_backend
from firstrun.tasks.load import load_task

FIRSTRUN = Path(sys.executable).parent / "firstrun"
CLI_FIXTURES = Path(__file__).resolve().parents[1] / "cli" / "run_fixtures"
PASS = CLI_FIXTURES / "tasks" / "greet-pass.yaml"


def write(tmp_path: Path, text: str, name: str = CONFIG_FILE) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def refusal(tmp_path: Path, text: str) -> TaskError:
    with pytest.raises(TaskError) as caught:
        load_project_config(write(tmp_path, text))
    assert "\n" not in str(caught.value)
    return caught.value


@pytest.mark.parametrize("key", ["agent", "model", "repeat", "affordances", "base_url"])
def test_keys_that_decide_what_is_measured_are_refused_with_file_line_and_why(
    tmp_path: Path, key: str
) -> None:
    error = refusal(tmp_path, f"backend: linux\nworkers: 2\n{key}: x\n")
    assert (error.path, error.line) == (str(tmp_path / CONFIG_FILE), 3)
    assert f"'{key}' cannot be set in a project config" in error.detail
    assert "measure different things" in error.detail
    assert f"--{key.replace('_', '-')}" in error.detail


@pytest.mark.parametrize(("text", "line", "words"), [
    ("backend: linux\nwokers: 2\n", 2, "unknown key 'wokers'; did you mean 'workers'?"),
    ("workers: 0\n", 1, "workers: must be greater than 0"),
    ("workers: many\n", 1, "workers: expected an integer"),
    ("out: a\nbackend: vm\n", 2, "unknown backend 'vm'"),
    ("task_defaults:\n  budgets:\n    max_turn: 3\n", 3, "did you mean 'max_turns'?"),
    ("task_defaults:\n  budgets:\n    max_turns: -1\n", 3, "max_turns: must be greater than 0"),
    ("task_defaults:\n  network:\n    allow: ['*']\n", 3, "task_defaults.network.allow"),
    ("permissions:\n  bash: deny\n", 2, "unknown key 'bash' in permissions"),
    ("out: a\nout: b\n", 2, "duplicate key 'out' (first at line 1)"),
    ("docs_mirrors:\n  docs.example.com: ./nowhere\n", 2, "docs_mirrors.docs.example.com"),
    ("workers: 1\nisolation: container\n", 2, "isolation: Input should be 'vm'"),
    ("inspect_tls: sometimes\n", 1, "inspect_tls"),
    ("workers: 1\nallow_write:\n  - .vscode\n  - .git/hooks\n", 4,
     "'.git/hooks' is not a protected workspace entry"),
    ("- backend\n", 1, "the top level must be a mapping"),
    ("", 1, "the file is empty"),
])
def test_bad_keys_and_values_are_one_line_errors_at_their_line(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    error = refusal(tmp_path, text)
    assert error.line == line, str(error)
    assert words in error.detail, str(error)


def test_a_valid_config_resolves_paths_from_its_own_directory(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    path = write(tmp_path, """backend: linux
out: sweeps/latest
cache_dir: .cache/docs
workers: 3
docs_mirrors:
  docs.example.com: site
permissions: {}
""")
    config = load_project_config(path)
    assert config.spec.backend == "linux" and config.spec.workers == 3
    assert config.out == str(tmp_path / "sweeps" / "latest")
    assert config.cache_dir == str(tmp_path / ".cache" / "docs")
    assert config.mirrors["docs.example.com"].directory == str(tmp_path / "site")
    assert config.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_permissions_is_a_closed_model_another_rule_can_be_added_to() -> None:
    field = ProjectSpec.model_fields["permissions"]
    assert field.annotation is not None
    assert field.annotation.model_config.get("extra") == "forbid"


def test_discovery_is_the_current_directory_or_the_flag(tmp_path: Path) -> None:
    assert find_project_config(None, tmp_path) is None
    write(tmp_path, "workers: 2\n")
    found = find_project_config(None, tmp_path)
    assert found is not None and found.spec.workers == 2
    other = write(tmp_path, "workers: 4\n", name="ci.yaml")
    chosen = find_project_config(str(other), tmp_path)
    assert chosen is not None and chosen.spec.workers == 4
    with pytest.raises(UsageError, match="^usage: --config: "):
        find_project_config(str(tmp_path / "absent.yaml"), tmp_path)


def test_task_defaults_sit_under_what_the_task_file_says(tmp_path: Path) -> None:
    task = tmp_path / "t.yaml"
    task.write_text(PASS.read_text() + "budgets:\n  max_turns: 7\nnetwork:\n  allow: [a.example.org]\n")
    config = load_project_config(write(tmp_path, """task_defaults:
  budgets:
    max_turns: 2
    max_seconds: 60
  network:
    allow: [registry.corp.example, a.example.org]
"""))
    (merged,) = apply_task_defaults([load_task(task)], config.spec)
    assert merged.spec.budgets.max_turns == 7
    assert merged.spec.budgets.max_seconds == 60
    assert merged.spec.budgets.max_command_seconds == 300  # neither said: the built-in default
    assert merged.spec.network.allow == ("a.example.org", "registry.corp.example")
    assert merged.sha256 == load_task(task).sha256
    assert merged.spec.firstrun.isolation is None


def test_a_project_requiring_a_vm_holds_for_every_task_and_a_task_cannot_opt_out(
    tmp_path: Path
) -> None:
    own = tmp_path / "own.yaml"
    own.write_text(PASS.read_text() + "firstrun:\n  isolation: vm\n")
    plain = load_project_config(write(tmp_path, "workers: 1\n", name="plain.yaml"))
    vm = load_project_config(write(tmp_path, "workers: 1\nisolation: vm\n", name="vm.yaml"))
    loaded = [load_task(PASS), load_task(own)]
    assert [t.spec.firstrun.isolation for t in apply_task_defaults(loaded, vm.spec)] == ["vm", "vm"]
    # Without the project's requirement, the task's own still holds.
    assert [t.spec.firstrun.isolation for t in apply_task_defaults(loaded, plain.spec)] == [None, "vm"]


def test_isolation_is_part_of_the_sweeps_identity_and_its_absence_hashes_as_before(
    tmp_path: Path
) -> None:
    plain = load_project_config(write(tmp_path, "workers: 1\n", name="a.yaml"))
    vm = load_project_config(write(tmp_path, "workers: 1\nisolation: vm\n", name="b.yaml"))
    # The hash a config without rules or isolation had before either existed.
    before = hashlib.sha256(json.dumps({}, sort_keys=True).encode()).hexdigest()
    assert plain.task_defaults_sha256() == before
    assert vm.task_defaults_sha256() != before


def test_inspect_tls_in_the_config_applies_and_the_command_line_wins(tmp_path: Path) -> None:
    from firstrun.cli.run import RunRequest, _with_project

    config = load_project_config(write(tmp_path, "inspect_tls: true\n"))
    assert _with_project(RunRequest(), config).inspect_tls is True
    assert _with_project(RunRequest(inspect_tls=False), config).inspect_tls is False
    assert _with_project(RunRequest(), None).inspect_tls is False
    assert build_parser().parse_args(["run", "--no-inspect-tls"]).inspect_tls is False
    assert build_parser().parse_args(["run"]).inspect_tls is None


def test_a_run_under_a_project_requiring_a_vm_is_refused_before_any_command(tmp_path: Path) -> None:
    config = write(tmp_path, "backend: linux\nisolation: vm\n")
    out = tmp_path / "out"
    done = subprocess.run([str(FIRSTRUN), "run", str(PASS), "--config", str(config),
                           "--out", str(out)], capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    here = own_kernel_backend()
    assert line.startswith(f"firstrun: refused ({here or 'gvisor or microvm'}): the project "
                           f"config {config} requires isolation: vm"), line
    assert f"fix: run it with --backend {here or 'gvisor'}" in line
    # Said once, before the sweep began: no run, no results document.
    assert not out.exists()


def test_auto_under_a_project_requiring_a_vm_runs_where_the_kernel_is_its_own(tmp_path: Path) -> None:
    config = write(tmp_path, "isolation: vm\n")
    out = tmp_path / "out"
    done = subprocess.run([str(FIRSTRUN), "run", str(PASS), "--config", str(config),
                           "--out", str(out)], capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL, timeout=300)
    here = own_kernel_backend()
    if here is None:
        assert done.returncode == 2, done.stdout + done.stderr
        assert "isolation: vm needs a kernel of its own" in done.stderr
        return
    assert done.returncode == 0, done.stdout + done.stderr
    meta = json.loads((out / "results.json").read_text(encoding="utf-8"))["meta"]
    assert meta["backend"] == here
    assert "they share the host's kernel, and isolation: vm asks for one of its own" in done.stderr


def test_a_run_takes_the_config_in_cwd_and_a_flag_wins_over_it(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    config = write(project, f"""backend: linux
out: from-config
workers: 2
docs_mirrors:
  greeter.docs.example: {CLI_FIXTURES / 'docs'}
task_defaults:
  budgets:
    max_turns: 5
""")
    done = subprocess.run([str(FIRSTRUN), "run", str(PASS)], cwd=project, capture_output=True,
                          text=True, check=False, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    meta = json.loads((project / "from-config" / "results.json").read_text())["meta"]
    assert meta["config"] == {"path": str(config),
                              "sha256": hashlib.sha256(config.read_bytes()).hexdigest()}
    assert meta["sweep"]["backend"] == "linux"
    assert meta["sweep"]["task_defaults_sha256"] is not None
    flagged = subprocess.run([str(FIRSTRUN), "run", str(PASS), "--out", str(tmp_path / "flag")],
                             cwd=project, capture_output=True, text=True, check=False,
                             stdin=subprocess.DEVNULL, timeout=300)
    assert flagged.returncode == 0, flagged.stdout + flagged.stderr
    assert (tmp_path / "flag" / "results.json").is_file()


def test_a_refused_key_stops_the_run_before_anything_starts(tmp_path: Path) -> None:
    config = write(tmp_path, "repeat: 5\n")
    with pytest.raises(TaskError, match=r"firstrun\.yaml:1: 'repeat' cannot be set"):
        _run(["run", str(PASS), "--config", str(config), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_allow_write_names_protected_entries_a_recheck_may_write(tmp_path: Path) -> None:
    config = load_project_config(write(tmp_path, "allow_write: [.vscode, .idea]\n"))
    assert config.spec.allow_write == (".vscode", ".idea")


def test_the_nearest_config_above_cwd_is_found_up_to_the_projects_root(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "docs" / "deep").mkdir(parents=True)
    (project / ".git").mkdir()
    write(project, "workers: 3\n")
    found = find_project_config(None, project / "docs" / "deep")
    assert found is not None and found.spec.workers == 3
    assert os.path.abspath(found.path) == str(project / "firstrun.yaml")
    # Above the project's root is another project's: not looked at.
    write(tmp_path, "workers: 5\n")
    inner = project / "vendored"
    (inner / ".git").mkdir(parents=True)
    assert find_project_config(None, inner) is None


def test_a_config_found_above_cwd_is_named_on_stderr(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / ".git").mkdir()
    write(project, "backend: linux\n")
    done = subprocess.run([str(FIRSTRUN), "run", str(PASS), "--out", str(tmp_path / "out")],
                          cwd=project / "sub", capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL, timeout=300)
    assert done.stderr.splitlines()[0] == f"firstrun: project config {project / 'firstrun.yaml'}"
