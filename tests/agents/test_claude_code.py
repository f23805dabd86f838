"""``--agent claude-code``: the real Claude Code CLI (installed from npm) inside the linux
sandbox (and the docker and gvisor ones, for the whole quickstart and the held key), driven by a
scripted, streaming Messages API server, through the real runner, proxy (docker's
sidecar there) and harness MCP server. Judged by the trace, the server's requests and
the check."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from claude_code_support import API_HOST, agent, api_tls, bash, read_docs, served
from mcp.server import mcpserver

import support.anthropic_wire as wire
from firstrun.agents.cli.install import CLAUDE_CODE, CliInstall, ensure
from firstrun.examples import example_mirrors, find_example
from firstrun.policy.network import Channel
from firstrun.proxy.records import Scheme
from firstrun.results.model import Classification
from firstrun.run.events import CommandRan, DocsRead, Event, ModelTurn, PermissionDecided, Source
from firstrun.run.runner import RunConfig, run_task
from firstrun.tasks.load import load_task
from support.agent_clis import serving
from support.agents import DOCS as DOCS_GREETER
from support.agents import greeter_task
from support.vendor import Reply, Request, VendorServer

EXAMPLE = find_example("python-tabulate")
DOCS = "https://python-tabulate.docs.example"
PLANETS = '''from tabulate import tabulate

planets = [
    ["Mercury", 2440, 0],
    ["Venus", 6052, 0],
    ["Earth", 6371, 1],
    ["Mars", 3390, 2],
]

print(tabulate(planets, headers=["Planet", "Radius (km)", "Moons"], tablefmt="github"))
'''
WRITE = f"cat > planets.py <<'EOF'\n{PLANETS}EOF"


@pytest.fixture
def config(linux_config: RunConfig) -> RunConfig:
    """Claude Code runs as a process in the session, so its runs are judged on linux's."""
    return linux_config


@pytest.fixture(scope="session")
def claude_code(tmp_path_factory: pytest.TempPathFactory) -> CliInstall:
    return ensure(CLAUDE_CODE, tmp_path_factory.mktemp("agent-cache"))


# The harness's proxy (linux, gvisor's own kernel) and docker's sidecar route the CLI.
ROUTED = ["linux", "docker", "gvisor"]


@pytest.fixture
def example_config(tmp_path: Path, backend: str) -> RunConfig:
    return RunConfig(out_dir=tmp_path / "out", backend=backend,
                     docs_mirrors=example_mirrors([EXAMPLE]))


def run(task, the_agent, config: RunConfig):
    events: list[Event] = []
    record = run_task(task, attempt=1, agent=the_agent, config=config, on_event=events.append)
    return record, events


