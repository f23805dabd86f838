"""Odd workspaces handed to the library: named through symlinks, named with a newline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from firstrun.errors import UsageError
from firstrun.sandbox.hostfs import check_workspace
from firstrun.sandbox.linux.backend import LinuxBackend
from support.profiles import make_profile


def test_a_refusal_of_a_path_with_a_newline_stays_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home\nnext"
    home.mkdir()
    with pytest.raises(UsageError) as caught:
        check_workspace(str(home), {"HOME": str(home)})
    assert "\n" not in str(caught.value)
    assert "home\\nnext" in str(caught.value) and "holds the home directory" in str(caught.value)


def test_a_workspace_named_through_a_symlink_chain_is_the_directory_it_names(
        workspace: str) -> None:
    real = os.path.join(workspace, "real")
    os.mkdir(real)
    os.symlink("real", os.path.join(workspace, "one"))
    os.symlink("one", os.path.join(workspace, "two"))
    profile = make_profile(os.path.join(workspace, "two"))
    assert profile.fs.workspace == real
    with LinuxBackend().start(profile, proxy=None) as s:
        assert s.exec("touch made").exit_code == 0
    assert os.path.exists(os.path.join(real, "made"))
    st = os.stat(os.path.join(real, "made"))
    assert (st.st_uid, st.st_gid) == (os.stat(real).st_uid, os.stat(real).st_gid)
