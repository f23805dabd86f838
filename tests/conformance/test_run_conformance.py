"""Runs on every available backend: the trace and the classification do not depend on the backend.

The docker backend's shell channel is its sidecar, the linux backend's the
harness proxy; both are the same proxy module fed the same policy, and the
records reach the trace while the command runs, so one task must classify
the same on both, with the same blocked egress, and task-level network
overrides must apply the same way.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
from conformance_support import AVAILABLE

from firstrun.agents.replay import ReplayAgent
from firstrun.docs import Mirror
from firstrun.results.model import RunRecord
from firstrun.results.store import ResultsStore
from firstrun.run.config import RunConfig
from firstrun.run.runner import run_task
from firstrun.run.suite import run_suite
from firstrun.sandbox.docker.resources import docker
from firstrun.tasks.load import load_task
from firstrun.tasks.model import Task

FIXTURE_DOCS = Path(__file__).parents[1] / "support" / "greeter_docs"
DOCS_HOST = "docs.greeter.test"

DENIED = """\
name: denied-egress
goal: Fetch the page the quickstart names and keep what came back.
docs:
  path:
    - http://docs.greeter.test/
replay:
  - run: curl -sS -o got.html -w '%{http_code}' http://denied.example/page > code.txt; true
    undocumented: a test step, not the guide's
  - run: curl -sS -o docs.html http://docs.greeter.test/; true
    undocumented: a test step, not the guide's
success:
  script: |
    grep -q '^200$' code.txt || qs_fail "the page did not come back: $(cat code.txt)"
"""

OVERRIDES = """\
name: overrides
goal: Reach PyPI, and only PyPI.
docs:
  path:
    - http://docs.greeter.test/
network:
  only:
    - pypi.org
replay:
  - run: curl -sS -o /dev/null -w '%{http_code}\\n' https://pypi.org/simple/tabulate/ >> codes.txt
    undocumented: a test step, not the guide's
  - run: curl -sS -o /dev/null -w '%{http_code}\\n' https://deb.debian.org/debian/ >> codes.txt; true
    undocumented: a test step, not the guide's
success:
  script: |
    test "$(head -n1 codes.txt)" = 200 || qs_fail "pypi.org was not reachable"
"""

# network.allow names a host (with its subdomains) on top of the defaults,
# and the task's own deny wins over a default registry.
ALLOW_AND_DENY = """\
name: allow-and-deny
goal: Reach PyPI, but not Debian.
docs:
  path:
    - http://docs.greeter.test/
network:
  allow:
    - pypi.org
firstrun:
  network:
    deny:
      - deb.debian.org
replay:
  - run: curl -sS -o /dev/null -w '%{http_code}\\n' https://pypi.org/simple/tabulate/ >> codes.txt
    undocumented: a test step, not the guide's
  - run: curl -sS -o /dev/null -w '%{http_code}\\n' https://deb.debian.org/debian/ >> codes.txt; true
    undocumented: a test step, not the guide's
success:
  script: |
    test "$(head -n1 codes.txt)" = 200 || qs_fail "pypi.org was not reachable"
