"""The replay agent against a toolbelt that records calls: order, first failure, budgets, drift."""

from __future__ import annotations

from dataclasses import replace

import pytest

from firstrun.agents import (
    AgentStop,
    Brief,
    Budget,
    BudgetExhausted,
    ReplayAgent,
    make_agent,
)
from firstrun.agents.replay import write_command
from firstrun.docs import Page, ReadFailure
from firstrun.docs.blocks import extract
from firstrun.errors import UsageError
from firstrun.sandbox.base import CappedOutput, ExecResult
from firstrun.tasks.model import BlockRef, Budgets, DocsReplay, ReplayStep

pytestmark = pytest.mark.fast

GUIDE = '<pre><code class="language-bash">one\ntwo\nthree</code></pre>'


def page(url: str, html: str) -> Page:
    return Page(url_requested=url, url_final=url, status=200, content_type="text/html", bytes=len(html),
                sha256=None, markdown="", title=None, links=(), from_cache=False, error=None,
                detail=None, hops=(url,), truncated=False, duration_ms=0, blocks=extract(html, url=url))


class ScriptedTools:
    """A toolbelt whose commands exit with the codes given, in order, recording every call.

    Its route's first page shows the commands one, two and three in a bash block."""

    def __init__(self, codes: dict[str, int] | None = None, *, budget_after: int | None = None,
                 first: str = GUIDE):
        self.codes = codes or {}
        self.calls: list[tuple[str, str]] = []
        self.budget_after = budget_after
        self.first = first

    def bash(self, command: str, *, timeout: float | None = None, origin=None) -> ExecResult:
        if self.budget_after is not None and len(self.calls) >= self.budget_after:
            raise BudgetExhausted(Budget.MAX_SECONDS, "spent")
        self.calls.append(("bash", command))
        empty = CappedOutput(data=b"", total_bytes=0)
        return ExecResult(exit_code=self.codes.get(command, 0), stdout=empty, stderr=empty,
                          duration_s=0.0)

    def read_docs(self, url: str) -> Page:
        self.calls.append(("read_docs", url))
        return page(url, self.first if url.endswith("/1") else "<p>Done.</p>")


def brief(replay: tuple[str | ReplayStep, ...], *, max_turns: int = 20) -> Brief:
    steps = tuple(ReplayStep(run=s) if isinstance(s, str) else s for s in replay)
    return Brief(task="t", goal="g", docs_route=("http://a.test/1", "http://a.test/2"),
                 docs_hosts=("a.test",), budgets=Budgets(max_turns=max_turns), replay=steps)


def test_reads_the_route_in_order_then_runs_every_step() -> None:
    tools = ScriptedTools()
    result = ReplayAgent().run(brief(("one", "two")), tools)
    assert result.stop is AgentStop.FINISHED and result.turns == 2
    assert tools.calls == [("read_docs", "http://a.test/1"), ("read_docs", "http://a.test/2"),
                           ("bash", "one"), ("bash", "two")]


def test_stops_at_the_first_failing_step() -> None:
    tools = ScriptedTools({"two": 3})
    result = ReplayAgent().run(brief(("one", "two", "three")), tools)
    assert result.stop is AgentStop.STEP_FAILED and result.turns == 2
    assert ("bash", "three") not in tools.calls
    assert "step 2 exited 3" in result.detail


def test_no_replay_block_touches_nothing() -> None:
    tools = ScriptedTools()
    result = ReplayAgent().run(brief(()), tools)
    assert result.stop is AgentStop.NO_REPLAY and tools.calls == []


def test_max_turns_stops_before_the_step_past_it() -> None:
    tools = ScriptedTools()
    result = ReplayAgent().run(brief(("one", "two", "three"), max_turns=2), tools)
    assert result.stop is AgentStop.BUDGET_EXHAUSTED and result.turns == 2
    assert [c for c in tools.calls if c[0] == "bash"] == [("bash", "one"), ("bash", "two")]
    assert result.detail.startswith("max_turns")


def test_the_toolbelt_ending_the_wall_budget_ends_the_agent() -> None:
    tools = ScriptedTools(budget_after=3)
    result = ReplayAgent().run(brief(("one", "two")), tools)
    assert result.stop is AgentStop.BUDGET_EXHAUSTED and result.turns == 2
    assert result.detail.startswith("max_seconds")


def test_a_step_no_page_shows_is_drift_and_nothing_runs() -> None:
    tools = ScriptedTools(first='<pre><code class="language-bash">one\ntwo</code></pre>')
    result = ReplayAgent().run(brief(("one", "tree")), tools)
    assert result.stop is AgentStop.REPLAY_DRIFT and result.turns == 0
    assert not [c for c in tools.calls if c[0] == "bash"]
    assert result.detail == ("step 2 matches no code block on the route: tree; "
                             "nearest: http://a.test/1 block 0: one ...")


def test_a_step_marked_undocumented_is_not_drift() -> None:
    tools = ScriptedTools()
    marked = ReplayStep(run="touch ready", undocumented="the guide assumes a marker")
    result = ReplayAgent().run(brief(("one", marked)), tools)
    assert result.stop is AgentStop.FINISHED
    assert ("bash", "touch ready") in tools.calls


def test_a_heredoc_matches_the_file_block_it_writes() -> None:
    html = ('<p>Save this as <code>app.py</code>:</p>\n'
            '<pre><code class="language-python">print("hi")\nprint("bye")</code></pre>')
    tools = ScriptedTools(first=html)
    step = "cat > app.py <<'PY'\nprint(\"hi\")\nprint(\"bye\")\nPY"
    assert ReplayAgent().run(brief((step,)), tools).stop is AgentStop.FINISHED


