"""The harness's reading of the proxy sidecar's stdout, fed garbage by a real process.

The sidecar's lines are its ready line and then one egress record each. A
line that is not a JSON object, or a record that is not one, must fail the
session as a ``SandboxError`` naming docker when it closes, never be
skipped (a lost record) and never escape as a bare ``KeyError``.
"""

from __future__ import annotations

import json
import subprocess
import tempfile

import pytest

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.sandbox.docker.backend import _Sidecar

READY = '{"event": "ready", "nonce": "n"}'
RECORD = '{"event": "record", "record": {"id": "one"}}'


def _sidecar(*lines: str) -> tuple[_Sidecar, list[dict[str, object]]]:
    process = subprocess.Popen(["printf", "%s\\n", *lines], stdout=subprocess.PIPE, text=True)
    delivered: list[dict[str, object]] = []
    return _Sidecar(process, delivered.append, tempfile.TemporaryFile()), delivered


@pytest.mark.parametrize("garbage", [
    "not json at all",
    "[1, 2]",
    '{"event": "record"}',
    '{"event": "record", "record": ["id"]}',
])
def test_a_line_it_cannot_read_fails_the_session_naming_docker(garbage: str) -> None:
    sidecar, delivered = _sidecar(READY, RECORD, garbage, RECORD)
    assert sidecar.await_ready()["nonce"] == "n"
    with pytest.raises(SandboxError) as failed:
        sidecar.finish()
    assert failed.value.who == "docker" and "the proxy sidecar sent" in str(failed.value)
    # The records around it were delivered: nothing after the bad line was lost.
    assert delivered == [{"id": "one"}, {"id": "one"}]


@pytest.mark.parametrize("first", ["", "garbage", "[]", '{"event": "record"}'])
def test_a_ready_line_it_cannot_read_is_a_sidecar_that_did_not_start(first: str) -> None:
    sidecar, _ = _sidecar(first)
    with pytest.raises(SandboxError, match="the proxy sidecar did not start") as failed:
        sidecar.await_ready()
    assert failed.value.who == "docker"
    sidecar.finish()  # nothing was delivered, so nothing fails here


def test_well_formed_lines_are_delivered_in_order() -> None:
    sidecar, delivered = _sidecar(READY, RECORD, '{"event": "other"}',
                                  '{"event": "record", "record": {"id": "two"}}')
    sidecar.await_ready()
    sidecar.finish()
    assert delivered == [{"id": "one"}, {"id": "two"}]


def test_a_refusal_is_one_capped_line_whatever_the_sidecar_wrote() -> None:
    refused = json.dumps({"event": "refused", "error": "bad\n\x1b[31mthing\r" + "x" * 900,
                          "fix": "do\tthis\x07"})
    sidecar, _ = _sidecar(refused)
    with pytest.raises(SandboxUnavailable) as failed:
        sidecar.await_ready()
    message = str(failed.value)
    assert "\n" not in message and "\x1b" not in message and "\r" not in message
    assert message.startswith("docker: bad [31mthing xxx")
    assert len(message) == len("docker: ") + 500 and failed.value.fix == "do this"
    sidecar.finish()


@pytest.mark.parametrize("refused", ['{"event": "refused"}',
                                     '{"event": "refused", "error": 1, "fix": "f"}'])
def test_a_refusal_without_its_words_is_a_sidecar_that_did_not_start(refused: str) -> None:
    sidecar, _ = _sidecar(refused)
    with pytest.raises(SandboxError, match="the proxy sidecar did not start"):
        sidecar.await_ready()
    sidecar.finish()
