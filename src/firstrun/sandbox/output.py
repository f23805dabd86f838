"""Capped command output that keeps both ends.

Guarantee: however much a command prints, at most ``cap`` bytes per stream
are kept: the first half and the last half, because the start says what ran
and the end says how it failed. ``total_bytes`` and ``omitted_bytes`` say
exactly how much was dropped from the middle. ``collect_streams`` reads a
host process's two pipes into such captures until both close or a deadline
passes, whichever is first, and closes the pipes either way.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time

from firstrun.sandbox.base import CappedOutput, OutputCallback, Stream


class OutputCapture:
    def __init__(self, cap: int) -> None:
        self._head_cap = cap // 2
        self._tail_cap = cap - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self._total = 0

    def add(self, data: bytes) -> None:
        self._total += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > self._tail_cap:
                del self._tail[: len(self._tail) - self._tail_cap]

    def result(self) -> CappedOutput:
        kept = len(self._head) + len(self._tail)
        return CappedOutput(data=bytes(self._head + self._tail), total_bytes=self._total,
                            omitted_bytes=self._total - kept)


def collect_streams(proc: subprocess.Popen[bytes], deadline: float, cap: int,
                    on_output: OutputCallback | None) -> tuple[dict[Stream, OutputCapture], bool]:
    """Both of ``proc``'s streams until EOF or ``deadline`` (monotonic); True if the deadline came first."""
    outputs = {Stream.STDOUT: OutputCapture(cap), Stream.STDERR: OutputCapture(cap)}
    assert proc.stdout is not None and proc.stderr is not None
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, Stream.STDOUT)
            sel.register(proc.stderr, selectors.EVENT_READ, Stream.STDERR)
            open_streams = 2
            while open_streams:
                events = sel.select(max(0.0, deadline - time.monotonic()))
                if not events:
                    return outputs, True
                for key, _ in events:
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                        continue
                    outputs[key.data].add(data)
                    if on_output is not None:
                        on_output(key.data, data)
        return outputs, False
    finally:
        proc.stdout.close()
        proc.stderr.close()