def of(events: list[Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


@pytest.mark.parametrize("backend", ROUTED)
def test_the_tabulate_quickstart_passes_through_claude_code(
        claude_code: CliInstall, example_config: RunConfig, backend: str) -> None:
    transcript = served(
        wire.message(wire.text("Reading the guide."), read_docs(f"{DOCS}/index.html")),
        wire.message(read_docs(f"{DOCS}/install.html")),
        wire.message(bash("python3 -m venv .venv && .venv/bin/pip install tabulate")),
        wire.message(read_docs(f"{DOCS}/first-table.html")),
        wire.message(bash(WRITE)),
        wire.message(bash(".venv/bin/python planets.py")),
        wire.message(wire.text("Done: planets.py prints the table.")),
    )
    with VendorServer(transcript, host=serving(backend)) as server:
        record, events = run(load_task(EXAMPLE.task_path), agent(claude_code, server.url),
                             example_config)
    assert (record.classification, record.reason) == (Classification.PASSED, "passed"), \
        [e for e in events if e.kind in ("failure", "agent_finished")]
    assert record.agent == "claude-code" and record.backend == backend
    # The docs came through the harness's read_docs, recorded as route reads.
    reads = of(events, DocsRead)
    assert [r.page["url_requested"] for r in reads] == [f"{DOCS}/index.html", f"{DOCS}/install.html",
                                               f"{DOCS}/first-table.html"]
    assert all(r.route for r in reads)
    # Every command the CLI ran is recorded with its exit code, each asked for first.
    commands = [e for e in of(events, CommandRan) if e.source is Source.AGENT]
    assert [c.exit_code for c in commands] == [0, 0, 0]
    assert "| Earth    |          6371 |       1 |" in commands[-1].stdout
    asked = [p.argument for p in of(events, PermissionDecided) if p.tool == "bash"]
    assert asked == [c.command for c in commands]
    turns = of(events, ModelTurn)
    assert len(turns) == 7 and turns[-1].text == "Done: planets.py prints the table."
    usage = [e for e in events if e.kind == "agent_finished"][0].usage
    assert usage["agent_cli"] == {"name": "claude-code", "package": "@anthropic-ai/claude-code",
                                  "version": "2.1.332"}
    # The CLI spoke the streaming wire format with a placeholder, never a key.
    first = server.seen()[0]
    assert first.body["stream"] is True and first.body["model"] == wire.MODEL
    assert wire.api_key(first).startswith("firstrun-anthropic-")


GREET = "printf 'hello, reader\\n' > greeting.txt"


def test_a_run_the_check_fails_is_a_docs_gap_and_the_key_is_nowhere(
        claude_code: CliInstall, config: RunConfig, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The harness holds a key; the run must show no trace of it anywhere.
    canary = "sk-ant-canary-" + "7f3e9b2c1d"
    for name in ("ANTHROPIC_API_KEY", "FIRSTRUN_ANTHROPIC_API_KEY"):
        monkeypatch.setenv(name, canary)
    # The pattern is not the literal, so the searching processes' own command lines
    # do not match it.
    look = ("env; if grep -rqs 'sk-ant-canar[y]' /proc/[0-9]*/environ /proc/[0-9]*/cmdline "
            "/workspace /home /tmp; then echo key-found; else echo key-absent; fi; "
            "printf 'hello\\n' > greeting.txt")
    transcript = served(
        wire.message(read_docs(DOCS_GREETER)),
        wire.message(bash(look)),
        wire.message(wire.text("Done.")),
    )
    kept = replace(config, keep_sandbox=True)
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), agent(claude_code, server.url), kept)
    assert (record.classification, record.reason) == (Classification.DOCS_GAP, "check_failed")
    (ran,) = [e for e in of(events, CommandRan) if e.source is Source.AGENT]
    assert ran.command == look and "ANTHROPIC_API_KEY=firstrun-anthropic-" in ran.stdout
    # By evidence: not in the sandbox's environment or files (the command above looked),
    # not in what the CLI sent, not in any file the run left.
    assert "key-absent" in ran.stdout and canary not in ran.stdout + ran.stderr
    for request in server.seen():
        assert canary not in repr(request.headers) + repr(request.body)
    for path in kept.out_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert canary.encode() not in path.read_bytes(), path


def test_the_turn_budget_stops_the_cli_mid_run(claude_code: CliInstall, config: RunConfig,
                                               tmp_path: Path) -> None:
    transcript = served(
        wire.message(read_docs(DOCS_GREETER)),
        wire.message(bash("touch started")),
        wire.message(bash(GREET)),
        wire.message(wire.text("Done.")),
    )
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path, budgets={"max_turns": 2}),
                             agent(claude_code, server.url), config)
    assert record.classification is Classification.BUDGET_EXHAUSTED
    (finished,) = [e for e in events if e.kind == "agent_finished"]
    assert finished.detail.startswith("max_turns")
    # The greeting was never written: the CLI stopped before its third turn.
    assert GREET not in [e.command for e in of(events, CommandRan)]
    assert len([r for r in server.seen() if (r.body or {}).get("tools")]) == 2


def test_the_cli_leaves_no_request_open_behind_it(claude_code: CliInstall, config: RunConfig,
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Every JSON-RPC method the CLI posts to the harness's MCP server, as served.
    methods: list[str] = []
    make_app = mcpserver.MCPServer.streamable_http_app

    def spied(self: mcpserver.MCPServer, **options: Any) -> Any:
        app = make_app(self, **options)

        async def asgi(scope: Any, receive: Any, send: Any) -> None:
            body = bytearray()

            async def seen() -> Any:
                message = await receive()
                body.extend(message.get("body", b""))
                if body and message["type"] == "http.request" and not message.get("more_body"):
                    methods.append(json.loads(body).get("method", ""))
                return message
            await app(scope, seen, send)
        return asgi

    monkeypatch.setattr(mcpserver.MCPServer, "streamable_http_app", spied)
    transcript = served(
        wire.message(read_docs(DOCS_GREETER)),
        wire.message(bash(GREET)),
        wire.message(wire.text("Done.")),
    )
    with VendorServer(transcript) as server:
        record, _ = run(greeter_task(tmp_path), agent(claude_code, server.url), config)
    assert record.classification is Classification.PASSED
    assert methods.count("tools/call") == 3
    # A listen stream (offered, the CLI opens one) outlived the CLI by some 45 s:
    # the proxy held it until a keepalive write to the gone client failed, and
    # the run waited for the MCP server's exit, which waited for the stream.
    assert "subscriptions/listen" not in methods


def test_a_vendor_error_is_an_infra_error(claude_code: CliInstall, config: RunConfig,
                                         tmp_path: Path) -> None:
    with VendorServer(served(wire.unauthorized())) as server:
        record, events = run(greeter_task(tmp_path), agent(claude_code, server.url), config)
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR, "agent_infra_error")
    (finished,) = [e for e in events if e.kind == "agent_finished"]
    assert "status 401" in finished.detail
    assert of(events, CommandRan) == []


