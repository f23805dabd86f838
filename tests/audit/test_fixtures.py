"""The audit's witnesses: refused cleanly where they cannot be planted, gone after close."""

from __future__ import annotations

import os

import pytest

from firstrun.audit.fixtures import Witnesses
from firstrun.errors import SandboxUnavailable


def test_a_system_dir_it_cannot_write_is_a_typed_refusal(tmp_path) -> None:
    with pytest.raises(SandboxUnavailable) as refused:
        Witnesses(home=str(tmp_path), system_dir=str(tmp_path / "missing"))
    assert refused.value.fix and "audit" == refused.value.who
    assert os.listdir(tmp_path) == []


def test_close_removes_every_planted_file_and_marker(tmp_path) -> None:
    system = tmp_path / "system"
    system.mkdir()
    witnesses = Witnesses(home=str(tmp_path), system_dir=str(system))
    markers = (witnesses.environ_marker, witnesses.kill_marker)
    assert os.path.exists(witnesses.secret_path) and os.path.exists(witnesses.system_path)
    assert oct(os.stat(witnesses.system_path).st_mode & 0o777) == "0o666"
    witnesses.close()
    assert os.listdir(system) == [] and sorted(os.listdir(tmp_path)) == ["system"]
    assert all(m.poll() is not None for m in markers)
