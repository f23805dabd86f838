"""Sweeps on a Ray cluster: each run is one Ray task, carried out whole on one node.

Guarantee: the sweep runs one backend on every node; a node that cannot give it,
or runs another firstrun, is excluded before the first run, with the reason
said. The driver alone keeps the queue, the spend ledger and ``results.json``,
and writes each run's record and trace where a local sweep would. A run whose
node is lost is ``infra_error``/``node_lost``, never retried; a stopped run ends
with its session closed. No API key crosses the network.
"""

from __future__ import annotations

import io
import os
import pickle
import select
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

# Ray is imported here alone, and nothing imports this module unless --engine ray
# asks for it.
import ray
import ray.cloudpickle
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from firstrun import __version__
from firstrun.docs import Mirror
from firstrun.errors import UsageError, one_line
from firstrun.proxy.records import iso, now_iso
from firstrun.results.model import Classification, RunRecord
from firstrun.results.store import write_atomic
from firstrun.run import node_run
from firstrun.run.classify import RunReason, classify_run
from firstrun.run.config import RunConfig
from firstrun.run.events import TRACE_FILE, Event, Failure, RunFinished, RunStarted, Trace
from firstrun.run.record import build_record
from firstrun.run.runner import fresh_run_dir, run_dir
from firstrun.sandbox.select import Resolution, ranked, sweep_backend
from firstrun.tasks.model import Task

# How long a node may take to answer the probe (docker's can take seconds).
PROBE_TIMEOUT_S = 120.0
# How soon a stop reaches a run in flight; only bounds the driver's wait.
_POLL_S = 0.2


@dataclass(frozen=True, kw_only=True)
class AgentSpec:
    """What ``make_agent`` takes, sent to the node that builds the run's agent there."""

    # Never a key: each node's agent reads its API key from the node's own
    # environment. What crosses the network is the task (its file's text,
    # parsed), the options, the docs mirrors' directories packed (pack_mirrors),
    # and back the record and the trace.

    name: str
    model: str | None = None
    base_url: str | None = None
    prices: Mapping[str, Any] | None = None

    def build(self) -> Any:
        from firstrun.agents import make_agent

        return make_agent(self.name, model=self.model, base_url=self.base_url,
                          price_file=self.prices)


@dataclass(frozen=True, kw_only=True)
class NodeReport:
    """One node as its probe found it. ``backends``: each asked-for backend, None where
    the node can give it, else why not. ``error``: the probe itself failed there."""

    node_id: str
    host: str
    cpus: int
    version: str | None = None
    backends: Mapping[str, str | None] = field(default_factory=dict)
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.host} ({self.node_id[:12]})"


@dataclass(frozen=True, kw_only=True)
class ClusterPlan:
    """The sweep's backend, the nodes that run it, and each excluded node with its reason."""

    resolution: Resolution
    nodes: tuple[NodeReport, ...]
    excluded: tuple[tuple[NodeReport, str], ...] = ()

    @property
    def cpus(self) -> int:
        return sum(node.cpus for node in self.nodes)


class Cluster:
    """The cluster a sweep joined: ``probe`` decides its plan, ``engine`` carries runs out."""

    def __init__(self) -> None:
        self._plan: ClusterPlan | None = None

    @classmethod
    def join(cls, address: str | None) -> Cluster:
        connect(address)
        return cls()

    @property
    def plan(self) -> ClusterPlan:
        assert self._plan is not None, "probe the cluster first"
        return self._plan

    def probe(self, backend: str, *, allow_unenforced: bool, images: Sequence[str | None],
              needs_kernel: bool) -> ClusterPlan:
        self._plan = plan(backend, allow_unenforced=allow_unenforced, images=images,
                          needs_kernel=needs_kernel)
        return self._plan

    def engine(self, *, agent: str, model: str | None, base_url: str | None,
               prices: Mapping[str, Any] | None, mirrors: Mapping[str, Mirror]) -> RayEngine:
        return RayEngine(self.plan, AgentSpec(name=agent, model=model, base_url=base_url,
                                              prices=prices), mirrors)