KEYED = ('<pre><code class="language-console">$ export API_TOKEN=&lt;your-token&gt;\n'
         '$ curl -H "Authorization: $API_TOKEN" https://api.example/me\n{"ok": true}</code></pre>\n'
         '<p>Save this as <code>app.py</code>:</p><pre><code class="language-python">print(1)</code></pre>\n'
         '<pre><code class="language-bash">python3 app.py</code></pre>')


def docs_brief(replay: DocsReplay) -> Brief:
    return Brief(task="t", goal="g", docs_route=("http://a.test/1", "http://a.test/2"),
                 docs_hosts=("a.test",), budgets=Budgets(), replay=(), replay_docs=replay)


def test_replay_docs_runs_the_pages_blocks_with_the_values_given() -> None:
    tools = ScriptedTools(first=KEYED)
    result = ReplayAgent().run(docs_brief(DocsReplay(source="docs", values={"your-token": "t0k"})), tools)
    assert result.stop is AgentStop.FINISHED and result.turns == 4
    assert tools.calls == [
        ("read_docs", "http://a.test/1"),
        ("bash", "export API_TOKEN=t0k"),
        ("bash", 'curl -H "Authorization: $API_TOKEN" https://api.example/me'),
        ("bash", "printf '%s' 'print(1)\n' > app.py"),
        ("bash", "python3 app.py"),
        ("read_docs", "http://a.test/2"),
    ]


def test_a_placeholder_without_a_value_stops_before_its_step() -> None:
    tools = ScriptedTools(first=KEYED)
    result = ReplayAgent().run(docs_brief(DocsReplay(source="docs")), tools)
    assert result.stop is AgentStop.NEEDS_INPUT and result.turns == 0
    assert not [c for c in tools.calls if c[0] == "bash"]
    assert result.detail == "http://a.test/1 block 0 needs a value for <your-token>; give it under replay.values"


def test_skipped_blocks_do_not_run_and_a_failure_names_its_block() -> None:
    tools = ScriptedTools({"python3 app.py": 1}, first=KEYED)
    replay = DocsReplay(source="docs", skip=(BlockRef(page="http://a.test/1", block=0),))
    result = ReplayAgent().run(docs_brief(replay), tools)
    assert result.stop is AgentStop.STEP_FAILED
    assert [c[1] for c in tools.calls if c[0] == "bash"] == ["printf '%s' 'print(1)\n' > app.py",
                                                             "python3 app.py"]
    assert result.detail == "http://a.test/1 block 2 exited 1: python3 app.py"


def test_a_route_with_no_block_to_run_is_no_replay() -> None:
    tools = ScriptedTools(first="<p>Read on.</p>")
    result = ReplayAgent().run(docs_brief(DocsReplay(source="docs")), tools)
    assert result.stop is AgentStop.NO_REPLAY and "no shell or file block" in result.detail


@pytest.mark.parametrize(("name", "path"), [
    ("app.py", "> app.py"), ("src/app.py", "mkdir -p -- src && printf"), ("../up.py", "> up.py"),
    ("~/.config/tool.toml", "> tool.toml"), ("/etc/passwd", "> passwd"), ("./a/../../b.txt", "> b.txt"),
])
def test_a_file_block_is_written_inside_the_workspace(name: str, path: str) -> None:
    command = write_command(name, "x\n")
    assert path in command and ".." not in command and "~" not in command
    assert " /" not in command


def test_drift_is_not_judged_over_a_route_not_read_in_full() -> None:
    class Unread(ScriptedTools):
        def read_docs(self, url: str) -> Page:
            page = super().read_docs(url)
            return replace(page, error=ReadFailure.HTTP_ERROR, blocks=()) if url.endswith("/2") else page

    tools = Unread()
    assert ReplayAgent().run(brief(("one", "tree")), tools).stop is AgentStop.FINISHED
    assert ("bash", "tree") in tools.calls


@pytest.mark.parametrize(("error", "status", "stop"), [
    (ReadFailure.UNREACHABLE, None, AgentStop.INFRA_ERROR),
    (ReadFailure.HTTP_ERROR, 502, AgentStop.INFRA_ERROR),
    (ReadFailure.HTTP_ERROR, 503, AgentStop.INFRA_ERROR),
    (ReadFailure.HTTP_ERROR, 404, AgentStop.STEP_FAILED),
    (ReadFailure.HTTP_ERROR, 410, AgentStop.STEP_FAILED),
    (ReadFailure.NOT_TEXT, 200, AgentStop.STEP_FAILED),
])
def test_a_route_page_the_site_failed_to_serve_is_no_evidence_about_the_docs(
        error: ReadFailure, status: int | None, stop: AgentStop) -> None:
    class Failing(ScriptedTools):
        def read_docs(self, url: str) -> Page:
            page = super().read_docs(url)
            return replace(page, error=error, status=status, detail="d", blocks=())

    tools = Failing()
    result = ReplayAgent().run(docs_brief(DocsReplay(source="docs")), tools)
    assert result.stop is stop
    assert not [c for c in tools.calls if c[0] == "bash"]
    said = "could not be reached" if stop is AgentStop.INFRA_ERROR else "could not be read"
    assert result.detail.startswith(f"route page http://a.test/1 {said} ({error}: d)")


def test_make_agent_knows_replay_and_names_the_flag_otherwise() -> None:
    assert isinstance(make_agent("replay"), ReplayAgent)
    with pytest.raises(UsageError, match="--agent: unknown agent 'replya'; did you mean 'replay'"):
        make_agent("replya")
    with pytest.raises(UsageError, match="--model"):
        make_agent("replay", model="gpt")
