"""``firstrun mutate`` proves a check can fail, in the real sandbox with the real PyPI.

One mutate sweep over three tasks whose docs are fixture pages served through
``--docs-mirror``: a good task (``replay: docs``, a pinned install, a file
block, a run whose output the check reads) whose every mutant must be killed,
its pin mutant included; a hand-written replay with a deliberately weak check,
whose survivor must be named; and a task that fails unmutated, which gets no
mutant. Then ``--resume`` of the finished sweep, which must run nothing again.
Judged by the saved results and the JSON the command prints.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from e2e_support import FIRSTRUN

pytestmark = pytest.mark.e2e

HOST = "mutate-guide.docs.example"
GUIDE = """<!doctype html><html><head><title>Tables</title></head><body><main>
<h1>Print a table</h1>
<p>Install tabulate next to your script:</p>
<pre><code class="language-bash">python3 -m pip install --target lib tabulate==0.9.0</code></pre>
<p>Save this as <code>table.py</code>:</p>
<pre><code class="language-python">from tabulate import tabulate
print(tabulate([["Earth", 1]], headers=["Planet", "Moons"], tablefmt="github"))</code></pre>
<p>Run it, keeping the table:</p>
<pre><code class="language-console">$ PYTHONPATH=lib python3 table.py &gt; table.txt</code></pre>
</main></body></html>
"""
GOOD = f"""name: good
goal: Install tabulate into lib, save table.py as the guide shows, and keep its table in table.txt.
docs:
  path: [https://{HOST}/index.html]
replay: docs
success:
  script: |
    grep -Eq '^\\| Earth +\\| +1 \\|$' table.txt || qs_fail "table.txt holds no row for Earth"
"""
WEAK = """name: weak
goal: Write a.txt, then b.txt.
docs:
  path: [https://{host}/index.html]
replay:
  - run: printf 'a' > a.txt
    undocumented: the fixture's own step
  - run: printf 'b' > b.txt
    undocumented: the fixture's own step
success:
  script: test -f a.txt || qs_fail "no a.txt"
""".format(host=HOST)
FAILING = WEAK.replace("name: weak", "name: failing").replace("test -f a.txt", "test -f c.txt")


def mutate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FIRSTRUN), "mutate", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=900)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], list[str]]:
    root = tmp_path_factory.mktemp("mutate")
    (root / "docs").mkdir()
    (root / "docs" / "index.html").write_text(GUIDE)
    for name, text in (("good", GOOD), ("weak", WEAK), ("failing", FAILING)):
        (root / f"{name}.yaml").write_text(text)
    tasks = [str(root / f"{name}.yaml") for name in ("good", "weak", "failing")]
    out = root / "out"
    done = mutate(*tasks, "--out", str(out), "--docs-mirror", f"{HOST}={root / 'docs'}", "--json")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    scores = {s["task"]: s for s in json.loads(done.stdout)}
    resumed = mutate("--resume", str(out), *tasks, "--docs-mirror", f"{HOST}={root / 'docs'}")
    return out, scores, [done.stdout, resumed.stdout + resumed.stderr, str(resumed.returncode)]


def verdicts(score: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["verdict"] for m in score["mutants"]}


def test_a_good_check_kills_every_mutant_the_pin_mutant_included(sweep) -> None:
    _, scores, _ = sweep
    good = scores["good"]
    assert verdicts(good) == {"good.drop-1": "killed", "good.pin-1-1": "killed", "good.drop-2": "killed",
                              "good.drop-3": "killed"}
    assert good["score"] == 1.0 and good["baseline"] == "passed"
    pin = next(m for m in good["mutants"] if m["name"] == "good.pin-1-1")
    assert pin["mutation"]["pin"] == ["==0.9.0", "==99999.0.0"]
    assert pin["mutation"]["where"] == f"https://{HOST}/index.html block 0"
    assert "tabulate==99999.0.0" in pin["reason"]


def test_a_weak_check_names_its_survivor_by_step_and_line(sweep) -> None:
    out, scores, _ = sweep
    weak = scores["weak"]
    assert verdicts(weak) == {"weak.drop-1": "killed", "weak.drop-2": "survived"}
    survivor = weak["mutants"][1]["mutation"]
    assert survivor["command"] == "printf 'b' > b.txt"
    assert survivor["where"] == f"{out.parent / 'weak.yaml'}:8"
    assert weak["score"] == 0.5


def test_a_task_that_fails_unmutated_gets_no_mutant_and_says_why(sweep) -> None:
    out, scores, _ = sweep
    failing = scores["failing"]
    assert failing["mutants"] == [] and failing["score"] is None
    assert failing["why_none"].startswith("the unmutated task did not pass (docs_gap")
    results = json.loads((out / "results.json").read_text())
    assert sorted(r["task"] for r in results["runs"]) == sorted([
        "good", "good.drop-1", "good.pin-1-1", "good.drop-2", "good.drop-3",
        "weak", "weak.drop-1", "weak.drop-2", "failing"])
    assert all((out / r["trace"]).is_file() for r in results["runs"])


def test_resuming_a_finished_sweep_runs_nothing_and_says_the_same(sweep) -> None:
    out, _, (_, resumed, code) = sweep
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"]) == 9 and code == "1"
    assert "  SURVIVED weak.drop-2: step 2 (" in resumed
    assert "weak: 1/2 killed (50%)" in resumed


@pytest.mark.parametrize(("args", "says"), [
    (["--workers", "0"], "--workers"),
    (["/nonexistent/task.yaml"], "/nonexistent/task.yaml"),
])
def test_bad_input_is_one_line(args: list[str], says: str) -> None:
    done = mutate(*args)
    assert done.returncode == 3 and says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_task_without_replay_is_refused_naming_its_file(tmp_path: Path) -> None:
    task = tmp_path / "plain.yaml"
    task.write_text(f"name: plain\ngoal: g\ndocs: {{entrypoint: 'https://{HOST}/'}}\n"
                    "success: {script: 'test -f x'}\n")
    done = mutate(str(task), "--out", str(tmp_path / "out"))
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"firstrun: error: mutate: {task}: task plain has no replay block, "
                                   "so there is no step to remove; add 'replay: docs' or a list of steps")


def test_a_credential_without_inspect_tls_is_refused_before_any_run(tmp_path: Path) -> None:
    task = tmp_path / "secret.yaml"
    task.write_text(WEAK.replace("name: weak", "name: secret") + "firstrun:\n  credentials:\n"
                    "    - {name: NPM_TOKEN, host: registry.example.com, from_env: NPM_TOKEN_REAL}\n")
    done = mutate(str(task), "--out", str(tmp_path / "out"))
    assert done.returncode == 3 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"firstrun: error: {task}: firstrun.credentials (NPM_TOKEN) need --inspect-tls")
    assert not (tmp_path / "out").exists()
