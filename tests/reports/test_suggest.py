"""``firstrun findings --suggest`` through the console script and the vendors' real SDKs.

The vendors are the agent tests' scripted servers on loopback (Anthropic's
Messages and OpenAI's Chat Completions wire formats); results directories
are written as a sweep writes them. Each test judges by what the server
received, what was saved in suggestions.json, and what the reports print.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from report_support import PIN_PAGE, firstrun, pin_sweep

import support.anthropic_wire as claude_wire
import support.gemini_wire as gemini_wire
import support.openai_wire as openai_wire
from firstrun.agents.vendor import (  # noqa: E402
    TokenUsage,
    Turn,
    TurnStop,
    VendorConfigError,
    VendorUnavailable,
)
from firstrun.errors import UsageError  # noqa: E402
from firstrun.reports.findings_report import build_report, render_text  # noqa: E402
from firstrun.reports.load import load_saved, read_runs  # noqa: E402
from firstrun.reports.suggest import MAX_OUTPUT_TOKENS, RETRY, choose_model, draft, shown  # noqa: E402
from firstrun.reports.suggestions import SYSTEM, Status, Suggestion, prompt  # noqa: E402
from support.vendor import Reply, Request, Router, VendorServer

PAGE = PIN_PAGE
NO_DIST = "ERROR: Could not find a version\nERROR: No matching distribution found for tabulate==0.0.999\n"
DRAFT = "On the quickstart, block 0: pin an existing release, `pip install tabulate==0.9.0`. <b>"
WHEEL_DRAFT = "Add a step before block 0: `pip install wheel`."
KEY = "sk-ant-suggest-test-1f3a"


def sweep(out: Path, *, agent: str = "claude", model: str | None = claude_wire.MODEL) -> Path:
    """Three runs break at the pinned block, four run ``pip install wheel`` no page gives, one passes."""
    return pin_sweep(out, no_dist=NO_DIST, meta={"agent": agent, "model": model}, agent=agent, model=model,
                     extra={"claim": "The pinned version does not exist.",
                            "usage": {"input_tokens": 1000, "output_tokens": 100, "spend": "0.01"}})


def prices(tmp_path: Path, model: str, rate: int) -> Path:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({model: {"input": rate, "output": rate * 5}}))
    return path


def env(**keys: str) -> dict[str, str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return {**base, **keys}


def by_finding(draft: Reply, wheel: Reply) -> Router:
    """The break's prompt gets ``draft``, the improvised step's ``wheel`` (each a wire reply)."""
    def key(request: Request) -> str:
        text = claude_wire.first_user_text(request) if "system" in request.body \
            else openai_wire.first_user_text(request)
        return "break" if "Error signature" in text else "improvised"
    return Router(key, {"break": lambda _: draft, "improvised": lambda _: wheel})


def without_suggestions(document: dict[str, Any]) -> dict[str, Any]:
    for task in document["tasks"]:
        for f in task["findings"]:
            f.pop("suggestion", None)
    return document


def test_claude_drafts_each_finding_from_its_evidence_and_it_is_saved_and_shown(tmp_path: Path) -> None:
    out = sweep(tmp_path / "results")
    before = firstrun("findings", str(out), "--format", "json")
    assert before.returncode == 0, before.stderr
    replies = by_finding(claude_wire.message(claude_wire.text(DRAFT), tokens=(1000, 200)),
                         claude_wire.message(claude_wire.text(WHEEL_DRAFT), tokens=(800, 100)))
    with VendorServer(replies) as server:
        proc = firstrun("findings", str(out), "--suggest", "--base-url", server.url,
                        "--price-file", str(prices(tmp_path, claude_wire.MODEL, 3)),
                        env=env(ANTHROPIC_API_KEY=KEY))
        seen = server.seen()
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # One call per finding, with the sweep's own model, the key from the environment, no tools.
    assert len(seen) == 2
    assert all(r.body["model"] == claude_wire.MODEL and "tools" not in r.body for r in seen)
    assert all(claude_wire.api_key(r) == KEY for r in seen)
    (asked,) = [claude_wire.first_user_text(r) for r in seen if "Error signature" in claude_wire.first_user_text(r)]
    assert f"Page: {PAGE}" in asked and "Code block: number 0" in asked
    assert "    $ pip install tabulate==0.0.999" in asked
    assert "Error signature: No matching distribution found for tabulate==<version>" in asked
    assert "    ERROR: No matching distribution found for tabulate==0.0.999" in asked
    assert "The pinned version does not exist." in asked
    assert seen[0].body["system"] == SYSTEM

    # Cost: 1000 in at 3 and 200 out at 15 USD per million, then 800 at 3 and 100 at 15.
    saved = json.loads((out / "suggestions.json").read_text())
    drafts = {s["finding"]["kind"]: s for s in saved["suggestions"]}
    assert drafts["break"]["text"] == DRAFT and drafts["break"]["status"] == "drafted"
    assert (drafts["break"]["input_tokens"], drafts["break"]["output_tokens"]) == (1000, 200)
    assert Decimal(drafts["break"]["spend_usd"]) == Decimal("0.006")
    assert Decimal(drafts["improvised"]["spend_usd"]) == Decimal("0.0039")
    assert drafts["break"]["finding"] == {"kind": "break", "task": "pin", "page": PAGE, "block": 0,
                                          "what": "No matching distribution found for tabulate==<version>"}
    assert "suggest: 2 of 2 findings drafted by claude-test-1, spend $0.0099" in proc.stderr

    # Shown beside the evidence, in every format.
    assert f"suggested change (drafted by {claude_wire.MODEL}, a suggestion, not a measurement):" in proc.stdout
    assert f"       ~ {DRAFT}" in proc.stdout
    assert "suggested changes: 2 of 2 findings drafted by claude-test-1, spend $0.0099" in proc.stdout
    markdown = firstrun("findings", str(out), "--format", "markdown")
    assert f"   ```\n   {DRAFT}\n   ```" in markdown.stdout
    html = tmp_path / "report.html"
    assert firstrun("report", str(out), "--out", str(html)).returncode == 0
    page = html.read_text()
    assert DRAFT.replace("<b>", "&lt;b&gt;") in page and DRAFT not in page
    assert page.index("suggested change (drafted by") < page.index('id="traces"')

    # The JSON validates, and apart from the suggestions it is what it was: no figure moved.
    after = firstrun("findings", str(out), "--format", "json")
    document = json.loads(after.stdout)
    schema = json.loads(firstrun("schema", "--findings").stdout)
    jsonschema.validate(document, schema)
    suggestion = document["tasks"][0]["findings"][1]["suggestion"]
    assert (suggestion["text"], suggestion["current"], suggestion["spend_usd"]) == (DRAFT, True, "0.006")
    suggestion["status"] = "guessed"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema)
    assert without_suggestions(document) == json.loads(before.stdout)

    # Asked again, nothing is re-drafted: every draft answers the evidence as it stands.
    with VendorServer(replies) as server:
        again = firstrun("findings", str(out), "--suggest", "--base-url", server.url,
                         "--price-file", str(prices(tmp_path, claude_wire.MODEL, 3)),
                         env=env(ANTHROPIC_API_KEY=KEY))
        assert server.seen() == []
    assert again.returncode == 0 and "every shown finding already has a current draft" in again.stderr


def test_a_spent_budget_stops_the_calls_and_names_the_findings_left(tmp_path: Path) -> None:
    out = sweep(tmp_path / "results", agent="replay", model=None)
    refused = firstrun("findings", str(out), "--suggest", env=env())
    assert refused.returncode == 3
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("firstrun: error: ") and "--model" in line

    # At 1000 USD per million input tokens (5000 out) a call reserves its prompt's bytes
    # plus the output limit at 5000; the cap holds the first, which settles at 2 + 2 USD,
    # and then cannot hold the second.
    report = build_report(read_runs(load_saved(out, label="RESULTS_DIR")))
    rate = Decimal(5000) / 1_000_000
    first, second = ((len(SYSTEM.encode()) + len(prompt(f).encode()) + MAX_OUTPUT_TOKENS) * rate
                     for f in shown(report))
    cap = first
    assert Decimal(4) + second > cap
    replies = by_finding(openai_wire.completion(DRAFT, tokens=(2000, 400)),
                         openai_wire.completion(WHEEL_DRAFT, tokens=(2000, 400)))
    with VendorServer(replies) as server:
        proc = firstrun("findings", str(out), "--suggest", "--agent", "openai", "--model", openai_wire.MODEL,
                        "--base-url", f"{server.url}/v1", "--max-spend", str(cap),
                        "--price-file", str(prices(tmp_path, openai_wire.MODEL, 1000)),
                        env=env(OPENAI_API_KEY="sk-openai-suggest"))
        seen = server.seen()
    assert proc.returncode == 0, proc.stderr
    assert len(seen) == 1 and "tools" not in seen[0].body
    assert seen[0].body["messages"][0] == {"role": "system", "content": SYSTEM}
    assert f"the --max-spend budget ({cap} USD) was spent; no draft for 1 finding:" in proc.stderr
    assert f"  pin: {shown(report)[1].headline()}" in proc.stderr
    saved = {s["status"]: s for s in json.loads((out / "suggestions.json").read_text())["suggestions"]}
    assert Decimal(saved["drafted"]["spend_usd"]) == Decimal(4)
    assert saved["budget_spent"]["text"] is None
    assert "no suggested change: the --max-spend budget was spent before this finding" in proc.stdout


def test_a_vendor_error_is_a_marked_gap_never_a_traceback(tmp_path: Path) -> None:
    out = sweep(tmp_path / "results")
    replies = by_finding(claude_wire.overloaded(),
                         claude_wire.message(claude_wire.text(WHEEL_DRAFT), tokens=(800, 100)))
    with VendorServer(replies) as server:
        proc = firstrun("findings", str(out), "--suggest", "--base-url", server.url,
                        env=env(FIRSTRUN_ANTHROPIC_API_KEY=KEY))
        seen = server.seen()
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # An overload is retried as the agent loop retries, a few times, then is a gap.
    assert len(seen) == 1 + RETRY.attempts
    assert "suggest: no draft for pin: 3 of 4 runs broke" in proc.stderr
    assert f"(gave up after {RETRY.attempts} attempts)" in proc.stderr
    (gap,) = [line for line in proc.stdout.splitlines() if "no suggested change" in line]
    assert gap.strip().startswith("no suggested change: anthropic: OverloadedError (HTTP 529)")
    assert "overloaded_error" in gap
    # No price is known for the test model: the draft's spend is unknown, never zero.
    assert "spend unknown" in proc.stderr
    saved = {s["status"]: s for s in json.loads((out / "suggestions.json").read_text())["suggestions"]}
    assert saved["drafted"]["spend_usd"] is None and saved["drafted"]["input_tokens"] == 800
    # An unpriced model cannot be held to a cap.
    capped = firstrun("findings", str(out), "--suggest", "--max-spend", "1", env=env(ANTHROPIC_API_KEY=KEY))
    assert capped.returncode == 3
    assert "--max-spend: no price is known for model 'claude-test-1'; give one with --price-file" in capped.stderr


def test_bad_flags_and_a_broken_suggestions_file_are_one_line(tmp_path: Path) -> None:
    out = sweep(tmp_path / "results")
    (out / "suggestions.json").write_text('{"schema": "firstrun.suggestions/1", "suggestions": [{}]}')
    for argv, named in ((["findings", str(out)], "suggestions.json"),
                        (["findings", str(out), "--model", "m"], "--model: only with --suggest"),
                        (["findings", str(out), str(out), "--suggest"], "--suggest: takes one"),
                        (["findings", str(out), "--suggest", "--max-spend", "0"], "--max-spend")):
        proc = firstrun(*argv, env=env(ANTHROPIC_API_KEY=KEY))
        assert proc.returncode == 3, (argv, proc.stderr)
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("firstrun: error: ") and named in line, line


def test_the_drafting_model_is_the_sweeps_unless_the_flags_say() -> None:
    claude = {"agent": "claude", "model": None}
    assert choose_model(claude, ["claude-x"], agent=None, model=None) == ("claude", "claude-x")
    assert choose_model(claude, ["claude-x"], agent=None, model="gpt-5.5") == ("openai", "gpt-5.5")
    assert choose_model(claude, ["claude-x"], agent="gemini", model=None) == ("gemini", None)
    assert choose_model({"agent": "replay"}, [None], agent=None, model="gemini-3-pro") == ("gemini", "gemini-3-pro")
    with pytest.raises(UsageError, match="--agent"):
        choose_model({"agent": "replay"}, [None], agent=None, model="llama-local")
    with pytest.raises(UsageError, match="give --model"):
        choose_model({"agent": "replay"}, [None], agent=None, model=None)


def test_a_draft_for_older_evidence_is_shown_as_stale_and_drafted_again(tmp_path: Path) -> None:
    out = sweep(tmp_path / "results")
    runs = read_runs(load_saved(out, label="RESULTS_DIR"))
    finding = shown(build_report(runs))[1]
    old = Suggestion(finding=finding.key, status=Status.DRAFTED, text=DRAFT, error=None, agent="claude",
                     model=claude_wire.MODEL, input_tokens=1, output_tokens=1, spend_usd=None, price_source=None,
                     inputs_sha256="0" * 64, drafted_at="2026-01-01T00:00:00+00:00")
    report = build_report(runs, {finding.key: old})
    assert not old.current(finding)
    assert "its evidence has changed since: run --suggest again" in render_text(report)
    # The figures are the same report's with or without it.
    assert report.figures == build_report(runs).figures and report.sweep == build_report(runs).sweep

    class Client:
        vendor, model, asked = "anthropic", claude_wire.MODEL, 0

        def user_message(self, text: str) -> dict[str, str]:
            return {"role": "user", "content": text}

        def send(self, **_: Any) -> Turn:
            self.asked += 1
            return Turn(text="again", tool_calls=(), stop=TurnStop.END, vendor_stop="end_turn",
                        usage=TokenUsage(input_tokens=10, output_tokens=5), message=None)

    class Failing(Client):
        def send(self, **_: Any) -> Turn:
            raise VendorConfigError("HTTP 400: bad request", who="anthropic")

    failed = draft(report, report.suggestions, agent="claude", model=claude_wire.MODEL, client=Failing(),  # type: ignore[arg-type]
                   pricing=None, governor=None)
    # The error is said, and the stale draft is kept over the gap; the other finding gets the gap.
    assert [s.status for _, s in failed.made] == [Status.VENDOR_ERROR, Status.VENDOR_ERROR]
    assert failed.saved[finding.key] == old and failed.spent == 0

    class Limited(Client):
        def send(self, **_: Any) -> Turn:
            self.asked += 1
            if self.asked == 1:
                raise VendorUnavailable("HTTP 429: rate limited", who="anthropic", retry_after=7.0)
            return super().send()

    sleeps: list[float] = []
    limited = Limited()
    retried = draft(report, report.suggestions, agent="claude", model=claude_wire.MODEL, client=limited,  # type: ignore[arg-type]
                    pricing=None, governor=None, sleep=sleeps.append)
    # The rate limit was waited out as the vendor asked, then both findings drafted.
    assert sleeps == [7.0] and [s.status for _, s in retried.made] == [Status.DRAFTED, Status.DRAFTED]

    client = Client()
    done = draft(report, report.suggestions, agent="claude", model=claude_wire.MODEL, client=client,  # type: ignore[arg-type]
                 pricing=None, governor=None)
    # Both findings asked: the stale one again, the other for the first time; spend unknown, no price.
    assert client.asked == 2 and done.saved[finding.key].text == "again" and done.spent is None


def test_gemini_drafts_through_its_own_wire_format(tmp_path: Path) -> None:
    out = sweep(tmp_path / "results", agent="gemini", model=gemini_wire.MODEL)
    with VendorServer(gemini_wire.script(gemini_wire.response(gemini_wire.text(DRAFT), tokens=(500, 50)))) \
            as server:
        proc = firstrun("findings", str(out), "--suggest", "--base-url", server.url, "--format", "markdown",
                        "--price-file", str(prices(tmp_path, gemini_wire.MODEL, 2)),
                        env=env(GEMINI_API_KEY="gemini-suggest-key"))
        seen = server.seen()
    assert proc.returncode == 0, proc.stderr
    assert len(seen) == 2 and all("tools" not in r.body and gemini_wire.api_key(r) == "gemini-suggest-key"
                                  for r in seen)
    assert seen[0].body["systemInstruction"]["parts"][0]["text"] == SYSTEM
    assert any(f"Page: {PAGE}" in gemini_wire.first_user_text(r) for r in seen)
    # 500 in at 2 and 50 out at 10 USD per million, twice.
    assert "suggest: 2 of 2 findings drafted by gemini-test-1, spend $0.0030" in proc.stderr
    assert f"   ```\n   {DRAFT}\n   ```" in proc.stdout
