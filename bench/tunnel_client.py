"""Rounds of new CONNECT tunnels at once, run inside a sandbox by its own Python.

Guarantee: the tunnels bench (bench_tunnels.py) and the docker sidecar's test
(tests/docker/test_tunnel_rounds.py) run this same client, as
``python3 -c TEXT host port first per_round cafile rounds``. Each tunnel is
a CONNECT through ``$https_proxy``, a TLS handshake trusting only ``cafile``,
and one GET naming the tunnel (``/t/<n>``, numbered from ``first``); each
wait is bounded. It prints one JSON line: the seconds all rounds took, how
many tunnels got the answer, the numbers of those that did not, and the first
ten reasons why.
"""

import asyncio
import json
import os
import ssl
import sys
import time
from urllib.parse import urlsplit

WAIT_S = 60


async def tunnel(n: int, host: str, port: int, context: ssl.SSLContext) -> str:
    """"ok", or what happened instead."""
    proxy = urlsplit(os.environ["https_proxy"])
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(proxy.hostname, proxy.port), WAIT_S)
        writer.write(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        if not head.startswith(b"HTTP/1.1 200"):
            return f"refused: {head[:60]!r}"
        await asyncio.wait_for(writer.start_tls(context, server_hostname=host), WAIT_S)
        writer.write(f"GET /t/{n} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), WAIT_S)
        writer.close()
        return "ok" if answer.startswith(b"HTTP/1.1 200") else f"answer: {answer[:60]!r}"
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
        return f"lost: {type(exc).__name__}: {exc}"[:160]


async def main(host: str, port: int, first: int, per_round: int, cafile: str,
               rounds: int) -> None:
    context = ssl.create_default_context(cafile=cafile)
    started = time.perf_counter()
    ended: list[str] = []
    for r in range(rounds):
        ended += await asyncio.gather(*(tunnel(first + r * per_round + i, host, port, context)
                                        for i in range(per_round)))
    print(json.dumps({"s": time.perf_counter() - started, "ok": ended.count("ok"),
                      "failed": [first + i for i, e in enumerate(ended) if e != "ok"],
                      "other": [e for e in ended if e != "ok"][:10]}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                     sys.argv[5], int(sys.argv[6])))
