"""JUnit XML from saved runs, for CI systems that show test results.

Guarantee: the document is well-formed XML 1.0 whatever the runs printed
(characters XML cannot carry, such as terminal escapes, are replaced, never
written raw), and it maps the run classifications onto JUnit's outcomes without
inventing evidence: only ``docs_gap`` is a ``<failure>``, and a run that could
not judge the docs is never shown green. One ``<testsuite>`` per task, one
``<testcase>`` per attempt in recorded order; the file is replaced atomically.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from firstrun.reports.summary import route_finding_text
from firstrun.results.model import Classification, RunRecord
from firstrun.results.mutation import is_mutant
from firstrun.results.store import write_atomic
from firstrun.tasks.allowlist import AllowEntries, allow_snippet

# XML 1.0 Char production: what is left out here cannot appear in a document at all.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

_OUTPUT_LIMIT = 8000


def _xml_text(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def _excerpt(text: str) -> str:
    if len(text) <= _OUTPUT_LIMIT:
        return text
    return f"[... {len(text) - _OUTPUT_LIMIT} characters before this were cut]\n" + text[-_OUTPUT_LIMIT:]


def _details(record: RunRecord) -> str:
    lines = [f"classification: {record.classification.value} ({record.reason})"]
    if record.detail:
        lines.append(f"detail: {record.detail}")
    if record.check_exit is not None:
        lines.append(f"check exit: {record.check_exit}")
    if record.last_page_before_failure:
        lines.append(f"last page read before the failure: {record.last_page_before_failure}")
    lines.extend(f"route page not read: {route_finding_text(f)}" for f in record.route_findings)
    for blocked in record.blocked_egress:
        host, port, reason = blocked.get("host"), blocked.get("port"), blocked.get("reason")
        lines.append(f"blocked egress: {host}:{port} ({reason})")
    if record.classification is Classification.BLOCKED and record.allow_fix:
        lines.append("the task lines that would allow it:")
        lines.append(allow_snippet(AllowEntries.from_data(record.allow_fix)).rstrip("\n"))
    if record.trace:
        lines.append(f"trace: {record.trace} (firstrun show it)")
    if record.check_output:
        lines.append("check output:")
        lines.append(_excerpt(record.check_output))
    return "\n".join(lines)


def _message(record: RunRecord) -> str:
    return f"{record.classification.value}: {record.reason}" + (
        f": {record.detail}" if record.detail else ""
    )


def _testcase(record: RunRecord) -> ET.Element:
    case = ET.Element(
        "testcase",
        {
            "name": f"{record.task} attempt {record.attempt}",
            "classname": f"firstrun.{record.task}",
            "time": f"{record.duration_s:.3f}",
            "file": _xml_text(record.task_file),
        },
    )
    # passed is a plain testcase; docs_gap a <failure>, the only outcome that says
    # the docs failed; skipped <skipped>; every other classification (infra or
    # harness trouble, a budget run out, an agent refusal) an <error>, because the
    # run could not judge the docs and a CI dashboard must not show it green.
    outcome: str | None
    if record.classification is Classification.PASSED:
        outcome = None
    elif record.classification is Classification.DOCS_GAP:
        outcome = "failure"
    elif record.classification is Classification.SKIPPED:
        outcome = "skipped"
    else:
        outcome = "error"
    if outcome is not None:
        element = ET.SubElement(
            case, outcome, {"message": _xml_text(_message(record)), "type": record.classification.value}
        )
        if outcome != "skipped":
            element.text = _xml_text(_details(record))
    out = ET.SubElement(case, "system-out")
    out.text = _xml_text(
        f"agent: {record.agent}" + (f" ({record.model})" if record.model else "")
        + f"\nbackend: {record.backend}, enforcement: {record.enforcement}"
        + f"\npages read: {len(record.pages)}, blocked egress: {len(record.blocked_egress)}"
        + (f"\ntrace: {record.trace}" if record.trace else "")
    )
    return case


def _counts(records: Sequence[RunRecord]) -> dict[str, str]:
    def n(*kinds: Classification) -> int:
        return sum(1 for r in records if r.classification in kinds)

    errors = len(records) - n(Classification.PASSED, Classification.DOCS_GAP, Classification.SKIPPED)
    return {
        "tests": str(len(records)),
        "failures": str(n(Classification.DOCS_GAP)),
        "errors": str(errors),
        "skipped": str(n(Classification.SKIPPED)),
        "time": f"{sum(r.duration_s for r in records):.3f}",
    }


def junit_document(records: Sequence[RunRecord], *, name: str = "firstrun") -> ET.Element:
    """The ``<testsuites>`` element for ``records``; a mutant's run tests the task's check,
    not the docs, and is no test case here."""
    records = [r for r in records if not is_mutant(r)]
    root = ET.Element("testsuites", {"name": name, **_counts(records)})
    by_task: dict[str, list[RunRecord]] = {}
    for record in records:
        by_task.setdefault(record.task, []).append(record)
    for task, runs in by_task.items():
        attrs = {"name": task, **_counts(runs), "file": _xml_text(runs[0].task_file)}
        if runs[0].started_at:
            attrs["timestamp"] = runs[0].started_at
        suite = ET.SubElement(root, "testsuite", attrs)
        properties = ET.SubElement(suite, "properties")
        first = runs[0]
        for key, value in (
            ("agent", first.agent),
            ("model", first.model),
            ("backend", first.backend),
            ("enforcement", first.enforcement),
            ("task_sha256", first.task_sha256),
        ):
            if value is not None:
                ET.SubElement(properties, "property", {"name": key, "value": _xml_text(value)})
        suite.extend(_testcase(r) for r in runs)
    return root


def write_junit(path: str | os.PathLike[str], records: Sequence[RunRecord]) -> None:
    """Write the JUnit document to ``path``, replacing it atomically."""
    root = junit_document(records)
    ET.indent(root)
    write_atomic(Path(path), ET.tostring(root, encoding="utf-8", xml_declaration=True))
