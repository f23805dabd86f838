"""``firstrun doctor`` reports the layers this machine can enforce."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

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
    assert {c["name"] for c in doc["optional"]} == {"docker daemon", "/dev/kvm"}
    for cap in doc["capabilities"] + doc["optional"]:
        if not cap["available"]:
            assert cap["fix"], cap
