"""action.yml and the documented workflow: they parse, every input is used and documented,
every firstrun command they would run is one the real CLI parser accepts, and the install
step installs the release ``version`` pins (or the checkout), under the constraints.

The action's install and run steps are executed for real by bash, with recording
``firstrun``, ``python`` and ``sudo`` first on PATH, so the argv under test is the one the
shell builds from the inputs (word splitting and quoting included), not a copy.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from firstrun.cli.main import build_parser

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
ACTION = yaml.safe_load((REPO / "action.yml").read_text())
DOC = (REPO / "docs" / "github-actions.md").read_text()
EXPRESSION = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")


def _steps() -> list[dict]:
    return ACTION["runs"]["steps"]


def _workflows() -> list[dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC, re.DOTALL)
    assert blocks, "the doc shows no workflow"
    return [yaml.safe_load(b) for b in blocks]


def test_the_action_is_composite_and_every_input_is_used() -> None:
    assert ACTION["runs"]["using"] == "composite"
    text = (REPO / "action.yml").read_text()
    used = set(re.findall(r"inputs\.([\w-]+)", text))
    assert used == set(ACTION["inputs"]), set(ACTION["inputs"]) ^ used
    for step in _steps():
        # Inputs only through env: an expression inside a script is an injection.
        assert not EXPRESSION.search(step.get("run", "")), step.get("name")
        if "run" in step:
            assert step["shell"] == "bash"


def _evaluate(value: str, context: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        return context[match.group(1)]

    return EXPRESSION.sub(one, value)


def _input_values(inputs: dict[str, str]) -> dict[str, str]:
    """The ``inputs.NAME`` expressions' values: ``inputs`` over the action's defaults."""
    values = {f"inputs.{k}": str(v.get("default", "")) for k, v in ACTION["inputs"].items()}
    values.update({f"inputs.{k}": v for k, v in inputs.items()})
    return values


def _argv_of_run_step(tmp_path: Path, inputs: dict[str, str]) -> list[str]:
    """The argv the action's run step hands to firstrun, given ``inputs`` (defaults filled)."""
    values = _input_values(inputs)
    (step,) = [s for s in _steps() if s.get("id") == "run"]
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    record = tmp_path / "argv.json"
    (shim / "firstrun").write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    (shim / "firstrun").chmod(0o755)
    env = {k: _evaluate(v, values) for k, v in step["env"].items()}
    env.update(PATH=f"{shim}:{os.environ['PATH']}", GITHUB_OUTPUT=str(tmp_path / "output"),
               GITHUB_STEP_SUMMARY=str(tmp_path / "summary.md"))
    subprocess.run(["bash", "-c", step["run"]], env=env, check=True, cwd=tmp_path)
    assert (tmp_path / "output").read_text() == "exit-code=0\n"
    return json.loads(record.read_text())


