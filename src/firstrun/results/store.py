"""Durable results: a versioned ``results.json`` rewritten atomically per run.

Guarantee: at every instant ``results.json`` on disk is either the previous
complete document or the new complete document, never a torn write, because
it is written to a temporary file in the same directory, fsynced, and
renamed over the old one. A run is added the moment it finishes, so an
interrupt keeps every finished run. A document with a schema version this
code does not know is refused, not half-read.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from firstrun.errors import UsageError

SCHEMA_VERSION = 1
RESULTS_FILE = "results.json"


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so readers see old or new, never a mix.

    Temporary file in the same directory, fsynced, renamed over the old one,
    then the directory fsynced so the rename itself survives a crash.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json_atomic(path: Path, document: Mapping[str, Any]) -> None:
    """``document`` as indented JSON at ``path``, written with ``write_atomic``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    write_atomic(path, text.encode("utf-8"))


class ResultsStore:
    """The results of one sweep; safe to ``add`` from several worker threads."""

    def __init__(self, out_dir: str | os.PathLike[str], *, meta: Mapping[str, Any]) -> None:
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / RESULTS_FILE
        self._lock = threading.Lock()
        self._meta = dict(meta)
        self._runs: list[dict[str, Any]] = []

    def runs(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._runs)

    def add(self, run: Mapping[str, Any]) -> None:
        with self._lock:
            self._runs.append(dict(run))
            write_json_atomic(self.path, self._document())

    def flush(self) -> None:
        with self._lock:
            write_json_atomic(self.path, self._document())

    def _document(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "meta": self._meta, "runs": self._runs}


def load_results(path: Path) -> dict[str, Any]:
    """Read a results document, refusing unknown versions with a one-line error."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no results file here") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable results file ({exc})") from None
    version = document.get("schema_version") if isinstance(document, dict) else None
    if version != SCHEMA_VERSION:
        raise UsageError(
            f"{path}: results schema version {version!r} is not supported (this firstrun reads {SCHEMA_VERSION})"
        )
    if not isinstance(document.get("runs"), list):
        raise UsageError(f"{path}: results file has no 'runs' list")
    return document
