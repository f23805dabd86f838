"""Every classification the replay agent can reach, reached for real in one suite.

One ``firstrun run`` over the fixture tasks (real bubblewrap, real proxy,
the fixture docs served from a directory mirror); each run is judged by its
saved record and by its trace: what ran, what did not, and why. The linux
backend is named, not left to ``auto`` (docker where a daemon answers): the
harness's own proxy hands each record over before it answers, so which step
a refusal belongs to is exact; the docker sidecar's records reach the
harness a moment late, through the daemon.

Not here, and why: ``agent_refusal`` needs an agent that can refuse, which
replay cannot (the LLM agents' issue covers it); ``harness_error`` means a
bug in firstrun, and there is no honest way to cause one from outside
without a backdoor in product code (its mapping is covered by the runner's
classification table).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from e2e_support import DOCS, DOCS_HOST, FIRSTRUN, events, runs_by_task, task, trace_of

from firstrun.agents import make_agent
from firstrun.docs import Mirror
from firstrun.results.store import ResultsStore
from firstrun.run.runner import RunConfig
from firstrun.run.suite import run_suite, suite_exit_code
from firstrun.tasks.load import load_tasks

pytestmark = pytest.mark.e2e

FIXTURES = [
    "passes",
    "replay-step-fails",
    "check-fails",
    "turns-budget",
    "disk-budget",
    "setup-fails",
    "no-replay",
    *(f"blocked-{reason}" for reason in ("not-allowed", "port-not-allowed", "dns-not-allowed",
                                         "ip-literal", "tcp-not-allowed", "udp-not-allowed")),
]
# What each blocked fixture is refused, and the task lines that would allow it.
BLOCKED = {
    "not-allowed": ("not_allowed", "example.com:443", {"allow": ["example.com"]}),
    "port-not-allowed": ("port_not_allowed", "pypi.org:8443", {"allow": ["pypi.org:8443"]}),
    "dns-not-allowed": ("dns_not_allowed", "example.com", {"allow": ["example.com"]}),
    "ip-literal": ("ip_literal", "203.0.113.80:443", {"allow": ["203.0.113.80:443"]}),
    "tcp-not-allowed": ("tcp_not_allowed", "pypi.org:443", {"tcp": ["pypi.org:443"]}),
    # Nothing a task can write lets a datagram out: no lines to suggest.
    "udp-not-allowed": ("udp_not_allowed", "pypi.org:443", {}),
}
ROUTE = [f"https://{DOCS_HOST}/index.html", f"https://{DOCS_HOST}/guide.html"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    out = tmp_path_factory.mktemp("classes") / "out"
    done = subprocess.run(
        [str(FIRSTRUN), "run", *(task(name) for name in FIXTURES), "--agent", "replay",
         "--backend", "linux", "--docs-mirror", f"{DOCS_HOST}={DOCS}", "--out", str(out)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )
    return done.returncode, out


def _run(suite: tuple[int, Path], name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    _, out = suite
    run = runs_by_task(out)[f"e2e-{name}"]
    return run, trace_of(out, run)


def _verdict(trace: list[dict[str, Any]]) -> tuple[str, str]:
    (finished,) = events(trace, "run_finished")
    return finished["classification"], finished["reason"]


def test_a_docs_gap_in_the_suite_makes_the_exit_status_1(suite: tuple[int, Path]) -> None:
    code, out = suite
    assert code == 1
    assert len(runs_by_task(out)) == len(FIXTURES)


def test_passed(suite: tuple[int, Path]) -> None:
    run, trace = _run(suite, "passes")
    assert (run["classification"], run["reason"]) == ("passed", "passed") == _verdict(trace)
    assert [p["url_requested"] for p in run["pages"]] == ROUTE
    assert run["check_exit"] == 0 and run["last_page_before_failure"] is None


def test_docs_gap_when_a_documented_step_fails(suite: tuple[int, Path]) -> None:
    run, trace = _run(suite, "replay-step-fails")
    assert (run["classification"], run["reason"]) == ("docs_gap", "replay_step_failed")
    assert _verdict(trace) == ("docs_gap", "replay_step_failed")
    # Replay stops at the first failure: the second step never ran.
    (step,) = events(trace, "command", source="agent")
    assert step["command"] == "cat greeting-template.txt" and step["exit_code"] != 0
    assert run["last_page_before_failure"] == ROUTE[-1]
    assert run["check_exit"] == 1


def test_docs_gap_when_the_steps_succeed_and_the_check_fails(suite: tuple[int, Path]) -> None:
    run, trace = _run(suite, "check-fails")
    assert (run["classification"], run["reason"]) == ("docs_gap", "check_failed") == _verdict(trace)
    assert all(c["exit_code"] == 0 for c in events(trace, "command", source="agent"))
    assert run["check_exit"] == 1
    assert "check failed: greeting.txt does not say hello" in run["check_output"]


def test_budget_exhausted_when_the_turns_run_out(suite: tuple[int, Path]) -> None:
    run, trace = _run(suite, "turns-budget")
    assert (run["classification"], run["reason"]) == ("budget_exhausted", "budget_exhausted")
    assert _verdict(trace) == ("budget_exhausted", "budget_exhausted")
    assert [c["command"] for c in events(trace, "command", source="agent")] == ["echo preparing"]
    (finished,) = events(trace, "agent_finished")
    assert finished["stop"] == "budget_exhausted" and finished["turns"] == 1
    # The check still ran and decided that the goal was not reached.
    assert run["check_exit"] == 1


def test_budget_exhausted_when_the_workspace_disk_fills(suite: tuple[int, Path]) -> None:
    run, trace = _run(suite, "disk-budget")
    assert (run["classification"], run["reason"]) == ("budget_exhausted", "disk_exhausted")
    assert _verdict(trace) == ("budget_exhausted", "disk_exhausted")
    (dd,) = events(trace, "command", source="agent")
    assert dd["exit_code"] != 0 and "No space left on device" in dd["stderr"]
    (disk,) = events(trace, "workspace_disk")
    assert disk["bound_bytes"] == 32 << 20 and disk["reached"] is True
    assert 24 << 20 < disk["peak_bytes"] <= 32 << 20
    assert run["extra"]["disk"]["reached"] is True
    assert "disk bound of 32 MiB" in run["detail"]


def test_a_run_records_the_default_disk_bound_it_ran_under(suite: tuple[int, Path]) -> None:
    _, trace = _run(suite, "passes")
    (disk,) = events(trace, "workspace_disk")
    assert disk["bound_bytes"] == 4096 << 20 and disk["reached"] is False
    assert disk["mechanism"] == "ext4 in a sparse image, loop-mounted"


def test_infra_error_when_setup_fails_and_the_agent_never_starts(suite: tuple[int, Path]) -> None:
    run, trace = _run(suite, "setup-fails")
    assert (run["classification"], run["reason"]) == ("infra_error", "setup_failed")
    assert _verdict(trace) == ("infra_error", "setup_failed")
    (setup,) = events(trace, "command", source="setup")
    assert setup["exit_code"] != 0
    assert events(trace, "command", source="agent") == []
    assert events(trace, "docs_read") == [] and events(trace, "check_finished") == []


def test_skipped_when_there_is_nothing_to_replay(suite: tuple[int, Path]) -> None:
    run, trace = _run(suite, "no-replay")
    assert (run["classification"], run["reason"]) == ("skipped", "no_replay") == _verdict(trace)
    assert events(trace, "command") == [] and events(trace, "check_finished") == []


def test_a_sweep_whose_backend_is_unusable_starts_no_run_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bubblewrap is found through PATH; a PATH without it is a machine without
    # it. The CLI refuses such a sweep up front; run_suite checks the backend
    # before each run and starts none on a backend that cannot enforce. (A
    # refusal of one run's own, recorded as sandbox_refused, is in
    # tests/microvm/test_isolation.py.)
    monkeypatch.setenv("PATH", str(tmp_path))
    out = tmp_path / "out"
    store = ResultsStore(out, meta={})
    config = RunConfig(out_dir=out, backend="linux",
                       docs_mirrors={DOCS_HOST: Mirror(host=DOCS_HOST, directory=str(DOCS))})
    outcome = run_suite(load_tasks([task("passes")]), agent_factory=lambda: make_agent("replay"),
                        config=config, store=store)
    assert outcome.records == [] and suite_exit_code(outcome.records) == 2
    assert outcome.backend_lost is not None and "bubblewrap" in outcome.backend_lost
    assert not (out / "runs").exists()


@pytest.mark.parametrize("name", sorted(BLOCKED))
def test_blocked_when_the_check_fails_after_the_boundary_refused(
        suite: tuple[int, Path], name: str) -> None:
    reason, where, fix = BLOCKED[name]
    run, trace = _run(suite, f"blocked-{name}")
    assert (run["classification"], run["reason"]) == ("blocked", "egress_refused") == \
        _verdict(trace)
    assert reason in {r["reason"] for r in run["blocked_egress"]}, run["blocked_egress"]
    assert run["allow_fix"] == fix
    assert where in run["detail"]
    # The agent was told, in the command's own result, what was refused and why.
    step = events(trace, "command", source="agent")[0]
    assert f"[sandbox] refused {where} ({reason})" in step["refusals"], step["refusals"]
    # The record names the failed step that was refused, and what was.
    (blocked_by, *_) = run["extra"]["blocked_by"]
    assert (blocked_by["step"], blocked_by["source"]) == (step["command"], "agent")
    assert f"{where} ({reason})" in blocked_by["refusals"], blocked_by
