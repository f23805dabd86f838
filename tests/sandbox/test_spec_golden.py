"""Golden tests: the bwrap argv and the seccomp rules are pinned, line by line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.process import Limits
from firstrun.policy.profile import LayerName, SandboxProfile
from firstrun.sandbox.bytecode import BOOTSTRAP
from firstrun.sandbox.linux import seccomp
from firstrun.sandbox.linux.spec import (
    HostView,
    StagedBind,
    build_launch_spec,
    helper_config,
)

GOLDEN = Path(__file__).parent / "golden"

PROFILE = SandboxProfile(
    fs=FilesystemPolicy(
        workspace="/HOST/ws",
        readonly=("/usr", "/etc", "/bin", "/lib", "/HOME/.cargo", "/HOME/.pyenv", "/CA/corp.pem"),
        hidden=("/HOME/.cargo/credentials.toml", "/HOME/.pyenv/.ssh"),
        real_homes=("/HOME", "/root"),
    ),
    limits=Limits(memory_bytes=1 << 30),
)
HOST = HostView(
    symlinks=(("/bin", "usr/bin"), ("/lib", "usr/lib")),
    directories=frozenset({"/usr", "/etc", "/HOME/.cargo", "/HOME/.pyenv", "/HOME/.pyenv/.ssh",
                           "/PY"}),
    interpreter="/PY/bin/python3.11",
    prefix="/PY",
)


def _spec(stage_dir: str | None):
    config = helper_config(PROFILE, control_fd=3, dial_fd=4)
    return build_launch_spec(PROFILE, host=HOST, helper_code="<HELPER>", config=config,
                             seccomp_fd=5, stage_dir=stage_dir, bwrap="/usr/bin/bwrap")


EXPECTED_HEAD = [
    "/usr/bin/bwrap",
    "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
    "--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--as-pid-1", "--new-session",
    "--hostname", "sandbox",
    "--proc", "/proc",
    "--dev", "/dev",
    "--size", "1073741824", "--tmpfs", "/dev/shm",
    "--size", "1073741824", "--tmpfs", "/tmp",
]


def test_argv_unprivileged_harness() -> None:
    spec = _spec(None)
    argv = list(spec.argv)
    config = json.loads(argv[-1])
    assert argv[:-1] == EXPECTED_HEAD + [
        "--ro-bind", "/PY", "/PY",
        "--symlink", "usr/bin", "/bin",
        "--ro-bind", "/etc", "/etc",
        "--symlink", "usr/lib", "/lib",
        "--ro-bind", "/usr", "/usr",
        "--ro-bind", "/CA/corp.pem", "/CA/corp.pem",
        "--ro-bind", "/HOME/.cargo", "/HOME/.cargo",
        "--ro-bind", "/HOME/.pyenv", "/HOME/.pyenv",
        "--ro-bind", "/dev/null", "/HOME/.cargo/credentials.toml",
        "--tmpfs", "/HOME/.pyenv/.ssh",
        "--size", "1073741824", "--tmpfs", "/home/sandbox",
        "--bind", "/HOST/ws", "/workspace",
        "--chdir", "/workspace",
        "--seccomp", "5",
        "--", "/PY/bin/python3.11", "-I", "-S", "-c", BOOTSTRAP, "<HELPER>",
    ]
    assert config == {
        "channel_fds": [3, 3],
        "dial_fd": 4,
        "proxy_port": 3128,
        "limits": {"pids": 1024, "memory_bytes": 1 << 30, "open_files": 4096},
        "landlock": {
            "apply": True,
            "required": True,
            "min_abi": 1,
            "dirs": ["/workspace", "/tmp", "/home/sandbox", "/dev/shm", "/dev/pts"],
            "files": ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random",
                      "/dev/urandom", "/dev/ptmx"],
        },
    }
    assert spec.stage == ()
    assert spec.exposed == ("/HOME/.cargo", "/HOME/.pyenv", "/CA/corp.pem", "/PY")


def test_argv_root_harness_stages_every_non_system_source() -> None:
    spec = _spec("<STAGE>")
    assert spec.stage == (
        StagedBind(source="/PY", staged="<STAGE>/0", directory=True),
        StagedBind(source="/CA/corp.pem", staged="<STAGE>/1", directory=False),
        StagedBind(source="/HOME/.cargo", staged="<STAGE>/2", directory=True),
        StagedBind(source="/HOME/.pyenv", staged="<STAGE>/3", directory=True),
        StagedBind(source="/HOST/ws", staged="<STAGE>/4", directory=True),
    )
    argv = list(spec.argv)
    assert ["--ro-bind", "<STAGE>/3", "/HOME/.pyenv"] == argv[argv.index("/HOME/.pyenv") - 2:
                                                            argv.index("/HOME/.pyenv") + 1]
    assert argv[argv.index("/workspace") - 2: argv.index("/workspace") + 1] == [
        "--bind", "<STAGE>/4", "/workspace"]
    # System directories are reachable by any uid and are never staged.
    assert ["--ro-bind", "/usr", "/usr"] == argv[argv.index("/usr") - 1: argv.index("/usr") + 2]


def test_trust_bundle_is_bound_over_the_system_bundle_after_etc() -> None:
    config = helper_config(PROFILE, control_fd=3, dial_fd=4)
    plain = list(_spec(None).argv)
    argv = list(build_launch_spec(PROFILE, host=HOST, helper_code="<HELPER>", config=config,
                                  seccomp_fd=5, stage_dir=None, bwrap="/usr/bin/bwrap",
                                  trust_bundle="/RUN/trust.pem").argv)
    at = plain.index("--ro-bind", plain.index("/HOME/.pyenv") + 1)
    # Exactly one bind added, after every read-only root (so on top of /etc's).
    assert argv == plain[:at] + [
        "--ro-bind", "/RUN/trust.pem", "/etc/ssl/certs/ca-certificates.crt"] + plain[at:]
    staged = build_launch_spec(PROFILE, host=HOST, helper_code="<HELPER>", config=config,
                               seccomp_fd=5, stage_dir="<STAGE>", bwrap="/usr/bin/bwrap",
                               trust_bundle="/RUN/trust.pem")
    assert StagedBind(source="/RUN/trust.pem", staged="<STAGE>/4", directory=False) in staged.stage


def test_nothing_under_run_or_host_tmp_is_ever_bound() -> None:
    argv = list(_spec(None).argv)
    sources = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    assert not [s for s in sources if s.startswith(("/run", "/var/run", "/tmp"))]


def test_landlock_downgrade_makes_it_optional() -> None:
    profile = SandboxProfile(fs=PROFILE.fs, downgrades=frozenset({LayerName.LANDLOCK}))
    assert helper_config(profile, control_fd=3, dial_fd=None)["landlock"]["required"] is False
    assert helper_config(profile, control_fd=3, dial_fd=None)["proxy_port"] is None


def test_seccomp_rules_match_golden() -> None:
    expected = json.loads((GOLDEN / "seccomp_rules.json").read_text())
    assert seccomp.rules_to_data() == expected


def test_seccomp_rules_compile_to_bpf() -> None:
    fd = seccomp.compile_filter()
    try:
        size = os.fstat(fd).st_size
        # Each classic BPF instruction is 8 bytes.
        assert size > 0 and size % 8 == 0
        assert os.get_inheritable(fd) is False
    finally:
        os.close(fd)


def test_compiling_the_filter_starts_no_process() -> None:
    # A library lookup through ctypes.util forks ldconfig: two processes per
    # session start, which the filter never needed.
    code = ("import os, subprocess\n"
            "def refuse(*a, **k): raise AssertionError(f'started a process: {a}')\n"
            "subprocess.Popen.__init__ = refuse\n"
            "from firstrun.sandbox.linux import seccomp\n"
            "os.close(seccomp.compile_filter())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_protected_entries_are_bound_read_only_on_top_of_the_workspace() -> None:
    from dataclasses import replace

    fs = replace(PROFILE.fs, protected=((".git", "dir"), (".bashrc", "file")))
    profile = replace(PROFILE, fs=fs)
    config = helper_config(profile, control_fd=3, dial_fd=4)
    for stage_dir in (None, "<STAGE>"):
        spec = build_launch_spec(profile, host=HOST, helper_code="<HELPER>", config=config,
                                 seccomp_fd=5, stage_dir=stage_dir, bwrap="/usr/bin/bwrap")
        argv = list(spec.argv)
        at = argv.index("/workspace")
        source = (lambda n, p: p) if stage_dir is None else (lambda n, p: f"<STAGE>/{n}")
        assert argv[at + 1: at + 7] == [
            "--ro-bind", source(5, "/HOST/ws/.git"), "/workspace/.git",
            "--ro-bind", source(6, "/HOST/ws/.bashrc"), "/workspace/.bashrc"]
        if stage_dir is not None:
            assert spec.stage[-2:] == (
                StagedBind(source="/HOST/ws/.git", staged="<STAGE>/5", directory=True),
                StagedBind(source="/HOST/ws/.bashrc", staged="<STAGE>/6", directory=False))


def _facts(**overrides: object):
    from firstrun.sandbox.linux.spec import LinuxFacts

    facts = {
        "bwrap": "/usr/bin/bwrap", "host": HOST, "uid": None, "stage_dir": None,
        "control_fd": 3, "dial_fd": 4, "seccomp_fd": 5, "cgroup_procs": (),
        "host_env": {"PATH": "/HOME/.cargo/bin:/usr/bin:/opt/absent:/HOME/.local/bin:/usr/bin",
                     "SSL_CERT_FILE": "/CA/corp.pem", "OPENAI_API_KEY": "sk-never"},
        "path_dirs": frozenset({"/HOME/.cargo/bin", "/usr/bin", "/HOME/.local/bin"}),
        "landlock_min_abi": 1, "capture": None,
        "helper_code": "<HELPER>",
    }
    facts.update(overrides)
    return LinuxFacts(**facts)  # type: ignore[arg-type]


def _plan_golden(name: str, data: dict) -> None:
    path = GOLDEN / name
    if os.environ.get("FIRSTRUN_UPDATE_GOLDEN"):
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert data == json.loads(path.read_text())


def test_the_plan_of_an_unprivileged_harness_runs_bubblewrap_itself() -> None:
    from firstrun.sandbox.base import ProxyEndpoint
    from firstrun.sandbox.linux.spec import prepare

    plan = prepare(PROFILE, ProxyEndpoint(socket_path="/run/p.sock", nonce="n"), _facts())
    assert plan.argv[0] == "/usr/bin/bwrap" and plan.pass_fds == (3, 4, 5)
    assert not plan.launch.needed
    # Only the PATH entries that exist and are visible inside; no key reaches the environment.
    assert plan.env["PATH"] == "/HOME/.cargo/bin:/usr/bin"
    assert "OPENAI_API_KEY" not in plan.env and plan.env["http_proxy"] == "http://127.0.0.1:3128"
    _plan_golden("linux_plan_unprivileged.json", plan.to_data())


def test_a_capturing_plan_asks_bubblewrap_for_its_childs_pid_before_the_setup() -> None:
    from firstrun.sandbox.base import ProxyEndpoint
    from firstrun.sandbox.linux.spec import prepare

    endpoint = ProxyEndpoint(socket_path="/run/p.sock", nonce="n", transparent_path="/run/t.sock",
                             dns_path="/run/d.sock")
    plan = prepare(PROFILE, endpoint, _facts(capture={"dns_port": 1}, info_fd=7))
    argv = list(plan.argv)
    # An option of bubblewrap's own, before the command it runs.
    assert argv[argv.index("--info-fd") + 1] == "7" and argv.index("--info-fd") < argv.index("--")
    assert plan.pass_fds == (3, 4, 5, 7)
    assert "--info-fd" not in prepare(PROFILE, endpoint, _facts()).argv


def test_the_plan_of_a_root_harness_launches_with_its_uid_cgroup_and_stage() -> None:
    from firstrun.sandbox.linux.spec import prepare

    plan = prepare(PROFILE, None, _facts(uid=1500000001, stage_dir="/run/firstrun/firstrun-stage-x",
                                         dial_fd=None, cgroup_procs=("/sys/fs/cgroup/s/cgroup.procs",)))
    assert plan.argv[0] == "/usr/bin/bwrap" and plan.pass_fds == (3, 5)
    assert plan.launch.needed
    assert (plan.launch.uid, plan.launch.cgroup_procs) == (
        1500000001, ("/sys/fs/cgroup/s/cgroup.procs",))
    assert plan.launch.stage == tuple((b.source, b.staged, b.directory) for b in plan.spec.stage)
    assert "http_proxy" not in plan.env
    _plan_golden("linux_plan_root.json", plan.to_data())
