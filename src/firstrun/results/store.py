"""Durable results: a versioned ``results.json`` rewritten atomically per run.

Guarantee: at every instant ``results.json`` on disk is either the previous
complete document or the new complete document, never a torn write. A run is
added the moment it finishes, so an interrupt keeps every finished run. A
document with a schema version this code does not know is refused, not
half-read. ``ResultsStore.reopen`` keeps a sweep's runs exactly as they were
and only ever adds to them.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from firstrun.errors import UsageError
from firstrun.results.model import SweepIdentity

SCHEMA_VERSION = 1
RESULTS_FILE = "results.json"
SWEEP_KEY = "sweep"


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

    # A sweep records what makes its runs one sample under ``meta["sweep"]``
    # (``SweepIdentity``). A document with no identity (written before
    # ``--resume`` existed) is refused, because nothing could show the new runs
    # comparable.
    @classmethod
    def reopen(cls, out_dir: str | os.PathLike[str], *, flag: str = "--resume") -> ResultsStore:
        """The store of the sweep saved in ``out_dir``, its runs kept, to add the missing ones.

        Raises ``UsageError`` naming ``flag`` when there is no readable sweep there.
        """
        path = Path(out_dir) / RESULTS_FILE
        try:
            document = load_results(path)
        except UsageError as exc:
            raise UsageError(f"{flag}: {exc.args[0]}") from None
        meta = document.get("meta")
        if not isinstance(meta, dict) or SWEEP_KEY not in meta:
            raise UsageError(f"{flag}: {path} records no sweep identity (it was written by a "
                             "firstrun without --resume); start a new sweep with --out")
        for i, run in enumerate(document["runs"], start=1):
            # Each run is kept as it is and counted done by its task and attempt;
            # a run without them would crash the sweep or be run again.
            if not (isinstance(run, dict) and isinstance(run.get("task"), str)
                    and type(run.get("attempt")) is int):
                raise UsageError(f"{flag}: {path}: run {i} is not a run record (it needs a "
                                 "string 'task' and an integer 'attempt')")
        store = cls(out_dir, meta=meta)
        store._runs = [dict(run) for run in document["runs"]]
        return store

    def identity(self, *, flag: str = "--resume") -> SweepIdentity:
        """The recorded sweep identity; ``UsageError`` naming ``flag`` when it is unreadable."""
        try:
            return SweepIdentity.from_data(self._meta[SWEEP_KEY])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise UsageError(f"{flag}: {self.path} has an unreadable sweep identity") from None

    def meta(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._meta)

    def update_meta(self, changes: Mapping[str, Any]) -> None:
        """Merge ``changes`` into the meta and rewrite the document atomically."""
        with self._lock:
            self._meta.update(changes)
            write_json_atomic(self.path, self._document())

    def finished(self, *, retry_infra: bool = False) -> frozenset[tuple[str, int]]:
        """``(task, attempt)`` of every stored run; only finished runs are ever stored.
        ``retry_infra``: not those stored as ``infra_error`` (``--retry-infra``)."""
        with self._lock:
            return frozenset((str(r["task"]), int(r["attempt"])) for r in self._runs
                             if not (retry_infra and r.get("classification") == "infra_error"))

    def runs(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._runs)

    def add(self, run: Mapping[str, Any]) -> None:
        """Store ``run``; one stored before for the same attempt (retried) is replaced."""
        key = (run.get("task"), run.get("attempt"))
        with self._lock:
            self._runs = [r for r in self._runs if (r.get("task"), r.get("attempt")) != key]
            self._runs.append(dict(run))
            write_json_atomic(self.path, self._document())

    def flush(self) -> None:
        with self._lock:
            write_json_atomic(self.path, self._document())

    def _document(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "meta": self._meta, "runs": self._runs}


def _read_regular(path: Path) -> bytes:
    # Non-blocking, so a FIFO by that name is refused rather than waited on.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    finally:
        os.close(fd)


def load_results(path: Path) -> dict[str, Any]:
    """Read a results document, refusing unknown versions with a one-line error."""
    try:
        document = json.loads(_read_regular(path).decode("utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no results file here") from None
    except OSError as exc:
        raise UsageError(f"{path}: not a readable results file ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise UsageError(f"{path}: not a readable results file ({exc})") from None
    except RecursionError:
        raise UsageError(f"{path}: not a readable results file (nested too deeply)") from None
    version = document.get("schema_version") if isinstance(document, dict) else None
    if version != SCHEMA_VERSION:
        raise UsageError(
            f"{path}: results schema version {version!r} is not supported (this firstrun reads {SCHEMA_VERSION})"
        )
    if not isinstance(document.get("runs"), list):
        raise UsageError(f"{path}: results file has no 'runs' list")
    return document
