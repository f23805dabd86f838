"""``--engine ray`` on a real multi-node Ray cluster on loopback, through the real CLI.

Each node carries its runs out whole (its own proxy, bubblewrap session and
check); judged by what the driver saved, by the processes on the machine, and
by what each node left in its own temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray_support import FIRSTRUN, LoopbackCluster, firstrun, loopback_cluster

import firstrun as firstrun_package
from firstrun import __version__

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sweeps here lend uids (root)")

FIXTURES = Path(__file__).resolve().parents[1] / "cli" / "run_fixtures"
TASKS = FIXTURES / "tasks"
DOCS_HOST = "greeter.docs.example"
MIRROR = ["--docs-mirror", f"{DOCS_HOST}={FIXTURES / 'docs'}"]
# Marks the slow replay step's process in /proc; it ends by itself, and passes.
SLOW_MARK = b"31.4159"
# Fields that say where and when a run happened, not what it found.
CIRCUMSTANTIAL = {"node", "started_at", "duration_s", "attestation", "layers", "policy_hash"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LoopbackCluster]:
    with loopback_cluster(2) as made:
        yield made


def _document(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def _task(tmp_path: Path, name: str, *, replay: str = "printf 'hello\\n' > greeting.txt") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""name: {name}
goal: Following the Greeter guide, write the first greeting into greeting.txt.
docs:
  entrypoint: https://greeter.docs.example/index.html
replay:
  - run: {replay}
    undocumented: a test step, not the guide's
success:
  script: |
    grep -qx hello greeting.txt || qs_fail "greeting.txt does not say hello"
""", encoding="utf-8")
    return path


def _marked() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if SLOW_MARK in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _await(what, *, within: float = 120.0, proc: subprocess.Popen | None = None):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not (found := what()):
        assert proc is None or proc.poll() is None, proc.communicate() if proc else None
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)
    return found


