"""The bundled examples, replayed end to end through the CLI, on every available backend.

Each run goes through the real ``firstrun run``: the backend attests, the
replay installs from the real registry through the egress proxy, and the
check judges the workspace; Ctrl-C in the middle of a command leaves no
process and no container behind. node-ms asks for ``node:22-slim``, which is not
built here; the docker backend refuses that with the fix, and the same task
naming the locally built ``firstrun/node:24`` passes.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from conformance_support import AVAILABLE

from firstrun.examples import find_example
from firstrun.images.build import NODE
from firstrun.sandbox.docker.resources import docker

FIRSTRUN = Path(sys.executable).parent / "firstrun"
NODE_IMAGE = NODE.tag


def _firstrun(*args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run the CLI; also return its pid, which names its docker resources' harness label."""
    proc = subprocess.Popen([str(FIRSTRUN), *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=900)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), proc.pid


def _left_by(pid: int) -> list[str]:
    """Containers and networks a harness with this pid left (labels are PID:STARTTIME)."""
    fmt = '{{.Label "org.firstrun.harness"}}'
    found = docker("ps", "--all", "--filter", "label=org.firstrun.managed", "--format", fmt).stdout
    found += docker("network", "ls", "--filter", "label=org.firstrun.managed",
                    "--format", fmt).stdout
    return [h for h in found.split() if h.startswith(f"{pid}:")]


def _results(out: Path) -> dict[str, object]:
    return json.loads((out / "results.json").read_text())


def _node_task(tmp_path: Path) -> tuple[Path, str]:
    """node-ms's task naming the image built here, and the --docs-mirror its site needs."""
    example = find_example("node-ms")
    text = example.task_path.read_text(encoding="utf-8")
    assert "image: node:22-slim" in text
    task = tmp_path / "node-ms.yaml"
    task.write_text(text.replace("image: node:22-slim", f"image: {NODE_IMAGE}"), encoding="utf-8")
    return task, f"{example.docs_host}={example.docs_dir}"


def test_the_examples_replay_and_pass(backend: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    node_task, mirror = _node_task(tmp_path)
    proc, pid = _firstrun("run", "--example", "python-tabulate", str(node_task),
                          "--docs-mirror", mirror, "--agent", "replay", "--backend", backend,
                          "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = _results(out)
    runs = document["runs"]
    assert sorted(r["task"] for r in runs) == ["node-ms", "python-tabulate"]
    for run in runs:
        assert (run["classification"], run["backend"], run["enforcement"]) == (
            "passed", backend, "enforced"), run
        assert run["attestation"] and all(c["passed"] for c in run["attestation"])
    assert document["meta"]["backend"] == backend
    if backend == "docker":
        assert _left_by(pid) == []


@pytest.mark.skipif("docker" not in AVAILABLE, reason="the docker backend is not available here")
def test_an_image_not_built_here_is_refused_with_the_fix(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc, _ = _firstrun("run", "--example", "node-ms", "--agent", "replay", "--backend", "docker",
                        "--out", str(out))
    assert proc.returncode == 2
    assert "node:22-slim" in proc.stderr and "docker pull node:22-slim" in proc.stderr
    assert "firstrun images build" in proc.stderr
    assert not (out / "results.json").exists()


@pytest.mark.skipif("docker" not in AVAILABLE, reason="the docker backend is not available here")
def test_auto_records_its_one_choice_for_the_sweep(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc, _ = _firstrun("run", "--example", "python-tabulate", "--agent", "replay",
                        "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = _results(out)
    assert document["meta"]["backend"] == "docker"
    assert document["meta"]["backend_resolution"] == {
        "requested": "auto", "backend": "docker", "passed_over": []}
    assert [r["backend"] for r in document["runs"]] == ["docker"]
    assert os.path.isdir(out / "runs")


INTERRUPTED = """\
name: interrupted
goal: Wait for the long step the quickstart shows.
docs:
  path:
    - http://docs.greeter.test/
replay:
  - run: touch {marker}.started; bash -c 'exec -a {marker} sleep 600'
    undocumented: a test step, not the guide's
success:
  script: |
    test -f never-made || qs_fail "the long step never finished"
"""


def _host_pids_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_ctrl_c_mid_command_leaves_nothing_running_or_created(backend: str,
                                                              tmp_path: Path) -> None:
    marker = f"firstrun-interrupted-{uuid.uuid4().hex}"
    task = tmp_path / "interrupted.yaml"
    task.write_text(INTERRUPTED.format(marker=marker), encoding="utf-8")
    docs = Path(__file__).parents[1] / "support" / "greeter_docs"
    proc = subprocess.Popen(
        [str(FIRSTRUN), "run", str(task), "--docs-mirror", f"docs.greeter.test={docs}",
         "--backend", backend, "--out", str(tmp_path / "out")],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Polled, not timed: the command is running once the host sees its
        # marker, or under a kernel of its own, once its first file is in the
        # (sized) workspace.
        def started() -> bool:
            return bool(_host_pids_with(marker) or glob.glob(
                os.path.join(tempfile.gettempdir(), "firstrun-disk-*", "workspace",
                             f"{marker}.started")))

        for _ in range(600):
            if started() or proc.poll() is not None:
                break
            time.sleep(0.2)
        assert started(), "the replay step never started"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert _host_pids_with(marker) == []
    if backend == "docker":
        assert _left_by(proc.pid) == []
