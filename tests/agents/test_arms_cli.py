"""Two models as two arms of one ``firstrun run`` sweep, through the OpenAI SDK to a
scripted local server: each arm runs every task, keeps its own sweep identity in
``OUT/ARM/``, resumes only what it lacks, and ``diff``, ``findings`` and ``report``
read the arms as a matrix with Fisher's test between them (values worked by hand).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

import support.openai_wire as wire
from support.agents import DOCS_HOST, GREETER_DOCS, greeter_task
from support.vendor import Reply, Request, Router, VendorServer

FIRSTRUN = Path(sys.executable).parent / "firstrun"
GREET = "printf 'hello, reader\\n' > greeting.txt"
GOOD, BAD = "m-good", "m-bad"
REPEAT = 4
# 4/4 against 0/4: the tables as extreme or more are the two of C(8,4) = 70, so
# p = 2/70; the Wilson 95% interval of 4/4 is [0.510, 1] and of 0/4 [0, 0.490].
P_VALUE = "0.02857"
GOOD_CELL = "4/4 (100%, CI 51%-100%)"
BAD_CELL = "0/4 (0%, CI 0%-49%)"


def _server() -> VendorServer:
    good = wire.script(wire.completion(None, wire.bash(GREET), local=True),
                       wire.completion("Done.", local=True))
    bad = wire.script(wire.completion("I found no greeting to write.", local=True))
    return VendorServer(Router(lambda r: r.body["model"], {GOOD: good, BAD: bad}))


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("FIRSTRUN_OPENAI_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL")}


def firstrun(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FIRSTRUN), *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, env=_env(), timeout=600)


def sweep_argv(task: Path, url: str, *extra: str, repeat: int = REPEAT) -> list[str]:
    return [str(FIRSTRUN), "run", str(task), "--agent", "openai", "--base-url", f"{url}/v1",
            "--model", GOOD, "--model", BAD, "--repeat", str(repeat), "--backend", "linux",
            "--docs-mirror", f"{DOCS_HOST}={GREETER_DOCS}", *extra]


def sweep(task: Path, url: str, *extra: str, repeat: int = REPEAT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sweep_argv(task, url, *extra, repeat=repeat), capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, env=_env(), timeout=600)


def conversations(seen: list[Request]) -> list[str]:
    """The model of each conversation the server saw (its first turn)."""
    return [r.body["model"] for r in seen if wire.model_turns(r) == 0]


def results(where: Path) -> dict:
    return json.loads((where / "results.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def server() -> Iterator[VendorServer]:
    # One for the module: --base-url is part of each arm's identity, so a resume
    # must reach the server the sweep did.
    with _server() as running:
        yield running


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory, server: VendorServer,
          ) -> tuple[Path, Path, subprocess.CompletedProcess[str], list[str]]:
    tmp = tmp_path_factory.mktemp("arms")
    task = greeter_task(tmp).path
    out = tmp / "out"
    done = sweep(task, server.url, "--out", str(out), "--junit", str(tmp / "junit.xml"),
                 "--github-summary-file", str(tmp / "summary.md"))
    return task, out, done, conversations(server.seen())


def test_each_arm_runs_every_task_as_a_sweep_of_its_own(swept) -> None:
    _, out, done, models = swept
    assert done.returncode == 1, done.stderr  # m-bad's runs are docs gaps
    assert sorted(models) == sorted([GOOD] * REPEAT + [BAD] * REPEAT)
    assert [a["name"] for a in json.loads((out / "arms.json").read_text())["arms"]] == [GOOD, BAD]
    assert not (out / "results.json").exists()
    good, bad = results(out / GOOD), results(out / BAD)
    assert [(r["task"], r["classification"], r["model"]) for r in good["runs"]] == \
        [("greeter", "passed", GOOD)] * REPEAT
    assert [(r["task"], r["classification"], r["model"]) for r in bad["runs"]] == \
        [("greeter", "docs_gap", BAD)] * REPEAT
    # Each arm's identity is its own, differing from the other's in the model alone.
    ids = good["meta"]["sweep"], bad["meta"]["sweep"]
    assert (ids[0]["model"], ids[1]["model"]) == (GOOD, BAD)
    assert {k: v for k, v in ids[0].items() if k != "model"} == \
        {k: v for k, v in ids[1].items() if k != "model"}
    assert (good["meta"]["arm"], bad["meta"]["arm"]) == (GOOD, BAD)
    for arm in (GOOD, BAD):
        assert len(list((out / arm / "runs").rglob("trace.jsonl"))) == REPEAT


def test_the_sweep_ends_with_the_arms_matrix_and_fishers_test(swept) -> None:
    _, _, done, _ = swept
    assert f"== arm {GOOD} ==" in done.stdout and f"== arm {BAD} ==" in done.stdout
    matrix = done.stdout[done.stdout.index("arms (pass rate"):]
    assert GOOD_CELL in matrix and BAD_CELL in matrix
    assert f"{GOOD} vs {BAD}, greeter: {GOOD} higher (p {P_VALUE})" in matrix


def test_junit_and_the_summary_name_each_arm(swept) -> None:
    _, out, _, _ = swept
    suites = ET.parse(out.parent / "junit.xml").getroot().findall("testsuite")
    assert sorted((s.get("name"), s.get("tests"), s.get("failures")) for s in suites) == [
        (f"{BAD}/greeter", str(REPEAT), str(REPEAT)), (f"{GOOD}/greeter", str(REPEAT), "0")]
    summary = (out.parent / "summary.md").read_text(encoding="utf-8")
    assert summary.startswith("## Arms\n") and f"## firstrun: arm {BAD}" in summary


def test_findings_and_report_of_the_sweep_put_the_matrix_first(swept, tmp_path: Path) -> None:
    _, out, _, _ = swept
    text = firstrun("findings", str(out))
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("arms (pass rate")
    assert f"{GOOD} vs {BAD}, greeter: {GOOD} higher (p {P_VALUE})" in text.stdout
    assert f"== arm {GOOD} ==" in text.stdout and f"== arm {BAD} ==" in text.stdout
    md = firstrun("report", str(out), "--markdown", "-", "--out", str(tmp_path / "r.html"))
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith("## Arms\n")
    cell = GOOD_CELL.replace("(", "\\(").replace(")", "\\)")  # markdown-escaped
    assert f"| {GOOD} | {cell} | {cell} |" in md.stdout
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert page.index('id="arms"') < page.index('id="arm-1-findings"') < page.index('id="arm-2-findings"')
    assert f"p {P_VALUE}" in page
    single = firstrun("findings", str(out), "--format", "json")
    assert single.returncode == 3 and "--format json" in single.stderr
    assert len(single.stderr.strip().splitlines()) == 1


def test_diff_between_two_arms_of_the_sweep(swept) -> None:
    _, out, _, _ = swept
    done = firstrun("diff", str(out / GOOD), str(out / BAD), "--fail-on-regression", "--color", "never")
    assert done.returncode == 1, done.stderr
    assert "REGRESSED" in done.stdout and P_VALUE in done.stdout
    whole = firstrun("diff", str(out), str(out / BAD))
    assert whole.returncode == 3 and f"{out / GOOD}" in whole.stderr


def _forget_last_run(where: Path) -> None:
    """As if the sweep had stopped before this arm's last run finished."""
    document = results(where)
    last = document["runs"].pop()
    (where / "results.json").write_text(json.dumps(document), encoding="utf-8")
    shutil.rmtree(where / Path(last["trace"]).parent)


