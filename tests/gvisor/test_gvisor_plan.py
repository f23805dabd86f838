"""A gVisor session's launch is a pure function of the profile and the facts: golden-tested."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.process import SANDBOX_CA_BUNDLE, Limits
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.base import ProxyEndpoint
from firstrun.sandbox.capture import CapturePorts, GvisorTools, capture_rules
from firstrun.sandbox.gvisor.spec import EGRESS_DIR, GvisorFacts, prepare
from firstrun.sandbox.linux.spec import HostView

GOLDEN = Path(__file__).parent / "golden"

PROFILE = SandboxProfile(
    fs=FilesystemPolicy(
        workspace="/HOST/ws",
        readonly=("/usr", "/etc", "/bin", "/lib", "/HOME/.cargo", "/CA/corp.pem"),
        hidden=("/HOME/.cargo/credentials.toml",),
        real_homes=("/HOME", "/root"),
        protected=((".git/hooks", "dir"), (".bashrc", "file")),
    ),
    limits=Limits(memory_bytes=1 << 30),
)
HOST = HostView(
    symlinks=(("/bin", "usr/bin"), ("/lib", "usr/lib")),
    directories=frozenset({"/usr", "/etc", "/HOME/.cargo", "/PY"}),
    interpreter="/PY/bin/python3.11",
    prefix="/PY",
)

# One instruction, SECCOMP_RET_ALLOW: the plan carries whatever program it is given.
SECCOMP_BPF = bytes.fromhex("060000000000ff7f")


def _facts(**overrides: object) -> GvisorFacts:
    facts: dict[str, object] = {
        "runsc": "/usr/bin/runsc", "platform": "systrap", "state_root": "/run/s/state",
        "bundle": "/run/s/bundle", "container_id": "firstrun-0123456789ab", "uid": 1000,
        "host": HOST, "sockets": {}, "cpus": 2.0, "helper_source": "<HELPER>",
        "host_env": {"PATH": "/HOME/.cargo/bin:/usr/bin:/opt/absent", "OPENAI_API_KEY": "sk-never"},
        "path_dirs": frozenset({"/HOME/.cargo/bin", "/usr/bin"}),
        "seccomp_bpf": SECCOMP_BPF,
    }
    facts.update(overrides)
    return GvisorFacts(**facts)  # type: ignore[arg-type]


def _golden(name: str, data: dict) -> None:
    path = GOLDEN / name
    if os.environ.get("FIRSTRUN_UPDATE_GOLDEN"):
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert data == json.loads(path.read_text())


def _mounts(plan) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {m["destination"]: m for m in plan.config["mounts"]}


def test_without_a_proxy_nothing_leads_out_and_only_the_workspace_is_writable() -> None:
    plan = prepare(PROFILE, None, _facts())
    assert "--network=none" in plan.argv and "--host-uds=open" not in plan.argv
    # Through the gofer: directfs truncates a read-only bind's file on O_TRUNC.
    assert "--directfs=false" in plan.argv
    mounts = _mounts(plan)
    writable = {d for d, m in mounts.items() if m["type"] == "bind" and "rw" in m["options"]}
    assert writable == {"/workspace"}
    assert plan.config["root"]["readonly"] is True
    assert ("/bin", "link", "usr/bin") in plan.skeleton
    # Protected entries are read-only binds over the workspace's own.
    assert "ro" in mounts["/workspace/.bashrc"]["options"]
    assert mounts["/HOME/.cargo/credentials.toml"]["source"] == "/dev/null"
    assert "OPENAI_API_KEY" not in plan.env and plan.env["PATH"] == "/HOME/.cargo/bin:/usr/bin"
    # The helper is root inside with only what it needs to run commands as uid 1000.
    process = plan.config["process"]
    assert process["user"] == {"uid": 0, "gid": 0}
    assert process["capabilities"]["bounding"] == ["CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP",
                                                   "CAP_KILL"]
    config = json.loads(process["args"][-1])
    assert config["user"] == {"uid": 1000, "gid": 1000} and config["proxy_port"] is None
    # No pids cgroup: runsc's counts the sentry's threads. Guest processes are RLIMIT_NPROC's.
    assert set(plan.config["linux"]["resources"]) == {"memory", "cpu"}
    _golden("gvisor_plan_no_proxy.json", plan.to_data())


def test_with_a_proxy_its_socket_is_the_one_way_out() -> None:
    proxy = ProxyEndpoint(socket_path="/tmp/p/proxy.sock", nonce="n", trust_bundle="/tmp/p/ca.pem")
    plan = prepare(PROFILE, proxy, _facts(sockets={"c": "/tmp/p/proxy.sock"}, platform="ptrace"))
    assert "--host-uds=open" in plan.argv and "--platform=ptrace" in plan.argv
    mounts = _mounts(plan)
    assert mounts[f"{EGRESS_DIR}/c.sock"]["source"] == "/tmp/p/proxy.sock"
    assert mounts[SANDBOX_CA_BUNDLE]["source"] == "/tmp/p/ca.pem"
    config = json.loads(plan.config["process"]["args"][-1])
    assert config["endpoints"] == {"c": f"{EGRESS_DIR}/c.sock"} and config["proxy_port"] == 3128
    assert plan.env["https_proxy"] == "http://127.0.0.1:3128"
    _golden("gvisor_plan_proxy.json", plan.to_data())


def test_under_capture_the_helper_loads_the_rules_and_only_it_may() -> None:
    proxy = ProxyEndpoint(socket_path="/tmp/p/proxy.sock", nonce="n",
                          transparent_path="/tmp/p/transparent.sock", dns_path="/tmp/p/dns.sock")
    tools = GvisorTools(ip="/usr/sbin/ip", restore="/usr/sbin/iptables-legacy-restore",
                        restore6="/usr/sbin/ip6tables-legacy-restore")
    plan = prepare(PROFILE, proxy, _facts(sockets={"c": "/tmp/p/proxy.sock",
                                                   "t": "/tmp/p/transparent.sock",
                                                   "d": "/tmp/p/dns.sock"}, capture=tools))
    # Raw sockets are the xtables tools' way to the sentry's netstack, which
    # has no interface but lo: nothing a raw socket sends can leave.
    assert "--net-raw" in plan.argv and "--network=none" in plan.argv
    config = json.loads(plan.config["process"]["args"][-1])
    assert config["endpoints"] == {kind: f"{EGRESS_DIR}/{kind}.sock" for kind in "cdt"}
    v4, v6 = capture_rules(CapturePorts())
    steps = config["capture"]["load"]
    assert [s.get("stdin") for s in steps["v4"] + steps["v6"]] == [None, v4, None, v6]
    assert steps["v4"][0]["argv"][-5:] == ["default", "via", "127.0.0.1", "dev", "lo"]
    # The network capabilities are the helper's, for the rules; commands drop all.
    assert {"CAP_NET_ADMIN", "CAP_NET_RAW"} <= set(plan.config["process"]["capabilities"]["bounding"])
    _golden("gvisor_plan_capture.json", plan.to_data())
    # Control: the same proxy without the tools in the facts loads nothing.
    plain = prepare(PROFILE, proxy, _facts(sockets={"c": "/tmp/p/proxy.sock"}))
    assert "--net-raw" not in plain.argv
    assert "capture" not in json.loads(plain.config["process"]["args"][-1])


def test_the_helper_is_handed_the_seccomp_program_and_the_bundle_none_of_its_own() -> None:
    plan = prepare(PROFILE, None, _facts())
    config = json.loads(plan.config["process"]["args"][-1])
    assert base64.b64decode(config["seccomp_bpf"]) == SECCOMP_BPF
    # runsc would answer every refusal of linux.seccomp with EPERM, so the bundle has none.
    assert "seccomp" not in plan.config["linux"] and "--oci-seccomp" not in plan.argv
    # A profile without the layer: no program, and the helper loads none.
    omitted = prepare(PROFILE, None, _facts(seccomp_bpf=None))
    assert "seccomp_bpf" not in json.loads(omitted.config["process"]["args"][-1])
