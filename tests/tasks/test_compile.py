from __future__ import annotations

from firstrun.policy.decision import Reason
from firstrun.policy.network import DEFAULT_ALLOW, Channel, Request, decide_name
from firstrun.tasks.compile import compile_network_policy, covering_patterns
from firstrun.tasks.load import read_task


def _task(write_task, extra: str = "", docs: str = "{entrypoint: https://docs.example.org/start}"):
    head = f"name: t\ngoal: g\ndocs: {docs}\nsuccess: {{script: test -f a}}\n"
    return read_task(write_task(head + extra))


def _shell(policy, host: str, port: int = 443):
    return decide_name(policy, Request(channel=Channel.SHELL, host=host, port=port))


def _docs(policy, host: str, port: int = 443):
    return decide_name(policy, Request(channel=Channel.DOCS, host=host, port=port))


def test_docs_hosts_are_docs_channel_only(write_task) -> None:
    policy = compile_network_policy(
        _task(write_task, docs="{path: [https://docs.example.org/a], allow: [example.net]}")
    )
    for host in ("docs.example.org", "www.docs.example.org", "example.net", "api.example.net"):
        assert _docs(policy, host).allowed
        assert _shell(policy, host).reason is Reason.DOCS_HOST_ON_SHELL
    assert _docs(policy, "pypi.org").reason is Reason.NOT_DOCS_HOST
    assert _shell(policy, "pypi.org").allowed


def test_a_docs_host_named_under_network_allow_is_opened_to_the_shell_and_marked(write_task) -> None:
    # quickstarted's rule, so its task files run unchanged: the explicit
    # entry wins over attribution, and every such request says so.
    task = _task(
        write_task,
        docs="{entrypoint: https://pypi.org/project/x/}",
        extra="network: {allow: [pypi.org]}",
    )
    policy = compile_network_policy(task)
    opened = _shell(policy, "pypi.org")
    assert opened.allowed and opened.reason is Reason.ALLOWED_DOCS_HOST_ON_SHELL
    assert _docs(policy, "pypi.org").allowed


def test_a_docs_host_covering_only_a_default_registry_stays_off_the_shell(write_task) -> None:
    task = _task(write_task, docs="{entrypoint: https://pypi.org/project/x/}")
    policy = compile_network_policy(task)
    assert _shell(policy, "pypi.org").reason is Reason.DOCS_HOST_ON_SHELL
    assert _docs(policy, "pypi.org").allowed


def test_network_allow_adds_to_defaults_with_subdomains(write_task) -> None:
    policy = compile_network_policy(
        _task(write_task, extra="network: {allow: [binaries.example.net]}")
    )
    assert _shell(policy, "binaries.example.net").allowed
    assert _shell(policy, "eu.binaries.example.net").allowed
    assert _shell(policy, "example.net").reason is Reason.NOT_ALLOWED
    assert _shell(policy, "evil-binaries.example.net").reason is Reason.NOT_ALLOWED
    for registry in DEFAULT_ALLOW:
        assert _shell(policy, registry).allowed
    # The defaults stay exact names.
    assert _shell(policy, "evil.pypi.org").reason is Reason.NOT_ALLOWED


def test_network_only_replaces_defaults(write_task) -> None:
    policy = compile_network_policy(
        _task(write_task, extra="network: {only: [registry.example.net]}")
    )
    assert _shell(policy, "registry.example.net").allowed
    assert _shell(policy, "pypi.org").reason is Reason.NOT_ALLOWED


def test_firstrun_extensions_compile_exactly(write_task) -> None:
    extra = (
        "network: {allow: [example.net]}\n"
        "firstrun:\n"
        "  network:\n"
        "    deny: [track.example.net]\n"
        "    overrides:\n"
        "      - host: mirror.corp.example:8443\n"
        "        networks: [10.20.0.0/16]\n"
    )
    policy = compile_network_policy(_task(write_task, extra=extra))
    assert _shell(policy, "track.example.net").reason is Reason.DENIED_BY_LIST
    assert _shell(policy, "mirror.corp.example", 8443).reason is Reason.ALLOWED_BY_OVERRIDE
    assert _shell(policy, "x.mirror.corp.example", 8443).reason is Reason.NOT_ALLOWED
    assert str(policy.overrides[0].networks[0]) == "10.20.0.0/16"


def test_a_docs_site_on_a_port_is_that_port_only(write_task) -> None:
    policy = compile_network_policy(
        _task(write_task, docs="{entrypoint: 'http://127.0.0.1:8123/docs/'}")
    )
    assert _docs(policy, "127.0.0.1", 8123).allowed
    assert not _docs(policy, "127.0.0.1", 8124).allowed


def test_covering_patterns_never_widen_over_a_public_suffix() -> None:
    assert covering_patterns("docs.example.org") == ("docs.example.org", "*.docs.example.org")
    assert covering_patterns("github.io") == ("github.io",)
    assert covering_patterns("fly.dev") == ("fly.dev",)
    assert covering_patterns("co.kr") == ("co.kr",)
    assert covering_patterns("myapp.fly.dev") == ("myapp.fly.dev", "*.myapp.fly.dev")
    assert covering_patterns("localhost") == ("localhost",)
    assert covering_patterns("10.0.0.1") == ("10.0.0.1",)
    assert covering_patterns("*.example.org") == ("*.example.org",)
