"""Golden tests: the Seatbelt profile text and the sandbox-exec argv are pinned.

The text is compared byte for byte with ``golden/profile.sb``; a change to
what the profile allows must show up as a reviewed change to that file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from firstrun.errors import SandboxError
from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.seatbelt.profile import SeatbeltHost, build_seatbelt_spec

GOLDEN = Path(__file__).parent / "golden"

# A workspace name that would break out of a spliced string literal.
WORKSPACE = '/Users/ada/src/quick") (allow file-write* (subpath "x'
PROFILE = SandboxProfile(fs=FilesystemPolicy(
    workspace=WORKSPACE,
    readonly=("/usr", "/etc", "/Users/ada/.pyenv", "/Users/ada/.cargo"),
    hidden=("/Users/ada/.cargo/credentials.toml",),
    real_homes=("/Users/ada", "/var/root"),
))
TMPDIR = "/private/var/folders/x/T/firstrun-sb-1"
PROFILE_FILE = "/private/var/folders/x/T/firstrun-profile-1/profile.sb"
HOST = SeatbeltHost(canonical=(("/etc", "/private/etc"), ("/var/root", "/private/var/root")),
                    tmpdir=TMPDIR, profile_file=PROFILE_FILE,
                    private=("/private/var/folders/x", "/private/tmp"),
                    readable=("/usr/local/bin/python3", "/Users/ada/.local/share/uv/python"))


def test_profile_text_is_golden() -> None:
    spec = build_seatbelt_spec(PROFILE, host=HOST, proxy_port=53128)
    assert spec.profile_text == (GOLDEN / "profile.sb").read_text(encoding="utf-8")


def test_a_protected_workspace_keeps_its_entries_out_of_the_write_rule() -> None:
    fs = PROFILE.fs
    protected = SandboxProfile(fs=FilesystemPolicy(
        workspace=fs.workspace, readonly=fs.readonly, hidden=fs.hidden, real_homes=fs.real_homes,
        protected=((".git", "dir"), (".bashrc", "file"))))
    spec = build_seatbelt_spec(protected, host=HOST, proxy_port=53128)
    assert spec.named("PROTECTED") == (f"{WORKSPACE}/.git", f"{WORKSPACE}/.bashrc")
    assert ('(allow file-write* (require-all (subpath (param "WRITABLE_0")) '
            '(require-not (subpath (param "PROTECTED_0"))) '
            '(require-not (subpath (param "PROTECTED_1")))))') in spec.profile_text
    assert '(allow file-write* (subpath (param "WRITABLE_1")))' in spec.profile_text
    # Only the write rule changes: every other line is the unprotected profile's.
    plain = build_seatbelt_spec(PROFILE, host=HOST, proxy_port=53128).profile_text.splitlines()
    changed = set(spec.profile_text.splitlines()) ^ set(plain)
    assert all(line.startswith("(allow file-write*") for line in changed), changed


def test_no_path_is_spliced_into_the_text() -> None:
    spec = build_seatbelt_spec(PROFILE, host=HOST, proxy_port=53128)
    for _, value in spec.parameters:
        if value != "/":
            assert value not in spec.profile_text
    # Other paths of the same shape give the very same text: only parameters differ.
    other = SandboxProfile(fs=FilesystemPolicy(
        workspace="/Users/bob/src/other",
        readonly=("/usr", "/etc", "/Users/bob/.pyenv", "/Users/bob/.cargo"),
        hidden=("/Users/bob/.cargo/credentials.toml",),
        real_homes=("/Users/bob", "/var/root"),
    ))
    other_host = SeatbeltHost(canonical=HOST.canonical, tmpdir="/private/var/folders/y/T/sb-2",
                              profile_file="/private/var/folders/y/T/p-2/profile.sb",
                              private=("/private/var/folders/y", "/private/tmp"),
                              readable=("/Users/bob/.local/share/uv/python",))
    other_spec = build_seatbelt_spec(other, host=other_host, proxy_port=53128)
    assert other_spec.profile_text == spec.profile_text
    assert other_spec.parameters != spec.parameters


def test_parameters_and_argv_are_golden() -> None:
    spec = build_seatbelt_spec(PROFILE, host=HOST, proxy_port=53128)
    assert spec.parameters == (
        ("HOME_0", "/Users/ada"),
        ("HOME_1", "/private/var/root"),
        ("PRIVATE_0", "/private/var/folders/x"),
        ("PRIVATE_1", "/private/tmp"),
        ("HIDDEN_0", "/Users/ada/.cargo/credentials.toml"),
        ("TOOLCHAIN_0", "/Users/ada/.pyenv"),
        ("TOOLCHAIN_1", "/Users/ada/.cargo"),
        ("TOOLCHAIN_2", "/Users/ada/.local/share/uv/python"),
        ("WRITABLE_0", WORKSPACE),
        ("WRITABLE_1", TMPDIR),
        ("ANCESTOR_0", "/"),
        ("ANCESTOR_1", "/Users"),
        ("ANCESTOR_2", "/Users/ada"),
        ("ANCESTOR_3", "/Users/ada/.local"),
        ("ANCESTOR_4", "/Users/ada/.local/share"),
        ("ANCESTOR_5", "/Users/ada/.local/share/uv"),
        ("ANCESTOR_6", "/Users/ada/src"),
        ("ANCESTOR_7", "/private"),
        ("ANCESTOR_8", "/private/var"),
        ("ANCESTOR_9", "/private/var/folders"),
        ("ANCESTOR_10", "/private/var/folders/x"),
        ("ANCESTOR_11", "/private/var/folders/x/T"),
    )
    argv = spec.argv(["/bin/bash", "-c", "echo hi"])
    assert argv == [
        "/usr/bin/sandbox-exec", "-f", PROFILE_FILE,
        *(arg for name, value in spec.parameters for arg in ("-D", f"{name}={value}")),
        "--", "/bin/bash", "-c", "echo hi",
    ]
    assert argv[3:7] == ["-D", "HOME_0=/Users/ada", "-D", "HOME_1=/private/var/root"]


def test_without_a_proxy_no_network_rule_at_all() -> None:
    spec = build_seatbelt_spec(PROFILE, host=HOST, proxy_port=None)
    assert "network" not in spec.profile_text.replace(";; network:", "").replace(
        "no network at all", "")
    assert "(allow network" not in spec.profile_text


@pytest.mark.parametrize("profile_file", [
    f"{WORKSPACE}/profile.sb",        # inside the workspace
    f"{TMPDIR}/profile.sb",           # inside the sandbox's temp dir
    TMPDIR,                           # the writable root itself
])
def test_profile_file_inside_a_writable_root_is_refused(profile_file: str) -> None:
    host = SeatbeltHost(canonical=HOST.canonical, tmpdir=TMPDIR, profile_file=profile_file)
    with pytest.raises(SandboxError, match="writable root"):
        build_seatbelt_spec(PROFILE, host=host, proxy_port=53128)


def test_profile_file_is_outside_every_writable_root() -> None:
    spec = build_seatbelt_spec(PROFILE, host=HOST, proxy_port=53128)
    writable = [v for n, v in spec.parameters if n.startswith("WRITABLE")]
    assert writable == [WORKSPACE, TMPDIR]
    for root in writable:
        assert not (spec.profile_file == root or spec.profile_file.startswith(root + "/"))


@pytest.mark.parametrize("port", [0, 65536, -1, "53128", True])
def test_a_port_that_is_not_a_port_is_refused(port: object) -> None:
    with pytest.raises(SandboxError, match="not a TCP port"):
        build_seatbelt_spec(PROFILE, host=HOST, proxy_port=port)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["relative/ws", "/Users/ada/../etc", "/Users/ada/ws/", "/a\0b"])
def test_non_canonical_paths_are_refused(bad: str) -> None:
    profile = SandboxProfile(fs=FilesystemPolicy(workspace=bad, real_homes=("/Users/ada",)))
    with pytest.raises(SandboxError, match="canonical"):
        build_seatbelt_spec(profile, host=HOST, proxy_port=53128)
