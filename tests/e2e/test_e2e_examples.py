"""The main job: ``firstrun run --example all --agent replay``, a Python and a Node quickstart in one suite.

Each example reads its bundled docs through a directory mirror, installs a
real package from a real registry through the egress proxy, and passes its
own check; judged by what the run saved.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from e2e_support import FIRSTRUN, Run, events, runs_by_task, trace_of

from firstrun.examples import list_examples
from firstrun.tasks.load import load_task

pytestmark = pytest.mark.e2e

REGISTRIES = {
    "python-tabulate": {"pypi.org", "files.pythonhosted.org"},
    "node-ms": {"registry.npmjs.org"},
    "node-fetch": {"registry.npmjs.org"},
}


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("examples") / "out"
    done = subprocess.run(
        [str(FIRSTRUN), "run", "--example", "all", "--agent", "replay", "--out", str(out)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_one_suite_runs_every_example_and_each_passes(out: Path) -> None:
    runs = runs_by_task(out)
    assert set(runs) == {e.name for e in list_examples()} == set(REGISTRIES)
    for run in runs.values():
        assert (run["classification"], run["reason"], run["check_exit"]) == ("passed", "passed", 0)
        assert run["backend"] == "linux" and run["enforcement"] == "enforced"
        assert run["attestation"] and all(a["passed"] for a in run["attestation"])
        assert run["blocked_egress"] == []


@pytest.mark.parametrize("example", list_examples(), ids=lambda e: e.name)
def test_the_replay_runs_the_route_pages_blocks_each_naming_its_page_and_block(
    out: Path, example
) -> None:
    run = runs_by_task(out)[example.name]
    task = load_task(example.task_path)
    trace = trace_of(out, run)
    reads = events(trace, "docs_read")
    assert [r["page"]["url_requested"] for r in reads] == list(task.docs_route)
    assert all(r["route"] and r["page"]["status"] == 200 for r in reads)
    assert [p["url_final"] for p in run["pages"]] == list(task.docs_route)
    # Every shell and file block of the route ran, in route order, each after
    # its page was read and recorded with the page and block it came from.
    documented = [(r["page"]["url_requested"], b["index"], step["command"])
                  for r in reads for b in r["page"]["blocks"] if b["kind"] == "shell"
                  for step in b["steps"]]
    files = [(r["page"]["url_requested"], b["index"]) for r in reads for b in r["page"]["blocks"]
             if b["kind"] == "file"]
    commands = events(trace, "command", source="agent")
    assert all(c["exit_code"] == 0 for c in commands)
    ran = [(c["origin"]["page"], c["origin"]["block"]) for c in commands]
    assert ran == sorted(ran, key=lambda o: (task.docs_route.index(o[0]), o[1]))
    assert [(p, b, c["command"]) for (p, b), c in zip(ran, commands, strict=True)
            if (p, b) not in files] == documented
    assert [o for o in ran if o in files] == files and len(files) == 1
    seqs = {e["page"]["url_requested"]: e["seq"] for e in reads}
    assert all(seqs[c["origin"]["page"]] < c["seq"] for c in commands)


@pytest.mark.parametrize("example", list_examples(), ids=lambda e: e.name)
def test_the_install_went_to_the_real_registry_through_the_proxy(
    out: Path, example
) -> None:
    trace = trace_of(out, runs_by_task(out)[example.name])
    shell = [e["record"] for e in events(trace, "egress") if e["record"]["channel"] == "shell"
             and e["record"]["reason"] != "attestation"]
    assert {r["host"] for r in shell} == REGISTRIES[example.name]
    assert all(r["decision"] == "allow" and r["reason"] == "allowed_by_list" for r in shell)
    assert all(r["bytes_down"] > 0 for r in shell)
    # The docs came from the bundle, never over the network or the shell.
    assert not any(example.docs_host == r["host"] for r in shell)


def test_the_installed_package_ran_and_printed_what_the_docs_show(out: Path) -> None:
    runs = runs_by_task(out)
    python = events(trace_of(out, runs["python-tabulate"]), "command", source="agent")
    assert "Successfully installed tabulate" in python[1]["stdout"]
    assert "| Earth    |          6371 |       1 |" in python[-1]["stdout"].splitlines()
    node = events(trace_of(out, runs["node-ms"]), "command", source="agent")
    assert "added 1 package" in node[1]["stdout"]
    assert node[-1]["stdout"].splitlines() == ["172800000", "3600000", "1m", "2 minutes"]
    # Node's fetch read no proxy variable: the registry was reached by capture alone.
    fetched = events(trace_of(out, runs["node-fetch"]), "command", source="agent")
    name, licence = fetched[-1]["stdout"].splitlines()
    assert re.fullmatch(r"ms \d+\.\d+\.\d+", name) and licence == "licence: MIT"
    registry = [e["record"] for e in events(trace_of(out, runs["node-fetch"]), "egress")
                if e["record"]["host"] == "registry.npmjs.org"]
    assert registry and {r["capture"] for r in registry} == {"transparent"}


def test_an_unknown_example_is_a_usage_error_naming_the_flag(firstrun: Run, tmp_path: Path) -> None:
    done = firstrun("run", "--example", "pyton-tabulate", "--out", str(tmp_path / "out"))
    assert done.returncode == 3
    assert "--example" in done.stderr and "python-tabulate" in done.stderr
    assert not (tmp_path / "out" / "results.json").exists()
