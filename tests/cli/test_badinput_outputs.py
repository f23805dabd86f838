"""Output locations that would destroy something, or that cannot be written, are refused.

``run --out`` over a directory holding a ``results.json`` firstrun did not
write used to replace it; an ``--out`` that cannot be created ended in a
traceback; ``--junit``, the GitHub summary and ``report``'s outputs could
name the very results file they are made from. Each is now one
``firstrun: error:`` line, exit 3, with every file as it was. Refusals all
come before any sandbox starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.badinput import TASK, Run, one_error

SAVED = {"schema_version": 1, "meta": {"agent": "replay"}, "runs": []}


def _task(tmp_path: Path) -> str:
    (tmp_path / "t.yaml").write_text(TASK)
    return str(tmp_path / "t.yaml")


@pytest.mark.parametrize("foreign", ['{"mine": 1}\n', "not json at all\n", ""],
                         ids=["other-json", "text", "empty"])
def test_out_never_replaces_a_results_json_firstrun_did_not_write(firstrun: Run, tmp_path: Path,
                                                                   foreign: str) -> None:
    out = tmp_path / "other"
    out.mkdir()
    (out / "results.json").write_text(foreign)
    (out / "notes.txt").write_text("keep\n")
    err = one_error(firstrun("run", _task(tmp_path), "--out", str(out), cwd=str(tmp_path)))
    assert "--out: " in err and "left alone" in err
    assert (out / "results.json").read_text() == foreign
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "results.json"]


def test_out_that_cannot_be_created_is_one_line(firstrun: Run, tmp_path: Path) -> None:
    err = one_error(firstrun("run", _task(tmp_path), "--out", "/proc/firstrun-out", cwd=str(tmp_path)))
    assert "--out: cannot write /proc/firstrun-out/results.json" in err


def test_resume_of_a_file_names_resume(firstrun: Run, tmp_path: Path) -> None:
    task = _task(tmp_path)
    err = one_error(firstrun("run", task, "--resume", task, cwd=str(tmp_path)))
    assert err.startswith("firstrun: error: --resume: ")


def _naming(flag: str, path: Path) -> tuple[list[str], dict[str, str]]:
    """The arguments and environment by which ``flag`` names ``path`` as its output."""
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(path)}
    # --github-summary takes no value: its file is the one GitHub Actions names.
    return ([flag] if flag == "--github-summary" else [f"{flag}={path}"]), env


@pytest.mark.parametrize("flag", ["--junit", "--github-summary", "--github-summary-file"])
def test_run_outputs_cannot_be_the_sweeps_own_results(firstrun: Run, tmp_path: Path, flag: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    saved = json.dumps(SAVED)
    (out / "results.json").write_text(saved)
    given, env = _naming(flag, out / "results.json")
    err = one_error(firstrun("run", _task(tmp_path), "--out", str(out), *given, env=env, cwd=str(tmp_path)))
    assert f"{flag}: " in err and "own results.json" in err
    assert (out / "results.json").read_text() == saved


@pytest.mark.parametrize("flag", ["--out", "--markdown", "--github-summary", "--github-summary-file"])
def test_report_outputs_cannot_be_the_results_being_reported(firstrun: Run, tmp_path: Path,
                                                             flag: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    saved = json.dumps(SAVED)
    (out / "results.json").write_text(saved)
    given, env = _naming(flag, out / "results.json")
    err = one_error(firstrun("report", str(out), *given, env=env))
    assert f"{flag}: " in err and "is the results file being reported" in err
    assert (out / "results.json").read_text() == saved


@pytest.mark.parametrize("where", ["/", "/etc", "/tmp"])
def test_check_sandbox_that_would_hand_over_the_host_names_the_flag(firstrun: Run, tmp_path: Path,
                                                                    where: str) -> None:
    err = one_error(firstrun("check", _task(tmp_path), "--sandbox", where, cwd=str(tmp_path)))
    assert err.startswith(f"firstrun: error: --sandbox: {where} cannot be a workspace")


def test_out_whose_runs_is_a_file_is_refused_before_any_run(firstrun: Run, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "runs").write_text("keep\n")
    err = one_error(firstrun("run", _task(tmp_path), "--out", str(out), cwd=str(tmp_path)))
    assert "--out: " in err and "runs' exists and is not a directory" in err
    assert (out / "runs").read_text() == "keep\n"
    assert not (out / "results.json").exists()


@pytest.mark.parametrize("shape", ["out-is-a-file", "runs-is-a-file"])
def test_check_out_that_is_not_a_directory_is_refused(firstrun: Run, tmp_path: Path, shape: str) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    out = tmp_path / "out"
    if shape == "out-is-a-file":
        out.write_text("keep\n")
    else:
        out.mkdir()
        (out / "runs").write_text("keep\n")
    err = one_error(firstrun("check", _task(tmp_path), "--sandbox", str(workspace), "--out", str(out),
                              cwd=str(tmp_path)))
    assert "--out: " in err and "exists and is not a directory" in err
