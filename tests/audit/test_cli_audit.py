"""``firstrun audit`` through the console script, and its three formats."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from firstrun.audit.battery import (
    AuditResult,
    Cell,
    Configuration,
    ConfigurationResult,
    bounded,
)
from firstrun.audit.model import ACTIONS, ActionResult, AuditedLayer, Reach, action, predict
from firstrun.cli.audit import (
    column,
    exit_status,
    render_json,
    render_markdown,
    render_text,
)

FIRSTRUN = Path(sys.executable).parent / "firstrun"

_CELL = {
    "type": "object",
    "additionalProperties": False,
    "required": ["action", "predicted", "observed", "agrees", "witness", "evidence", "seen",
                 "stopped_by"],
    "properties": {
        "action": {"enum": [a.id for a in ACTIONS]},
        "predicted": {"enum": ["stopped", "through"]},
        "observed": {"enum": ["stopped", "through", None]},
        "agrees": {"type": "boolean"},
        "witness": {"enum": ["host", "kernel's answer"]},
        "evidence": {"type": "string"},
        "seen": {"type": ["integer", "null"]},
        "stopped_by": {"type": "array", "items": {"enum": [layer.value for layer in AuditedLayer]}},
    },
}
# Pinned: consumers key on these names; a change here is a schema version bump.
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["schema", "actions", "configurations", "residual", "disagreements", "skipped",
                 "controls"],
    "properties": {
        "schema": {"const": "firstrun.audit/2"},
        "actions": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["id", "title", "needed", "reaches"],
            "properties": {"id": {"type": "string"}, "title": {"type": "string"},
                           "needed": {"type": "boolean"},
                           "reaches": {"type": "array", "items": {"type": "string"}}}}},
        "configurations": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["name", "backend", "layers", "omitted", "host_refuses",
                         "unneeded_open", "needed_broken", "not_run", "session", "cells"],
            "properties": {
                "name": {"type": "string"}, "backend": {"type": "string"},
                "layers": {"type": "array", "items": {"enum": [layer.value for layer in AuditedLayer]}},
                "omitted": {"type": "array",
                            "items": {"enum": [layer.value for layer in AuditedLayer]}},
                "host_refuses": {"type": "array", "items": {"enum": [r.value for r in Reach]}},
                "unneeded_open": {"type": "integer", "minimum": 0},
                "needed_broken": {"type": "integer", "minimum": 0},
                "not_run": {"type": "integer", "minimum": 0},
                "session": {"type": "object", "required": ["backend", "enforcement", "layers"]},
                "cells": {"type": "array", "items": _CELL},
            }}},
        "residual": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["configuration", "backend", "action", "closed_by", "available"],
            "properties": {"configuration": {"type": "string"}, "backend": {"type": "string"},
                           "action": {"type": "string"},
                           "closed_by": {"type": "array", "items": {"type": "string"}},
                           "available": {"type": "array", "items": {"type": "string"}}}}},
        "disagreements": {"type": "array", "items": {
            **_CELL, "required": ["configuration", *_CELL["required"]],
            "properties": {"configuration": {"type": "string"}, **_CELL["properties"]}}},
        "skipped": {"type": "array", "items": {
            "type": "object", "required": ["backend", "reason"]}},
        "controls": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def _firstrun(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, str(FIRSTRUN), *args], check=False, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=600, env=dict(os.environ))


def test_json_of_the_real_linux_matrix_matches_the_pinned_schema(audit: AuditResult) -> None:
    data = json.loads(render_json(audit))
    jsonschema.validate(data, SCHEMA)
    assert data["disagreements"] == []
    assert [c["name"] for c in data["configurations"]][-2:] == [
        "linux: full stack + --inspect-tls", "local: no layers"]


def test_markdown_is_one_table_row_per_action_plus_the_counts(audit: AuditResult) -> None:
    text = render_markdown(audit)
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + len(ACTIONS) + 2
    width = len(audit.results) + 2
    assert all(row.count("|") == width + 1 for row in rows)
    assert "`linux:FNSLW`" in rows[0] and "`linux:FNSLWMC`" in rows[0] and "`local:-`" in rows[0]
    full = [r.configuration for r in audit.results].index(
        next(r.configuration for r in audit.results if r.configuration.name == "linux: full stack"))
    counts = rows[-2].strip("|").split("|")
    assert counts[2 + full].strip() == "3"
    assert "upload_registry" in text and "method_rules" in text


def test_text_lists_counts_residual_and_agreement(audit: AuditResult) -> None:
    text = render_text(audit)
    assert "Model and measurement agree on every cell that ran." in text
    for r in audit.results:
        assert r.configuration.name in text
    assert "upload_registry: closed by method_rules (--inspect-tls" in text
    assert "linux: full stack + --inspect-tls: nothing open" in text


def _disagreeing() -> AuditResult:
    config = Configuration(backend="linux", layers=frozenset({AuditedLayer.NETWORK}))
    cell = Cell(action="host_loopback", predicted=ActionResult.STOPPED, observed=ActionResult.THROUGH,
                evidence="host listener accepted 1 connection(s)", witness="host", seen=1)
    return AuditResult(results=(ConfigurationResult(configuration=config, cells=(cell,)),))


def test_a_disagreement_is_listed_marked_and_fails_the_exit_status() -> None:
    result = _disagreeing()
    assert exit_status(result) == 1
    text = render_text(result)
    assert "DISAGREE" in text and "THROUGH!" in text
    assert json.loads(render_json(result))["disagreements"][0]["action"] == "host_loopback"


_LINUX_FULL = frozenset({AuditedLayer.FILESYSTEM, AuditedLayer.NAMESPACES, AuditedLayer.SECCOMP, AuditedLayer.LANDLOCK,
                         AuditedLayer.NETWORK})
_INSPECTED = _LINUX_FULL | {AuditedLayer.METHOD_RULES, AuditedLayer.CREDENTIAL_MASKING}
# Domain fronting as measured: (layers, observed, listed as residual, disagrees, exit status).
# Open where the model says it is open is a residual, not a failure; open
# where inspection should close it, or closed where nothing should, fails.
_FRONTING_VERDICTS = [
    (_LINUX_FULL, ActionResult.THROUGH, True, False, 0),
    (_INSPECTED, ActionResult.STOPPED, False, False, 0),
    (_INSPECTED, ActionResult.THROUGH, True, True, 1),
    (_LINUX_FULL, ActionResult.STOPPED, False, True, 1),
]


@pytest.mark.parametrize(("layers", "observed", "residual", "disagrees", "status"),
                         _FRONTING_VERDICTS)
def test_domain_fronting_open_as_predicted_is_a_residual_and_not_a_failure(
        layers, observed, residual, disagrees, status) -> None:
    fronting = action("domain_fronting")
    config = Configuration(backend="linux", layers=layers)
    cell = Cell(action=fronting.id, predicted=predict(fronting, layers), observed=observed,
                evidence="registry recorded", witness="host",
                seen=1 if observed is ActionResult.THROUGH else 0)
    result = AuditResult(results=(ConfigurationResult(configuration=config, cells=(cell,)),))
    assert ([r.action for r in result.residual] == [fronting.id]) is residual
    assert bool(result.disagreements) is disagrees
    assert exit_status(result) == status
    text = render_text(result)
    assert ("    domain_fronting: closed by method_rules (--inspect-tls (a request's Host "
            "must be its tunnel's" in text) is (residual and not disagrees)
    assert ("DISAGREE" in text) is disagrees


def test_column_names_the_backend_and_its_layers() -> None:
    assert column(Configuration(backend="local", layers=frozenset())) == "local:-"
    assert column(Configuration(backend="linux",
                                layers=frozenset({AuditedLayer.NETWORK, AuditedLayer.FILESYSTEM}))) == "linux:FW"


@pytest.mark.escape
def test_the_console_script_runs_the_local_baseline_as_json() -> None:
    out = _firstrun("audit", "--backend", "local", "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    jsonschema.validate(data, SCHEMA)
    (local,) = data["configurations"]
    assert local["session"]["enforcement"] == "unenforced"
    assert "firstrun audit: local: no layers" in out.stderr


def _local_oom_cell(prefix: tuple[str, ...] = ()) -> tuple[list[str], dict[str, object]]:
    out = _firstrun("audit", "--backend", "local", "--format", "json", prefix=prefix)
    assert out.returncode == 0, out.stdout + out.stderr
    (local,) = json.loads(out.stdout)["configurations"]
    (cell,) = [c for c in local["cells"] if c["action"] == "lower_oom_score"]
    return local["host_refuses"], cell


def test_a_harness_at_its_oom_floor_is_predicted_and_measured_as_refused() -> None:
    # The harness as CI runs it (root in a container, no CAP_SYS_RESOURCE,
    # its OOM score at its floor): a local command cannot lower its score.
    # Whether this process is there is read the way the kernel answers a
    # bare child of it, without firstrun.
    lower = ("p = '/proc/self/oom_score_adj'\nb = int(open(p).read())\n"
             "with open(p, 'w') as f:\n    f.write(str(b - 1))\n")
    bare = subprocess.run([sys.executable, "-c", lower], capture_output=True, text=True,
                          check=False)
    refused, cell = _local_oom_cell()
    if bare.returncode == 0:
        assert (refused, cell["observed"]) == (sorted(r.value for r in bounded()), "through")
    else:
        assert "PermissionError" in bare.stderr
        assert refused == sorted(r.value for r in bounded() | {Reach.OOM_SCORE_DOWN})
        assert (cell["predicted"], cell["observed"], cell["stopped_by"]) == ("stopped", "stopped", [])
        assert "EACCES" in cell["evidence"]
    assert cell["agrees"]


def test_a_harness_above_its_oom_floor_is_predicted_and_measured_as_through() -> None:
    # choom raises the harness's score (which needs no privilege); its floor
    # stays below, so a local command can lower its own score again.
    choom = shutil.which("choom")
    if choom is None:
        pytest.fail("choom (util-linux) is not installed: run scripts/install")
    refused, cell = _local_oom_cell(prefix=(choom, "-n", "10", "--"))
    assert refused == sorted(r.value for r in bounded())
    assert (cell["predicted"], cell["observed"], cell["evidence"]) == ("through", "through",
                                                                       "10 -> 9")


@pytest.mark.parametrize("args", [("--backend", "nope"), ("--format", "yaml"),
                                  ("--backend", "auto")])
def test_bad_usage_is_one_line_and_exit_3(args: tuple[str, ...]) -> None:
    out = _firstrun("audit", *args)
    assert out.returncode == 3
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) <= 2
