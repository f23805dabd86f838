"""Real quickstarts agree on every backend: the host decides, and only a refusal may differ.

Each corpus entry (``tests/fixtures/differential/corpus.yaml``) is the README
inside a package pinned by its registry integrity; the README is served as
the docs and its own quickstart blocks are replayed on the host (``local``)
and on every backend this machine has (the conformance suite's ``backend``). A backend may differ from the host
only by a refusal it records (a ``blocked`` run); any other difference (a
classification, a step that fails on one and not the other) is the sandbox
breaking a tool, which firstrun would count as a gap in the docs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from firstrun.docs.blocks import BlockKind, extract_markdown

FIRSTRUN = Path(sys.executable).parent / "firstrun"
CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "differential" / "corpus.yaml"
NODE_IMAGE = "firstrun/node:24"
ENTRIES: list[dict[str, Any]] = yaml.safe_load(CORPUS.read_text(encoding="utf-8"))


def _readme(entry: dict[str, Any], into: Path) -> str:
    """The README of the pinned package, from the npm registry, checked against its integrity."""
    spec = f"{entry['package']}@{entry['version']}"
    packed = subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(into), spec],
                            capture_output=True, text=True, check=True, timeout=300)
    tarball = into / packed.stdout.strip().splitlines()[-1]
    algorithm, _, expected = entry["integrity"].partition("-")
    digest = hashlib.new(algorithm, tarball.read_bytes()).digest()
    assert base64.b64encode(digest).decode() == expected, f"{spec}: not the pinned tarball"
    with tarfile.open(tarball) as archive:
        member = archive.extractfile(entry["readme"])
        assert member is not None, f"{spec}: no {entry['readme']}"
        return member.read().decode("utf-8")


def _task(entry: dict[str, Any], readme: str, into: Path) -> tuple[Path, str]:
    """A replay task of the README's own blocks, and the --docs-mirror that serves it."""
    host = f"{entry['package']}.readme.example"
    site = into / host
    site.mkdir()
    (site / "README.md").write_text(readme, encoding="utf-8")
    url = f"https://{host}/README.md"
    blocks = extract_markdown(readme, url=url)
    assert all(blocks[index].steps for index in entry["blocks"]), entry["package"]
    # The README's own blocks, read by the replay agent from the page it serves: every
    # runnable block but the quickstart's is skipped.
    skip = [{"page": url, "block": b.index} for b in blocks
            if b.kind is not BlockKind.OTHER and b.index not in entry["blocks"]]
    task = into / f"{entry['package']}.yaml"
    task.write_text(yaml.safe_dump({
        "name": entry["package"],
        "goal": f"Follow the {entry['package']} README's quickstart.",
        "docs": {"entrypoint": url},
        "replay": {"from": "docs", "skip": skip},
        "success": {"script": f"{entry['check']} || qs_fail 'the quickstart did not work'\n"},
    }, sort_keys=False), encoding="utf-8")
    return task, f"{host}={site}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[str]]:
    into = tmp_path_factory.mktemp("corpus")
    tasks, mirrors = [], []
    for entry in ENTRIES:
        task, mirror = _task(entry, _readme(entry, into), into)
        tasks.append(task)
        mirrors += ["--docs-mirror", mirror]
    return tasks, mirrors


def _outcomes(backend: str, corpus: tuple[list[Path], list[str]], out: Path) -> dict[str, Any]:
    tasks, mirrors = corpus
    extra = ["--allow-unenforced"] if backend == "local" else []
    if backend == "docker":
        extra += ["--image", NODE_IMAGE]
    done = subprocess.run([str(FIRSTRUN), "run", *map(str, tasks), *mirrors, "--agent", "replay",
                           "--backend", backend, *extra, "--workers", "2", "--out", str(out)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    outcomes = {}
    for run in json.loads((out / "results.json").read_text())["runs"]:
        trace = [json.loads(line) for line in (out / run["trace"]).read_text().splitlines()]
        steps = [(e["command"], e["exit_code"] == 0) for e in trace
                 if e["kind"] == "command" and e["source"] == "agent"]
        outcomes[run["task"]] = {"classification": run["classification"], "steps": steps,
                                 "detail": run.get("detail")}
    return outcomes


@pytest.fixture(scope="module")
def host(corpus: tuple[list[Path], list[str]],
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _outcomes("local", corpus, tmp_path_factory.mktemp("host"))


def test_the_corpus_is_what_it_says_on_the_host(host: dict[str, Any]) -> None:
    assert {name: o["classification"] for name, o in host.items()} == {
        "left-pad": "passed", "express": "passed", "uuid": "passed", "is-number": "docs_gap",
    }, json.dumps(host, indent=1)
    assert {name: [command for command, _ in o["steps"]] for name, o in host.items()} == {
        "left-pad": ["npm install left-pad"], "express": ["npm install express"],
        "uuid": ["npm install uuid", "npx uuid"], "is-number": ["npm install && npm test"]}


def test_a_backend_agrees_with_the_host_but_for_a_refusal(
        backend: str, corpus: tuple[list[Path], list[str]], host: dict[str, Any],
        tmp_path: Path) -> None:
    mine = _outcomes(backend, corpus, tmp_path / "out")
    differ = {name: (host[name], mine.get(name)) for name in host
              if mine.get(name) != host[name]
              and (mine.get(name) or {}).get("classification") != "blocked"}
    assert differ == {}, json.dumps(differ, indent=1)