def test_a_replay_sweep_across_two_nodes_saves_what_a_local_one_does(
        cluster: LoopbackCluster, tmp_path: Path) -> None:
    tasks = [str(_task(tmp_path, f"greet-{n}")) for n in range(4)]
    local = firstrun("run", *tasks, *MIRROR, "--backend", "linux", "--workers", "2",
                     "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stdout + local.stderr
    remote = firstrun("run", *tasks, *MIRROR, "--backend", "linux", "--engine", "ray",
                      "--ray-address", cluster.address, "--out", str(tmp_path / "ray"))
    assert remote.returncode == 0, remote.stdout + remote.stderr
    assert "running on 2 Ray nodes (2 CPUs)" in remote.stderr
    mine, theirs = _document(tmp_path / "local"), _document(tmp_path / "ray")
    assert (mine["meta"]["engine"], theirs["meta"]["engine"]) == ("local", "ray")
    assert mine["meta"]["sweep"] == theirs["meta"]["sweep"]
    assert set(mine["meta"]) == set(theirs["meta"])

    def what(document: dict) -> dict:
        return {(r["task"], r["attempt"]): {
            **{k: v for k, v in r.items() if k not in CIRCUMSTANTIAL},
            "extra": {k: v for k, v in r["extra"].items() if k != "ray"}}
            for r in document["runs"]}

    assert what(mine) == what(theirs)
    assert {r["classification"] for r in theirs["runs"]} == {"passed"}
    # Spread: both nodes carried runs out, each recorded as HOST (NODE-ID).
    nodes = {r["node"] for r in theirs["runs"]}
    assert {n.split("(")[1].rstrip(")") for n in nodes} == {
        cluster.node_id(i)[:12] for i in range(2)}
    assert all(r["node"] is None and "ray" not in r["extra"] for r in mine["runs"])
    # Where each run waited before its node started it, from submit (the driver's clock).
    for run in theirs["runs"]:
        placed = run["extra"]["ray"]
        assert placed["scheduled_s"] >= 0 and placed["submitted_at"] <= placed["started_on_node_at"]
        # In the form every record's times take (UTC, milliseconds, Z).
        assert all(len(placed[k]) == len(run["started_at"]) and placed[k].endswith("Z")
                   for k in ("submitted_at", "started_on_node_at"))
    for run in theirs["runs"]:
        trace = (tmp_path / "ray" / run["trace"]).read_text().splitlines()
        assert json.loads(trace[0])["kind"] == "run_started"
        assert json.loads(trace[-1])["kind"] == "run_finished"
    assert cluster.left_on(0) == [] and cluster.left_on(1) == []


def test_a_lost_node_is_node_lost_the_rest_finish_and_retry_infra_runs_it_again(
        tmp_path: Path) -> None:
    slow = _task(tmp_path, "greet-slow", replay=f"sleep {SLOW_MARK.decode()}; "
                                              "printf 'hello\\n' > greeting.txt")
    quick = [_task(tmp_path, f"greet-{n}") for n in range(2)]
    out = tmp_path / "out"
    with loopback_cluster(2) as made:
        proc = subprocess.Popen(
            [str(FIRSTRUN), "run", str(slow), *map(str, quick), *MIRROR, "--backend", "linux",
             "--engine", "ray", "--ray-address", made.address, "--out", str(out)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
        _await(_marked, proc=proc)
        # The node whose run directory (under its own TMPDIR) holds the slow task's job.
        [dying] = [i for i in range(2) for job in made.tmpdirs[i].glob("firstrun-ray-run-*/job*")
                   if b"greet-slow" in job.read_bytes()]
        made.kill(dying)
        stdout, stderr = proc.communicate(timeout=300)
        survivor = 1 - dying
        assert made.left_on(survivor) == []
    assert proc.returncode == 0, stdout + stderr
    runs = {r["task"]: r for r in _document(out)["runs"]}
    lost = runs["greet-slow"]
    assert (lost["classification"], lost["reason"]) == ("infra_error", "node_lost"), lost
    assert made.node_id(dying)[:12] in lost["node"] and "was lost" in lost["detail"]
    trace = [json.loads(line) for line in (out / lost["trace"]).read_text().splitlines()]
    assert [e["kind"] for e in trace] == ["run_started", "failure", "run_finished"]
    for name in ("greet-0", "greet-1"):
        assert runs[name]["classification"] == "passed"
        assert made.node_id(survivor)[:12] in runs[name]["node"]
    assert _marked() == []
    # Never retried by itself (a retry would spend twice); --retry-infra asks for it.
    again = firstrun("run", str(slow), *map(str, quick), *MIRROR, "--backend", "linux",
                     "--resume", str(out), "--retry-infra")
    assert again.returncode == 0, again.stdout + again.stderr
    runs = _document(out)["runs"]
    assert sorted((r["task"], r["classification"]) for r in runs) == [
        ("greet-0", "passed"), ("greet-1", "passed"), ("greet-slow", "passed")]


def test_ctrl_c_cancels_the_runs_and_every_node_closes_its_session(
        cluster: LoopbackCluster, tmp_path: Path) -> None:
    slow = _task(tmp_path, "greet-slow", replay=f"sleep {SLOW_MARK.decode()}0")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [str(FIRSTRUN), "run", str(TASKS / "greet-pass.yaml"), str(slow), *MIRROR,
         "--backend", "linux", "--engine", "ray", "--ray-address", cluster.address,
         "--workers", "1", "--out", str(out)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    try:
        _await(_marked, proc=proc)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stdout + stderr
    assert [(r["task"], r["classification"]) for r in _document(out)["runs"]] == [
        ("greet-pass", "passed")]
    assert "interrupted: 1 finished run kept" in stderr
    # Closed before the driver returned: no sandboxed process, nothing on either node.
    assert _marked() == []
    assert cluster.left_on(0) == [] and cluster.left_on(1) == []


def test_a_run_whose_command_died_before_the_stop_and_answered_after_it_is_not_kept(
        cluster: LoopbackCluster, tmp_path: Path) -> None:
    token = f"firstrun-ray-killed-{os.getpid()}"
    task = _task(tmp_path, "greet-killed", replay=f"exec -a {token} sleep 3600")
    out = tmp_path / "out"
    driver = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("held_driver.py")), cluster.address,
         str(task), str(out), DOCS_HOST, str(FIXTURES / "docs")],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
        env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "HELD_TOKEN": token})
    # The node, unaware of any stop, answered a docs gap; the driver kept nothing.
    trace = out / "runs" / "greet-killed" / "1" / "trace.jsonl"
    assert trace.is_file(), driver.stdout + driver.stderr
    assert '"classification": "docs_gap"' in trace.read_text()
    assert driver.returncode == 0, driver.stdout + driver.stderr
    assert not (out / "results.json").exists()
    assert cluster.left_on(0) == [] and cluster.left_on(1) == []


