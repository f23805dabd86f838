"""What every launched backend's start does to the workspace, in one place: the protected
entries' placeholders placed and a lent uid given the workspace, each undone on the
start's stack, so closing it leaves the workspace as it was found."""

from __future__ import annotations

import os
from contextlib import ExitStack

import pytest

from firstrun.sandbox.ownership import pick_uid
from firstrun.sandbox.supervised import take_workspace
from support.profiles import make_profile

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="lending a workspace needs root")


def test_placed_and_lent_then_removed_and_given_back(workspace: str) -> None:
    os.chown(workspace, 4321, 4322)
    with open(os.path.join(workspace, "mine"), "w") as f:
        f.write("kept\n")
    os.chown(os.path.join(workspace, "mine"), 4321, 4322)
    fs = make_profile(workspace, protect=True).fs
    lent = pick_uid((1_500_000_000, 1_600_000_000), who="test")
    with ExitStack() as acquired:
        take_workspace(acquired, fs, lent=lent, owner=(4321, 4322), who="test")
        for name, kind in fs.protected:
            path = os.path.join(workspace, name)
            assert os.path.isdir(path) if kind == "dir" else os.path.isfile(path), name
        assert os.stat(workspace).st_uid == lent
        assert os.stat(os.path.join(workspace, "mine")).st_uid == lent
    assert sorted(os.listdir(workspace)) == ["mine"]
    assert (os.stat(workspace).st_uid, os.stat(os.path.join(workspace, "mine")).st_uid) == \
        (4321, 4321)


def test_without_a_uid_only_the_placeholders_come_and_go(workspace: str) -> None:
    fs = make_profile(workspace, protect=True).fs
    owner = os.stat(workspace).st_uid
    with ExitStack() as acquired:
        take_workspace(acquired, fs, lent=None, owner=(owner, owner), who="test")
        assert len(os.listdir(workspace)) == len(fs.protected)
        assert os.stat(workspace).st_uid == owner
    assert os.listdir(workspace) == []
