"""The Seatbelt backend's parts that do not need macOS: launch spec, environment,
layers, refusals, the profile's place on disk (real files and symlinks), and
the probe's answer on this Linux host."""

from __future__ import annotations

import json
import os
import stat
import struct
import sys
from pathlib import Path

import pytest

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.profile import LayerName, SandboxProfile, unprovided
from firstrun.sandbox.seatbelt.backend import (
    MARKER_VARIABLE,
    SeatbeltBackend,
    attest_plan,
    carries,
    host_for,
    inside_path,
    layers,
    prepare_session_dirs,
    probe,
    procargs_environment,
    provides,
    refusal,
    session_environment,
    write_profile,
)
from firstrun.sandbox.seatbelt.profile import SeatbeltHost, build_seatbelt_spec

GOLDEN = Path(__file__).parent / "golden"
DOWNGRADED = frozenset({LayerName.NAMESPACES, LayerName.LIMITS})
PROFILE = SandboxProfile(
    fs=FilesystemPolicy(workspace="/Users/ada/src/quickstart",
                        readonly=("/usr", "/etc", "/Users/ada/.pyenv"),
                        hidden=("/Users/ada/.pyenv/.netrc",), real_homes=("/Users/ada",)),
    downgrades=DOWNGRADED)
SESSION = "/private/var/folders/x/T/firstrun-seatbelt-1"
HOST = SeatbeltHost(canonical=(("/etc", "/private/etc"),), tmpdir=f"{SESSION}/tmp",
                    profile_file=f"{SESSION}/profile.sb",
                    private=("/private/var/folders/x", "/private/tmp"),
                    readable=("/Users/ada/.pyenv/versions/3.11.7", "/opt/homebrew/bin"))
HOST_ENV = {
    "PATH": "/usr/bin:/bin:/Users/ada/bin:relative:/no/such/dir",
    "TERM": "xterm-256color",
    "ANTHROPIC_API_KEY": "sk-ant-must-not-pass",
    "SSL_CERT_FILE": "/private/etc/ssl/cert.pem",
}


def _launch() -> dict[str, object]:
    spec = build_seatbelt_spec(PROFILE, host=HOST, proxy_port=53128)
    env = session_environment(HOST_ENV, spec, proxy_port=53128, marker="0" * 32)
    return {"argv": spec.argv(["/bin/bash", "-c", "pip install -r requirements.txt"]),
            "env": env}


def test_launch_spec_is_golden() -> None:
    """argv and environment together, as the session hands them to Popen."""
    golden = json.loads((GOLDEN / "launch.json").read_text(encoding="utf-8"))
    assert _launch() == golden


def test_environment_is_built_from_scratch() -> None:
    env = _launch()["env"]
    assert isinstance(env, dict)
    assert "ANTHROPIC_API_KEY" not in env
    assert env["HOME"] == f"{SESSION}/tmp/home"
    assert env["TMPDIR"] == f"{SESSION}/tmp"
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://127.0.0.1:53128"
    assert env[MARKER_VARIABLE] == "0" * 32


