"""The harness's own workspace I/O never leaves the workspace: real symlinks, real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from firstrun.run.workspace import Workspace, WorkspaceError

pytestmark = pytest.mark.fast


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("untouched\n")
    return outside


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.iterdir())}


def test_a_symlinked_directory_is_never_written_through(ws: Path, canary: Path) -> None:
    before = snapshot(canary)
    (ws / "results").symlink_to(canary)
    with Workspace(ws) as handle, pytest.raises(WorkspaceError, match="symlink"):
        handle.write_new("results/out.txt", b"escaped")
    assert snapshot(canary) == before


def test_a_symlink_deeper_down_is_never_written_through(ws: Path, canary: Path) -> None:
    before = snapshot(canary)
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "c").symlink_to(canary)
    with Workspace(ws) as handle, pytest.raises(WorkspaceError):
        handle.write_new("a/b/c/d/out.txt", b"escaped")
    assert snapshot(canary) == before
    assert not (canary / "d").exists()


def test_a_symlinked_file_name_is_never_written_through(ws: Path, canary: Path) -> None:
    (ws / "log.txt").symlink_to(canary / "canary.txt")
    (ws / "dangling.txt").symlink_to(canary / "created-by-harness.txt")
    with Workspace(ws) as handle:
        for name in ("log.txt", "dangling.txt"):
            with pytest.raises(WorkspaceError):
                handle.write_new(name, b"escaped")
    assert snapshot(canary) == {"canary.txt": "untouched\n"}


def test_a_hard_link_is_never_written_through(ws: Path, canary: Path) -> None:
    os.link(canary / "canary.txt", ws / "log.txt")
    with Workspace(ws) as handle, pytest.raises(WorkspaceError, match="already exists"):
        handle.write_new("log.txt", b"escaped")
    assert (canary / "canary.txt").read_text() == "untouched\n"


def test_reads_refuse_symlinks_and_do_not_hang_on_a_fifo(ws: Path, canary: Path) -> None:
    (ws / "link").symlink_to(canary / "canary.txt")
    (ws / "dir").symlink_to(canary)
    os.mkfifo(ws / "pipe")
    with Workspace(ws) as handle:
        with pytest.raises(WorkspaceError):
            handle.read("link", max_bytes=100)
        with pytest.raises(WorkspaceError):
            handle.read("dir/canary.txt", max_bytes=100)
        with pytest.raises(WorkspaceError, match="not a regular file"):
            handle.read("pipe", max_bytes=100)


def test_remove_takes_the_link_away_and_never_its_target(ws: Path, canary: Path) -> None:
    (ws / "link").symlink_to(canary / "canary.txt")
    (ws / "link-dir").symlink_to(canary)
    with Workspace(ws) as handle:
        handle.remove("link")
        with pytest.raises(WorkspaceError):
            handle.remove("link-dir/canary.txt")
    assert not os.path.lexists(ws / "link")
    assert snapshot(canary) == {"canary.txt": "untouched\n"}


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../x", "", ".", "a/\0b"])
def test_paths_that_name_anything_but_a_plain_descendant_are_refused(ws: Path, bad: str) -> None:
    with Workspace(ws) as handle, pytest.raises(WorkspaceError):
        handle.write_new(bad, b"x")
    assert list(ws.iterdir()) == []


def test_a_plain_write_and_read_round_trip(ws: Path) -> None:
    with Workspace(ws) as handle:
        handle.write_new("sub/dir/file.txt", b"hello")
        assert handle.read("sub/dir/file.txt", max_bytes=3) == b"hel"
        with pytest.raises(WorkspaceError, match="already exists"):
            handle.write_new("sub/dir/file.txt", b"again")
    assert (ws / "sub" / "dir" / "file.txt").read_bytes() == b"hello"


def test_a_workspace_root_that_is_a_symlink_is_refused(tmp_path: Path, canary: Path) -> None:
    (tmp_path / "ws-link").symlink_to(canary)
    with pytest.raises(WorkspaceError):
        Workspace(tmp_path / "ws-link")
