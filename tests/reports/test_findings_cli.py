"""``firstrun findings`` and ``firstrun schema --findings`` through the real console script.

The results directories are written as a sweep writes them (``ResultsStore``
and ``Trace`` with the runner's typed events), the pages read carrying their
code blocks as ``firstrun.docs.blocks`` extracts them.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from report_support import PIN_PAGE, firstrun, pin_sweep

pytestmark = pytest.mark.fast

PAGE = PIN_PAGE
NO_DIST = "ERROR: No matching distribution found for tabulate==0.0.999\n"


def _sweep(out: Path, *, missing: bool = False) -> Path:
    return pin_sweep(out, no_dist=NO_DIST, meta={"agent": "replay", "model": None}, missing=missing,
                     extra={"claim": "The pinned version does not exist."})


def test_text_names_the_block_the_signature_the_improvised_step_and_the_gap(tmp_path: Path) -> None:
    out = _sweep(tmp_path / "results", missing=True)
    proc = firstrun("findings", str(out))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert f"2 of 4 runs broke at block 0 of {PAGE}: No matching distribution found for tabulate==<version>" in text
    assert "3 of 4 runs ran `pip install wheel`, which no page says" in text
    assert "said: The pinned version does not exist." in text
    assert "gap: 1 run (pin #1): no trace saved" in text
    assert "1/4 evidential runs passed; pass^1 25%, pass^2 0%" in text
    # Records with no usage and no agent failure: nothing spent, as the spend cap counts it.
    assert "per success: 0 tokens, spend $0.0000" in text


def test_json_follows_the_published_schema(tmp_path: Path) -> None:
    out = _sweep(tmp_path / "results")
    schema = firstrun("schema", "--findings")
    assert schema.returncode == 0, schema.stderr
    proc = firstrun("findings", str(out), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    jsonschema.validate(document, json.loads(schema.stdout))
    (task,) = document["tasks"]
    # Ranked by runs: the step all four ran, then the break of three.
    assert [f["kind"] for f in task["findings"]] == ["improvised", "break"]
    first = task["findings"][1]
    assert (first["kind"], first["page"], first["block"], first["runs"]) == (
        "break", PAGE, 0, ["pin #1", "pin #2", "pin #3"])
    assert first["evidence"][0]["output_tail"] == NO_DIST.strip()
    assert task["figures"]["spend_per_success_usd"] == "0"
    # The schema refuses what the document must not be: a finding without its runs.
    first["runs"] = []
    try:
        jsonschema.validate(document, json.loads(schema.stdout))
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("an empty runs list validated")


def test_markdown_is_a_findings_section(tmp_path: Path) -> None:
    proc = firstrun("findings", str(_sweep(tmp_path / "results")), "--format", "markdown")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("## Findings\n")
    # A fence inside a list item is indented on every line, or it ends the item.
    assert "   ```\n   $ pip install tabulate==0.0.999\n   $ python app.py\n   ```" in proc.stdout


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    (old / "results.json").write_text(json.dumps({"schema_version": 0, "meta": {}, "runs": []}))
    for argv, named in ((["findings", str(old)], "schema version"),
                        (["findings", str(tmp_path / "none")], "RESULTS_DIR"),
                        (["findings", str(old), "--format", "yaml"], "--format")):
        proc = firstrun(*argv)
        assert proc.returncode == 3, proc.stderr
        assert "Traceback" not in proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("firstrun: error: ") and named in line


def test_github_annotations_point_at_the_task_file_and_name_page_and_block(tmp_path: Path) -> None:
    proc = firstrun("findings", str(_sweep(tmp_path / "results")), "--format", "github")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("::warning file=tasks/pin.yaml,title=firstrun break::3 of 4 runs broke at "
                               "block 0 of https://docs.test/quickstart: No matching distribution")
    assert "; pin #1 ran: pip install tabulate==0.0.999" in lines[1]


def test_several_results_are_arms_matrix_first(tmp_path: Path) -> None:
    one = _sweep(tmp_path / "one")
    two = _sweep(tmp_path / "two", missing=True)
    proc = firstrun("findings", str(one), str(two))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "arms (pass rate over evidential runs, 95% Wilson CI):"
    # Both sweeps are replay with no model: each arm is told apart by its directory.
    assert lines[2].startswith(f"  replay ({one})  1/4 (25%, CI 5%-70%)")
    assert f"replay ({one}) vs replay ({two}), pin: no significant difference (p 1)" in proc.stdout
    assert proc.stdout.index(f"== arm replay ({two}) ==") > proc.stdout.index(f"== arm replay ({one}) ==") > \
        proc.stdout.index("Fisher's exact test")
    markdown = firstrun("findings", str(one), str(two), "--format", "markdown")
    assert markdown.stdout.startswith("## Arms\n") and "## Findings: replay" in markdown.stdout
    refused = firstrun("findings", str(one), str(two), "--format", "json")
    assert refused.returncode == 3 and refused.stdout == ""
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("firstrun: error: --format json: takes one RESULTS_DIR")
