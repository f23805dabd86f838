"""Saved runs for report tests: real ``RunRecord``s, built the way the runner saves them."""

from __future__ import annotations

from typing import Any

from firstrun.results.model import Classification, PageRead, RunRecord


def record(task: str, attempt: int, classification: Classification, **fields: Any) -> RunRecord:
    base: dict[str, Any] = {
        "task": task,
        "task_file": f"tasks/{task}.yaml",
        "task_sha256": "ab" * 32,
        "attempt": attempt,
        "agent": "replay",
        "model": None,
        "classification": classification,
        "reason": {
            Classification.PASSED: "check_passed",
            Classification.DOCS_GAP: "check_failed",
            Classification.SKIPPED: "no_replay",
            Classification.INFRA_ERROR: "sandbox_refused",
        }.get(classification, classification.value),
        "backend": "linux",
        "enforcement": "full",
        "policy_hash": "p" * 16,
        "pages": (
            PageRead(url_requested="https://docs.test/", url_final="https://docs.test/", status=200,
                     error=None, bytes=10, sha256="c" * 64),
        ),
        "started_at": "2026-01-01T00:00:00+00:00",
        "duration_s": 1.5,
        "trace": f"runs/{task}/{attempt}/trace.jsonl",
    }
    base.update(fields)
    return RunRecord(**base)
