"""A default image that lacks what the host has never makes a docs gap: real replay runs on docker.

Each task is replayed by the real ``firstrun run`` in the node image, with
its docs served from a directory mirror. A step that runs a command the
image lacks and this host has, or loads a library the image lacks and the
host has, gives a non-evidential run naming the image and what it lacked;
a command neither has stays the docs' gap.
"""

from __future__ import annotations

import html
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from firstrun.images.build import NODE
from firstrun.run.lacking import LDCONFIG, loader_cache
from firstrun.sandbox.docker.resources import docker

FIRSTRUN = Path(sys.executable).parent / "firstrun"
DOCS_HOST = "lacking.docs.example"


def _lacked_by_the_image(host_has: set[str], candidates: tuple[str, ...], probe: str) -> str:
    """The first candidate this host has and the node image does not."""
    for name in candidates:
        if name in host_has and docker("run", "--rm", "--network", "none", NODE.tag, "sh", "-c",
                                       probe, "probe", name, check=False).returncode != 0:
            return name
    pytest.fail(f"none of {candidates} is on this host and absent from {NODE.tag}")


def _task(directory: Path, name: str, step: str) -> str:
    """A task replaying its own page (``replay: docs``): the one documented step, then done.txt."""
    (directory / "docs" / f"{name}.html").write_text(
        f"<html><body><p>Run the step.</p><pre><code class=\"language-bash\">"
        f"{html.escape(step)}\ntouch done.txt</code></pre></body></html>", encoding="utf-8")
    path = directory / f"{name}.yaml"
    path.write_text(f"""name: {name}
goal: Run the one documented step, then write done.txt.
image: {NODE.tag}
docs:
  path:
    - https://{DOCS_HOST}/{name}.html
replay: docs
success:
  script: |
    test -f done.txt || qs_fail "no done.txt"
""", encoding="utf-8")
    return str(path)


@pytest.mark.usefixtures("docker_ready")
def test_a_step_needing_what_the_image_lacks_is_not_evidence_and_names_the_image(
        tmp_path: Path) -> None:
    tool = _lacked_by_the_image({n for n in ("make", "jq", "zip") if shutil.which(n)},
                                ("make", "jq", "zip"), 'command -v "$1"')
    host_libraries = loader_cache(subprocess.run([LDCONFIG, "-p"], capture_output=True,
                                                 text=True, check=True).stdout)
    library = _lacked_by_the_image(set(host_libraries), ("libGL.so.1", "libgtk-3.so.0", "libnss3.so"),
                                   f'{LDCONFIG} -p | grep -q "^[[:space:]]$1 "')
    docs = tmp_path / "docs"
    docs.mkdir()
    tasks = [_task(tmp_path, "lacks-command", f"{tool} --version"),
             _task(tmp_path, "lacks-library",
                   f"python3 -c \"import ctypes; ctypes.CDLL('{library}')\""),
             _task(tmp_path, "lacked-everywhere", "firstrun-no-such-tool --version")]
    out = tmp_path / "out"
    done = subprocess.run([str(FIRSTRUN), "run", *tasks, "--agent", "replay", "--backend", "docker",
                           "--docs-mirror", f"{DOCS_HOST}={docs}", "--out", str(out)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900)
    runs: dict[str, dict[str, Any]] = {
        r["task"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert set(runs) == {"lacks-command", "lacks-library", "lacked-everywhere"}, done.stderr

    command = runs["lacks-command"]
    assert (command["classification"], command["reason"]) == ("infra_error", "image_lacks_command")
    assert command["extra"]["image_lacked"] == {"image": NODE.tag, "commands": [tool],
                                                "libraries": []}
    assert command["detail"] == f"the image {NODE.tag} lacks the command {tool}, which this host has"

    loaded = runs["lacks-library"]
    assert (loaded["classification"], loaded["reason"]) == ("infra_error", "image_lacks_library")
    assert loaded["extra"]["image_lacked"] == {"image": NODE.tag, "commands": [],
                                               "libraries": [library]}
    assert NODE.tag in loaded["detail"] and library in loaded["detail"]

    # Nobody has it: the docs never said to install it, a gap as on every backend.
    gap = runs["lacked-everywhere"]
    assert (gap["classification"], gap["reason"]) == ("docs_gap", "replay_step_failed")
    assert "image_lacked" not in gap["extra"]
    # Only the gap counts as evidence: the exit status says a docs gap was found.
    assert done.returncode == 1, done.stdout + done.stderr
