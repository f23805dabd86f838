"""The bundled examples: complete, consistent, packaged, and their replay is the docs themselves."""

from __future__ import annotations

import glob
import os
import re
import tomllib
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

import firstrun.examples as examples_pkg
from firstrun.agents.replay import docs_steps
from firstrun.docs.blocks import extract
from firstrun.docs.mirror import serve_directory
from firstrun.errors import UsageError
from firstrun.examples import example_mirrors, find_example, list_examples
from firstrun.tasks.lint import lint_task
from firstrun.tasks.load import load_task

ROOT = Path(examples_pkg.__file__).resolve().parent
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = list_examples()


def _pages(example):
    """Each route page's HTML, fetched through the same directory server the mirror uses."""
    task = load_task(example.task_path)
    pages = []
    for url in task.docs_route:
        response = serve_directory(str(example.docs_dir), url.split(example.docs_host, 1)[1].encode())
        assert response.status_code == 200, url
        pages.append((url, response.content.decode()))
    return task, pages


def _steps(example):
    """The commands replay: docs takes from the example's route, in order."""
    task, pages = _pages(example)
    assert task.spec.replay_docs is not None
    return [step.command for url, html in pages
            for step in docs_steps(extract(html, url=url), task.spec.replay_docs)]


def test_every_example_directory_is_listed_and_every_listed_one_exists() -> None:
    on_disk = {p.parent.name for p in ROOT.glob("*/task.yaml")}
    assert {e.name for e in EXAMPLES} == on_disk
    assert len(EXAMPLES) >= 2


def test_there_is_a_python_and_a_node_example() -> None:
    images = {load_task(e.task_path).spec.image for e in EXAMPLES}
    replays = [" ".join(_steps(e)) for e in EXAMPLES]
    assert "node:22-slim" in images
    assert any("pip install" in r for r in replays)
    assert any("npm install" in r for r in replays)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_the_task_loads_lint_clean_under_its_own_name(example) -> None:
    task = load_task(example.task_path)
    assert task.name == example.name
    assert lint_task(task) == []
    assert example.summary.strip()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_the_whole_route_is_on_the_one_reserved_docs_host(example) -> None:
    task = load_task(example.task_path)
    assert example.docs_host.endswith(".example")
    assert set(task.docs_hosts) == {example.docs_host}
    assert len(task.docs_route) >= 3


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_each_route_page_links_to_the_next_one_a_reader_takes(example) -> None:
    _, pages = _pages(example)
    for (_, html), (next_url, _) in zip(pages, pages[1:], strict=False):
        soup = BeautifulSoup(html, "html.parser")
        links = {a["href"] for a in soup.find_all("a", href=True)}
        assert next_url.rsplit("/", 1)[1] in links


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_the_replay_is_the_docs_every_command_and_file_they_show(example) -> None:
    task, pages = _pages(example)
    assert task.spec.replay_docs is not None and task.spec.replay_steps == ()
    shown = 0
    for _, html in pages:
        soup = BeautifulSoup(html, "html.parser")
        shown += len(soup.select("pre > code.language-bash"))
        # A script the guide gives is tied to its file by the sentence before it.
        for code in soup.select("pre > code.language-python, pre > code.language-js"):
            before = code.find_parent("pre").find_previous_sibling()
            shown += before is not None and bool(re.search(r"Save [^.]* as", before.get_text()))
    steps = _steps(example)
    assert len(steps) == shown >= 2
    assert sum(step.startswith("printf '%s' ") for step in steps) == 1


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_its_mirror_serves_its_docs_dir_for_its_host(example) -> None:
    mirrors = example_mirrors([example])
    assert list(mirrors) == [example.docs_host]
    mirror = mirrors[example.docs_host]
    assert mirror.host == example.docs_host
    assert mirror.directory == os.path.realpath(example.docs_dir)


def test_find_example_returns_the_listed_example() -> None:
    for example in EXAMPLES:
        assert find_example(example.name) == example


def test_an_unknown_example_names_the_flag_and_the_closest_name() -> None:
    with pytest.raises(UsageError) as raised:
        find_example("pyton-tabulate")
    message = str(raised.value)
    assert "--example" in message and "did you mean 'python-tabulate'" in message


def test_an_unknown_example_with_nothing_close_lists_what_exists() -> None:
    with pytest.raises(UsageError) as raised:
        find_example("cobol")
    message = str(raised.value)
    assert "did you mean" not in message
    assert all(e.name in message for e in EXAMPLES)


def test_package_data_ships_every_example_file() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["firstrun.examples"]
    # setuptools expands package-data globs with glob(recursive=True) under the package.
    shipped = {
        path
        for pattern in patterns
        for path in glob.glob(pattern, root_dir=ROOT, recursive=True)
        if os.path.isfile(ROOT / path)
    }
    bundled = {
        os.path.relpath(os.path.join(dirpath, name), ROOT)
        for example in EXAMPLES
        for dirpath, _, names in os.walk(ROOT / example.name)
        for name in names
    }
    assert bundled and bundled <= shipped
