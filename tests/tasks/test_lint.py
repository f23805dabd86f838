from __future__ import annotations

from pathlib import Path

import pytest

from firstrun.tasks.lint import Code, Severity, lint_task
from firstrun.tasks.load import load_task, read_task
from firstrun.tasks.model import CheckIsolation

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"

HEAD = "name: t\ngoal: g\ndocs: {entrypoint: https://docs.example.org/}\n"


def _lint(write_task, body: str, head: str = HEAD):
    task = read_task(write_task(head + body))
    return task, [(f.severity, f.code, f.line) for f in lint_task(task)]


@pytest.mark.parametrize("path", sorted((FIXTURES / "valid").glob("*.yaml")), ids=lambda p: p.name)
def test_valid_fixtures_are_clean(path: Path) -> None:
    assert lint_task(load_task(path)) == []


def test_no_criterion(write_task) -> None:
    _, found = _lint(write_task, "success:\n  script: ''\n")
    assert found == [(Severity.ERROR, Code.NO_CRITERION, 4)]


def test_serve_without_criterion(write_task) -> None:
    _, found = _lint(write_task, "success:\n  serve: ./server --port $QS_PORT\n")
    assert found == [(Severity.ERROR, Code.SERVE_WITHOUT_CRITERION, 5)]


def test_serve_with_wait_http_is_fine(write_task) -> None:
    _, found = _lint(write_task, "success:\n  serve: ./server\n  wait_http: {path: /}\n")
    assert found == []


def test_wait_http_on_loopback_with_no_serve_warns_that_the_check_shares(write_task) -> None:
    task, found = _lint(write_task, "success:\n  wait_http: {path: /health}\n")
    assert found == [(Severity.WARNING, Code.CHECK_SHARED, 5)]
    assert task.spec.success.isolation() is CheckIsolation.SHARED


@pytest.mark.parametrize("success", [
    "  wait_http: {url: 'http://localhost:8000/'}\n",
    "  wait_http: {url: 'http://127.0.0.2:8000/'}\n",
    "  wait_http: {url: 'http://[::1]:8000/'}\n",
])
def test_every_loopback_url_is_a_shared_check(write_task, success: str) -> None:
    task, found = _lint(write_task, "success:\n" + success)
    assert [code for _, code, _ in found] == [Code.CHECK_SHARED]
    assert task.spec.success.isolation() is CheckIsolation.SHARED


@pytest.mark.parametrize("success", [
    "  serve: ./server\n  wait_http: {path: /}\n",
    "  wait_http: {url: 'https://app.example.org/health'}\n",
    "  script: test -f a.py\n",
    "  expect_output: {contains: ok}\n",
])
def test_every_other_check_runs_clean(write_task, success: str) -> None:
    task, found = _lint(write_task, "success:\n" + success)
    assert Code.CHECK_SHARED not in [code for _, code, _ in found]
    assert task.spec.success.isolation() is CheckIsolation.CLEAN


def test_check_that_always_passes(write_task) -> None:
    task, found = _lint(write_task, "success:\n  script: |\n    echo checking\n    echo done\n")
    assert found == [(Severity.ERROR, Code.CHECK_ALWAYS_PASSES, 5)]


def test_a_weak_script_beside_a_declarative_criterion_is_not_an_error(write_task) -> None:
    _, found = _lint(
        write_task, "success:\n  expect_output: {contains: ok}\n  script: echo extra\n"
    )
    assert found == []


def test_ignored_and_masked_failures_point_into_the_script(write_task) -> None:
    body = (
        "success:\n"
        "  script: |\n"
        "    test -f a.py\n"  # line 6: forgotten, not last
        "    grep -q x a.py || true\n"  # line 7: masked
        "    .venv/bin/python a.py | tee out\n"  # line 8: masked by tee
        "    test -f b.py\n"
        "setup: [python3 -m venv .venv]\n"
    )
    _, found = _lint(write_task, body)
    assert found == [
        (Severity.WARNING, Code.FAILURE_IGNORED, 6),
        (Severity.WARNING, Code.FAILURE_MASKED, 7),
        (Severity.WARNING, Code.FAILURE_MASKED, 8),
    ]


