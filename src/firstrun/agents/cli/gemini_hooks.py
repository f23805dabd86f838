"""Gemini CLI's hooks, answered by the harness: each command decided, each turn's tokens.

Guarantee: the CLI runs ``RELAY`` (node, which it needs anyway) for its
``BeforeTool``, ``AfterTool`` and ``BeforeModel`` hooks; the relay hands the hook's
input, plus the token counts of every model turn so far from the CLI's own
transcript, to ``HookServer`` through the egress proxy (a recorded route, as the
MCP server's) and prints the answer. A relay that cannot reach the harness
exits 2, which the CLI takes as a refusal: no command runs undecided.
"""

from __future__ import annotations

import json
import secrets
import shlex
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from firstrun.agents.cli.frame import LOOPBACK
from firstrun.agents.cli.harness_mcp import HARNESS_HOST

HOOK_PATH = "/hook"
HOOK_TIMEOUT_MS = 24 * 3600 * 1000

# Node, CommonJS (node -e). The transcript is the CLI's record of the session,
# one JSON object a line; a model turn is rewritten whole as it grows, so the
# last line of an id wins. The tokens there are the API's own usage counts.
RELAY = r"""
// Any failure is exit 2, which the CLI takes as a refusal; any other exit it
// would take as a warning and run the command undecided.
process.on('uncaughtException', (e) => {
  process.stderr.write(`firstrun: the hook relay failed: ${e.message}\n`);
  process.exit(2);
});
const fs = require('node:fs');
const http = require('node:http');
let raw = '';
process.stdin.on('data', (chunk) => { raw += chunk; });
process.stdin.on('end', () => {
  const hook = JSON.parse(raw);
  const turns = new Map();
  const take = (m) => {
    if (m && m.type === 'gemini' && m.tokens) turns.set(m.id, { model: m.model, ...m.tokens });
  };
  try {
    for (const line of fs.readFileSync(hook.transcript_path, 'utf8').split('\n')) {
      if (!line.trim()) continue;
      const m = JSON.parse(line);
      take(m);
      for (const each of (m.$set && m.$set.messages) || []) take(each);
    }
  } catch (e) { /* no transcript yet: no turn has ended */ }
  delete hook.llm_request;
  hook.firstrun_turns = [...turns.values()];
  const body = Buffer.from(JSON.stringify(hook));
  const target = new URL(process.env.FIRSTRUN_HOOK_URL);
  const proxy = new URL(process.env.http_proxy || process.env.HTTP_PROXY);
  const request = http.request({
    host: proxy.hostname, port: proxy.port, method: 'POST', path: target.href,
    headers: { host: target.host, 'content-type': 'application/json',
               'content-length': body.length },
  }, (response) => {
    let answer = '';
    response.on('data', (chunk) => { answer += chunk; });
    response.on('end', () => {
      if (response.statusCode !== 200) {
        process.stderr.write(`firstrun: the harness answered ${response.statusCode}\n`);
        process.exit(2);
      }
      process.stdout.write(answer);
    });
  });
  request.on('error', (e) => {
    process.stderr.write(`firstrun: the harness is out of reach: ${e.message}\n`);
    process.exit(2);
  });
  request.end(body);
});
"""


def hook_settings(url: str, node: str = "node") -> dict[str, Any]:
    """The ``hooks`` part of the CLI's settings, its relay (run by ``node``) told the harness's
    ``url``."""
    # A hook that times out is a warning to the CLI, which would then run the
    # command undecided: the limit is far past any answer, and the session's
    # wall budget ends a CLI still waiting.
    hook = {"type": "command", "name": "firstrun", "command": f'{shlex.quote(node)} -e "$FIRSTRUN_HOOK_RELAY"',
            "timeout": HOOK_TIMEOUT_MS,
            "env": {"FIRSTRUN_HOOK_RELAY": RELAY, "FIRSTRUN_HOOK_URL": url}}
    # Every shell command is decided before it runs; every tool's end reports
    # the tokens of the turn that asked for it (and a command's exit code);
    # every model call is preceded by the spend so far.
    return {"BeforeTool": [{"matcher": "run_shell_command", "hooks": [hook]}],
            "AfterTool": [{"matcher": ".*", "hooks": [hook]}],
            "BeforeModel": [{"hooks": [hook]}]}


Answer = Callable[[dict[str, Any]], dict[str, Any]]


class HookServer:
    """Serves the relay on ``host``; ``answer`` maps one hook's input to its output."""

    def __init__(self, host: str = LOOPBACK) -> None:
        self.host = host
        self._answer: Answer | None = None
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self.port: int = self._sock.getsockname()[1]
        # As the MCP server's: only the relay, told this path, is answered.
        self.path = f"{HOOK_PATH}/{secrets.token_urlsafe(18)}"
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{HARNESS_HOST}:{self.port}{self.path}"

    def bind(self, answer: Answer) -> None:
        self._answer = answer

    def __enter__(self) -> HookServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("content-length") or 0)
                try:
                    hook = json.loads(self.rfile.read(length))
                except ValueError:
                    hook = None
                # The proxy forwards the relay's absolute-form target as it came.
                path = urlsplit(self.path).path
                if path != server.path or not isinstance(hook, dict) or server._answer is None:
                    self.send_response(400)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                data = json.dumps(server._answer(hook)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._sock.listen(16)
        self._httpd = ThreadingHTTPServer((self.host, self.port), Handler,
                                          bind_and_activate=False)
        self._httpd.socket.close()
        self._httpd.socket = self._sock
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="firstrun-gemini-hooks", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Release the port of a server never entered."""
        self._sock.close()

    def __exit__(self, *exc: object) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()
        self._sock.close()
