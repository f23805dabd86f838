"""The symlink trap: an agent plants links to /etc and to the host's /tmp, and the harness's own
writes (traces, results, kept workspaces, their replacement and removal, ownership handed back)
still land only where they should.

Inside the sandbox /tmp is private, so a link to a host /tmp path dangles
there and resolves only on the host side, which is exactly where the
harness works. The evidence is the host paths themselves: a canary directory
owned by another uid, its file's bytes, mode and owner, and /etc and /tmp's
own ownership and mode, before and after.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import DOCS, DOCS_HOST, Run, events, runs_by_task, trace_of

pytestmark = pytest.mark.e2e

NAME = "e2e-symlink-trap"
CANARY_UID = 4242
HARNESS_NAMES = ("results.json", "trace.jsonl", "workspace", "runs")


def _identity(path: str) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


@pytest.fixture
def canary() -> Iterator[Path]:
    # On the host's /tmp, owned by a uid that is neither the harness nor the
    # sandbox user, so a chown that followed a link would show.
    directory = Path(tempfile.mkdtemp(prefix="firstrun-e2e-canary-", dir="/tmp"))
    (directory / "canary.txt").write_text("untouched\n")
    os.chmod(directory / "canary.txt", 0o600)
    os.chown(directory / "canary.txt", CANARY_UID, CANARY_UID)
    os.chown(directory, CANARY_UID, CANARY_UID)
    yield directory
    shutil.rmtree(directory)


def _trap_task(tmp_path: Path, canary: Path) -> Path:
    links = {
        "etc-link": "/etc",
        "host-tmp": "/tmp",
        "canary-dir": str(canary),
        "canary-file": str(canary / "canary.txt"),
        "nested/deeper/canary-dir": str(canary),
        **{name: str(canary / name) for name in HARNESS_NAMES},
    }
    steps = [f"mkdir -p {os.path.dirname(name)}" for name in links if "/" in name]
    steps += [f"ln -s {target} {name}" for name, target in links.items()]
    path = tmp_path / "symlink-trap.yaml"
    path.write_text(
        f"name: {NAME}\n"
        "goal: Plant symlinks out of the workspace.\n"
        f"docs:\n  path:\n    - https://{DOCS_HOST}/index.html\n"
        "replay:\n" + "".join(f"  - {{run: {step}, undocumented: a test step}}\n" for step in steps) +
        "success:\n  script: |\n"
        "    test -L etc-link && test -L canary-file || qs_fail \"the links are gone\"\n"
    )
    return path


def test_planted_symlinks_never_lead_a_harness_write_outside(
    firstrun: Run, tmp_path: Path, canary: Path
) -> None:
    trap = _trap_task(tmp_path, canary)
    watched = ("/etc", "/tmp", str(canary), str(canary / "canary.txt"))
    before = {path: _identity(path) for path in watched}
    etc_before = set(os.listdir("/etc"))
    out = tmp_path / "out"
    mirror = f"{DOCS_HOST}={DOCS}"

    # Kept workspace; then the same --out again, which replaces the kept
    # attempt (removing a tree full of planted links); then a throwaway one.
    for extra in (["--keep-sandbox"], ["--keep-sandbox"], []):
        done = firstrun("run", str(trap), "--docs-mirror", mirror, "--out", str(out), *extra)
        assert done.returncode == 0, done.stdout + done.stderr
        (run,) = runs_by_task(out).values()
        assert run["classification"] == "passed"
        assert all(c["exit_code"] == 0 for c in events(trace_of(out, run), "command"))

    assert {path: _identity(path) for path in watched} == before
    assert os.listdir(canary) == ["canary.txt"]
    assert (canary / "canary.txt").read_text() == "untouched\n"
    assert not any(name in etc_before ^ set(os.listdir("/etc")) for name in HARNESS_NAMES)
    assert not any(n.startswith(".firstrun-output-") for n in os.listdir("/etc"))

    # What the harness wrote is where the layout says, and nowhere else.
    assert sorted(os.listdir(out)) == ["results.json", "runs"]
    assert sorted(os.listdir(out / "runs" / NAME / "1")) == ["trace.jsonl"]


def test_a_kept_workspace_keeps_the_links_as_links(
    firstrun: Run, tmp_path: Path, canary: Path
) -> None:
    trap = _trap_task(tmp_path, canary)
    out = tmp_path / "out"
    done = firstrun("run", str(trap), "--docs-mirror", f"{DOCS_HOST}={DOCS}", "--out", str(out),
                    "--keep-sandbox")
    assert done.returncode == 0, done.stdout + done.stderr
    attempt = out / "runs" / NAME / "1"
    assert sorted(os.listdir(attempt)) == ["trace.jsonl", "workspace"]
    kept = attempt / "workspace"
    for name, target in (("etc-link", "/etc"), ("host-tmp", "/tmp"),
                         ("canary-dir", str(canary)), ("results.json", str(canary / "results.json"))):
        assert (kept / name).is_symlink() and os.readlink(kept / name) == target
    # Ownership came back to the caller on the links themselves, not their targets.
    assert os.lstat(kept / "etc-link").st_uid == os.getuid()
    assert _identity(str(canary)) == (CANARY_UID, CANARY_UID, 0o700)
    assert os.listdir(canary) == ["canary.txt"]
