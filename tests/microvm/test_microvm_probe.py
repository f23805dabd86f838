"""Each reason KVM can be unusable, produced for real: a missing device, a refused open, a
file that is not KVM, PVM's module."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from firstrun.sandbox.microvm import probe

NOBODY = 65534


def test_a_missing_device_says_so_and_how_to_get_one(tmp_path: Path) -> None:
    cap = probe.kvm(device=str(tmp_path / "kvm"), modules=str(tmp_path))
    assert not cap.available
    assert "no " in cap.detail and cap.fix


def test_pvm_is_named_as_the_reason(tmp_path: Path) -> None:
    (tmp_path / "kvm_pvm").mkdir()
    device = tmp_path / "kvm"
    device.write_bytes(b"")
    cap = probe.kvm(device=str(device), modules=str(tmp_path))
    assert not cap.available and "PVM" in cap.detail and "tcg" in (cap.fix or "")


def test_a_file_that_is_not_kvm_refuses_the_api(tmp_path: Path) -> None:
    device = tmp_path / "kvm"
    device.write_bytes(b"")
    cap = probe.kvm(device=str(device), modules=str(tmp_path))
    assert not cap.available and "refused to create a VM" in cap.detail


def test_no_permission_is_told_apart() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to probe as another uid")
    # Under /tmp itself: pytest's own temporary tree is not searchable by other uids.
    top = Path(tempfile.mkdtemp(prefix="firstrun-test-kvm-", dir="/tmp"))
    try:
        _probe_as_nobody(top)
    finally:
        shutil.rmtree(top)


def _probe_as_nobody(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    device = tmp_path / "kvm"
    device.write_bytes(b"")
    os.chmod(device, 0o600)
    # The probe runs in a forked child that drops to nobody: no interpreter
    # or source tree has to be reachable by that uid (a fresh clone may sit
    # under a 0700 directory).
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            c = probe.kvm(device=str(device), modules=str(tmp_path))
            os.write(write, json.dumps([c.available, c.detail, c.fix]).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    available, detail, fix = json.loads(answer)
    assert not available
    assert "Permission denied" in detail and "kvm group" in fix
