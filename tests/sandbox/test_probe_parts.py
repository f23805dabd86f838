"""The probe's own parts: what counts as the stub's synthetic answer, and checks run beside
the rest, which report in order and fail when they break."""

from __future__ import annotations

import threading

import pytest

from firstrun.sandbox import attest_probe


@pytest.mark.parametrize(("address", "synthetic"), [
    ("198.18.0.1", True), ("198.19.255.254", True), ("198.17.255.255", False),
    ("198.20.0.0", False), ("127.0.0.1", False), ("not an address", False)])
def test_only_198_18_0_0_15_is_the_stubs(address: str, synthetic: bool) -> None:
    assert attest_probe._synthetic(address) is synthetic


def test_concurrent_checks_fill_their_slots_and_a_broken_one_fails() -> None:
    gate = threading.Event()

    def waits() -> tuple[bool, str]:
        gate.wait(30)
        return True, "waited"

    def breaks() -> tuple[bool, str]:
        raise OSError("no route")

    running = attest_probe._Concurrent()
    first, second = running.start("first", waits), running.start("second", breaks)
    gate.set()
    running.join()
    assert first == ["first", True, "waited"]
    assert second == ["second", False, "OSError: no route"]
