"""The bundled examples: complete, consistent, packaged, and their replay is the docs' own text."""

from __future__ import annotations

import glob
import os
import re
import tomllib
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

import firstrun.examples as examples_pkg
from firstrun.docs.mirror import serve_directory
from firstrun.errors import UsageError
from firstrun.examples import example_mirrors, find_example, list_examples
from firstrun.tasks.lint import lint_task
from firstrun.tasks.load import load_task

ROOT = Path(examples_pkg.__file__).resolve().parent
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = list_examples()
HEREDOC = re.compile(r"^cat > (?P<file>\S+) <<'(?P<tag>\w+)'\n(?P<body>.*)\n(?P=tag)$", re.S)


def _pages(example):
    """Each route page's parsed HTML, fetched through the same directory server the mirror uses."""
    task = load_task(example.task_path)
    pages = []
    for url in task.docs_route:
        response = serve_directory(str(example.docs_dir), url.split(example.docs_host, 1)[1].encode())
        assert response.status_code == 200, url
        pages.append((url, BeautifulSoup(response.content, "html.parser")))
    return task, pages


def test_every_example_directory_is_listed_and_every_listed_one_exists() -> None:
    on_disk = {p.parent.name for p in ROOT.glob("*/task.yaml")}
    assert {e.name for e in EXAMPLES} == on_disk
    assert len(EXAMPLES) >= 2


def test_there_is_a_python_and_a_node_example() -> None:
    images = {load_task(e.task_path).spec.image for e in EXAMPLES}
    replays = [" ".join(s.run for s in load_task(e.task_path).spec.replay_steps) for e in EXAMPLES]
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
    for (_, soup), (next_url, _) in zip(pages, pages[1:], strict=False):
        links = {a["href"] for a in soup.find_all("a", href=True)}
        assert next_url.rsplit("/", 1)[1] in links


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_the_replay_is_exactly_the_documented_commands_and_files(example) -> None:
    task, pages = _pages(example)
    shell, files = set(), set()
    for _, soup in pages:
        for code in soup.select("pre > code"):
            classes = code.get("class") or []
            if "language-bash" in classes:
                shell.add(code.get_text())
            elif any(c in classes for c in ("language-python", "language-js")):
                files.add(code.get_text())
    for step in (s.run for s in task.spec.replay_steps):
        heredoc = HEREDOC.match(step)
        if heredoc:
            assert heredoc["body"] in files, f"{step!r} writes a file the docs do not show"
        else:
            assert step in shell, f"{step!r} is not a documented command"


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
