"""Golden test: every docker command that creates a session's resources, pinned."""

from __future__ import annotations

from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.process import Limits
from firstrun.policy.profile import SandboxProfile
from firstrun.proxy.server import ProxyLimits
from firstrun.sandbox.docker.resources import firewall_rules
from firstrun.sandbox.docker.topology import (
    SIDECAR_CONNECTIONS,
    DockerHost,
    build_topology,
    helper_config,
)

PROFILE = SandboxProfile(
    fs=FilesystemPolicy(workspace="/HOST/ws", real_homes=("/root",)),
    limits=Limits(pids=256, memory_bytes=1 << 30, open_files=2048),
)
HOST = DockerHost(
    workspace="/HOST/ws", uid=1000, gid=1000, image="firstrun/python:3.11",
    sidecar_image="firstrun/python:3.11",
    lib_binds=(("/SRC/firstrun", "firstrun"), ("/SITE/h11", "h11")),
    harness="4242:777", seccomp_profile="/PRIVATE/seccomp.json", helper_source="HELPER SOURCE",
)
LABELS = ("--label", "org.firstrun.managed=1", "--label", "org.firstrun.session=s1",
          "--label", "org.firstrun.harness=4242:777")


def test_topology_is_golden() -> None:
    topo = build_topology(PROFILE, session="s1", host=HOST)
    assert (topo.internal_network, topo.egress_network, topo.sidecar, topo.run) == (
        "firstrun-s1-internal", "firstrun-s1-egress", "firstrun-s1-proxy", "firstrun-s1-run")
    assert topo.create == (
        ("network", "create", "--driver", "bridge", "--internal", *LABELS,
         "firstrun-s1-internal"),
        ("network", "create", "--driver", "bridge", *LABELS, "firstrun-s1-egress"),
        ("create", "--name", "firstrun-s1-proxy", *LABELS,
         "--network", "firstrun-s1-egress",
         "--interactive",
         "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
         "--security-opt", "seccomp=/PRIVATE/seccomp.json", "--read-only",
         "--tmpfs", "/tmp:rw,noexec,nosuid,nodev,size=16777216",
         "--user", "65534:65534", "--pids-limit", "576",
         "--memory", "268435456", "--memory-swap", "268435456", "--cpus", "0.5",
         "--ulimit", "core=0", "--ipc", "private", "--log-driver", "none",
         "--env", "PYTHONPATH=/opt/firstrun/lib",
         "--mount", "type=bind,source=/SRC/firstrun,target=/opt/firstrun/lib/firstrun,readonly",
         "--mount", "type=bind,source=/SITE/h11,target=/opt/firstrun/lib/h11,readonly",
         "firstrun/python:3.11", "python3", "-s", "-m", "firstrun.proxy", "0.0.0.0", "3128"),
        ("network", "connect", "firstrun-s1-internal", "firstrun-s1-proxy"),
        ("create", "--name", "firstrun-s1-run", *LABELS,
         "--network", "firstrun-s1-internal", "--interactive",
         "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
         "--security-opt", "seccomp=/PRIVATE/seccomp.json", "--read-only",
         "--tmpfs", "/tmp:rw,exec,nosuid,nodev,size=1073741824",
         "--user", "0:0", "--pids-limit", "256",
         "--memory", "1073741824", "--memory-swap", "1073741824", "--cpus", "1",
         "--ulimit", "core=0", "--ipc", "private", "--log-driver", "none",
         "--cap-add", "SETUID", "--cap-add", "SETGID", "--cap-add", "SETPCAP",
         "--cap-add", "KILL",
         "--tmpfs", "/home/sandbox:rw,exec,nosuid,nodev,size=1073741824,uid=1000,gid=1000,mode=700",
         "--tmpfs", "/run/firstrun-witness:rw,nosuid,nodev,noexec,size=4096,mode=1777",
         "--ulimit", "nofile=2048:2048",
         "--mount", "type=bind,source=/HOST/ws,target=/workspace",
         "--workdir", "/workspace", "--hostname", "sandbox",
         "--entrypoint", "/usr/bin/python3", "firstrun/python:3.11", "-I", "-S", "-c",
         "HELPER SOURCE",
         '{"channel_fds":[0,1],"dial_fd":null,"proxy_port":null,'
         '"limits":{"pids":null,"memory_bytes":1073741824,"open_files":2048},'
         '"landlock":{"apply":true,"required":false,"min_abi":1,'
         '"dirs":["/workspace","/tmp","/home/sandbox","/dev/shm","/dev/pts"],'
         '"files":["/dev/null","/dev/zero","/dev/full","/dev/tty","/dev/random","/dev/urandom",'
         '"/dev/ptmx"]},"user":{"uid":1000,"gid":1000}}'),
    )
    assert topo.resources() == (
        ("container", "firstrun-s1-run"), ("container", "firstrun-s1-proxy"),
        ("network", "firstrun-s1-internal"), ("network", "firstrun-s1-egress"),
    )