def test_a_permission_rule_refuses_a_command_the_cli_asked_for(
        claude_code: CliInstall, config: RunConfig, tmp_path: Path) -> None:
    path = tmp_path / "greeter.yaml"
    path.write_text(
        "name: greeter\ngoal: Create greeting.txt holding the greeting.\n"
        f"docs:\n  entrypoint: {DOCS_GREETER}\n"
        "success:\n  script: grep -q 'hello, reader' greeting.txt\n"
        "firstrun:\n  permissions:\n    deny:\n      - bash(touch*)\n", encoding="utf-8")
    transcript = served(
        wire.message(bash("touch refused-ran")),
        wire.message(bash(GREET)),
        wire.message(wire.text("Done.")),
    )
    kept = replace(config, keep_sandbox=True)
    with VendorServer(transcript) as server:
        record, events = run(load_task(path), agent(claude_code, server.url), kept)
    assert record.classification is Classification.PASSED
    decisions = [(e.argument, e.verdict, e.rule) for e in of(events, PermissionDecided)]
    assert decisions == [("touch refused-ran", "deny", "bash(touch*)"), (GREET, "allow", None)]
    assert [e.command for e in of(events, CommandRan) if e.source is Source.AGENT] == [GREET]
    workspace = kept.out_dir / "runs" / "greeter" / "1" / "workspace"
    assert not (workspace / "refused-ran").exists()
    # The model was told, as the call's result, which rule refused it.
    (refused,) = wire.tool_results(
        next(r for r in server.seen() if wire.model_turns(r) == 1 and r.body.get("tools")))
    assert "bash(touch*)" in str(refused["content"])


def in_memory(marker: bytes, needles: tuple[bytes, ...]) -> tuple[int, dict[bytes, int]]:
    """How many processes hold ``marker`` in their environment, and how many of their
    readable memory regions hold each needle, read from the host through /proc."""
    found = dict.fromkeys(needles, 0)
    scanned = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker not in f.read():
                    continue
            with open(f"/proc/{pid}/maps", encoding="ascii") as f:
                regions = [line.split() for line in f]
            mem = open(f"/proc/{pid}/mem", "rb", buffering=0)  # noqa: SIM115 (closed below)
        except OSError:
            continue
        scanned += 1
        with mem:
            for fields in regions:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if not fields[1].startswith("r") or fields[-1] in ("[vvar]", "[vsyscall]"):
                    continue
                try:
                    mem.seek(start)
                    data = mem.read(end - start)
                except (OSError, OverflowError, ValueError):
                    continue
                for needle in needles:
                    found[needle] += needle in data
    return scanned, found