def test_resuming_runs_only_what_each_arm_lacks(swept, server: VendorServer,
                                                tmp_path: Path) -> None:
    task, saved, _, _ = swept
    out = tmp_path / "out"
    shutil.copytree(saved, out)
    for arm in (GOOD, BAD):
        _forget_last_run(out / arm)
    before = len(server.seen())
    done = sweep(task, server.url, "--resume", str(out))
    assert done.returncode == 1, done.stderr
    assert sorted(conversations(server.seen()[before:])) == [BAD, GOOD]
    for arm, classification in ((GOOD, "passed"), (BAD, "docs_gap")):
        document = results(out / arm)
        assert sorted(r["attempt"] for r in document["runs"]) == list(range(1, REPEAT + 1))
        assert {r["classification"] for r in document["runs"]} == {classification}
        assert len(document["meta"]["resumed"]) == 1


def test_a_sweep_interrupted_in_its_second_arm_resumes_only_what_is_missing(tmp_path: Path) -> None:
    task = greeter_task(tmp_path).path
    out = tmp_path / "out"
    held = threading.Event()
    bad = wire.script(wire.completion("I found no greeting to write.", local=True))

    def gated(request: Request) -> Reply:
        held.wait(timeout=300)
        return bad(request)

    good = wire.script(wire.completion(None, wire.bash(GREET), local=True),
                       wire.completion("Done.", local=True))
    with VendorServer(Router(lambda r: r.body["model"], {GOOD: good, BAD: gated})) as server:
        proc = subprocess.Popen(sweep_argv(task, server.url, "--out", str(out), repeat=2),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, env=_env())
        try:
            # The second arm's first turn is held at the server: the first arm is done.
            while BAD not in conversations(server.seen()) and proc.poll() is None:
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            held.set()
            _, stderr = proc.communicate(timeout=300)
        finally:
            held.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 130, stderr
        assert [r["attempt"] for r in results(out / GOOD)["runs"]] == [1, 2]
        kept = len(results(out / BAD)["runs"])
        assert kept < 2
        before = len(server.seen())
        done = sweep(task, server.url, "--resume", str(out), repeat=2)
    assert done.returncode == 1, done.stderr
    assert conversations(server.seen()[before:]) == [BAD] * (2 - kept)
    assert sorted(r["attempt"] for r in results(out / GOOD)["runs"]) == [1, 2]
    assert sorted(r["attempt"] for r in results(out / BAD)["runs"]) == [1, 2]