def test_ca_bundles_are_bound_read_only_at_their_own_paths() -> None:
    from dataclasses import replace

    topo = build_topology(PROFILE, session="s1", host=replace(HOST, ca_files=("/etc/ca.pem",)))
    run = topo.create[4]
    at = run.index("type=bind,source=/etc/ca.pem,target=/etc/ca.pem,readonly")
    assert run[at - 1] == "--mount"


def test_run_container_is_on_the_internal_network_only() -> None:
    topo = build_topology(PROFILE, session="s1", host=HOST)
    run = topo.create[4]
    assert [run[i + 1] for i, a in enumerate(run) if a == "--network"] == [topo.internal_network]
    assert not any(a.startswith("--network=") or a in ("--net", "--privileged") for a in run)
    # The helper's four, which every command drops (bounding set included) before it execs.
    assert [run[i + 1] for i, a in enumerate(run) if a == "--cap-add"] == [
        "SETUID", "SETGID", "SETPCAP", "KILL"]
    assert helper_config(PROFILE, uid=1000, gid=1000)["user"] == {"uid": 1000, "gid": 1000}
    assert not any("seccomp=unconfined" in a or "apparmor=unconfined" in a for a in run)
    # Only the workspace is bound writable; the sidecar binds only read-only.
    assert [a for a in run if a.startswith("type=bind")] == [
        "type=bind,source=/HOST/ws,target=/workspace"]
    assert all(a.endswith(",readonly") for a in topo.create[2] if a.startswith("type=bind"))


def test_namespace_firewall_rules_are_golden() -> None:
    v4, v6 = firewall_rules("172.18.0.2")
    assert v4.splitlines() == [
        "*filter",
        ":INPUT ACCEPT [0:0]",
        ":FORWARD DROP [0:0]",
        ":OUTPUT DROP [0:0]",
        "-A OUTPUT -d 127.0.0.11/32 -j DROP",
        "-A OUTPUT -o lo -j ACCEPT",
        "-A OUTPUT -d 172.18.0.2/32 -p tcp -m tcp --dport 3128 -j ACCEPT",
        "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
        "COMMIT",
    ]
    assert v6.splitlines() == [
        "*filter", ":INPUT ACCEPT [0:0]", ":FORWARD DROP [0:0]", ":OUTPUT DROP [0:0]",
        "-A OUTPUT -o lo -j ACCEPT", "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
        "COMMIT",
    ]


def test_sidecar_hosts_reach_only_the_sidecars_etc_hosts() -> None:
    from dataclasses import replace

    topo = build_topology(PROFILE, session="s1", host=replace(
        HOST, sidecar_hosts=(("registry.example.test", "172.17.0.1"),)))
    sidecar, run = topo.create[2], topo.create[4]
    at = sidecar.index("--add-host")
    assert sidecar[at:at + 2] == ("--add-host", "registry.example.test:172.17.0.1")
    assert sidecar.index("--add-host") < sidecar.index("firstrun/python:3.11")
    assert "--add-host" not in run


def test_protected_entries_are_read_only_binds_on_top_of_the_workspace() -> None:
    from dataclasses import replace

    fs = replace(PROFILE.fs, protected=((".git", "dir"), (".bashrc", "file")))
    run = build_topology(replace(PROFILE, fs=fs), session="s1", host=HOST).create[4]
    at = run.index("type=bind,source=/HOST/ws,target=/workspace")
    assert list(run[at + 1: at + 5]) == [
        "--mount", "type=bind,source=/HOST/ws/.git,target=/workspace/.git,readonly",
        "--mount", "type=bind,source=/HOST/ws/.bashrc,target=/workspace/.bashrc,readonly"]


def test_lent_directories_are_read_only_binds_and_their_closed_home_a_bare_tmpfs() -> None:
    from dataclasses import replace

    fs = replace(PROFILE.fs, real_homes=("/root", "/home/ann"),
                 lent=("/root/.cache/firstrun/agents/cli", "/opt/tools"))
    run = build_topology(replace(PROFILE, fs=fs), session="s1", host=HOST).create[4]
    at = run.index("type=bind,source=/HOST/ws,target=/workspace")
    # Root's home (0700 in the image) is crossed, never listed; /home/ann holds nothing lent.
    assert list(run[at + 1: at + 7]) == [
        "--tmpfs", "/root:rw,nosuid,nodev,noexec,size=4096,mode=711",
        "--mount", "type=bind,source=/root/.cache/firstrun/agents/cli,"
                   "target=/root/.cache/firstrun/agents/cli,readonly",
        "--mount", "type=bind,source=/opt/tools,target=/opt/tools,readonly"]
    assert run[at + 7] == "--workdir"


def test_the_sidecars_pids_limit_admits_every_tunnel_the_proxy_holds() -> None:
    # Two pump threads a tunnel, on each of the two listeners that carry
    # tunnels, each holding the proxy's connection bound: below this, the
    # pids limit refuses a tunnel's thread and the tunnel is lost.
    assert SIDECAR_CONNECTIONS == ProxyLimits().max_connections
    topo = build_topology(PROFILE, session="s1", host=HOST)
    sidecar = topo.create[2]
    pids = int(sidecar[sidecar.index("--pids-limit") + 1])
    assert pids >= 2 * 2 * ProxyLimits().max_connections + 2
