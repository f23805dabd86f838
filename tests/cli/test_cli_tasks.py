"""schema, validate, init, examples and show, driven through the real console script."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

Run = Callable[..., subprocess.CompletedProcess[str]]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


def test_schema_is_json_schema_that_accepts_the_fixtures(firstrun: Run) -> None:
    proc = firstrun("schema")
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    import yaml

    for path in sorted((FIXTURES / "valid").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    # Every form of replay the loader takes, and none it refuses.
    head = "name: t\ngoal: g\ndocs: {path: ['https://d.example/a']}\nsuccess: {script: 'test -f x'}\n"
    for replay in ("docs", "{from: docs, values: {your-token: t}, skip: [{page: 'https://d.example/a', block: 1}]}",
                   "[ls, {run: touch ready, undocumented: the guide assumes it}]"):
        jsonschema.validate(yaml.safe_load(f"{head}replay: {replay}\n"), schema)
    for replay in ("doc", "{from: web}", "[{run: ls, why: x}]", "{from: docs, skip: [{page: x, block: -1}]}"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(yaml.safe_load(f"{head}replay: {replay}\n"), schema)


def test_validate_exit_codes_follow_the_findings(firstrun: Run, tmp_path: Path) -> None:
    ok = firstrun("validate", str(FIXTURES / "valid"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = firstrun("validate", str(FIXTURES / "invalid" / "typo-top-level.yaml"))
    assert bad.returncode == 1
    (finding,) = bad.stdout.splitlines()
    assert finding.startswith(f"{FIXTURES / 'invalid' / 'typo-top-level.yaml'}:")
    assert "did you mean" in finding and "[invalid_task]" in finding
    none = firstrun("validate", cwd=str(tmp_path))
    assert none.returncode == 3
    assert "no task files here" in none.stdout


def test_examples_lists_one_per_line_name_first(firstrun: Run) -> None:
    from firstrun.examples import list_examples

    proc = firstrun("examples")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [e.name for e in list_examples()]
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines)


BAD = [
    (["run", "--repeat", "0"], "--repeat"),
    (["run", "--workers", "many"], "--workers"),
    (["run", "--backend", "podman"], "--backend"),
    (["run", "--agent", "replya"], "--agent"),
    (["run", "--model", "gpt"], "--model"),
    (["run", "--example", "pyhton-tabulate"], "--example"),
    (["run", "--docs-mirror", "docs.test"], "--docs-mirror"),
    (["run", "--docs-mirror", "docs.test=/nonexistent/firstrun"], "--docs-mirror"),
    (["run", "--junit", "/nonexistent/dir/j.xml"], "--junit"),
    (["run", "--allow-downgrade", "all"], "--allow-downgrade"),
    (["run", "--out", "tasks/t.yaml"], "--out"),
    (["run", "--cache-dir", "tasks/t.yaml"], "--cache-dir"),
    (["run", "/nonexistent/task.yaml"], "/nonexistent/task.yaml"),
    (["run", "--frobnicate"], "--frobnicate"),
    (["check", "task.yaml"], "--sandbox"),
    (["check", "/nonexistent/task.yaml", "--sandbox", "/nonexistent/ws"], "--sandbox"),
    (["show"], "TRACE"),
    (["show", "/nonexistent/trace.jsonl"], "/nonexistent/trace.jsonl"),
    (["validate", "--bogus"], "--bogus"),
    (["schema", "extra"], "extra"),
    (["init"], "URL"),
    (["init", "ftp://docs.test/"], "ftp://docs.test/"),
    (["init", "https://docs.test/", "--name", "../x"], "--name"),
    (["init", "https://docs.test/", "--out", "/nonexistent/dir/t.yaml"], "--out"),
    (["examples", "--", "x"], "examples"),
]


@pytest.mark.parametrize(("argv", "names"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_3(firstrun: Run, tmp_path: Path, argv: list[str], names: str) -> None:
    # A directory holding one valid task, so 'run' gets past "no task files" to the bad flag.
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "t.yaml").write_bytes((FIXTURES / "valid" / "expect-output-only.yaml").read_bytes())
    proc = firstrun(*argv, cwd=str(tmp_path))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1, proc.stderr
    assert err[0].startswith("firstrun: error: ") and names in err[0]
    assert not (tmp_path / "results").exists()


def test_an_invalid_task_names_its_file_and_line(firstrun: Run, tmp_path: Path) -> None:
    bad = FIXTURES / "invalid" / "typo-nested.yaml"
    proc = firstrun("run", str(bad), cwd=str(tmp_path))
    assert proc.returncode == 3
    (line,) = proc.stderr.splitlines()
    assert re.match(rf"firstrun: error: {re.escape(str(bad))}:\d+: unknown key .*did you mean", line), line


def test_run_with_no_tasks_says_where_it_looked(firstrun: Run, tmp_path: Path) -> None:
    proc = firstrun("run", cwd=str(tmp_path))
    assert proc.returncode == 3
    (line,) = proc.stderr.splitlines()
    assert "no task files in tasks/" in line and "--example" in line
