#!/usr/bin/env python3
"""New CONNECT tunnels in rounds of 150 at once: docker's sidecar against linux's harness proxy.

Guarantee: both arms run in the same process, their sessions open side by
side, against one HTTPS server (a separate process, so it shares no GIL
with the linux arm's proxy) on the host's docker bridge address, which an
override lets the fixture name reach; the same client code runs inside each
sandbox. A round is ``PER_ROUND`` tunnels opened at once, each a CONNECT, a
TLS handshake trusting only the fixture's CA and one GET naming the tunnel;
the arms alternate round by round, ``ROUNDS`` each (3,000 tunnels an arm),
so load from anything else falls on both alike. Figures: the median round's
time on each arm (docker's against linux's, with a bar), and the tunnels
each arm lost (the server never answered its GET, or the answer never
reached the client), whose bound is 0.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from loopback import HOST_NAME, throwaway_ca

ROUNDS = 20
PER_ROUND = 150
# Docker's sidecar is a proxy process of its own (half a CPU), where linux's
# proxy shares the harness's interpreter: docker measured 0.74x linux here.
BAR = 1.5
SERVE_TIMEOUT_S = 20.0

# The upstream, in its own process: serves until stdin closes, then prints
# the paths it answered (one GET each) as JSON.
SERVER = r"""
import asyncio, json, ssl, sys
address, certfile, keyfile = sys.argv[1:4]
seen = []

async def answer(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b" ", 2)[1].decode("ascii", "replace"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()

async def main():
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile, keyfile)
    server = await asyncio.start_server(answer, address, 0, ssl=context, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    server.close()
    print(json.dumps(seen), flush=True)

asyncio.run(main())
"""

# Run inside each sandbox, one round per exec (shared with tests/docker/test_tunnel_rounds.py).
CLIENT = (Path(__file__).parent / "tunnel_client.py").read_text(encoding="utf-8")


def main(rounds: int = ROUNDS, per_round: int = PER_ROUND) -> dict[str, dict[str, object]]:
    from firstrun.audit.battery import docker_bridge_address
    from firstrun.enclosure import ProxySetup, open_enclosure
    from firstrun.policy.network import NetworkPolicy
    from firstrun.policy.profile import SandboxProfile
    from firstrun.sandbox.docker.backend import DockerBackend
    from firstrun.sandbox.hostfs import host_filesystem_policy
    from firstrun.sandbox.select import entry

    address = docker_bridge_address()
    private = Path(tempfile.mkdtemp(prefix="firstrun-bench-tunnels-"))
    workspaces = {arm: tempfile.mkdtemp(prefix=f"firstrun-bench-tunnels-{arm}-")
                  for arm in ("docker", "linux")}
    # The certificate names loopback's HOST_NAME; the sandboxes dial it by that name.
    cert = throwaway_ca(private)
    server = subprocess.Popen([sys.executable, "-I", "-c", SERVER, address, str(cert.certfile),
                               str(cert.keyfile)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    rounds_s: dict[str, list[float]] = {"docker": [], "linux": []}
    # Each arm's tunnels by number, and those its client saw fail.
    numbers: dict[str, set[int]] = {"docker": set(), "linux": set()}
    failed: dict[str, set[int]] = {"docker": set(), "linux": set()}
    try:
        assert server.stdout is not None and server.stdin is not None
        port = int(server.stdout.readline())
        policy = NetworkPolicy.build(overrides=[(f"{HOST_NAME}:{port}", [f"{address}/32"])])

        async def resolver(host: str, _port: int) -> list:
            return [ipaddress.ip_address(address)] if host == HOST_NAME else []

        with ExitStack() as stack:
            sessions, cafiles = {}, {}
            for arm, workspace in workspaces.items():
                shutil.copy(cert.cafile, os.path.join(workspace, "ca.pem"))
                profile = SandboxProfile(
                    fs=host_filesystem_policy(workspace, os.environ, protect=False), net=policy)
                cafiles[arm] = f"{profile.fs.sandbox_workspace}/ca.pem"
                build = (lambda o: DockerBackend(on_record=o.on_record,
                                                 sidecar_hosts=((HOST_NAME, address),))) \
                    if arm == "docker" else None
                enclosure = stack.enter_context(open_enclosure(
                    entry(arm), profile, ProxySetup(env=os.environ, resolver=resolver), build=build))
                sessions[arm] = enclosure.start()
            first = 0
            for index in range(rounds):
                for arm in (("docker", "linux") if index % 2 == 0 else ("linux", "docker")):
                    result = sessions[arm].exec(
                        ["python3", "-c", CLIENT, HOST_NAME, str(port), str(first),
                         str(per_round), cafiles[arm], "1"], timeout=600)
                    if result.exit_code != 0:
                        raise RuntimeError(f"{arm}: {result.stderr.text()[-300:]}")
                    out = json.loads(result.stdout.text())
                    rounds_s[arm].append(out["s"])
                    failed[arm].update(out["failed"])
                    numbers[arm].update(range(first, first + per_round))
                    first += per_round
        server.stdin.close()
        seen = json.loads(server.stdout.readline())
        server.wait(timeout=SERVE_TIMEOUT_S)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        shutil.rmtree(private, ignore_errors=True)
        for workspace in workspaces.values():
            shutil.rmtree(workspace, ignore_errors=True)
    if len(seen) != len(set(seen)):
        raise RuntimeError(f"the server answered {len(seen) - len(set(seen))} GETs twice")
    answered = {int(path.rsplit("/", 1)[1]) for path in seen}
    # Lost: the server never answered its GET, or its answer never reached the client.
    lost = {arm: len((numbers[arm] - answered) | failed[arm]) for arm in numbers}
    total = rounds * per_round
    return {
        "linux_round_of_150_tunnels": {"value": statistics.median(rounds_s["linux"]) * 1e3,
                                       "unit": "ms", "better": "lower"},
        "docker_round_of_150_tunnels": {"value": statistics.median(rounds_s["docker"]) * 1e3,
                                        "unit": "ms", "better": "lower",
                                        "baseline": "linux_round_of_150_tunnels", "bar": BAR},
        "linux_tunnels_lost": {"value": lost["linux"], "unit": f"of {total}",
                               "better": "lower", "limit": 0},
        "docker_tunnels_lost": {"value": lost["docker"], "unit": f"of {total}",
                                "better": "lower", "limit": 0},
    }


if __name__ == "__main__":
    for name, figure in main().items():
        print(f"{name}: {figure['value']:.3f} {figure['unit']}")
