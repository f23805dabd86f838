"""The harness proxy as a loopback TCP port: what a Seatbelt profile can name.

Guarantee: ``ProxyRelay`` listens on ``127.0.0.1`` and carries each
connection, byte for byte in both directions, to the egress proxy's Unix
socket and nowhere else; a connection the proxy refuses is closed with
nothing sent. ``close`` ends the listener and every connection it carried,
and returns only once every relay thread has finished.
"""

from __future__ import annotations

import os
import select
import socket
import threading

_CHUNK = 1 << 16


# Why a relay: ProxyEndpoint is a Unix socket (the contract every backend shares), while
# macOS has no network namespace to put a private port in, so the sandbox's only way out is
# a Seatbelt rule allowing one loopback TCP port. Any process of this host can dial that
# port too, as it can the harness's docs listener: what it reaches is the proxy's shell
# channel, under the task's policy, with every request recorded, never the network itself.
class ProxyRelay:
    def __init__(self, socket_path: str) -> None:
        self._path = socket_path
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = os.pipe()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._spawn(self._accept_loop)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True,  # type: ignore[arg-type]
                                  name="firstrun-seatbelt-relay")
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while True:
            ready, _, _ = select.select([self._listener, self._wake_r], [], [])
            if self._wake_r in ready:
                return
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self._path)
            except OSError:
                upstream.close()
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._open.update((client, upstream))
            done = threading.Barrier(2, action=lambda c=client, u=upstream: self._forget(c, u))
            self._spawn(self._pump, client, upstream, done)
            self._spawn(self._pump, upstream, client, done)

    def _pump(self, src: socket.socket, dst: socket.socket, done: threading.Barrier) -> None:
        try:
            while data := src.recv(_CHUNK):
                dst.sendall(data)
            # EOF one way is a half-close: the other direction keeps flowing.
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            for sock in (src, dst):
                _shutdown(sock)
        done.wait()

    def _forget(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                self._open.discard(sock)
                sock.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = list(self._open)
        os.write(self._wake_w, b"x")
        for sock in live:
            _shutdown(sock)
        while True:
            with self._lock:
                pending = [t for t in self._threads if t.is_alive()]
            if not pending:
                break
            for thread in pending:
                thread.join()
        self._listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> ProxyRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
