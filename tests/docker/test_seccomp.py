"""The docker seccomp profile as data: golden, derived from the linux rules, and its translations exact."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstrun.sandbox.docker.seccomp import (
    ALLOWED,
    _prefixes,
    build_profile,
    mechanism,
    profile_json,
)
from firstrun.sandbox.linux.seccomp import RULES, Action, ArgCmp, Op, Rule

GOLDEN = Path(__file__).parent / "golden" / "seccomp.json"


def test_the_profile_is_golden() -> None:
    # Regenerate deliberately: python -c "from firstrun.sandbox.docker.seccomp import
    # profile_json; open('tests/docker/golden/seccomp.json','w').write(profile_json())"
    assert profile_json() == GOLDEN.read_text(encoding="utf-8")


def _entries(name: str) -> list[dict[str, object]]:
    return [e for e in build_profile()["syscalls"] if name in e["names"]]  # type: ignore[index, operator]


def test_every_syscall_the_linux_rules_refuse_outright_is_not_allowed_here() -> None:
    for rule in RULES:
        if rule.args:
            continue
        entries = _entries(rule.syscall)
        assert all(e["action"] == "SCMP_ACT_ERRNO" for e in entries), rule.syscall
        # EPERM is the profile's default: such a syscall is simply not listed.
        if rule.action is Action.EPERM:
            assert entries == []
        else:
            assert entries == [{"names": [rule.syscall], "action": "SCMP_ACT_ERRNO",
                                "errnoRet": errno.ENOSYS}]


def test_the_default_refuses_with_eperm_and_only_native_abis_match() -> None:
    profile = build_profile()
    assert (profile["defaultAction"], profile["defaultErrnoRet"]) == ("SCMP_ACT_ERRNO", errno.EPERM)
    assert all(a["subArchitectures"] == [] for a in profile["archMap"])  # type: ignore[union-attr, index]
    assert "io_uring_setup" not in {n for group in ALLOWED.values() for n in group}
    assert "socketcall" not in json.dumps(profile)


def test_clone_and_personality_are_allowed_only_without_any_refused_flag() -> None:
    for name in ("clone", "personality"):
        union = 0
        for rule in RULES:
            if rule.syscall == name:
                union |= rule.args[0].mask
        assert _entries(name) == [{"names": [name], "action": "SCMP_ACT_ALLOW", "args": [
            {"index": 0, "value": union, "op": "SCMP_CMP_MASKED_EQ", "valueTwo": 0}]}]


def test_socket_keeps_its_eafnosupport_refusals_under_an_always_true_allow() -> None:
    entries = _entries("socket")
    assert entries[0] == {"names": ["socket"], "action": "SCMP_ACT_ALLOW",
                          "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_GE"}]}
    refusals = [r for r in RULES if r.syscall == "socket"]
    assert len(entries) == 1 + len(refusals)
    assert all(e["errnoRet"] == errno.EAFNOSUPPORT for e in entries[1:])


def _allowed_by(prefixes: list[tuple[int, int]], value: int) -> bool:
    return any(value & mask == datum for mask, datum in prefixes)


@given(st.frozensets(st.integers(0, 0xFFFFFFFF), min_size=1, max_size=4),
       st.integers(0, 0xFFFFFFFF))
def test_the_value_complement_allows_exactly_the_values_not_refused(
        excluded: frozenset[int], value: int) -> None:
    prefixes = _prefixes(excluded)
    assert _allowed_by(prefixes, value) is (value not in excluded)
    for refused in excluded:
        assert not _allowed_by(prefixes, refused)


@given(st.integers(0, (1 << 64) - 1))
def test_ioctl_is_allowed_for_every_request_but_tiocsti_and_tioclinux_in_the_low_32_bits(
        request: int) -> None:
    prefixes = [(a["value"], a["valueTwo"]) for e in _entries("ioctl") for a in e["args"]]  # type: ignore[union-attr, index]
    refused = (request & 0xFFFFFFFF) in (0x5412, 0x541C)
    assert _allowed_by(prefixes, request) is not refused  # type: ignore[arg-type]
    assert _allowed_by(prefixes, (request & ~0xFFFFFFFF) | 0x5412) is False  # type: ignore[arg-type]


def test_a_rule_it_cannot_express_is_refused_not_dropped() -> None:
    greater = Rule(syscall="ioctl", action=Action.EPERM,
                   args=(ArgCmp(index=1, op=Op.GT, value=7),))
    with pytest.raises(ValueError, match="ioctl"):
        build_profile((greater,))
    mixed = (Rule(syscall="socket", action=Action.EPERM, args=(ArgCmp(index=0, op=Op.EQ, value=3),)),
             Rule(syscall="socket", action=Action.EAFNOSUPPORT,
                  args=(ArgCmp(index=0, op=Op.EQ, value=4),)))
    with pytest.raises(ValueError, match="socket"):
        build_profile(mixed)


def test_the_mechanism_names_the_rule_count() -> None:
    assert mechanism() == f"firstrun seccomp profile ({len(RULES)} rules) over docker"
