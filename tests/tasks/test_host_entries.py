"""A task's host entries are parsed once, at load: the model holds each entry's pattern,
compiling hands those patterns to the policy as they are, and a task pickled (to a Ray
node) keeps them."""

from __future__ import annotations

import pickle

import pytest
import ray.cloudpickle

from firstrun.errors import TaskError
from firstrun.policy.hosts import HostPattern
from firstrun.tasks import compile as task_compile
from firstrun.tasks.compile import compile_inspection, compile_network_policy
from firstrun.tasks.load import read_task

TASK = """\
name: t
goal: g
docs: {path: [https://docs.example.org/a], allow: [example.net]}
success: {script: test -f a}
network: {allow: [PyPI.org, "*.example.com"]}
firstrun:
  network:
    deny: [evil.example.com]
    overrides: [{host: "db.internal:5432", networks: [10.0.0.0/8]}]
    tcp: ["github.com:22"]
  methods:
    - host: upload.example.com
      methods: [POST]
  credentials:
    - name: NPM_TOKEN
      host: registry.example.com
      from_env: NPM_TOKEN_REAL
"""


def test_every_host_entry_holds_its_pattern_as_it_reads(write_task) -> None:
    task = read_task(write_task(TASK))
    spec, ext = task.spec, task.spec.firstrun
    entries = [*spec.network.allow, *spec.docs.allow, *task.docs_hosts, *ext.network.deny,
               ext.network.overrides[0].host, *ext.network.tcp, ext.methods[0].host,
               ext.credentials[0].host]
    for entry in entries:
        assert entry.pattern == HostPattern.parse(entry), entry
    assert spec.network.allow == ("pypi.org", "*.example.com")


def test_compiling_parses_nothing_and_gives_the_policy_the_loaded_patterns(
        write_task, monkeypatch: pytest.MonkeyPatch) -> None:
    task = read_task(write_task(TASK))
    expected = compile_network_policy(task, inspect=True)

    def refuse(cls: type, text: str) -> HostPattern:
        raise AssertionError(f"{text!r} was parsed again after the task loaded")

    monkeypatch.setattr(HostPattern, "parse", classmethod(refuse))
    assert compile_network_policy(task, inspect=True) == expected
    assert compile_inspection(task) == expected.inspection
    assert task_compile.covering(task.docs_hosts[0].pattern)[0] is task.docs_hosts[0].pattern


def test_a_pickled_task_keeps_its_patterns(write_task) -> None:
    task = read_task(write_task(TASK))
    # As a run's job crosses to a Ray node: Ray's pickler there, the standard one here.
    again = pickle.loads(ray.cloudpickle.dumps(task))
    assert again == task
    assert [e.pattern for e in again.spec.network.allow] == \
        [e.pattern for e in task.spec.network.allow]
    assert again.spec.firstrun.network.tcp[0].pattern == HostPattern.parse("github.com:22")


def test_a_bad_entry_is_still_one_line_naming_its_file_and_line(write_task) -> None:
    path = write_task(TASK.replace('"*.example.com"', '"*.com"'))
    with pytest.raises(TaskError) as caught:
        read_task(path)
    message = str(caught.value)
    assert f"{path}:5:" in message and "network.allow[1]" in message
    assert "\n" not in message
