"""``isolation: vm``: a task that asks for a kernel of its own gets a KVM micro-VM or nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from firstrun.errors import SandboxUnavailable, TaskError
from firstrun.examples import find_example
from firstrun.sandbox.microvm import probe
from firstrun.sandbox.select import own_kernel_backend, require_vm
from firstrun.tasks.load import load_task


def _task_with(tmp_path: Path, extension: str) -> Path:
    source = find_example("python-tabulate").task_path.parent
    target = tmp_path / "task"
    shutil.copytree(source, target)
    task = target / "task.yaml"
    task.write_text(task.read_text(encoding="utf-8") + f"firstrun:\n  isolation: {extension}\n",
                    encoding="utf-8")
    return task


def test_the_task_file_says_vm(tmp_path: Path) -> None:
    assert load_task(_task_with(tmp_path, "vm")).spec.firstrun.isolation == "vm"


def test_an_unknown_isolation_is_refused_at_its_line(tmp_path: Path) -> None:
    with pytest.raises(TaskError) as caught:
        load_task(_task_with(tmp_path, "container"))
    assert "task.yaml" in str(caught.value)


@pytest.mark.parametrize("backend", ["linux", "docker", "local", "seatbelt"])
def test_any_backend_that_shares_the_kernel_is_refused_naming_one_that_does_not(backend: str) -> None:
    with pytest.raises(SandboxUnavailable) as caught:
        require_vm(backend, who="task t")
    here = own_kernel_backend()
    assert caught.value.fix.startswith(f"run it with --backend {here or 'gvisor or --backend microvm'}")


def test_microvm_without_kvm_is_refused_even_if_emulation_was_asked_for(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("FIRSTRUN_MICROVM_ACCEL", "tcg")
    kvm = probe.kvm()
    if kvm.available:
        require_vm("microvm", who="task t")
        return
    with pytest.raises(SandboxUnavailable) as caught:
        require_vm("microvm", who="task t")
    assert kvm.detail in str(caught.value)


@pytest.mark.parametrize("backend", ["linux", "microvm"])
def test_a_run_of_such_a_task_is_refused_before_any_sandbox(tmp_path: Path, backend: str) -> None:
    if backend == "microvm" and probe.kvm().available:
        pytest.skip("KVM is usable here: the microvm run would start")
    task = _task_with(tmp_path, "vm")
    out = tmp_path / "out"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "firstrun"), "run", str(task), "--agent", "replay",
         "--backend", backend, "--out", str(out)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120, check=False,
        env={**os.environ, "FIRSTRUN_MICROVM_ACCEL": "tcg"})
    assert done.returncode != 0
    (run,) = json.loads((out / "results.json").read_text(encoding="utf-8"))["runs"]
    assert run["reason"] == "sandbox_refused"
    assert "isolation: vm" in run["detail"]
    # Nothing ran: no command reached a sandbox.
    assert run["commands"] == 0