def leave() -> None:
    """Disconnect from the cluster, if this process joined one."""
    if ray.is_initialized():
        ray.shutdown()


def connect(address: str | None) -> None:
    """Join the cluster at ``address`` (``auto``: the one this machine belongs to;
    ``local``: a new one-machine cluster in this process). One line when it cannot."""
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        if target == "local":
            ray.init(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
        else:
            ray.init(address=target, log_to_driver=False, logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise UsageError(f"--ray-address: cannot join a Ray cluster at {target!r}: "
                         f"{' '.join(str(exc).split())[:300]}; start one with 'ray start "
                         "--head', or give --ray-address HOST:PORT (or local)") from None


def candidates(backend: str, *, needs_kernel: bool) -> tuple[str, ...]:
    """The backends a node is asked about: the named one, or ``auto``'s, strongest first."""
    if backend != "auto":
        return (backend,)
    return tuple(e.name for e in ranked(own_kernel=needs_kernel))


def _probe_here(names: Sequence[str], allow_unenforced: bool, images: Sequence[str | None],
                needs_kernel: bool) -> dict[str, Any]:
    # Plain data: a node that runs another firstrun must still be able to say so.
    backends: dict[str, str | None] = {}
    for name in names:
        found = sweep_backend(name, allow_unenforced, images, needs_kernel=needs_kernel)
        backends[name] = found if isinstance(found, str) else None
    return {"version": __version__, "host": socket.gethostname(), "backends": backends}


_probe = ray.remote(num_cpus=0, max_retries=0)(_probe_here)


def choose(reports: Sequence[NodeReport], *, backend: str, names: Sequence[str]) -> ClusterPlan:
    """Pure: the sweep's backend and nodes from every node's report, strongest first.

    A node that runs another firstrun, failed its probe or has no CPU is out.
    ``auto`` takes the first candidate every remaining node can give; when
    none is common, the one the most nodes can give (the stronger on a tie),
    and the nodes that cannot are out with their reason.
    """
    excluded: list[tuple[NodeReport, str]] = []
    fit: list[NodeReport] = []
    for node in reports:
        if node.error is not None:
            excluded.append((node, f"its probe failed: {node.error}"))
        elif node.version != __version__:
            excluded.append((node, f"it runs firstrun {node.version}, this driver {__version__}"))
        elif node.cpus < 1:
            excluded.append((node, "it has no CPU for runs"))
        else:
            fit.append(node)
    if not fit:
        raise UsageError("--engine ray: no node can run this sweep: " + "; ".join(
            f"{node.label}: {why}" for node, why in excluded) if excluded
            else "--engine ray: the cluster has no node")
    counts = [(sum(1 for n in fit if n.backends.get(name) is None), -i, name)
              for i, name in enumerate(names)]
    common = [name for name in names if all(n.backends.get(name) is None for n in fit)]
    chosen = common[0] if common else max(counts)[2]
    if not common and max(counts)[0] == 0:
        raise UsageError("--engine ray: no node can give " + (
            f"backend {backend}" if backend != "auto" else "any enforcing backend") + ": " +
            "; ".join(f"{n.label}: {n.backends.get(names[0])}" for n in fit))
    nodes = []
    for node in fit:
        why = node.backends.get(chosen)
        if why is None:
            nodes.append(node)
        else:
            excluded.append((node, f"it cannot give backend {chosen}: {why}"))
    passed = tuple(f"{name}: not on every node" for name in names[:names.index(chosen)])
    return ClusterPlan(resolution=Resolution(requested=backend, backend=chosen,
                                             passed_over=passed if backend == "auto" else ()),
                       nodes=tuple(nodes), excluded=tuple(excluded))


def plan(backend: str, *, allow_unenforced: bool, images: Sequence[str | None],
         needs_kernel: bool) -> ClusterPlan:
    """Probe every live node, each with a Ray task pinned to it, and ``choose``."""
    names = candidates(backend, needs_kernel=needs_kernel)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    pending = {
        _probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote(names, allow_unenforced, list(images), needs_kernel):
        n for n in nodes}
    reports: list[NodeReport] = []
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    for ref, node in pending.items():
        common: dict[str, Any] = {"node_id": node["NodeID"],
                                  "host": node.get("NodeManagerHostname", "?"),
                                  "cpus": int(node.get("Resources", {}).get("CPU", 0))}
        try:
            found = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            reports.append(NodeReport(**common, error=f"no answer in {PROBE_TIMEOUT_S:.0f} s"))
            continue
        except ray.exceptions.RayError as exc:
            reports.append(NodeReport(**common, error=_first_line(exc)))
            continue
        reports.append(NodeReport(**{**common, "host": found.get("host", common["host"])},
                                  version=found.get("version"),
                                  backends=found.get("backends", {})))
    return choose(reports, backend=backend, names=names)


def _first_line(exc: BaseException) -> str:
    return one_line(str(exc), 300) or type(exc).__name__


def pack_mirrors(mirrors: Mapping[str, Mirror]) -> dict[str, bytes]:
    """Each directory mirror's tree as a gzipped tar, for nodes that do not have it."""
    packed = {}
    for host, mirror in mirrors.items():
        if mirror.directory is not None:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
                archive.add(mirror.directory, arcname=".")
            packed[host] = buffer.getvalue()
    return packed


def _unpack_mirrors(mirrors: Mapping[str, Mirror], packed: Mapping[str, bytes],
                    into: Path) -> dict[str, Mirror]:
    unpacked = dict(mirrors)
    for host, blob in packed.items():
        where = into / "mirrors" / host
        where.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as archive:
            archive.extractall(where, filter="data")
        unpacked[host] = replace(mirrors[host], directory=str(where))
    return unpacked


def _carry_out_here(task: Task, attempt: int, agent: AgentSpec, config: RunConfig,
                    max_spend: Decimal | None, packed: Mapping[str, bytes],
                    submitted: float) -> dict[str, Any]:
    """One run on this node, in a process of its own (``run.node_run``): a cancel (Ray's
    KeyboardInterrupt) stops it at its next call boundary and waits for it, and if Ray
    kills this worker outright (the driver gone) the run stops the same way by itself."""
    started = time.time()
    node = f"{socket.gethostname()} ({ray.get_runtime_context().get_node_id()[:12]})"
    scratch = Path(tempfile.mkdtemp(prefix="firstrun-ray-run-"))
    try:
        here = replace(config, out_dir=scratch / "out",
                       docs_mirrors=_unpack_mirrors(config.docs_mirrors, packed, scratch))
        # Ray's own pickler, as for the task's arguments (frozen mappings included).
        (scratch / node_run.JOB).write_bytes(ray.cloudpickle.dumps(
            {"task": task, "attempt": attempt, "agent": agent, "config": here,
             "max_spend": max_spend}))
        alive_r, alive_w = os.pipe()
        done_r, done_w = os.pipe()
        try:
            try:
                _ForkServer.send(str(scratch).encode(), [alive_r, done_w])
            finally:
                os.close(alive_r)
                os.close(done_w)
            try:
                _await_end(done_r)
            except BaseException:
                # Ray's cancel (KeyboardInterrupt) or its worker's SIGTERM (SystemExit):
                # the run sees ALIVE end, stops, and closes its session before DONE ends.
                os.close(alive_w)
                alive_w = -1
                _await_end(done_r, poll=None)
                raise
        finally:
            for fd in (alive_w, done_r):
                if fd >= 0:
                    os.close(fd)
        answer = pickle.loads((scratch / node_run.ANSWER).read_bytes())
        if "error" in answer:
            raise answer["error"]
        record: RunRecord = answer["record"]
        trace = (here.out_dir / record.trace).read_bytes()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # Submit (the driver's clock) to the task's start here: Ray's scheduling and
    # the wait for a free CPU, which the trace's own times do not show.
    placed = {"submitted_at": iso(submitted), "started_on_node_at": iso(started),
              "scheduled_s": round(max(0.0, started - submitted), 6)}
    record = replace(record, node=node, extra={**record.extra, "ray": placed})
    return {"record": record.to_data(), "trace": trace}


class _ForkServer:
    """This worker's ``node_run`` server: started on its first run, detached from it."""

    _sock: socket.socket | None = None

    @classmethod
    def send(cls, path: bytes, fds: list[int]) -> None:
        for fresh in (False, True):
            if cls._sock is None or fresh:
                cls._start()
            assert cls._sock is not None
            try:
                socket.send_fds(cls._sock, [path], fds)
                return
            except OSError:
                if fresh:
                    raise

    @classmethod
    def _start(cls) -> None:
        if cls._sock is not None:
            cls._sock.close()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            subprocess.run([sys.executable, "-m", "firstrun.run.node_run", str(theirs.fileno())],
                           stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                           start_new_session=True, check=True)
        finally:
            theirs.close()
        cls._sock = mine


def _await_end(fd: int, *, poll: float | None = _POLL_S) -> None:
    """Until the pipe's writer is gone; in short waits, so a cancel can land between them."""
    while True:
        if poll is not None and not select.select([fd], [], [], poll)[0]:
            continue
        if not os.read(fd, 4096):
            return


_carry_out = ray.remote(num_cpus=1, max_retries=0)(_carry_out_here)


class RayEngine:
    """``run_suite``'s engine for a cluster: one Ray task per run, on the least loaded node."""

    def __init__(self, cluster: ClusterPlan, agent: AgentSpec,
                 mirrors: Mapping[str, Mirror]) -> None:
        self.cluster = cluster
        self.agent = agent
        self._packed = ray.put(pack_mirrors(mirrors))
        self._lock = threading.Lock()
        self._load = {node.node_id: 0 for node in cluster.nodes}
        self._lost: set[str] = set()

    def unavailable(self, task: Task, config: RunConfig) -> str | None:
        with self._lock:
            if all(node_id in self._lost for node_id in self._load):
                return "every node of the cluster that could run the sweep is lost"
        return None

    def _take(self) -> NodeReport | None:
        with self._lock:
            live = [n for n in self.cluster.nodes if n.node_id not in self._lost]
            if not live:
                return None
            node = min(live, key=lambda n: (self._load[n.node_id] / n.cpus, n.node_id))
            self._load[node.node_id] += 1
            return node

    def _give(self, node: NodeReport, *, lost: bool = False) -> None:
        with self._lock:
            self._load[node.node_id] -= 1
            if lost:
                self._lost.add(node.node_id)

    def execute(self, task: Task, *, attempt: int, config: RunConfig,
                on_event: Callable[[Event], None] | None, stop: threading.Event,
                max_spend: Decimal | None) -> RunRecord:
        # The node's events stay on the node; a progress board sees each run
        # start (queued or running) and finish.
        if on_event is not None:
            on_event(RunStarted(task=task.name, attempt=attempt, agent=self.agent.name,
                                model=self.agent.model, task_file=task.path,
                                task_sha256=task.sha256))
        record = self._execute(task, attempt=attempt, config=config, stop=stop,
                               max_spend=max_spend)
        if on_event is not None:
            on_event(RunFinished(classification=record.classification.value,
                                 reason=record.reason))
        return record

    def _execute(self, task: Task, *, attempt: int, config: RunConfig, stop: threading.Event,
                 max_spend: Decimal | None) -> RunRecord:
        last: NodeReport | None = None
        while (node := self._take()) is not None:
            last = node
            lost = False
            try:
                answer = self._carry_out_on(node, task, attempt, config, stop, max_spend)
            except ray.exceptions.TaskUnschedulableError:
                # It never started there, so nothing was spent: another node may take it.
                lost = True
                continue
            except _Lost as exc:
                lost = True
                return node_lost(task, attempt=attempt, agent=self.agent, config=config,
                                 node=node, why=str(exc))
            finally:
                self._give(node, lost=lost)
            if answer is None:
                return _interrupted(task, attempt, self.agent, config)
            record = RunRecord.from_data(answer["record"])
            # Where a local run would have left it: the attempt's directory anew.
            fresh_run_dir(config, task.name, attempt).mkdir(parents=True)
            write_atomic(config.out_dir / record.trace, answer["trace"])
            return record
        assert last is not None or self.cluster.nodes
        return node_lost(task, attempt=attempt, agent=self.agent, config=config,
                         node=last or self.cluster.nodes[0],
                         why="every node that could run the sweep is lost")

    def _carry_out_on(self, node: NodeReport, task: Task, attempt: int, config: RunConfig,
                      stop: threading.Event, max_spend: Decimal | None) -> dict[str, Any] | None:
        """The run's answer from ``node``; None when a stop cancelled it. Raises ``_Lost``."""
        # On the node the run is carried out detached from its Ray worker
        # (run.node_run), so a driver that goes away without a word, whose
        # workers Ray then kills outright, still stops each run as Ctrl-C would.
        ref = _carry_out.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            node.node_id, soft=False)).remote(task, attempt, self.agent,
                                              replace(config, politeness=None), max_spend,
                                              self._packed, time.time())
        cancelled = False
        while not ray.wait([ref], timeout=_POLL_S)[0]:
            if stop.is_set() and not cancelled:
                # Ray raises KeyboardInterrupt in the task, which stops the run
                # and waits for its session to close before the task ends.
                ray.cancel(ref)
                cancelled = True
        try:
            answer: dict[str, Any] = ray.get(ref)
        except ray.exceptions.TaskCancelledError:
            return None
        except ray.exceptions.TaskUnschedulableError:
            raise
        except ray.exceptions.RayTaskError as exc:
            # An exception from firstrun itself on the node: the local
            # engine's crash, raised the same way.
            raise exc.as_instanceof_cause() from None
        except ray.exceptions.RayError as exc:
            raise _Lost(_first_line(exc)) from None
        return answer


