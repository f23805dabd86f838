"""workspace_protection: which entries of a workspace are held, as a table (pure)."""

from __future__ import annotations

import pytest

from firstrun.policy.filesystem import PROTECTED_ENTRIES, PROTECTED_NAMES, workspace_protection


def _kinds(**present: str):
    named = {name.replace("_", "."): kind for name, kind in present.items()}
    return lambda name: named.get(name)


def test_an_empty_workspace_holds_every_entry_as_its_placeholder_kind() -> None:
    held = workspace_protection(_kinds())
    assert held.protected == PROTECTED_ENTRIES and held.refusal is None
    assert dict(held.protected)[".git"] == "dir" and dict(held.protected)[".bashrc"] == "file"


@pytest.mark.parametrize(("present", "lift", "expect"), [
    # A present entry is held as what it is: a worktree's .git is a file.
    ({"_git": "file"}, (), {".git": "file"}),
    ({"_vscode": "file"}, (), {".vscode": "file"}),
    # A lifted name is not held, and is named as lifted.
    ({}, (".vscode", ".vscode"), {".vscode": None}),
])
def test_what_is_held(present: dict[str, str], lift: tuple[str, ...],
                      expect: dict[str, str | None]) -> None:
    held = workspace_protection(_kinds(**present), lift)
    assert held.refusal is None
    for name, kind in expect.items():
        assert dict(held.protected).get(name) == kind
    assert held.lifted == tuple(dict.fromkeys(lift))


@pytest.mark.parametrize(("present", "lift", "says"), [
    # A bind would land on the symlink's target, so it cannot be held.
    ({"_bashrc": "symlink"}, (), "the workspace's .bashrc is a symlink"),
    ({"_git": "other"}, (), "the workspace's .git is neither a file nor a directory"),
    ({}, (".vscod",), "'.vscod' is not a protected workspace entry"),
])
def test_what_is_refused(present: dict[str, str], lift: tuple[str, ...], says: str) -> None:
    held = workspace_protection(_kinds(**present), lift)
    assert held.protected == () and held.refusal is not None and says in held.refusal


def test_a_lifted_symlink_is_the_users_to_keep() -> None:
    held = workspace_protection(_kinds(_bashrc="symlink"), (".bashrc",))
    assert held.refusal is None and ".bashrc" not in dict(held.protected)


def test_every_name_is_one_entry_at_the_top_of_the_workspace() -> None:
    # Top level only: each is a mount point in the workspace's root, which
    # cannot be renamed, so no ancestor needs pinning.
    assert all("/" not in name and name.startswith(".") for name in PROTECTED_NAMES)
    assert len(set(PROTECTED_NAMES)) == len(PROTECTED_NAMES)
