"""Findings and the field's figures over saved runs whose answers are known by hand.

Traces are the events a run saves (``trace.jsonl`` lines); each page read
carries its code blocks as ``firstrun.docs.blocks.extract`` gives them.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from report_support import record

from firstrun.docs.blocks import extract
from firstrun.reports.findings import (
    SIGNATURE_RULES,
    SIMILARITY,
    FindingKind,
    Gap,
    RunTrace,
    agent_seconds,
    arms_matrix,
    breaking_call,
    calls,
    figures,
    findings,
    normal,
    pass_at_k,
    pass_hat_k,
    quantile,
    signature,
    similarity,
    simple_commands,
    sweep_figures,
    uniform,
)
from firstrun.reports.findings_report import figures_lines, gap_lines
from firstrun.results.model import Classification
from firstrun.results.stats import ComparisonVerdict

pytestmark = pytest.mark.fast

PAGE = "https://docs.test/quickstart"
HTML = """
<p>Install it:</p>
<pre><code class="language-console">$ python -m venv .venv
$ .venv/bin/pip install tabulate==0.0.999</code></pre>
<p>Save this as <code>app.py</code>:</p>
<pre><code class="language-python">import tabulate</code></pre>
<pre><code class="language-console">$ .venv/bin/python app.py
hello</code></pre>
"""
BLOCKS = [b.to_data() for b in extract(HTML, url=PAGE)]
NO_DIST = ("ERROR: Could not find a version that satisfies the requirement tabulate==0.0.999 "
           "(from versions: 0.8.10, 0.9.0)\nERROR: No matching distribution found for tabulate==0.0.999\n")


def read(url: str = PAGE, blocks: list[dict[str, Any]] | None = BLOCKS) -> dict[str, Any]:
    page: dict[str, Any] = {"url_requested": url, "url_final": url, "status": 200, "error": None}
    if blocks is not None:
        page["blocks"] = blocks
    return {"kind": "docs_read", "page": page, "route": True}


def ran(command: str, exit_code: int = 0, stderr: str = "", **extra: Any) -> dict[str, Any]:
    return {"kind": "command", "source": "agent", "command": command, "exit_code": exit_code,
            "stdout": "", "stderr": stderr, **extra}


def run(attempt: int, classification: Classification, events: list[dict[str, Any]] | None,
        *, task: str = "pin", claim: str = "", **fields: Any) -> RunTrace:
    extra = {"claim": claim, **fields.pop("extra", {})}
    r = record(task, attempt, classification, extra=extra, **fields)
    return RunTrace(record=r, events=None if events is None else tuple(events),
                    gap=None if events is not None else Gap.NO_TRACE.value)


# --- signatures: one row per rule, and the uniform tokens ---------------------------

SIGNATURES = [
    ("python_module", "Traceback (most recent call last):\n  File \"/tmp/tmpa1b2/app.py\", line 3\n"
     "ModuleNotFoundError: No module named 'requests'\n", "ModuleNotFoundError: No module named 'requests'"),
    ("python_import", "ImportError: cannot import name 'foo' from 'bar' (/tmp/x/bar.py)",
     "ImportError: cannot import name 'foo' from 'bar'"),
    ("pip_no_distribution", NO_DIST, "No matching distribution found for tabulate==<version>"),
    ("pip_externally_managed", "error: externally-managed-environment\n\nx This environment...",
     "error: externally-managed-environment"),
    ("npm_404", "npm error 404  'left-padx@1.2.3' is not in this registry.", "npm ERR! 404 left-padx"),
    ("npm_404_get", "npm ERR! code E404\nnpm ERR! 404 Not Found - GET https://registry.npmjs.org/left-padx - "
     "Not found", "npm ERR! 404 left-padx"),
    ("npm_etarget", "npm ERR! code ETARGET\nnpm ERR! notarget No matching version found for "
     "express@99.0.0.", "npm ERR! notarget No matching version found for express"),
    ("npm_code", "npm ERR! code ENOENT\nnpm ERR! syscall open", "npm ERR! code ENOENT"),
    ("command_not_found", "bash: line 1: uvx: command not found", "command not found: uvx"),
    ("command_not_found", "sh: 1: uvx: not found", "command not found: uvx"),
    ("no_such_file", "python: can't open file '/tmp/ws-8812/app.py': [Errno 2] No such file or directory",
     "can't open file '<tmp>/app.py': No such file or directory"),
    ("python_exception", "Traceback ...\nKeyError: 'port 8080 at 3f9a2b1c7d'",
     "KeyError: 'port <n> at <hash>'"),
    ("error_line", "fatal: repository 'https://git.test/x.git/' not found", "error: repository "
     "'https://git.test/x.git/' not found"),
]


@pytest.mark.parametrize(("rule", "output", "expected"), SIGNATURES)
def test_each_rule_names_its_error_uniformly(rule: str, output: str, expected: str) -> None:
    first = next(r.name for r in SIGNATURE_RULES if r.pattern.search(output))
    assert first == rule
    assert signature(output, 1) == expected


def test_every_rule_has_a_row() -> None:
    assert {r.name for r in SIGNATURE_RULES} == {rule for rule, _, _ in SIGNATURES}


def test_an_unknown_error_is_its_last_line_made_uniform_and_silence_its_exit() -> None:
    assert signature("building...\nsegfault in worker 12 at 0xdeadbeef99\n\n", 139) == \
        "segfault in worker <n> at <hash>"
    assert signature("", 127) == "exit 127 with no output"


@pytest.mark.parametrize(("text", "expected"), [
    ("/tmp/pip-build-abc123/setup.py failed", "<tmp>/setup.py failed"),
    ("/var/folders/x1/T/tmpz/a.txt", "<tmp>/a.txt"),
    ("commit 4f3a2b1c9d8e7f60", "commit <hash>"),
    ("node v18.19.0 and 1.2.3rc1", "node <version> and <version>"),
    ("took 42 s, py3dmol", "took <n> s, py3dmol"),
    ("deadbeef is a word", "deadbeef is a word"),
])
def test_uniform_tokens(text: str, expected: str) -> None:
    assert uniform(text) == expected


# --- commands split, normalised and matched --------------------------------------------

def test_a_chained_call_splits_into_its_simple_commands() -> None:
    assert simple_commands("cd app && .venv/bin/pip install x 2>&1 | tail -5; python3 -m pip install wheel") == (
        ("cd", "app"), (".venv/bin/pip", "install", "x"), ("tail", "-5"),
        ("python3", "-m", "pip", "install", "wheel"))
    assert simple_commands("$ FOO=1 sudo npm i x") == (("npm", "i", "x"),)
    # Shell the reader does not follow is one command, never an exception.
    assert simple_commands("echo 'unclosed") == (("echo", "'unclosed"),)


def test_programs_are_compared_by_name() -> None:
    assert normal((".venv/bin/python3", "-m", "pip", "install", "x")) == ("pip", "install", "x")
    assert normal(("/usr/bin/pip3", "list")) == ("pip", "list")


def test_similarity_threshold_keeps_a_dropped_pin_and_parts_another_package() -> None:
    assert similarity(("pip", "install", "tabulate"), ("pip", "install", "tabulate==0.9.0")) >= SIMILARITY
    assert similarity(("pip", "install", "wheel"), ("pip", "install", "tabulate")) < SIMILARITY
    assert similarity(("npm", "install", "x"), ("pip", "install", "x")) == 0


def test_calls_match_exactly_then_by_similarity_and_leave_the_rest_improvised() -> None:
    found, with_blocks = calls([
        ran(".venv/bin/pip install tabulate==0.0.999", 1, NO_DIST),  # before the read: still its block
        read(),
        ran("python3 -m venv .venv && .venv/bin/pip install tabulate==0.0.999 --quiet", 1, NO_DIST),
        ran("ls -la && pip install wheel"),
    ])
    assert with_blocks
    assert found[0].origin is not None and (found[0].origin.index, found[0].origin.exact) == (0, True)
    assert [(b.index, b.exact) if b else None for b in found[1].blocks] == [(0, True), (0, False)]
    assert found[1].origin is not None and (found[1].origin.page, found[1].origin.index) == (PAGE, 0)
    assert found[2].blocks == (None, None) and found[2].origin is None


def test_a_step_that_names_its_origin_is_taken_at_its_word() -> None:
    found, _ = calls([read(), ran("printf 'x' > app.py && make it", origin={"page": PAGE, "block": 1})])
    assert found[0].origin is not None and found[0].origin.index == 1
    assert "import tabulate" in found[0].origin.text
    # Each of its commands came from that block: none is improvised.
    assert found[0].blocks == (found[0].origin, found[0].origin)


def test_a_failure_overcome_later_is_not_where_the_run_broke() -> None:
    found, _ = calls([read(), ran("pip install tabulate==0.0.999", 1, NO_DIST),
                      ran("pip install tabulate==0.0.999", 0),
                      ran("python app.py", 1, "ModuleNotFoundError: No module named 'yaml'")])
    broke = breaking_call(found)
    assert broke is not None and broke.command == "python app.py"
    assert breaking_call(found[:2]) is None


# --- findings -------------------------------------------------------------------------

def _pinned(attempt: int, claim: str) -> RunTrace:
    return run(attempt, Classification.DOCS_GAP, [
        read(), ran("python -m venv .venv"), ran(".venv/bin/pip install tabulate==0.0.999", 1, NO_DIST),
        ran("pip install wheel", 0), ran(".venv/bin/pip install tabulate==0.0.998", 1, NO_DIST)],
        claim=claim)


def test_breaks_group_by_block_then_signature_and_improvised_steps_count_runs() -> None:
    runs = [
        _pinned(1, "The pin tabulate==0.0.999 does not exist."),
        _pinned(2, "the pin   tabulate==0.0.999 does not exist."),
        _pinned(3, "Step 2 fails."),
        run(4, Classification.PASSED, [read(), ran("python -m venv .venv"), ran(".venv/bin/python app.py")]),
        # Not evidential: never counted, not even in "of".
        run(5, Classification.INFRA_ERROR, [read(), ran("pip install wheel")]),
    ]
    (task,) = findings(runs)
    assert task.evidential == 4 and task.gaps == ()
    first, second = task.findings
    assert first.kind is FindingKind.BREAK
    assert (first.page, first.block, first.what) == (PAGE, 0, "No matching distribution found for tabulate==<version>")
    assert first.runs == ("pin #1", "pin #2", "pin #3") and first.of == 4
    assert "pip install tabulate==0.0.999" in (first.block_text or "")
    # The first failed call never overcome is where each run broke, the output tail beside it.
    assert first.evidence[0].command == ".venv/bin/pip install tabulate==0.0.999"
    assert first.evidence[0].output_tail.endswith("No matching distribution found for tabulate==0.0.999")
    # Claims deduplicated (case and spacing), in run order.
    assert first.claims == ("The pin tabulate==0.0.999 does not exist.", "Step 2 fails.")
    assert second.kind is FindingKind.IMPROVISED and second.what == "pip install wheel"
    assert second.runs == ("pin #1", "pin #2", "pin #3")
    assert second.headline() == "3 of 4 runs ran `pip install wheel`, which no page says"
    assert first.headline().startswith(f"3 of 4 runs broke at block 0 of {PAGE}: No matching")


def test_a_run_whose_failures_were_all_overcome_broke_at_the_check() -> None:
    r = run(1, Classification.DOCS_GAP, [read(), ran(".venv/bin/python app.py")],
            check_exit=1, check_output="expected hello\n")
    (task,) = findings([r])
    (finding,) = task.findings
    assert (finding.page, finding.block, finding.what, finding.at_check) == (None, None, "expected hello", True)
    assert finding.evidence[0].command == "(the success check)"
    assert finding.headline() == "1 of 1 runs broke at the success check: expected hello"


def test_a_gap_names_five_runs_and_counts_the_rest() -> None:
    (task,) = findings([run(i, Classification.PASSED, None) for i in range(1, 8)])
    assert gap_lines(task) == ["gap: 7 runs (pin #1, pin #2, pin #3, pin #4, pin #5, and 2 more): no trace saved"]


def test_a_missing_trace_and_pages_without_blocks_are_marked_gaps() -> None:
    runs = [run(1, Classification.DOCS_GAP, None),
            run(2, Classification.DOCS_GAP, [read(blocks=None), ran("pip install wheel", 1, "boom")])]
    (task,) = findings(runs)
    assert task.gaps == (("pin #1", "no_trace"), ("pin #2", "no_blocks"))
    # The break is still told (its signature is in the trace); no step is called improvised.
    assert [(f.kind, f.what, f.page) for f in task.findings] == [(FindingKind.BREAK, "boom", None)]
    assert task.findings[0].headline() == "1 of 2 runs broke at a command no saved block gives: boom"


# --- the figures ------------------------------------------------------------------------

def test_pass_hat_k_and_pass_at_k_against_hand_computed_values() -> None:
    # 5 runs, 3 passed: pass^2 = C(3,2)/C(5,2) = 3/10; pass^3 = 1/10; pass@2 = 1 - C(2,2)/C(5,2) = 9/10.
    assert pass_hat_k(5, 3, 2) == Fraction(3, 10)
    assert pass_hat_k(5, 3, 3) == Fraction(1, 10)
    assert pass_hat_k(5, 3, 4) == 0
    assert pass_at_k(5, 3, 2) == Fraction(9, 10)
    assert pass_at_k(5, 3, 3) == 1
    with pytest.raises(ValueError):
        pass_hat_k(2, 1, 3)


@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_hat_1_is_the_pass_rate_and_pass_hat_k_never_grows_with_k(nc: tuple[int, int]) -> None:
    n, c = nc
    assert pass_hat_k(n, c, 1) == Fraction(c, n) == pass_at_k(n, c, 1)
    hats = [pass_hat_k(n, c, k) for k in range(1, n + 1)]
    ats = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(a >= b for a, b in zip(hats, hats[1:], strict=False))
    assert all(a <= b for a, b in zip(ats, ats[1:], strict=False))


def test_quantile_interpolates_like_numpy() -> None:
    assert quantile([10.0, 20.0, 30.0, 40.0], 0.9) == pytest.approx(37.0)
    assert quantile([5.0], 0.9) == 5.0 and quantile([], 0.9) is None


def _timed(attempt: int, classification: Classification, wall: float, agent: float | None,
           usage: dict[str, Any] | None, failed: int = 0) -> RunTrace:
    events: list[dict[str, Any]] = [{"kind": "sandbox_started", "mono": 100.0},
                                    {"kind": "command", "source": "setup", "exit_code": 0, "command": "s",
                                     "mono": 101.0}]
    events += [ran("x", 1) for _ in range(failed)] + [ran("y", 0)]
    if agent is not None:
        events.append({"kind": "agent_finished", "mono": 101.0 + agent})
    return run(attempt, classification, events, duration_s=wall, commands=failed + 1,
               extra={"usage": usage} if usage is not None else {})


def test_figures_over_evidential_runs() -> None:
    runs = [
        _timed(1, Classification.PASSED, 10.0, 4.0, {"input_tokens": 100, "output_tokens": 20, "spend": "0.10"}),
        _timed(2, Classification.PASSED, 30.0, 8.0, {"input_tokens": 200, "output_tokens": 40, "spend": "0.30"}),
        _timed(3, Classification.DOCS_GAP, 50.0, 9.0, {"input_tokens": 60, "output_tokens": 0, "spend": "0.20"},
               failed=2),
        _timed(4, Classification.INFRA_ERROR, 99.0, None, None),
    ]
    f = figures("pin", runs)
    assert (f.evidential, f.passed) == (3, 2)
    assert dict(f.pass_hat) == {1: pytest.approx(2 / 3), 2: pytest.approx(1 / 3)}
    assert f.wall_s.median == 20.0 and f.wall_s.p90 == pytest.approx(28.0)
    assert f.agent_s.median == 6.0
    assert f.tokens_per_success == 210.0
    assert f.spend_per_success == Decimal("0.30")
    assert f.commands_per_run == pytest.approx(5 / 3)
    assert f.failed_command_share == pytest.approx(2 / 5)


def test_unknown_spend_is_unknown_never_zero() -> None:
    runs = [_timed(1, Classification.PASSED, 1.0, 1.0, {"input_tokens": 1, "output_tokens": 1, "spend": None}),
            _timed(2, Classification.PASSED, 1.0, 1.0, {"spend": "0.1"})]
    f = figures("t", runs)
    assert f.spend_per_success is None and f.tokens_per_success is None
    nothing = figures("t", [_timed(1, Classification.DOCS_GAP, 1.0, 1.0, {"spend": "0.1"})])
    assert nothing.spend_per_success is None and nothing.wall_s.median is None


def test_no_passing_run_is_said_so_never_called_unknown() -> None:
    nothing = figures_lines(figures("t", [_timed(1, Classification.DOCS_GAP, 1.0, 1.0, {"spend": "0.1"})]))
    assert nothing[1:3] == ["time to success: no run passed", "per success: no run passed"]
    unpriced = figures_lines(figures("t", [_timed(1, Classification.PASSED, 2.0, 1.0,
                                                  {"input_tokens": 1, "output_tokens": 1, "spend": None})]))
    assert unpriced[1:3] == ["time to success: median 2.0s, p90 2.0s (agent phase: median 1.0s, p90 1.0s)",
                             "per success: 2 tokens, spend unknown"]


def test_agent_phase_is_from_the_end_of_setup_to_agent_finished() -> None:
    assert agent_seconds([{"kind": "sandbox_started", "mono": 1.0},
                          {"kind": "command", "source": "setup", "mono": 3.0},
                          {"kind": "agent_finished", "mono": 10.5}]) == 7.5
    assert agent_seconds([{"kind": "sandbox_started", "mono": 1.0}]) is None


def test_sweep_pass_hat_k_is_the_mean_over_tasks() -> None:
    runs = [run(1, Classification.PASSED, [], task="a"), run(2, Classification.PASSED, [], task="a"),
            run(1, Classification.PASSED, [], task="b"), run(2, Classification.DOCS_GAP, [], task="b")]
    f = sweep_figures(runs)
    assert dict(f.pass_hat) == {1: 0.75, 2: 0.5}
    # A task with one run leaves pass^2 unsaid rather than averaged over the other task alone.
    assert dict(sweep_figures([*runs, run(1, Classification.DOCS_GAP, [], task="c")]).pass_hat) == {
        1: pytest.approx(0.5)}


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=3), max_leaves=8)
_SHELLISH = st.text(alphabet="ab =&|;()<>'\"`$\\{}\n#!-[]", max_size=30)


@given(st.lists(st.one_of(
    _JSON,
    st.fixed_dictionaries({"kind": st.just("command"), "source": st.just("agent"),
                           "command": _SHELLISH | _JSON, "exit_code": _JSON, "stdout": _JSON, "stderr": _JSON,
                           "origin": _JSON}),
    st.fixed_dictionaries({"kind": st.just("docs_read"), "page": st.one_of(_JSON, st.fixed_dictionaries({
        "blocks": st.lists(st.fixed_dictionaries({"page": _JSON, "index": _JSON, "text": _JSON,
                                                  "kind": st.just("shell"),
                                                  "steps": st.lists(st.fixed_dictionaries(
                                                      {"command": _SHELLISH | _JSON}), max_size=2) | _JSON}),
                           max_size=2) | _JSON}))}),
    st.fixed_dictionaries({"kind": st.sampled_from(["agent_finished", "sandbox_started"]), "mono": _JSON}),
), max_size=6))
def test_a_trace_this_version_never_wrote_gives_findings_never_an_exception(events: list[Any]) -> None:
    runs = [run(1, Classification.DOCS_GAP, events), run(2, Classification.PASSED, events)]
    findings(runs)
    figures("pin", runs)


def test_arms_matrix_rates_every_arm_on_every_task_and_tests_each_pair() -> None:
    def arm(task_counts: dict[str, tuple[int, int]]) -> list[Any]:
        out = []
        for task, (passed, gaps) in task_counts.items():
            kinds = [Classification.PASSED] * passed + [Classification.DOCS_GAP] * gaps
            out += [record(task, i, k) for i, k in enumerate(kinds, start=1)]
        return out

    # Fisher's convictions table: 10/13 against 2/17, p = 0.0005367 (R).
    m = arms_matrix([("a", arm({"quick": (10, 3), "only-a": (1, 0)})), ("b", arm({"quick": (2, 15)})),
                     ("c", arm({"quick": (1, 0)}))])
    assert m.arms == ("a", "b", "c") and m.tasks == ("quick", "only-a")
    a_quick, a_only = m.rates[0]
    assert a_quick is not None and (a_quick.passed, a_quick.evidential) == (10, 13)
    assert m.rates[1][1] is None and m.totals[0].passed == 11
    pairs = {(p.first, p.second, p.comparison.task): p.comparison for p in m.pairs}
    assert set(pairs) == {("a", "b", "quick"), ("a", "c", "quick"), ("b", "c", "quick")}
    assert pairs["a", "b", "quick"].verdict is ComparisonVerdict.REGRESSED
    assert pairs["a", "b", "quick"].p_value == pytest.approx(0.0005367, abs=5e-8)
    # 17 runs against 1: not even 0/17 against 1/1 reaches p < 0.05 (it is 1/18).
    assert pairs["b", "c", "quick"].verdict is ComparisonVerdict.TOO_SMALL


def test_a_replay_sweep_spends_nothing_per_success_and_says_so() -> None:
    # Replay records an empty usage: no model, so nothing spent, as the spend cap counts it.
    runs = [_timed(n, Classification.PASSED, 1.0, 1.0, {}) for n in (1, 2)]
    f = figures("t", runs)
    assert f.spend_per_success == Decimal(0) and f.tokens_per_success == 0