def test_path_keeps_only_directories_the_profile_lets_a_command_read(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for d in ("bin", ".pyenv/shims", ".ssh/bin"):
        (home / d).mkdir(parents=True)
    profile = SandboxProfile(fs=FilesystemPolicy(
        workspace=str(tmp_path / "ws"), readonly=("/usr", str(home / ".pyenv")),
        real_homes=(str(home),)))
    spec = build_seatbelt_spec(profile, host=SeatbeltHost(
        tmpdir=str(tmp_path / "s" / "tmp"), profile_file=str(tmp_path / "s" / "profile.sb")),
        proxy_port=None)
    host_path = ":".join([str(home / ".pyenv/shims"), "/usr/bin", str(home / "bin"),
                          str(home / ".ssh/bin"), "/usr/bin"])
    assert inside_path(host_path, spec) == [str(home / ".pyenv/shims"), "/usr/bin"]


def test_layers_say_what_seatbelt_gives_and_what_it_cannot() -> None:
    spec = build_seatbelt_spec(PROFILE, host=HOST, proxy_port=53128)
    got = {layer.name: layer for layer in layers(PROFILE, spec, euid=501, proxy_port=53128)}
    assert set(got) == set(LayerName)
    assert not got[LayerName.NAMESPACES].applied
    assert "no namespaces" in got[LayerName.NAMESPACES].detail
    assert not got[LayerName.LIMITS].applied
    assert "not capped" in got[LayerName.LIMITS].detail
    assert got[LayerName.LANDLOCK].mechanism == "seatbelt file-write rules"
    assert f"{SESSION}/tmp" in got[LayerName.LANDLOCK].detail
    assert got[LayerName.NETWORK].applied
    assert "localhost:53128" in got[LayerName.NETWORK].detail
    assert got[LayerName.UNPRIVILEGED].mechanism == "uid 501"
    as_root = {layer.name: layer for layer in layers(PROFILE, spec, euid=0, proxy_port=None)}
    assert not as_root[LayerName.UNPRIVILEGED].applied
    assert as_root[LayerName.NETWORK].detail == "no network at all (no proxy)"


def test_layers_seatbelt_cannot_give_are_refused_unless_downgraded() -> None:
    required_all = SandboxProfile(fs=PROFILE.fs)
    assert unprovided(required_all, provides(501)) == (LayerName.LIMITS, LayerName.NAMESPACES)
    assert unprovided(PROFILE, provides(501)) == ()
    assert unprovided(PROFILE, provides(0)) == (LayerName.UNPRIVILEGED,)
    refused = refusal(required_all, euid=501)
    assert refused is not None
    assert str(refused) == ("seatbelt: Seatbelt cannot provide required layers: limits: macOS "
                            "has no cgroups and does not enforce memory rlimits; namespaces: "
                            "macOS has no namespaces")
    assert refused.fix == ("pass --allow-downgrade limits --allow-downgrade namespaces to run "
                           "with them recorded as not applied, or use the linux or docker backend")
    as_root = refusal(PROFILE, euid=0)
    assert as_root is not None and "runs as root" in str(as_root)
    assert refusal(PROFILE, euid=501) is None


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the answer off macOS")
def test_probe_says_why_not_here_and_what_to_use_instead() -> None:
    (cap,) = probe()
    assert cap.name == "macos" and not cap.available
    assert sys.platform in cap.detail
    assert "--backend linux" in (cap.fix or "")
    assert SeatbeltBackend().probe() == probe()


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the refusal off macOS")
def test_start_refuses_off_macos_before_anything_is_made(tmp_path: Path) -> None:
    profile = SandboxProfile(fs=FilesystemPolicy(workspace=str(tmp_path)), downgrades=DOWNGRADED)
    with pytest.raises(SandboxUnavailable) as refused:
        SeatbeltBackend(state_root=str(tmp_path / "state")).start(profile, proxy=None)
    assert "only on macOS" in str(refused.value)
    assert refused.value.fix and "--backend linux" in refused.value.fix
    assert not (tmp_path / "state").exists()


def test_profile_file_is_outside_every_writable_root_after_resolving_symlinks(
        tmp_path: Path) -> None:
    # The state root is reached through a symlink, as macOS's /var and /tmp are.
    (tmp_path / "real-state").mkdir()
    (tmp_path / "state").symlink_to(tmp_path / "real-state")
    (tmp_path / "real-ws").mkdir()
    (tmp_path / "ws").symlink_to(tmp_path / "real-ws")
    dirs = prepare_session_dirs(str(tmp_path / "state"))
    profile = SandboxProfile(fs=FilesystemPolicy(workspace=str(tmp_path / "ws")))
    spec = build_seatbelt_spec(profile, host=host_for(
        profile, session_dir=dirs.session_dir, tmpdir=dirs.tmpdir, private=(), readable=()),
        proxy_port=None)
    writable = [v for n, v in spec.parameters if n.startswith("WRITABLE_")]
    assert writable == [str(tmp_path / "real-ws"), os.path.realpath(dirs.tmpdir)]
    assert os.path.realpath(spec.profile_file) == spec.profile_file
    for root in writable:
        assert os.path.realpath(root) == root
        assert os.path.commonpath([root, spec.profile_file]) != root
    assert stat.S_IMODE(os.stat(dirs.session_dir).st_mode) == 0o700


def test_a_profile_file_that_resolves_into_the_workspace_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real" / "ws").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    # Spelled outside the workspace, but the symlink puts it inside.
    session_dir = tmp_path / "link" / "ws" / "state"
    session_dir.mkdir()
    profile = SandboxProfile(fs=FilesystemPolicy(workspace=str(tmp_path / "real" / "ws")))
    host = host_for(profile, session_dir=str(session_dir), tmpdir=str(tmp_path / "t"),
                    private=(), readable=())
    with pytest.raises(SandboxError, match="inside the writable root"):
        build_seatbelt_spec(profile, host=host, proxy_port=None)


def test_the_profile_is_written_0400_and_never_over_an_existing_file(tmp_path: Path) -> None:
    dirs = prepare_session_dirs(str(tmp_path))
    profile = SandboxProfile(fs=FilesystemPolicy(workspace=str(tmp_path / "ws")))
    spec = build_seatbelt_spec(profile, host=host_for(
        profile, session_dir=dirs.session_dir, tmpdir=dirs.tmpdir, private=(), readable=()),
        proxy_port=None)
    write_profile(spec)
    assert Path(spec.profile_file).read_text(encoding="utf-8") == spec.profile_text
    assert stat.S_IMODE(os.stat(spec.profile_file).st_mode) == 0o400
    with pytest.raises(SandboxError, match="cannot write the profile"):
        write_profile(spec)
    os.unlink(spec.profile_file)
    os.symlink(tmp_path / "elsewhere", spec.profile_file)
    with pytest.raises(SandboxError, match="cannot write the profile"):
        write_profile(spec)
    assert not (tmp_path / "elsewhere").exists()


def test_the_session_marker_is_read_from_kern_procargs2_layout() -> None:
    buf = (struct.pack("=i", 2) + b"/bin/sleep\0\0\0\0" + b"sleep\0" + b"100\0"
           + f"A=1\0{MARKER_VARIABLE}=ab\0".encode() + b"\0" + b"ptr_munge=\0")
    assert procargs_environment(buf) == [b"A=1", f"{MARKER_VARIABLE}=ab".encode()]
    # A marker spelled as an argument is not in the environment.
    argv_only = struct.pack("=i", 2) + f"/bin/x\0x\0{MARKER_VARIABLE}=ab\0\0".encode()
    assert procargs_environment(argv_only) == []
    assert procargs_environment(b"\1\0") == []


def test_registered_by_name_and_ranked_after_docker_and_linux() -> None:
    from firstrun.sandbox.select import (
        REGISTRY,
        BackendOptions,
        build_backend,
        unavailable,
    )

    assert isinstance(build_backend("seatbelt", BackendOptions()), SeatbeltBackend)
    ranked = [e.name for e in sorted((e for e in REGISTRY if e.auto_rank is not None),
                                     key=lambda e: e.auto_rank or 0)]
    assert ranked == ["docker", "linux", "seatbelt"]
    if sys.platform != "darwin":
        missing = unavailable("seatbelt", BackendOptions())
        assert missing is not None and missing.name == "macos" and missing.fix


def test_a_command_marker_is_its_own_and_the_session_marker_covers_every_command() -> None:
    env = [b"A=1", f"{MARKER_VARIABLE}=abc.2".encode()]
    assert carries(env, "abc")
    assert carries(env, "abc.2")
    assert not carries(env, "abc.1")
    assert not carries(env, "abc.20") and not carries([f"{MARKER_VARIABLE}=abc.20".encode()], "abc.2")
    assert not carries(env, "ab")
    assert not carries([b"A=1"], "abc")


def test_the_attestation_plan_is_in_seatbelt_terms() -> None:
    spec = build_seatbelt_spec(PROFILE, host=HOST, proxy_port=53128)
    plan = attest_plan(spec, python="/opt/homebrew/bin/python3.11", proxy_port=53128, nonce="n")
    assert plan.network == "profile_filtered" and plan.kernel == "darwin"
    assert not plan.landlock
    assert plan.workspace == "/Users/ada/src/quickstart"
    assert plan.real_homes == ("/Users/ada", "/private/var/folders/x", "/private/tmp")
    assert plan.exposed == ("/Users/ada/.pyenv", "/Users/ada/.pyenv/versions/3.11.7",
                            "/Users/ada/src/quickstart", f"{SESSION}/tmp")
    # The witness is where the profile lives; the write tried in it is in no writable root.
    assert plan.write_witness == SESSION
    assert (plan.proxy_port, plan.nonce, plan.host_address) == (53128, "n", "127.0.0.1")