@pytest.mark.parametrize("backend", ROUTED)
def test_the_proxy_puts_the_key_into_api_requests_and_nowhere_else(
        claude_code: CliInstall, config: RunConfig, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    canary = "sk-ant-canary-" + "0b5d77e1a4"
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("FIRSTRUN_ANTHROPIC_API_KEY", canary)
    context, cafile = api_tls(tmp_path)
    # The proxy verifies the scripted API's certificate like any server's.
    trust = tmp_path / "trust.pem"
    system = os.environ.get("SSL_CERT_FILE")
    trust.write_bytes((Path(system).read_bytes() if system else b"") + cafile.read_bytes())
    monkeypatch.setenv("SSL_CERT_FILE", str(trust))
    # Where the harness's services listen for this backend's proxy: the sandbox
    # itself must not reach that address except through the proxy.
    canary_listener = socket.socket()
    canary_listener.bind((serving(backend), 0))
    canary_listener.listen(1)
    canary_listener.setblocking(False)
    host, port = canary_listener.getsockname()
    look = ("env | grep ^ANTHROPIC_API_KEY=; if grep -rqs 'sk-ant-canar[y]' /proc/[0-9]*/environ "
            "/proc/[0-9]*/cmdline /workspace /home /tmp; then echo key-found; "
            "else echo key-absent; fi; python3 -c 'import socket; socket.create_connection("
            f"(\"{host}\", {port}), 5).recv(1)' 2>/dev/null; {GREET}")
    conversation = served(
        wire.message(bash(look)),
        wire.message(wire.text("Done.")),
    )
    scans: list[tuple[int, dict[bytes, int]]] = []

    def transcript(request: Request) -> Reply:
        # After its command ran, while the CLI waits on this answer: its memory, and
        # its children's, read from the host. The placeholder must be there (the scan
        # sees what the CLI holds), the key nowhere.
        if wire.model_turns(request) == 1 and (request.body or {}).get("tools") and not scans:
            scans.append(in_memory(b"ANTHROPIC_API_KEY=firstrun-",
                                   (canary.encode(), b"firstrun-anthropic_api_key-")))
        return conversation(request)

    kept = replace(config, keep_sandbox=True, backend=backend)
    with canary_listener, VendorServer(transcript, tls=context, host=serving(backend)) as server:
        record, events = run(greeter_task(tmp_path), agent(claude_code, server.url), kept)
        with pytest.raises(BlockingIOError):
            canary_listener.accept()
    assert record.classification is Classification.PASSED, \
        [e for e in events if e.kind in ("failure", "agent_finished")]
    # Every request reached the API with the real key: the proxy swapped it in.
    api = [r for r in server.seen()]
    assert api and all(wire.api_key(r) == canary for r in api)
    egress = [e.record for e in events if e.kind == "egress"]
    swapped = [r for r in egress if r.host == API_HOST]
    assert swapped and all(r.credentials == ("ANTHROPIC_API_KEY",) for r in swapped
                           if r.credentials)
    # Without --inspect-tls the proxy decrypted the API host alone, and its records
    # are the agent channel's, counted apart from the shell's egress.
    assert {r.host for r in egress if r.scheme is Scheme.HTTPS} == {API_HOST}
    assert all(r.channel is Channel.AGENT for r in swapped)
    assert record.extra["agent_egress"] == {"records": len(swapped), "refused": 0}
    # Inside, only the placeholder: in the CLI's environment, in no process or file.
    (ran,) = [e for e in of(events, CommandRan) if e.source is Source.AGENT]
    assert ran.stdout.startswith("ANTHROPIC_API_KEY=firstrun-anthropic_api_key-")
    assert "key-absent" in ran.stdout and canary not in ran.stdout + ran.stderr
    # By evidence: the listener took no connection, and whatever the proxy saw of the
    # attempt it refused (docker's capture hands it to the sidecar; elsewhere the address
    # is loopback, the sandbox's own, where nothing listens).
    direct = [e.record for e in events if e.kind == "egress" and e.record.port == port
              and e.record.host in (host, None)]
    assert all(r.decision.value == "deny" for r in direct), direct
    assert direct or host == "127.0.0.1"
    for path in kept.out_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert canary.encode() not in path.read_bytes(), path
    # gVisor's processes live behind its own kernel, their memory the sentry's, and
    # are not the host's to list; elsewhere each is a host process.
    if backend != "gvisor":
        ((scanned, found),) = scans
        assert scanned >= 1 and found[b"firstrun-anthropic_api_key-"] >= 1, (scanned, found)
        assert found[canary.encode()] == 0, found


# The harness's proxy alone holds the docs reader that serves a fetch as a page read.
@pytest.mark.parametrize("backend", ["linux", "gvisor"])
def test_the_clis_own_web_fetch_of_a_docs_page_is_a_page_read(
        claude_code: CliInstall, example_config: RunConfig) -> None:
    # WebFetch fetches from the CLI's own process, through the proxy, which answers
    # a docs host from the run's docs reader: the same conversion and cache as
    # read_docs, and a docs_read in the trace.
    page = f"{DOCS}/index.html"
    transcript = served(
        wire.message(wire.tool_use("WebFetch", url=page, prompt="What does this page say?")),
        wire.message(wire.text("Read the overview.")),
    )
    with VendorServer(transcript) as server:
        record, events = run(load_task(EXAMPLE.task_path), agent(claude_code, server.url),
                             example_config)
    assert (record.classification, record.reason) == (Classification.DOCS_GAP, "check_failed"), \
        [e for e in events if e.kind in ("failure", "agent_finished")]
    (read,) = of(events, DocsRead)
    assert read.route and read.page["url_requested"] == page and read.page["error"] is None
    assert [p.url_requested for p in record.pages] == [page]
    # The CLI got the converted page: its small model was asked to read it.
    side = [r for r in server.seen() if not (r.body or {}).get("tools")]
    assert any("a neatly aligned plain-text table" in repr(r.body) for r in side)
    # Served, not fetched: the proxy dialled no docs host, and its records say so.
    egress = [e.record for e in events if e.kind == "egress"]
    assert {r.reason.value for r in egress if r.host == "python-tabulate.docs.example"
            and r.channel is Channel.SHELL} == {"allowed_as_page_read"}