def _install_step(tmp_path: Path, inputs: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The action's install step run by bash with ``inputs``, every command it runs a recorder.

    Returns the step's outcome and the file each recorded command line is appended to.
    """
    values = _input_values(inputs)
    (step,) = [s for s in _steps() if s.get("name") == "Install firstrun and bubblewrap"]
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    record = tmp_path / "commands.jsonl"
    for name in ("sudo", "python", "firstrun"):
        (shim / name).write_text(
            f"#!{sys.executable}\nimport json, os, sys\n"
            f"open({str(record)!r}, 'a').write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + '\\n')\n")
        (shim / name).chmod(0o755)
    env = {k: _evaluate(v, values) for k, v in step["env"].items()}
    env.update(PATH=f"{shim}:{os.environ['PATH']}", GITHUB_ACTION_PATH=str(tmp_path / "action"))
    proc = subprocess.run(["bash", "-c", step["run"]], env=env, capture_output=True, text=True, cwd=tmp_path)
    return proc, record


def _pip_install(record: Path) -> list[str]:
    (pip,) = [argv for argv in map(json.loads, record.read_text().splitlines()) if argv[0] == "python"]
    return pip


@pytest.mark.parametrize(("inputs", "spec"), [
    ({}, "{action}"),
    ({"extras": "claude"}, "{action}[claude]"),
    ({"version": "0.2.0"}, "firstrun==0.2.0"),
    ({"version": "1.0rc1", "extras": "claude,openai"}, "firstrun[claude,openai]==1.0rc1"),
    ({"version": "1!2.0.post1.dev3"}, "firstrun==1!2.0.post1.dev3"),
], ids=["checkout", "checkout-extras", "release", "pre-release-extras", "epoch-post-dev"])
def test_the_install_step_installs_the_pinned_release_or_the_checkout(tmp_path: Path, inputs: dict[str, str],
                                                                      spec: str) -> None:
    proc, record = _install_step(tmp_path, inputs)
    assert proc.returncode == 0, proc.stderr
    action = tmp_path / "action"
    # The action's constraints hold the dependencies whichever firstrun is installed.
    assert _pip_install(record) == ["python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                    "-c", f"{action}/constraints.txt", spec.format(action=action)]


@pytest.mark.parametrize("version", ["latest", "v0.2.0", ">=0.2", "0.2.0 ", "0.2.0+local", "01.0", "1.0-rc1",
                                     "0.2.0; touch x", "$(touch x)", "0.2.0\n::warning::forged"])
def test_a_version_that_is_not_pep_440_is_refused_in_one_line_before_any_install(tmp_path: Path,
                                                                                 version: str) -> None:
    proc, record = _install_step(tmp_path, {"version": version})
    assert proc.returncode == 3
    (line,) = proc.stderr.splitlines()
    assert line.startswith("firstrun: error: version: ") and "PEP 440" in line
    assert not record.exists() and not (tmp_path / "x").exists()


def test_every_input_is_documented_in_the_doc_and_the_readme_names_the_version() -> None:
    rows = set(re.findall(r"^\| `([\w-]+)` \|", DOC, re.MULTILINE))
    assert rows == set(ACTION["inputs"]), rows ^ set(ACTION["inputs"])
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## GitHub Actions"):readme.index("## CLI reference")]
    assert "`version: 0.2.0`" in section and "constraints.txt" in section


def test_the_run_step_with_defaults_builds_a_valid_command(tmp_path: Path) -> None:
    argv = _argv_of_run_step(tmp_path, {})
    args = build_parser().parse_args(argv)
    # --agent and --model are repeatable (each value an arm): the step gives one agent, no model.
    assert (args.subcommand, args.tasks, args.agent, args.repeat) == ("run", [], ["replay"], 1)
    assert args.backend is None and args.model == []
    assert args.junit == "firstrun-results/junit.xml"
    # The job summary: the file GitHub Actions names in $GITHUB_STEP_SUMMARY.
    assert args.github_summary is True and args.github_summary_file is None


def test_the_run_step_passes_every_input_through(tmp_path: Path) -> None:
    argv = _argv_of_run_step(tmp_path, {
        "tasks": "tasks/a.yaml tasks/more", "agent": "claude", "model": "m-1", "backend": "linux",
        "repeat": "5", "args": "--workers 2 --max-spend 3", "out": "res"})
    args = build_parser().parse_args(argv)
    assert args.tasks == ["tasks/a.yaml", "tasks/more"]
    assert (args.agent, args.model, args.backend, args.repeat) == (["claude"], ["m-1"], "linux", 5)
    assert (args.workers, str(args.max_spend), args.out) == (2, "3", "res")


def test_an_input_cannot_inject_shell(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    argv = _argv_of_run_step(tmp_path, {"tasks": f"$(touch {canary})", "model": f"`touch {canary}`"})
    assert not canary.exists()
    # Split on spaces like any list input, and otherwise passed as the words written.
    assert argv[1:3] == ["$(touch", f"{canary})"]
    assert argv[argv.index("--model") + 1] == f"`touch {canary}`"


def _firstrun_commands(script: str) -> list[list[str]]:
    """Each ``firstrun ...`` command in a workflow script, its variables left as placeholders."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line)
        if words and words[0] == "firstrun":
            commands.append(words[1:])
    return commands


def test_the_documented_workflow_uses_only_real_inputs_and_valid_commands(tmp_path: Path) -> None:
    (workflow,) = _workflows()
    assert set(workflow[True]) >= {"push", "schedule"}  # YAML 1.1 reads the key 'on' as True
    uses, commands = [], []
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            if step.get("uses", "").startswith("OWNER/firstrun@"):
                uses.append(step)
            commands.extend(_firstrun_commands(step.get("run", "")))
    assert len(uses) == 2
    for n, step in enumerate(uses):
        inputs = {k: str(v) for k, v in step["with"].items()}
        assert set(inputs) <= set(ACTION["inputs"]), set(inputs) - set(ACTION["inputs"])
        run_dir = tmp_path / str(n)
        run_dir.mkdir()
        build_parser().parse_args(_argv_of_run_step(run_dir, inputs))
    agent = next(s for s in uses if s["with"].get("agent") == "claude")
    assert agent["env"]["ANTHROPIC_API_KEY"] == "${{ secrets.ANTHROPIC_API_KEY }}"
    (diff,) = commands
    args = build_parser().parse_args(diff)
    assert (args.subcommand, args.fail_on_regression) == ("diff", True)
    # The diff reads what the agent step wrote and what the download step fetched.
    assert args.after == agent["with"]["out"]
    assert f"--name {agent['with']['artifact-name']} --dir {args.before}" in DOC


@pytest.mark.parametrize("flag", ["--resume", "--config"])
def test_the_readme_and_the_doc_name_flags_that_exist(flag: str) -> None:
    readme = (REPO / "README.md").read_text()
    assert flag in readme
    build_parser().parse_args(["run", flag, "somewhere"])
