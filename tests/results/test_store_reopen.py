"""ResultsStore.reopen: a saved sweep continued in place, its runs untouched; old documents stay readable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from firstrun.errors import UsageError
from firstrun.results.model import SweepIdentity, TaskIdentity
from firstrun.results.store import RESULTS_FILE, ResultsStore, load_results

IDENTITY = SweepIdentity(
    tasks=(TaskIdentity(name="t", sha256="a", check_sha256="b"),), agent="replay", model=None,
    base_url=None, backend="linux", repeat=2, affordances="all", probe_affordances=False,
    allow_unenforced=False, downgrades=(), task_defaults_sha256=None, inspect_tls=False)


def test_reopen_keeps_every_saved_run_and_only_adds(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path, meta={"sweep": IDENTITY.to_data(), "agent": "replay"})
    store.add({"task": "t", "attempt": 1, "classification": "passed", "note": "é"})
    saved = json.loads((tmp_path / RESULTS_FILE).read_text())
    again = ResultsStore.reopen(tmp_path)
    assert again.identity() == IDENTITY
    assert again.finished() == {("t", 1)}
    again.add({"task": "t", "attempt": 2, "classification": "docs_gap"})
    after = json.loads((tmp_path / RESULTS_FILE).read_text())
    assert after["runs"][0] == saved["runs"][0]
    assert after["meta"] == saved["meta"]
    assert [r["attempt"] for r in after["runs"]] == [1, 2]


def test_a_document_from_before_resume_is_readable_but_cannot_be_resumed(tmp_path: Path) -> None:
    old = {"schema_version": 1, "meta": {"agent": "replay", "backend": "auto"},
           "runs": [{"task": "t", "attempt": 1, "classification": "passed"}]}
    (tmp_path / RESULTS_FILE).write_text(json.dumps(old))
    assert load_results(tmp_path / RESULTS_FILE) == old
    with pytest.raises(UsageError) as refused:
        ResultsStore.reopen(tmp_path)
    assert refused.value.args[0].startswith("--resume: ")
    assert "no sweep identity" in refused.value.args[0]


def test_an_unreadable_identity_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / RESULTS_FILE).write_text(json.dumps(
        {"schema_version": 1, "meta": {"sweep": {"tasks": "nope"}}, "runs": []}))
    with pytest.raises(UsageError, match="unreadable sweep identity"):
        ResultsStore.reopen(tmp_path).identity()


def test_a_retried_attempt_replaces_its_stored_record(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path, meta={})
    store.add({"task": "t", "attempt": 1, "classification": "infra_error"})
    store.add({"task": "t", "attempt": 2, "classification": "passed"})
    assert store.finished(retry_infra=True) == {("t", 2)}
    store.add({"task": "t", "attempt": 1, "classification": "passed"})
    assert sorted((r["attempt"], r["classification"]) for r in store.runs()) == [
        (1, "passed"), (2, "passed")]
    assert len(load_results(tmp_path / RESULTS_FILE)["runs"]) == 2