def test_findings_in_a_check_file_name_that_file(write_task) -> None:
    check = write_task("# header\ntest -f a\ntest -f b\n", name="checks/c.sh")
    task, found = _lint(write_task, "success:\n  file: checks/c.sh\n")
    (finding,) = lint_task(task)
    assert (finding.file, finding.line, finding.code) == (str(check), 2, Code.FAILURE_IGNORED)
    assert str(finding) == f"{check}:2: warning: {finding.message} [failure_ignored]"


def test_env_dir_nothing_creates(write_task) -> None:
    body = "success:\n  script: |\n    set -e\n    venv/bin/python -c 'import x'\n"
    _, found = _lint(write_task, body)
    assert found == [(Severity.WARNING, Code.UNPREPARED_ENV, 7)]


@pytest.mark.parametrize(
    "creator", ["setup: [python3 -m venv .venv]", "replay: [uv venv]", "replay: ['uv sync']",
                # The commands are the pages', which a lint that reads none cannot judge.
                "replay: docs"]
)
def test_env_dir_created_by_setup_or_replay(write_task, creator: str) -> None:
    body = f"success:\n  script: |\n    set -e\n    .venv/bin/python -c 'import x'\n{creator}\n"
    _, found = _lint(write_task, body)
    assert found == []


def test_system_bin_dirs_are_not_environments(write_task) -> None:
    _, found = _lint(write_task, "success:\n  script: /usr/bin/env python3 -c 'import x'\n")
    assert found == []


def test_route_outside_docs_allow(write_task) -> None:
    head = (
        "name: t\ngoal: g\ndocs:\n  path:\n    - https://vite.dev/guide/\n"
        "    - https://vitejs.dev/guide/build\n  allow: [vitejs.dev]\n"
    )
    _, found = _lint(write_task, "success: {script: test -f a}\n", head=head)
    assert found == [(Severity.WARNING, Code.DOCS_ROUTE_OUTSIDE_ALLOW, 5)]


def test_docs_host_over_a_registry_or_network_allow(write_task) -> None:
    head = (
        "name: t\ngoal: g\ndocs:\n  entrypoint: https://docs.example.org/\n"
        "  allow: [example.org, pythonhosted.org, example.net]\n"
    )
    task, found = _lint(
        write_task, "network: {allow: [api.example.net]}\nsuccess: {script: test -f a}\n", head=head
    )
    assert found == [
        (Severity.WARNING, Code.DOCS_HOST_SHADOWS_SHELL, 5),
        (Severity.WARNING, Code.DOCS_HOST_SHADOWS_SHELL, 5),
    ]
    messages = [f.message for f in lint_task(task)]
    assert "files.pythonhosted.org, a default registry" in messages[0]
    assert "api.example.net, named under network" in messages[1]


def test_network_allow_unused_beside_only(write_task) -> None:
    _, found = _lint(
        write_task,
        "network: {only: [a.example.net], allow: [b.example.net]}\nsuccess: {script: test -f a}\n",
    )
    assert found == [(Severity.WARNING, Code.NETWORK_ALLOW_UNUSED, 4)]


def test_a_tcp_rule_is_explained_and_compiled(write_task) -> None:
    from firstrun.tasks.compile import compile_network_policy

    task, found = _lint(write_task, "success:\n  script: test -f a.py\n"
                        "firstrun:\n  network:\n    tcp: [github.com:22]\n")
    assert found == [(Severity.NOTE, Code.TCP_RULE, 8)]
    assert [str(p) for p in compile_network_policy(task).tcp] == ["github.com:22"]


@pytest.mark.parametrize("entry", ["github.com", "*.example.com:22", "github.com:0"])
def test_a_tcp_rule_without_one_name_and_one_port_names_its_line(write_task, entry: str) -> None:
    from firstrun.errors import TaskError

    with pytest.raises(TaskError) as caught:
        read_task(write_task(HEAD + "success:\n  script: test -f a.py\n"
                             f"firstrun:\n  network:\n    tcp: ['{entry}']\n"))
    assert caught.value.line == 8 and "tcp" in str(caught.value)