"""


def _task(tmp_path: Path, text: str) -> Task:
    path = tmp_path / f"task-{uuid.uuid4().hex[:8]}.yaml"
    path.write_text(text, encoding="utf-8")
    return load_task(path)


def _config(tmp_path: Path, backend: str) -> RunConfig:
    return RunConfig(out_dir=tmp_path / f"out-{backend}", backend=backend,
                     docs_mirrors={DOCS_HOST: Mirror(host=DOCS_HOST, directory=str(FIXTURE_DOCS))})


def _egress(record: RunRecord) -> list[tuple[object, ...]]:
    return [(r["channel"], r["host"], r["decision"], r["reason"], r["layer"])
            for r in record.blocked_egress]


def _run_on_each(tmp_path: Path, text: str) -> dict[str, RunRecord]:
    task = _task(tmp_path, text)
    return {backend: run_task(task, attempt=1, agent=ReplayAgent(),
                              config=_config(tmp_path, backend))
            for backend in AVAILABLE}


@pytest.mark.skipif(len(AVAILABLE) < 2, reason="needs two available backends to compare")
def test_a_denied_egress_classifies_the_same_on_every_backend(tmp_path: Path) -> None:
    records = _run_on_each(tmp_path, DENIED)
    assert {r.backend for r in records.values()} == set(AVAILABLE)
    outcomes = {(r.classification, r.reason, r.enforcement) for r in records.values()}
    assert len(outcomes) == 1, records
    egress = {backend: _egress(r) for backend, r in records.items()}
    first = next(iter(egress.values()))
    assert ("shell", "denied.example", "deny", "not_allowed", "default") in first
    assert any(host == DOCS_HOST for _, host, *_ in first), first
    assert all(e == first for e in egress.values()), egress


@pytest.mark.skipif(len(AVAILABLE) < 2, reason="needs two available backends to compare")
@pytest.mark.parametrize("text", [OVERRIDES, ALLOW_AND_DENY], ids=["only", "allow-and-deny"])
def test_task_network_overrides_apply_the_same_on_every_backend(tmp_path: Path,
                                                                text: str) -> None:
    records = _run_on_each(tmp_path, text)
    for backend, record in records.items():
        assert record.classification.value == "passed", (backend, record.detail)
        # deb.debian.org is a default registry; the task took it away.
        assert [(h, d) for _, h, d, *_ in _egress(record)] == [("deb.debian.org", "deny")], backend
    egress = [_egress(r) for r in records.values()]
    assert all(e == egress[0] for e in egress)


@pytest.mark.skipif("docker" not in AVAILABLE, reason="the docker backend is not available here")
def test_a_sweep_resolves_once_and_stops_when_its_backend_goes_away(tmp_path: Path) -> None:
    # A tag of our own, removed after the first run: the backend that auto
    # chose is then unavailable, and the sweep must stop, not switch.
    tag = f"firstrun/conformance-vanishing:{uuid.uuid4().hex[:8]}"
    docker("tag", "firstrun/python:3.11", tag)
    task = _task(tmp_path, DENIED.replace("name: denied-egress", "name: vanishing"))
    store = ResultsStore(tmp_path / "sweep", meta={})
    try:
        def on_event(name: str, attempt: int, event: object) -> None:
            if getattr(event, "kind", "") == "run_finished" and attempt == 1:
                docker("image", "rm", tag)

        config = RunConfig(out_dir=tmp_path / "sweep", backend="auto", image=tag,
                           docs_mirrors=_config(tmp_path, "auto").docs_mirrors)
        outcome = run_suite([task], agent_factory=ReplayAgent, config=config, store=store,
                            repeat=3, on_event=on_event)
    finally:
        subprocess.run(["docker", "image", "rm", tag], capture_output=True, check=False)
    assert outcome.resolution is not None and outcome.resolution.backend == "docker"
    assert [r.backend for r in outcome.records] == ["docker"]
    assert len(store.runs()) == 1
    assert outcome.backend_lost is not None and tag in outcome.backend_lost
    assert "firstrun images build" in outcome.backend_lost or "docker pull" in outcome.backend_lost


def test_auto_explains_why_docker_was_passed_over() -> None:
    from firstrun.sandbox.select import BackendOptions, resolve_backend

    if "linux" not in AVAILABLE:
        pytest.skip("needs the linux backend to fall to")
    resolution = resolve_backend("auto", BackendOptions(), ["firstrun/absent-image:0"])
    assert resolution.backend == "linux"
    (why,) = resolution.passed_over
    assert why.startswith("docker: image") and "firstrun/absent-image:0" in why
    assert "docker pull firstrun/absent-image:0" in why
    assert "not docker: image" in resolution.explain()
