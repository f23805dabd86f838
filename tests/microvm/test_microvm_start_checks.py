"""A micro-VM's start checks only what it uses: QEMU, KVM only when it boots with KVM,
and the image it finds itself; never the sweep's whole probe again."""

from __future__ import annotations

from pathlib import Path

import pytest

from firstrun.errors import SandboxUnavailable
from firstrun.sandbox.base import Capability
from firstrun.sandbox.microvm import probe
from firstrun.sandbox.microvm.backend import MicrovmBackend
from support.profiles import make_profile


def _never(what: str):  # type: ignore[no-untyped-def]
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the start asked for {what}")
    return refuse


def test_under_emulation_a_start_never_asks_kvm(
        workspace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "kvm", _never("KVM"))
    monkeypatch.setattr(MicrovmBackend, "probe", _never("the whole probe"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable) as refused:
        MicrovmBackend(accel="tcg").start(make_profile(workspace), proxy=None)
    assert refused.value.args[0].startswith(f"qemu: {probe.QEMU} not found")


def test_with_kvm_a_start_refuses_what_kvm_lacks(
        workspace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lacking = Capability(name="kvm", available=False, detail="no /dev/kvm here", fix="enable it")
    monkeypatch.setattr(probe, "qemu", lambda: Capability(name="qemu", available=True,
                                                          detail="qemu"))
    monkeypatch.setattr(probe, "kvm", lambda: lacking)
    monkeypatch.setattr(probe, "image", _never("the image's capability"))
    monkeypatch.setattr(MicrovmBackend, "probe", _never("the whole probe"))
    with pytest.raises(SandboxUnavailable) as refused:
        MicrovmBackend(accel="kvm").start(make_profile(workspace), proxy=None)
    assert refused.value.args[0] == "kvm: no /dev/kvm here" and refused.value.fix == "enable it"
