"""JUnit XML: a docs gap is a failure, trouble is an error, a skip is skipped; always well-formed."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from cli_records import record

from firstrun.reports.junit import write_junit
from firstrun.results.model import Classification as C


def test_outcomes_map_onto_junit_and_counts_agree(tmp_path: Path) -> None:
    records = [
        record("alpha", 1, C.PASSED),
        record("alpha", 2, C.DOCS_GAP, check_exit=1, check_output="expected hello\n",
               last_page_before_failure="https://docs.test/install/",
               route_findings=({"url": "https://docs.test/gone/", "error": "http_error",
                                "status": 404, "detail": "HTTP 404"},)),
        record("beta", 1, C.INFRA_ERROR, detail="landlock unavailable"),
        record("beta", 2, C.SKIPPED),
        record("beta", 3, C.BUDGET_EXHAUSTED),
    ]
    path = tmp_path / "junit.xml"
    write_junit(path, records)
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("5", "1", "2", "1")
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["alpha", "beta"]
    assert [s.get("tests") for s in suites] == ["2", "3"]
    cases = root.findall("testsuite/testcase")
    assert [c.get("name") for c in cases] == [
        "alpha attempt 1", "alpha attempt 2", "beta attempt 1", "beta attempt 2", "beta attempt 3",
    ]
    assert all(float(c.get("time", "x")) == 1.5 for c in cases)
    outcomes = [[child.tag for child in c if child.tag != "system-out"] for c in cases]
    assert outcomes == [[], ["failure"], ["error"], ["skipped"], ["error"]]
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("type") == "docs_gap"
    assert "expected hello" in (failure.text or "")
    assert "https://docs.test/install/" in (failure.text or "")
    assert "route page not read: https://docs.test/gone/ (http_error, HTTP 404): HTTP 404" in (failure.text or "")
    error = cases[2].find("error")
    assert error is not None and "landlock unavailable" in (error.get("message") or "")
    assert cases[4].find("error").get("type") == "budget_exhausted"  # type: ignore[union-attr]
    props = {p.get("name"): p.get("value") for p in suites[0].findall("properties/property")}
    assert props["agent"] == "replay" and props["backend"] == "linux"


def test_terminal_escapes_and_lone_surrogates_still_make_well_formed_xml(tmp_path: Path) -> None:
    output = "\x1b[31mred\x1b[0m \x00 nul \udcff bad byte, kept text"
    path = tmp_path / "junit.xml"
    write_junit(path, [record("gamma", 1, C.DOCS_GAP, check_output=output)])
    text = (path.read_bytes()).decode("utf-8")
    root = ET.fromstring(text.encode("utf-8"))
    body = root.find("testsuite/testcase/failure").text  # type: ignore[union-attr]
    assert body is not None and "kept text" in body and "red" in body
    assert "\x1b" not in text and "\x00" not in text


def test_an_empty_suite_is_still_a_document(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    write_junit(path, [])
    root = ET.parse(path).getroot()
    assert root.get("tests") == "0" and list(root) == []
