"""The host-side witnesses the audit judges by: canaries, a fixture registry, marker processes.

Guarantee: every witness lives on this host's loopback or in files and
processes the audit itself created, and records what reached it, so a cell
of the matrix is judged by what the host saw, not by what the session said.
``Witnesses`` is per configuration (fresh nonce, listeners, markers and
canary files); ``close`` removes every file it planted and ends every
process it started, by pid. The ``Registry`` serves one package (a wheel
built here) under PEP 503 and records every request, upload bodies included;
it listens on 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PACKAGE = "firstrun-audit-fixture"
MODULE = "firstrun_audit_fixture"
REGISTRY_HOST = "registry.firstrun-audit.test"
_WHEEL = f"{MODULE}-1.0-py3-none-any.whl"


def build_wheel(marker: str) -> bytes:
    """A minimal, valid wheel whose module holds ``marker`` (so an install is recognisable)."""
    files = {
        f"{MODULE}/__init__.py": f"MARKER = {marker!r}\n".encode(),
        f"{MODULE}-1.0.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n".encode(),
        f"{MODULE}-1.0.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: firstrun-audit\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{MODULE}-1.0.dist-info/RECORD,,")
    files[f"{MODULE}-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return out.getvalue()


@dataclass(frozen=True, kw_only=True)
class Seen:
    """One request the registry answered."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


class Registry:
    """A package registry on 127.0.0.1 that accepts uploads, as a real one does."""

    def __init__(self) -> None:
        self.marker = secrets.token_hex(8)
        self._wheel = build_wheel(self.marker)
        self._lock = threading.Lock()
        self._seen: list[Seen] = []
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _record(self, body: bytes) -> None:
                with registry._lock:
                    registry._seen.append(Seen(method=self.command, path=self.path,
                                               headers=tuple(self.headers.items()), body=body))

            def do_GET(self) -> None:
                self._record(b"")
                path = self.path.split("?", 1)[0]
                if path in ("/simple/", f"/simple/{PACKAGE}/"):
                    link = f'<a href="/packages/{_WHEEL}">{_WHEEL}</a>'
                    self._answer(200, f"<html><body>{link}</body></html>".encode(), "text/html")
                elif path == f"/packages/{_WHEEL}":
                    self._answer(200, registry._wheel, "application/octet-stream")
                else:
                    self._answer(404, b"not found", "text/plain")

            do_HEAD = do_GET

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._record(self.rfile.read(min(length, 1 << 20)))
                self._answer(200, b"stored", "text/plain")

            do_PUT = do_POST

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="firstrun-audit-registry")

    def __enter__(self) -> Registry:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)


class _Listener:
    """A listener that never accepts until counted: the backlog holds every connection."""

    def __init__(self, family: int, kind: int, address: object) -> None:
        self.sock = socket.socket(family, kind)
        self.sock.bind(address)
        if kind == socket.SOCK_STREAM:
            self.sock.listen(64)
        self.sock.setblocking(False)

    def count(self) -> tuple[int, bytes]:
        """Connections (stream) or datagrams received so far, and the datagrams' bytes."""
        n, data = 0, b""
        while True:
            try:
                if self.sock.type == socket.SOCK_STREAM:
                    conn, _ = self.sock.accept()
                    conn.close()
                else:
                    data += self.sock.recv(4096)
            except BlockingIOError:
                return n, data
            n += 1

    def close(self) -> None:
        self.sock.close()


def _marker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", "import time; time.sleep(3600)"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def pids_with_argv0(token: str) -> list[int]:
    """Host pids whose argv[0] is ``token`` (the leftover a session was asked to leave)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0]
        except OSError:
            continue
        if argv0 == token.encode():
            found.append(int(name))
    return found


class Witnesses:
    """Everything one configuration's actions are judged by; fresh per configuration."""

    def __init__(self, *, home: str, system_dir: str) -> None:
        self.nonce = secrets.token_hex(12)
        self.token = f"firstrun-audit-linger-{self.nonce}"
        self.secret = f"firstrun-audit-secret-{secrets.token_hex(12)}"
        self.credential = f"firstrun-audit-credential-{secrets.token_hex(12)}"
        self.canary = _Listener(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0))
        self.dns = _Listener(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0))
        self.abstract_name = f"firstrun-audit-{self.nonce}"
        self.abstract = _Listener(socket.AF_UNIX, socket.SOCK_STREAM, "\0" + self.abstract_name)
        self.secret_path = os.path.join(home, f".firstrun-audit-{self.nonce}")
        # A system file any uid may write by its mode: only a layer refuses the write.
        self.system_dir = tempfile.mkdtemp(prefix="firstrun-audit-", dir=system_dir)
        os.chmod(self.system_dir, 0o755)
        self.system_path = os.path.join(self.system_dir, "canary")
        self.system_content = f"untouched {self.nonce}\n"
        with open(self.system_path, "w") as f:
            f.write(self.system_content)
        os.chmod(self.system_path, 0o666)
        fd = os.open(self.secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.secret)
        self.environ_marker = _marker({"FIRSTRUN_AUDIT_SECRET": self.secret})
        self.kill_marker = _marker({})

    def close(self) -> None:
        for marker in (self.environ_marker, self.kill_marker):
            if marker.poll() is None:
                marker.kill()
            marker.wait()
        for pid in pids_with_argv0(self.token):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for listener in (self.canary, self.dns, self.abstract):
            listener.close()
        try:
            os.unlink(self.secret_path)
        except FileNotFoundError:
            pass
        shutil.rmtree(self.system_dir, ignore_errors=True)