def test_a_sweep_resumes_across_engines(cluster: LoopbackCluster, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (tmp_path / "firstrun.yaml").write_text(
        f"engine: ray\nray_address: {cluster.address}\nbackend: linux\n", encoding="utf-8")
    first = firstrun("run", str(TASKS / "greet-pass.yaml"), *MIRROR, "--repeat", "2",
                     "--engine", "local", "--config", str(tmp_path / "firstrun.yaml"),
                     "--out", str(out))
    assert first.returncode == 0, first.stderr
    # As an interrupt after the first run would have left it.
    document = _document(out)
    document["runs"] = [r for r in document["runs"] if r["attempt"] == 1]
    (out / "results.json").write_text(json.dumps(document), encoding="utf-8")
    # The project config says ray: the resumed sweep goes there.
    resumed = firstrun("run", str(TASKS / "greet-pass.yaml"), *MIRROR, "--repeat", "2",
                       "--config", str(tmp_path / "firstrun.yaml"), "--resume", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    runs = sorted(_document(out)["runs"], key=lambda r: r["attempt"])
    assert [(r["attempt"], r["classification"]) for r in runs] == [(1, "passed"), (2, "passed")]
    assert runs[0]["node"] is None and runs[1]["node"] is not None


def test_a_node_running_another_firstrun_is_excluded_with_its_reason(tmp_path: Path) -> None:
    # The same code under another version, first on that node's path.
    other = tmp_path / "other"
    shutil.copytree(Path(firstrun_package.__file__).parent, other / "firstrun",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = other / "firstrun" / "__init__.py"
    init.write_text(init.read_text().replace(f'"{__version__}"', '"0.0.1"'))
    with loopback_cluster(1) as made:
        stranger = made.add(env={"PYTHONPATH": str(other)})
        done = firstrun("run", str(TASKS / "greet-pass.yaml"), *MIRROR, "--repeat", "3",
                        "--backend", "linux", "--engine", "ray", "--ray-address", made.address,
                        "--out", str(tmp_path / "out"))
        stranger_id = made.node_id(stranger)[:12]
        good_id = made.node_id(0)[:12]
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"({stranger_id}) excluded: it runs firstrun 0.0.1, this driver {__version__}"
            in done.stderr)
    runs = _document(tmp_path / "out")["runs"]
    assert len(runs) == 3 and all(good_id in r["node"] for r in runs)


def test_without_ray_the_engine_is_refused_in_one_line_with_the_install(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n")
    done = firstrun("run", str(TASKS / "greet-pass.yaml"), *MIRROR, "--engine", "ray",
                    "--out", str(tmp_path / "out"), env={"PYTHONPATH": str(tmp_path / "shadow")})
    assert done.returncode == 3, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "--engine ray" in line and "pip install 'firstrun[ray]'" in line
    assert "Traceback" not in done.stderr


def test_a_driver_killed_outright_is_a_ctrl_c_to_every_node(
        cluster: LoopbackCluster, tmp_path: Path) -> None:
    slow = _task(tmp_path, "greet-slow", replay=f"sleep {SLOW_MARK.decode()}1")
    proc = subprocess.Popen(
        [str(FIRSTRUN), "run", str(slow), *MIRROR, "--backend", "linux", "--engine", "ray",
         "--ray-address", cluster.address, "--out", str(tmp_path / "out")],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    _await(_marked, proc=proc)
    assert cluster.left_on(0) + cluster.left_on(1), "control: a running run holds files"
    proc.kill()  # SIGKILL: no handler runs, the connection to the cluster just ends
    proc.communicate()
    # Ray kills the driver's tasks' workers outright; each run, detached from
    # its worker, sees it gone and closes its session as a Ctrl-C would.
    _await(lambda: not _marked() and not cluster.left_on(0) and not cluster.left_on(1))