class _Lost(Exception):
    """The node carrying a run out died, or its worker did, under it."""


def _interrupted(task: Task, attempt: int, agent: AgentSpec, config: RunConfig) -> RunRecord:
    # Not a finished run: run_suite never stores it, so it needs no trace.
    return RunRecord(task=task.name, task_file=task.path, task_sha256=task.sha256,
                     attempt=attempt, agent=agent.name, model=agent.model,
                     classification=Classification.INFRA_ERROR, reason=RunReason.INTERRUPTED,
                     backend=config.backend, enforcement=None, policy_hash=None)


# Never retried: a retry would spend twice.
def node_lost(task: Task, *, attempt: int, agent: AgentSpec, config: RunConfig,
              node: NodeReport, why: str) -> RunRecord:
    """The record and trace of a run whose node was lost under it, written by the driver."""
    where = run_dir(config, task.name, attempt)
    started = now_iso()
    trace = Trace(where / TRACE_FILE)
    try:
        trace.emit(RunStarted(task=task.name, attempt=attempt, agent=agent.name,
                              model=agent.model, task_file=task.path, task_sha256=task.sha256))
        trace.emit(Failure(phase="node", who="ray", error_type="NodeLost",
                           message=f"node {node.label} was lost: {why}", infra=True,
                           reason=RunReason.NODE_LOST.value))
        outcome = classify_run(trace.events())
        trace.emit(RunFinished(classification=outcome.classification.value,
                               reason=outcome.reason.value))
        events = trace.events()
    finally:
        trace.close()
    record = build_record(task, attempt=attempt, agent_name=agent.name, model=agent.model,
                          outcome=outcome, events=events, started_at=started, duration_s=0.0,
                          trace=str((where / TRACE_FILE).relative_to(config.out_dir)))
    return replace(record, node=node.label, backend=config.backend)
