"""A real multi-node Ray cluster on loopback, each node with a temporary directory of its own.

Every node binds 127.0.0.1 only; ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
makes Ray's own address lookups answer loopback too, so no component listens
on the machine's other addresses. A node's ``TMPDIR`` is its own directory,
so what a run leaves on one node is told apart from another's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from firstrun.sandbox import disk, ownership

ray_cluster_utils = pytest.importorskip("ray.cluster_utils")

FIRSTRUN = Path(sys.executable).parent / "firstrun"
LOOPBACK = "127.0.0.1"


@dataclass
class LoopbackCluster:
    cluster: Any
    nodes: list[Any] = field(default_factory=list)
    tmpdirs: list[Path] = field(default_factory=list)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def node_id(self, index: int) -> str:
        return str(self.nodes[index].node_id)

    def add(self, *, cpus: int = 1, env: Mapping[str, str] | None = None) -> int:
        # Traversable by a sandbox's lent uid, as /tmp is; not named firstrun-*,
        # so the suite's own leftover check sees only what a run leaves there.
        tmpdir = Path(tempfile.mkdtemp(prefix="ray-node-"))
        tmpdir.chmod(0o755)
        node = self.cluster.add_node(node_ip_address=LOOPBACK, num_cpus=cpus,
                                     env_vars={"TMPDIR": str(tmpdir), **(env or {})})
        self.nodes.append(node)
        self.tmpdirs.append(tmpdir)
        self.cluster.wait_for_nodes()
        return len(self.nodes) - 1

    def left_on(self, index: int) -> list[str]:
        """What firstrun left in node ``index``'s temporary directory, and the leases of
        uids lent and disks mounted there."""
        top = self.tmpdirs[index]
        left = sorted(p.name for p in top.iterdir() if p.name.startswith("firstrun-"))
        for leases in (ownership.LEASE_DIR, disk.DISK_LEASE_DIR):
            if os.path.isdir(leases):
                for name in os.listdir(leases):
                    if str(top) in Path(leases, name).read_text(encoding="utf-8"):
                        left.append(f"{leases}/{name}")
        return left

    def kill(self, index: int) -> None:
        """SIGKILL the node's raylet and every worker of it, as a machine dying would."""
        self.cluster.remove_node(self.nodes[index], allow_graceful=False)


@contextmanager
def loopback_cluster(nodes: int = 2, *, env: Mapping[str, str] | None = None,
                     ) -> Iterator[LoopbackCluster]:
    """A head that runs nothing (no CPU) and ``nodes`` one-CPU worker nodes."""
    saved = {name: os.environ.get(name) for name in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
                                                     "RAY_TMPDIR")}
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    temp = tempfile.mkdtemp(prefix="ray-")
    try:
        # Ray writes the head's address to $RAY_TMPDIR/ray/ray_current_cluster (/tmp/ray
        # by default) without making the directory: on a machine where Ray never ran,
        # the head would not start. Here it goes under the cluster's own directory.
        os.environ["RAY_TMPDIR"] = temp
        os.makedirs(os.path.join(temp, "ray"))
        cluster = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={
            "node_ip_address": LOOPBACK, "num_cpus": 0, "include_dashboard": False,
            "temp_dir": temp})
        made = LoopbackCluster(cluster=cluster)
        try:
            for _ in range(nodes):
                made.add(env=env)
            yield made
        finally:
            cluster.shutdown()
            # A killed node's runs leave what its next start would reap: reaped here.
            ownership.recover(who="test")
            disk.recover()
            for tmpdir in made.tmpdirs:
                shutil.rmtree(tmpdir, ignore_errors=True)
    finally:
        # Also when the head never started.
        shutil.rmtree(temp, ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def firstrun(*args: str, env: Mapping[str, str] | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FIRSTRUN), *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout,
                          env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                               **(env or {})})
