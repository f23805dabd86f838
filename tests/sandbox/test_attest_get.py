"""The probe's GET to the proxy: only a 200 with this run's nonce in its body attests, and a
peer that trickles or floods cannot hold the probe past its bounds. Served on loopback."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from firstrun.sandbox import attest_probe

NONCE = "n-0123456789abcdef"


@pytest.fixture
def serve() -> Iterator:
    listeners: list[socket.socket] = []

    def start(reply) -> tuple[str, int]:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def run() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                reply(conn)
        threading.Thread(target=run, daemon=True).start()
        return listener.getsockname()

    yield start
    for listener in listeners:
        listener.close()


def _answer(status: str, body: bytes, headers: str = "") -> object:
    return lambda conn: conn.sendall(f"HTTP/1.1 {status}\r\n{headers}connection: close\r\n"
                                     f"\r\n".encode() + body)


@pytest.mark.parametrize(("reply", "attests"), [
    (_answer("200 OK", NONCE.encode()), True),
    (_answer("200 OK", b"someone else's nonce"), False),
    (_answer("403 Forbidden", NONCE.encode()), False),
    (_answer("200 OK", b"", headers=f"x-nonce: {NONCE}\r\n"), False),
    (lambda conn: conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n" + NONCE.encode()), False),
])
def test_only_a_200_carrying_the_nonce_in_its_body_attests(serve, reply, attests: bool) -> None:
    status, body = attest_probe._attest_get(serve(reply), "http://attest.firstrun.invalid/")
    assert attest_probe._answered(status, body, NONCE) is attests


def test_an_empty_nonce_never_attests() -> None:
    assert not attest_probe._answered(200, b"anything", "")


def test_a_flood_is_read_no_further_than_the_cap(serve) -> None:
    def flood(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        try:
            while True:
                conn.sendall(b"x" * 65536)
        except OSError:
            pass
    _, body = attest_probe._attest_get(serve(flood), "/")
    assert len(body) < attest_probe._ATTEST_MAX_BYTES


def test_a_trickle_ends_at_the_deadline(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attest_probe, "_ATTEST_TIMEOUT_S", 0.5)
    stop = threading.Event()

    def trickle(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        while not stop.is_set():
            conn.sendall(b"x")
            time.sleep(0.05)
    try:
        with pytest.raises(TimeoutError):
            attest_probe._attest_get(serve(trickle), "/")
    finally:
        stop.set()
