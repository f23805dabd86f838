"""Capped command output that keeps both ends.

Guarantee: however much a command prints, at most ``cap`` bytes per stream
are kept: the first half and the last half, because the start says what ran
and the end says how it failed. ``total_bytes`` and ``omitted_bytes`` say
exactly how much was dropped from the middle.
"""

from __future__ import annotations

from firstrun.sandbox.base import CappedOutput


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
