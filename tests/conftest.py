"""Every test cleans up what it makes: the suite fails if it leaves firstrun's files behind.

At the end of the session, anything named ``firstrun-*`` in the temporary
directory, any stage directory under ``/run/firstrun``, any lease (a lent
workspace's or a sized workspace's), any gVisor session's directory and any
mount of a sized workspace that was not there when the session began is a
leftover (a key, a socket directory, a workspace), and the session errors
naming each one; what a live firstrun outside the suite holds is not ours.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

# One definition of each shared fixture (``workspace``, the greeter run configs).
pytest_plugins = ("support.fixtures",)

# Whole directories of the fast loop (``-m fast``): pure functions, files and loopback
# servers. Elsewhere a module says ``pytestmark = pytest.mark.fast`` itself.
_FAST_DIRECTORIES = ("policy", "tasks", "results", "docs")

_RUN = "/run/firstrun"


def _ours() -> set[str]:
    found: set[str] = set()
    temp = tempfile.gettempdir()
    for root, prefix in ((temp, "firstrun-"), (_RUN, "firstrun-stage-"),
                         (os.path.join(_RUN, "leases"), ""), (os.path.join(_RUN, "disks"), ""),
                         (os.path.join(_RUN, "gvisor"), "")):
        try:
            names = os.listdir(root)
        except OSError:
            continue
        found |= {os.path.join(root, n) for n in names if n.startswith(prefix)}
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        found |= {f"mount {fields[4]}" for fields in (line.split() for line in f)
                  if "/firstrun-disk-" in fields[4]}
    return found


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if os.path.relpath(str(item.path), here).split(os.sep)[0] in _FAST_DIRECTORIES:
            item.add_marker(pytest.mark.fast)


@pytest.fixture(autouse=True)
def a_fast_test_starts_no_kernel_sandbox(request: pytest.FixtureRequest,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Hold ``fast`` to its word: a backend that enforces (and so needs a kernel, docker,
    runsc or qemu) may be built and probed, never started, in a test marked fast."""
    if request.node.get_closest_marker("fast") is None:
        return
    from firstrun.sandbox import select

    build = select.build_backend

    def guarded(name: str, options: select.BackendOptions) -> object:
        backend = build(name, options)
        if not select.entry(name).unenforced:
            def refuse(*args: object, **kwargs: object) -> None:
                pytest.fail(f"a test marked fast started the {name} backend; mark it otherwise "
                            "or run it on the fake backend", pytrace=False)
            backend.start = refuse  # type: ignore[method-assign]
        return backend

    monkeypatch.setattr(select, "build_backend", guarded)


def _descends_from_us(pid: int) -> bool:
    me = os.getpid()
    while pid > 1:
        if pid == me:
            return True
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return False
        pid = int(stat[stat.rindex(b")") + 2:].split()[1])
    return False


def _others(found: set[str]) -> set[str]:
    """What in ``found`` a live firstrun outside this suite holds (another checkout's tests,
    a run by hand): named as its owner by a lease or an owner file, or mounted by it."""
    from firstrun.sandbox.ownership import alive

    def foreign(identity: str) -> bool:
        pid = identity.partition(":")[0]
        return alive(identity) and not _descends_from_us(int(pid))

    held: set[str] = set()
    for path in found:
        if path.startswith("mount "):
            continue
        try:
            if path.endswith(".json"):
                with open(path, encoding="utf-8") as f:
                    lease = json.load(f)
                if foreign(str(lease["harness"])):
                    held |= {path, *(str(lease[k]) for k in ("workspace", "dir", "stage_dir")
                                     if lease.get(k))}
            elif os.path.basename(path).startswith("firstrun-proxy-"):
                with open(os.path.join(path, "owner"), encoding="ascii") as f:
                    if foreign(f.read().strip()):
                        held.add(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if _descends_from_us(int(pid)):
            continue
        try:
            with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as f:
                mounted = f.read()
        except OSError:
            continue
        held |= {p for p in found if not p.startswith("mount ") and f" {p} " in mounted}
    return {p for p in found
            if any(p == h or p.startswith(h + os.sep) or p.startswith(f"mount {h}/")
                   or p == f"mount {h}" for h in held)}


@pytest.fixture(scope="session", autouse=True)
def the_suite_leaves_nothing_behind() -> Iterator[None]:
    before = _ours()
    yield
    new = _ours() - before
    left = sorted(new - _others(new))
    if left:
        pytest.fail(f"the suite left {len(left)} of firstrun's files behind: {', '.join(left[:20])}",
                    pytrace=False)


def _records_until(read: Callable[[], list], done: Callable[[list], bool], *,
                   deadline_s: float = 30.0) -> list:
    """Poll ``read()`` until ``done`` holds of the records it gives, or give up at the deadline.

    A proxy writes a tunnel's record when it sees the tunnel close, and the
    docker sidecar's records reach the harness through a reader thread:
    either can land a moment after the client inside already has its answer.
    The deadline only bounds a broken run; it is not a timing assertion.
    """
    stop = time.monotonic() + deadline_s
    records = read()
    while not done(records) and time.monotonic() < stop:
        time.sleep(0.05)
        records = read()
    return records


@pytest.fixture
def records_until() -> Callable[..., list]:
    return _records_until
