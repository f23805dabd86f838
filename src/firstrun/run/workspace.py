"""The harness's own reads and writes inside a workspace an agent has had.

Guarantee: no symlink the agent planted, at any depth, can lead a harness read
or write outside the workspace, and a write never goes through an existing
entry, so a planted FIFO, device or hard link to a host file is never written
through either; ``..``, absolute paths and empty components are refused before
anything is opened. A refusal is ``WorkspaceError``, a ``SandboxError``: the
boundary did not hold, which is infrastructure trouble, never a docs finding.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import PurePosixPath

from firstrun.errors import SandboxError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class WorkspaceError(SandboxError):
    who = "workspace"


def _parts(relpath: str) -> list[str]:
    path = PurePosixPath(relpath)
    if path.is_absolute():
        raise WorkspaceError(f"{relpath!r}: an absolute path is not inside the workspace")
    parts = list(path.parts)
    if not parts or any(p in ("..", ".", "") or "\0" in p for p in parts):
        raise WorkspaceError(f"{relpath!r}: only plain names below the workspace are allowed")
    return parts


class Workspace:
    """A workspace directory, held open by descriptor for its lifetime."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        try:
            self._fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise WorkspaceError(f"cannot open workspace {self.root}: {exc.strerror}") from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Every path is walked one component at a time from the root's descriptor,
    # each component opened with O_NOFOLLOW relative to its parent (dir_fd).
    def _parent(self, parts: list[str], *, create: bool) -> int:
        """A new descriptor on the directory holding ``parts[-1]``; the caller closes it."""
        fd = os.dup(self._fd)
        try:
            for name in parts[:-1]:
                if create:
                    try:
                        os.mkdir(name, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
        except OSError as exc:
            os.close(fd)
            raise _refused("/".join(parts), exc) from None
        return fd

    def write_new(self, relpath: str, data: bytes, *, mode: int = 0o644) -> None:
        """Create ``relpath`` (and missing parent directories) holding ``data``."""
        parts = _parts(relpath)
        parent = self._parent(parts, create=True)
        # Created exclusively (O_EXCL): never through an existing entry.
        try:
            fd = os.open(
                parts[-1],
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                mode,
                dir_fd=parent,
            )
        except OSError as exc:
            raise _refused(relpath, exc) from None
        finally:
            os.close(parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)

    def read(self, relpath: str, *, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` of the regular file ``relpath``."""
        parts = _parts(relpath)
        parent = self._parent(parts, create=False)
        try:
            # O_NONBLOCK: a FIFO planted under this name must not hang the harness.
            fd = os.open(
                parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent
            )
        except OSError as exc:
            raise _refused(relpath, exc) from None
        finally:
            os.close(parent)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise WorkspaceError(f"{relpath!r} is not a regular file")
            return fh.read(max_bytes)

    def remove(self, relpath: str) -> None:
        """Remove the entry ``relpath`` itself (a symlink is removed, never followed)."""
        parts = _parts(relpath)
        parent = self._parent(parts, create=False)
        try:
            os.unlink(parts[-1], dir_fd=parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _refused(relpath, exc) from None
        finally:
            os.close(parent)


def _refused(relpath: str, exc: OSError) -> WorkspaceError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return WorkspaceError(f"{relpath!r}: a symlink or non-directory is in the way; refused")
    if exc.errno == errno.EEXIST:
        return WorkspaceError(f"{relpath!r} already exists; the harness does not write through it")
    return WorkspaceError(f"{relpath!r}: {exc.strerror}")
