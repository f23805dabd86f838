"""Which nodes run a sweep, and on which backend: a pure function of the nodes' reports."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from firstrun import __version__  # noqa: E402
from firstrun.errors import UsageError  # noqa: E402
from firstrun.run.ray_engine import NodeReport, candidates, choose  # noqa: E402

AUTO = candidates("auto", needs_kernel=False)


def node(name: str, *, version: str = __version__, cpus: int = 2, error: str | None = None,
         lacks: tuple[str, ...] = ()) -> NodeReport:
    return NodeReport(node_id=f"{name:0<16}", host=name, cpus=cpus, version=version,
                      error=error,
                      backends={b: (f"no {b} here" if b in lacks else None) for b in AUTO})


def test_auto_tries_the_strongest_first_and_a_vm_requirement_only_kernels() -> None:
    assert AUTO[:2] == ("docker", "linux")
    assert candidates("auto", needs_kernel=True) == ("microvm", "gvisor")
    assert candidates("linux", needs_kernel=False) == ("linux",)


@pytest.mark.parametrize(("reports", "backend", "chosen", "kept", "excluded"), [
    # Every node has docker: docker on all of them.
    ([node("a"), node("b")], "auto", "docker", ["a", "b"], []),
    # One node lacks docker: the strongest all have is linux, and nobody is left out.
    ([node("a"), node("b", lacks=("docker",))], "auto", "linux", ["a", "b"],
     []),
    # Another version, a failed probe and no CPU are out whatever the backend.
    ([node("a"), node("old", version="0.0.1"), node("broken", error="ImportError"),
      node("idle", cpus=0)], "auto", "docker", ["a"],
     ["old: it runs firstrun 0.0.1", "broken: its probe failed: ImportError",
      "idle: it has no CPU for runs"]),
    # A named backend: a node that cannot give it is out, never given a weaker one.
    ([node("a"), node("b", lacks=("linux",))], "linux", "linux", ["a"],
     ["b: it cannot give backend linux: no linux here"]),
    # Nothing common: the backend the most nodes have, the others out.
    ([node("a", lacks=("linux", "seatbelt")), node("b", lacks=("docker", "seatbelt")),
      node("c", lacks=("docker", "seatbelt"))], "auto", "linux", ["b", "c"],
     ["a: it cannot give backend linux: no linux here"]),
])
def test_the_plan_keeps_only_nodes_that_give_the_one_backend(
        reports: list[NodeReport], backend: str, chosen: str, kept: list[str],
        excluded: list[str]) -> None:
    names = candidates(backend, needs_kernel=False)
    if backend != "auto":
        reports = [NodeReport(node_id=r.node_id, host=r.host, cpus=r.cpus, version=r.version,
                              error=r.error, backends={backend: r.backends.get(backend)})
                   for r in reports]
    plan = choose(reports, backend=backend, names=names)
    assert plan.resolution.backend == chosen and plan.resolution.requested == backend
    assert [n.host for n in plan.nodes] == kept
    assert [f"{n.host}: {why}" for n, why in plan.excluded] == [
        e if "0.0.1" not in e else f"{e}, this driver {__version__}" for e in excluded]


def test_no_node_that_can_run_the_sweep_is_one_line_naming_each() -> None:
    with pytest.raises(UsageError) as raised:
        choose([node("old", version="0.0.1")], backend="auto", names=AUTO)
    assert "no node can run this sweep" in str(raised.value) and "old" in str(raised.value)
    with pytest.raises(UsageError, match="no node can give backend linux"):
        choose([node("a", lacks=AUTO)], backend="linux", names=("linux",))
