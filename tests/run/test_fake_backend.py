"""The fake backend: refused as ``local`` is, never chosen by ``auto``, and loud in every
record that it enforced nothing; what it does carry (egress through the harness proxy) is
judged by the proxy's own records."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from run_support import fixture_task, write_task

from firstrun.agents import ReplayAgent
from firstrun.errors import SandboxUnavailable
from firstrun.policy.profile import LayerName
from firstrun.results.model import Classification
from firstrun.run.events import Event, Failure
from firstrun.run.runner import RunConfig, run_task
from firstrun.sandbox.base import Enforcement, ProxyEndpoint
from firstrun.sandbox.fake import NOTHING_ENFORCED, FakeBackend
from firstrun.sandbox.select import (
    BackendOptions,
    entry,
    ranked,
    resolve_backend,
    select_backend,
    sweep_backend,
)
from support.agents import DOCS_HOST, GREETER_DOCS, greeter_task
from support.profiles import make_profile

pytestmark = pytest.mark.fast

FIRSTRUN = Path(sys.executable).parent / "firstrun"


def test_it_is_refused_unless_unenforced_runs_are_allowed(workspace: str) -> None:
    with pytest.raises(SandboxUnavailable) as refused:
        FakeBackend().start(make_profile(workspace), proxy=None)
    assert "--allow-unenforced" in (refused.value.fix or "")
    with pytest.raises(SandboxUnavailable):
        select_backend("fake", allow_unenforced=False)
    (probe,) = FakeBackend().probe()
    assert not probe.available
    said = sweep_backend("fake", False, [None])
    assert isinstance(said, str) and said.startswith("firstrun: refused (fake):")
    assert select_backend("fake", allow_unenforced=True).name == "fake"


def test_auto_never_picks_it() -> None:
    assert entry("fake").auto_rank is None and entry("fake").unenforced
    assert "fake" not in {e.name for e in ranked(own_kernel=False)}
    assert "fake" not in {e.name for e in ranked(own_kernel=True)}
    # Even with unenforced runs allowed, auto resolves to an enforcing backend or refuses.
    try:
        chosen = resolve_backend("auto", BackendOptions(allow_unenforced=True)).backend
    except SandboxUnavailable:
        return
    assert chosen not in {"fake", "local"}


def test_every_session_says_it_enforced_nothing(workspace: str) -> None:
    with FakeBackend(allow_unenforced=True).start(make_profile(workspace), proxy=None) as session:
        info = session.info
        result = session.exec("pwd; echo made > here")
    assert (info.backend, info.enforcement) == ("fake", Enforcement.UNENFORCED)
    (check,) = info.attestation
    assert not check.passed and check.detail == NOTHING_ENFORCED
    assert "FAKE BACKEND" in check.detail
    assert {layer.name for layer in info.layers} == set(LayerName)
    assert not any(layer.applied for layer in info.layers)
    assert result.exit_code == 0 and result.stdout.text() == f"{workspace}\n"
    assert (Path(workspace) / "here").read_text() == "made\n"


def test_inspection_and_capture_are_refused_not_ignored(workspace: str, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.pem"
    bundle.write_text("")
    for endpoint in (
            ProxyEndpoint(socket_path=str(tmp_path / "p.sock"), nonce="n", trust_bundle=str(bundle)),
            ProxyEndpoint(socket_path=str(tmp_path / "p.sock"), nonce="n",
                          transparent_path=str(tmp_path / "t.sock"),
                          dns_path=str(tmp_path / "d.sock"))):
        with pytest.raises(SandboxUnavailable):
            FakeBackend(allow_unenforced=True).start(make_profile(workspace), proxy=endpoint)


@pytest.fixture
def fake(config: RunConfig) -> RunConfig:
    return replace(config, backend="fake", allow_unenforced=True)


def test_a_run_records_it_and_its_egress_goes_through_the_proxy(fake: RunConfig,
                                                              tmp_path: Path) -> None:
    events: list[Event] = []
    record = run_task(fixture_task("pass"), attempt=1, agent=ReplayAgent(), config=fake,
                      on_event=events.append)
    assert (record.classification, record.reason) == (Classification.PASSED, "passed")
    assert (record.backend, record.enforcement) == ("fake", "unenforced")
    assert [c["name"] for c in record.attestation] == ["fake_backend_enforces_nothing"]
    assert not record.attestation[0]["passed"]
    assert all(not layer["applied"] for layer in record.layers)
    # The proxy variables lead to the harness proxy, which refuses the docs host on the shell.
    task = write_task(tmp_path, "curl", f"name: curl\ngoal: Fetch the docs from the shell.\n"
                    f"docs:\n  entrypoint: http://{DOCS_HOST}/\n"
                    f"replay:\n  - run: curl -sS -o /dev/null -w '%{{http_code}}' http://{DOCS_HOST}/\n"
                      "    undocumented: the shell reaching for the docs host\n"
                      "success:\n  script: |\n    test -d . || qs_fail gone\n")
    curled = run_task(task, attempt=1, agent=ReplayAgent(), config=fake)
    (blocked,) = curled.blocked_egress
    assert (blocked["host"], blocked["channel"], blocked["reason"]) == (
        DOCS_HOST, "shell", "docs_host_on_shell")


def test_a_run_without_the_allowance_is_refused_as_infra_error(fake: RunConfig) -> None:
    events: list[Event] = []
    record = run_task(fixture_task("pass"), attempt=1, agent=ReplayAgent(),
                      config=replace(fake, allow_unenforced=False), on_event=events.append)
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR,
                                                      "sandbox_refused")
    (failure,) = [e for e in events if isinstance(e, Failure)]
    assert failure.infra and failure.phase == "sandbox" and failure.who == "fake"


def test_the_cli_refuses_it_in_one_line_and_records_it_when_allowed(tmp_path: Path) -> None:
    task = greeter_task(tmp_path)
    mirror = ["--docs-mirror", f"{DOCS_HOST}={GREETER_DOCS}"]
    refused = subprocess.run([str(FIRSTRUN), "run", str(task.path), *mirror, "--backend", "fake",
                              "--out", str(tmp_path / "refused")],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.startswith("firstrun: refused (fake):")
    assert "--allow-unenforced" in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert not (tmp_path / "refused" / "runs").exists()
    allowed = subprocess.run([str(FIRSTRUN), "run", str(task.path), *mirror, "--backend", "fake",
                              "--allow-unenforced", "--out", str(tmp_path / "allowed")],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    (saved,) = json.loads((tmp_path / "allowed" / "results.json").read_text())["runs"]
    assert (saved["backend"], saved["enforcement"]) == ("fake", "unenforced"), allowed.stderr
    assert "FAKE BACKEND" in saved["attestation"][0]["detail"]
