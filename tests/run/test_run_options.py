"""Every ``firstrun run`` option is declared once, and each one is in the sweep identity or exempt."""

from __future__ import annotations

import dataclasses
import json

import pytest

from firstrun.cli.main import build_parser
from firstrun.cli.run import RunRequest, _sweep_identity, _with_project
from firstrun.results.model import IDENTITY_FLAGS, NOT_RECORDED, SweepIdentity, incomparability
from firstrun.run.options import REFUSED_KEYS, RUN_OPTIONS, RunOption
from firstrun.run.project import ProjectSpec

pytestmark = pytest.mark.fast

# Identity fields that no single option decides: the tasks' hashes and the
# project config's task defaults.
_NOT_FROM_AN_OPTION = {"tasks", "task_defaults_sha256"}


def test_every_option_is_in_the_identity_or_says_why_not() -> None:
    for option in RUN_OPTIONS:
        assert (option.identity is None) != (option.exempt is None), option.field
        if option.exempt is not None:
            assert len(option.exempt.split()) >= 5, f"{option.field}: say why it is exempt"


def test_an_option_with_neither_or_both_is_refused_where_it_is_declared() -> None:
    with pytest.raises(ValueError, match="exactly one of identity and exempt"):
        RunOption(field="x", flag="--x", kind="switch", help="x")
    with pytest.raises(ValueError, match="exactly one of identity and exempt"):
        RunOption(field="x", flag="--x", kind="switch", help="x", identity="x", exempt="why not x at all")


def test_the_identity_is_exactly_what_the_options_decide() -> None:
    fields = {f.name for f in dataclasses.fields(SweepIdentity)}
    decided = [o.identity for o in RUN_OPTIONS if o.identity is not None]
    assert len(decided) == len(set(decided))
    assert fields == set(decided) | _NOT_FROM_AN_OPTION


def test_a_difference_is_named_by_the_flag_that_decides_it() -> None:
    for option in RUN_OPTIONS:
        if option.identity is not None:
            assert IDENTITY_FLAGS[option.identity] == option.flag, option.field


def test_the_request_holds_one_field_per_option_and_their_defaults_agree_with_the_parser() -> None:
    assert {f.name for f in dataclasses.fields(RunRequest)} - {"argv"} == {o.field for o in RUN_OPTIONS}
    args = build_parser().parse_args(["run"])
    parsed = RunRequest(**{o.field: o.request_value(getattr(args, o.field)) for o in RUN_OPTIONS})
    assert parsed == RunRequest()


def test_every_flag_reaches_its_own_field() -> None:
    argv = ["run", "a.yaml", "--example", "e", "--agent", "claude", "--model", "m", "--base-url", "u",
            "--max-spend", "2", "--price-file", "p", "--backend", "linux", "--image", "img:1",
            "--out", "o", "--resume", "o", "--config", "c", "--keep-sandbox", "--repeat", "3",
            "--workers", "2", "--junit", "j", "--github-summary", "--github-summary-file=g", "--docs-mirror", "h=d",
            "--cache-dir", "cd", "--refresh", "--offline", "--affordances", "none",
            "--probe-affordances", "--engine", "ray", "--ray-address", "h:6379", "--retry-infra",
            "--allow-unenforced", "--allow-downgrade", "seccomp", "--no-inspect-tls", "-q", "--verbose",
            "--color", "never"]
    args = build_parser().parse_args(argv)
    request = RunRequest(**{o.field: o.request_value(getattr(args, o.field)) for o in RUN_OPTIONS})
    unset = [f for f, default in dataclasses.asdict(RunRequest()).items()
             if f != "argv" and dataclasses.asdict(request)[f] == default]
    assert unset == []


def test_project_keys_are_keys_of_the_project_config_and_the_refused_ones_are_not() -> None:
    keys = set(ProjectSpec.model_fields)
    for option in RUN_OPTIONS:
        if option.project is not None:
            assert option.project in keys, option.field
    assert set(REFUSED_KEYS) >= {"agent", "model", "base_url", "repeat", "affordances"}
    assert not set(REFUSED_KEYS) & keys
    by_flag = {o.flag: o for o in RUN_OPTIONS}
    for key, flag in REFUSED_KEYS.items():
        assert by_flag[flag].identity is not None and by_flag[flag].project is None, key


def test_unset_options_take_the_project_configs_value_then_their_fallback() -> None:
    filled = _with_project(RunRequest(), None)
    # --workers has no fallback: the engine decides (1 here, the nodes' CPUs on Ray).
    assert (filled.backend, filled.out, filled.workers, filled.cache_dir, filled.inspect_tls,
            filled.engine, filled.ray_address) == ("auto", "results", None, None, False, "local",
                                                   None)


def test_the_image_is_part_of_the_identity_and_an_older_sweep_is_comparable_with_neither() -> None:
    one = _sweep_identity(RunRequest(image="firstrun/node:24"), [], "docker", None)
    other = _sweep_identity(RunRequest(), [], "docker", None)
    assert incomparability(one, other) == "--image was 'firstrun/node:24' and is now unset"
    saved = one.to_data()
    del saved["image"]
    older = SweepIdentity.from_data(json.loads(json.dumps(saved)))
    assert older.image == NOT_RECORDED
    for wanted in (one, other):
        reason = incomparability(older, wanted)
        assert reason is not None and "before firstrun recorded --image" in reason