def test_a_resume_whose_arms_differ_is_refused_naming_the_flag(swept) -> None:
    task, out, _, _ = swept
    one = firstrun("run", str(task), "--agent", "openai", "--model", GOOD, "--repeat", str(REPEAT),
                   "--backend", "linux", "--resume", str(out))
    assert one.returncode == 3
    assert one.stderr.startswith("firstrun: error: --resume:") and "several arms" in one.stderr
    other = firstrun("run", str(task), "--agent", "openai", "--model", GOOD, "--model", "m-other",
                     "--repeat", str(REPEAT), "--backend", "linux", "--resume", str(out))
    assert other.returncode == 3 and "--resume:" in other.stderr and "m-other" in other.stderr
    for done in (one, other):
        assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("flags", "named"), [
    (("--agent", "openai", "--model", "m", "--model", "m"), "--model: 'm' is given twice"),
    (("--agent", "openai", "--agent", "openai", "--model", "m"), "--agent: 'openai' is given twice"),
    (("--affordances", "none", "--affordances", "none"), "--affordances: 'none' is given twice"),
    (("--agent", "openai", "--agent", "nope", "--model", "m"), "--agent"),
    (("--agent", "openai", "--agent", "replay", "--model", "m"), "--model: the replay agent"),
])
def test_bad_arms_are_refused_in_one_line_naming_the_flag(tmp_path: Path, flags: tuple[str, ...],
                                                          named: str) -> None:
    task = greeter_task(tmp_path).path
    done = firstrun("run", str(task), *flags, "--base-url", "http://127.0.0.1:9/v1",
                    "--backend", "linux", "--out", str(tmp_path / "out"))
    assert done.returncode == 3, done.stderr
    assert named in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_max_spend_caps_the_whole_sweep_not_each_arm(tmp_path: Path) -> None:
    # 1000 USD per million tokens of every kind: a token costs 0.001 USD, and each run
    # reserves its max_tokens (1000) at that rate, 1 USD. m-good's two runs settle 240
    # tokens each (two turns of 100 in, 20 out), 0.48 USD, leaving the second arm 1.02
    # USD of the 1.5: one reservation fits and settles 0.12 (one turn), the next
    # (0.12 + 1 > 1.02) does not. A cap per arm would have let m-bad run twice.
    task = greeter_task(tmp_path, budgets={"max_tokens": 1000}).path
    prices = tmp_path / "prices.yaml"
    prices.write_text("".join(f"{m}: {{input: 1000, output: 1000, cached: 1000}}\n" for m in (GOOD, BAD)),
                      encoding="utf-8")
    good = wire.script(wire.completion(None, wire.bash(GREET)), wire.completion("Done."))
    bad = wire.script(wire.completion("I found no greeting to write."))
    out = tmp_path / "out"
    with VendorServer(Router(lambda r: r.body["model"], {GOOD: good, BAD: bad})) as server:
        done = sweep(task, server.url, "--out", str(out), "--price-file", str(prices),
                     "--max-spend", "1.5", repeat=2)
    assert done.returncode == 1, done.stderr
    assert conversations(server.seen()) == [GOOD, GOOD, BAD]
    assert [r["classification"] for r in results(out / GOOD)["runs"]] == ["passed", "passed"]
    assert [r["attempt"] for r in results(out / BAD)["runs"]] == [1]
    assert "--max-spend 1.5 USD reached (0.60 USD settled)" in done.stderr
