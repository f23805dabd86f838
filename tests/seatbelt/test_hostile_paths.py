"""Hostile path names reach sandbox-exec only as -D values: the profile text never changes.

Each name below would end a string literal, open an S-expression, start a
comment or a regex literal, or break a line if it were spliced into SBPL.
The proof is twofold: the profile text is byte-identical to the one for a
plain path, and each hostile value is exactly one argv element.
"""

from __future__ import annotations

import pytest

from firstrun.errors import SandboxError
from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.seatbelt.profile import SeatbeltHost, build_seatbelt_spec

HOSTILE = [
    '/Users/ada/q"uote',
    "/Users/ada/paren) (allow default) (",
    "/Users/ada/new\nline (allow default)",
    "/Users/ada/#comment ; (allow default)",
    '/Users/ada/#"regex"',
    "/Users/ada/ünï·cødé/日本語/🙂",
    "/Users/ada/back\\slash\\\"",
    "/Users/ada/equals=(param \"HOME_0\")",
    "/Users/ada/-D WRITABLE_0=x",
]
PLAIN = "/Users/ada/plain"
HOST = SeatbeltHost(tmpdir="/private/var/folders/x/T/sb", profile_file="/private/var/p/profile.sb",
                    private=("/private/var/folders/x",))


def _profile(workspace: str) -> SandboxProfile:
    return SandboxProfile(fs=FilesystemPolicy(workspace=workspace, readonly=("/usr",),
                                              real_homes=("/Users/ada",)))


@pytest.mark.parametrize("path", HOSTILE)
def test_a_hostile_workspace_leaves_the_profile_text_unchanged(path: str) -> None:
    # A plain path of the same depth: the text depends on how many ancestors
    # a path has, never on what they are called.
    same_depth = "/Users/ada/" + "/".join("p" for _ in path.split("/")[3:])
    plain = build_seatbelt_spec(_profile(same_depth), host=HOST, proxy_port=4000)
    hostile = build_seatbelt_spec(_profile(path), host=HOST, proxy_port=4000)
    assert hostile.profile_text == plain.profile_text
    assert ("WRITABLE_0", path) in hostile.parameters
    argv = hostile.argv(["/bin/true"])
    assert argv.count(f"WRITABLE_0={path}") == 1
    assert argv[argv.index(f"WRITABLE_0={path}") - 1] == "-D"
    assert argv[-2:] == ["--", "/bin/true"]


@pytest.mark.parametrize("path", HOSTILE)
def test_hostile_homes_hidden_paths_and_temp_dirs_are_parameters_too(path: str) -> None:
    profile = SandboxProfile(fs=FilesystemPolicy(
        workspace="/Volumes/work/ws", readonly=("/usr", f"{path}/.pyenv"),
        hidden=(f"{path}/.pyenv/secret",), real_homes=(path,)))
    host = SeatbeltHost(tmpdir=f"/private/var/folders/x/T/{path[11:]}",
                        profile_file="/private/var/p/profile.sb")
    spec = build_seatbelt_spec(profile, host=host, proxy_port=4000)
    values = dict(spec.parameters)
    assert values["HOME_0"] == path
    assert values["HIDDEN_0"] == f"{path}/.pyenv/secret"
    assert values["TOOLCHAIN_0"] == f"{path}/.pyenv"
    for value in (path, path[11:]):
        assert value not in spec.profile_text


def test_only_the_proxy_port_is_written_into_the_text_and_only_as_an_integer() -> None:
    a = build_seatbelt_spec(_profile(PLAIN), host=HOST, proxy_port=4000)
    b = build_seatbelt_spec(_profile(PLAIN), host=HOST, proxy_port=4001)
    diff = [(x, y) for x, y in zip(a.profile_text.splitlines(), b.profile_text.splitlines(), strict=True)
            if x != y]
    assert diff == [('(allow network-outbound (remote ip "localhost:4000"))',
                     '(allow network-outbound (remote ip "localhost:4001"))')]


def test_a_nul_byte_is_refused_before_any_text_is_made() -> None:
    with pytest.raises(SandboxError, match="canonical"):
        build_seatbelt_spec(_profile("/Users/ada/a\0b"), host=HOST, proxy_port=4000)


@pytest.mark.parametrize("workspace", ["/Users", "/Users/ada", "/private/var/folders", "/"])
def test_a_writable_root_holding_a_home_or_private_directory_is_refused(workspace: str) -> None:
    with pytest.raises(SandboxError, match="must stay unreadable|writable root"):
        build_seatbelt_spec(_profile(workspace), host=HOST, proxy_port=4000)
