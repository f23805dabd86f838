"""Each reason KVM can be unusable, produced for real: a missing device, a refused open, a
file that is not KVM, PVM's module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
    code = ("import json, sys; from firstrun.sandbox.microvm import probe; "
            "c = probe.kvm(device=sys.argv[1], modules=sys.argv[2]); "
            "print(json.dumps([c.available, c.detail, c.fix]))")
    src = str(Path(probe.__file__).parents[3])
    # Debian's interpreter (the harness's may sit under a 0700 home), with the
    # source tree and the venv's packages on its path.
    site = next(p for p in sys.path if p.endswith("site-packages"))
    done = subprocess.run(["/usr/bin/python3", "-c", code, str(device), str(tmp_path)],
                          capture_output=True, text=True, user=NOBODY, group=NOBODY,
                          extra_groups=[], env={"PYTHONPATH": f"{src}:{site}"}, check=False,
                          cwd="/")
    assert done.returncode == 0, done.stderr[-1000:]
    available, detail, fix = json.loads(done.stdout)
    assert not available
    assert "Permission denied" in detail and "kvm group" in fix
