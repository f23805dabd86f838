"""``firstrun doctor`` reports the layers this machine can enforce."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

Run = Callable[..., subprocess.CompletedProcess[str]]


def test_doctor_names_the_layers_and_passes_on_this_machine(firstrun: Run) -> None:
    proc = firstrun("doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout.lower()
    for word in ("bubblewrap", "landlock", "seccomp", "user_namespaces", "docker", "/dev/kvm"):
        assert word in text, word
    assert "masks (secrets)" in text
    assert "/root" in text


def test_doctor_json_matches_its_exit_status(firstrun: Run) -> None:
    proc = firstrun("doctor", "--json")
    doc = json.loads(proc.stdout)
    assert doc["linux_usable"] is (proc.returncode == 0)
    backends = {b["name"]: b for b in doc["backends"]}
    assert {"linux", "docker", "microvm", "local"} <= set(backends)
    assert "kvm" in {c["name"] for c in backends["microvm"]["capabilities"]}
    assert backends["linux"]["available"] is doc["linux_usable"]
    assert not backends["local"]["available"]
    docker = {c["name"]: c for c in backends["docker"]["capabilities"]}
    assert {"docker daemon", "root", "image"} <= set(docker)
    if docker["docker daemon"]["available"]:
        assert "CVE-2024-29018" in docker["docker daemon"]["detail"]
    assert doc["auto"]
    caps = list(doc["capabilities"])
    caps += [c for b in doc["backends"] for c in b["capabilities"]]
    for cap in caps:
        if not cap["available"]:
            assert cap["fix"], cap


def test_a_missing_layer_fails_doctor_with_the_fix_and_refuses_sandbox(
    firstrun: Run, tmp_path: Path
) -> None:
    # bubblewrap is found through PATH; a PATH without it is a machine without it.
    env = dict(os.environ, PATH=str(tmp_path))
    doctor = firstrun("doctor", env=env)
    assert doctor.returncode == 1
    assert "NOT usable" in doctor.stdout
    assert "fix: apt-get install bubblewrap" in doctor.stdout

    sandbox = firstrun("sandbox", "--workspace", str(tmp_path), "--", "/usr/bin/touch", "ran", env=env)
    assert sandbox.returncode == 125
    assert "refused" in sandbox.stderr and "apt-get install bubblewrap" in sandbox.stderr
    assert not (tmp_path / "ran").exists()
