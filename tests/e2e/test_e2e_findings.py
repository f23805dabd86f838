"""Findings from a real sweep: the block that broke, the step no page gave, and a task that passes.

One sweep, two repeats each, in the real sandbox with installs going to the
real PyPI through the egress proxy, of three tasks served from loopback
copies of the bundled python-tabulate docs (``--docs-mirror``): the guide as
written; the guide pinning a tabulate release that does not exist; and a
task whose hand-written replay installs a package no page names. Judged by
``firstrun findings --format json`` over what the sweep saved.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from e2e_support import FIRSTRUN

from firstrun.examples import find_example

pytestmark = pytest.mark.e2e

EXAMPLE = find_example("python-tabulate")
IMPROVISED = """name: {name}
goal: Make a virtual environment at .venv in which PyYAML imports.
docs:
  path: [https://{host}/index.html]
replay:
  - python3 -m venv .venv
  - run: .venv/bin/pip install pyyaml
    undocumented: the page imports yaml and never says which package gives it
  - .venv/bin/python -c "import yaml"
success:
  script: .venv/bin/python -c "import yaml" || qs_fail "yaml is not importable from .venv"
"""
YAML_PAGE = """<!doctype html><html><head><title>YAML</title></head><body><main>
<h1>Read YAML</h1>
<pre><code class="language-bash">python3 -m venv .venv</code></pre>
<pre><code class="language-bash">.venv/bin/python -c "import yaml"</code></pre>
</main></body></html>
"""


def _copy(root: Path, name: str, edit: Any = None) -> tuple[str, str]:
    host = f"{name}.docs.example"
    docs = root / name / "docs"
    shutil.copytree(EXAMPLE.docs_dir, docs)
    if edit is not None:
        edit(docs)
    text = EXAMPLE.task_path.read_text().replace(EXAMPLE.docs_host, host)
    (root / name / "task.yaml").write_text(text.replace("name: python-tabulate", f"name: {name}"))
    return str(root / name / "task.yaml"), f"{host}={docs}"


def _pin(docs: Path) -> None:
    page = docs / "install.html"
    text = page.read_text()
    assert ".venv/bin/pip install tabulate</code>" in text
    page.write_text(text.replace(".venv/bin/pip install tabulate</code>",
                                 ".venv/bin/pip install tabulate==0.0.999</code>"))


def _improvised(root: Path, name: str) -> tuple[str, str]:
    host = f"{name}.docs.example"
    (root / name / "docs").mkdir(parents=True)
    (root / name / "docs" / "index.html").write_text(YAML_PAGE)
    (root / name / "task.yaml").write_text(IMPROVISED.format(name=name, host=host))
    return str(root / name / "task.yaml"), f"{host}={root / name / 'docs'}"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("findings")
    made = [_copy(root, "tabulate-docs"), _copy(root, "tabulate-pinned", _pin), _improvised(root, "yaml-unnamed")]
    out = root / "out"
    argv = [str(FIRSTRUN), "run", "--agent", "replay", "--repeat", "2", "--out", str(out)]
    for _, mirror in made:
        argv += ["--docs-mirror", mirror]
    argv += [task for task, _ in made]
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1200)
    assert (out / "results.json").exists(), done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    found = subprocess.run([str(FIRSTRUN), "findings", str(out), "--format", "json"], capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert found.returncode == 0, found.stderr
    return {t["task"]: t for t in json.loads(found.stdout)["tasks"]}


def test_the_pinned_release_breaks_both_runs_at_its_block(report: dict[str, dict[str, Any]]) -> None:
    task = report["tabulate-pinned"]
    assert task["gaps"] == []
    (finding,) = task["findings"]
    assert (finding["kind"], finding["page"], finding["block"]) == (
        "break", "https://tabulate-pinned.docs.example/install.html", 1)
    assert finding["what"] == "No matching distribution found for tabulate==<version>"
    assert (len(finding["runs"]), finding["of"]) == (2, 2)
    assert finding["block_text"] == ".venv/bin/pip install tabulate==0.0.999"
    assert "No matching distribution found for tabulate==0.0.999" in finding["evidence"][0]["output_tail"]
    assert task["figures"]["pass_hat_k"] == [{"k": 1, "value": 0.0}, {"k": 2, "value": 0.0}]


def test_the_package_no_page_names_is_an_improvised_step(report: dict[str, dict[str, Any]]) -> None:
    task = report["yaml-unnamed"]
    (finding,) = task["findings"]
    assert (finding["kind"], finding["what"], finding["page"]) == ("improvised", "pip install pyyaml", None)
    assert (finding["runs"], finding["of"]) == (["yaml-unnamed #1", "yaml-unnamed #2"], 2)


def test_the_guide_as_written_has_no_finding_and_every_figure(report: dict[str, dict[str, Any]]) -> None:
    task = report["tabulate-docs"]
    assert task["findings"] == [] and task["gaps"] == []
    figures = task["figures"]
    assert figures["pass_hat_k"] == [{"k": 1, "value": 1.0}, {"k": 2, "value": 1.0}]
    assert figures["wall_s"]["median"] > 0 and figures["agent_s"]["p90"] > 0
    assert figures["failed_command_share"] == 0.0
    # Replay has no model: it spends nothing, as the spend cap counts it.
    assert figures["spend_per_success_usd"] == "0"
